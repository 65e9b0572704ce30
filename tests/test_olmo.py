"""OLMo 2 and OLMo 3 (Olmo2ForCausalLM, Olmo3ForCausalLM; both llama.cpp's
olmo2): no norm before the attention or the MLP, norms of their outputs,
q/k norms over the whole projections; OLMo 3's sliding layers with their
own unscaled RoPE beside YaRN on the full ones. OLMo 1 (OlmoForCausalLM;
llama.cpp's olmo): Llama's layer under LayerNorms without weights, q, k and
v clamped as projected (clip_qkv). The frozen transformers
logits are tests/test_decoder.py's, the converter's own files
tests/test_llamacpp_converter.py's; here, the config's other spelling and
what is refused rather than run as another model, in Python and in the
native decoder's own checks."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      reconfigure, reconfigured_logits, run_tool, st_write)
from gguf_build import rewrite_gguf

OLMO3 = GOLDEN_IEBIN / "tiny-olmo3"
OLMO1 = GOLDEN_IEBIN / "tiny-olmo"


def _with_tensors(tmp_path, extra=None, replace=None):
    """tiny-olmo2's checkpoint with tensors added or replaced (raw bytes)."""
    from iekit.formats.safetensors_reader import SafetensorsFile

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-olmo2", hf)
    with SafetensorsFile(hf / "model.safetensors") as f:
        tensors = {n: (t.dtype.name.upper(), list(t.shape), b"".join(f.iter_chunks(t))) for n, t in f.tensors.items()}
    tensors.update(extra or {})
    tensors.update(replace or {})
    (hf / "model.safetensors").unlink()
    st_write(hf / "model.safetensors", tensors, {"format": "pt"})
    return hf


def test_a_norm_before_a_block_is_not_carried_and_dropped(tmp_path):
    """OLMo 2 has no input_layernorm: a checkpoint holding one is not the
    model the decoder runs, and the conversion says so rather than drop it."""
    hf = _with_tensors(tmp_path, extra={"model.layers.0.input_layernorm.weight": ("BF16", [64], b"\x80\x3f" * 64)})
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    assert "input_layernorm" in res.stderr and "does not use it" in res.stderr
    refused = run_tool("ierun", "generate", "--model-dir", tmp_path / "o", "--ids", "1")
    assert_one_line_error(refused, "input_layernorm", "does not use it")


def test_a_per_head_q_norm_is_refused(tmp_path):
    """Qwen3's per-head q_norm [head_dim] in an OLMo 2 checkpoint: its
    q_norm is over the whole projection [heads x head_dim]."""
    hf = _with_tensors(tmp_path, replace={"model.layers.0.self_attn.q_norm.weight": ("BF16", [16], b"\x80\x3f" * 16)})
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "model.layers.0.self_attn.q_norm.weight", "[16]", "[64]")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model,flags,message", [
    ("tiny-olmo2", dict(pre_norms=True), "layer 0 input_layernorm"),
    ("tiny-olmo2", dict(qk_norm_full=False), "layer 0 q_norm"),
    ("tiny-llama", dict(pre_norms=False), "output norms alone"),
])
def test_the_native_decoder_checks_the_layer_it_is_given(model, flags, message):
    from iekit.runtime import native
    from iekit.formats.model_spec import decoder_spec
    from iekit.runtime import decoder_weights
    from iekit.runtime.decoder import native_config
    from iekit.runtime.tensor_source import TensorSource

    src = TensorSource(GOLDEN_IEBIN / model)
    s = decoder_spec(src.model.meta, src.model.meta_path)
    bound = decoder_weights.bind(src, s)
    native._native.Decoder(native_config(s, 16, ("f32", "f32")), bound.weights)  # as bound: accepted
    arch = dataclasses.replace(s.arch, **flags)
    with pytest.raises(ValueError, match=message):
        native._native.Decoder(native_config(dataclasses.replace(s, arch=arch), 16, ("f32", "f32")), bound.weights)


def _olmo3_hub(meta, **yarn):
    """tiny-olmo3's config as OLMo 3's on the Hub spell it: rope_theta and
    a YaRN rope_scaling at the top (transformers gives the sliding layers
    the default RoPE of the same base)."""
    cfg = meta["config"]
    rp = cfg.pop("rope_parameters")
    full = {k: v for k, v in rp["full_attention"].items() if k != "rope_theta"}
    cfg.update(rope_theta=rp["full_attention"]["rope_theta"], rope_scaling={**full, **yarn})
    reconfigure(meta)


def test_olmo3s_hub_spelling_is_the_same_model(tmp_path):
    ids = json.loads((GOLDEN_REF / "tiny-olmo3" / "ids.json").read_text())
    d = edited_artifact(OLMO3, tmp_path / "m", _olmo3_hub)
    got = exact_logits(d, ids, tmp_path / "a.npy")
    assert (got == exact_logits(OLMO3, ids, tmp_path / "b.npy")).all()


def test_an_attention_factor_stated_as_llamacpp_derives_it_exports(tmp_path):
    """OLMo 3's configs state YaRN's attention_factor, 0.1 ln(factor) + 1:
    llama.cpp derives the same, so the export goes through; another value
    has no llama.cpp key and is refused."""
    same = edited_artifact(OLMO3, tmp_path / "a", lambda m: _olmo3_hub(m, attention_factor=0.1 * math.log(4) + 1))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", same, "--out", tmp_path / "a.gguf")
    assert res.returncode == 0, res.stderr
    other = edited_artifact(OLMO3, tmp_path / "b", lambda m: _olmo3_hub(m, attention_factor=1.5))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", other, "--out", tmp_path / "b.gguf")
    assert_one_line_error(res, "rope_scaling", "attention factor of 1.5")
    assert not (tmp_path / "b.gguf").exists()


