"""iq3_xxs: llama.cpp's IQ3_XXS codebook type (formats/quant.py IQ3_XXS,
formats/codebooks.py), checked against gguf-py's table and dequantizer
and against llama.cpp's own IQ3_XXS files (independent of our code).

IQ3_XXS is what llama.cpp's IQ3_XS / IQ3_XXS mixes and the low-bit quants
users download for large models hold most matrices in; before it was a
native type, gguf-to-iebin dequantized such a file to f32, ten times its
size. The native decoders' bytes are held to gguf-py's here (every
codebook entry) and in tests/test_gemv.py (random blocks, every ISA and
layout); the hostile golden rows, random scales and the refusals beside
iq3_s's in tests/test_iq3s.py; our bytes imported and exported byte for
byte, and a model on every path, in tests/test_quantize_imatrix.py.
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
from test_quantize_imatrix import TEXT, wide  # noqa: F401  (the fixture)

sys.path.insert(0, str(REPO / "benchmarks"))
from llamacpp import tool  # noqa: E402

S, P = SCHEMES["iq3_xxs"], QuantParams("iq3_xxs")
QUANT = GOLDEN / "quant"
QUANTIZE = tool("llama-quantize")


def _gguf_deq(raw: np.ndarray, rows: int) -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType.IQ3_XXS).astype(np.float32)


def _err(x, deq, imp=None):
    d = (x.astype(np.float64) - deq) ** 2
    return float((d if imp is None else d * imp).sum())


def _stored_negative(raw: np.ndarray, rows: int) -> np.ndarray:
    """Each element's stored sign as gguf-py reads it (negative: True)."""
    return _gguf_deq(raw, rows) < 0


def test_codebook_is_gguf_py_s():
    gguf.quants.IQ3_XXS.init_grid()
    ref = np.asarray(gguf.quants.IQ3_XXS.grid, np.float32).reshape(256, 4)
    assert np.array_equal(codebooks.IQ3XXS.grid() * 4, ref)
    assert sorted(set(ref.ravel())) == [4, 12, 20, 28, 36, 44, 52, 62]


def test_native_decoder_reads_every_codebook_entry_as_gguf_py_does():
    """csrc/common/iq3xxs_grid.h is the other copy of the codebook: four
    rows whose tuples index all 256 entries in turn (random signs,
    sub-scales and d) dequantize natively to gguf-py's values bit for bit."""
    from iekit.runtime import kernels

    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (4, S.block_bytes), dtype=np.uint8)
    raw[:, 0:2] = np.array(rng.uniform(0.01, 1, 4), np.float16).view(np.uint8).reshape(4, 2)
    raw[:, S.QS:S.QS + 64] = np.arange(256).reshape(4, 64)
    got = kernels.dequantize(raw.reshape(-1), {"name": "w", "dtype": "iq3_xxs", "shape": [4, 256],
                                               "quant": {"scheme": "iq3_xxs", "block_size": 256}})
    assert np.array_equal(got.view(np.uint32), _gguf_deq(raw, 4).view(np.uint32))


def test_signs_keep_their_parity_and_give_up_only_the_least_weight():
    """Seven stored sign bits per eight weights: a group with an odd number
    of negative weights stores one of them with the other sign, and that one
    is the group's smallest in magnitude (unit weights); every other sign is
    the weight's own."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    raw = S.quantize(x, P)
    want = (x < 0).reshape(-1, 8)
    got = _stored_negative(raw, 8).reshape(-1, 8)
    assert (got.sum(axis=1) % 2 == 0).all()
    wrong = want != got
    odd = want.sum(axis=1) % 2 == 1
    assert (wrong.sum(axis=1) == odd).all()
    least = np.abs(x).reshape(-1, 8).argmin(axis=1)
    assert np.array_equal(np.flatnonzero(wrong.ravel()), (np.flatnonzero(odd) * 8 + least[odd]))


@pytest.mark.parametrize("dist", ["normal", "student-t"])
def test_between_q2_k_and_q3_k(dist):
    """At 3.0625 bits (q3_k: 3.4375, q2_k: 2.625) the codebook leaves under
    0.4x q2_k's error (here 0.32-0.37x) and at most 1.45x q3_k's (0.98-1.40x:
    closest on heavy tails with an importance vector, as in real weights),
    with and without an importance vector."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 1024)) if dist == "normal" else rng.standard_t(4, (64, 1024))).astype(np.float32)
    imp = (rng.uniform(0.2, 3, 1024) ** 2).astype(np.float32)
    for w in (None, imp):
        ours = _err(x, S.dequantize(S.quantize(x, P, importance=w), *x.shape, P), w)
        other = {}
        for name in ("q2_k", "q3_k"):
            t, p = SCHEMES[name], QuantParams(name)
            other[name] = _err(x, t.dequantize(t.quantize(x, p, importance=w), *x.shape, p), w)
        assert ours < 0.4 * other["q2_k"] and ours < 1.45 * other["q3_k"], (w is not None, ours, other)


