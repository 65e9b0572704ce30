"""nvfp4: NVIDIA's FP4 as llama.cpp keeps it (ggml's NVFP4 blocks, and the
float32 ``.scale`` / ``.input_scale`` tensors its converter writes beside
each weight of an NVFP4 checkpoint), checked against gguf-py's decoder,
float64, transformers' logits of the same weights, and the files llama.cpp's
own converter wrote (golden/gguf/make_nvfp4.py).

Before it was a type of ours such a file could not be imported at all (its
``.scale`` tensors had no Hugging Face counterpart), and dequantizing it
would have made it 7x its size.
"""

from __future__ import annotations

import json
import math
import shutil

import gguf
import numpy as np
import pytest
from conftest import GOLDEN, GOLDEN_REF, assert_gemv_paths, assert_one_line_error, run_tool
from gguf_build import rewrite_gguf

from iekit.formats import iebin
from iekit.formats.finite import scan_bytes
from iekit.formats.quant import SCHEMES, QuantParams, ue4m3_half, ue4m3_of
from iekit.runtime import kernels
from iekit.runtime.decoder import Decoder

S = SCHEMES["nvfp4"]
CONVERTED = GOLDEN / "gguf" / "llamacpp"
FILES = ["tiny-llama-nvfp4", "tiny-qwen3-moe-nvfp4"]  # a dense Llama; Qwen3-MoE, a scale per expert
CT = "tiny-llama-nvfp4-ct"  # tiny-llama-nvfp4's weights as llm-compressor writes them (reciprocal scales)
NVFP4 = gguf.GGMLQuantizationType.NVFP4


def _blocks(rng, n):
    raw = rng.integers(0, 256, (n, 36), dtype=np.uint8)
    d = raw[:, :4]
    d &= 0x7F
    d[d == 0x7F] = 0x7E
    return raw


def _entry(rows, cols, p):
    return {"dtype": "nvfp4", "shape": [rows, cols], "quant": S.quant_dict(cols, p)}


def test_scale_bytes_as_gguf_py():
    x = np.arange(256, dtype=np.uint8)
    assert np.array_equal(ue4m3_half(x), gguf.quants.NVFP4.ue4m3_to_fp32(x).astype(np.float32))
    rng = np.random.default_rng(0)
    v = (np.abs(rng.standard_normal(200_000)) * np.exp2(rng.integers(-14, 10, 200_000))).astype(np.float32)
    v[:4] = (0, 448, 1000, 2.0**-12)
    assert np.array_equal(ue4m3_of(v), gguf.quants.NVFP4.fp32_to_ue4m3(v))


