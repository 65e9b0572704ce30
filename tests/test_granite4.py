"""Granite 4 (GraniteMoeHybridForCausalLM; llama.cpp's granitehybrid): Mamba2
layers, whose states replace a KV cache, beside attention without RoPE,
Granite's multipliers, a shared MLP beside softmax-routed experts (or alone);
and Granite 3.x MoE (GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM;
llama.cpp's granitemoe), the same experts beside Granite's attention.
The frozen transformers logits and greedy ids are tests/test_decoder.py's,
the converter's own files tests/test_llamacpp_converter.py's, the round
trips through GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's;
here, what the states change (no rewinding), the Hub's spelling of the
config, what RoPE's switch does, the calibration tools on the new matrices,
and what a config or file may not say."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, edited_artifact, imatrix_of,
                      max_rel, reconfigure, reconfigured_logits, run_tool)
from gguf_build import rewrite_gguf

from iekit.formats.errors import IEError
from iekit.formats.iebin import load_model
from iekit.formats.model_spec import decoder_spec
from iekit.runtime.decoder import Decoder

GRANITE4 = GOLDEN_IEBIN / "tiny-granite4"
DENSE = GOLDEN_IEBIN / "tiny-granite4-dense"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-granite4"
IDS = json.loads((REF / "ids.json").read_text())
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp"




@pytest.mark.parametrize("model", [GRANITE4, DENSE])
def test_the_states_carry_from_step_to_step(model):
    """The scan's states and the convolution's last inputs (conftest.assert_states_carry); int8 activations as
    float ones, near enough."""
    assert_states_carry(model, IDS)
    assert max_rel(Decoder(model, act="int8").logits(IDS), Decoder(model, act="f32").logits(IDS)) < 2e-2


def test_only_the_attention_layer_has_a_kv_cache():
    """Three layers of four run Mamba2: the one attention layer's K and V per position (2 KV heads of 16, f32) and
    a thread's score."""
    from iekit.runtime.decoder import cached_layers, kv_cache_bytes

    s = Decoder(GRANITE4).spec
    assert s.ssm == (True, False, True, True) and s.recurrent == s.ssm and cached_layers(s) == 1
    assert (s.ssm_heads, s.ssm_head_dim, s.ssm_state, s.ssm_groups, s.ssm_conv) == (8, 16, 16, 2, 4)
    assert s.nope == (True,) * 4 and s.moe.glu == "halves" and s.moe.shared_inter == 48
    assert kv_cache_bytes(s, 100, 1, ("f32", "f32")) == 100 * (2 * 2 * 16 * 4 + 4)


@pytest.mark.parametrize("spelling", [["mamba", "attention", "mamba", "mamba"], None])
def test_the_hubs_spelling_reads_as_transformers_5s(tmp_path, spelling):
    """The Hub's configs say "mamba" and "attention", transformers 5 writes linear_attention and full_attention;
    without layer_types every layer is Mamba2 (GraniteMoeHybridConfig's default): another model."""
    d = edited_artifact(GRANITE4, tmp_path / "m", lambda m: reconfigure(m, layer_types=spelling))
    if spelling is None:
        res = run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "l.npy")
        assert_one_line_error(res, "model.layers.1.", "does not use it")  # (layer 1 holds attention's tensors)
        return
    assert np.array_equal(Decoder(d, act="f32").logits(IDS), Decoder(GRANITE4, act="f32").logits(IDS))


def test_rope_where_position_embedding_type_says_so(tmp_path):
    """position_embedding_type "rope" turns q and k in the attention layers (Granite 4.0 Micro's); "nope" and
    null do not: the same weights compute another model."""
    d = edited_artifact(GRANITE4, tmp_path / "m", lambda m: reconfigure(m, position_embedding_type="rope"))
    assert Decoder(d).spec.nope == ()
    assert max_rel(Decoder(d, act="f32").logits(IDS), Decoder(GRANITE4, act="f32").logits(IDS)) > 1e-3
    n = edited_artifact(GRANITE4, tmp_path / "n", lambda m: reconfigure(m, position_embedding_type=None))
    assert np.array_equal(Decoder(n, act="f32").logits(IDS), Decoder(GRANITE4, act="f32").logits(IDS))


