"""iq3_xxs and iq2_xxs: llama.cpp's IQ3_XXS and IQ2_XXS codebook types
(formats/quant.py, formats/codebooks.py), checked against gguf-py's tables
and dequantizer and against llama.cpp's own files of those types
(independent of our code).

They are what llama.cpp's IQ3_XS / IQ3_XXS / IQ2_XXS mixes and the low-bit
quants users download for large models hold most matrices in; before they
were native types, gguf-to-iebin dequantized such a file to f32, ten to
fifteen times its size. The two share their signs (seven stored per eight
weights, the eighth their parity) and their scales; the native decoders'
bytes are held to gguf-py's here (every codebook entry) and in
tests/test_gemv.py (random blocks, every ISA and layout); the hostile golden
rows, random scales and the refusals beside iq3_s's in tests/test_iq3s.py;
our bytes imported and exported byte for byte, and a model on every path,
in tests/test_quantize_imatrix.py.
"""

from __future__ import annotations

import subprocess
import sys

import gguf
import numpy as np
import pytest

from conftest import GOLDEN, REPO, run_tool
from iekit.formats import codebooks, iebin
from iekit.formats.quant import SCHEMES, QuantParams
from iekit.runtime.decoder import Decoder
from test_quantize_imatrix import TEXT, _quantize, int8_bound, wide  # noqa: F401  (the fixture)

sys.path.insert(0, str(REPO / "benchmarks"))
from llamacpp import tool  # noqa: E402

QUANT = GOLDEN / "quant"
QUANTIZE = tool("llama-quantize")
# Per type: its codebook, the stored magnitudes, entries and magnitudes per entry
BOOKS = {"iq3_xxs": (codebooks.IQ3XXS, [4, 12, 20, 28, 36, 44, 52, 62], 256, 4),
         "iq2_xxs": (codebooks.IQ2XXS, [8, 25, 43], 256, 8)}
XXS = sorted(BOOKS)


def _gguf_deq(raw: np.ndarray, rows: int, scheme: str) -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[scheme.upper()]).astype(np.float32)


def _err(x, deq, imp=None):
    d = (x.astype(np.float64) - deq) ** 2
    return float((d if imp is None else d * imp).sum())


def _sp(scheme):
    return SCHEMES[scheme], QuantParams(scheme)


@pytest.mark.parametrize("scheme", XXS)
def test_codebook_is_gguf_py_s(scheme):
    book, levels, entries, dims = BOOKS[scheme]
    q = getattr(gguf.quants, scheme.upper())
    q.init_grid()
    ref = np.asarray(q.grid, np.float32).reshape(entries, dims)
    assert np.array_equal(book.grid * book.unit, ref)
    assert sorted(set(ref.ravel())) == levels


