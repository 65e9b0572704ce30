"""Mamba-2 (Mamba2ForCausalLM; llama.cpp's mamba2): Nemotron-H's Mamba2 block in every layer and nothing else, no
attention, no MLP. The frozen transformers logits and greedy ids are tests/test_decoder.py's, the converter's own
file tests/test_llamacpp_converter.py's, the round trips through GGUF tests/test_gguf_export.py's and
tests/test_gguf_to_hf.py's, llama.cpp running the export tests/test_llamacpp_runs.py's; here, what a model without
attention changes (no KV cache, no head counts anywhere), the calibration tools on it, and what a config or file may
not say."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, gptq_q8_0, imatrix_of,
                      max_rel, reconfigured_logits, run_tool)
from gguf_build import rewrite_gguf

from iekit.formats.iebin import load_model
from iekit.runtime.decoder import Decoder, cached_layers, kv_cache_bytes

MODEL = GOLDEN_IEBIN / "tiny-mamba2"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-mamba2"
IDS = json.loads((REF / "ids.json").read_text())
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-mamba2.gguf"




def test_the_states_carry_and_nothing_is_cached():
    """Three Mamba2 layers: their scans' states and convolutions' last inputs carry from step to step
    (conftest.assert_states_carry), and no layer keeps a KV cache at any context; int8 activations as float ones,
    near enough."""
    assert_states_carry(MODEL, IDS)
    s = Decoder(MODEL).spec
    assert s.ssm == (True,) * 3 and s.mixer_only == (True,) * 3 and s.mlp_only == (False,) * 3
    assert (s.ssm_heads, s.ssm_head_dim, s.ssm_state, s.ssm_groups, s.ssm_conv) == (4, 32, 16, 2, 4)
    assert s.attends == (False,) * 3 and cached_layers(s) == 0 and s.moe is None
    assert kv_cache_bytes(s, 100, 1, ("f32", "f32")) == 100 * 4  # (no K or V: a thread's score row alone)
    assert max_rel(Decoder(MODEL, act="int8").logits(IDS), Decoder(MODEL).logits(IDS)) < 2e-2


@pytest.mark.parametrize("edit,key", [
    ({"use_bias": True}, "config.use_bias"),
    ({"use_conv_bias": False}, "config.use_conv_bias"),
    ({"hidden_act": "gelu"}, "model.hidden_act"),
    ({"time_step_limit": [0.0, 5.0]}, "config.time_step_limit"),
    ({"num_heads": 3}, "config.num_heads"),
    ({"expand": 3}, "config.num_heads"),
    ({"n_groups": 3}, "config.num_heads"),
    ({"state_size": 0}, "config.state_size"),
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    """What Mamba2ForCausalLM's config may say that the decoder does not run, or that is no Mamba-2 (heads that are
    not expand x hidden channels, groups that do not divide them): one line naming the key."""
    assert_one_line_error(reconfigured_logits(MODEL, tmp_path, **edit), key)


@pytest.mark.parametrize("kv,key", [
    ({"mamba2.attention.head_count": 4}, "mamba2.attention.head_count"),
    ({"mamba2.feed_forward_length": 128}, "mamba2.feed_forward_length"),
    ({"mamba2.ssm.time_step_rank": 3}, "mamba2.ssm.inner_size"),
    ({"mamba2.ssm.inner_size": 96}, "mamba2.ssm.inner_size"),
    ({"mamba2.ssm.state_size": None}, "mamba2.ssm.state_size"),
])
def test_a_gguf_that_is_no_mamba2_is_one_line(tmp_path, kv, key):
    """llama.cpp's mamba2 has no attention and no MLP, and its dims come from ssm.*: a file that states heads or a
    width, whose inner width is no whole number of heads or of the model's width, or that lacks a dimension, is
    refused in one line, and nothing is written."""
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=set(kv),
                       kv={k: v for k, v in kv.items() if v is not None})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), key)
    assert not (tmp_path / "m").exists()


def test_the_imatrix_names_every_matrix_as_llamacpp_does(tmp_path):
    """An imatrix of a Mamba-2 has each layer's two matrices under mixer. (in_proj reads the normed input, 64
    wide; out_proj the gated scan, 128) beside the head's, and no other."""
    z = imatrix_of(MODEL, IDS, tmp_path)
    assert sorted(k for k in z.files if k != "__meta__.json") == sorted(
        ["lm_head.weight", *(f"model.layers.{i}.mixer.{p}_proj.weight" for i in range(3) for p in ("in", "out"))])
    assert z["model.layers.0.mixer.in_proj.weight"].shape == (64,)
    assert z["model.layers.2.mixer.out_proj.weight"].shape == (128,)


def test_gptq_quantizes_every_layer_and_the_export_takes_it(tmp_path):
    """gptq's covariances reach every layer's in_proj and out_proj; the quantized model stays near the float one,
    and it exports."""
    g = gptq_q8_0("tiny-mamba2", tmp_path, False)
    q = load_model(g).meta["tensors"]
    assert {t["dtype"] for t in q if t["name"].endswith(("in_proj.weight", "out_proj.weight"))} == {"q8_0"}
    ref = np.load(REF / "logits.npy").astype(np.float64)
    assert max_rel(Decoder(g, act="f32").logits(IDS), ref) < 0.05
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", g, "--out", tmp_path / "g.gguf")
    assert res.returncode == 0, res.stderr
