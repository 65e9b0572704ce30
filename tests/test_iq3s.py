"""iq3_s: llama.cpp's IQ3_S codebook type (formats/quant.py IQ3_S,
formats/codebooks.py), checked against gguf-py's table and dequantizer
(independent of our code) and against q3_k, the uniform grid of the same
size that it exists to beat. The checks the codebook types share (sizes,
gguf-py's reading of the hostile golden rows and of random scales, the
refusals) run here for iq3_xxs and iq2_xxs too; their own in tests/test_xxs.py.

The native decoders' bytes are held to gguf-py's here (every codebook
entry) and in tests/test_gemv.py (random blocks, every ISA and layout); GGUF import and export byte for byte,
and a model run on every path, in tests/test_quantize_imatrix.py.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iekit.formats.codebooks import IQ3S
from iekit.formats.errors import IEError
from iekit.formats.quant import SCHEMES, QuantParams

S, P = SCHEMES["iq3_s"], QuantParams("iq3_s")
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "quant"


def _gguf_deq(raw: np.ndarray, rows: int, scheme: str = "iq3_s") -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[scheme.upper()]).astype(np.float32)


def _err(x, deq, imp=None):
    d = (x.astype(np.float64) - deq) ** 2
    return float((d if imp is None else d * imp).sum())


def test_codebook_is_gguf_py_s():
    gguf.quants.IQ3_S.init_grid()
    ref = np.asarray(gguf.quants.IQ3_S.grid, np.float32).reshape(512, 4)
    assert np.array_equal(IQ3S.grid, ref)


def test_native_decoder_reads_every_codebook_entry_as_gguf_py_does():
    """csrc/common/IQ3S.h is the other copy of the codebook: eight rows
    whose tuples index all 512 entries in turn (random signs, sub-scales and
    d) dequantize natively to gguf-py's values bit for bit."""
    from iekit.runtime import kernels

    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (8, S.block_bytes), dtype=np.uint8)
    raw[:, 0:2] = np.array(rng.uniform(0.01, 1, 8), np.float16).view(np.uint8).reshape(8, 2)
    k = np.arange(512).reshape(8, 64)  # row r, tuple t: entry 64 r + t
    raw[:, S.QS:S.QS + 64] = k & 0xFF
    raw[:, S.QH:S.QH + 8] = ((k >> 8).reshape(8, 8, 8) << np.arange(8)).sum(axis=2)
    got = kernels.dequantize(raw.reshape(-1), {"name": "w", "dtype": "iq3_s", "shape": [8, 256],
                                               "quant": {"scheme": "iq3_s", "block_size": 256}})
    assert np.array_equal(got.view(np.uint32), _gguf_deq(raw, 8).view(np.uint32))


# The codebook types (their own checks: here for iq3_s, tests/test_xxs.py, tests/test_iq2.py and
# tests/test_iq1.py for the others)
CODEBOOK_TYPES = ["iq3_s", "iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"]


@pytest.mark.parametrize("scheme, bits", [("iq3_s", 3.4375), ("iq3_xxs", 3.0625), ("iq2_xxs", 2.0625), ("iq2_xs", 2.3125),
                                          ("iq2_s", 2.5625), ("iq1_s", 1.5625), ("iq1_m", 1.75)])
def test_block_is_llama_cpp_s_size(scheme, bits):
    s = SCHEMES[scheme]
    assert (s.block_elems, s.block_bytes) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[scheme.upper()]]
    assert s.nbytes(4, 512) * 8 / (4 * 512) == bits


@pytest.mark.parametrize("scheme", CODEBOOK_TYPES)
@pytest.mark.parametrize("weighted", [False, True])
def test_golden_input_dequantizes_as_gguf_does_within_the_bound(scheme, weighted):
    """The hostile golden rows (zeros, constants, subnormals, an outlier, ties):
    our bytes read back by gguf-py give our values bit for bit, within the bound."""
    s, p = SCHEMES[scheme], QuantParams(scheme)
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy") if weighted else None
    raw = s.quantize(x, p, importance=imp)
    assert raw.size == s.nbytes(*x.shape, p)
    ours = s.dequantize(raw, *x.shape, p)
    assert np.array_equal(ours.view(np.uint32), _gguf_deq(raw, x.shape[0], scheme).view(np.uint32))
    assert (np.abs(x - ours) <= s.error_bound(x, raw, p)).all()
    if scheme == "iq3_s":
        assert np.array_equal(ours[0], np.zeros(512, np.float32))  # an all-zero row stays zero (the others have no 0)


