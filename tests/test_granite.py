"""Granite 3 (GraniteForCausalLM; llama.cpp's granite): Llama's layer with
four multipliers; Granite SWA (GraniteSWAForCausalLM; llama.cpp's
granite_swa): the same with a learned sink per head, sliding layers and a
RoPE base per layer. The frozen transformers logits are
tests/test_decoder.py's, the converter's own files
tests/test_llamacpp_converter.py's; here, what a granite file without its
optional keys means, Granite SWA's bases, and what is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, exact_logits, max_rel, reconfigure,
                      reconfigured_logits, run_tool)
from gguf_build import rewrite_gguf

GRANITE = GOLDEN_IEBIN / "tiny-granite"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-granite.gguf"
SWA = GOLDEN_IEBIN / "tiny-granite-swa"
SWA_REF = GOLDEN / "ref" / "tiny-granite-swa"
SWA_CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-granite-swa.gguf"


def _import(src, out):
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "config.json").read_text())


def test_a_file_without_the_optional_keys_takes_llamacpps_defaults(tmp_path):
    """llama.cpp reads no embedding or residual multiplier and scores by
    1/sqrt(head_dim) where the keys are absent (transformers' GraniteConfig
    would take 1 for the attention's): the import records llama.cpp's."""
    bare = rewrite_gguf(CONVERTED, tmp_path / "bare.gguf",
                        drop={"granite.embedding_scale", "granite.attention.scale", "granite.residual_scale"})
    cfg = _import(bare, tmp_path / "b")
    assert (cfg["embedding_multiplier"], cfg["residual_multiplier"]) == (1.0, 1.0)
    assert cfg["attention_multiplier"] == pytest.approx(1 / math.sqrt(16), rel=1e-12)
    full = _import(CONVERTED, tmp_path / "f")
    assert (full["embedding_multiplier"], full["attention_multiplier"], full["residual_multiplier"],
            full["logits_scaling"]) == (12.0, 0.0625, 0.22, 4.0)


@pytest.mark.parametrize("change,needle", [
    (dict(drop={"granite.logit_scale"}), "granite.logit_scale"),
    (dict(kv={"granite.rope.scaling.finetuned": False}), "rotates no layer"),
])
def test_hostile_granite_files_are_refused(tmp_path, change, needle):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", **change)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", needle)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key", ["embedding_multiplier", "attention_multiplier", "residual_multiplier",
                                 "logits_scaling"])
def test_a_multiplier_that_is_no_positive_number_is_refused(tmp_path, key):
    d = edited_artifact(GRANITE, tmp_path / "m", lambda meta: reconfigure(meta, **{key: 0}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), f"config.{key}",
                          "positive number")


def test_logits_scaling_divides_every_logit(tmp_path):
    """Logits divided by logits_scaling as transformers divides them:
    doubling it halves every logit. (The other three multipliers each move
    the golden logits by > 1%, and those are transformers' within 2e-7:
    tests/test_decoder.py.)"""
    out = {}
    for tag, scale in (("a", 4.0), ("b", 8.0)):
        d = edited_artifact(GRANITE, tmp_path / tag, lambda meta, s=scale: reconfigure(meta, logits_scaling=s))
        out[tag] = exact_logits(d, [1, 5, 9, 200], tmp_path / f"{tag}.npy").astype(np.float64)
    np.testing.assert_allclose(out["b"] * 2, out["a"], rtol=1e-6, atol=1e-6 * np.abs(out["a"]).max())


def test_granite_swas_sliding_layers_turn_by_their_own_base(tmp_path):
    """layer_rope_theta gives tiny-granite-swa's sliding layers a base of 10 beside the full layer's 10000 (layer 2
    still without RoPE): the decoder gives transformers' logits of that config (frozen as two_bases.npy), and the
    export refuses it in one line, as llama.cpp's granite_swa turns every layer by one base."""
    ids = json.loads((SWA_REF / "ids.json").read_text())
    d = edited_artifact(SWA, tmp_path / "m", lambda m: reconfigure(m, layer_rope_theta=[10000.0, 10.0, 0.0, 10.0]))
    two = np.load(SWA_REF / "two_bases.npy").astype(np.float64)
    assert max_rel(exact_logits(d, ids, tmp_path / "a.npy"), two) < 1e-5
    assert max_rel(exact_logits(SWA, ids, tmp_path / "b.npy"), two) > 1e-2
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "layer_rope_theta", "own RoPE base 10", "granite_swa")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("edit,key", [
    ({"layer_rope_theta": [10000.0, 10000.0, 0.0]}, "config.layer_rope_theta"),
    ({"layer_rope_theta": [10000.0, -1.0, 0.0, 10000.0]}, "config.layer_rope_theta"),
    ({"layer_rope_theta": [10000.0, "10000", 0.0, 10000.0]}, "config.layer_rope_theta"),
    ({"layer_rope_theta": [10000.0, 500.0, 0.0, 10.0]}, "config.layer_rope_theta"),  # (two sliding bases)
    ({"no_rope_layers": [1, 1, 1, 1]}, "config.no_rope_layers"),  # (the Hub's spelling disagreeing)
    ({"sliding_window": None}, "config.sliding_window"),
])
def test_a_granite_swa_config_the_decoder_cannot_run_is_one_line(tmp_path, edit, key):
    assert_one_line_error(reconfigured_logits(SWA, tmp_path, **edit), key)


