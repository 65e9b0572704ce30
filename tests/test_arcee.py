"""Arcee (ArceeForCausalLM, AFM-4.5B; llama.cpp's arcee): Llama's layer whose MLP is up, ReLU squared, down, with no
gate. The frozen transformers logits and greedy ids are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's, the round trips through GGUF tests/test_gguf_export.py's and
tests/test_gguf_to_hf.py's; here, the calibration tools on an MLP without a
gate, and what a config or checkpoint may not say."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, gptq_q8_0, imatrix_of, max_rel,
                      reconfigure, run_tool)
from gguf_build import hf_tensors
from safetensors.numpy import save_file

from iekit.formats.iebin import load_model
from iekit.runtime.decoder import Decoder

ARCEE = GOLDEN_IEBIN / "tiny-arcee"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-arcee"
IDS = json.loads((REF / "ids.json").read_text())




def test_the_imatrix_has_the_mlp_without_a_gate(tmp_path):
    """The MLP's up reads the normed input (64 wide), its down the squared ReLU (128 wide, never negative); no gate
    is named, as none is stored."""
    z = imatrix_of(ARCEE, IDS, tmp_path)
    assert z["model.layers.0.mlp.up_proj.weight"].shape == (64,)
    assert z["model.layers.1.mlp.down_proj.weight"].shape == (128,)
    assert (z["model.layers.1.mlp.down_proj.weight"] >= 0).all()
    assert not any("gate_proj" in k for k in z.files)


@pytest.mark.parametrize("sequential", [False, True])
def test_gptq_quantizes_the_mlp_and_the_export_takes_it(tmp_path, sequential):
    g = gptq_q8_0("tiny-arcee", tmp_path, sequential)
    q = load_model(g).meta["tensors"]
    assert {t["dtype"] for t in q if t["name"].endswith(("up_proj.weight", "down_proj.weight", "q_proj.weight"))} == \
        {"q8_0"}
    ref = np.load(REF / "logits.npy").astype(np.float64)
    assert max_rel(Decoder(g, act="f32").logits(IDS), ref) < 0.05
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", g, "--out", tmp_path / "g.gguf")
    assert res.returncode == 0, res.stderr


def test_another_unit_runs_but_llamacpp_would_square_it(tmp_path):
    """ArceeMLP applies config.hidden_act between up and down, whatever it names: SiLU runs (a unit the decoder has),
    the exact GELU is refused in one line, and the export of a SiLU Arcee is refused (llama.cpp's arcee squares the
    ReLU whatever the file says)."""
    d = edited_artifact(ARCEE, tmp_path / "silu", lambda m: reconfigure(m, hidden_act="silu"))
    ref = np.load(REF / "logits.npy").astype(np.float64)
    assert max_rel(Decoder(d, act="f32").logits(IDS), ref) > 0.05  # (another model: not ReLU squared)
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf"),
                          "hidden_act", "llama.cpp's arcee uses relu2")
    d = edited_artifact(ARCEE, tmp_path / "gelu", lambda m: reconfigure(m, hidden_act="gelu"))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "hidden_act", "'gelu'")


def test_a_stored_gate_is_refused_not_dropped(tmp_path):
    """A checkpoint that stores a gate_proj beside the ungated MLP is not the model transformers builds (it would
    leave the gate unread): the conversion says ierun cannot run it, and ierun refuses it in one line naming the
    tensor."""
    src = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-arcee", src)
    t = hf_tensors(src)
    t["model.layers.0.mlp.gate_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].copy()
    save_file(t, str(src / "model.safetensors"))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "m")
    assert res.returncode == 0 and "ierun cannot run this model" in res.stderr, res.stderr
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", tmp_path / "m", "--ids", "1"),
                          "model.layers.0.mlp.gate_proj.weight")
