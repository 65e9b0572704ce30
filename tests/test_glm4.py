"""GLM-4 (Glm4ForCausalLM; llama.cpp's glm4): interleaved RoPE over half of
each head, RMSNorm before and after each block, gate_up_proj fused. The
frozen transformers logits are tests/test_decoder.py's, the converter's own
file tests/test_llamacpp_converter.py's; here, the rotated share as
Glm4Config and llama.cpp read it."""

from __future__ import annotations

import json

import numpy as np

from conftest import GOLDEN, GOLDEN_IEBIN, edited_artifact, exact_logits, reconfigure, run_tool
from gguf_build import rewrite_gguf

GLM4 = GOLDEN_IEBIN / "tiny-glm4"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-glm4.gguf"
IDS = [3, 17, 42, 99, 5, 250, 7, 8, 1, 64, 12, 200]
ROPE = json.loads((GLM4 / "config.json").read_text())["rope_parameters"]


def _with_rope(tmp_path, tag, rope):
    d = edited_artifact(GLM4, tmp_path / tag, lambda meta: reconfigure(meta, rope_parameters=rope))
    return exact_logits(d, IDS, tmp_path / f"{tag}.npy")


def test_a_config_without_the_factor_rotates_half_of_each_head(tmp_path):
    """Glm4Config's partial_rotary_factor defaults to 0.5: leaving it out is
    the same model, and 1.0 (the whole head) another."""
    ref = exact_logits(GLM4, IDS, tmp_path / "ref.npy")
    bare = {k: v for k, v in ROPE.items() if k != "partial_rotary_factor"}
    np.testing.assert_array_equal(_with_rope(tmp_path, "bare", bare), ref)
    whole = _with_rope(tmp_path, "whole", {**ROPE, "partial_rotary_factor": 1.0})
    assert np.abs(whole - ref).max() > 1e-2 * np.abs(ref).max()


def test_a_file_rotating_whole_heads_imports_as_such(tmp_path):
    """A glm4 file whose rope.dimension_count is the whole head says so in
    the config (1.0), rather than falling to Glm4Config's 0.5."""
    whole = rewrite_gguf(CONVERTED, tmp_path / "whole.gguf", drop={"glm4.rope.dimension_count"})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", whole, "--out-dir", tmp_path / "w")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "w/config.json").read_text())["partial_rotary_factor"] == 1.0
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "h")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "h/config.json").read_text())["partial_rotary_factor"] == 0.5
