"""A Hugging Face ``tokenizer.json`` rebuilt from a GGUF file's vocabulary.

llama.cpp stores the tokenizer as key-values: ``tokenizer.ggml.model`` (the
kind), ``tokens``, ``token_type``, ``merges`` (byte-level BPE) or ``scores``
(SentencePiece), the special token ids and ``tokenizer.ggml.pre``, the name
of the pre-tokenizer llama.cpp hard-codes for that model family. Each kind
rebuilt here is the HF pipeline that tokenizes like llama.cpp does:

- ``gpt2`` (byte-level BPE) with any pre name of ``BPE_PRE`` (GPT-2's,
  Llama 3's, Qwen2's, o200k's, Tekken's, DeepSeek's splits and their
  aliases, and llama.cpp's default chain): the pre-tokenizer regexes and
  flags of llama.cpp's ``llama-vocab.cpp`` for that name, then byte-level
  BPE with the stored merges;
- ``llama`` (SentencePiece BPE): merges derived from the scores (a pair
  merges with the priority of the token it forms, as llama.cpp's SPM
  tokenizer does), byte fallback for ``<0xNN>`` tokens, the ``▁`` space
  convention and a prefix space.

Token types: CONTROL (3) and UNKNOWN (2) become special added tokens,
USER_DEFINED (4) non-special ones, matched before the model runs, as in
llama.cpp (whose text partition takes all three; by a model's name, Phi-3's
drop the whitespace after them).
``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` become the post-processor.
Any other kind or pre-tokenizer is refused with one line: a tokenizer that
silently splits text differently would make every figure downstream wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iekit.formats.errors import FormatError

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp's regex_exprs), spelled as it spells them.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_DIGIT = r"\p{N}"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k's and Tekken's case-aware words, which llama.cpp writes without \p{Lu}/\p{Ll}: an "upper" letter
# is one not in a-z and a "lower" one not in A-Z, so outside ASCII every letter is both.
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[一-龥ࠀ-一가-퟿]+"
# DeepSeek-LLM's letters, as code points: six of them are not in Unicode normal form, which an editor
# would silently normalise into other characters.
_DEEPSEEK_LETTERS = (
    "\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-"
    "\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    "\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-"
    "\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-"
    "\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-"
    "\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943")
_DEEPSEEK_LLM = ("[\r\n]", r"\s?[A-Za-z" + _DEEPSEEK_LETTERS + "]+", "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$",
                 _CJK, "\\p{N}+")
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
_DEEPSEEK3 = (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
              "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
              "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")

# Kimi K2's split as llama.cpp's own handler draws it (unicode.cpp, unicode_regex_split_custom_kimi_k2): runs of
# Han (its ranges: the CJK ideograph blocks), words of other letters (any case: the handler does not tell Lu from
# Ll) after an optional non-letter and with an English contraction, digits by threes, then GPT-4o's pieces of
# punctuation (without its slash) and whitespace
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002ebef\U0002f800-\U0002fa1f"
_KIMI_K2 = (rf"[{_HAN}]+|[^\r\n\p{{L}}\p{{N}}]?(?:(?![{_HAN}])\p{{L}})+{_CONTRACTIONS}?"
            rf"|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# AFMoE's (Trinity's) split, as llama.cpp draws it: digits in groups of three counted from the run's end (its own
# handler, unicode_regex_split_custom_afmoe, which leaves the text before a run in one piece with the run's first
# group, so that the later splits' lookaheads see that digit), runs of its CJK and Southeast Asian scripts (the
# ranges as llama.cpp's source spells them: the third begins at U+8C48, the character its U+F900 normalises to), then
# DeepSeek-V3's pieces
_AFMOE = (r"\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
          "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
          "\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
          "\u1100-\u11ff]+",
          _DEEPSEEK3[2])

# Youtu-LLM's split as llama.cpp draws it: runs of Hangul, of CJK punctuation, of Bopomofo, of Han and kana (its
# ranges), then words as o200k's: llama.cpp collapses \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm} and \p{Lo} all into one
# letter class (unicode.cpp's k_ucat_enum; ASCII letters of either case included), so the cased words are any run of
# letters and marks, after an optional non-letter and with an English contraction
_YOUTU = ("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
          rf"[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+{_CONTRACTIONS}?|\p{{N}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class BpePre:
    """How llama.cpp splits text before byte-level BPE, for a group of
    ``tokenizer.ggml.pre`` names (llama-vocab.cpp's pre type and flags)."""

    regexes: tuple[str, ...]  # applied in turn, each isolating its matches (and the text between them)
    ignore_merges: bool = False  # a piece that is a token is that token, whatever the merges would make
    add_bos: bool = False  # BOS is added where the file has no tokenizer.ggml.add_bos_token


_PRE_GROUPS: tuple[tuple[tuple[str, ...], BpePre], ...] = (
    (("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"), BpePre((_GPT2,))),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
     BpePre((_DIGIT, _GPT2))),
    (("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     BpePre((_LLAMA3,), ignore_merges=True, add_bos=True)),
    (("smaug-bpe", "dbrx"), BpePre((_LLAMA3,))),
    (("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan", "solar-open"), BpePre((_QWEN2,))),
    (("gpt-4o", "llama4"), BpePre((_GPT4O,))),
    (("tekken",), BpePre((_TEKKEN,), ignore_merges=True, add_bos=True)),
    (("deepseek-llm",), BpePre(_DEEPSEEK_LLM)),
    (("deepseek-coder",), BpePre(_DEEPSEEK_CODER)),
    (("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"), BpePre(_DEEPSEEK3)),
    (("kimi-k2",), BpePre((_KIMI_K2,))),
    (("afmoe",), BpePre(_AFMOE)),
    (("youtu",), BpePre(_YOUTU, ignore_merges=True)),
    # what llama.cpp splits with when the file names no pre-tokenizer (it warns that quality will suffer)
    (("default",), BpePre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))),
)
# tokenizer.ggml.pre -> its split; the first name of each group is the one an export writes.
BPE_PRE: dict[str, BpePre] = {name: pre for names, pre in _PRE_GROUPS for name in names}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama_token_type
# config.json's {k}_token_id -> tokenizer.ggml.{v}_token_id, as gguf-py's SpecialVocab writes them from a config
# (llama.cpp's spelling "seperator"); both ways (the unknown token's: written, and read from the vocabulary)
CONFIG_TOKEN_IDS = {"bos": "bos", "eos": "eos", "pad": "padding", "sep": "seperator", "cls": "cls", "mask": "mask"}
SPM_SPACE = "\u2581"


