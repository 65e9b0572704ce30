"""LFM2 (Lfm2ForCausalLM; llama.cpp's lfm2): short gated convolutions, whose
last inputs replace a KV cache, beside attention with per-head q/k norms.
The frozen transformers logits and greedy ids are tests/test_decoder.py's,
the converter's own file tests/test_llamacpp_converter.py's, the round
trips through GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's;
here, what the states change (no rewinding), the MLP's width rule, the
Hub's spelling of the config, and what a config or file may not say."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, edited_artifact, max_rel,
                      reconfigure, reconfigured_logits, run_tool, text_model_converted)
from gguf_build import rewrite_gguf

from iekit.formats import model_spec
from iekit.runtime.decoder import Decoder

LFM2 = GOLDEN_IEBIN / "tiny-lfm2"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-lfm2"
IDS = json.loads((REF / "ids.json").read_text())
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-lfm2.gguf"




def test_the_convolutions_carry_from_step_to_step():
    """The convolutions' last inputs (conftest.assert_states_carry), the whole prompt as transformers computes it."""
    assert max_rel(Decoder(LFM2, act="f32").logits(IDS), np.load(REF / "logits.npy")) < 1e-5
    assert_states_carry(LFM2, IDS)


def test_only_the_attention_layer_has_a_kv_cache():
    """Three layers of four convolve: the one attention layer's K and V per position (2 KV heads of 16, f32) and a
    thread's score."""
    from iekit.runtime.decoder import cached_layers, kv_cache_bytes

    s = Decoder(LFM2).spec
    assert s.short_conv == (True, False, True, True) and cached_layers(s) == 1
    assert kv_cache_bytes(s, 100, 1, ("f32", "f32")) == 100 * (2 * 2 * 16 * 4 + 4)


@pytest.mark.parametrize("raw,adjust,mult,step,want", [
    (200, True, 1.0, 32, 160),      # the toy's: 2/3 of 200 is 133, up to a multiple of 32
    (12288, True, 1.0, 256, 8192),  # LFM2-1.2B's block_ff_dim (llama.cpp's n_ff 8192 for the 1.2B)
    (200, True, None, 32, 133),     # no multiplier: no rounding up either (Lfm2MLP's order)
    (160, False, 1.0, 32, 160),     # as stated
])
def test_the_mlp_width_is_lfm2s_rule(raw, adjust, mult, step, want):
    """Lfm2MLP's width from the config: two thirds where block_auto_adjust_ff_dim, times the multiplier, up to a
    multiple of block_multiple_of."""
    cfg = {"intermediate_size": raw, "block_auto_adjust_ff_dim": adjust, "block_ffn_dim_multiplier": mult,
           "block_multiple_of": step}
    assert model_spec._lfm2(cfg, 4, LFM2 / "model.ie.json", moe=False)["inter"] == want


def test_lfm2_moes_dense_layers_take_intermediate_size_as_it_is():
    """Lfm2MoeMLP has no width rule (Lfm2MoeConfig has none of the block_* keys)."""
    assert model_spec._lfm2({"intermediate_size": 200}, 4, LFM2 / "model.ie.json", moe=True)["inter"] == 200


def test_the_hubs_spelling_reads_as_transformers_does(tmp_path):
    """LFM2's config.json on the Hub: block_ff_dim for intermediate_size, tie_embedding, full_attn_idxs for
    layer_types (the same model)."""
    def hub(meta):
        cfg = meta["config"]
        cfg["block_ff_dim"] = cfg.pop("intermediate_size")
        cfg["tie_embedding"] = cfg.pop("tie_word_embeddings")
        cfg["full_attn_idxs"] = [i for i, t in enumerate(cfg.pop("layer_types")) if t == "full_attention"]
        reconfigure(meta)

    d = edited_artifact(LFM2, tmp_path / "m", hub)
    assert Decoder(d).spec.tied
    assert np.array_equal(Decoder(d, act="f32").logits(IDS), Decoder(LFM2, act="f32").logits(IDS))