@pytest.mark.parametrize("scheme", XXS)
def test_native_decoder_reads_every_codebook_entry_as_gguf_py_does(scheme):
    """csrc/common/codebooks.h is the other copy of the codebook: rows whose
    tuples index every entry in turn (random signs, sub-scales and d)
    dequantize natively to gguf-py's values bit for bit."""
    from iekit.runtime import kernels

    s, _p = _sp(scheme)
    book, _l, entries, dims = BOOKS[scheme]
    rows = entries // (256 // dims)
    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (rows, s.block_bytes), dtype=np.uint8)
    raw[:, 0:2] = np.array(rng.uniform(0.01, 1, rows), np.float16).view(np.uint8).reshape(rows, 2)
    idx = np.arange(entries, dtype=np.uint8).reshape(rows, 8, 256 // dims // 8)
    raw[:] = np.concatenate([raw[:, :2], s._codes(idx, s._aux(raw))], axis=1)
    assert np.array_equal(s._entries(raw), idx)
    got = kernels.dequantize(raw.reshape(-1), {"name": "w", "dtype": scheme, "shape": [rows, 256],
                                               "quant": {"scheme": scheme, "block_size": 256}})
    assert np.array_equal(got.view(np.uint32), _gguf_deq(raw, rows, scheme).view(np.uint32))


@pytest.mark.parametrize("scheme", [*XXS, "iq2_xs"])  # iq2_xs keeps their signs (tests/test_iq2.py)
def test_signs_keep_their_parity_and_give_up_only_the_least_weight(scheme):
    """Seven stored sign bits per eight weights: a group with an odd number
    of negative weights stores one of them with the other sign, and that one
    is the group's smallest in magnitude (unit weights); every other sign is
    the weight's own."""
    s, p = _sp(scheme)
    x = np.random.default_rng(4).standard_normal((8, 512)).astype(np.float32)
    raw = s.quantize(x, p)
    want = (x < 0).reshape(-1, 8)
    got = (_gguf_deq(raw, 8, scheme) < 0).reshape(-1, 8)
    assert (got.sum(axis=1) % 2 == 0).all()
    wrong = want != got
    odd = want.sum(axis=1) % 2 == 1
    assert (wrong.sum(axis=1) == odd).all()
    least = np.abs(x).reshape(-1, 8).argmin(axis=1)
    assert np.array_equal(np.flatnonzero(wrong.ravel()), (np.flatnonzero(odd) * 8 + least[odd]))


# Each type's error against the uniform k-quants around it, on Gaussian and
# Student-t rows with and without an importance vector: (type, bound), the
# error below bound x the type's (measured: iq3_xxs 0.32-0.37x q2_k's and
# 0.98-1.40x q3_k's at 3.0625 bits against 2.625 and 3.4375; iq2_xxs
# 1.19-1.25x q2_k's at 0.79x its bits, 1.31-1.51x with an importance vector).
AROUND = {"iq3_xxs": (("q2_k", 0.4), ("q3_k", 1.45)), "iq2_xxs": (("q2_k", 1.6),)}


@pytest.mark.parametrize("scheme", XXS)
@pytest.mark.parametrize("dist", ["normal", "student-t"])
def test_error_beside_the_k_quants_of_about_its_size(scheme, dist):
    s, p = _sp(scheme)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 1024)) if dist == "normal" else rng.standard_t(4, (64, 1024))).astype(np.float32)
    imp = (rng.uniform(0.2, 3, 1024) ** 2).astype(np.float32)
    for w in (None, imp):
        ours = _err(x, s.dequantize(s.quantize(x, p, importance=w), *x.shape, p), w)
        for name, bound in AROUND[scheme]:
            t, tp = _sp(name)
            theirs = _err(x, t.dequantize(t.quantize(x, tp, importance=w), *x.shape, tp), w)
            assert ours < bound * theirs, (w is not None, name, ours / theirs)


@pytest.mark.parametrize("scheme", XXS)
def test_a_flipped_sign_breaks_the_bound(scheme):
    """The bound lets a group with an odd number of negative weights store
    one with the other sign, and no other: a stored sign bit toggled for the
    largest weight of an even group (first 256 of row 0) falls outside it."""
    s, p = _sp(scheme)
    x = np.load(QUANT / "input.npy")[-4:]
    raw = s.quantize(x, p).copy().reshape(4, -1)
    a = np.abs(x[0, :256]).reshape(32, 8).copy()
    a[(x[0, :256] < 0).reshape(32, 8).sum(axis=1) % 2 == 1] = 0  # odd groups
    a[:, 7] = 0  # the eighth sign is not stored
    e = int(a.argmax())
    aux = s._aux(raw[:1])
    aux[0, e // 32] ^= np.uint32(1 << (7 * (e % 32 // 8) + e % 8))
    s._set_aux(raw[:1], aux)
    deq = s.dequantize(raw.reshape(-1), *x.shape, p)
    assert np.sign(deq[0, e]) != np.sign(x[0, e])
    assert not (np.abs(x - deq) <= s.error_bound(x, raw.reshape(-1), p)).all()


@pytest.mark.parametrize("scheme", XXS)
def test_sub_scales_refit_by_gptq_keep_the_codes(scheme):
    """with_sub_scales (gptq's refit) rewrites d and the scale nibbles only:
    the indices and the signs (the aux words' low 28 bits) stay."""
    s, p = _sp(scheme)
    x = np.random.default_rng(6).standard_normal((4, 256)).astype(np.float32)
    raw = s.quantize(x, p).reshape(4, -1)
    values = s.sub_scale_fields(raw).values * np.float32(1.1)
    out = s.with_sub_scales(raw, values)
    assert np.array_equal(s._entries(out), s._entries(raw))
    assert np.array_equal(s._aux(out) & 0x0FFFFFFF, s._aux(raw) & 0x0FFFFFFF)
    np.testing.assert_allclose(s.sub_scale_fields(out).values, values, rtol=0.05)


@pytest.mark.skipif(QUANTIZE is None, reason="llama.cpp's llama-quantize is not built (make llamacpp)")
@pytest.mark.parametrize("scheme", XXS)
def test_llama_cpp_s_own_file_runs_at_its_size(wide, tmp_path, scheme):  # noqa: F811
    own_file_runs_at_its_size(wide, tmp_path, scheme)


# llama-quantize's mix whose --pure files hold a type, where its name is not the type's
MIX_OF = {"iq2_s": "IQ2_M"}


def own_file_runs_at_its_size(wide, tmp_path, scheme):  # noqa: F811
    """A file llama-quantize wrote as the codebook type `scheme` (llama.cpp's
    bytes, not ours): gguf-to-iebin keeps its blocks, so the artifact is near
    the file's size rather than the f32 it used to become, and ierun's logits
    on every path are those of the file's dequantized float model."""
    f32 = tmp_path / "f32.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", wide["f32"], "--out", f32)
    assert res.returncode == 0, res.stderr
    q, im = tmp_path / f"{scheme}.gguf", tmp_path / "imatrix.gguf"
    # llama-quantize takes these types only with an importance matrix: ours, in llama.cpp's GGUF form
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", wide["f32"], "--text-file", TEXT, "--ctx", "64",
                   "--chunks", "2", "-o", im)
    assert res.returncode == 0, res.stderr
    # --pure: every matrix of the mix's type (llama.cpp's mixes put others beside it; its IQ2_M mix's type is
    # IQ2_S) but the embedding, which no importance matrix has (a lookup)
    res = subprocess.run([QUANTIZE, "--pure", "--imatrix", str(im), "--token-embedding-type", "q8_0", str(f32), str(q),
                          MIX_OF.get(scheme, scheme.upper())],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q)).tensors}
    n = sum(v == scheme.upper() for v in types.values())
    assert n >= 8, types
    kept, flat = tmp_path / "kept", tmp_path / "flat"
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", q, "--out-dir", kept)
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(kept)
    assert sum(t["dtype"] == scheme for t in m.tensors) == n
    assert (kept / "model.ie.bin").stat().st_size < 0.2 * (wide["f32"] / "model.ie.bin").stat().st_size
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", q, "--out-dir", flat, "--dequantize").returncode == 0
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 320, 24)]
    ref = Decoder(flat).logits(ids).astype(np.float64)
    for act, tol in (("f32", 1e-4), ("int8", int8_bound(scheme))):
        for isa in ("scalar", "avx2"):
            got = Decoder(kept, act=act, isa=isa).logits(ids)
            assert np.abs(got - ref).max() / np.abs(ref).max() <= tol, (act, isa)