@pytest.mark.parametrize("tensor_scale", [1.0, float(np.float32(3.1e-4))])
def test_decoded_as_gguf_py_times_the_tensor_scale(tensor_scale):
    """Every code under every scale byte: numpy and native, gguf-py's values
    times the tensor scale in float32, bit for bit."""
    rng = np.random.default_rng(1)
    raw = _blocks(rng, 512)
    raw[:128, 0] = np.arange(128)  # every scale byte below 0x7F (0x7F itself is refused: below)
    raw[128, 0] = 0x7E
    p = QuantParams("nvfp4", tensor_scale=tensor_scale)
    want = gguf.quants.dequantize(raw.reshape(-1), NVFP4).astype(np.float32).reshape(64, 512) * np.float32(tensor_scale)
    assert np.array_equal(S.dequantize(raw.reshape(-1), 64, 512, p), want)
    assert np.array_equal(kernels.dequantize(raw.reshape(-1), _entry(64, 512, p)), want)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_gemv_every_path_is_float64s(rows, batch):
    """y = s W x + b on scalar and AVX2, f32 and int8 activations, against
    float64 (each row's scales differ; rows not a multiple of the kernels'
    step); int8 within its activation rounding."""
    rng = np.random.default_rng(rows * 10 + batch)
    cols = 384
    raw = _blocks(rng, rows * cols // 64)  # every scale byte below 0x7F (the SIMD kernels' table: each entry)
    p = QuantParams("nvfp4", tensor_scale=float(np.float32(2.5e-3)))
    e = _entry(rows, cols, p)
    w64 = S.dequantize(raw.reshape(-1), rows, cols, p).astype(np.float64)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    assert_gemv_paths(raw, e, x, w64, bias, {"f32": 2e-6, "int8": 1e-2})  # (measured: 1.5e-7, 5.3e-3)


def test_quantizer_is_ggmls_reference_and_an_importance_matrix_lowers_its_error():
    """Without an importance matrix, ggml's quantize_row_nvfp4_ref of w / s:
    each scale byte ue4m3_of(max|x| / 6) of its 16 weights, each code the
    nearest value (the bound holds); with one, a smaller weighted error."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((16, 512)) * 0.02).astype(np.float32)
    p = QuantParams("nvfp4", tensor_scale=float(np.float32(np.abs(w).max() / 1344)))
    raw = S.quantize(w, p).reshape(-1, 36)
    sub = (w / np.float32(p.tensor_scale)).reshape(-1, 16)
    assert np.array_equal(raw[:, :4].reshape(-1), ue4m3_of(np.abs(sub).max(axis=1) / np.float32(6)))
    got = S.dequantize(raw.reshape(-1), 16, 512, p)
    assert (np.abs(got - w) <= S.error_bound(w, raw.reshape(-1), p)).all()
    imp = rng.uniform(0.1, 10, 512).astype(np.float32)
    weighted = S.dequantize(S.quantize(w, p, importance=imp), 16, 512, p)
    err = [float((imp * (v - w) ** 2).sum()) for v in (got, weighted)]
    assert err[1] < err[0]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """{file: (artifact, its --dequantize import)} of the converter's NVFP4 files."""
    root = tmp_path_factory.mktemp("nvfp4")
    out = {}
    for name in [*FILES, CT]:
        kept, flat = root / name, root / f"{name}-flat"
        for d, more in ((kept, ()), (flat, ("--dequantize",))):
            res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED / f"{name}.gguf", "--out-dir", d, *more)
            assert res.returncode == 0, res.stderr
        out[name] = kept, flat
    return out


@pytest.mark.parametrize("name", FILES)
def test_converter_file_kept_at_its_size_with_its_scales(imported, name):
    """Every NVFP4 tensor's blocks kept byte for byte, its `.scale` (its
    expert's, from a stack's [experts] vector) and `.input_scale` in its quant
    object as float32 values."""
    kept, _ = imported[name]
    r = gguf.GGUFReader(str(CONVERTED / f"{name}.gguf"))
    by = {t.name: t for t in r.tensors}
    m = iebin.load_model(kept)
    ents = {t["name"]: t for t in m.tensors}
    nv = [t for t in m.tensors if t["dtype"] == "nvfp4"]
    assert len(nv) == sum(t.shape[-1] if len(t.shape) == 3 else 1 for t in r.tensors if t.tensor_type == NVFP4)
    src = "model.layers.0.mlp.experts.2.up_proj.weight" if "moe" in name else "model.layers.1.mlp.up_proj.weight"
    g = "blk.0.ffn_up_exps" if "moe" in name else "blk.1.ffn_up"
    e = 2 if "moe" in name else 0
    q = ents[src]["quant"]
    assert q["tensor_scale"] == float(by[f"{g}.scale"].data.reshape(-1)[e])
    assert q["input_scale"] == float(by[f"{g}.input_scale"].data.reshape(-1)[e])
    per = math.prod(ents[src]["shape"]) // 64 * 36
    flat = {t["name"]: t for t in iebin.load_model(imported[name][1]).tensors}
    assert 64 * sum(t["nbytes"] for t in nv) == 9 * sum(flat[t["name"]]["nbytes"] for t in nv)  # 4.5 bits, not 32
    data = np.fromfile(kept / "model.ie.bin", np.uint8)[ents[src]["file_data_offset"]:][:per]
    assert np.array_equal(data, by[f"{g}.weight"].data.reshape(-1)[e * per:(e + 1) * per])


