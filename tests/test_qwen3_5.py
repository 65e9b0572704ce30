"""Qwen3.5 (Qwen3_5ForCausalLM; llama.cpp's qwen35): gated DeltaNet layers,
whose recurrent states replace a KV cache, beside gated full attention. The
frozen transformers logits and greedy ids are tests/test_decoder.py's, the
converter's own file tests/test_llamacpp_converter.py's, the round trips
through GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's;
here, what the states change (no rewinding), both value-head orders, the
multimodal checkpoint's text model, and what the config may not say."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, edited_artifact, max_rel,
                      reconfigure, reconfigured_logits, run_tool)
from iekit.formats import delta_net
from iekit.runtime.decoder import Decoder

Q35 = GOLDEN_IEBIN / "tiny-qwen3-5"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-qwen3-5"
IDS = json.loads((REF / "ids.json").read_text())




def test_the_states_carry_from_step_to_step():
    """The convolution and the DeltaNet states (conftest.assert_states_carry); a model without them rewinds."""
    assert_states_carry(Q35, IDS)
    assert Decoder(GOLDEN_IEBIN / "tiny-qwen3", act="f32")._dec.rewinds


def test_huggingfaces_value_head_order_runs_as_llamacpps(tmp_path):
    """An artifact whose value heads are in Hugging Face's grouped order
    (config.linear_value_head_order "grouped") computes the model the tiled
    one does: the decoder pairs each value head with its key head either way."""
    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-qwen3-5", hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, delta_net.ORDER_KEY: "tiled"}))  # (so nothing is reordered)
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "as-is").returncode == 0
    grouped = edited_artifact(tmp_path / "as-is", tmp_path / "g",
                              lambda m: reconfigure(m, **{delta_net.ORDER_KEY: "grouped"}))
    got, tiled = Decoder(grouped, act="f32").logits(IDS), Decoder(Q35, act="f32").logits(IDS)
    assert max_rel(got, tiled) < 1e-5 and max_rel(got, np.load(REF / "logits.npy")) < 1e-4  # (out_proj sums reordered)
    wrong = Decoder(tmp_path / "as-is", act="f32").logits(IDS)  # the same bytes read as tiled: another model
    assert max_rel(wrong, tiled) > 1e-2
    # llama.cpp reads the tiled order alone: an artifact in the other is refused, not exported reordered wrong
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", grouped, "--out", tmp_path / "g.gguf"),
                          "config.linear_value_head_order")


@pytest.mark.parametrize("name,cls,defaults", [("qwen3-5", "Qwen3_5ForCausalLM", "QWEN3_5_TEXT_DEFAULTS"),
                                               ("qwen3-5-moe", "Qwen3_5MoeForCausalLM", "QWEN3_5_MOE_TEXT_DEFAULTS")])
def test_the_text_model_of_a_multimodal_qwen3_5_is_its_text_model(tmp_path, name, cls, defaults):
    """golden/hf/tiny-NAME-vl is tiny-NAME's language model (and MTP block)
    beside a vision model, as Qwen3.5 is published: its text model converts
    to tiny-NAME's artifact, byte for byte; the defaults its text_config
    leaves out are transformers' (frozen by the generator)."""
    from iekit.convert import text_model

    theirs = json.loads((REF.parent / f"{name}-text-defaults.json").read_text())
    table = getattr(text_model, defaults)
    assert {k: theirs[k] for k in table} == table
    assert text_model.QWEN3_5_ROPE_DEFAULTS == {"rope_parameters": theirs["rope_parameters"]}
    res = run_tool("ieconv", "text-model", "-q", "--hf-dir", GOLDEN_HF / f"tiny-{name}-vl", "--out-dir", tmp_path / "t")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "t/config.json").read_text())
    assert cfg["architectures"] == [cls] and cfg["model_type"] == theirs["model_type"]
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ie/model.ie.bin").read_bytes() == (GOLDEN_IEBIN / f"tiny-{name}" / "model.ie.bin").read_bytes()


@pytest.mark.parametrize("edit,key", [
    ({"linear_num_value_heads": 3}, "config.linear_num_value_heads"),
    ({"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]}, "config.layer_types"),
    ({delta_net.ORDER_KEY: "interleaved"}, "config.linear_value_head_order"),
    ({"linear_conv_kernel_dim": 0}, "config.linear_conv_kernel_dim"),
    ({"attention_bias": True}, "config.attention_bias"),
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    assert_one_line_error(reconfigured_logits(Q35, tmp_path, **edit), key)


def test_a_gguf_decay_that_is_not_negative_is_refused(tmp_path):
    """llama.cpp stores -exp(A_log): a rate of 0 or above has no A_log (one line naming the tensor)."""
    from gguf import GGUFReader

    src = GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-qwen3-5.gguf"
    bad = tmp_path / "bad.gguf"
    shutil.copy(src, bad)
    t = next(t for t in GGUFReader(src).tensors if t.name == "blk.1.ssm_a")
    with open(bad, "r+b") as f:
        f.seek(int(t.data_offset))
        f.write(np.float32(0.5).tobytes())
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"),
                          "blk.1.ssm_a")
    assert not (tmp_path / "m").exists()


def test_a_rate_comes_back_exactly():
    """a_log_of inverts decay_rate: every float32 rate made from a float32 A_log gives back an A_log of that rate."""
    a_log = np.random.default_rng(3).uniform(-8, 4, 100_000).astype(np.float32)
    rate = delta_net.decay_rate(a_log)
    assert np.array_equal(delta_net.decay_rate(delta_net.a_log_of(rate)), rate)


@pytest.mark.parametrize("key,value,named", [
    ("qwen35.nextn_predict_layers", 9, "qwen35.nextn_predict_layers"),
    ("qwen35.ssm.group_count", 3, "qwen35.ssm.inner_size"),
    ("qwen35.ssm.conv_kernel", 0, "config.linear_conv_kernel_dim"),
    ("qwen35.ssm.state_size", 17, "in_proj_qkv"),
])
def test_a_gguf_whose_deltanet_keys_disagree_is_one_line(tmp_path, key, value, named):
    from gguf_build import rewrite_gguf

    bad = rewrite_gguf(GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-qwen3-5.gguf", tmp_path / "bad.gguf",
                       drop={key}, kv={key: value})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), named)
    assert not (tmp_path / "m").exists()


def test_only_the_attention_layers_have_a_kv_cache():
    """Three layers in four keep states, not a cache: the one attention layer's K and V per position (2 KV heads
    of 32, f32) and a thread's score, as the native decoder allocates them (KvCache::slot)."""
    from iekit.runtime.decoder import cached_layers, kv_cache_bytes

    s = Decoder(Q35).spec
    assert cached_layers(s) == 1 and sum(s.linear) == 3
    assert kv_cache_bytes(s, 100, 1, ("f32", "f32")) == 100 * (2 * 2 * 32 * 4 + 4)
