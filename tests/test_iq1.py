"""iq1_s and iq1_m: llama.cpp's IQ1_S and IQ1_M ternary codebook types
(formats/quant.py, formats/codebooks.py), checked against gguf-py's table
and dequantizer and against llama.cpp's own files of those types
(independent of our code).

They are what llama.cpp's IQ1_S and IQ1_M mixes, and the 1.58-bit quants
users run DeepSeek-R1, Kimi K2 and other models of hundreds of billions of
weights from, hold most (expert) matrices in; before they were native
types, gguf-to-iebin dequantized such a file to f32, twenty times its size.
Each eight weights are an entry of 2048 eight-tuples of -1, 0, 1 shifted by
+-1/8; IQ1_S has a 3-bit scale and one shift per 32 weights, IQ1_M a scale
per 16 and a shift per 8, and its f16 d spread over the top nibbles of its
scale words. Their stored-layout and rows8 kernels are held to gguf-py's
values in tests/test_gemv.py (random blocks, every ISA); the hostile golden
rows, random scales and the refusals beside the other codebook types' in
tests/test_iq3s.py; our bytes imported and exported byte for byte, and a
model on every path, in tests/test_quantize_imatrix.py; gptq's refits in
tests/test_gptq.py.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from iekit.formats import _search, codebooks
from iekit.formats.quant import SCHEMES, QuantParams
from test_quantize_imatrix import wide  # noqa: F401  (the fixture)
from test_xxs import QUANTIZE, _gguf_deq, own_file_runs_at_its_size

IQ1 = ["iq1_m", "iq1_s"]


def _sp(scheme):
    return SCHEMES[scheme], QuantParams(scheme)


def test_codebook_is_gguf_py_s():
    q = gguf.quants.IQ1_S
    q.init_grid()
    ref = np.asarray(q.grid, np.float32).reshape(2048, 8)
    assert np.array_equal(codebooks.IQ1S.grid, ref)
    assert sorted(set(ref.ravel())) == [-1, 0, 1]
    assert len(np.unique(codebooks.IQ1S.words)) == 2048


@pytest.mark.parametrize("scheme", IQ1)
def test_native_decoder_reads_every_codebook_entry_as_gguf_py_does(scheme):
    """csrc/common/codebooks.h is the other copy of the codebook: rows whose
    eight-tuples index every entry in turn (random shifts, sub-scales and d)
    dequantize natively, and in numpy, to gguf-py's values bit for bit."""
    from iekit.runtime import kernels

    s, p = _sp(scheme)
    rows = 2048 // 32
    rng = np.random.default_rng(9)
    d16 = rng.uniform(0.01, 1, rows).astype(np.float16)
    sub = rng.integers(0, 8, (rows, s.NSUB)).astype(np.uint8)
    neg = rng.random((rows, 256 // s.SHIFT)) < 0.5
    raw = s._pack(d16, sub, np.arange(2048).reshape(rows, 32), neg)
    assert raw.shape == (rows, s.block_bytes)
    assert np.array_equal(s.f16_field(raw, 0), d16)
    want = _gguf_deq(raw, rows, scheme)
    got = kernels.dequantize(raw.reshape(-1), {"name": "w", "dtype": scheme, "shape": [rows, 256],
                                               "quant": {"scheme": scheme, "block_size": 256}})
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(s.dequantize(raw.reshape(-1), rows, 256, p).view(np.uint32), want.view(np.uint32))
    # each group's shift as given: the mean of a group is d (1 + 2 s) (mean of its entry +- 1/8)
    idx, back = s._entries(raw)
    assert np.array_equal(idx, np.arange(2048).reshape(rows, 32)) and np.array_equal(back, neg)


def _shifted_scale_reference(x, w, cand_val, starts, moves, delta, group):
    """csrc/search/grid_nearest.cpp's shifted_row_scale in numpy, the same
    float32 operations in the same order, one row at a time."""
    f32 = np.float32
    n = len(x)
    amax = f32(np.abs(x).max())
    unit = (x / (amax if amax > 0 else f32(1))).astype(f32)
    levels = np.array([-1, 0, 1], f32)
    best, gain, place = f32(0), f32(0), f32(0)

    def fit(at):
        nonlocal best, gain, place
        sumqx = sumq2 = f32(0)
        for g0 in range(0, n, group):
            q, err = [], []
            for shift in (f32(delta), f32(-delta)):
                e, qs = f32(0), np.zeros(group, f32)
                for b in range(0, group, 8):
                    u = (unit[g0 + b:g0 + b + 8] * f32(at) - shift).astype(f32)
                    t = int(((u > -0.5).astype(int) + (u > 0.5)) @ 3 ** np.arange(8))
                    g = cand_val[t]  # [8, 16]
                    ww = w[g0 + b:g0 + b + 8]
                    c = int(np.argmin((g * (g - f32(2) * u[:, None]) * ww[:, None]).sum(axis=0)))
                    for j in range(8):
                        d = f32(u[j] - g[j, c])
                        e = f32(e + f32(f32(ww[j] * d) * d))
                        qs[b + j] = f32(g[j, c] + shift)
                q.append(qs)
                err.append(e)
            qs = q[1] if err[1] < err[0] else q[0]
            for j in range(group):
                wq = f32(w[g0 + j] * qs[j])
                sumqx = f32(sumqx + f32(wq * x[g0 + j]))
                sumq2 = f32(sumq2 + f32(wq * qs[j]))
        scale = f32(sumqx / (sumq2 if sumq2 > 0 else f32(np.inf)))
        if scale * sumqx > gain:
            best, gain, place = scale, f32(scale * sumqx), f32(at)

    for at in starts:
        fit(at)
    for m in moves:
        around = place
        fit(f32(around - m))
        fit(f32(around + m))
    return best


@pytest.mark.parametrize("scheme", IQ1)
def test_native_scale_search_is_its_numpy_description(scheme):
    """The scale search (TernaryCodebook.scales) against a numpy loop of the
    same steps: the same scale for every row but where the candidates'
    errors tie to a rounding (summed in another order here)."""
    s = SCHEMES[scheme]
    book = codebooks.IQ1S
    rng = np.random.default_rng(2)
    x = rng.standard_t(4, (40, s.SUB)).astype(np.float32)
    x[0] = 0
    w = rng.uniform(0.1, 2, x.shape).astype(np.float32)
    got = _search.shifted_scales(x, w, book.neighbours[1], book.starts, book.moves, np.float32(book.DELTA))
    want = np.array([_shifted_scale_reference(x[r], w[r], book.neighbours[1], book.starts, book.moves, book.DELTA,
                                              s.SHIFT) for r in range(len(x))], np.float32)
    assert got[0] == 0
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_shift_is_chosen_per_group():
    """Weights that sit on one shifted grid come back on it: groups of
    values (g + 1/8) and (g - 1/8) times one scale, each with a weight at
    the top (9/8), the shift of each group found (iq1_m: per eight weights;
    iq1_s: per 32) and every value, to the f16 rounding of d."""
    book = codebooks.IQ1S
    rng = np.random.default_rng(3)
    for scheme in IQ1:
        s, p = _sp(scheme)
        rows = 4
        neg = rng.random((rows, 256 // s.SHIFT)) < 0.5
        first = np.where(neg.repeat(s.SHIFT // 8, axis=1), -1, 1)  # each group's first weight: the top, its shift's sign
        idx = np.array([[rng.choice(np.flatnonzero(book.grid[:, 0] == f)) for f in row] for row in first])
        shift = np.where(neg, -book.DELTA, book.DELTA).repeat(s.SHIFT).reshape(rows, 256)
        x = ((book.grid[idx].reshape(rows, 256) + shift) * 0.01).astype(np.float32)
        raw = s.quantize(x, p).reshape(rows, -1)
        assert np.array_equal(s._entries(raw)[1], neg)
        np.testing.assert_allclose(s.dequantize(raw.reshape(-1), rows, 256, p), x, rtol=2e-3, atol=1e-7)


# Each type's error against iq2_xxs's (2.0625 bits), on Gaussian and
# Student-t rows with and without an importance vector: measured iq1_m
# 1.46-1.77x at 1.75 bits, iq1_s 1.83-2.23x at 1.5625 (the k-quants have no
# type this small; llama.cpp's own iq1 files beside ours: docs/quality.md).
AROUND = {"iq1_m": 1.9, "iq1_s": 2.4}


@pytest.mark.parametrize("dist", ["normal", "student-t"])
def test_error_falls_with_each_bit(dist):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 1024)) if dist == "normal" else rng.standard_t(4, (64, 1024))).astype(np.float32)
    imp = (rng.uniform(0.2, 3, 1024) ** 2).astype(np.float32)
    for w in (None, imp):
        err = {}
        for name in ("iq1_s", "iq1_m", "iq2_xxs"):
            s, p = _sp(name)
            d = (x.astype(np.float64) - s.dequantize(s.quantize(x, p, importance=w), *x.shape, p)) ** 2
            err[name] = float((d if w is None else d * w).sum())
        assert err["iq2_xxs"] < err["iq1_m"] < err["iq1_s"], (w is not None, err)
        for name, bound in AROUND.items():
            assert err[name] < bound * err["iq2_xxs"], (w is not None, name, err[name] / err["iq2_xxs"])


def test_iq1_m_d_lives_in_the_scale_words_top_nibbles():
    """IQ1_M has no bytes of its own for d: f16_field and set_f16_field
    read and write the four nibbles and nothing else, and the payload scan
    (ieconv validate --deep, formats/finite.py) finds a NaN d there."""
    from iekit.formats.finite import PayloadScan

    s, p = _sp("iq1_m")
    raw = s.quantize(np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32), p).reshape(4, -1)
    before = raw.copy()
    s.set_f16_field(raw, 0, np.full(4, np.nan, np.float16))
    assert np.isnan(s.f16_field(raw, 0)).all()
    changed = np.flatnonzero((raw != before).any(axis=0))
    assert set(changed) <= {49, 51, 53, 55}
    assert np.array_equal(raw[:, :48], before[:, :48]) and np.array_equal(raw[:, 48::2], before[:, 48::2])
    assert np.array_equal(raw[:, 49::2] & 0x0F, before[:, 49::2] & 0x0F)
    bad = before.copy()
    s.set_f16_field(bad[3:], 0, np.array([np.nan], np.float16))
    scan = PayloadScan({"dtype": "iq1_m", "shape": [2, 512], "quant": s.quant_dict(512, p)})
    scan.feed(bad.reshape(-1).tobytes())
    assert scan.problem is not None and "block 3 (row 1, columns 256..511)" in scan.problem and "d is nan" in scan.problem


@pytest.mark.parametrize("scheme", IQ1)
def test_sub_scales_refit_by_gptq_keep_the_codes(scheme):
    """with_sub_scales (gptq's refit) rewrites d and the 3-bit scales only:
    indices and shifts stay, and the scales are refit per SUB weights."""
    s, p = _sp(scheme)
    x = np.random.default_rng(6).standard_normal((4, 256)).astype(np.float32)
    raw = s.quantize(x, p).reshape(4, -1)
    fields = s.sub_scale_fields(raw)
    assert fields.width == s.SUB and fields.values.shape == (4, 1, s.NSUB)
    out = s.with_sub_scales(raw, fields.values * np.float32(1.1))
    for a, b in zip(s._entries(out), s._entries(raw), strict=True):
        assert np.array_equal(a, b)
    np.testing.assert_allclose(s.sub_scale_fields(out).values, fields.values * 1.1, rtol=0.08)


@pytest.mark.skipif(QUANTIZE is None, reason="llama.cpp's llama-quantize is not built (make llamacpp)")
@pytest.mark.parametrize("scheme", IQ1)
def test_llama_cpp_s_own_file_runs_at_its_size(wide, tmp_path, scheme):  # noqa: F811
    own_file_runs_at_its_size(wide, tmp_path, scheme)
