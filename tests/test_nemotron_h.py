"""Nemotron-H (NemotronHForCausalLM; llama.cpp's nemotron_h and nemotron_h_moe): blocks of one norm and one mixer
each, Mamba2 (its states replace a KV cache), attention without RoPE, a ReLU-squared MLP without a gate, or
experts (sigmoid scores plus a choice bias, ReLU-squared) beside a shared expert. The frozen transformers logits
and greedy ids are tests/test_decoder.py's, the converter's own files tests/test_llamacpp_converter.py's, the
round trips through GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's; here, what the blocks change
(no rewinding, a KV cache for the attention blocks alone), the Hub's spellings of the checkpoint and config, the
calibration tools on the new matrices, and what a config or file may not say."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, edited_artifact, gptq_q8_0,
                      imatrix_of, max_rel, reconfigure, reconfigured_logits, run_tool)
from gguf_build import rewrite_gguf

from iekit.formats.errors import IEError
from iekit.formats.iebin import load_model
from iekit.formats.model_spec import decoder_spec
from iekit.runtime.decoder import Decoder, cached_layers, kv_cache_bytes

DENSE = GOLDEN_IEBIN / "tiny-nemotron-h"
MOE = GOLDEN_IEBIN / "tiny-nemotron-h-moe"
IDS = json.loads((GOLDEN_IEBIN.parent / "ref" / "tiny-nemotron-h" / "ids.json").read_text())
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp"




def _logits(model, act: str = "f32") -> np.ndarray:
    return Decoder(model, act=act).logits(IDS)


@pytest.mark.parametrize("model", [DENSE, MOE])
def test_the_states_carry_from_step_to_step(model):
    """The scan's states and the convolution's last inputs (conftest.assert_states_carry); int8 activations as
    float ones, near enough."""
    assert_states_carry(model, IDS)
    assert max_rel(_logits(model, "int8"), _logits(model)) < 2e-2


def test_only_the_attention_block_has_a_kv_cache():
    """Of six blocks (M - * - M M) three run Mamba2 and two an MLP: the one attention block's K and V per position
    (2 KV heads of 16, f32) and a thread's score."""
    s = Decoder(DENSE).spec
    assert s.ssm == (True, False, False, False, True, True) and s.recurrent == s.ssm
    assert s.mlp_only == (False, True, False, True, False, False)
    assert s.mixer_only == (True, False, True, False, True, True) and s.attends == (False, False, True, False, False, False)
    assert (s.ssm_heads, s.ssm_head_dim, s.ssm_state, s.ssm_groups, s.ssm_conv) == (4, 16, 16, 2, 4)
    assert s.nope == (True,) * 6 and s.mlp_act == "relu2" and s.moe is None and cached_layers(s) == 1
    assert kv_cache_bytes(s, 100, 1, ("f32", "f32")) == 100 * (2 * 2 * 16 * 4 + 4)
    m = Decoder(MOE).spec.moe
    assert m.layers == (False, True, False, False, True) and m.glu == "relu2" and m.sigmoid and m.shared_inter == 48
    assert (m.n_experts, m.top_k, m.inter, m.routed_scale, m.norm_topk) == (4, 2, 32, 2.5, True)


@pytest.mark.parametrize("spelling", [{"hybrid_override_pattern": "M-*-MM", "layers_block_type": None},
                                      {"layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba", "mamba"]}])
def test_the_hubs_spellings_read_as_transformers_5s(tmp_path, spelling):
    """The Hub's configs say hybrid_override_pattern (M, *, -, E) and num_hidden_layers, transformers 5 writes
    layers_block_type (older ones "mamba" and "attention"): the same model."""
    d = edited_artifact(DENSE, tmp_path / "m", lambda m: reconfigure(m, **spelling))
    assert np.array_equal(_logits(d), _logits(DENSE))


