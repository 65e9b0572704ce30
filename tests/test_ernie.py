"""ERNIE 4.5 (Ernie4_5ForCausalLM, Ernie4_5_MoeForCausalLM; llama.cpp's
ernie4_5 and ernie4_5-moe). The frozen transformers logits are
tests/test_decoder.py's, the converter's own files
tests/test_llamacpp_converter.py's; here, what the config's keys do and
what is refused: the MTP tensors beside the model, head_dim's default,
use_bias, experts llama.cpp cannot place."""

from __future__ import annotations

import json

import numpy as np

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from iekit.formats.iebin import load_model
from iekit.runtime.decoder import Decoder
from llamacpp_models import _convert, _hf_variant
from gguf_build import hf_tensors

DENSE, MOE = GOLDEN_IEBIN / "tiny-ernie4-5", GOLDEN_IEBIN / "tiny-ernie4-5-moe"
IDS = json.loads((GOLDEN / "ref" / "tiny-ernie4-5-moe" / "ids.json").read_text())


def test_the_mtp_tensors_are_carried_unread_and_left_out_of_the_gguf(tmp_path):
    """The Hub's -PT checkpoints store the multi-token prediction tensors
    (model.mtp_*) beside the model: transformers leaves them unread, so
    does the decoder (the logits are the same without them), the artifact
    carries them, and the export leaves them out as llama.cpp's converter
    does; any other unknown tensor is still refused."""
    names = {t["name"] for t in load_model(MOE).tensors}
    assert {"model.mtp_linear_proj.0.weight", "model.mtp_block.0.mlp.gate.weight"} <= names
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", MOE, "--out", tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    assert not any("mtp" in t.name for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors)
    bare = _convert(_hf_variant(tmp_path, "tiny-ernie4-5-moe", {}, {
        k: v for k, v in hf_tensors(GOLDEN / "hf" / "tiny-ernie4-5-moe").items() if not k.startswith("model.mtp_")}),
        tmp_path / "bare")
    np.testing.assert_allclose(Decoder(bare, act="f32").logits(IDS), Decoder(MOE, act="f32").logits(IDS), rtol=0,
                               atol=1e-5)
    odd = edited_artifact(MOE, tmp_path / "odd", lambda m: m["tensors"][-1].update(name="model.extra.weight"))
    assert_one_line_error(run_tool("ierun", "logits", "--model-dir", odd, "--ids", "1", "--out", tmp_path / "l.npy"),
                          "model.extra.weight", "does not use it")


def test_head_dim_defaults_to_ernies_128(tmp_path):
    """Ernie4_5Config's head_dim is 128 where the config states none, not
    hidden / heads (as Qwen3's, Gemma's, gpt-oss's ... are their classes'
    constants: hf_config.HEAD_DIM_DEFAULTS): the toy's 16-wide heads then
    disagree with q_proj, one line naming both."""
    d = edited_artifact(DENSE, tmp_path / "m", lambda m: reconfigure(m, head_dim=None))
    res = run_tool("ierun", "logits", "--model-dir", d, "--ids", "1", "--out", tmp_path / "l.npy")
    assert_one_line_error(res, "model.head_dim: 128")


def test_use_bias_is_refused(tmp_path):
    d = edited_artifact(DENSE, tmp_path / "m", lambda m: reconfigure(m, use_bias=True))
    assert_one_line_error(run_tool("ierun", "logits", "--model-dir", d, "--ids", "1", "--out", tmp_path / "l.npy"),
                          "config.use_bias")


def test_experts_llamacpp_cannot_place_are_refused(tmp_path):
    """moe_layer_interval 2: experts at layer 1 alone, layer 2 dense (its MLP
    drawn from layer 0's). The decoder runs it; llama.cpp's ernie4_5-moe
    loads experts for every layer from the first that has them, so the
    export refuses it, naming the key."""
    t = {k: v for k, v in hf_tensors(GOLDEN / "hf" / "tiny-ernie4-5-moe").items()
         if not k.startswith(("model.layers.2.mlp.", "model.mtp_"))}
    t.update({k.replace("layers.0.", "layers.2."): v[::-1].copy() for k, v in t.items()
              if k.startswith("model.layers.0.mlp.")})
    d = _convert(_hf_variant(tmp_path, "tiny-ernie4-5-moe", {"moe_layer_interval": 2}, t), tmp_path / "m")
    assert np.isfinite(Decoder(d, act="f32").logits(IDS)).all()
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.moe_layer_interval", "experts at layers [1]")
