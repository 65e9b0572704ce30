"""Nemotron (NemotronForCausalLM: Nemotron-Mini-4B, Minitron 4B and 8B; llama.cpp's nemotron): LayerNorm1P (its
weights plus 1, with biases), RoPE over half of each head, an MLP of up, ReLU squared and down without a gate. The
frozen transformers logits and greedy ids are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's, the round trips through GGUF tests/test_gguf_export.py's and
tests/test_gguf_to_hf.py's; here, what llama.cpp's loader requires."""

from __future__ import annotations

from conftest import GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool

NEMOTRON = GOLDEN_IEBIN / "tiny-nemotron"


def test_the_export_needs_an_output_head_of_its_own(tmp_path):
    """llama.cpp's nemotron loader requires output.weight: a tied Nemotron is refused, not written unloadable."""
    d = edited_artifact(NEMOTRON, tmp_path / "m", lambda m: reconfigure(m, tie_word_embeddings=True))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "tie_word_embeddings", "requires an output head of its own")
    assert not (tmp_path / "m.gguf").exists()