def test_a_flipped_sign_breaks_the_bound():
    """The bound lets a group with an odd number of negative weights store
    one with the other sign, and no other: a stored sign bit toggled for the
    largest weight of an even group (first 256 of row 0) falls outside it."""
    x = np.load(QUANT / "input.npy")[-4:]
    raw = S.quantize(x, P).copy()
    a = np.abs(x[0, :256]).reshape(32, 8).copy()
    a[(x[0, :256] < 0).reshape(32, 8).sum(axis=1) % 2 == 1] = 0  # odd groups
    a[:, 7] = 0  # the eighth sign is not stored
    e = int(a.argmax())
    word = S.AUX + 4 * (e // 32)
    bit = 7 * (e % 32 // 8) + e % 8
    raw[word + bit // 8] ^= 1 << (bit % 8)
    deq = S.dequantize(raw, *x.shape, P)
    assert np.sign(deq[0, e]) != np.sign(x[0, e])
    assert not (np.abs(x - deq) <= S.error_bound(x, raw, P)).all()


def test_sub_scales_refit_by_gptq_keep_the_codes():
    """with_sub_scales (gptq's refit) rewrites d and the scale nibbles only:
    the indices and the signs (the aux words' low 28 bits) stay."""
    x = np.random.default_rng(6).standard_normal((4, 256)).astype(np.float32)
    raw = S.quantize(x, P).reshape(4, -1)
    values = S.sub_scale_fields(raw).values * np.float32(1.1)
    out = S.with_sub_scales(raw, values)
    assert np.array_equal(out[:, S.QS:S.AUX], raw[:, S.QS:S.AUX])
    assert np.array_equal(out[:, S.AUX:].copy().view("<u4") & 0x0FFFFFFF, raw[:, S.AUX:].copy().view("<u4") & 0x0FFFFFFF)
    np.testing.assert_allclose(S.sub_scale_fields(out).values, values, rtol=0.05)


@pytest.mark.skipif(QUANTIZE is None, reason="llama.cpp's llama-quantize is not built (make llamacpp)")
def test_llama_cpp_s_iq3_xxs_file_runs_at_its_size(wide, tmp_path):  # noqa: F811
    """A file llama-quantize wrote as IQ3_XXS (llama.cpp's bytes, not ours):
    gguf-to-iebin keeps its IQ3_XXS blocks, so the artifact is the file's
    size rather than the f32 it used to become, and ierun's logits on every
    path are those of the file's dequantized float model."""
    f32 = tmp_path / "f32.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", wide["f32"], "--out", f32)
    assert res.returncode == 0, res.stderr
    q, im = tmp_path / "iq3xxs.gguf", tmp_path / "imatrix.gguf"
    # llama-quantize takes IQ3_XXS only with an importance matrix: ours, in llama.cpp's GGUF form
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", wide["f32"], "--text-file", TEXT, "--ctx", "64",
                   "--chunks", "2", "-o", im)
    assert res.returncode == 0, res.stderr
    # --pure: every matrix IQ3_XXS (the IQ3_XXS mix puts other types beside it)
    res = subprocess.run([QUANTIZE, "--pure", "--imatrix", str(im), str(f32), str(q), "IQ3_XXS"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q)).tensors}
    n = sum(v == "IQ3_XXS" for v in types.values())
    assert n >= 8, types
    kept, flat = tmp_path / "kept", tmp_path / "flat"
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", q, "--out-dir", kept)
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(kept)
    assert sum(t["dtype"] == "iq3_xxs" for t in m.tensors) == n
    assert (kept / "model.ie.bin").stat().st_size < 0.2 * (wide["f32"] / "model.ie.bin").stat().st_size
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", q, "--out-dir", flat, "--dequantize").returncode == 0
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 320, 24)]
    ref = Decoder(flat).logits(ids).astype(np.float64)
    for act, tol in (("f32", 1e-4), ("int8", 6e-2)):
        for isa in ("scalar", "avx2"):
            got = Decoder(kept, act=act, isa=isa).logits(ids)
            assert np.abs(got - ref).max() / np.abs(ref).max() <= tol, (act, isa)