@pytest.mark.parametrize("edit,key", [
    ({"mamba_conv_bias": False}, "config.mamba_conv_bias"),
    ({"mamba_proj_bias": True}, "config.mamba_proj_bias"),
    ({"time_step_limit": [0.0, 5.0]}, "config.time_step_limit"),
    ({"position_embedding_type": "alibi"}, "config.position_embedding_type"),
    ({"layer_types": ["mamba", "sliding_attention", "mamba", "mamba"]}, "config.layer_types"),
    ({"mamba_n_heads": 6}, "config.mamba_n_heads"),
    ({"mamba_n_groups": 3}, "config.mamba_n_heads"),
    ({"hidden_act": "gelu"}, "model.hidden_act"),  # (Mamba2's activation and the MLP's: SiLU only)
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    assert_one_line_error(reconfigured_logits(GRANITE4, tmp_path, **edit), key)


@pytest.mark.parametrize("name,kv,key", [
    ("tiny-granite4", {"granitehybrid.attention.head_count_kv": [0, 2, 0]}, "granitehybrid.attention.head_count_kv"),
    ("tiny-granite4", {"granitehybrid.expert_shared_feed_forward_length": 0},
     "granitehybrid.expert_shared_feed_forward_length"),
    ("tiny-granite4-dense", {"granitehybrid.ssm.inner_size": 100}, "granitehybrid.ssm.inner_size"),
    ("tiny-granite4-dense", {"granitehybrid.ssm.time_step_rank": 7}, "granitehybrid.ssm.inner_size"),
])
def test_a_gguf_whose_mamba_layers_do_not_add_up_is_one_line(tmp_path, name, kv, key):
    """The Mamba2 layers by attention.head_count_kv (one per block), their dims by ssm.*, the shared MLP beside the
    experts by its width: what does not describe a Granite 4 is refused, and nothing is written."""
    bad = rewrite_gguf(CONVERTED / f"{name}.gguf", tmp_path / "bad.gguf", drop=set(kv), kv=kv)
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), key)
    assert not (tmp_path / "m").exists()


def test_a_file_that_turns_rope_on_imports_with_it(tmp_path):
    """rope.scaling.finetuned is llama.cpp's granitehybrid's RoPE switch (true where absent): true reads as
    position_embedding_type "rope", which the decoder turns."""
    on = rewrite_gguf(CONVERTED / "tiny-granite4.gguf", tmp_path / "on.gguf",
                      drop={"granitehybrid.rope.scaling.finetuned"}, kv={"granitehybrid.rope.scaling.finetuned": True})
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", on, "--out-dir", tmp_path / "m").returncode == 0
    assert load_model(tmp_path / "m").meta["config"]["position_embedding_type"] == "rope"
    assert Decoder(tmp_path / "m").spec.nope == ()


def test_the_export_refuses_mamba2_llamacpp_cannot_load():
    """llama.cpp's granitehybrid asserts its Mamba2 layers are twice as wide as the model (mamba_expand 2)."""
    from iekit.convert import iebin_to_gguf
    from iekit.convert.gguf_names import arch_of

    m = load_model(GRANITE4)
    s = decoder_spec(m.meta, m.meta_path)
    iebin_to_gguf._check_expressible(m, arch_of(m.meta, m.meta_path), s, m.meta["config"], False)
    with pytest.raises(IEError, match="config.mamba_expand: 4"):
        iebin_to_gguf._check_expressible(m, arch_of(m.meta, m.meta_path), dataclasses.replace(s, ssm_heads=16),
                                         m.meta["config"], False)


@pytest.mark.parametrize("model", ["tiny-granite4", "tiny-granite4-dense"])
def test_the_imatrix_names_every_matrix_as_llamacpp_does(tmp_path, model):
    """An imatrix of a Granite 4 has every quantizable matrix (Mamba2's in_proj reads the normed input, out_proj the
    gated scan, inner wide; the shared MLP under its own names) and writes as llama.cpp's GGUF imatrix."""
    z = imatrix_of(GOLDEN_IEBIN / model, IDS, tmp_path)
    assert z["model.layers.0.mamba.in_proj.weight"].shape == (64,)
    assert z["model.layers.0.mamba.out_proj.weight"].shape == (128,)
    assert z["model.layers.2.shared_mlp.output_linear.weight"].shape == (48,)
    assert not any(".mlp." in k for k in z.files)


GRANITE_MOE = GOLDEN_IEBIN / "tiny-granite-moe"


def test_granite_moe_has_experts_in_every_layer(tmp_path):
    """Granite 3.x MoE (GraniteMoeForCausalLM) has no MLP but its experts: none is not a model it can be."""
    s = Decoder(GRANITE_MOE).spec
    assert s.moe.layers == (True, True) and s.moe.shared_inter == 0 and s.moe.glu == "halves" and not s.nope
    assert Decoder(GOLDEN_IEBIN / "tiny-granite-moe-shared").spec.moe.shared_inter == 48
    assert_one_line_error(reconfigured_logits(GRANITE_MOE, tmp_path, num_local_experts=0), "config.num_local_experts")


def test_a_granitemoe_file_with_shared_tensors_but_no_width_is_one_line(tmp_path):
    """llama.cpp's granitemoe runs a shared MLP where expert_shared_feed_forward_length is positive, which is how the
    import tells GraniteMoeShared from GraniteMoe: ffn_*_shexp tensors without it are refused, not dropped."""
    bad = rewrite_gguf(CONVERTED / "tiny-granite-moe-shared.gguf", tmp_path / "bad.gguf",
                       drop={"granitemoe.expert_shared_feed_forward_length"})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"),
                          "ffn_gate_shexp")
    assert not (tmp_path / "m").exists()
