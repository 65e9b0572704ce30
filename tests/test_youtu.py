"""Youtu-LLM (Tencent's YoutuForCausalLM, written by llama.cpp's converter as a deepseek2 file without experts):
DeepSeek-V3's latent attention with a dense MLP in every layer. The frozen transformers logits are
tests/test_decoder.py's and the converter's file tests/test_llamacpp_converter.py's; llama.cpp's "youtu" split
tests/test_gguf_pretokenizers.py's. Here, how its file is told from DeepSeek's, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      reconfigure, run_tool)
from gguf_build import rewrite_gguf
from llamacpp_models import _hf_variant

YOUTU = GOLDEN_IEBIN / "tiny-youtu"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-youtu.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-youtu" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-youtu" / "logits.npy").astype(np.float64)
# Youtu-LLM's word split as its tokenizer.json states it (cased words by \p{Lu} and \p{Ll}), which llama.cpp's
# "youtu" collapses into one letter class: "iPhone" is one piece there, "i" and "Phone" here
HF_WORDS = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_its_deepseek2_file_imports_as_youtu(tmp_path):
    """A deepseek2 file without expert_count is a dense model: imported as YoutuForCausalLM (its latent attention
    as DeepSeek's, interleaved RoPE, the head tied), computing transformers' logits."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert cfg["architectures"] == ["YoutuForCausalLM"] and cfg["rope_interleave"] is True
    assert cfg["tie_word_embeddings"] is True and not any("expert" in k for k in cfg)
    logits = exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy").astype(np.float64)
    assert np.abs(logits - REF).max() / np.abs(REF).max() < 1e-4  # (latent attention's order of sums: test_decoder)


@pytest.mark.parametrize("kv, drop, needles", [
    ({"deepseek2.leading_dense_block_count": 1}, set(), ("leading_dense_block_count", "1 of 2 layers dense")),
    ({}, {"deepseek2.leading_dense_block_count"}, ("leading_dense_block_count", "0 of 2 layers dense")),
])
def test_a_dense_file_with_layers_llamacpp_runs_as_experts_is_refused(tmp_path, kv, drop, needles):
    """llama.cpp runs a dense MLP only in the first leading_dense_block_count layers: fewer than all, and it looks
    for experts the file has none of."""
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=drop, kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, str(bad), *needles)
    assert not (tmp_path / "m").exists()


def test_the_export_writes_every_layer_dense(tmp_path):
    import gguf

    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", YOUTU, "--out", tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    kv = {k: f.contents() for k, f in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields.items()}
    assert (kv["deepseek2.leading_dense_block_count"], kv["deepseek2.expert_feed_forward_length"],
            kv["deepseek2.expert_shared_count"]) == (2, 128, 0)
    assert "deepseek2.expert_count" not in kv and "output.weight" not in {t.name for t in gguf.GGUFReader(
        str(tmp_path / "m.gguf")).tensors}  # (tied: llama.cpp's deepseek2 reads the embedding as the head)
    d = edited_artifact(YOUTU, tmp_path / "flat", lambda m: reconfigure(m, rope_interleave=False))
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "f.gguf"),
                          "config.rope_interleave", "interleaved")


def test_its_own_tokenizer_is_not_exported_as_llamacpps_youtu_split(tmp_path):
    """llama.cpp's "youtu" split reads \\p{Lu} and \\p{Ll} as any letter, so it keeps "iPhone" whole where the
    checkpoint's tokenizer splits it: an export under that name would tokenize differently, and is refused."""
    hf = _hf_variant(tmp_path, "tiny-youtu", {})
    tok = json.loads((hf / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": HF_WORDS}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    (hf / "tokenizer.json").write_text(json.dumps(tok))
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "m").returncode == 0
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "m", "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "pre_tokenizer", "no name for")
