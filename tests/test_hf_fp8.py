"""FP8 checkpoints (quantization_config.quant_method "fp8": Qwen3-FP8,
GLM-4.5-FP8, DeepSeek-V3, MiniMax-M2, Ministral 3, Devstral) read as the
float weights they stand for (formats/hf_fp8.py): against transformers' own
dequantization (golden/ref/<model>-fp8/logits.npy, FineGrainedFP8Config
with dequantize=True), torch's e4m3fn values, and a numpy float64
reference for blocks that do not divide the matrix; and every malformed
checkpoint refused in one line."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_HF, assert_one_line_error, run_tool
from iekit.formats import iebin
from iekit.formats.casting import decode_f32
from iekit.formats.hf_fp8 import E4M3
from iekit.runtime.decoder import Decoder

BASE = {"tiny-qwen3-fp8": "tiny-qwen3", "tiny-ministral3-fp8": "tiny-ministral3"}


def _tensors(path) -> dict[str, tuple[str, list[int], bytes]]:
    """A safetensors file's tensors: name -> (dtype, shape, bytes), read raw (F8_E4M3 included)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def _write(path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for k in sorted(tensors):
        dtype, shape, b = tensors[k]
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _variant(tmp_path, name: str, edit=None, cfg_edit=None):
    """A copy of golden/hf/NAME with its tensors (``edit(tensors)``) or config (``cfg_edit(cfg)``) changed."""
    d = tmp_path / "src"
    shutil.copytree(GOLDEN_HF / name, d)
    if edit is not None:
        t = _tensors(d / "model.safetensors")
        edit(t)
        _write(d / "model.safetensors", t)
    if cfg_edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        cfg_edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_e4m3_values_are_torchs():
    assert np.array_equal(E4M3, np.load(GOLDEN / "ref" / "e4m3fn.npy"), equal_nan=True)


@pytest.mark.parametrize("name", sorted(BASE))
def test_an_fp8_checkpoint_is_the_model_transformers_dequantizes(tmp_path, name):
    """Block scales (tiny-qwen3-fp8) and one scale per matrix beside a
    static activation scale (tiny-ministral3-fp8): converted, the artifact
    runs as transformers runs the checkpoint dequantized; its weights in
    the checkpoint's bfloat16, its config without the quantization_config."""
    out = tmp_path / "m"
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / name, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(out)
    assert {t["dtype"] for t in m.tensors} == {"bf16"}
    assert not any(t["name"].endswith(("weight_scale_inv", "activation_scale")) for t in m.tensors)
    assert "quantization_config" not in m.meta["config"]
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    ids = json.loads((GOLDEN / "ref" / BASE[name] / "ids.json").read_text())
    ref = np.load(GOLDEN / "ref" / name / "logits.npy")
    got = np.asarray(Decoder(out, act="f32").logits(ids, start=0))
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