@pytest.mark.parametrize("edit,key", [
    ({"conv_bias": True}, "config.conv_bias"),
    ({"layer_types": ["conv", "sliding_attention", "conv", "conv"]}, "config.layer_types"),
    ({"conv_L_cache": 0}, "config.conv_L_cache"),
    ({"block_multiple_of": 0}, "config.block_multiple_of"),
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    assert_one_line_error(reconfigured_logits(LFM2, tmp_path, **edit), key)


@pytest.mark.parametrize("per_layer", [[0, 2, 0], [0, 2, 0, 1], [0, 0, 0, 0]])
def test_a_gguf_whose_layers_do_not_add_up_is_one_line(tmp_path, per_layer):
    """attention.head_count_kv names the convolving layers: one count per block, the attention blocks' all alike."""
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop={"lfm2.attention.head_count_kv"},
                       kv={"lfm2.attention.head_count_kv": per_layer})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"),
                          "lfm2.attention.head_count_kv")
    assert not (tmp_path / "m").exists()


LFM2_MOE = GOLDEN_IEBIN / "tiny-lfm2-moe"


@pytest.mark.parametrize("edit,key", [
    ({"norm_topk_prob": False}, "config.norm_topk_prob"),
    ({"routed_scaling_factor": 2.0}, "config.routed_scaling_factor"),
])
def test_an_lfm2_moe_llamacpp_cannot_run_is_not_exported(tmp_path, edit, key):
    """llama.cpp's lfm2moe renormalises the top-k weights always and never scales them: a model that does not is
    refused in one line (the decoder runs it)."""
    d = edited_artifact(LFM2_MOE, tmp_path / "m", lambda m: reconfigure(m, **edit))
    assert run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "l.npy").returncode == 0
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf"), key)
    assert not (tmp_path / "m.gguf").exists()


def test_an_lfm2_moe_without_a_choice_bias_is_not_exported(tmp_path):
    """use_expert_bias false: the decoder runs it (the top k by sigmoid score alone); llama.cpp's lfm2moe reads a
    choice bias, so the export refuses."""
    def unbiased(meta):
        reconfigure(meta, use_expert_bias=False)
        meta["tensors"] = [t for t in meta["tensors"] if not t["name"].endswith("feed_forward.expert_bias")]

    d = edited_artifact(LFM2_MOE, tmp_path / "m", unbiased)
    assert run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "l.npy").returncode == 0
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf"),
                          "config.use_expert_bias")


def test_the_text_model_of_lfm2_vl_is_lfm2(tmp_path):
    """LFM2-VL (Lfm2VlForConditionalGeneration): an Lfm2ForCausalLM beside a SigLIP2 tower, its text_config over
    transformers' Lfm2Config defaults (frozen by the generator), tied where the checkpoint stores no head;
    golden/hf/tiny-lfm2-vl holds tiny-lfm2's language model, so the text model converts to tiny-lfm2's artifact,
    byte for byte."""
    from iekit.convert import text_model

    cfg, ie = text_model_converted("tiny-lfm2-vl", tmp_path, ("lfm2-vl-text-defaults.json",
                                                              text_model.LFM2_TEXT_DEFAULTS,
                                                              text_model.LFM2_ROPE_DEFAULTS))
    assert cfg["architectures"] == ["Lfm2ForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (ie / "model.ie.bin").read_bytes() == (LFM2 / "model.ie.bin").read_bytes()


def test_a_per_layer_head_count_without_zeros_is_every_layer_attending(tmp_path):
    """attention.head_count_kv one per block and none 0: an LFM2 whose every layer attends (its config as such)."""
    from iekit.convert.gguf_to_iebin import build_config
    from iekit.formats.gguf_file import open_gguf

    f = rewrite_gguf(CONVERTED, tmp_path / "a.gguf", drop={"lfm2.attention.head_count_kv"},
                     kv={"lfm2.attention.head_count_kv": [2, 2, 2, 2]})
    with open_gguf(f) as g:
        cfg = build_config(g)
    assert cfg["layer_types"] == ["full_attention"] * 4 and cfg["num_key_value_heads"] == 2
