"""llama.cpp's block formats whose quantizers gguf-py lacks (the k-quants
q4_k, q5_k, q6_k, q3_k, q2_k; iq4_nl, iq4_xs) and importance-weighted quantization
(formats/quant.py, formats/quant_search.py) against llama.cpp itself.

References, none of them our code:
- golden/quant/*.bin: ggml's ``quantize_<type>`` bytes for
  golden/quant/input.npy, without and with the importance vector
  golden/quant/importance.npy (golden/quant/make_golden_quant.py);
- ``gguf.quants.dequantize`` for what the bytes mean.
iq4's own checks (its grid, its index) are in tests/test_iq4.py.
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
KQUANTS = ["q4_k", "q5_k", "q6_k", "q3_k", "q2_k"]
GOLDEN_BYTES = KQUANTS + ["iq4_nl", "iq4_xs"]  # quantized by libggml itself, with and without an imatrix


def _golden(name: str) -> np.ndarray:
    return np.frombuffer((GOLDEN / name).read_bytes(), np.uint8)


def _gguf_deq(raw: np.ndarray, rows: int, scheme: str = "q4_k") -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[scheme.upper()]).astype(np.float32)


@pytest.mark.parametrize("suffix", ["", "-imatrix"])
@pytest.mark.parametrize("scheme", GOLDEN_BYTES)
def test_bytes_equal_llama_cpp(scheme, suffix):
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy") if suffix else None
    s = SCHEMES[scheme]
    ours = s.quantize(x, QuantParams(scheme), importance=imp)
    bad = np.flatnonzero(ours != _golden(f"{scheme}{suffix}.bin"))
    assert bad.size == 0, f"first differing byte {bad[0]} (row {bad[0] // s.nbytes(1, x.shape[1], QuantParams(scheme))})"


@pytest.mark.parametrize("scheme", GOLDEN_BYTES)
def test_dequantizes_as_gguf_does_within_the_bound(scheme):
    x = np.load(GOLDEN / "input.npy")
    s, p = SCHEMES[scheme], QuantParams(scheme)
    for raw in (s.quantize(x, p), s.quantize(x, p, importance=np.load(GOLDEN / "importance.npy"))):
        ours = s.dequantize(raw, *x.shape, p)
        assert np.array_equal(ours.view(np.uint32), _gguf_deq(raw, x.shape[0], scheme).view(np.uint32))
        assert (np.abs(x - ours) <= s.error_bound(x, raw, p)).all()


def test_q6_k_keeps_the_search_codes_where_a_sub_scale_stores_as_zero():
    """Golden row 3 (one outlier among values 1e-3 small) has sub-blocks whose
    int8 scale rounds to 0 while d does not: ggml keeps make_qx_quants's codes
    there (not 32), and so do we (the bytes test); the values are 0."""
    raw = _golden("q6_k.bin").reshape(-1, 210)
    sc = raw[:, 192:208].view(np.int8)
    d = raw[:, 208:210].copy().view(np.float16)[:, 0]
    codes = SCHEMES["q6_k"].codes(raw).reshape(-1, 16, 16)
    kept = (sc == 0) & (d != 0)[:, None] & (codes != 32).any(axis=2)
    assert kept.any()


@pytest.mark.parametrize("scheme", [*GOLDEN_BYTES, "iq3_s", "iq4_xsh", "iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s",
                                    "iq1_s", "iq1_m"])
def test_importance_lowers_the_weighted_error(scheme):
    """The point of an importance matrix: on the columns it marks, the error
    shrinks; summed with its weights, the error is lower than without it
    (our own searches too: iq3_s, iq4_xsh and the XXS and IQ2 codebooks)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    imp = np.where(rng.random(512) < 0.1, 50.0, 0.1).astype(np.float32)
    s, p = SCHEMES[scheme], QuantParams(scheme)
    plain = s.dequantize(s.quantize(x, p), *x.shape, p)
    weighted = s.dequantize(s.quantize(x, p, importance=imp), *x.shape, p)
    err = lambda d: float((imp * (x.astype(np.float64) - d) ** 2).sum())  # noqa: E731
    assert err(weighted) < 0.9 * err(plain)


@pytest.mark.parametrize("scheme", GOLDEN_BYTES)
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), supers=st.integers(1, 3), log_scale=st.floats(-30, 3), seed=st.integers(0, 2**31))
def test_round_trip_on_random_scales(scheme, rows, supers, log_scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, 256 * supers)) * 10.0 ** log_scale).astype(np.float32)
    s, p = SCHEMES[scheme], QuantParams(scheme)
    raw = s.quantize(x, p)
    assert raw.size == s.nbytes(*x.shape, p)
    deq = s.dequantize(raw, *x.shape, p)
    assert np.array_equal(deq.view(np.uint32), _gguf_deq(raw, rows, scheme).view(np.uint32))
    assert (np.abs(x - deq) <= s.error_bound(x, raw, p)).all()


# A byte holding element 5's code bits 2..3 in row 0's first (sub-)block (q6_k: its low nibble;
# q3_k: the hmask byte whose bits 2..3 are the third bits of elements 69 and 101).
CODE_BYTE = {"q4_k": 16 + 5, "q5_k": 48 + 5, "q6_k": 5, "q3_k": 5, "q2_k": 16 + 5, "iq4_nl": 2 + 5, "iq4_xs": 8 + 5}


