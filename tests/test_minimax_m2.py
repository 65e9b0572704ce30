"""MiniMax-M2 (MiniMaxM2ForCausalLM; llama.cpp's minimax-m2): experts in
every layer chosen by sigmoid score plus the block's correction bias and
renormalised, q/k RMS-normed over the whole projections, RoPE over the
first rotary_dim dims of each head. The frozen transformers logits are
tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, the Hub config's legacy
rotary_dim, what the import records and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from gguf_build import rewrite_gguf
from iekit.runtime.decoder import Decoder

MODEL = GOLDEN_IEBIN / "tiny-minimax-m2"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-minimax-m2.gguf"
REF = GOLDEN / "ref" / "tiny-minimax-m2"
IDS = json.loads((REF / "ids.json").read_text())
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _rel(model_dir) -> float:
    ref = np.load(REF / "logits.npy")
    got = np.asarray(Decoder(model_dir, act="f32").logits(IDS, start=0))
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def test_the_hub_configs_rotary_dim_is_the_partial_rope(tmp_path):
    """MiniMax-M2's published config says rotary_dim 64 of head_dim 128, not
    partial_rotary_factor: read as transformers 5 reads it."""
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, rope_parameters=DEFAULT_ROPE, rotary_dim=8))
    assert _rel(d) < 2e-6
    whole = edited_artifact(MODEL, tmp_path / "w", lambda meta: reconfigure(meta, rope_parameters=DEFAULT_ROPE))
    assert _rel(whole) > 1e-2  # (without it, whole heads turn)


@pytest.mark.parametrize("value", [0, 17, 8.0])
def test_a_rotary_dim_outside_the_head_is_one_error(tmp_path, value):
    d = edited_artifact(MODEL, tmp_path / "m",
                        lambda meta: reconfigure(meta, rope_parameters=DEFAULT_ROPE, rotary_dim=value))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "config.rotary_dim")


def test_the_import_says_what_llamacpp_runs(tmp_path):
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["architectures"], cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"],
            cfg["partial_rotary_factor"]) == (["MiniMaxM2ForCausalLM"], 4, 2, 32, 0.5)
    assert _rel(tmp_path / "m") < 2e-6


@pytest.mark.parametrize("gating", [None, 1])
def test_a_file_not_sigmoid_gated_is_refused(tmp_path, gating):
    """llama.cpp's minimax-m2 graph aborts without the key, and would run a softmax router with 1."""
    g = rewrite_gguf(CONVERTED, tmp_path / "g.gguf", drop={"minimax-m2.expert_gating_func"},
                     kv={} if gating is None else {"minimax-m2.expert_gating_func": gating})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, "minimax-m2.expert_gating_func")
    assert not (tmp_path / "m").exists()


def test_export_refuses_a_tied_head(tmp_path):
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, tie_word_embeddings=True))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.tie_word_embeddings", "output head of its own")