@pytest.mark.parametrize("scheme", ["iq2_xxs", "iq2_xs", "iq1_s"])
def test_copies_larger_than_the_stored_bytes_only_where_memory_allows(wide, monkeypatch, scheme):  # noqa: F811
    """iq2_xxs's rows8 copies hold 4.25 bits a weight, twice what is stored
    (iq2_xs's 4.56, 1.97x; iq1_s's 4.56, 2.9x): with the memory for them the decoder makes them
    (the tile kernels); without, those matrices keep their stored bytes
    (runtime/expert_copies.py grow_copies), a prefill chunk packs them into
    tiles as it goes and a decode step reads them as stored, and the int8
    products are the same to rounding."""
    from iekit.runtime import expert_copies

    out, _m, _r = _quantize(wide, f"{scheme}-copies", "--scheme", scheme)
    ids = [int(i) for i in np.random.default_rng(4).integers(0, 320, 12)]
    grown = Decoder(out, threads=2, act="int8", isa="avx2")
    monkeypatch.setattr(expert_copies, "available_bytes", lambda: 1)
    kept = Decoder(out, threads=2, act="int8", isa="avx2")
    stored = sum(t["nbytes"] for t in iebin.load_model(out).tensors if t["dtype"] == scheme)
    assert grown.rows8_bytes - kept.rows8_bytes > 1.9 * stored  # the copies were 1.97-2.06x the stored bytes
    a, b = grown.logits(ids).astype(np.float64), kept.logits(ids).astype(np.float64)  # 12 tokens: packed
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    kept.prefill(ids[:1])
    steps = np.stack([kept.step(t) for t in ids[1:4]]).astype(np.float64)  # one token: the stored layout
    # the two layouts' sums agree to rounding, so the logits do (median 1e-7: a wrong product moves most of
    # them); where a sum differs in its last place an activation may round to the other int8 in the next
    # layer, which moved iq1_s's logits by up to 2.4e-4 (9e-4 in another run), so the largest is held to 2e-3
    d = np.abs(steps - a[1:4]) / np.abs(a).max()
    assert np.median(d) <= 1e-6 and d.max() <= 2e-3, (np.median(d), d.max())
    monkeypatch.setattr(expert_copies, "available_bytes", lambda: None)  # unknown: as before
    assert Decoder(out, threads=2, act="int8", isa="avx2").rows8_bytes == grown.rows8_bytes
