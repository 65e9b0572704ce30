"""q1_0: llama.cpp's Q1_0 (PrismML's 1-bit Bonsai models), a sign bit per
weight under an f16 scale per 128.

gguf-py knows the type's size but not its values, so the references here
are ggml's own definitions restated in numpy (dequantize_row_q1_0,
quantize_row_q1_0_ref) and llama.cpp itself: llama-quantize's bytes, which
our quantizer must write bit for bit, and llama-perplexity's view of a
model, which ierun's import of the same file must share."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from conftest import REPO, assert_gemv_paths, run_tool
from iekit.formats import iebin
from iekit.formats.finite import scan_bytes
from iekit.formats.quant import SCHEMES, QuantParams
from iekit.runtime import kernels, native
from iekit.runtime.decoder import Decoder
from test_quantize_imatrix import _quantize, wide  # noqa: F401  (the fixture)
from test_xxs import own_file_runs_at_its_size

sys.path.insert(0, str(REPO / "benchmarks"))
from llamacpp import tool  # noqa: E402

S = SCHEMES["q1_0"]
P = QuantParams("q1_0")
QUANTIZE, PERPLEXITY = tool("llama-quantize"), tool("llama-perplexity")


def _ggml_dequantize(raw: np.ndarray) -> np.ndarray:
    """dequantize_row_q1_0, element by element as ggml writes it."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
    out = np.empty((len(blocks), 128), np.float32)
    for j in range(128):
        bit = (blocks[:, 2 + j // 8] >> (j % 8)) & 1
        out[:, j] = np.where(bit == 1, d, -d)
    return out


def _ggml_quantize(x: np.ndarray) -> np.ndarray:
    """quantize_row_q1_0_ref: d the float32 mean |x| (summed in order), a bit set where x >= 0."""
    out = []
    for b in x.reshape(-1, 128):
        s = np.float32(0)
        for v in b:
            s = np.float32(s + np.float32(abs(v)))
        d = np.float16(s / np.float32(128))
        bits = np.zeros(16, np.uint8)
        for j, v in enumerate(b):
            if v >= 0:
                bits[j // 8] |= np.uint8(1 << (j % 8))
        out.append(np.concatenate([np.array([d]).view(np.uint8), bits]))
    return np.concatenate(out)


def _entry(rows, cols):
    return {"dtype": "q1_0", "shape": [rows, cols], "quant": S.quant_dict(cols, P)}


def test_the_type_is_gguf_pys_q1_0():
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q1_0] == (S.block_elems, S.block_bytes) == (128, 18)
    assert S.GGUF == "Q1_0" and S.LADDER == () and S.FALLBACK is None


def test_decoded_and_quantized_as_ggml():
    """Random bytes (finite scales) decode as ggml's dequantize_row_q1_0, in numpy and native, bit for bit;
    the quantizer's bytes are quantize_row_q1_0_ref's (zeros, -0.0 and a tie of magnitudes included)."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (64, 18), dtype=np.uint8)
    raw[:, :2] = rng.standard_normal(64).astype(np.float16).view(np.uint8).reshape(64, 2)
    want = _ggml_dequantize(raw).reshape(16, 512)
    assert np.array_equal(S.dequantize(raw.reshape(-1), 16, 512, P), want)
    assert np.array_equal(kernels.dequantize(raw.reshape(-1), _entry(16, 512)), want)
    x = (rng.standard_normal((8, 256)) * np.exp2(rng.integers(-6, 6, (8, 1)))).astype(np.float32)
    x[0, :5] = (0.0, -0.0, 1.0, -1.0, 0.5)
    assert np.array_equal(S.quantize(x, P), _ggml_quantize(x))


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_gemv_every_path_is_float64s(rows, batch):
    """y = W x + b on scalar and AVX2, f32 and int8 activations, against
    float64; int8 within its activation rounding, and AVX2 (and AVX-512's
    kernel where the CPU has it) the scalar reference's sums in another order."""
    rng = np.random.default_rng(rows * 10 + batch)
    cols = 384
    raw = S.quantize(rng.standard_normal((rows, cols)).astype(np.float32), P)
    e = _entry(rows, cols)
    w64 = S.dequantize(raw, rows, cols, P).astype(np.float64)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    assert_gemv_paths(raw, e, x, w64, bias, {"f32": 2e-6, "int8": 1e-2})  # (measured: 4e-8, 1.8e-3)
    if "avx512" in native.cpu_features()["isas"]:  # (csrc/gemv/avx512.cpp's q1_rows)
        ys, y512 = (kernels.gemv(raw.reshape(-1), e, x, bias=bias, act="int8", isa=isa) for isa in ("scalar", "avx512"))
        assert kernels.max_rel_error(y512, x, w64, bias) <= 1e-2
        assert np.abs(y512 - ys).max() <= 1e-5 * np.abs(ys).max()


def test_an_importance_matrix_weights_the_scale():
    """With one, d is the weighted mean |x| (the signs unchanged), which lowers the weighted error."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    imp = np.where(np.arange(256) % 7 == 0, 50.0, 1.0).astype(np.float32)
    plain, weighted = S.quantize(w, P), S.quantize(w, P, importance=imp)
    assert np.array_equal(plain.reshape(-1, 18)[:, 2:], weighted.reshape(-1, 18)[:, 2:])

    def err(raw):
        return float((imp * (w - S.dequantize(raw, 32, 256, P)) ** 2).sum())

    assert err(weighted) < 0.99 * err(plain)
    assert np.all(S.error_bound(w, plain, P) >= np.abs(w - S.dequantize(plain, 32, 256, P)))


def test_a_nan_scale_is_named():
    raw = S.quantize(np.ones((2, 256), np.float32), P).copy().reshape(-1, 18)
    raw[3, :2] = np.array([np.nan], np.float16).view(np.uint8)
    msg = scan_bytes(_entry(2, 256), raw.reshape(-1))
    assert msg is not None and "block 3" in msg and "d" in msg, msg


@pytest.fixture(scope="module")
def llamacpp_q1_0(wide, tmp_path_factory):  # noqa: F811
    """The wide Llama as llama-quantize writes it in Q1_0 (--pure: every matrix, the embedding Q8_0)."""
    if QUANTIZE is None:
        pytest.skip("llama.cpp's llama-quantize is not built (make llamacpp)")
    d = tmp_path_factory.mktemp("q1_0")
    f32 = d / "f32.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", wide["f32"], "--out", f32)
    assert res.returncode == 0, res.stderr
    q = d / "q1_0.gguf"
    res = subprocess.run([QUANTIZE, "--pure", "--token-embedding-type", "q8_0", str(f32), str(q), "Q1_0"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    return {"f32": f32, "q": q, "dir": d}


def test_our_quantizer_writes_llama_quantizes_bytes(llamacpp_q1_0):
    """Every Q1_0 tensor of llama-quantize's file is our quantizer's bytes of the same float32 rows."""
    f32 = {t.name: t for t in gguf.GGUFReader(str(llamacpp_q1_0["f32"])).tensors}
    n = 0
    for t in gguf.GGUFReader(str(llamacpp_q1_0["q"])).tensors:
        if t.tensor_type.name != "Q1_0":
            continue
        rows = np.asarray(f32[t.name].data, np.float32).reshape(-1, int(t.shape[0]))
        assert S.quantize(rows, P).tobytes() == np.asarray(t.data).tobytes(), t.name
        n += 1
    assert n >= 15


def test_llama_quantizes_file_runs_at_its_size(llamacpp_q1_0, wide, tmp_path):  # noqa: F811
    """gguf-to-iebin keeps every Q1_0 block of llama-quantize's own file (the artifact near the file's size) and
    ierun's logits on every path are the file's dequantized float model's (test_xxs's check); the export writes
    the blocks back byte for byte."""
    own_file_runs_at_its_size(wide, tmp_path, "q1_0")
    d, q = llamacpp_q1_0["dir"], llamacpp_q1_0["q"]
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", q, "--out-dir", d / "kept").returncode == 0
    back = d / "back.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d / "kept", "--out", back).returncode == 0
    theirs = {t.name: t for t in gguf.GGUFReader(str(q)).tensors}
    ours = [t for t in gguf.GGUFReader(str(back)).tensors if t.tensor_type.name == "Q1_0"]
    assert len(ours) == sum(t.tensor_type.name == "Q1_0" for t in theirs.values()) >= 8
    for t in ours:
        assert np.asarray(t.data).tobytes() == np.asarray(theirs[t.name].data).tobytes(), t.name


@pytest.mark.skipif(PERPLEXITY is None, reason="llama.cpp's llama-perplexity is not built (make llamacpp)")
def test_llama_cpp_computes_what_ierun_computes(llamacpp_q1_0):
    """llama-perplexity --kl-divergence of llama-quantize's own file against ierun's import of it
    (benchmarks/gguf_parity.py's method): the two engines run the same model."""
    import gguf_parity as gp

    d, q = llamacpp_q1_0["dir"], llamacpp_q1_0["q"]
    kept = d / "kept-kl"
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", q, "--out-dir", kept).returncode == 0
    assert sum(t["dtype"] == "q1_0" for t in iebin.load_model(kept).tensors) >= 8
    ids = np.random.default_rng(5).integers(3, 320, 64 * 4).tolist()
    chunks = gp.chunks_of(ids, 64, 4, gp.gguf_bos(q))
    gp.write_base(d / "base", kept, chunks, 2)
    r = gp.llama_kld(PERPLEXITY, q, d / "base", 64, 2, 4)
    assert r["kld"] < 0.01, r


def test_a_manifest_may_select_it(wide, tmp_path):  # noqa: F811
    """q4-manifest --scheme q1_0: every layer matrix in Q1_0 (the rows are whole blocks), run, and exported as
    Q1_0 byte for byte."""
    out, _m, _res = _quantize(wide, "q1_0", "--scheme", "q1_0")
    m = iebin.load_model(out)
    layers = {t["name"]: t for t in m.tensors if t["name"].startswith("model.layers.") and len(t["shape"]) == 2}
    assert len(layers) == 14 and {t["dtype"] for t in layers.values()} == {"q1_0"}
    ids = list(range(3, 19))
    ref = Decoder(out, act="f32", isa="scalar").logits(ids)
    assert np.abs(Decoder(out, act="f32", isa="avx2").logits(ids) - ref).max() <= 1e-4 * np.abs(ref).max()
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", out, "--out", tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    stored = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors if t.tensor_type.name == "Q1_0"}
    assert len(stored) == len(layers)
    raw = (out / "model.ie.bin").read_bytes()
    gguf_of = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
    for name, t in layers.items():  # (the same rows: q and k's in llama.cpp's interleaved order)
        i, part = name.split(".")[2], ".".join(name.split(".")[3:5])
        ours = np.frombuffer(raw, np.uint8, t["nbytes"], t["file_data_offset"]).reshape(t["shape"][0], -1)
        theirs = np.asarray(stored[f"blk.{i}.{gguf_of[part]}.weight"].data).reshape(ours.shape)
        assert sorted(map(bytes, ours)) == sorted(map(bytes, theirs)), name


def test_rows_that_are_not_whole_blocks_keep_their_floats(tmp_path):
    """tiny-llama's rows are 64 wide but down_proj's (128): with no smaller block to fall back to (llama.cpp has
    none either), only down_proj becomes q1_0 and every other matrix keeps its floats."""
    man, out = tmp_path / "m.json", tmp_path / "q"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", REPO / "golden/hf/tiny-llama", "-o", man,
                    "--scheme", "q1_0").returncode == 0
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", REPO / "golden/hf/tiny-llama", "--q4-map", man,
                   "--out-dir", out)
    assert res.returncode == 0, res.stderr
    dtypes = {t["name"]: t["dtype"] for t in iebin.load_model(out).tensors if len(t["shape"]) == 2}
    assert {n for n, d in dtypes.items() if d == "q1_0"} == {f"model.layers.{i}.mlp.down_proj.weight" for i in (0, 1)}
    assert {d for n, d in dtypes.items() if "down_proj" not in n} == {"f32"}


def test_decode_reads_the_bits_and_prefill_the_copy(wide, monkeypatch):  # noqa: F811
    """q1_0's rows8 copy (a q4_0 matrix's, 4x the bytes) is made where memory allows; a prefill chunk reads it,
    a decode step the stored bits (rows8_decodes), so a decoder with copies and one without (prefill packing
    the same tiles per chunk) give the same floats, token for token."""
    from iekit.runtime import decoder

    out, _m, _res = _quantize(wide, "q1_0-copies", "--scheme", "q1_0")
    ids = list(range(3, 40))
    got = {}
    for grow in (True, False):
        real = decoder.grow_copies
        monkeypatch.setattr(decoder, "grow_copies", lambda *a, grow=grow, real=real, **k: grow and real(*a, **k))
        d = decoder.Decoder(out, threads=2, act="int8", isa="avx2")
        monkeypatch.setattr(decoder, "grow_copies", real)
        got[grow] = (d.rows8_bytes, d.logits(ids[:16]), [d.step(i) for i in ids[16:]])
    assert got[True][0] > 3 * got[False][0]  # (the copies made, and not)
    assert np.array_equal(got[True][1], got[False][1])
    assert all(np.array_equal(a, b) for a, b in zip(got[True][2], got[False][2]))
