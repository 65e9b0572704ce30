"""Llama 4 (Llama4ForCausalLM; llama.cpp's llama4): chunked attention on the
layers RoPE turns, q and k divided by their RMS after it, a temperature on
the others' queries, experts fed their sigmoid weight beside a shared one.
The frozen transformers logits are tests/test_decoder.py's (and the chunks
across decode spans), the converter's own file
tests/test_llamacpp_converter.py's; here, what the export refuses (what llama.cpp's graph fixes whatever a
file says), and what the config may not say."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN_IEBIN, assert_one_line_error, edited_artifact, max_rel, reconfigure, reconfigured_logits,
                      run_tool)
from iekit.runtime.decoder import Decoder

L4 = GOLDEN_IEBIN / "tiny-llama4"
FIXED = {"attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1}  # llama.cpp's llama4 constants




def test_the_chunks_matter_past_the_toys_reach(tmp_path):
    """Over 700 positions, chunks of 300 (tests/test_decoder.py holds them to
    the one-pass prefill across decode spans) against one chunk for all."""
    ids = [int(i) for i in np.random.default_rng(11).integers(0, 320, 700)]
    logits = []
    for chunk in (300, 800):
        d = edited_artifact(L4, tmp_path / f"c{chunk}", lambda m: reconfigure(m, max_position_embeddings=800,
                                                                             attention_chunk_size=chunk))
        logits.append(Decoder(d, threads=2, act="f32").logits(ids)[600:])
    assert max_rel(logits[0], logits[1]) > 1e-2


@pytest.mark.parametrize("edit,key", [
    ({}, "config.attention_chunk_size"),  # the golden toy's chunks of 4
    ({**FIXED, "floor_scale": 4}, "config.attn_scale"),
    ({**FIXED, "attn_temperature_tuning": False}, "config.attn_scale"),
    ({**FIXED, "use_qk_norm": False}, "config.use_qk_norm"),
    ({**FIXED, "no_rope_layers": [1, 1, 0, 1], "layer_types": ["chunked_attention", "chunked_attention",
                                                               "full_attention", "chunked_attention"]},
     "config.no_rope_layers"),
])
def test_export_refuses_what_llamacpp_fixes(tmp_path, edit, key):
    """llama.cpp's llama4 graph attends in chunks of 8192 on every layer it
    turns, turns all but every 4th, applies the temperature 0.1 per step of
    8192 positions to those, norms q and k unless the model has 128
    experts, and has experts at every interleave_moe_layer_step-th layer,
    whatever the file says: a model that differs is refused, naming the key."""
    d = edited_artifact(L4, tmp_path / "m", lambda m: reconfigure(m, **edit))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, key)
    assert not (tmp_path / "m.gguf").exists()


def test_experts_off_llamacpps_period_are_refused():
    """Experts at layers 1 and 2: no interleave_moe_layer_step says that."""
    import dataclasses

    from iekit.convert.iebin_to_gguf import _check_llama4
    from iekit.formats.errors import IEError
    from iekit.formats.iebin import load_model
    from iekit.formats.model_spec import decoder_spec

    m = load_model(L4)
    s = decoder_spec(m.meta, m.meta_path)
    s = dataclasses.replace(s, chunks=(8192, 8192, 8192, 0), attn_temp_scale=0.1, attn_temp_floor=8192)
    _check_llama4("config", s)
    with pytest.raises(IEError, match=r"config\.moe_layers: experts at layers \[1, 2\]"):
        _check_llama4("config", dataclasses.replace(s, moe=dataclasses.replace(s.moe, layers=(False, True, True, False))))


def test_the_export_llamacpp_runs_imports_as_itself(tmp_path):
    """With llama.cpp's constants the export imports to the same model (its
    RoPE's step, Scout's equal llama3 factors, read back from rope_freqs)."""
    d = edited_artifact(L4, tmp_path / "m", lambda m: reconfigure(m, **FIXED))
    g = tmp_path / "m.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", g).returncode == 0
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "back")
    assert res.returncode == 0, res.stderr
    ids = json.loads((L4.parent.parent / "ref" / "tiny-llama4" / "ids.json").read_text())
    assert np.array_equal(Decoder(tmp_path / "back", act="f32").logits(ids), Decoder(d, act="f32").logits(ids))
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (cfg["moe_layers"], cfg["no_rope_layers"], cfg["use_qk_norm"]) == ([1, 3], [1, 1, 1, 0], True)


@pytest.mark.parametrize("edit,key", [
    ({"layer_types": ["sliding_attention"] * 4}, "config.layer_types"),
    ({"moe_layers": [1, 9]}, "config.moe_layers"),
    ({"attention_chunk_size": 0}, "config.attention_chunk_size"),
    ({"use_qk_norm": "yes"}, "config.use_qk_norm"),
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    assert_one_line_error(reconfigured_logits(L4, tmp_path, **edit), key)


VL = GOLDEN_IEBIN.parent / "hf" / "tiny-llama4-vl"


def test_the_text_model_of_a_multimodal_llama4_is_tiny_llama4(tmp_path):
    """golden/hf/tiny-llama4-vl is tiny-llama4's language model beside a
    vision model, as Scout and Maverick are published (transformers gives
    the same text logits; the generator checks): its text model converts to
    tiny-llama4's artifact, byte for byte, expert stacks transposed alike."""
    res = run_tool("ieconv", "text-model", "-q", "--hf-dir", VL, "--out-dir", tmp_path / "t")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "t/config.json").read_text())
    assert cfg["architectures"] == ["Llama4ForCausalLM"] and cfg["model_type"] == "llama4_text"
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ie/model.ie.bin").read_bytes() == (L4 / "model.ie.bin").read_bytes()


