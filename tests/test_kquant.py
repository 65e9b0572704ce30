"""q4_k and importance-weighted quantization (formats/quant.py,
formats/quant_search.py) against llama.cpp itself.

References, none of them our code:
- golden/quant/*.bin: ggml's ``quantize_q4_K`` (and ``quantize_q4_0`` /
  ``quantize_q4_1``) bytes for golden/quant/input.npy, without and with the
  importance vector golden/quant/importance.npy (golden/quant/make_golden_quant.py);
- ``gguf.quants.dequantize`` for what q4_k bytes mean.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iekit.formats import quant_search as qs
from iekit.formats.errors import IEError
from iekit.formats.quant import SCHEMES, QuantParams

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "quant"
Q4K = SCHEMES["q4_k"]
P = QuantParams("q4_k")


def _golden(name: str) -> np.ndarray:
    return np.frombuffer((GOLDEN / name).read_bytes(), np.uint8)


def _gguf_deq(raw: np.ndarray, rows: int) -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType.Q4_K).astype(np.float32)


def test_q4_k_bytes_equal_llama_cpp():
    x = np.load(GOLDEN / "input.npy")
    ours = Q4K.quantize(x, P)
    ref = _golden("q4_k.bin")
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, f"first differing byte {bad[0]} (row {bad[0] // (x.shape[1] // 256 * 144)})"


def test_q4_k_with_importance_bytes_equal_llama_cpp():
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy")
    ours = Q4K.quantize(x, P, importance=imp)
    assert np.array_equal(ours, _golden("q4_k-imatrix.bin"))


def test_q4_k_dequantizes_as_gguf_does():
    x = np.load(GOLDEN / "input.npy")
    for raw in (Q4K.quantize(x, P), Q4K.quantize(x, P, importance=np.load(GOLDEN / "importance.npy"))):
        ours = Q4K.dequantize(raw, *x.shape, P)
        assert np.array_equal(ours.view(np.uint32), _gguf_deq(raw, x.shape[0]).view(np.uint32))
        assert (np.abs(x - ours) <= Q4K.error_bound(x, raw, P)).all()


def test_importance_lowers_the_weighted_error():
    """The point of an importance matrix: on the columns it marks, the error
    shrinks; summed with its weights, the error is lower than without it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    imp = np.where(rng.random(512) < 0.1, 50.0, 0.1).astype(np.float32)
    plain = Q4K.dequantize(Q4K.quantize(x, P), *x.shape, P)
    weighted = Q4K.dequantize(Q4K.quantize(x, P, importance=imp), *x.shape, P)
    err = lambda d: float((imp * (x.astype(np.float64) - d) ** 2).sum())  # noqa: E731
    assert err(weighted) < 0.9 * err(plain)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), supers=st.integers(1, 3), log_scale=st.floats(-30, 3), seed=st.integers(0, 2**31))
def test_q4_k_round_trip_on_random_scales(rows, supers, log_scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, 256 * supers)) * 10.0 ** log_scale).astype(np.float32)
    raw = Q4K.quantize(x, P)
    assert raw.size == Q4K.nbytes(*x.shape, P)
    deq = Q4K.dequantize(raw, *x.shape, P)
    assert np.array_equal(deq.view(np.uint32), _gguf_deq(raw, rows).view(np.uint32))
    assert (np.abs(x - deq) <= Q4K.error_bound(x, raw, P)).all()


def test_error_bound_catches_a_wrong_code():
    x = np.load(GOLDEN / "input.npy")[-4:]
    raw = Q4K.quantize(x, P).copy()
    raw[16 + 5] ^= 0x0C  # element 5 of sub-block 0, row 0: its code moves by 4 or more steps
    deq = Q4K.dequantize(raw, *x.shape, P)
    assert not (np.abs(x - deq) <= Q4K.error_bound(x, raw, P)).all()


def test_q4_k_needs_whole_super_blocks():
    assert "multiple of 256" in Q4K.check([4, 576], P)
    assert Q4K.check([4, 512], P) is None


def test_nearest_int_is_ggml_rounding():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.49999, 4194303.0, 1e-40], np.float32)
    assert qs.nearest_int(v).tolist() == [0, 2, 2, 0, -2, 3, 4194303, 0]


@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_bad_importance_is_refused(bad):
    x = np.ones((2, 256), np.float32)
    imp = np.ones(256, np.float32)
    imp[9] = bad
    with pytest.raises(IEError, match=r"w\.q: importance of column 9 is"):
        Q4K.quantize(x, P, name="w.q", importance=imp)


def test_importance_of_the_wrong_length_is_refused():
    with pytest.raises(IEError, match=r"w\.q: importance has 255 columns, the matrix 256"):
        Q4K.quantize(np.ones((2, 256), np.float32), P, name="w.q", importance=np.ones(255, np.float32))


def _weighted_err(x, deq, imp):
    return float((imp.astype(np.float64) * (x.astype(np.float64) - deq) ** 2).sum())


@pytest.mark.parametrize("scheme", ["q4_0", "q4_1", "q4_k"])
def test_weighted_quantization_is_no_worse_than_llama_cpp_with_the_same_imatrix(scheme):
    """q4_0/q4_1 keep llama.cpp's search but choose every code for the scale as
    stored (f16), so their importance-weighted error may not exceed what
    llama.cpp's own imatrix quantization of the same input reaches; q4_k is
    byte-identical to it."""
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy")
    s, p = SCHEMES[scheme], QuantParams(scheme)
    ours = s.quantize(x, p, importance=imp)
    ref = _golden(f"{scheme}-imatrix.bin")
    ours_deq = s.dequantize(ours, *x.shape, p)
    ref_deq = gguf.quants.dequantize(ref.reshape(x.shape[0], -1), gguf.GGMLQuantizationType[scheme.upper()])
    assert _weighted_err(x, ours_deq, imp) <= _weighted_err(x, ref_deq.astype(np.float32), imp) * (1 + 1e-6)
    assert (np.abs(x - ours_deq) <= s.error_bound(x, ours, p)).all()
    if scheme != "q4_k":  # the same search: the f16 scale (and min) of every block are llama.cpp's
        head = 2 * len(s.F16_FIELDS)
        ob, rb = ours.reshape(-1, s.block_bytes), ref.reshape(-1, s.block_bytes)
        assert np.array_equal(ob[:, :head], rb[:, :head])
    # and without the importance the llama.cpp-compatible bytes are untouched
    assert np.array_equal(s.quantize(x, p), _golden(f"{scheme}.bin"))


@pytest.mark.parametrize("p", [QuantParams("int4w", g, sym, sd) for g in (32, 64, None)
                               for sym in (True, False) for sd in ("f16", "f32")],
                         ids=lambda p: f"g{p.group_size}-{'sym' if p.symmetric else 'aff'}-{p.scale_dtype}")
def test_int4w_importance_lowers_the_weighted_error(p):
    x = np.load(GOLDEN / "input.npy")[3:]  # without the all-zero/constant rows, whose error is 0 either way
    imp = np.load(GOLDEN / "importance.npy")
    s = SCHEMES["int4w"]
    plain, weighted = s.quantize(x, p), s.quantize(x, p, importance=imp)
    assert plain.size == weighted.size == s.nbytes(*x.shape, p)
    e_plain = _weighted_err(x, s.dequantize(plain, *x.shape, p), imp)
    e_weighted = _weighted_err(x, s.dequantize(weighted, *x.shape, p), imp)
    assert e_weighted < e_plain
    assert (np.abs(x - s.dequantize(weighted, *x.shape, p)) <= s.error_bound(x, weighted, p)).all()