def test_granite_swas_defaults_are_its_config_classs(tmp_path):
    """Without layer_types every 4th layer from the first is full, and without layer_rope_theta every layer turns
    by rope_theta (GraniteSWAConfig's defaults); the Hub's no_rope_layers, where it agrees, is the same model."""
    ids = json.loads((SWA_REF / "ids.json").read_text())
    ref = exact_logits(SWA, ids, tmp_path / "ref.npy")
    same = edited_artifact(SWA, tmp_path / "a", lambda m: reconfigure(m, layer_types=None, no_rope_layers=[1, 1, 0, 1]))
    assert (exact_logits(same, ids, tmp_path / "a.npy") == ref).all()
    every = edited_artifact(SWA, tmp_path / "c", lambda m: reconfigure(m, layer_rope_theta=None))
    assert max_rel(exact_logits(every, ids, tmp_path / "c.npy"), ref) > 1e-3


@pytest.mark.parametrize("drop,kv,key", [
    ({"granite_swa.attention.rope_pattern"}, {"granite_swa.attention.rope_pattern": [True, False]},
     "granite_swa.attention.rope_pattern"),
    ({"granite_swa.attention.sliding_window_pattern"}, {}, "granite_swa.attention.sliding_window_pattern"),
    ({"granite_swa.attention.sliding_window"}, {}, "granite_swa.attention.sliding_window"),
    (set(), {"granite_swa.rope.freq_base_swa": 500.0}, "granite_swa.rope.freq_base_swa"),
])
def test_a_granite_swa_file_that_does_not_say_its_layers_is_one_line(tmp_path, drop, kv, key):
    """llama.cpp's granite_swa requires the window and its pattern, reads one RoPE base, and turns the layers its
    rope_pattern marks: a file missing the first, with another base, or a pattern of other length is refused."""
    bad = rewrite_gguf(SWA_CONVERTED, tmp_path / "bad.gguf", drop=drop, kv=kv)
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o"), key)
    assert not (tmp_path / "o").exists()


def test_granite_swas_layers_without_rope_cross_as_rope_pattern(tmp_path):
    """The converter's file marks layer 2 without RoPE (attention.rope_pattern): imported as layer_rope_theta's 0;
    our export writes the same pattern; without the key every layer turns, and the export then writes none."""
    import gguf

    assert _import(SWA_CONVERTED, tmp_path / "a")["layer_rope_theta"] == [10000.0, 10000.0, 0.0, 10000.0]
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", SWA, "--out", tmp_path / "a.gguf")
    assert res.returncode == 0, res.stderr
    field = gguf.GGUFReader(str(tmp_path / "a.gguf")).fields["granite_swa.attention.rope_pattern"]
    assert field.contents() == [True, True, False, True]
    plain = rewrite_gguf(SWA_CONVERTED, tmp_path / "plain.gguf", drop={"granite_swa.attention.rope_pattern"})
    assert "layer_rope_theta" not in _import(plain, tmp_path / "b")
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "b", "--out", tmp_path / "b.gguf")
    assert res.returncode == 0, res.stderr
    assert "granite_swa.attention.rope_pattern" not in gguf.GGUFReader(str(tmp_path / "b.gguf")).fields
