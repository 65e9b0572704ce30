"""The byte-level BPE splits llama.cpp knows by name (``tokenizer.ggml.pre``):
gguf-to-iebin's rebuilt tokenizer against llama.cpp's own ids, and the name
iebin-to-gguf gives a tokenizer.json, Hugging Face's spellings included.

The reference is llama.cpp itself: golden/gguf/make_pretokenizer_ids.py
froze what ``llama-tokenize`` gives for 406 strings under each split, on a
vocabulary whose merges cross the boundaries the splits draw and that has
tokens no merge makes (so ``ignore_merges`` shows)."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import pytest
from conftest import GOLDEN_HF, assert_one_line_error, run_tool
from gguf_build import gguf_from_hf

from iekit.convert.gguf_tokenizer import BPE_PRE, gguf_tokenizer_fields

GOLDEN = GOLDEN_HF.parent / "gguf"
FROZEN = json.loads((GOLDEN / "pretokenizer-llamacpp-ids.json").read_text(encoding="utf-8"))
VOCAB = GOLDEN / "pretokenizer-vocab.json"


def _vocab() -> dict:
    assert hashlib.sha256(VOCAB.read_bytes()).hexdigest() == FROZEN["vocab_sha256"]
    return json.loads(VOCAB.read_text(encoding="utf-8"))


def _ids(tokenizer_json: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    return [e.ids for e in Tokenizer.from_file(str(tokenizer_json)).encode_batch(FROZEN["texts"])]


@pytest.mark.parametrize("label", list(FROZEN["cases"]))
def test_rebuilt_tokenizer_gives_llama_cpps_ids_and_exports_under_the_same_split(tmp_path, label):
    """The import of a GGUF with this ``tokenizer.ggml.pre`` tokenizes every
    string exactly as llama.cpp did (BOS by llama.cpp's default for the name,
    special tokens matched, whole-token pieces as its ignore_merges says, and
    for a model named Phi-3 the whitespace after special tokens dropped);
    exported again, the file names a split llama.cpp treats the same way,
    with the same vocabulary."""
    import gguf

    case = FROZEN["cases"][label]
    pre = case["pre"]
    extra = {"general.name": ("string", case["general.name"])} if "general.name" in case else None
    src = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", pre=pre, tokenizer=_vocab(), extra_kv=extra)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", src, "--out-dir", tmp_path / "m", "-q")
    assert res.returncode == 0, res.stderr
    assert ("names no pre-tokenizer" in res.stderr) == (pre == "default")  # llama.cpp warns of it too
    assert _ids(tmp_path / "m/tokenizer.json") == FROZEN["ids"][label]
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "m", "--out", tmp_path / "b.gguf", "-q")
    assert res.returncode == 0, res.stderr
    a, b = (gguf.GGUFReader(str(p)).fields for p in (src, tmp_path / "b.gguf"))
    assert BPE_PRE[b["tokenizer.ggml.pre"].contents()] == BPE_PRE[pre]
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
        assert b[key].contents() == a[key].contents(), key


def test_a_file_naming_no_split_is_llama_cpps_default(tmp_path):
    """No tokenizer.ggml.pre at all (files converted before spring 2024):
    llama.cpp's default split, as for the name "default", with its warning
    (this import used to fail on the missing key)."""
    src = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", pre=None, tokenizer=_vocab())
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", src, "--out-dir", tmp_path / "m", "-q")
    assert res.returncode == 0, res.stderr
    assert "names no pre-tokenizer" in res.stderr
    assert _ids(tmp_path / "m/tokenizer.json") == FROZEN["ids"]["default"]


def test_the_frozen_splits_tell_every_pair_apart():
    """The golden strings separate each pair of splits (BOS aside), so a
    rebuilt tokenizer with another name's regex or flag would fail above."""
    def body(pre: str) -> list[list[int]]:
        return [ids[1:] if BPE_PRE[pre].add_bos else ids for ids in FROZEN["ids"][pre]]


    splits = [label for label, case in FROZEN["cases"].items() if label == case["pre"]]
    for p, q in itertools.combinations(splits, 2):
        assert sum(x != y for x, y in zip(body(p), body(q))) >= 50, (p, q)
    # a Phi-3 name changes only the whitespace after special tokens: here
    phi = [i for i, (x, y) in enumerate(zip(FROZEN["ids"]["gpt-2 named Phi3"], FROZEN["ids"]["gpt-2"])) if x != y]
    assert len(phi) >= 20 and all(re.search(r"(</s>|<tool>)\s", FROZEN["texts"][i]) for i in phi)


