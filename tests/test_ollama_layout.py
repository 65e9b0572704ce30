"""Ollama's GGUF layouts (convert/ollama_layout.py): each fixture is
llama.cpp's converter's file of a golden toy written again as Ollama's
converter (convert/convert_gptoss.go, convert_gemma3.go; model/models/*)
lays the same model out, and must import to what llama.cpp's file does.
The renames here are spelled out from Ollama's converter, not taken from
the module's tables, so a wrong table fails."""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
from conftest import GOLDEN_HF, assert_one_line_error, run_tool
from gguf_build import rewrite_gguf

from iekit.formats.iebin import load_model

LLAMACPP = GOLDEN_HF.parent / "gguf" / "llamacpp"
GPT_OSS = LLAMACPP / "tiny-gpt-oss-mxfp4.gguf"
GEMMA3 = LLAMACPP / "tiny-gemma3.gguf"
# Ollama's gptoss converter: what it names the tensors llama.cpp calls otherwise (its Replacements), and the keys
# llama.cpp's file has that it never writes
OLLAMA_GPTOSS_NAMES = {".attn_output.": ".attn_out.", ".attn_sinks.weight": ".attn_sinks",
                       ".post_attention_norm.": ".ffn_norm."}
OLLAMA_GPTOSS_UNWRITTEN = {"gpt-oss.expert_feed_forward_length", "gpt-oss.rope.scaling.type",
                           "gpt-oss.rope.scaling.yarn_beta_fast", "gpt-oss.rope.scaling.yarn_beta_slow",
                           "tokenizer.ggml.pre"}


def _prefixed(src, old: str, new: str) -> dict[str, str]:
    return {k: new + k[len(old):] for k in gguf.GGUFReader(str(src)).fields if k.startswith(old)}


def ollama_gptoss(dst, **change):
    """tiny-gpt-oss-mxfp4 as Ollama's gptoss converter writes it: general.architecture gptoss, its keys under
    gptoss., its names, no expert width, RoPE scaling type or betas, the split named "default" (its hash of the
    tokenizer's regex matches none it knows), its eos_token_ids."""
    kv = {"tokenizer.ggml.pre": "default", "tokenizer.ggml.eos_token_ids": [1], **change.pop("kv", {})}
    return rewrite_gguf(GPT_OSS, dst, arch="gptoss", keys=_prefixed(GPT_OSS, "gpt-oss.", "gptoss."),
                        drop=OLLAMA_GPTOSS_UNWRITTEN | change.pop("drop", set()), kv=kv,
                        names={**OLLAMA_GPTOSS_NAMES, **change.pop("names", {})}, **change)


def _import(gguf_path, out, *flags):
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", gguf_path, "--out-dir", out, *flags)
    assert res.returncode == 0, res.stderr
    return res


def _same_model(a, b, config_differs: dict | None = None) -> None:
    """Artifacts a and b hold the same tensors, byte for byte, and the same config (but ``config_differs``)."""
    assert (a / "model.ie.bin").read_bytes() == (b / "model.ie.bin").read_bytes()
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    for key, (va, vb) in (config_differs or {}).items():
        assert (ca.pop(key), cb.pop(key)) == (va, vb), key
    assert ca == cb


def test_ollamas_gptoss_imports_as_llamacpps_gpt_oss(tmp_path):
    """gpt-oss as `ollama pull gpt-oss:20b` holds it: the artifact of llama.cpp's file of the same weights, byte for
    byte, the same config; the split the o200k one (llama.cpp's gpt-4o) whatever the file names; recorded as read
    as Ollama's layout."""
    res = _import(ollama_gptoss(tmp_path / "o.gguf"), tmp_path / "o")
    assert "read as Ollama lays it out" in res.stderr
    _import(GPT_OSS, tmp_path / "l", "-q")
    _same_model(tmp_path / "o", tmp_path / "l")
    meta = json.loads((tmp_path / "o/model.ie.json").read_text())
    assert meta["source"]["gguf"]["architecture"] == "gpt-oss" and meta["source"]["gguf"]["layout"] == "ollama"
    gpt4o = rewrite_gguf(GPT_OSS, tmp_path / "gpt4o.gguf", drop={"tokenizer.ggml.pre"},
                         kv={"tokenizer.ggml.pre": "gpt-4o"})
    _import(gpt4o, tmp_path / "g", "-q")
    assert (tmp_path / "o/tokenizer.json").read_bytes() == (tmp_path / "g/tokenizer.json").read_bytes()
    assert (tmp_path / "o/tokenizer.json").read_bytes() != (tmp_path / "l/tokenizer.json").read_bytes()
    assert run_tool("ieconv", "validate", "--deep", tmp_path / "o").returncode == 0


def test_ollamas_stop_tokens_must_be_llamacpps(tmp_path):
    """eos_token_ids naming a token llama.cpp's reading would not stop at: one line naming the key."""
    bad = ollama_gptoss(tmp_path / "o.gguf", kv={"tokenizer.ggml.eos_token_ids": [1, 7]})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o"),
                          "tokenizer.ggml.eos_token_ids")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("old,fused", [(".attn_q.", ".attn_qkv."), (".ffn_gate_exps.", ".ffn_gate_up_exps.")])
def test_an_older_ollama_fused_layout_is_one_line(tmp_path, old, fused):
    bad = ollama_gptoss(tmp_path / "o.gguf", names={old: fused})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o"),
                          fused.strip("."))