@pytest.mark.parametrize("edit,key", [
    ({"layers_block_type": None, "hybrid_override_pattern": "M-*-M", "num_hidden_layers": 6},
     "config.hybrid_override_pattern"),
    ({"layers_block_type": None, "hybrid_override_pattern": "M-*-MX"}, "config.hybrid_override_pattern"),
    ({"layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp", "sliding_attention",
                            "linear_attention"]}, "config.layers_block_type"),
    ({"moe_latent_size": 32}, "config.moe_latent_size"),
    ({"use_bias": True}, "config.use_bias"),
    ({"use_conv_bias": False}, "config.use_conv_bias"),
    ({"mamba_hidden_act": "gelu"}, "config.mamba_hidden_act"),
    ({"num_nextn_predict_layers": 1}, "config.num_nextn_predict_layers"),
    ({"sliding_window": 8}, "config.sliding_window"),
    ({"time_step_limit": [0.0, 5.0]}, "config.time_step_limit"),
    ({"mamba_num_heads": 3}, "config.mamba_num_heads"),
    ({"mlp_hidden_act": "silu"}, "model.hidden_act"),  # (its MLP has no gate: relu2 only)
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    assert_one_line_error(reconfigured_logits(DENSE, tmp_path, **edit), key)


def _renamed_checkpoint(src, dst, rename) -> None:
    """``src`` copied to ``dst`` with its safetensors header's names through ``rename`` (name -> names), the
    tensors' bytes as they are."""
    shutil.copytree(src, dst)
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    body = json.dumps({new: v for k, v in header.items() for new in ([k] if k == "__metadata__" else rename(k))})
    body = body.encode() + b" " * (-len(body) % 8)
    (dst / "model.safetensors").write_bytes(len(body).to_bytes(8, "little") + body + raw[8 + n:])


def test_the_checkpoints_backbone_prefix_is_read_as_model(tmp_path):
    """The Hub's checkpoints name the model backbone.*, which transformers 5 loads as model.*: a checkpoint under
    either converts to the same model; one holding a tensor under both is refused in one line."""
    src = GOLDEN_HF / "tiny-nemotron-h"
    _renamed_checkpoint(src, tmp_path / "model", lambda k: [k.replace("backbone.", "model.", 1)])
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "model", "--out-dir", tmp_path / "a")
    assert res.returncode == 0, res.stderr
    assert np.array_equal(_logits(tmp_path / "a"), _logits(DENSE))
    _renamed_checkpoint(src, tmp_path / "both", lambda k: [k, "model.norm_f.weight"] if k == "backbone.norm_f.weight"
                        else [k])
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "both", "--out-dir", tmp_path / "b"),
                          "model.norm_f.weight")


@pytest.mark.parametrize("name,kv,key", [
    ("tiny-nemotron-h", {"nemotron_h.attention.head_count_kv": 2}, "nemotron_h.attention.head_count_kv"),
    ("tiny-nemotron-h", {"nemotron_h.feed_forward_length": [0, 128, 0, 128, 0]}, "nemotron_h.feed_forward_length"),
    ("tiny-nemotron-h", {"nemotron_h.feed_forward_length": [0, 128, 128, 128, 0, 0]},
     "nemotron_h.attention.head_count_kv"),
    ("tiny-nemotron-h", {"nemotron_h.feed_forward_length": [0, 128, 0, 96, 0, 0]}, "nemotron_h.feed_forward_length"),
    ("tiny-nemotron-h", {"nemotron_h.ssm.time_step_rank": 3}, "nemotron_h.ssm.inner_size"),
    ("tiny-nemotron-h-moe", {"nemotron_h_moe.expert_shared_feed_forward_length": 0},
     "nemotron_h_moe.expert_shared_feed_forward_length"),
    ("tiny-nemotron-h-moe", {"nemotron_h_moe.expert_gating_func": 1}, "nemotron_h_moe.expert_gating_func"),
])
def test_a_gguf_whose_blocks_do_not_add_up_is_one_line(tmp_path, name, kv, key):
    """The blocks by attention.head_count_kv and feed_forward_length (one per block), the Mamba2 dims by ssm.*, the
    shared expert by its width, the router by its gating: what does not describe a Nemotron-H is refused, and nothing
    is written."""
    bad = rewrite_gguf(CONVERTED / f"{name}.gguf", tmp_path / "bad.gguf", drop=set(kv), kv=kv)
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), key)
    assert not (tmp_path / "m").exists()


