"""AFMoE (Arcee's Trinity Nano, Mini, Large: AfmoeForCausalLM, llama.cpp's afmoe): norms before and after each
block, per-head q/k norms, each head's attention output times the sigmoid of a gate matrix of its own, every 4th
layer full and unrotated (the others sliding), dense first layers, then experts chosen by sigmoid score plus a
choice bias (renormalised, scaled) beside shared ones, the routed and shared outputs normed together; embeddings
times sqrt(hidden). The frozen transformers logits are tests/test_decoder.py's and the converter's file
tests/test_llamacpp_converter.py's; here, that those features act, what the import reads from llama.cpp's keys,
and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      max_rel, reconfigure, run_tool)
from gguf_build import hf_tensors, rewrite_gguf
from llamacpp_models import _hf_variant

AFMOE = GOLDEN_IEBIN / "tiny-afmoe"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-afmoe.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-afmoe" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-afmoe" / "logits.npy").astype(np.float64)




@pytest.mark.parametrize("zeroed", ["self_attn.gate_proj.weight", "mlp.expert_bias"])
def test_the_gate_and_the_choice_bias_act(tmp_path, zeroed):
    """The same checkpoint with every attention gate's weights zero (each head's output halved, not gated) or the
    choice bias zero (other experts chosen) is another model: the golden holds both."""
    t = hf_tensors(GOLDEN_HF / "tiny-afmoe")
    t.update({k: np.zeros_like(v) for k, v in t.items() if k.endswith(zeroed)})
    out = tmp_path / "m"
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir",
                   _hf_variant(tmp_path, "tiny-afmoe", {"dtype": "float32"}, t), "--out-dir", out)
    assert res.returncode == 0, res.stderr
    assert max_rel(exact_logits(out, IDS, tmp_path / "l.npy"), REF) > 1e-2


def test_llamacpps_file_states_the_hubs_config(tmp_path):
    """The converter writes the router's settings as expert_* keys and no pattern (llama.cpp's default: every 4th
    layer full); the import states them as AfmoeConfig does (route_norm and mup_enabled true, as llama.cpp's graph
    runs it), and computes transformers' logits."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert {k: cfg[k] for k in ("num_experts", "num_experts_per_tok", "num_shared_experts", "moe_intermediate_size",
                                "num_dense_layers", "route_scale", "route_norm", "mup_enabled", "sliding_window",
                                "layer_types")} == {
        "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "moe_intermediate_size": 32,
        "num_dense_layers": 1, "route_scale": 2.0, "route_norm": True, "mup_enabled": True, "sliding_window": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    assert max_rel(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy"), REF) < 1e-5


@pytest.mark.parametrize("kv, drop, needles", [
    ({"afmoe.expert_weights_norm": False}, {"afmoe.expert_weights_norm"}, ("afmoe.expert_weights_norm", "never")),
    ({}, {"afmoe.expert_weights_norm"}, ("afmoe.expert_weights_norm", "missing")),
    ({"afmoe.expert_gating_func": 1}, set(), ("afmoe.expert_gating_func",)),
    ({"afmoe.attention.sliding_window_pattern": [True, False, True, True]}, set(),
     ("afmoe.attention.sliding_window_pattern", "every 4th")),
    ({"afmoe.rope.freq_base_swa": 5000.0}, set(), ("afmoe.rope.freq_base_swa",)),
    ({}, {"afmoe.attention.sliding_window"}, ("afmoe.attention.sliding_window", "missing")),
    ({}, {"afmoe.expert_shared_count"}, ("afmoe.expert_shared_count", "missing")),
])
def test_a_file_llamacpp_would_run_otherwise_is_refused(tmp_path, kv, drop, needles):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=drop, kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, str(bad), *needles)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("fields, needles", [
    ({"mup_enabled": False}, ("mup_enabled", "sqrt(hidden_size)")),
    ({"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
     ("layer_types", "every 4th")),
])
def test_an_afmoe_llamacpp_cannot_run_is_not_exported(tmp_path, fields, needles):
    d = edited_artifact(AFMOE, tmp_path / "m", lambda m: reconfigure(m, **fields))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "m.gguf").exists()


def test_route_norm_false_is_refused(tmp_path):
    """transformers' AFMoE renormalises always; a config saying otherwise (llama.cpp's converter reads it) is
    another model."""
    d = edited_artifact(AFMOE, tmp_path / "m", lambda m: reconfigure(m, route_norm=False))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1", "--max-new", "1"),
                          "route_norm")