@pytest.mark.parametrize("name", FILES)
def test_logits_are_transformers_on_the_dequantized_weights(imported, name):
    """ierun on the kept blocks, every path, and on the --dequantize import
    (gguf-py's values times the scales): the checkpoint's dequantized model as
    transformers runs it (golden/ref/<name>/)."""
    kept, flat = imported[name]
    ids = json.loads((GOLDEN_REF / name / "ids.json").read_text())
    ref = np.load(GOLDEN_REF / name / "logits.npy").astype(np.float64)
    scale = np.abs(ref).max()
    assert np.abs(Decoder(flat).logits(ids) - ref).max() / scale <= 2e-6
    for act, tol in (("f32", 2e-6), ("int8", 5e-2)):
        for isa in ("scalar", "avx2"):
            got = Decoder(kept, act=act, isa=isa).logits(ids)
            assert np.abs(got - ref).max() / scale <= tol, (act, isa)


@pytest.mark.parametrize("name", FILES)
def test_export_is_the_converters_file_tensor_for_tensor(imported, name, tmp_path):
    """iebin-to-gguf writes every tensor of the converter's file byte for
    byte, the scales included (a stack's one per expert again); imported
    again, the artifact's payload is the same bytes."""
    kept, _ = imported[name]
    out = tmp_path / "x.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", kept, "--out", out).returncode == 0
    a = {t.name: t for t in gguf.GGUFReader(str(CONVERTED / f"{name}.gguf")).tensors}
    b = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    assert set(a) == set(b)
    for n, t in a.items():
        assert (b[n].tensor_type, b[n].data.tobytes()) == (t.tensor_type, t.data.tobytes()), n
    again = tmp_path / "again"
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", again).returncode == 0
    assert (again / "model.ie.bin").read_bytes() == (kept / "model.ie.bin").read_bytes()


def _rewritten(tmp_path, **kw):
    return rewrite_gguf(CONVERTED / "tiny-llama-nvfp4.gguf", tmp_path / "bad.gguf", **kw)


def test_hostile_scales_are_one_line_each(tmp_path):
    """A scale byte with its sign bit set or E4M3's NaN, a `.scale` beside a
    weight that is not NVFP4, of the wrong shape, or not a positive finite
    number: one line naming the tensor, exit 1."""
    r = gguf.GGUFReader(str(CONVERTED / "tiny-llama-nvfp4.gguf"))
    w = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    for byte, what in ((0x7F, "0x7F"), (0x85, "0x85")):
        data = np.array(w.data).copy()
        data.reshape(-1, 36)[3, 1] = byte
        f = _rewritten(tmp_path, tensors={w.name: (data, NVFP4)})
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", f, "--out-dir", tmp_path / f"o{byte}")
        assert_one_line_error(res, "attn_q", "d1", what)
    cases = [({"blk.0.attn_norm.scale": np.ones(1, np.float32)}, "attn_norm.scale", "F32 weight"),
             ({"blk.0.attn_q.scale": np.ones(2, np.float32)}, "attn_q.scale", "[1]"),
             ({"blk.0.attn_q.scale": np.array([np.nan], np.float32)}, "attn_q.scale", "nan"),
             ({"blk.0.attn_q.input_scale": np.array([-1], np.float32)}, "attn_q.input_scale", "positive")]
    for i, (tensors, *needles) in enumerate(cases):
        f = _rewritten(tmp_path, tensors=tensors)
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", f, "--out-dir", tmp_path / f"c{i}")
        assert_one_line_error(res, *needles)