# Hugging Face's own tokenizer.json spellings of the splits (what convert_hf_to_gguf meets).
_HF_WORD_UPPER, _HF_WORD_LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_HF = {
    "gpt-4o": (rf"[^\r\n\p{{L}}\p{{N}}]?{_HF_WORD_UPPER}*{_HF_WORD_LOWER}+{_HF_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?"
               rf"{_HF_WORD_UPPER}+{_HF_WORD_LOWER}*{_HF_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "tekken": (rf"[^\r\n\p{{L}}\p{{N}}]?{_HF_WORD_UPPER}*{_HF_WORD_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_HF_WORD_UPPER}+"
               rf"{_HF_WORD_LOWER}*|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "llama-bpe": (rf"{_HF_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _pre_of(pre_tokenizer: dict, *, ignore_merges: bool, vocab: dict | None = None) -> str:
    tok = dict(vocab or _vocab())
    tok["pre_tokenizer"] = pre_tokenizer
    tok["model"] = {**tok["model"], "ignore_merges": ignore_merges}
    fields = gguf_tokenizer_fields(json.dumps(tok).encode(), {}, {}, Path("tokenizer.json"))
    return fields["tokenizer.ggml.pre"]


@pytest.mark.parametrize("name, ignore_merges, want", [
    ("gpt-4o", False, "gpt-4o"), ("tekken", True, "tekken"), ("llama-bpe", True, "llama-bpe"),
    ("llama-bpe", False, "smaug-bpe"), ("gpt-2", False, "gpt-2")])
def test_export_names_hugging_faces_spellings(name, ignore_merges, want):
    """o200k's and Tekken's \\p{Lu}/\\p{Ll} words, Llama 3's (?i:...)
    contractions and a Split of ByteLevel's own regex get the name llama.cpp
    gives them; Llama 3's split without ignore_merges (this vocabulary has
    tokens no merge makes) is the name whose flag is the file's."""
    sequence = {"type": "Sequence", "pretokenizers": [_split(_HF[name]), _byte_level(False)]}
    assert _pre_of(sequence, ignore_merges=ignore_merges) == want


def test_export_takes_llama_cpps_flag_where_the_merges_make_every_token(tmp_path):
    """gpt-oss's tokenizer.json may ask for ignore_merges where llama.cpp's
    gpt-4o does not: harmless when the merges make each token from its own
    text (then both ways give the same ids), refused when they do not."""
    sequence = {"type": "Sequence", "pretokenizers": [_split(_HF["gpt-4o"]), _byte_level(False)]}
    clean = json.loads((GOLDEN_HF / "tiny-llama/tokenizer.json").read_text())
    assert _pre_of(sequence, ignore_merges=True, vocab=clean) == "gpt-4o"
    tok = _vocab()
    tok["pre_tokenizer"] = sequence
    tok["model"]["ignore_merges"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    from iekit.convert.gguf_tokenizer import FormatError

    with pytest.raises(FormatError) as e:
        gguf_tokenizer_fields((tmp_path / "tokenizer.json").read_bytes(), {}, {}, tmp_path / "tokenizer.json")
    msg = str(e.value)
    assert "model.ignore_merges" in msg and "'gpt-4o'" in msg and "do not make" in msg


def test_an_unknown_split_is_refused_on_export(tmp_path):
    """A split llama.cpp has no name for (here GPT-2's without its
    contractions) is one line naming the pre_tokenizer, nothing written."""
    import shutil

    shutil.copytree(GOLDEN_HF / "tiny-llama", tmp_path / "hf")
    tok = json.loads((tmp_path / "hf/tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [_split(r" ?\p{L}+| ?\p{N}+"), _byte_level(False)]}
    (tmp_path / "hf/tokenizer.json").write_text(json.dumps(tok))
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "hf", "--out-dir", tmp_path / "m", "-q")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "m", "--out", tmp_path / "b.gguf", "-q")
    assert_one_line_error(res, "pre_tokenizer", "no name for", "gpt-4o", "tekken")
    assert not (tmp_path / "b.gguf").exists()