@pytest.mark.parametrize("scheme", GOLDEN_BYTES)
def test_error_bound_catches_a_wrong_code(scheme):
    x = np.load(GOLDEN / "input.npy")[-4:]
    s, p = SCHEMES[scheme], QuantParams(scheme)
    raw = s.quantize(x, p).copy()
    raw[CODE_BYTE[scheme]] ^= 0x0C  # the code moves by 4 or more (grid) steps
    deq = s.dequantize(raw, *x.shape, p)
    assert not (np.abs(x - deq) <= s.error_bound(x, raw, p)).all()


@pytest.mark.parametrize("scheme", KQUANTS)
def test_k_quants_need_whole_super_blocks(scheme):
    s, p = SCHEMES[scheme], QuantParams(scheme)
    assert "multiple of 256" in s.check([4, 576], p)
    assert s.check([4, 512], p) is None


def test_nearest_int_is_ggml_rounding():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.49999, 4194303.0, 1e-40], np.float32)
    assert qs.nearest_int(v).tolist() == [0, 2, 2, 0, -2, 3, 4194303, 0]


@pytest.mark.parametrize("scheme", GOLDEN_BYTES)
@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_bad_importance_is_refused(scheme, bad):
    x = np.ones((2, 256), np.float32)
    imp = np.ones(256, np.float32)
    imp[9] = bad
    with pytest.raises(IEError, match=r"w\.q: importance of column 9 is"):
        SCHEMES[scheme].quantize(x, QuantParams(scheme), name="w.q", importance=imp)


def test_importance_of_the_wrong_length_is_refused():
    with pytest.raises(IEError, match=r"w\.q: importance has 255 columns, the matrix 256"):
        Q4K.quantize(np.ones((2, 256), np.float32), P, name="w.q", importance=np.ones(255, np.float32))


def _weighted_err(x, deq, imp):
    return float((imp.astype(np.float64) * (x.astype(np.float64) - deq) ** 2).sum())


@pytest.mark.parametrize("scheme", ["q4_0", "q4_1", "q5_0", "q5_1"] + KQUANTS)
def test_weighted_quantization_is_no_worse_than_llama_cpp_with_the_same_imatrix(scheme):
    """q4_0/q4_1 keep llama.cpp's search but choose every code for the scale as
    stored (f16), so their importance-weighted error may not exceed what
    llama.cpp's own imatrix quantization of the same input reaches; the
    k-quants are byte-identical to it."""
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy")
    s, p = SCHEMES[scheme], QuantParams(scheme)
    ours = s.quantize(x, p, importance=imp)
    ref = _golden(f"{scheme}-imatrix.bin")
    ours_deq = s.dequantize(ours, *x.shape, p)
    ref_deq = gguf.quants.dequantize(ref.reshape(x.shape[0], -1), gguf.GGMLQuantizationType[scheme.upper()])
    assert _weighted_err(x, ours_deq, imp) <= _weighted_err(x, ref_deq.astype(np.float32), imp) * (1 + 1e-6)
    assert (np.abs(x - ours_deq) <= s.error_bound(x, ours, p)).all()
    if scheme not in KQUANTS:  # the same search: the f16 scale (and min) of every block are llama.cpp's
        head = 2 * len(s.F16_FIELDS)
        ob, rb = ours.reshape(-1, s.block_bytes), ref.reshape(-1, s.block_bytes)
        assert np.array_equal(ob[:, :head], rb[:, :head])
    # and without the importance the llama.cpp-compatible bytes are untouched
    assert np.array_equal(s.quantize(x, p), _golden(f"{scheme}.bin"))


def test_mxfp4_importance_is_no_worse_than_llama_cpp():
    """llama.cpp's MXFP4 quantizer takes no importance matrix, so its bytes
    with one are its bytes without (gguf.quants'); ours, searching the
    exponent under the weights, may not do worse by their measure."""
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy")
    s, p = SCHEMES["mxfp4"], QuantParams("mxfp4")
    ours = s.quantize(x, p, importance=imp)
    ours_deq = s.dequantize(ours, *x.shape, p)
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    ref_deq = gguf.quants.dequantize(ref, gguf.GGMLQuantizationType.MXFP4).astype(np.float32)
    assert _weighted_err(x, ours_deq, imp) <= _weighted_err(x, ref_deq, imp)
    assert _weighted_err(x, ours_deq, imp) < 0.99 * _weighted_err(x, ref_deq, imp)  # and the search does something
    assert (np.abs(x - ours_deq) <= s.error_bound(x, ours, p)).all()


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


@pytest.mark.parametrize("scheme, d_at", [("q6_k", 208), ("q3_k", 32 + 64 + 12), ("iq3_s", 0), ("iq3_xxs", 0), ("iq2_xxs", 0),
                                           ("iq2_xs", 0), ("iq2_s", 0), ("iq1_s", 0)])  # d last; codebooks: first
def test_a_nonfinite_d_at_the_end_of_a_block_is_found(scheme, d_at):
    """The payload scan (ieconv validate --deep, formats/finite.py) finds a NaN d
    where ggml's struct keeps it: after the codes and sub-scales (q6_k, q3_k),
    or first (the codebook types, whose d is the only float in their blocks)."""
    from iekit.formats.finite import PayloadScan

    s, p = SCHEMES[scheme], QuantParams(scheme)
    raw = s.quantize(np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32), p).copy()
    at = 3 * s.block_bytes + d_at  # row 1, second super-block
    raw[at:at + 2] = np.array([np.nan], np.float16).view(np.uint8)
    scan = PayloadScan({"dtype": scheme, "shape": [2, 512], "quant": s.quant_dict(512, p)})
    for i in range(0, raw.size, 100):
        scan.feed(raw[i:i + 100].tobytes())
    assert scan.problem is not None and "block 3 (row 1, columns 256..511)" in scan.problem and "d is nan" in scan.problem
