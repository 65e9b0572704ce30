"""StarCoder2 (Starcoder2ForCausalLM: StarCoder2 3B, 7B, 15B; llama.cpp's starcoder2): LayerNorms with biases, a
bias on every projection, an MLP of c_fc, GELU-tanh and c_proj without a gate, a sliding window on every layer. The
frozen transformers logits and greedy ids are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's, the round trips through GGUF tests/test_gguf_export.py's and
tests/test_gguf_to_hf.py's; here, the window llama.cpp does not apply, the calibration tools on the MLP's new names,
and use_bias."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GOLDEN_IEBIN, assert_one_line_error, edited_artifact, gptq_q8_0, imatrix_of, reconfigure, run_tool

from iekit.formats.iebin import load_model
from iekit.runtime.decoder import Decoder

STARCODER2 = GOLDEN_IEBIN / "tiny-starcoder2"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-starcoder2"
IDS = json.loads((REF / "ids.json").read_text())


def test_the_export_says_that_llamacpp_attends_past_the_window(tmp_path):
    """llama.cpp's starcoder2 attends to every position: the export refuses a model whose window is shorter than its
    context unless asked, and then says what is dropped (StarCoder2's own 4096 of 16384 alike)."""
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", STARCODER2, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.sliding_window", "--allow-full-attention")
    assert not (tmp_path / "m.gguf").exists()
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", STARCODER2, "--out", tmp_path / "m.gguf",
                   "--allow-full-attention")
    assert res.returncode == 0 and "sliding_window 4 is dropped" in res.stderr, res.stderr


def test_the_imatrix_names_the_mlp_by_its_own_names(tmp_path):
    """c_fc reads the normed input (64 wide), c_proj the GELU of c_fc's output plus its bias (128 wide)."""
    z = imatrix_of(STARCODER2, IDS, tmp_path)
    assert z["model.layers.0.mlp.c_fc.weight"].shape == (64,)
    assert z["model.layers.1.mlp.c_proj.weight"].shape == (128,)
    assert not any("up_proj" in k or "down_proj" in k or "gate_proj" in k for k in z.files)


def test_gptq_quantizes_every_matrix_and_the_biases_stay_float(tmp_path):
    g = gptq_q8_0("tiny-starcoder2", tmp_path, sequential=True)
    q = {t["name"]: t["dtype"] for t in load_model(g).meta["tensors"]}
    assert {q[f"model.layers.1.{m}.weight"] for m in ("mlp.c_fc", "mlp.c_proj", "self_attn.o_proj")} == {"q8_0"}
    assert q["model.layers.1.mlp.c_fc.bias"] == q["model.norm.bias"] == "bf16"
    ref = np.load(REF / "logits.npy").astype(np.float64)
    got = Decoder(g, act="f32").logits(IDS).astype(np.float64)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 0.05


def test_use_bias_false_leaves_stored_biases_unread_so_they_are_refused(tmp_path):
    d = edited_artifact(STARCODER2, tmp_path / "m", lambda m: reconfigure(m, use_bias=False))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "does not use it")


@pytest.mark.parametrize("key,value", [("hidden_act", "gelu"), ("mlp_bias", True)])
def test_what_the_decoder_does_not_implement_is_one_line(tmp_path, key, value):
    """The exact GELU is not the tanh approximation; Llama's mlp_bias (a gate bias too) is not StarCoder2's."""
    d = edited_artifact(STARCODER2, tmp_path / "m", lambda m: reconfigure(m, **{key: value}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), key)
