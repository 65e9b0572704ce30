"""iq2_xs and iq2_s: llama.cpp's IQ2_XS and IQ2_S codebook types
(formats/quant.py, formats/codebooks.py), checked against gguf-py's tables
and dequantizer and against llama.cpp's own files of those types
(independent of our code).

They are what llama.cpp's IQ2_XS and IQ2_S mixes (IQ2_XS) and its IQ2_M mix
(IQ2_S) hold most matrices in, the 2-bit files users download for 70B and
larger models; before they were native types, gguf-to-iebin dequantized
such a file to f32, twelve to fourteen times its size. Both are IQ2_XXS's
eight-tuples of 8, 25, 43 from larger codebooks (512 and 1024 entries)
under a 4-bit scale per 16 weights, not 32; IQ2_XS keeps IQ2_XXS's seven
sign bits per eight weights, IQ2_S stores all eight. Their stored-layout
kernels are held to gguf-py's values in tests/test_gemv.py (random blocks,
every ISA); the hostile golden rows, random scales and the refusals beside
the other codebook types' in tests/test_iq3s.py; our bytes imported and
exported byte for byte, and a model on every path, in
tests/test_quantize_imatrix.py.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from iekit.formats import codebooks
from iekit.formats.quant import SCHEMES, QuantParams
from test_quantize_imatrix import wide  # noqa: F401  (the fixture)
from test_xxs import QUANT, QUANTIZE, _gguf_deq, own_file_runs_at_its_size

BOOKS = {"iq2_xs": (codebooks.IQ2XS, 512), "iq2_s": (codebooks.IQ2S, 1024)}
IQ2 = sorted(BOOKS)


def _sp(scheme):
    return SCHEMES[scheme], QuantParams(scheme)


@pytest.mark.parametrize("scheme", IQ2)
def test_codebook_is_gguf_py_s(scheme):
    book, entries = BOOKS[scheme]
    q = getattr(gguf.quants, scheme.upper())
    q.init_grid()
    ref = np.asarray(q.grid, np.float32).reshape(entries, 8)
    assert np.array_equal(book.grid * book.unit, ref)
    assert sorted(set(ref.ravel())) == [8, 25, 43]
    assert len(np.unique(book.words)) == entries


@pytest.mark.parametrize("scheme", IQ2)
def test_native_decoder_reads_every_codebook_entry_as_gguf_py_does(scheme):
    """csrc/common/codebooks.h is the other copy of the codebook: rows whose
    eight-tuples index every entry in turn (random signs, sub-scales and d)
    dequantize natively, and in numpy, to gguf-py's values bit for bit."""
    from iekit.runtime import kernels

    s, p = _sp(scheme)
    _book, entries = BOOKS[scheme]
    rows = entries // 32
    rng = np.random.default_rng(9)
    d16 = rng.uniform(0.01, 1, rows).astype(np.float16)
    sub = rng.integers(0, 16, (rows, 16)).astype(np.uint8)
    neg = rng.random((rows, 256)) < 0.5
    raw = s._pack(d16, sub, np.arange(entries).reshape(rows, 16, 2), neg)
    assert raw.shape == (rows, s.block_bytes)
    want = _gguf_deq(raw, rows, scheme)
    got = kernels.dequantize(raw.reshape(-1), {"name": "w", "dtype": scheme, "shape": [rows, 256],
                                               "quant": {"scheme": scheme, "block_size": 256}})
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(s.dequantize(raw.reshape(-1), rows, 256, p).view(np.uint32), want.view(np.uint32))
    if scheme == "iq2_s":  # every sign as given
        assert np.array_equal(want < 0, neg)


def test_iq2_s_keeps_every_sign():
    """IQ2_S stores a sign per weight: no group gives one up (IQ2_XS's
    parity, like the XXS types', in tests/test_xxs.py)."""
    s, p = _sp("iq2_s")
    x = np.random.default_rng(4).standard_normal((8, 512)).astype(np.float32)
    assert np.array_equal(_gguf_deq(s.quantize(x, p), 8, "iq2_s") < 0, x < 0)


