"""Qwen3-Next (Qwen3NextForCausalLM; llama.cpp's qwen3next): Qwen3.5-MoE's
layers with the gated DeltaNet's projections stored fused and blocked by key
head (in_proj_qkvz, in_proj_ba), its value heads in Hugging Face's grouped
order on both sides. The frozen transformers logits are tests/test_decoder.py's,
the converter's own file tests/test_llamacpp_converter.py's, the round trips
through GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's;
here, the fused matrices read as the parts they hold (from a checkpoint and
from llama.cpp's older files, whose ssm_in fuses q, k, v and z), and what
neither side can say."""

from __future__ import annotations

import json
import shutil

import numpy as np
from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from gguf_build import hf_tensors, rewrite_gguf

from iekit.runtime.decoder import Decoder

NAME = "tiny-qwen3-next"
LLAMACPP = GOLDEN_HF.parent / "gguf" / "llamacpp" / f"{NAME}.gguf"
IDS = json.loads((GOLDEN_HF.parent / "ref" / NAME / "ids.json").read_text())
CFG = json.loads((GOLDEN_HF / NAME / "config.json").read_text())
KH, VH, KD, VD = (CFG[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                   "linear_value_head_dim"))
R = VH // KH  # value heads per key head


def _artifact(model) -> dict[str, np.ndarray]:
    """An artifact's float tensors as float32, [rows, cols]."""
    meta = json.loads((model / "model.ie.json").read_text())
    blob = np.fromfile(model / "model.ie.bin", np.uint8)
    out = {}
    for t in meta["tensors"]:
        raw = blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        if t["dtype"] == "bf16":
            out[t["name"]] = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t["shape"])
        elif t["dtype"] == "f32":
            out[t["name"]] = raw.view(np.float32).reshape(t["shape"])
    return out


def _fused(qkv: np.ndarray, z: np.ndarray) -> np.ndarray:
    """in_proj_qkvz as models/qwen3_next's fix_query_key_value_ordering reads it: per key head its q rows, k rows,
    then its value heads' v rows and z rows."""
    q, k, v = np.split(qkv, [KH * KD, 2 * KH * KD])
    cols = qkv.shape[1]
    return np.concatenate([q.reshape(KH, KD, cols), k.reshape(KH, KD, cols), v.reshape(KH, R * VD, cols),
                           z.reshape(KH, R * VD, cols)], axis=1).reshape(-1, cols)


def test_the_fused_projections_are_read_as_the_parts_they_hold():
    """The artifact holds Qwen3.5's in_proj_qkv (every q row, every k row, every v row), in_proj_z, in_proj_b and
    in_proj_a, cut from the checkpoint's fused matrices as transformers splits them, in the grouped order."""
    src, art = hf_tensors(GOLDEN_HF / NAME), _artifact(GOLDEN_IEBIN / NAME)
    for i, kind in enumerate(CFG["layer_types"]):
        pre = f"model.layers.{i}.linear_attn."
        if kind != "linear_attention":
            assert not any(n.startswith(pre) for n in art)
            continue
        qkvz, ba = src[pre + "in_proj_qkvz.weight"], src[pre + "in_proj_ba.weight"]
        assert pre + "in_proj_qkvz.weight" not in art and pre + "in_proj_ba.weight" not in art
        assert np.array_equal(_fused(art[pre + "in_proj_qkv.weight"], art[pre + "in_proj_z.weight"]), qkvz)
        b, a = (x.reshape(KH, R, -1) for x in (art[pre + "in_proj_b.weight"], art[pre + "in_proj_a.weight"]))
        assert np.array_equal(np.concatenate([b, a], axis=1).reshape(ba.shape), ba)
        assert np.array_equal(art[pre + "A_log"], src[pre + "A_log"])  # (grouped: nothing reordered)
    assert "linear_value_head_order" not in json.loads((GOLDEN_IEBIN / NAME / "config.json").read_text())


def test_an_older_gguf_with_ssm_in_imports_as_the_current_one(tmp_path):
    """llama.cpp's converter once wrote q, k, v and z as one ssm_in, blocked by key head as in_proj_qkvz (its
    graph still reads either): such a file imports to the same projections, and so to the same model."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(LLAMACPP)
    t = {x.name: dequantize(x.data, x.tensor_type).reshape([int(d) for d in reversed(x.shape)]) for x in r.tensors}
    layers = [i for i, k in enumerate(CFG["layer_types"]) if k == "linear_attention"]
    edit = {}
    for i in layers:
        edit.update({f"blk.{i}.attn_qkv.weight": None, f"blk.{i}.attn_gate.weight": None,
                     f"blk.{i}.ssm_in.weight": _fused(t[f"blk.{i}.attn_qkv.weight"], t[f"blk.{i}.attn_gate.weight"])})
    old = rewrite_gguf(LLAMACPP, tmp_path / "old.gguf", tensors=edit)
    for src, out in ((LLAMACPP, tmp_path / "new"), (old, tmp_path / "old")):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", out)
        assert res.returncode == 0, res.stderr
    new, was = _artifact(tmp_path / "new"), _artifact(tmp_path / "old")
    assert sorted(new) == sorted(was)
    for n in new:
        assert np.array_equal(new[n], was[n]), n
    assert np.array_equal(Decoder(tmp_path / "old", act="f32").logits(IDS),
                          Decoder(tmp_path / "new", act="f32").logits(IDS))


def test_fused_rows_the_config_does_not_split_are_one_line(tmp_path):
    """Heads that do not add up to in_proj_qkvz's rows: one line naming the tensor, nothing written."""
    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / NAME, hf)
    (hf / "config.json").write_text(json.dumps({**CFG, "linear_value_head_dim": VD * 2}))
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "m"),
                          "in_proj_qkvz")
    assert not (tmp_path / "m").exists()
    bad = rewrite_gguf(LLAMACPP, tmp_path / "bad.gguf", drop={"qwen3next.ssm.time_step_rank"},
                       kv={"qwen3next.ssm.time_step_rank": VH * 2, "qwen3next.ssm.inner_size": VH * 2 * VD})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "g"), "ssm_ba")


def test_what_llamacpps_qwen3next_cannot_run_is_refused(tmp_path):
    """llama.cpp's qwen3next always renormalises the top-k weights: a model that does not is refused by name."""
    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / NAME, hf)
    (hf / "config.json").write_text(json.dumps({**CFG, "norm_topk_prob": False}))
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "m").returncode == 0
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "m", "--out",
                                   tmp_path / "m.gguf"), "norm_topk_prob")
    assert not (tmp_path / "m.gguf").exists()
