"""Gemma 3 (Gemma3ForCausalLM, llama.cpp's gemma3): the config spellings
transformers reads as one model, what the decoder refuses rather than runs
as another, and the GGUF bridge's choices a toy from the golden generator
does not reach (the converter's own file is tests/test_llamacpp_converter.py;
the frozen transformers logits are tests/test_decoder.py's)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, reconfigure,
                      run_tool)

GEMMA = GOLDEN_IEBIN / "tiny-gemma3"
IDS = json.loads((GOLDEN_REF / "tiny-gemma3" / "ids.json").read_text())


def _logits(model, tmp_path, name="l.npy") -> np.ndarray:
    out = tmp_path / name
    res = run_tool("ierun", "logits", "--model-dir", model, "--ids", ",".join(map(str, IDS)), "--out", out,
                   "--act", "f32", "-ctk", "f32", "--cache-type-v", "f32")
    assert res.returncode == 0, res.stderr
    return np.load(out)


def _spec(model):
    from iekit.formats.iebin import load_model
    from iekit.formats.model_spec import decoder_spec

    m = load_model(model)
    return decoder_spec(m.meta, m.meta_path)


def test_the_hubs_config_spelling_is_the_same_model(tmp_path):
    """Gemma 3's configs on the Hub predate transformers 5's: no layer_types
    (sliding_window_pattern: every pattern-th layer global), and rope_theta,
    rope_local_base_freq, rope_scaling at the top. transformers reads both as
    one model, and so must the decoder: the golden logits, from the other
    spelling."""
    def hub(meta):
        cfg = meta["config"]
        rp = cfg.pop("rope_parameters")
        cfg.pop("layer_types")
        full = rp["full_attention"]
        cfg.update(sliding_window_pattern=2, rope_theta=full["rope_theta"],
                   rope_local_base_freq=rp["sliding_attention"]["rope_theta"],
                   rope_scaling={"rope_type": "linear", "factor": full["factor"]})
        reconfigure(meta)

    d = edited_artifact(GEMMA, tmp_path / "m", hub)
    ref = np.load(GOLDEN_REF / "tiny-gemma3" / "logits.npy")
    got = _logits(d, tmp_path)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    assert np.array_equal(got, _logits(GEMMA, tmp_path, "g.npy"))


@pytest.mark.parametrize("key,value,needle", [
    ("attn_logit_softcapping", 50.0, "soft-capping"),
    ("final_logit_softcapping", 30.0, "soft-capping"),
    ("use_bidirectional_attention", True, "bidirectional"),
    ("query_pre_attn_scalar", 0, "positive number"),
    ("hidden_activation", "gelu", "not supported"),
    ("sliding_window_pattern", 0, "positive integer"),
])
def test_what_the_decoder_does_not_run_is_refused(tmp_path, key, value, needle):
    def edit(meta):
        if key == "sliding_window_pattern":
            meta["config"].pop("layer_types")
        reconfigure(meta, **{key: value})

    d = edited_artifact(GEMMA, tmp_path / "m", edit)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), needle)


def test_a_sliding_layers_rope_type_other_than_default_is_refused(tmp_path):
    def edit(meta):
        meta["config"]["rope_parameters"]["sliding_attention"]["rope_type"] = "linear"
        reconfigure(meta)

    d = edited_artifact(GEMMA, tmp_path / "m", edit)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "rope_parameters.sliding_attention.rope_type", "not supported")


@pytest.mark.parametrize("types,local", [
    (["full_attention", "sliding_attention"], 5000.0),  # not llama.cpp's default pattern, nor its default base
    (["full_attention", "full_attention"], 10000.0),    # no sliding layer: no window written at all
])
def test_gguf_round_trip_keeps_layer_types_and_the_local_base(tmp_path, types, local):
    """Layer types llama.cpp's default (every 6th layer global) does not
    give are written as sliding_window_pattern, the sliding layers' base as
    rope.freq_base_swa; the import reads both back: the same decoder and
    bit-identical logits."""
    import gguf

    def edit(meta):
        meta["config"]["layer_types"] = types
        meta["config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = local
        reconfigure(meta)

    d = edited_artifact(GEMMA, tmp_path / "m", edit)
    out = tmp_path / "m.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", out)
    assert res.returncode == 0, res.stderr
    kv = {k: f.contents() for k, f in gguf.GGUFReader(str(out)).fields.items()}
    assert kv["gemma3.rope.freq_base_swa"] == local
    swa = [t == "sliding_attention" for t in types]
    assert kv.get("gemma3.attention.sliding_window_pattern") == (swa if any(swa) else None)
    assert kv.get("gemma3.attention.sliding_window") == (4 if any(swa) else None)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", tmp_path / "back")
    assert res.returncode == 0, res.stderr
    a, b = _spec(d), _spec(tmp_path / "back")
    assert a.windows == b.windows == tuple(4 if s else 0 for s in swa)
    assert np.array_equal(a.inv_freq_swa, b.inv_freq_swa) and np.array_equal(a.inv_freq, b.inv_freq)
    assert (a.attn_scale, a.embed_scale, a.norm_offset, a.mlp_act) == (b.attn_scale, b.embed_scale,
                                                                       b.norm_offset, b.mlp_act)
    assert np.array_equal(_logits(d, tmp_path), _logits(tmp_path / "back", tmp_path, "b.npy"))


def test_export_refuses_an_attention_scale_llamacpp_would_not_apply(tmp_path):
    """llama.cpp's gemma3 derives its attention scale from the shapes
    (1/sqrt(head_dim), but for the 62-layer 27B); a model with another
    query_pre_attn_scalar would run differently there."""
    d = edited_artifact(GEMMA, tmp_path / "m", lambda m: reconfigure(m, query_pre_attn_scalar=48))
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf"),
                          "query_pre_attn_scalar", "1/sqrt(32)")
    assert not (tmp_path / "m.gguf").exists()


def test_norms_cross_as_one_plus_w_exactly(tmp_path):
    """llama.cpp stores Gemma's norms as 1 + w (float32, from the bf16 w:
    exact); the import takes 1 back off, exactly for any stored value of at
    least 0.5 (Sterbenz): the import's norms are the checkpoint's bits."""
    from iekit.formats.casting import decode_f32
    from iekit.formats.iebin import load_model

    out = tmp_path / "m.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", GEMMA, "--out", out).returncode == 0
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", tmp_path / "b").returncode == 0
    src, back = load_model(GEMMA), load_model(tmp_path / "b")

    def values(m, name):
        t = next(t for t in m.tensors if t["name"] == name)
        with open(m.path_of(t), "rb") as f:
            f.seek(t["file_data_offset"])
            return decode_f32(f.read(t["nbytes"]), t["dtype"])

    norms = [t["name"] for t in src.tensors if t["name"].endswith("norm.weight")]
    assert len(norms) == 2 * 6 + 1
    for n in norms:
        assert np.array_equal(values(src, n), values(back, n)), n