def test_blocks_that_do_not_divide_the_matrix(tmp_path):
    """48 x 48 blocks over 64- and 128-wide matrices (the last ones cut
    short, as transformers' FP8 layers allocate them): --dtype f32 gives
    each code times its block's scale, exactly as numpy computes it."""
    rng = np.random.default_rng(3)
    scales = {}

    def reblock(t):
        for k in [k for k in t if k.endswith("weight_scale_inv")]:
            _d, shape, _b = t[k.replace("weight_scale_inv", "weight")]
            s = rng.uniform(1e-4, 1e-2, (-(-shape[0] // 48), -(-shape[1] // 48))).astype(np.float32)
            scales[k.replace("_scale_inv", "")] = s
            t[k] = ("F32", list(s.shape), s.tobytes())

    src = _variant(tmp_path, "tiny-qwen3-fp8", reblock,
                   lambda c: c["quantization_config"].update(weight_block_size=[48, 48]))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m", "--dtype", "f32")
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(tmp_path / "m")
    codes = _tensors(src / "model.safetensors")
    for name, s in scales.items():
        t = next(t for t in m.tensors if t["name"] == name)
        got = decode_f32(m.path_of(t).read_bytes()[t["file_data_offset"]:][:t["nbytes"]], "f32").reshape(t["shape"])
        x = E4M3[np.frombuffer(codes[name][2], np.uint8)].reshape(t["shape"]).astype(np.float64)
        r, c = np.indices(t["shape"])
        want = (x * s[r // 48, c // 48]).astype(np.float32)  # (a product of two floats of < 12 bits: exact)
        assert np.array_equal(got, want), name


def _set(name: str, value):
    def edit(t):
        t[name] = value
    return edit


def _drop(name: str):
    def edit(t):
        del t[name]
    return edit


def _nan_code(t):
    dtype, shape, b = t["model.layers.1.mlp.up_proj.weight"]
    b = bytearray(b)
    b[3 * shape[1] + 5] = 0x7F
    t["model.layers.1.mlp.up_proj.weight"] = (dtype, shape, bytes(b))


W = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("edit,cfg_edit,needles", [
    (_nan_code, None, ("model.layers.1.mlp.up_proj.weight[3, 5]", "NaN")),
    (_drop(W + ".weight_scale_inv"), None, (W + ".weight", "without its scales")),
    (_set(W + ".weight_scale_inv", ("F32", [2, 3], np.ones(6, np.float32).tobytes())), None,
     (W + ".weight_scale_inv", "[2, 3]", "[4, 2]")),
    (_set(W + ".weight_scale_inv", ("BF16", [4, 2], np.ones(8, np.uint16).tobytes())), None,
     (W + ".weight_scale_inv", "bf16")),
    (_set(W + ".weight_scale_inv", ("F32", [4, 2], np.full(8, np.inf, np.float32).tobytes())), None,
     (W + ".weight_scale_inv[0, 0]", "not finite")),
    (_set("model.layers.0.mlp.gate_proj.weight_scale_inv", ("F32", [1], np.ones(1, np.float32).tobytes())), None,
     ("model.layers.0.mlp.gate_proj.weight_scale_inv", "[1]")),
    (None, lambda c: c.pop("quantization_config"), ("F8_E4M3", "quant_method 'fp8'")),
    (None, lambda c: c["quantization_config"].update(scale_fmt="ue8m0"), ("scale_fmt", "ue8m0")),
    (None, lambda c: c["quantization_config"].update(weight_block_size=[32]), ("weight_block_size", "[32]")),
])
def test_a_malformed_fp8_checkpoint_is_one_error(tmp_path, edit, cfg_edit, needles):
    src = _variant(tmp_path, "tiny-qwen3-fp8", edit, cfg_edit)
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "m").exists()


def test_scales_without_a_weight_are_refused(tmp_path):
    src = _variant(tmp_path, "tiny-qwen3-fp8", _set("model.norm.weight_scale_inv", ("F32", [], b"\0\0\x80?")))
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m"),
                          "model.norm.weight_scale_inv", "no FP8 weight")


def test_quantizing_an_fp8_checkpoint_starts_from_its_floats(tmp_path):
    """q4-manifest and hf-to-iebin --q4-map read the dequantized weights: q8_0
    of them is the dequantized model within q8_0's error."""
    man, out = tmp_path / "m.json", tmp_path / "q"
    src = GOLDEN_HF / "tiny-qwen3-fp8"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", src, "-o", man, "--scheme", "q8_0").returncode == 0
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    assert "q8_0" in {t["dtype"] for t in iebin.load_model(out).tensors}
    ids = json.loads((GOLDEN / "ref" / "tiny-qwen3" / "ids.json").read_text())
    ref = np.load(GOLDEN / "ref" / "tiny-qwen3-fp8" / "logits.npy")
    got = np.asarray(Decoder(out, act="f32").logits(ids, start=0))
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max()


def test_the_text_model_of_an_fp8_release_is_its_dequantized_language_model(tmp_path):
    """Ministral 3 and Devstral Small 2 ship as Mistral3ForConditionalGeneration
    in FP8 (one scale per matrix): ieconv text-model writes the language
    model's weights dequantized, in the checkpoint's bfloat16 (each value
    code x scale rounded to nearest even), and a config without the
    quantization_config, which hf-to-iebin then converts as any other."""
    finite = np.flatnonzero(~np.isnan(E4M3))
    want = {}

    def to_fp8(t):
        for k in [k for k in t if k.startswith("language_model.model.layers.") and k.endswith("_proj.weight")]:
            dtype, shape, b = t[k]
            w = decode_f32(b, dtype.lower()).astype(np.float64)
            scale = np.float32(np.abs(w).max() / 448)
            codes = finite[np.abs(E4M3[finite][None, :] - (w / scale)[:, None]).argmin(axis=1)].astype(np.uint8)
            t[k] = ("F8_E4M3", shape, codes.tobytes())
            t[k.removesuffix("weight") + "weight_scale_inv"] = ("F32", [], scale.tobytes())
            want[k.removeprefix("language_model.")] = (E4M3[codes] * scale).astype(np.float32)

    src = _variant(tmp_path, "tiny-ministral3-vl", to_fp8, lambda c: c.update(quantization_config={
        "quant_method": "fp8", "weight_block_size": None, "activation_scheme": "dynamic"}))
    text = tmp_path / "text"
    res = run_tool("ieconv", "text-model", "--hf-dir", src, "--out-dir", text)
    assert res.returncode == 0, res.stderr
    assert "quantization_config" not in json.loads((text / "config.json").read_text())
    got = _tensors(text / "model.safetensors")
    for k, w in want.items():
        dtype, shape, b = got[k]
        bf16 = ((w.view(np.uint32) + 0x7FFF + ((w.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
        assert dtype == "BF16" and np.array_equal(np.frombuffer(b, np.uint16), bf16.reshape(-1)), k
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", text, "--out-dir", tmp_path / "m").returncode == 0


def test_a_scale_past_float32_is_one_error(tmp_path):
    """A finite scale whose product with a code overflows float32 (448 x 3.4e38)."""
    huge = np.full(8, np.finfo(np.float32).max, np.float32).tobytes()
    src = _variant(tmp_path, "tiny-qwen3-fp8", _set(W + ".weight_scale_inv", ("F32", [4, 2], huge)))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, W + ".weight[0, 0]", "overflows float32")


def test_scales_in_another_shard_than_their_weight(tmp_path):
    """A sharded FP8 checkpoint may put a weight and its scales in different
    files (the index says where each is): read as one matrix all the same."""
    src = tmp_path / "src"
    shutil.copytree(GOLDEN_HF / "tiny-qwen3-fp8", src)
    t = _tensors(src / "model.safetensors")
    scales = {k for k in t if k.endswith("weight_scale_inv")}
    (src / "model.safetensors").unlink()
    _write(src / "model-00001-of-00002.safetensors", {k: v for k, v in t.items() if k not in scales})
    _write(src / "model-00002-of-00002.safetensors", {k: t[k] for k in scales})
    index = {k: "model-00002-of-00002.safetensors" if k in scales else "model-00001-of-00002.safetensors" for k in t}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    ids = json.loads((GOLDEN / "ref" / "tiny-qwen3" / "ids.json").read_text())
    ref = np.load(GOLDEN / "ref" / "tiny-qwen3-fp8" / "logits.npy")
    got = np.asarray(Decoder(tmp_path / "m", act="f32").logits(ids, start=0))
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


def test_an_fp8_checkpoint_rotates_as_its_floats(tmp_path):
    """ieconv rotate reads the dequantized weights (f32, unrounded) and writes
    a float checkpoint, its config without the quantization_config: the same
    model as the float32 dequantization (hf-to-iebin --dtype f32)."""
    src, rot = GOLDEN_HF / "tiny-qwen3-fp8", tmp_path / "rot"
    res = run_tool("ieconv", "rotate", "-q", "--hf-dir", src, "--out-dir", rot)
    assert res.returncode == 0, res.stderr
    assert "quantization_config" not in json.loads((rot / "config.json").read_text())
    for d, args in ((rot, []), (src, ["--dtype", "f32"])):
        assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", d, "--out-dir", tmp_path / f"ie-{d.name}",
                        *args).returncode == 0
    ids = json.loads((GOLDEN / "ref" / "tiny-qwen3" / "ids.json").read_text())
    got, ref = (np.asarray(Decoder(tmp_path / f"ie-{d.name}", act="f32").logits(ids, start=0)) for d in (rot, src))
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_fused_fp8_matrices_blocked_by_head_are_read_as_their_parts(tmp_path):
    """Qwen3-Next-80B-A3B-Instruct-FP8's DeltaNet projections: in_proj_qkvz and in_proj_ba in FP8 with 12 x 32
    blocks (not aligned with its 16-row heads), read as Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a:
    each row its code times its own block's scale, as numpy computes it, gathered as transformers splits them."""
    finite = np.flatnonzero(~np.isnan(E4M3))
    cfg = json.loads((GOLDEN_HF / "tiny-qwen3-next" / "config.json").read_text())
    kh, r, kd, vd = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"] // cfg["linear_num_key_heads"],
                     cfg["linear_key_head_dim"], cfg["linear_value_head_dim"])
    fused = {}

    def to_fp8(t):
        for k in [k for k in t if k.endswith(("in_proj_qkvz.weight", "in_proj_ba.weight"))]:
            dtype, shape, b = t[k]
            w = decode_f32(b, dtype.lower()).reshape(shape).astype(np.float64)
            blocks = (-(-shape[0] // 12), -(-shape[1] // 32))
            rows, cols = np.indices(shape)
            s = np.zeros(blocks, np.float32)
            np.maximum.at(s, (rows // 12, cols // 32), np.abs(w).astype(np.float32) / 448)
            x = w / s[rows // 12, cols // 32]
            codes = finite[np.abs(E4M3[finite][None, :] - x.reshape(-1, 1)).argmin(axis=1)].astype(np.uint8)
            t[k] = ("F8_E4M3", shape, codes.tobytes())
            t[k.removesuffix("weight") + "weight_scale_inv"] = ("F32", list(blocks), s.tobytes())
            fused[k] = (E4M3[codes].reshape(shape).astype(np.float64) * s[rows // 12, cols // 32]).astype(np.float32)

    src = _variant(tmp_path, "tiny-qwen3-next", to_fp8, lambda c: c.update(quantization_config={
        "quant_method": "fp8", "weight_block_size": [12, 32], "activation_scheme": "dynamic"}))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m", "--dtype", "f32")
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(tmp_path / "m")
    got = {t["name"]: decode_f32(m.path_of(t).read_bytes()[t["file_data_offset"]:][:t["nbytes"]], "f32")
           .reshape(t["shape"]) for t in m.tensors}
    assert len(fused) == 6
    for k, w in fused.items():
        pre = k.rsplit(".", 2)[0] + "."
        if k.endswith("in_proj_ba.weight"):
            heads = w.reshape(kh, 2 * r, -1)
            assert np.array_equal(got[pre + "in_proj_b.weight"], heads[:, :r].reshape(kh * r, -1))
            assert np.array_equal(got[pre + "in_proj_a.weight"], heads[:, r:].reshape(kh * r, -1))
            continue
        q, kk, v, z = np.split(w.reshape(kh, 2 * kd + 2 * r * vd, -1), [kd, 2 * kd, 2 * kd + r * vd], axis=1)
        qkv = np.concatenate([x.reshape(-1, w.shape[1]) for x in (q, kk, v)])
        assert np.array_equal(got[pre + "in_proj_qkv.weight"], qkv)
        assert np.array_equal(got[pre + "in_proj_z.weight"], z.reshape(-1, w.shape[1]))