@pytest.mark.parametrize("value", [1e40, -0.5, 0.1, "0.5", 1, 0.0])
def test_a_bad_tensor_scale_is_one_line(imported, tmp_path, value):
    """quant.tensor_scale must be a positive finite float32 value (0.1 is
    not one: its JSON would not be the kernels' number): validate and ierun
    refuse anything else in one line naming it."""
    kept, _ = imported["tiny-llama-nvfp4"]
    d = tmp_path / "m"
    shutil.copytree(kept, d)
    meta = json.loads((d / "model.ie.json").read_text())
    t = next(t for t in meta["tensors"] if t["dtype"] == "nvfp4")
    t["quant"]["tensor_scale"] = value
    (d / "model.ie.json").write_text(json.dumps(meta))
    assert_one_line_error(run_tool("ieconv", "validate", d), "tensor_scale")
    assert_one_line_error(run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "l.npy"),
                          "tensor_scale")


def test_payload_scan_names_a_nan_scale():
    raw = _blocks(np.random.default_rng(3), 4)
    raw[2, 3] = 0x7F
    msg = scan_bytes(_entry(2, 128, QuantParams("nvfp4")), raw.reshape(-1))
    assert msg is not None and "block 2" in msg and "d3" in msg and "0x7F" in msg


def test_export_refuses_where_llama_cpp_leaves_a_scale_unapplied(tmp_path):
    """An architecture whose llama.cpp graph does not multiply every matrix by
    its scale (the Llama file's tensors under smollm3, whose graph passes no
    FFN scale on): its import runs (the scales applied), its export is refused
    in one line; --requantize writes another llama.cpp type instead."""
    keys = {k: k.replace("llama.", "smollm3.", 1) for k in gguf.GGUFReader(str(CONVERTED / "tiny-llama-nvfp4.gguf")).fields
            if k.startswith("llama.")}
    f = _rewritten(tmp_path, arch="smollm3", keys=keys)
    d = tmp_path / "smol"
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", f, "--out-dir", d)
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "x.gguf")
    assert_one_line_error(res, "nvfp4", "tensor_scale", "smollm3", "--requantize")
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "y.gguf", "--requantize", "q4_0")
    assert res.returncode == 0, res.stderr
    types = {t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "y.gguf")).tensors}
    assert "NVFP4" not in types and not any(t.name.endswith(".scale") for t in gguf.GGUFReader(str(tmp_path / "y.gguf")).tensors)


@pytest.mark.parametrize("name", [*FILES, CT])
def test_hf_checkpoint_is_the_converters_file(imported, name, tmp_path):
    """hf-to-iebin of the Model Optimizer checkpoint itself (golden/hf/<name>;
    CT: llm-compressor's layout of the same weights, its per-matrix scales
    reciprocals) writes every NVFP4 matrix as gguf-to-iebin of llama.cpp's
    conversion of it does: the same bytes, the same quant object (scales included), config.json
    without the quantization_config; and runs to transformers' logits (the
    float matrices as the checkpoint has them: tiny-llama's f32 where the
    converter wrote f16, whence its looser bound)."""
    from conftest import GOLDEN_HF

    kept, _ = imported[name]
    d = tmp_path / "hf"
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / name, "--out-dir", d)
    assert res.returncode == 0, res.stderr
    a, b = iebin.load_model(d), iebin.load_model(kept)
    ea, eb = {t["name"]: t for t in a.tensors}, {t["name"]: t for t in b.tensors}
    assert set(ea) == set(eb)
    ba, bb = (np.fromfile(m / "model.ie.bin", np.uint8) for m in (d, kept))
    nv = [n for n, t in eb.items() if t["dtype"] == "nvfp4"]
    assert len(nv) >= 14 and all(ea[n]["dtype"] == "nvfp4" and ea[n]["quant"] == eb[n]["quant"] for n in nv)
    for n in nv:
        assert np.array_equal(ba[ea[n]["file_data_offset"]:][:ea[n]["nbytes"]],
                              bb[eb[n]["file_data_offset"]:][:eb[n]["nbytes"]]), n
    assert "quantization_config" not in json.loads((d / "config.json").read_text())
    ref_dir = GOLDEN_REF / name.removesuffix("-ct")  # (1 / (1 / s) may be s's neighbour: the same model to 1e-7)
    ids = json.loads((ref_dir / "ids.json").read_text())
    ref = np.load(ref_dir / "logits.npy").astype(np.float64)
    got = Decoder(d, act="f32").logits(ids)
    assert np.abs(got - ref).max() / np.abs(ref).max() <= (2e-3 if name.startswith("tiny-llama") else 2e-6)


