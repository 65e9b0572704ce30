"""Mamba 1 (MambaForCausalLM, FalconMambaForCausalLM; llama.cpp's mamba): its selective scan alone in every layer, no
attention, no MLP; Falcon Mamba with dt's low rank, B and C RMS-normed. The frozen transformers logits and greedy ids
are tests/test_decoder.py's, the converter's own files tests/test_llamacpp_converter.py's, the round trips through
GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's, llama.cpp running the exports
tests/test_llamacpp_runs.py's; here, what a model without attention changes, the calibration tools on its five
matrices, and what a config or file may not say."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, edited_artifact, gptq_q8_0,
                      imatrix_of, max_rel, reconfigure, reconfigured_logits, run_tool)
from gguf_build import rewrite_gguf

from iekit.formats.errors import IEError
from iekit.formats.iebin import load_model
from iekit.formats.model_spec import decoder_spec
from iekit.runtime.decoder import Decoder, cached_layers

MODELS = ("tiny-mamba", "tiny-falcon-mamba")
IDS = json.loads((GOLDEN_IEBIN.parent / "ref" / "tiny-mamba" / "ids.json").read_text())


@pytest.mark.parametrize("name", MODELS)
def test_the_states_carry_and_nothing_is_cached(name):
    """Three layers of the scan: its states and the convolution's last inputs carry from step to step
    (conftest.assert_states_carry); no layer keeps a KV cache; int8 activations as float ones, near enough."""
    model = GOLDEN_IEBIN / name
    assert_states_carry(model, IDS)
    s = Decoder(model).spec
    assert s.ssm1 == (True,) * 3 and s.ssm == () and s.mixer_only == (True,) * 3
    assert (s.ssm1_inner, s.ssm1_rank, s.ssm_state, s.ssm_conv) == (128, 8, 16, 4)
    assert s.ssm1_norms == (name == "tiny-falcon-mamba") and s.tied == (name == "tiny-mamba")
    assert s.attends == (False,) * 3 and cached_layers(s) == 0 and s.moe is None
    assert max_rel(Decoder(model, act="int8").logits(IDS), Decoder(model).logits(IDS)) < 2e-2


def test_falcon_mambas_norms_are_run(tmp_path):
    """Falcon Mamba's norms of dt, B and C, by mixer_rms_eps, move the logits: the same weights read as Mamba 1's
    (no norms) are far from transformers' Falcon Mamba, which the artifact matches."""
    model = GOLDEN_IEBIN / "tiny-falcon-mamba"
    ref = np.load(GOLDEN_IEBIN.parent / "ref" / "tiny-falcon-mamba" / "logits.npy")
    assert Decoder(model).spec.ssm1_eps == 1e-5
    assert max_rel(Decoder(model, act="f32").logits(IDS), ref) < 1e-4
    plain = edited_artifact(model, tmp_path / "plain", lambda m: reconfigure(m, architecture="MambaForCausalLM"))
    assert max_rel(Decoder(plain, act="f32").logits(IDS), ref) > 1e-2


@pytest.mark.parametrize("edit,key", [
    ({"use_bias": True}, "config.use_bias"),
    ({"use_conv_bias": False}, "config.use_conv_bias"),
    ({"hidden_act": "gelu"}, "model.hidden_act"),
    ({"state_size": 0}, "config.state_size"),
    ({"time_step_rank": 0}, "config.time_step_rank"),
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    """What MambaForCausalLM's config may say that the decoder does not run: one line naming the key."""
    assert_one_line_error(reconfigured_logits(GOLDEN_IEBIN / "tiny-mamba", tmp_path, **edit), key)


def test_falcon_mambas_eps_must_be_positive(tmp_path):
    assert_one_line_error(reconfigured_logits(GOLDEN_IEBIN / "tiny-falcon-mamba", tmp_path, mixer_rms_eps=0.0),
                          "config.mixer_rms_eps")


@pytest.mark.parametrize("kv,key", [
    ({"mamba.attention.head_count": 4}, "mamba.attention.head_count"),
    ({"mamba.feed_forward_length": 128}, "mamba.feed_forward_length"),
    ({"mamba.ssm.inner_size": 96}, "mamba.ssm.inner_size"),
    ({"mamba.ssm.state_size": None}, "mamba.ssm.state_size"),
    ({"mamba.ssm.time_step_rank": None}, "mamba.ssm.time_step_rank"),
])
def test_a_gguf_that_is_no_mamba_is_one_line(tmp_path, kv, key):
    """llama.cpp's mamba has no attention and no MLP, and its dims come from ssm.*: a file that states heads or a
    width, whose inner width is no whole multiple of the model's, or that lacks a dimension, is refused in one line,
    and nothing is written."""
    bad = rewrite_gguf(GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-mamba.gguf", tmp_path / "bad.gguf",
                       drop=set(kv), kv={k: v for k, v in kv.items() if v is not None})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), key)
    assert not (tmp_path / "m").exists()


