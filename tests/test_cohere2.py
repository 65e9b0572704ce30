"""Cohere 2 (Cohere2ForCausalLM; llama.cpp's cohere2) and Cohere
(CohereForCausalLM; command-r): one LayerNorm per layer feeding attention
and MLP in parallel, interleaved RoPE (Cohere 2: on the sliding layers
only), logits times logit_scale. The frozen transformers logits are
tests/test_decoder.py's, the converter's own files
tests/test_llamacpp_converter.py's; here, the logit scale and what is
refused rather than imported or exported as another model."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, exact_logits, reconfigure, run_tool
from gguf_build import rewrite_gguf

COHERE2 = GOLDEN_IEBIN / "tiny-cohere2"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-cohere2.gguf"
IDS = [3, 17, 42, 99, 5, 250, 7, 8, 1, 64, 12, 200]


def test_logit_scale_multiplies_every_logit(tmp_path):
    """Halving logit_scale halves every logit (a power of two: exactly)."""
    ref = exact_logits(COHERE2, IDS, tmp_path / "ref.npy")
    d = edited_artifact(COHERE2, tmp_path / "m", lambda meta: reconfigure(meta, logit_scale=0.25))
    np.testing.assert_array_equal(exact_logits(d, IDS, tmp_path / "half.npy") * 2, ref)


@pytest.mark.parametrize("change,needle", [
    (dict(drop={"cohere2.logit_scale"}), "cohere2.logit_scale"),
    (dict(drop={"cohere2.attention.sliding_window"}), "cohere2.attention.sliding_window"),
    (dict(tensors={"output.weight": np.zeros((320, 64), np.float32)}), "never this one"),
])
def test_hostile_cohere2_files_are_refused(tmp_path, change, needle):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", **change)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", needle)
    assert not (tmp_path / "o").exists()


def test_export_refuses_an_untied_head(tmp_path):
    d = edited_artifact(COHERE2, tmp_path / "m", lambda meta: reconfigure(meta, tie_word_embeddings=False))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "tie_word_embeddings", "reads the embedding")


COHERE = GOLDEN_IEBIN / "tiny-cohere"


def test_a_command_r_file_without_logit_scale_scales_nothing(tmp_path):
    """llama.cpp's command-r scales the logits only where the file has the
    key (cohere2 requires it): without it the import says 1."""
    import json

    bare = rewrite_gguf(GOLDEN / "gguf" / "llamacpp" / "tiny-cohere.gguf", tmp_path / "bare.gguf",
                        drop={"command-r.logit_scale"})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bare, "--out-dir", tmp_path / "b")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "b/config.json").read_text())["logit_scale"] == 1.0


def test_command_r_plus_qk_norms_are_refused(tmp_path):
    d = edited_artifact(COHERE, tmp_path / "m", lambda meta: reconfigure(meta, use_qk_norm=True))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "config.use_qk_norm",
                          "not supported")