def _hf_copy(tmp_path, name="tiny-llama-nvfp4"):
    from conftest import GOLDEN_HF

    d = tmp_path / "ckpt"
    shutil.copytree(GOLDEN_HF / name, d)
    return d


def _patch(path, tensor, offset, data):
    """Bytes ``data`` written at ``offset`` into ``tensor``'s data in the safetensors file ``path``."""
    from iekit.formats.safetensors_reader import SafetensorsFile

    with SafetensorsFile(path) as sf:
        start = sf.tensors[tensor].start
    with open(path, "r+b") as f:
        f.seek(start + offset)
        f.write(data)


def test_hf_hostile_checkpoints_are_one_line_each(tmp_path):
    """A scale byte with its sign bit set, a weight without its per-matrix
    scale, NVFP4 parts under a config that does not say NVFP4: one line
    naming the tensor; the KV cache's k_scale is left out, as llama.cpp's
    converter leaves it (the import runs)."""
    w = "model.layers.0.self_attn.q_proj.weight"
    st = "model.safetensors"
    d = _hf_copy(tmp_path)
    _patch(d / st, w + "_scale", 5, b"\x85")
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", d, "--out-dir", tmp_path / "a"),
                          w + "_scale", "0x85")
    d = _hf_copy(tmp_path / "b")
    raw = (d / st).read_bytes()
    (d / st).write_bytes(raw.replace(b'"model.layers.0.self_attn.q_proj.weight_scale_2"',
                                     b'"model.layers.0.self_attn.q_proj.weight_scale_3"', 1))
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", d, "--out-dir", tmp_path / "b" / "o"),
                          w, "weight_scale_2")
    d = _hf_copy(tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "quantization_config"}))
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", d, "--out-dir", tmp_path / "c" / "o"),
                          "_scale", "quantization_config")
    d = _hf_copy(tmp_path / "d")
    old = b'"model.layers.0.self_attn.k_proj.input_scale"'
    new = b'"model.layers.0.self_attn.k_proj.k_scale"'
    (d / st).write_bytes((d / st).read_bytes().replace(old, new + b" " * (len(old) - len(new)), 1))  # (JSON spaces)
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", d, "--out-dir", tmp_path / "d" / "o").returncode == 0
    names = {t["name"] for t in iebin.load_model(tmp_path / "d" / "o").tensors}
    assert not any("k_scale" in n for n in names)
    k = next(t for t in iebin.load_model(tmp_path / "d" / "o").tensors if t["name"] == w.replace("q_proj", "k_proj"))
    assert "input_scale" not in k["quant"]
    d = _hf_copy(tmp_path / "e", CT)  # llm-compressor's reciprocal of 0: no scale
    _patch(d / st, "model.layers.1.mlp.up_proj.weight_global_scale", 0, np.float32(0).tobytes())
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", d, "--out-dir", tmp_path / "e" / "o"),
                          "weight_global_scale", "inf")


@pytest.mark.parametrize("dtype, value, needle", [("q4_0", 0.5, "nvfp4 only"), ("nvfp4", float("nan"), "positive finite"),
                                                  ("nvfp4", 0.1, "float32"), ("nvfp4", -2.0, "positive")])
def test_native_weight_spec_refuses_a_tensor_scale_it_cannot_apply(dtype, value, needle):
    """The C++ side checks what it is given too (a scale on a type whose kernels do not apply one, a value
    that is not a positive finite float32)."""
    from iekit.runtime.native import _native

    with pytest.raises(ValueError, match=needle):
        _native.WeightSpec(dtype, 2, 64, tensor_scale=value)
    assert _native.WeightSpec("nvfp4", 2, 64, tensor_scale=float(np.float32(0.1))).tensor_scale == np.float32(0.1)
