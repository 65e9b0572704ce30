"""Jais 2 (Inception's Jais2ForCausalLM, llama.cpp's jais2): Llama's attention with biases on q, k, v and o,
LayerNorms with biases, an MLP of up, ReLU squared and down with their biases, no gate. The frozen transformers
logits are tests/test_decoder.py's and the converter's file tests/test_llamacpp_converter.py's; here, that each
switch of biases is read as transformers reads it, and what llama.cpp cannot load is not exported."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_REF, assert_one_line_error, exact_logits, max_rel, run_tool
from gguf_build import hf_tensors
from llamacpp_models import _hf_variant

CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-jais2.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-jais2" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-jais2" / "logits.npy").astype(np.float64)
MLP_BIASES = ("mlp.up_proj.bias", "mlp.down_proj.bias")
ATTN_BIASES = tuple(f"self_attn.{p}_proj.bias" for p in "qkvo")




def test_llamacpps_file_states_the_checkpoints_switches(tmp_path):
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["attention_bias"], cfg["mlp_bias"], cfg["hidden_act"]) == (True, True, "relu2")
    assert cfg["layer_norm_eps"] == 1e-5 and "rms_norm_eps" not in cfg
    assert max_rel(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy"), REF) < 1e-5


@pytest.mark.parametrize("switch, dropped", [("mlp_bias", MLP_BIASES), ("attention_bias", ATTN_BIASES)])
def test_each_switch_turns_its_own_biases_off(tmp_path, switch, dropped):
    """A checkpoint saved with one switch false has none of its biases, and the other's: it converts and runs
    (another model than the golden's), the export is refused (llama.cpp's loader requires them); the same
    switch beside stored biases leaves them unread: the converter says so, and the decoder refuses to run it."""
    t = hf_tensors(GOLDEN_HF / "tiny-jais2")
    without = {k: v for k, v in t.items() if not k.endswith(dropped)}
    hf = _hf_variant(tmp_path, "tiny-jais2", {"dtype": "float32", switch: False}, without)
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "m").returncode == 0
    assert max_rel(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy"), REF) > 1e-3
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "m", "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, f"config.{switch}", "llama.cpp's jais2 requires")
    assert not (tmp_path / "m.gguf").exists()
    stored = _hf_variant(tmp_path / "b", "tiny-jais2", {"dtype": "float32", switch: False}, t)
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", stored, "--out-dir", tmp_path / "b" / "m")
    assert res.returncode == 0 and "warning: ierun cannot run this model" in res.stderr, res.stderr
    res = run_tool("ierun", "generate", "--model-dir", tmp_path / "b" / "m", "--ids", "1", "--max-new", "1")
    assert_one_line_error(res, "does not use it")
    assert any(d in res.stderr for d in dropped), res.stderr
