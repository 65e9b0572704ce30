"""A Hugging Face ``tokenizer.json`` rebuilt from a GGUF file's vocabulary.

llama.cpp stores the tokenizer as key-values: ``tokenizer.ggml.model`` (the
kind), ``tokens``, ``token_type``, ``merges`` (byte-level BPE) or ``scores``
(SentencePiece), the special token ids and ``tokenizer.ggml.pre``, the name
of the pre-tokenizer llama.cpp hard-codes for that model family. Each kind
rebuilt here is the HF pipeline that tokenizes like llama.cpp does:

- ``gpt2`` (byte-level BPE) with pre ``gpt-2``, ``smollm``, ``llama-bpe``,
  ``qwen2``: the pre-tokenizer regexes of llama.cpp's ``llama-vocab.cpp``
  for those names, then byte-level BPE with the stored merges;
- ``llama`` (SentencePiece BPE): merges derived from the scores (a pair
  merges with the priority of the token it forms, as llama.cpp's SPM
  tokenizer does), byte fallback for ``<0xNN>`` tokens, the ``▁`` space
  convention and a prefix space.

Token types: CONTROL (3) becomes a special added token, USER_DEFINED (4) a
non-special added token, matched before the model runs, as in llama.cpp.
``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` become the post-processor.
Any other kind or pre-tokenizer is refused with one line: a tokenizer that
silently splits text differently would make every figure downstream wrong.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from iekit.formats.errors import FormatError

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), by tokenizer.ggml.pre.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre name -> (split on single digits first, regex after; None: ByteLevel's own, which is _GPT2)
BPE_PRE = {"gpt-2": (False, None), "smollm": (True, None), "llama-bpe": (False, _LLAMA3), "qwen2": (False, _QWEN2)}
CONTROL, USER_DEFINED, BYTE = 3, 4, 6
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

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    # llama.cpp's defaults when the file does not say: BOS for SentencePiece and Llama-3's BPE.
    bos_default = kind == "llama" or fields.get("tokenizer.ggml.pre") == "llama-bpe"
    _post_processor(tok, fields, path, tokens, bos_default)
    return (json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _get(fields: dict[str, Any], path: Path, key: str, typ: type) -> Any:
    if key not in fields:
        raise FormatError(path, key, "is missing; cannot rebuild the tokenizer")
    v = fields[key]
    if not isinstance(v, typ) or isinstance(v, bool):
        raise FormatError(path, key, f"expected {typ.__name__}, got {type(v).__name__}")
    return v


def _byte_level_bpe(fields: dict[str, Any], path: Path, tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in BPE_PRE:
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
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs))
    except Exception as e:  # the tokenizers library raises its own Exception type (a panic: library_calls)
        raise FormatError(path, "tokenizer.ggml.merges", f"rejected by the BPE model: {e}") from None
    digits, regex = BPE_PRE[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
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


def tokenizer_config_json(fields: dict[str, Any], path: Path) -> bytes | None:
    """A ``tokenizer_config.json`` carrying the file's chat template
    (``tokenizer.chat_template``) and the text of its BOS/EOS tokens, which
    templates refer to, and a SentencePiece vocabulary's scores
    (``gguf_scores``: the BPE merges are made from them but cannot hold
    them, and iebin-to-gguf writes them back as they were); None when there
    is neither."""
    template = fields.get("tokenizer.chat_template")
    scores = fields.get("tokenizer.ggml.scores") if fields.get("tokenizer.ggml.model") == "llama" else None
    if template is None and scores is None:
        return None
    if template is not None and not isinstance(template, str):
        raise FormatError(path, "tokenizer.chat_template", f"expected a string, got {type(template).__name__}")
    tokens = fields.get("tokenizer.ggml.tokens") or []
    cfg: dict[str, Any] = {} if template is None else {"chat_template": template}
    if scores is not None:  # checked by tokenizer_json, which runs first
        cfg["gguf_scores"] = [float(s) for s in scores]
    for which in ("bos", "eos"):
        tid = fields.get(f"tokenizer.ggml.{which}_token_id")
        if type(tid) is int and 0 <= tid < len(tokens):
            cfg[f"{which}_token"] = tokens[tid]
    return (json.dumps(cfg, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


# --- the other way: a tokenizer.json as llama.cpp's tokenizer.ggml.* key-values ---

NORMAL, UNKNOWN, UNUSED = 1, 2, 5
# Hugging Face writes the case-insensitive contractions as (?i:...); llama.cpp spells each case out.
_HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMACPP_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"


def _bpe_pre_name(pre: Any) -> str | None:
    """The llama.cpp pre-tokenizer name whose pipeline ``pre`` (a
    tokenizer.json ``pre_tokenizer``) is: the inverse of ``BPE_PRE``. The
    digit split and the regex decide; offsets and prefix-space flags that do
    not change the split are not compared."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    digits = False
    if steps and isinstance(steps[0], dict) and steps[0].get("type") == "Digits":
        if not steps[0].get("individual_digits"):
            return None
        digits, steps = True, steps[1:]
    if len(steps) == 1 and isinstance(steps[0], dict) and steps[0].get("type") == "ByteLevel":
        regex = None if steps[0].get("use_regex", True) and not steps[0].get("add_prefix_space") else "?"
    elif (len(steps) == 2 and isinstance(steps[0], dict) and steps[0].get("type") == "Split"
          and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
          and isinstance(steps[1], dict) and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex", True)
          and not steps[1].get("add_prefix_space")):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        if isinstance(regex, str) and regex.startswith(_HF_CONTRACTIONS):  # HF's spelling of the same regex
            regex = _LLAMACPP_CONTRACTIONS + regex[len(_HF_CONTRACTIONS):]
    else:
        return None
    return next((name for name, sig in BPE_PRE.items() if sig == (digits, regex)), None)


def _spm_space_prefix(tok: dict[str, Any], path: Path) -> bool:
    """Whether a SentencePiece-style tokenizer.json (BPE with byte fallback)
    prepends ``▁`` to the text (llama.cpp's ``add_space_prefix``). Its
    pipeline must be what llama.cpp's SentencePiece tokenizer does: spaces
    become ``▁``, optionally one prepended, as a normalizer (HF's older
    converter) or a non-splitting Metaspace pre-tokenizer (its newer one)."""
    norm, pre = tok.get("normalizer"), tok.get("pre_tokenizer")
    steps = norm.get("normalizers", []) if isinstance(norm, dict) and norm.get("type") == "Sequence" else \
        ([] if norm is None else [norm])
    prepend = bool(steps) and steps[0] == {"type": "Prepend", "prepend": SPM_SPACE}
    rest = steps[1:] if prepend else steps
    replaces = rest == [{"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE}]
    if pre is None and replaces:
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
    pre = None if spm else _bpe_pre_name(tok.get("pre_tokenizer"))
    if not spm and pre is None:
        raise FormatError(path, "pre_tokenizer", "splits text in a way llama.cpp has no name for (known: "
                                                 f"{', '.join(BPE_PRE)}); llama.cpp would tokenize differently")
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
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
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
    if spm and isinstance(unk, str) and unk in vocab and "unk_token_id" not in config:
        fields["tokenizer.ggml.unknown_token_id"] = vocab[unk]
    for which, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
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
    template = tok_config.get("chat_template")
    if isinstance(template, str):
        fields["tokenizer.chat_template"] = template
    return fields
