"""gpt-oss's MXFP4 pairs (HF ``*_blocks`` + ``*_scales``) -> IEBIN ``mxfp4``
stacks (convert/hf_mxfp4.py): the repack keeps every weight, checked against
two independent references (transformers' dequantization written out from
its documented algorithm, and gguf.quants on our bytes); the converter,
validator and inspect handle [experts, rows, cols]; every broken rule of a
pair is one line, exit 1, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import assert_one_line_error, run_tool
from test_hostile_validation import corrupt
from iekit.convert.hf_mxfp4 import repack
from iekit.formats import iebin
from iekit.formats.quant import SCHEMES, QuantParams

# transformers' FP4_VALUES (integrations/mxfp4.py): e2m1 codes 0..15.
FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
MX = SCHEMES["mxfp4"]
P = QuantParams("mxfp4")


def hf_dequant(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' convert_moe_packed_tensors, before its final transpose:
    byte k of a block is elements 2k (low nibble) and 2k + 1 (high), times
    2^(scale − 127); [..., G, 16] -> [..., G * 32]."""
    out = np.empty((*blocks.shape[:-1], 32), np.float32)
    out[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    out[..., 1::2] = FP4_VALUES[blocks >> 4]
    out = np.ldexp(out, scales.astype(np.int32)[..., None] - 127)
    return out.reshape(*blocks.shape[:-2], -1)


def pair(rng, lead=(3, 5), groups=4, lo=100, hi=140):
    blocks = rng.integers(0, 256, (*lead, groups, 16), dtype=np.uint8)
    scales = rng.integers(lo, hi, (*lead, groups), dtype=np.uint8)
    return blocks, scales


def same_weights(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, but for the sign of zero: e2m1 code 8 is −0, which
    transformers keeps and ggml's integer table (and so iekit) reads as 0."""
    return np.array_equal((a + np.float32(0)).view(np.uint32), (b + np.float32(0)).view(np.uint32))


def test_repack_keeps_every_weight():
    rng = np.random.default_rng(0)
    blocks, scales = pair(rng, lo=0, hi=253)  # every finite E8M0 code, the subnormal scales included
    raw = repack(blocks.reshape(-1, 16), scales.reshape(-1))
    ref = hf_dequant(blocks, scales).reshape(-1, 128)
    ours = MX.dequantize(raw, 15, 128, P)
    assert same_weights(ours, ref)
    theirs = gguf.quants.dequantize(raw.reshape(15, -1), gguf.GGMLQuantizationType.MXFP4).astype(np.float32)
    assert np.array_equal(theirs.view(np.uint32), ours.view(np.uint32))


def test_quantize_then_repack_round_trips():
    """Our quantizer's blocks, written in HF's layout and repacked, are the same bytes."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    raw = MX.quantize(w, P).reshape(-1, 17)
    codes = np.empty((raw.shape[0], 32), np.uint8)
    codes[:, :16], codes[:, 16:] = raw[:, 1:] & 0xF, raw[:, 1:] >> 4
    hf_blocks = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    assert repack(hf_blocks, raw[:, 0]).tobytes() == raw.tobytes()


# ------------------------------------------------------------- the converter

def write_checkpoint(d: Path, tensors: dict, quant_method: str | None = "mxfp4") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}
    if quant_method is not None:
        cfg["quantization_config"] = {"quant_method": quant_method}
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(d / "model.safetensors"))
    return d


def gpt_oss_like(rng, experts=4, hidden=64, inter=32) -> dict:
    gu_b, gu_s = pair(rng, (experts, 2 * inter), hidden // 32)
    dn_b, dn_s = pair(rng, (experts, hidden), inter // 32)
    pre = "model.layers.0.mlp.experts."
    return {pre + "gate_up_proj_blocks": gu_b, pre + "gate_up_proj_scales": gu_s,
            pre + "gate_up_proj_bias": rng.standard_normal((experts, 2 * inter)).astype(np.float32),
            pre + "down_proj_blocks": dn_b, pre + "down_proj_scales": dn_s,
            pre + "down_proj_bias": rng.standard_normal((experts, hidden)).astype(np.float32),
            "model.layers.0.mlp.router.weight": rng.standard_normal((experts, hidden)).astype(np.float32)}


def test_converter_writes_one_mxfp4_stack_per_pair(tmp_path):
    rng = np.random.default_rng(2)
    t = gpt_oss_like(rng)
    src = write_checkpoint(tmp_path / "hf", t)
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", src, "--out-dir", tmp_path / "out", "-q")
    assert res.returncode == 0, res.stderr
    assert "2 MXFP4 kept as mxfp4" in res.stderr
    # A partial checkpoint (its config has no dimensions) converts as tensors, with a warning.
    assert "ierun cannot run this model" in res.stderr and "no hidden_size" in res.stderr
    model = iebin.load_model(tmp_path / "out", deep=True)
    entries = {e["name"]: e for e in model.meta["tensors"]}
    pre = "model.layers.0.mlp.experts."
    assert not [n for n in entries if n.endswith(("_blocks", "_scales"))]
    for proj, rows, cols in (("gate_up_proj", 64, 64), ("down_proj", 64, 32)):
        e = entries[pre + proj]
        assert e["dtype"] == "mxfp4" and e["shape"] == [4, rows, cols]
        assert e["quant"] == {"scheme": "mxfp4", "block_size": 32}
        raw = model.path_of(e).read_bytes()[e["file_data_offset"]:e["file_data_offset"] + e["nbytes"]]
        got = MX.dequantize(raw, 4 * rows, cols, P).reshape(4, rows, cols)
        ref = hf_dequant(t[pre + proj + "_blocks"], t[pre + proj + "_scales"])
        assert same_weights(got, ref)
    assert entries[pre + "gate_up_proj_bias"]["dtype"] == "f32"
    res = run_tool("ieconv", "validate", tmp_path / "out", "--deep")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "inspect", tmp_path / "out", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["by_dtype"]["mxfp4"] == {"bits_per_weight": 4.25, "bytes": 4 * 64 * 3 * 17, "tensors": 2}
    res = run_tool("ieconv", "inspect", tmp_path / "out")
    assert res.returncode == 0 and "4×64×32" in res.stdout, res.stdout


def _bad(rng, case: str) -> tuple[dict, str | None, list[str]]:
    t = gpt_oss_like(rng)
    pre = "model.layers.0.mlp.experts."
    method = "mxfp4"
    if case == "no-scales":
        del t[pre + "down_proj_scales"]
        words = ["down_proj_blocks has no", "down_proj_scales"]
    elif case == "no-blocks":
        del t[pre + "down_proj_blocks"]
        words = ["down_proj_scales has no", "down_proj_blocks"]
    elif case == "shape":
        t[pre + "down_proj_scales"] = t[pre + "down_proj_scales"][:, :-1]
        words = ["down_proj_scales: shape [4, 63, 1] does not match", "[4, 64, 1]"]
    elif case == "dtype":
        t[pre + "down_proj_scales"] = t[pre + "down_proj_scales"].astype(np.int8)
        words = ["down_proj_scales: MXFP4 halves are uint8, got i8"]
    elif case == "not-16":
        t[pre + "down_proj_blocks"] = t[pre + "down_proj_blocks"][..., :8].copy()
        words = ["down_proj_blocks: shape [4, 64, 1, 8] is not [..., rows, cols/32, 16]"]
    elif case == "nan-scale":
        t[pre + "gate_up_proj_scales"][2, 7, 1] = 255
        words = ["gate_up_proj_scales: E8M0 scale 255 at (2, 7, 1)", "NaN"]
    elif case == "mixed":
        del t[pre + "down_proj_blocks"], t[pre + "down_proj_scales"]
        t[pre + "down_proj"] = rng.standard_normal((4, 64, 32)).astype(np.float32)
        words = ["model.layers.0.mlp.experts mixes MXFP4", "down_proj"]
    else:
        assert case == "config"
        method = None
        words = ["is an MXFP4 half", "quant_method is None, not 'mxfp4'"]
    return t, method, words


@pytest.mark.parametrize("case", ["no-scales", "no-blocks", "shape", "dtype", "not-16", "nan-scale", "mixed", "config"])
def test_broken_pairs_are_one_line_and_nothing_is_written(tmp_path, case):
    t, method, words = _bad(np.random.default_rng(3), case)
    src = write_checkpoint(tmp_path / "hf", t, method)
    out = tmp_path / "out"
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", src, "--out-dir", out, "-q")
    assert_one_line_error(res, *words)
    assert not out.exists()


# ------------------------------------------------------------- the validator

def test_validator_takes_block_stacks_and_refuses_int4w_stacks(tmp_path):
    src = write_checkpoint(tmp_path / "hf", gpt_oss_like(np.random.default_rng(4)))
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", src, "--out-dir", tmp_path / "out", "-q").returncode == 0
    meta = json.loads((tmp_path / "out" / iebin.META_NAME).read_text())
    k = next(i for i, e in enumerate(meta["tensors"]) if e["name"].endswith("down_proj"))

    def check(**change):
        m = json.loads(json.dumps(meta))
        m["tensors"][k].update(change)
        iebin.validate_meta(m)

    check()
    with pytest.raises(iebin.FormatError, match=rf"tensors\[{k}\]\.nbytes.*1088 disagrees with mxfp4\[4, 64, 32\] = 4352"):
        check(nbytes=64 * 17)
    check(dtype="q4_0", nbytes=4 * 64 * 18, quant={"scheme": "q4_0", "block_size": 32})
    i4 = {"scheme": "int4w", "group_size": 32, "symmetric": True, "scale_dtype": "f16", "layout": "planar-v1"}
    with pytest.raises(iebin.FormatError, match=r"int4w needs a 2-D matrix, tensor has shape \[4, 64, 32\]"):
        check(dtype="int4w", quant=i4)
    with pytest.raises(iebin.FormatError, match=r"mxfp4 needs a 2-D matrix or a 3-D stack"):
        check(shape=[2, 2, 64, 32])


@pytest.mark.parametrize("e", [253, 255])
def test_validate_deep_and_verify_refuse_scales_past_float32(tmp_path, e):
    src = write_checkpoint(tmp_path / "hf", gpt_oss_like(np.random.default_rng(5)))
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", src, "--out-dir", tmp_path / "out", "-q").returncode == 0
    name = "model.layers.0.mlp.experts.down_proj"  # [4, 64, 32]: one block per row; block 70 = expert 1, row 6
    d = corrupt(tmp_path / "out", tmp_path / "bad", name, 17 * 70, bytes([e]))
    assert run_tool("ieconv", "validate", d).returncode == 0  # the JSON and sizes are fine
    words = [name, "block 70 (expert 1, row 6, columns 0..31): e is", str(e), "overflow float32"]
    assert_one_line_error(run_tool("ieconv", "validate", "--deep", d), *words)
    assert_one_line_error(run_tool("ierun", "verify", "quant", "--model-dir", d), "verify quant", *words)