def test_the_export_refuses_what_llamacpp_cannot_load_and_warns_of_another_eps():
    """llama.cpp's mamba asserts its layers are twice as wide as the model; it norms Falcon Mamba's dt, B and C by
    the model's eps, which the export says where mixer_rms_eps differs."""
    from iekit.convert import iebin_to_gguf
    from iekit.convert.gguf_names import arch_of

    m = load_model(GOLDEN_IEBIN / "tiny-falcon-mamba")
    s, arch = decoder_spec(m.meta, m.meta_path), arch_of(m.meta, m.meta_path)
    assert iebin_to_gguf._check_expressible(m, arch, s, m.meta["config"], False) == []
    with pytest.raises(IEError, match="config.intermediate_size: 192"):
        iebin_to_gguf._check_expressible(m, arch, dataclasses.replace(s, ssm1_inner=192), m.meta["config"], False)
    warned = iebin_to_gguf._check_expressible(m, arch, dataclasses.replace(s, ssm1_eps=1e-6), m.meta["config"], False)
    assert len(warned) == 1 and "mixer_rms_eps 1e-06" in warned[0]


@pytest.mark.parametrize("name", MODELS)
def test_the_imatrix_names_every_matrix_as_llamacpp_does(tmp_path, name):
    """An imatrix of a Mamba has each layer's four matrices under mixer. (in_proj reads the normed input, 64 wide;
    x_proj the convolved x and out_proj the gated scan, 128; dt_proj dt's low rank, 8) beside the head's, and no
    other."""
    z = imatrix_of(GOLDEN_IEBIN / name, IDS, tmp_path)
    head = "lm_head.weight" if name == "tiny-falcon-mamba" else "model.embeddings.weight"  # (tiny-mamba's: tied)
    assert sorted(k for k in z.files if k != "__meta__.json") == sorted(
        [head, *(f"model.layers.{i}.mixer.{p}_proj.weight" for i in range(3) for p in ("in", "x", "dt", "out"))])
    widths = {"in": 64, "x": 128, "dt": 8, "out": 128}
    for p, w in widths.items():
        assert z[f"model.layers.1.mixer.{p}_proj.weight"].shape == (w,), p
        assert (z[f"model.layers.1.mixer.{p}_proj.weight"] > 0).all(), p


@pytest.mark.parametrize("name", MODELS)
def test_gptq_quantizes_every_layer_and_the_export_takes_it(tmp_path, name):
    """gptq's covariances reach every layer's four matrices (x_proj's and dt_proj's inputs in their own slots), each
    in turn after the ones before it are quantized; the quantized model stays near the float one, and it exports."""
    g = gptq_q8_0(name, tmp_path, True)
    q = load_model(g).meta["tensors"]
    assert {t["dtype"] for t in q if t["name"].endswith(("in_proj.weight", "x_proj.weight", "out_proj.weight"))} == \
        {"q8_0"}
    ref = np.load(GOLDEN_IEBIN.parent / "ref" / name / "logits.npy").astype(np.float64)
    # (tiny-falcon-mamba's norms of 8- and 16-wide dt, B and C magnify any error: q8_0 by nearest rounding is 0.12
    # from its logits, tiny-mamba's 0.012)
    assert max_rel(Decoder(g, act="f32").logits(IDS), ref) < (0.2 if name == "tiny-falcon-mamba" else 0.05)
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", g, "--out", tmp_path / "g.gguf")
    assert res.returncode == 0, res.stderr