# Each type's error against q2_k's (2.625 bits), on Gaussian and Student-t
# rows with and without an importance vector: the bound on the ratio
# (measured: iq2_s 0.67-0.96x at 2.5625 bits, iq2_xs 0.87-1.07x at 2.3125,
# iq2_xxs 1.2-1.58x at 2.0625): each more bits, less error.
AROUND = {"iq2_xs": 1.15, "iq2_s": 1.0}


@pytest.mark.parametrize("dist", ["normal", "student-t"])
def test_error_falls_with_each_bit_and_meets_q2_k(dist):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 1024)) if dist == "normal" else rng.standard_t(4, (64, 1024))).astype(np.float32)
    imp = (rng.uniform(0.2, 3, 1024) ** 2).astype(np.float32)
    for w in (None, imp):
        err = {}
        for name in ("iq2_xxs", "iq2_xs", "iq2_s", "q2_k"):
            s, p = _sp(name)
            d = (x.astype(np.float64) - s.dequantize(s.quantize(x, p, importance=w), *x.shape, p)) ** 2
            err[name] = float((d if w is None else d * w).sum())
        assert err["iq2_s"] < err["iq2_xs"] < err["iq2_xxs"], (w is not None, err)
        for name, bound in AROUND.items():
            assert err[name] < bound * err["q2_k"], (w is not None, name, err[name] / err["q2_k"])


def _toggle_sign(scheme: str, raw: np.ndarray, e: int) -> None:
    """Flip the stored sign bit of element e (< 256) of row 0's first block."""
    s = SCHEMES[scheme]
    if scheme == "iq2_s":
        raw[0, s.SIGNS + e // 8] ^= np.uint8(1 << (e % 8))
    else:  # bit 9 + k of the group's u16 (its eighth sign is not stored)
        assert e % 8 != 7
        raw[0, s.QS + 2 * (e // 8) + 1] ^= np.uint8(1 << (1 + e % 8))


@pytest.mark.parametrize("scheme", IQ2)
def test_a_flipped_sign_breaks_the_bound(scheme):
    """The bound allows IQ2_XS's one flip per odd group of eight and no
    other: a stored sign toggled for the largest weight of an even group
    (IQ2_S: of any group) falls outside it."""
    s, p = _sp(scheme)
    x = np.load(QUANT / "input.npy")[-4:]
    raw = s.quantize(x, p).copy().reshape(4, -1)
    a = np.abs(x[0, :256]).reshape(32, 8).copy()
    if scheme == "iq2_xs":
        a[(x[0, :256] < 0).reshape(32, 8).sum(axis=1) % 2 == 1] = 0  # odd groups
        a[:, 7] = 0  # the eighth sign is not stored
    e = int(a.argmax())
    _toggle_sign(scheme, raw, e)
    deq = s.dequantize(raw.reshape(-1), *x.shape, p)
    assert np.sign(deq[0, e]) != np.sign(x[0, e])
    assert not (np.abs(x - deq) <= s.error_bound(x, raw.reshape(-1), p)).all()


@pytest.mark.parametrize("scheme", IQ2)
def test_sub_scales_refit_by_gptq_keep_the_codes(scheme):
    """with_sub_scales (gptq's refit) rewrites d and the sixteen scale
    nibbles only: indices and signs stay, and the scales are refit per 16."""
    s, p = _sp(scheme)
    x = np.random.default_rng(6).standard_normal((4, 256)).astype(np.float32)
    raw = s.quantize(x, p).reshape(4, -1)
    fields = s.sub_scale_fields(raw)
    assert fields.width == 16 and fields.values.shape == (4, 1, 16)
    out = s.with_sub_scales(raw, fields.values * np.float32(1.1))
    assert np.array_equal(out[:, 2:s.SCALES], raw[:, 2:s.SCALES])
    np.testing.assert_allclose(s.sub_scale_fields(out).values, fields.values * 1.1, rtol=0.05)


@pytest.mark.skipif(QUANTIZE is None, reason="llama.cpp's llama-quantize is not built (make llamacpp)")
@pytest.mark.parametrize("scheme", IQ2)
def test_llama_cpp_s_own_file_runs_at_its_size(wide, tmp_path, scheme):  # noqa: F811
    own_file_runs_at_its_size(wide, tmp_path, scheme)