def test_the_export_refuses_mlp_blocks_beside_experts():
    """llama.cpp's nemotron_h_moe runs every block with a width as experts: an MLP block beside expert blocks has
    no place in it."""
    from iekit.convert import iebin_to_gguf
    from iekit.convert.gguf_names import arch_of

    m = load_model(MOE)
    s = decoder_spec(m.meta, m.meta_path)
    arch = arch_of(m.meta, m.meta_path)
    iebin_to_gguf._check_expressible(m, arch, s, m.meta["config"], False)
    mixed = dataclasses.replace(s, mlp_only=(False, True, True, False, True), mixer_only=(True, False, False, True,
                                                                                          False))
    with pytest.raises(IEError, match="layers_block_type: MLP blocks beside expert blocks"):
        iebin_to_gguf._check_expressible(m, arch, mixed, m.meta["config"], False)


@pytest.mark.parametrize("model", ["tiny-nemotron-h", "tiny-nemotron-h-moe"])
def test_the_imatrix_names_every_matrix_as_llamacpp_does(tmp_path, model):
    """An imatrix of a Nemotron-H has every quantizable matrix under the block's mixer. (Mamba2's in_proj reads the
    normed input, out_proj the gated scan, 64 wide; the MLP's up the normed input, its down the squared ReLU) and
    writes as llama.cpp's GGUF imatrix."""
    z = imatrix_of(GOLDEN_IEBIN / model, json.loads((GOLDEN_IEBIN.parent / "ref" / model / "ids.json").read_text()),
                   tmp_path)
    assert z["model.layers.0.mixer.in_proj.weight"].shape == (64,)
    assert z["model.layers.0.mixer.out_proj.weight"].shape == (64,)
    if model == "tiny-nemotron-h":
        assert z["model.layers.1.mixer.up_proj.weight"].shape == (64,)
        assert z["model.layers.1.mixer.down_proj.weight"].shape == (128,)
        assert z["model.layers.2.mixer.o_proj.weight"].shape == (64,)
        assert (z["model.layers.1.mixer.down_proj.weight"] >= 0).all()
    else:
        assert z["model.layers.1.mixer.experts.0.up_proj.weight"].shape == (64,)
        assert z["model.layers.1.mixer.experts.3.down_proj.weight"].shape == (32,)
        assert z["model.layers.4.mixer.shared_experts.down_proj.weight"].shape == (48,)
        assert z["model.layers.4.mixer.gate.weight"].shape == (64,)
    assert not any(".mlp." in k or "self_attn" in k or ".mamba." in k for k in z.files)


@pytest.mark.parametrize("sequential", [False, True])
def test_gptq_quantizes_every_block_and_the_export_takes_it(tmp_path, sequential):
    """gptq's covariances reach each block's matrices (Mamba2's, attention's, the MLP's, the experts' and the shared
    expert's), the quantized model stays near the float one, and it exports."""
    ids = json.loads((GOLDEN_IEBIN.parent / "ref" / "tiny-nemotron-h-moe" / "ids.json").read_text())
    g = gptq_q8_0("tiny-nemotron-h-moe", tmp_path, sequential)
    q = load_model(g).meta["tensors"]
    assert {t["dtype"] for t in q if t["name"].endswith(("in_proj.weight", "up_proj.weight", "o_proj.weight"))} == \
        {"q8_0"}
    ref = np.load(GOLDEN_IEBIN.parent / "ref" / "tiny-nemotron-h-moe" / "logits.npy").astype(np.float64)
    assert max_rel(Decoder(g, act="f32").logits(ids), ref) < 0.05
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", g, "--out", tmp_path / "g.gguf")
    assert res.returncode == 0, res.stderr