def test_a_text_config_of_differences_takes_transformers_defaults(tmp_path):
    """The Hub's text_config holds what differs from Llama4TextConfig's
    defaults: left out, they are filled in (the table held to transformers'
    own defaults, frozen by the generator), and the model is the same."""
    import shutil

    from iekit.convert.text_model import LLAMA4_ROPE_DEFAULTS, LLAMA4_TEXT_DEFAULTS

    theirs = json.loads((GOLDEN_IEBIN.parent / "ref" / "llama4-text-defaults.json").read_text())
    assert {k: theirs[k] for k in LLAMA4_TEXT_DEFAULTS} == LLAMA4_TEXT_DEFAULTS
    assert LLAMA4_ROPE_DEFAULTS == {"rope_theta": theirs["rope_parameters"]["rope_theta"]}
    src = tmp_path / "hub"
    shutil.copytree(VL, src)
    cfg = json.loads((src / "config.json").read_text())
    text = cfg["text_config"]
    for k in ("no_rope_layers", "moe_layers", "layer_types"):  # derived from the counts, as transformers derives them
        text.pop(k)
    text["attn_scale"] = LLAMA4_TEXT_DEFAULTS["attn_scale"]  # (then a default: left out)
    for k in [k for k, v in text.items() if LLAMA4_TEXT_DEFAULTS.get(k, object()) == v]:
        del text[k]
    assert "attn_scale" not in text and "use_qk_norm" not in text
    (src / "config.json").write_text(json.dumps(cfg))
    assert run_tool("ieconv", "text-model", "-q", "--hf-dir", src, "--out-dir", tmp_path / "t").returncode == 0
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie").returncode == 0
    want = edited_artifact(L4, tmp_path / "w", lambda m: reconfigure(m, attn_scale=0.1))
    ids = json.loads((GOLDEN_IEBIN.parent / "ref" / "tiny-llama4" / "ids.json").read_text())
    assert np.array_equal(Decoder(tmp_path / "ie", act="f32").logits(ids), Decoder(want, act="f32").logits(ids))
