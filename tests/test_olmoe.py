"""OLMoE (OlmoeForCausalLM; llama.cpp's olmoe): Llama's norms with q/k
norms over the whole projections, and experts in every layer weighted by
the top-k of the softmax over all of them. The frozen transformers logits
are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, what the import records and what
is refused rather than run or exported as another model."""

from __future__ import annotations

import json

import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool

OLMOE = GOLDEN_IEBIN / "tiny-olmoe"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-olmoe.gguf"


def test_the_import_says_what_llamacpp_runs(tmp_path):
    """OlmoeConfig's keys: num_experts (not num_local_experts), the expert
    width as intermediate_size, and no renormalisation (llama.cpp's olmoe
    has none)."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["architectures"], cfg["num_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"],
            cfg["norm_topk_prob"]) == (["OlmoeForCausalLM"], 4, 2, 32, False)
    assert "num_local_experts" not in cfg


def test_export_refuses_renormalised_weights(tmp_path):
    d = edited_artifact(OLMOE, tmp_path / "m", lambda meta: reconfigure(meta, norm_topk_prob=True))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.norm_topk_prob", "never renormalises")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("value", [8.0, 0.5])
def test_clipped_qkv_is_refused(tmp_path, value):
    """OLMo's clip_qkv clamps q, k and v; the decoder has no such step."""
    d = edited_artifact(OLMOE, tmp_path / "m", lambda meta: reconfigure(meta, clip_qkv=value))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "config.clip_qkv",
                          "not supported")