def _vision(dst, src=GEMMA3, arch="gemma3", **change):
    """``src`` with a vision tower's and projector's tensors and keys beside the language model, as Ollama's
    multimodal blobs hold them."""
    kv = {f"{arch}.vision.block_count": 1, f"{arch}.vision.embedding_length": 16, f"{arch}.mm.tokens_per_image": 4,
          **change.pop("kv", {})}
    extra = {"v.blk.0.attn_q.weight": np.ones((16, 16), np.float32),
             "v.patch_embd.weight": np.ones((16, 3), np.float32),
             "mm.mm_input_projection.weight": np.ones((64, 16), np.float32)}
    return rewrite_gguf(src, dst, kv=kv, tensors=extra, **change)


def test_a_multimodal_blob_needs_text_only(tmp_path):
    """Refused in one line that says what it holds and names --text-only; with it, the language model alone (llama.cpp's
    file's artifact, byte for byte), the other parts recorded as left out and said."""
    blob = _vision(tmp_path / "mm.gguf")
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", blob, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, "--text-only")
    assert "2 vision tower tensors (v.*)" in res.stderr and not (tmp_path / "m").exists()
    res = _import(blob, tmp_path / "m", "--text-only")
    assert "left out 2 vision tower tensors (v.*), 1 projector tensors (mm.*)" in res.stderr
    _import(GEMMA3, tmp_path / "l", "-q")
    _same_model(tmp_path / "m", tmp_path / "l")
    source = load_model(tmp_path / "m").meta["source"]["gguf"]
    assert source["left_out"] == {"v.": 2, "mm.": 1} and source["layout"] == "ollama"
    assert run_tool("ieconv", "validate", "--deep", tmp_path / "m").returncode == 0


def test_ierun_runs_a_multimodal_blobs_language_model(tmp_path):
    """ierun's --model-dir takes the blob as it is: it imports the language model alone."""
    blob = _vision(tmp_path / "mm.gguf")
    env = {**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")}
    res = run_tool("ierun", "logits", "--model-dir", blob, "--ids", "1,2,3", "--out", tmp_path / "l.npy", env=env)
    assert res.returncode == 0, res.stderr
    _import(GEMMA3, tmp_path / "l", "-q")
    res = run_tool("ierun", "logits", "--model-dir", tmp_path / "l", "--ids", "1,2,3", "--out", tmp_path / "r.npy")
    assert res.returncode == 0, res.stderr
    assert np.array_equal(np.load(tmp_path / "l.npy"), np.load(tmp_path / "r.npy"))


def test_ollamas_gemma3_rope_keys_and_defaults(tmp_path):
    """Ollama's gemma3 keys: the RoPE bases under rope.global / rope.local (the same model); a multimodal blob
    names neither nor the norms' eps, which Ollama's gemma3 model takes as 1e6, 1e4 and 1e-6."""
    keys = {"gemma3.rope.freq_base": "gemma3.rope.global.freq_base",
            "gemma3.rope.freq_base_swa": "gemma3.rope.local.freq_base"}
    _import(rewrite_gguf(GEMMA3, tmp_path / "k.gguf", keys=keys), tmp_path / "k", "-q")
    _import(GEMMA3, tmp_path / "l", "-q")
    _same_model(tmp_path / "k", tmp_path / "l")
    silent = _vision(tmp_path / "s.gguf", drop={"gemma3.rope.freq_base", "gemma3.rope.freq_base_swa",
                                                "gemma3.attention.layer_norm_rms_epsilon"})
    _import(silent, tmp_path / "s", "-q", "--text-only")
    _same_model(tmp_path / "s", tmp_path / "l", {"rms_norm_eps": (1e-6, pytest.approx(1e-5))})
    both = rewrite_gguf(GEMMA3, tmp_path / "b.gguf", kv={"gemma3.rope.global.freq_base": 5.0})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", both, "--out-dir", tmp_path / "b"),
                          "gemma3.rope.global.freq_base")


def test_ollamas_mistral3_yarn_keys(tmp_path):
    """Ollama's mistral3 names YaRN's betas rope.scaling.beta_* and the attention temperature rope.scaling_beta."""
    src = LLAMACPP / "tiny-ministral3.gguf"
    keys = {"mistral3.rope.scaling.yarn_beta_fast": "mistral3.rope.scaling.beta_fast",
            "mistral3.rope.scaling.yarn_beta_slow": "mistral3.rope.scaling.beta_slow",
            "mistral3.attention.temperature_scale": "mistral3.rope.scaling_beta"}
    _import(_vision(tmp_path / "o.gguf", src=src, arch="mistral3", keys=keys), tmp_path / "o", "-q", "--text-only")
    _import(src, tmp_path / "l", "-q")
    _same_model(tmp_path / "o", tmp_path / "l")


def test_ollamas_qwen35_layout_is_one_line(tmp_path):
    src = LLAMACPP / "tiny-qwen3-5.gguf"
    bad = rewrite_gguf(src, tmp_path / "q.gguf", kv={"qwen35.ssm.v_head_reordered": True})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "q"),
                          "qwen35.ssm.v_head_reordered")


def test_ollamas_lfm2_names_its_final_norm_output_norm(tmp_path):
    """Ollama's lfm2: the final norm as output_norm, and an older converter's feed_forward_length stale (Ollama's
    model reads the width from the tensors): the artifact of llama.cpp's file."""
    src = LLAMACPP / "tiny-lfm2.gguf"
    blob = rewrite_gguf(src, tmp_path / "o.gguf", names={"token_embd_norm.": "output_norm."},
                        drop={"lfm2.feed_forward_length"}, kv={"lfm2.feed_forward_length": 12288})
    res = _import(blob, tmp_path / "o")
    assert "read as Ollama lays it out" in res.stderr
    _import(src, tmp_path / "l", "-q")
    _same_model(tmp_path / "o", tmp_path / "l")
