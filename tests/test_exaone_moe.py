"""EXAONE MoE (LG's K-EXAONE: ExaoneMoeForCausalLM, llama.cpp's exaone-moe): EXAONE 4's attention (per-head q/k
norms; sliding layers rotated, full ones not) in pre-norm layers, dense first layers, then DeepSeek-V3's router
beside shared experts; a dense multi-token prediction layer beside the model (mtp.*), which transformers leaves
unread and llama.cpp's converter writes after the last block. The frozen transformers logits are
tests/test_decoder.py's and the converter's file tests/test_llamacpp_converter.py's; here, what the import reads
from llama.cpp's keys, where the MTP layer goes, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      reconfigure, run_tool)
from gguf_build import rewrite_gguf

EXAONE_MOE = GOLDEN_IEBIN / "tiny-exaone-moe"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-exaone-moe.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-exaone-moe" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-exaone-moe" / "logits.npy").astype(np.float64)


def test_llamacpps_file_states_the_hubs_config(tmp_path):
    """The converter's keys read back as ExaoneMoeConfig's; its block after the last goes back beside the model
    under the Hub's mtp.* names (the dense MLP an MTP layer has), and the logits are transformers'."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    keys = ("num_experts", "num_experts_per_tok", "num_shared_experts", "moe_intermediate_size", "mlp_layer_types",
            "routed_scaling_factor", "norm_topk_prob", "n_group", "topk_group", "scoring_func", "sliding_window",
            "layer_types", "num_hidden_layers", "num_nextn_predict_layers")
    assert {k: cfg[k] for k in keys} == {
        "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "moe_intermediate_size": 32,
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "routed_scaling_factor": 2.5,
        "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "scoring_func": "sigmoid", "sliding_window": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "num_hidden_layers": 4,
        "num_nextn_predict_layers": 1}
    names = {t["name"] for t in json.loads((tmp_path / "m/model.ie.json").read_text())["tensors"]}
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.mlp.gate_proj.weight"} <= names
    assert not any(n.startswith("model.layers.4.") for n in names)
    assert np.abs(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy") - REF).max() / np.abs(REF).max() < 1e-5


@pytest.mark.parametrize("kv, drop, needles", [
    ({}, {"exaone-moe.expert_gating_func"}, ("exaone-moe.expert_gating_func", "missing")),  # (its loader needs it)
    ({"exaone-moe.expert_gating_func": 1}, set(), ("exaone-moe.expert_gating_func", "sigmoid")),
    ({"exaone-moe.expert_shared_feed_forward_length": 48}, set(),
     ("exaone-moe.expert_shared_feed_forward_length", "whole number")),
    ({"exaone-moe.attention.sliding_window_pattern": [True, False]}, set(),
     ("exaone-moe.attention.sliding_window_pattern", "4 booleans")),
    ({"exaone-moe.attention.sliding_window": 0}, set(), ("exaone-moe.attention.sliding_window", "at least 1")),
    ({}, {"exaone-moe.attention.sliding_window"}, ("exaone-moe.attention.sliding_window", "missing")),
])
def test_a_file_llamacpp_would_not_run_so_is_refused(tmp_path, kv, drop, needles):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=drop, kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, str(bad), *needles)
    assert not (tmp_path / "m").exists()


def test_a_model_rotating_its_full_layers_is_not_exported(tmp_path):
    """llama.cpp's exaone-moe rotates the sliding layers alone; an artifact without a window (whose layers all
    rotate, as EXAONE 4's attention does then) would lose its RoPE there: refused."""
    d = edited_artifact(EXAONE_MOE, tmp_path / "m", lambda m: reconfigure(
        m, sliding_window=None, layer_types=["full_attention"] * 4))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.sliding_window", "rotates the sliding layers alone")
    assert not (tmp_path / "m.gguf").exists()