def tokenizer_json(fields: dict[str, Any], path: Path) -> bytes:
    """The ``tokenizer.json`` bytes for a GGUF file's key-values (``path``
    names the file in errors)."""
    kind = _get(fields, path, "tokenizer.ggml.model", str)
    tokens = _get(fields, path, "tokenizer.ggml.tokens", list)
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise FormatError(path, "tokenizer.ggml.tokens", "must be a non-empty array of strings")
    n = len(tokens)
    types = fields.get("tokenizer.ggml.token_type", [1] * n)
    if not isinstance(types, list) or len(types) != n or not all(type(t) is int for t in types):
        raise FormatError(path, "tokenizer.ggml.token_type", f"must be an array of {n} integers (one per token)")
    bad = next((i for i, t in enumerate(types) if not 0 <= t <= BYTE), None)
    if bad is not None:
        raise FormatError(path, f"tokenizer.ggml.token_type[{bad}]", f"{types[bad]} is not a token type "
                                                                     f"(0..{BYTE}, llama.cpp's llama_token_type)")
    seen: set[str] = set()
    for t in tokens:  # a set, not a scan of the earlier tokens: linear in a hostile vocabulary too
        if t in seen:
            raise FormatError(path, "tokenizer.ggml.tokens", f"token {t!r} appears twice")
        seen.add(t)
    if kind == "gpt2":
        tok = _byte_level_bpe(fields, path, tokens)
    elif kind == "llama":
        tok = _sentencepiece_bpe(fields, path, tokens, types)
    else:
        raise FormatError(path, "tokenizer.ggml.model", f"tokenizer kind {kind!r} cannot be rebuilt "
                                                        "(supported: gpt2 byte-level BPE, llama SentencePiece BPE)")
    from tokenizers import AddedToken

    rstrip = _rstripped(fields, tokens, types)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=t in rstrip)
                            for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False, rstrip=t in rstrip)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    # llama.cpp's defaults when the file does not say: BOS for SentencePiece and for Llama-3's and Tekken's BPE.
    bos_default = kind == "llama" or BPE_PRE[pre_name(fields)].add_bos
    _post_processor(tok, fields, path, tokens, bos_default)
    return (json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _rstripped(fields: dict[str, Any], tokens: list[str], types: list[int]) -> set[str]:
    """The special tokens after which llama.cpp drops the whitespace: for a
    model whose ``general.name`` says Phi-3, all of them but ``<unk>``,
    ``<s>`` and ``<|endoftext|>`` (llama-vocab.cpp sets these attributes by
    the model's name); none for any other model."""
    name = fields.get("general.name")
    if not isinstance(name, str) or not any(k in name.lower() for k in ("phi-3", "phi3")):
        return set()
    special = {t for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED, UNKNOWN)}
    return special - {"<unk>", "<s>", "<|endoftext|>"}