@pytest.mark.parametrize("dist", ["normal", "student-t"])
def test_less_error_than_q3_k_at_the_same_size(dist):
    """The reason for the type: at q3_k's 3.4375 bits the codebook leaves
    clearly less error, with and without an importance vector (here 0.66-0.7x)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 1024)) if dist == "normal" else rng.standard_t(4, (64, 1024))).astype(np.float32)
    imp = (rng.uniform(0.2, 3, 1024) ** 2).astype(np.float32)
    q3 = SCHEMES["q3_k"]
    for w in (None, imp):
        ours = _err(x, S.dequantize(S.quantize(x, P, importance=w), *x.shape, P), w)
        theirs = _err(x, q3.dequantize(q3.quantize(x, QuantParams("q3_k"), importance=w), *x.shape, QuantParams("q3_k")), w)
        assert ours < 0.8 * theirs, (w is not None, ours / theirs)


def test_nearest_entry_is_the_exhaustive_one_up_to_a_hair():
    """The neighbour lists stand in for a search of all 512 entries: on-grid
    tuples find themselves, and off-grid ones lose under 0.5% of the
    weighted error an exhaustive search leaves."""
    g = IQ3S.grid
    w1 = np.ones((512, 4), np.float32)
    assert np.array_equal(IQ3S.nearest(g, w1), np.arange(512))
    rng = np.random.default_rng(0)
    u = rng.uniform(0, 16, (20000, 4)).astype(np.float32)
    w = rng.uniform(0.1, 1, (20000, 4)).astype(np.float32)
    best = np.einsum("mkj,mkj,mj->mk", u[:, None] - g[None], u[:, None] - g[None], w).min(axis=1)
    got = ((u - g[IQ3S.nearest(u, w)]) ** 2 * w).sum(axis=1)
    assert (got >= best - 1e-4).all()
    assert got.sum() <= 1.005 * best.sum()


def test_a_flipped_sign_breaks_the_bound():
    x = np.load(GOLDEN / "input.npy")[-4:]
    raw = S.quantize(x, P).copy()
    e = int(np.abs(x[0, :32]).argmax())  # row 0's first sub-block: its largest weight's sign bit
    raw[S.SIGNS + e // 8] ^= 1 << (e % 8)
    deq = S.dequantize(raw, *x.shape, P)
    assert not (np.abs(x - deq) <= S.error_bound(x, raw, P)).all()


@pytest.mark.parametrize("scheme", CODEBOOK_TYPES)
def test_rows_need_whole_super_blocks(scheme):
    s, p = SCHEMES[scheme], QuantParams(scheme)
    assert "multiple of 256" in s.check([4, 576], p)
    assert s.check([4, 512], p) is None


@pytest.mark.parametrize("scheme", CODEBOOK_TYPES)
def test_a_scale_f16_cannot_hold_is_refused(scheme):
    s, p = SCHEMES[scheme], QuantParams(scheme)
    with pytest.raises(IEError, match=r"w\.q: scale .* overflows f16"):
        s.quantize(np.full((1, 256), 3e9, np.float32), p, name="w.q")


@pytest.mark.parametrize("scheme", CODEBOOK_TYPES)
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), supers=st.integers(1, 3), log_scale=st.floats(-30, 3), seed=st.integers(0, 2**31))
def test_round_trip_on_random_scales(scheme, rows, supers, log_scale, seed):
    s, p = SCHEMES[scheme], QuantParams(scheme)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, 256 * supers)) * 10.0 ** log_scale).astype(np.float32)
    raw = s.quantize(x, p)
    deq = s.dequantize(raw, rows, x.shape[1], p)
    assert np.array_equal(deq.view(np.uint32), _gguf_deq(raw, rows, scheme).view(np.uint32))
    assert (np.abs(x - deq) <= s.error_bound(x, raw, p)).all()
