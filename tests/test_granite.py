"""Granite 3 (GraniteForCausalLM; llama.cpp's granite): Llama's layer with
four multipliers. The frozen transformers logits are tests/test_decoder.py's,
the converter's own file tests/test_llamacpp_converter.py's; here, what a
granite file without its optional keys means, and what is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, exact_logits, reconfigure, run_tool
from gguf_build import rewrite_gguf

GRANITE = GOLDEN_IEBIN / "tiny-granite"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-granite.gguf"


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