def pre_name(fields: dict[str, Any]) -> Any:
    """The file's ``tokenizer.ggml.pre``; llama.cpp reads a file without one
    (converted before spring 2024) as "default"."""
    return fields.get("tokenizer.ggml.pre", "default")


def _get(fields: dict[str, Any], path: Path, key: str, typ: type) -> Any:
    if key not in fields:
        raise FormatError(path, key, "is missing; cannot rebuild the tokenizer")
    v = fields[key]
    if not isinstance(v, typ) or isinstance(v, bool):
        raise FormatError(path, key, f"expected {typ.__name__}, got {type(v).__name__}")
    return v


def _byte_level_bpe(fields: dict[str, Any], path: Path, tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = pre_name(fields)
    if not isinstance(pre, str) or pre not in BPE_PRE:
        raise FormatError(path, "tokenizer.ggml.pre", f"pre-tokenizer {pre!r} cannot be rebuilt "
                                                      f"(supported: {', '.join(BPE_PRE)})")
    merges = _get(fields, path, "tokenizer.ggml.merges", list)
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2 or not all(parts):
            raise FormatError(path, f"tokenizer.ggml.merges[{i}]", f"expected two tokens separated by a space, got {m!r}")
        pairs.append((parts[0], parts[1]))
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs,
                                   ignore_merges=BPE_PRE[pre].ignore_merges))
    except Exception as e:  # the tokenizers library raises its own Exception type (a panic: library_calls)
        raise FormatError(path, "tokenizer.ggml.merges", f"rejected by the BPE model: {e}") from None
    regexes = list(BPE_PRE[pre].regexes)
    steps = []
    if regexes[0] == _DIGIT:  # HF's own form of it
        steps.append(pre_tokenizers.Digits(individual_digits=True))
        regexes.pop(0)
    if regexes == [_GPT2]:  # HF's ByteLevel regex splits as llama.cpp's GPT-2 one does
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


# The longest SentencePiece piece read or written (sentencepiece's own default is 16): every split of
# every piece is looked up, so an unbounded piece would make a small hostile file run for minutes.
MAX_PIECE_CHARS = 512


def _check_piece_lengths(tokens: list[str], types: list[int], path: Path, field: str) -> None:
    long = next((t for t, ty in zip(tokens, types) if ty not in (CONTROL, USER_DEFINED) and len(t) > MAX_PIECE_CHARS),
                None)
    if long is not None:
        raise FormatError(path, field, f"a SentencePiece piece of {len(long)} characters (at most {MAX_PIECE_CHARS}): "
                                       f"{long[:40]!r}...")


def spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """The BPE merges that tokenize as llama.cpp's SentencePiece tokenizer
    does with these scores: every split of a token into two tokens, ranked
    by the merged token's score (higher first), then by the pieces' ids."""
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] not in (CONTROL, USER_DEFINED, BYTE)}
    ranked = []
    for t, i in mergeable.items():
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in mergeable and b in mergeable:
                ranked.append((-scores[i], vocab[a], vocab[b], a, b))
    ranked.sort()
    return [(r[3], r[4]) for r in ranked]


def _sentencepiece_bpe(fields: dict[str, Any], path: Path, tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = _get(fields, path, "tokenizer.ggml.scores", list)
    if len(scores) != len(tokens) or not all(isinstance(s, (int, float)) and not isinstance(s, bool)
                                             and math.isfinite(s) for s in scores):
        raise FormatError(path, "tokenizer.ggml.scores", f"must be an array of {len(tokens)} finite numbers (one per "
                                                         "token)")
    _check_piece_lengths(tokens, types, path, "tokenizer.ggml.tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = fields.get("tokenizer.ggml.unknown_token_id", 0)
    if type(unk_id) is not int or not 0 <= unk_id < len(tokens):
        raise FormatError(path, "tokenizer.ggml.unknown_token_id", f"not a token id: {unk_id!r}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens, types, scores), unk_token=tokens[unk_id],
                               byte_fallback=True, fuse_unk=True))
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    if not isinstance(prefix, bool):
        raise FormatError(path, "tokenizer.ggml.add_space_prefix", f"expected a boolean, got {prefix!r}")
    steps = [normalizers.Prepend(SPM_SPACE)] if prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPM_SPACE)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def _post_processor(tok, fields: dict[str, Any], path: Path, tokens: list[str], bos_default: bool) -> None:
    """BOS/EOS added around each sequence when the file asks for them."""
    from tokenizers import processors

    ends = []
    for which, default in (("bos", bos_default), ("eos", False)):
        add = fields.get(f"tokenizer.ggml.add_{which}_token", default)
        if not isinstance(add, bool):
            raise FormatError(path, f"tokenizer.ggml.add_{which}_token", f"expected a boolean, got {add!r}")
        if not add:
            ends.append(None)
            continue
        key = f"tokenizer.ggml.{which}_token_id"
        tid = fields.get(key)
        if type(tid) is not int or not 0 <= tid < len(tokens):
            raise FormatError(path, key, f"add_{which}_token is set but the id {tid!r} is not a token id")
        ends.append((tokens[tid], tid))
    bos, eos = ends
    if bos is None and eos is None:
        return

    def seq(letter: str, type_id: int) -> str:
        return " ".join(f"{e}:{type_id}" for e in (bos and bos[0], f"${letter}", eos and eos[0]) if e)

    tok.post_processor = processors.TemplateProcessing(
        single=seq("A", 0), pair=f"{seq('A', 0)} {seq('B', 1)}", special_tokens=sorted({e for e in ends if e}))


# llama.cpp's end-of-generation tokens (llama-vocab.cpp, "special_eog_ids"): the eos, eot and eom ids, the FIM
# pad / repo / file-separator ids (named by key, or found by these texts), and every token with one of these texts.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>",
    "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["})
_FIM_TEXTS = {"fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
              "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
              "fim_sep": ("<|file_sep|>",)}


