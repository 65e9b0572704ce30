"""dots.llm1 (rednote-hilab's Dots1ForCausalLM, llama.cpp's dots1): Qwen3's attention, dense first layers, then
DeepSeek-V3's router (sigmoid scores plus a choice bias, chosen within groups, renormalised where the config says,
scaled) beside shared experts. The frozen transformers logits are tests/test_decoder.py's and the converter's file
tests/test_llamacpp_converter.py's; here, that the router's parts act, what the import reads from llama.cpp's keys,
the config rules transformers applies that the checkpoint does not state, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      max_rel, reconfigure, run_tool)
from gguf_build import hf_tensors, rewrite_gguf
from llamacpp_models import _hf_variant

from iekit.formats.errors import IEError, UnsupportedError
from iekit.formats.model_spec import decoder_spec

DOTS1 = GOLDEN_IEBIN / "tiny-dots1"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-dots1.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-dots1" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-dots1" / "logits.npy").astype(np.float64)




def _meta(**fields) -> dict:
    meta = json.loads((DOTS1 / "model.ie.json").read_text())
    reconfigure(meta, **fields)
    return meta


@pytest.mark.parametrize("edit", ["zero choice bias", "one group"])
def test_the_choice_bias_and_the_groups_act(tmp_path, edit):
    """The same weights with the choice bias zero, or the experts in one group, choose other experts: the golden
    (2 groups of 2, the better group kept) holds both."""
    t = hf_tensors(GOLDEN_HF / "tiny-dots1")
    cfg = {"dtype": "float32"}
    if edit == "zero choice bias":
        t.update({k: np.zeros_like(v) for k, v in t.items() if k.endswith("e_score_correction_bias")})
    else:
        cfg.update(n_group=1, topk_group=1)
    out = tmp_path / "m"
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", _hf_variant(tmp_path, "tiny-dots1", cfg, t),
                   "--out-dir", out)
    assert res.returncode == 0, res.stderr
    assert max_rel(exact_logits(out, IDS, tmp_path / "l.npy"), REF) > 1e-2


def test_llamacpps_file_states_the_hubs_config(tmp_path):
    """The converter writes the router as expert_* keys (groups, scale, renormalisation, sigmoid gating); the
    import states them as the Hub's config does, and computes transformers' logits."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    keys = ("n_routed_experts", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size",
            "first_k_dense_replace", "routed_scaling_factor", "norm_topk_prob", "n_group", "topk_group",
            "scoring_func", "topk_method", "sliding_window")
    assert {k: cfg[k] for k in keys} == {
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
        "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "n_group": 2,
        "topk_group": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "sliding_window": None}
    assert max_rel(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy"), REF) < 1e-5


@pytest.mark.parametrize("kv, drop, needles", [
    ({}, {"dots1.expert_gating_func"}, ("dots1.expert_gating_func", "missing")),  # (llama.cpp's graph aborts)
    ({"dots1.expert_gating_func": 1}, set(), ("dots1.expert_gating_func", "sigmoid")),
    ({}, {"dots1.expert_shared_count"}, ("dots1.expert_shared_count", "missing")),
    ({"dots1.nextn_predict_layers": 1}, set(), ("dots1.nextn_predict_layers", "not read")),
])
def test_a_file_llamacpp_would_not_run_so_is_refused(tmp_path, kv, drop, needles):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=drop, kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, str(bad), *needles)
    assert not (tmp_path / "m").exists()


def test_grouped_query_attention_is_not_exported(tmp_path):
    """llama.cpp's dots1 loads k and v as wide as q (the Hub's model has a key head per query head): a dots1 with
    fewer key heads runs here, and is refused by the export in one line."""
    t = hf_tensors(GOLDEN_HF / "tiny-dots1")
    t.update({k: v[:v.shape[0] // 2] for k, v in t.items() if k.endswith(("k_proj.weight", "v_proj.weight"))})
    hf = _hf_variant(tmp_path, "tiny-dots1", {"dtype": "float32", "num_key_value_heads": 2}, t)
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "m").returncode == 0
    assert run_tool("ierun", "generate", "--model-dir", tmp_path / "m", "--ids", "1", "--max-new", "1").returncode == 0
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "m", "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.num_key_value_heads", "2 of 4", "llama.cpp's dots1")
    assert not (tmp_path / "m.gguf").exists()


def test_a_sliding_window_is_not_exported_unasked(tmp_path):
    """llama.cpp's dots1 attends to every position: a dots1 with sliding layers is refused, or with
    --allow-full-attention exported with a warning."""
    d = edited_artifact(DOTS1, tmp_path / "m", lambda m: reconfigure(
        m, sliding_window=4, layer_types=["full_attention", "sliding_attention"]))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.sliding_window", "llama.cpp's dots1", "--allow-full-attention")
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "m.gguf",
                   "--allow-full-attention")
    assert res.returncode == 0 and "warning: sliding_window 4 is dropped" in res.stderr


def test_the_config_class_rules_the_checkpoint_leaves_unsaid():
    """Dots1Config's defaults where the Hub's config.json has no key: the top-k weights not renormalised; without
    layer_types, the layers from max_window_layers (62) on slide where sliding_window is set."""
    path = DOTS1 / "model.ie.json"
    assert decoder_spec(_meta(norm_topk_prob=None), path).moe.norm_topk is False
    assert decoder_spec(_meta(), path).windows == (0, 0)
    assert decoder_spec(_meta(layer_types=None, sliding_window=4), path).windows == (0, 0)  # (2 layers < 62)
    assert decoder_spec(_meta(layer_types=None, sliding_window=4, max_window_layers=1), path).windows == (0, 4)
    assert decoder_spec(_meta(layer_types=None, sliding_window=None, max_window_layers=0), path).windows == (0, 0)


@pytest.mark.parametrize("fields, error, needles", [
    ({"scoring_func": "softmax"}, UnsupportedError, ("config.scoring_func", "'softmax'", "sigmoid")),
    ({"scoring_func": "noaux_tc"}, None, ()),  # (dots.llm1's first Hub configs: its converter read sigmoid)
    ({"topk_method": "greedy"}, UnsupportedError, ("config.topk_method", "'greedy'")),
    ({"n_shared_experts": None}, IEError, ("config.n_shared_experts",)),  # (Dots1Config has no default)
])
def test_what_the_router_does_not_do_is_refused(fields, error, needles):
    path = DOTS1 / "model.ie.json"
    if error is None:
        assert decoder_spec(_meta(**fields), path).moe.sigmoid
        return
    with pytest.raises(error) as e:
        decoder_spec(_meta(**fields), path)
    assert all(n in str(e.value) for n in (str(path), *needles)), str(e.value)