def test_an_olmo3_file_with_another_sliding_base_is_refused(tmp_path):
    """llama.cpp's olmo2 turns the sliding layers by rope.freq_base whatever
    rope.freq_base_swa says: a file where they differ is no model it runs as
    stated."""
    src = GOLDEN / "gguf" / "llamacpp" / "tiny-olmo3.gguf"
    bad = rewrite_gguf(src, tmp_path / "bad.gguf", drop={"olmo2.rope.freq_base_swa"},
                       kv={"olmo2.rope.freq_base_swa": 5000.0})
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", "olmo2.rope.freq_base_swa", "rope.freq_base")


def test_olmo1s_clamp_is_applied(tmp_path):
    """tiny-olmo clamps about a fifth of its q, k and v values (clip_qkv 1.6): with the clamp the decoder gives
    transformers' logits, without it (the same weights, clip_qkv null) another model."""
    from iekit.runtime.decoder import Decoder

    ids = json.loads((GOLDEN_REF / "tiny-olmo" / "ids.json").read_text())
    ref = np.load(GOLDEN_REF / "tiny-olmo" / "logits.npy").astype(np.float64)
    d = Decoder(OLMO1)
    assert d.spec.clip_qkv == pytest.approx(1.6) and d.spec.eps == 1e-5
    assert np.abs(d.logits(ids) - ref).max() / np.abs(ref).max() < 1e-5
    off = edited_artifact(OLMO1, tmp_path / "m", lambda m: reconfigure(m, clip_qkv=None))
    assert np.abs(Decoder(off).logits(ids) - ref).max() / np.abs(ref).max() > 1e-2


@pytest.mark.parametrize("clip,key", [(0, "config.clip_qkv"), (-1.0, "config.clip_qkv"), ("8", "config.clip_qkv")])
def test_an_olmo1_clamp_that_is_no_bound_is_one_line(tmp_path, clip, key):
    assert_one_line_error(reconfigured_logits(OLMO1, tmp_path, clip_qkv=clip), key)


def test_a_clamp_on_another_architecture_is_still_refused(tmp_path):
    """clip_qkv is OLMo's: a Llama config stating it is not run without it."""
    assert_one_line_error(reconfigured_logits(GOLDEN_IEBIN / "tiny-llama", tmp_path, clip_qkv=8.0), "config.clip_qkv",
                          "not supported")


def test_a_norm_weight_in_an_olmo1_checkpoint_is_not_carried_and_dropped(tmp_path):
    """OLMo 1's LayerNorms have no weights: a checkpoint holding one is another model, and the decoder refuses it
    rather than run without it."""
    from iekit.formats.safetensors_reader import SafetensorsFile

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-olmo", hf)
    with SafetensorsFile(hf / "model.safetensors") as f:
        tensors = {n: (t.dtype.name.upper(), list(t.shape), b"".join(f.iter_chunks(t))) for n, t in f.tensors.items()}
    tensors["model.layers.1.post_attention_layernorm.weight"] = ("BF16", [64], b"\x80\x3f" * 64)
    (hf / "model.safetensors").unlink()
    st_write(hf / "model.safetensors", tensors, {"format": "pt"})
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    assert "post_attention_layernorm" in res.stderr and "does not use it" in res.stderr
    refused = run_tool("ierun", "generate", "--model-dir", tmp_path / "o", "--ids", "1")
    assert_one_line_error(refused, "post_attention_layernorm", "does not use it")


@pytest.mark.parametrize("kv,key", [
    ({"olmo.attention.layer_norm_epsilon": 1e-6}, "olmo.attention.layer_norm_epsilon"),
    ({"olmo.attention.clamp_kqv": 0.0}, "olmo.attention.clamp_kqv"),
    ({"olmo.attention.clamp_kqv": float("nan")}, "olmo.attention.clamp_kqv"),
])
def test_an_olmo_file_that_is_no_olmo1_is_one_line(tmp_path, kv, key):
    """llama.cpp's olmo norms with the file's eps, where OLMo 1's LayerNorm has 1e-5 and no other, and clamps by
    attention.clamp_kqv: a file stating another eps, or a clamp that bounds nothing, is refused, nothing written."""
    src = GOLDEN / "gguf" / "llamacpp" / "tiny-olmo.gguf"
    bad = rewrite_gguf(src, tmp_path / "bad.gguf", drop=set(kv), kv=kv)
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o"), key)
    assert not (tmp_path / "o").exists()


def test_an_olmo_file_without_a_clamp_imports_unclamped(tmp_path):
    """OLMo-1B's and OLMo-7B's files have no attention.clamp_kqv (their clip_qkv is null): imported without one,
    and exported again without one."""
    src = GOLDEN / "gguf" / "llamacpp" / "tiny-olmo.gguf"
    plain = rewrite_gguf(src, tmp_path / "plain.gguf", drop={"olmo.attention.clamp_kqv"}, kv={})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", plain, "--out-dir", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    assert "clip_qkv" not in json.loads((tmp_path / "o" / "config.json").read_text())
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "o", "--out", tmp_path / "again.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    assert "olmo.attention.clamp_kqv" not in gguf.GGUFReader(str(tmp_path / "again.gguf")).fields