def end_of_generation(fields: dict[str, Any]) -> list[int]:
    """The token ids at which llama.cpp stops generating, the file's EOS
    first: what ``ierun generate`` must stop at too (an instruction-tuned
    Llama 3 ends its turn with <|eot_id|>, not its EOS). As llama.cpp: a
    gpt-oss vocabulary (<|call|> or <|calls|>, with <|return|> or
    <|flush|>) does not stop at <|end|>, and one with <|tool_response> or
    <|plamo:eos|> not at </s>."""
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return []
    ids = [fields.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    by_text = {t: i for i, t in enumerate(tokens)}
    for key, texts in _FIM_TEXTS.items():
        given = fields.get(f"tokenizer.ggml.{key}_token_id")
        ids += [given] if given is not None else [by_text[t] for t in texts if t in by_text]
    ids += [i for i, t in enumerate(tokens) if t in _EOG_TEXTS]
    eog = list(dict.fromkeys(i for i in ids if type(i) is int and 0 <= i < len(tokens)))
    texts = {tokens[i] for i in eog}
    calls = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and calls and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.remove(by_text["<|end|>"])
    if "</s>" in texts and texts & {"<|tool_response>", "<|plamo:eos|>"}:
        eog.remove(by_text["</s>"])
    return eog


_TEMPLATE_KEY = "tokenizer.chat_template"


def _chat_templates(fields: dict[str, Any], path: Path) -> str | list[dict[str, str]] | None:
    """The file's chat template as tokenizer_config.json holds it: the text,
    or, where it has named ones besides (``tokenizer.chat_template.NAME``,
    tool use and the like), transformers' list of {name, template} with the
    unnamed one as "default"."""
    named = {}
    for key, v in fields.items():
        if key == _TEMPLATE_KEY or key.startswith(_TEMPLATE_KEY + "."):
            if not isinstance(v, str):
                raise FormatError(path, key, f"expected a string, got {type(v).__name__}")
            named["default" if key == _TEMPLATE_KEY else key[len(_TEMPLATE_KEY) + 1:]] = v
    if set(named) <= {"default"}:
        return named.get("default")
    return [{"name": n, "template": t} for n, t in sorted(named.items(), key=lambda kv: kv[0] != "default")]


def tokenizer_config_json(fields: dict[str, Any], path: Path) -> bytes | None:
    """A ``tokenizer_config.json`` carrying the file's chat template
    (``tokenizer.chat_template``) and the text of its BOS/EOS tokens, which
    templates refer to, and a SentencePiece vocabulary's scores
    (``gguf_scores``: the BPE merges are made from them but cannot hold
    them, and iebin-to-gguf writes them back as they were); and a byte-level
    vocabulary's unknown token (``unk_token``, which llama.cpp's BPE never
    emits, so not in the model, but which an export names again); None when
    there is none of these."""
    template = _chat_templates(fields, path)
    scores = fields.get("tokenizer.ggml.scores") if fields.get("tokenizer.ggml.model") == "llama" else None
    unk = fields.get("tokenizer.ggml.unknown_token_id") if fields.get("tokenizer.ggml.model") == "gpt2" else None
    if template is None and scores is None and unk is None:
        return None
    tokens = fields.get("tokenizer.ggml.tokens") or []
    cfg: dict[str, Any] = {} if template is None else {"chat_template": template}
    if scores is not None:  # checked by tokenizer_json, which runs first
        cfg["gguf_scores"] = [float(s) for s in scores]
    for which, tid in (("bos", fields.get("tokenizer.ggml.bos_token_id")),
                       ("eos", fields.get("tokenizer.ggml.eos_token_id")), ("unk", unk)):
        if type(tid) is int and 0 <= tid < len(tokens):
            cfg[f"{which}_token"] = tokens[tid]
    return (json.dumps(cfg, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


# --- the other way: a tokenizer.json as llama.cpp's tokenizer.ggml.* key-values ---

# Hugging Face's spellings (tokenizer.json) of pieces llama.cpp spells out, its regex engine having neither
# inline case folding nor \p{Lu}: the same text splits the same way, except that llama.cpp's "upper" and
# "lower" take every letter outside ASCII (o200k's and Tekken's words; docs/gguf.md).
_HF_SPELLINGS = ((r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", _CONTRACTIONS),
                 (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", _UPPER), (r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]", _LOWER))
_HF_GPT2 = _GPT2 + r"|\s+"  # ByteLevel's own regex: its last branch takes only what llama.cpp leaves between


def _pre_regexes(pre: Any) -> tuple[str, ...] | None:
    """The llama.cpp regexes a tokenizer.json ``pre_tokenizer`` applies, in
    order (as ``BpePre.regexes``); None where it is not a chain of isolating
    splits ending in a byte-level step that adds no prefix space."""
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not steps:
        return None
    out: list[str] = []
    for i, st in enumerate(steps):
        last = i == len(steps) - 1
        kind = st.get("type") if isinstance(st, dict) else None
        if kind == "Digits" and st.get("individual_digits") and not last:
            out.append(_DIGIT)
        elif kind == "Split" and st.get("behavior") == "Isolated" and not st.get("invert") and not last:
            regex = (st.get("pattern") or {}).get("Regex") if isinstance(st.get("pattern"), dict) else None
            if not isinstance(regex, str):
                return None
            for hf, ours in _HF_SPELLINGS:
                regex = regex.replace(hf, ours)
            out.append(_GPT2 if regex == _HF_GPT2 else regex)
        elif kind == "ByteLevel" and last and not st.get("add_prefix_space"):
            if st.get("use_regex", True):
                out.append(_GPT2)
        else:
            return None
    return tuple(out)


def _bpe_pre_name(tok: dict[str, Any], pairs: list[tuple[str, str]], path: Path) -> str:
    """The ``tokenizer.ggml.pre`` under which llama.cpp splits text as the
    tokenizer.json ``tok`` does, and treats a piece that is a whole token as
    it does (``ignore_merges``). Where llama.cpp's flag for that split is not
    the file's, the name is still right if the merges make every token from
    its own text (then the flag changes nothing); else refused."""
    regexes = _pre_regexes(tok.get("pre_tokenizer"))
    groups = [(names[0], spec) for names, spec in _PRE_GROUPS if spec.regexes == regexes]
    if not groups:
        known = ", ".join(names[0] for names, _ in _PRE_GROUPS)
        raise FormatError(path, "pre_tokenizer", f"splits text in a way llama.cpp has no name for (known: {known}); "
                                                 "llama.cpp would tokenize differently")
    ignore = tok["model"].get("ignore_merges", False) is True
    name = next((n for n, spec in groups if spec.ignore_merges == ignore), None)
    if name is not None:
        return name
    added = {t.get("content") for t in tok.get("added_tokens") or [] if isinstance(t, dict)}
    try:
        stray = _token_no_merge_makes(tok["model"]["vocab"], pairs, added)
    except Exception as e:  # the tokenizers library raises its own Exception type
        raise FormatError(path, "model.merges", f"rejected by the BPE model: {e}") from None
    if stray is None:
        return groups[0][0]
    theirs = "ignores" if not ignore else "applies"
    raise FormatError(path, "model.ignore_merges",
                      f"is {str(ignore).lower()}, but llama.cpp's {groups[0][0]!r} {theirs} the merges on a piece that "
                      f"is a whole token, and here that differs (the merges do not make {stray!r} from its text): "
                      "llama.cpp would tokenize differently")


def _token_no_merge_makes(vocab: dict[str, Any], pairs: list[tuple[str, str]], added: set) -> str | None:
    """A vocabulary token that the merges, applied to its own text, do not
    make (None if there is none): only such a token tokenizes differently
    with and without ``ignore_merges``. Added tokens are matched before
    the model runs, so they do not count."""
    from tokenizers import models

    ids = {t: i for t, i in vocab.items() if type(i) is int and i >= 0}
    bpe = models.BPE(vocab=ids, merges=pairs)
    return next((t for t in ids if len(t) > 1 and t not in added and [x.value for x in bpe.tokenize(t)] != [t]), None)


def _spm_space_prefix(tok: dict[str, Any], path: Path) -> bool:
    """Whether a SentencePiece-style tokenizer.json (BPE with byte fallback)
    prepends ``▁`` to the text (llama.cpp's ``add_space_prefix``). Its
    pipeline must be what llama.cpp's SentencePiece tokenizer does: spaces
    become ``▁``, optionally one prepended, as a normalizer (HF's older
    converter) or a non-splitting Metaspace pre-tokenizer (its newer one).
    Gemma's (transformers' GemmaConverter) adds a Split on the string " ",
    which text whose spaces are already ``▁`` never matches: no split."""
    norm, pre = tok.get("normalizer"), tok.get("pre_tokenizer")
    steps = norm.get("normalizers", []) if isinstance(norm, dict) and norm.get("type") == "Sequence" else \
        ([] if norm is None else [norm])
    prepend = bool(steps) and steps[0] == {"type": "Prepend", "prepend": SPM_SPACE}
    rest = steps[1:] if prepend else steps
    replaces = rest == [{"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE}]
    if replaces and (pre is None or (isinstance(pre, dict) and pre.get("type") == "Split"
                                     and pre.get("pattern") == {"String": " "} and not pre.get("invert"))):
        return prepend
    if (norm is None and isinstance(pre, dict) and pre.get("type") == "Metaspace" and pre.get("replacement") == SPM_SPACE
            and not pre.get("split", True) and pre.get("prepend_scheme", "always") in ("always", "first", "never")):
        return pre.get("prepend_scheme", "always") != "never"
    raise FormatError(path, "normalizer", "a byte-fallback BPE tokenizer whose text pipeline is not SentencePiece's "
                                          "(spaces as ▁, optionally one prepended); llama.cpp would tokenize differently")


def _spm_scores(tokens: list[str], types: list[int], merges: list[tuple[str, str]], path: Path) -> list[float]:
    """llama.cpp's SentencePiece tokenizer merges the adjacent pair whose
    joined text is the token of the highest score; a BPE model merges the
    pair of the lowest rank. So a token scores minus the rank of the first
    merge that makes it (0 where no merge does: letters, bytes, controls).
    A token that two others join into but no merge makes would be made by
    llama.cpp and never by the BPE model: refused."""
    first: dict[str, int] = {}
    for rank, (a, b) in enumerate(merges):
        first.setdefault(a + b, rank)
    normal = {t for t, ty in zip(tokens, types) if ty == NORMAL}
    for t in normal:
        if t not in first and any(t[:k] in normal and t[k:] in normal for k in range(1, len(t))):
            raise FormatError(path, "model.merges", f"token {t!r} joins two tokens but no merge makes it: llama.cpp's "
                                                    "SentencePiece tokenizer would make it, this BPE model never does")
    return [-float(first[t] + 1) if t in first and ty == NORMAL else 0.0 for t, ty in zip(tokens, types)]


def gguf_tokenizer_fields(tok_bytes: bytes, tok_config: dict[str, Any], config: dict[str, Any],
                          path: Path) -> dict[str, Any]:
    """``tokenizer.*`` key-values (name -> value) for an artifact's
    tokenizer.json (``path`` names it in errors), its tokenizer_config.json
    (the chat template) and its config.json (BOS/EOS ids). Byte-level BPE
    with a pre-tokenizer llama.cpp knows by name becomes ``gpt2``, as
    convert_hf_to_gguf's ``_set_vocab_gpt2`` stores it; BPE with byte
    fallback and SentencePiece's space convention (Llama 2, Mistral, what
    gguf-to-iebin rebuilds from a ``llama`` vocabulary) becomes ``llama``
    with scores ranked as its merges (``_spm_scores``); anything else is
    refused, since llama.cpp would tokenize differently."""
    try:
        tok = json.loads(tok_bytes)
    except ValueError as e:
        raise FormatError(path, "(file)", f"not JSON: {e}") from None
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise FormatError(path, "model.type", f"{kind!r} tokenizer: only BPE (byte-level, or SentencePiece-style with "
                                              "byte fallback) is exported to GGUF")
    spm = bool(model.get("byte_fallback"))
    prefix = _spm_space_prefix(tok, path) if spm else None
    vocab = model.get("vocab")
    merges = model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise FormatError(path, "model.vocab", "a BPE model needs a vocab object and a merges list")
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ") if isinstance(m, str) else m
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
            raise FormatError(path, f"model.merges[{i}]", f"expected two tokens, got {m!r}")
        pairs.append((parts[0], parts[1]))
    pre = None if spm else _bpe_pre_name(tok, pairs, path)
    added = {t["id"]: t for t in tok.get("added_tokens") or [] if isinstance(t, dict) and type(t.get("id")) is int}
    ids = [i for i in vocab.values() if type(i) is int and i >= 0]
    size = max(max(ids, default=-1), max(added, default=-1)) + 1
    if "vocab_size" in config and type(config["vocab_size"]) is int:
        size = max(size, config["vocab_size"])
    rev = {i: t for t, i in vocab.items()}
    unk = model.get("unk_token")
    tokens, types = [], []
    for i in range(size):
        if i in added:
            tokens.append(added[i]["content"])
            # SentencePiece's unknown piece stays UNKNOWN (the import makes it an added token: llama.cpp matches its text)
            types.append(UNKNOWN if spm and added[i]["content"] == unk else
                         CONTROL if added[i].get("special") else USER_DEFINED)
        elif i in rev:
            t = rev[i]
            tokens.append(t)
            byte = spm and len(t) == 6 and t.startswith("<0x") and t.endswith(">")
            types.append(BYTE if byte else UNKNOWN if spm and t == unk else NORMAL)
        else:  # ids the embedding has and the vocabulary does not name (padding rows)
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
    if len(set(tokens)) != len(tokens):
        raise FormatError(path, "model.vocab", "two ids have the same token text")
    fields: dict[str, Any] = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    if spm:
        _check_piece_lengths(tokens, types, path, "model.vocab")
        scores = _spm_scores(tokens, types, pairs, path)
        kept = tok_config.get("gguf_scores")  # a GGUF vocabulary's own scores, where they still make these merges
        if (isinstance(kept, list) and len(kept) == len(tokens)
                and all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in kept)
                and spm_merges(tokens, types, kept) == pairs):
            scores = [float(s) for s in kept]
        fields.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": scores,
                       "tokenizer.ggml.add_space_prefix": prefix})
    else:
        fields.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                       "tokenizer.ggml.merges": [f"{a} {b}" for a, b in pairs]})
    if unk is None and not spm:  # a byte-level model has none; its tokenizer_config.json may name one
        unk = tok_config.get("unk_token")
        unk = unk.get("content") if isinstance(unk, dict) else unk
    if isinstance(unk, str) and unk in vocab and "unk_token_id" not in config:  # as convert_hf_to_gguf names it
        fields["tokenizer.ggml.unknown_token_id"] = vocab[unk]
    for which, key in (*CONFIG_TOKEN_IDS.items(), ("unk", "unknown")):
        tid = config.get(f"{which}_token_id")
        if isinstance(tid, list):  # several EOS ids: llama.cpp stores one (the first), as its converter does
            tid = tid[0] if tid else None
        if type(tid) is int and 0 <= tid < size:
            fields[f"tokenizer.ggml.{key}_token_id"] = tid
    post = tok.get("post_processor")
    single = post.get("single") if isinstance(post, dict) and post.get("type") == "TemplateProcessing" else None
    if isinstance(single, list) and single:
        fields["tokenizer.ggml.add_bos_token"] = "SpecialToken" in single[0]
        fields["tokenizer.ggml.add_eos_token"] = "SpecialToken" in single[-1]
    else:
        fields["tokenizer.ggml.add_bos_token"] = fields["tokenizer.ggml.add_eos_token"] = False
    fields.update(_chat_template_fields(tok_config.get("chat_template"), path))
    return fields


def _chat_template_fields(template: Any, path: Path) -> dict[str, Any]:
    """tokenizer_config.json's ``chat_template`` (a text, or transformers'
    list of named ones) as llama.cpp's keys, as gguf-py writes them: the
    default as ``tokenizer.chat_template``, each other one as
    ``tokenizer.chat_template.NAME`` (NAME's characters outside [A-Za-z0-9]
    as ``_``), their names in ``tokenizer.chat_templates``."""
    if template is None:
        return {}
    if isinstance(template, str):
        return {_TEMPLATE_KEY: template}
    if not isinstance(template, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                 and isinstance(t.get("template"), str) for t in template):
        raise FormatError(path.with_name("tokenizer_config.json"), "chat_template",
                          "expected a string or a list of {name, template} strings")
    out: dict[str, Any] = {}
    names = []
    for t in template:
        name = "".join(c if c.isascii() and c.isalnum() else "_" for c in t["name"])
        if name == "default":
            out[_TEMPLATE_KEY] = t["template"]
        elif name:
            out[f"{_TEMPLATE_KEY}.{name}"] = t["template"]
            names.append(name)
    if names:
        out["tokenizer.chat_templates"] = names
    return out
