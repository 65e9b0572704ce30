"""golden/gguf/pretokenizer-llamacpp-ids.json: llama.cpp's own token ids for
the same strings under one byte-level BPE vocabulary and each pre-tokenizer
llama.cpp knows by a different split (``tokenizer.ggml.pre``).

The reference for gguf-to-iebin's rebuilt tokenizers: a GGUF is written for
each pre-tokenizer (and once more under a Phi-3 name, for which llama.cpp
strips the whitespace after special tokens) (tests/gguf_build.py's ``gguf_from_hf``, the tiny-llama
weights, the vocabulary in ``pretokenizer-vocab.json``), and llama.cpp's
``llama-tokenize`` (vocab only, special tokens parsed, its BOS rule) gives
the ids. The vocabulary is a byte-level BPE trained on the strings without
any pre-split, so its merges cross the boundaries the pre-tokenizers draw,
less the merges that make ten of its tokens (so that llama.cpp's ``ignore_merges`` shows).
The tests only read the two JSON files; to regenerate, after
``make llamacpp`` and ``ninja -C build/llamacpp llama-tokenize``:

    .venv/bin/python golden/gguf/make_pretokenizer_ids.py
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from gguf_build import gguf_from_hf  # noqa: E402

VOCAB = HERE / "pretokenizer-vocab.json"
OUT = HERE / "pretokenizer-llamacpp-ids.json"
# One name per distinct split (and ignore_merges / BOS rule) in llama.cpp's llama-vocab.cpp; and GPT-2's split
# in a model named Phi-3, for which llama.cpp drops the whitespace after most special tokens.
PRES = ["gpt-2", "smollm", "llama-bpe", "smaug-bpe", "qwen2", "gpt-4o", "tekken", "deepseek-llm", "deepseek-coder",
        "deepseek-v3", "kimi-k2", "afmoe", "youtu", "default"]
# Names llama.cpp gives another's split (its label says whose: the tests tell apart the splits, not the names)
ALIASES = {"hunyuan (qwen2's split)": "hunyuan", "hunyuan-dense (deepseek-v3's split)": "hunyuan-dense",
           "hy_v4 (deepseek-v3's split)": "hy_v4", "joyai-llm (deepseek-v3's split)": "joyai-llm",
           "solar-open (qwen2's split)": "solar-open"}
CASES = {**{p: {"pre": p} for p in PRES}, "gpt-2 named Phi3": {"pre": "gpt-2", "general.name": "Phi3"},
         **{label: {"pre": p} for label, p in ALIASES.items()}}
PIECES = ["the", " quick", "Brown", " fox", "'s", "'LL", " don't", " It'S", "12345", " 7", "3.14", "1234567",
          "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "   \n", "café", " naïve", "Ünïcödé", "ÉTÉ", "éÉ",
          " Straße", " ΑΒΓαβγ", " Привет", "мир", "e\u0301", "日本語", " 中文字符", "ひらがな", "カタカナ", "한국어", "😀", "!!",
          "?", " ...", "-", "$5", "x2", "_", " ", "a", "Z", "0", "99 bottles", "e-mail", "(x)", "#1", "€",
          "HTTPServer", " CamelCase", "iPhone", " getURL", "/usr/bin", "a/b/c", "//", "C++", "foo_bar",
          "@user", "١٢٣", "²", "Ⅻ", "<s>", "</s>", "<|endoftext|>", "<tool>", " def f(x):", "    return x",
          "https://example.com/a?b=1", "«»", "—", "ＡＢＣ", "ｶﾀｶﾅ"]


def strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def train() -> dict:
    """A byte-level BPE without pre-split, plus whole pieces no merge makes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<s>", "</s>", "<unk>", "<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(strings(6000, seed=1), trainer)
    tok.add_tokens(["<tool>"])  # a user-defined (non-special) added token
    spec = json.loads(tok.to_str())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    whole = {byte_level.pre_tokenize_str(p)[0][0] for p in (" quick", "Brown", " naïve", " fox", "ÉTÉ", " Привет",
                                                             "日本語", " CamelCase", "iPhone", "1234567")}
    assert whole <= spec["model"]["vocab"].keys(), "the training no longer makes these tokens: pick others"
    spec["model"]["merges"] = [m for m in spec["model"]["merges"] if "".join(m) not in whole]
    return spec


def llama_tokenize(gguf: Path, text: str, work: Path) -> list[int]:
    exe = ROOT / "build/llamacpp/bin/llama-tokenize"
    f = work / "prompt.txt"
    f.write_bytes(text.encode("utf-8"))
    out = subprocess.run([str(exe), "-m", str(gguf), "-f", str(f), "--ids", "--log-disable"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    spec = train()
    VOCAB.write_text(json.dumps(spec, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    texts = strings(400, seed=7) + ["a<tool>b", "<s>x</s>", " quick", "HTTPServer", "ÉTÉéÉ", "a</s>  x\n</s>\n"]
    head = {"vocab_sha256": hashlib.sha256(VOCAB.read_bytes()).hexdigest(), "texts": texts, "cases": CASES}
    ids = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for label, case in CASES.items():
            extra = {"general.name": ("string", case["general.name"])} if "general.name" in case else None
            gguf = gguf_from_hf(ROOT / "golden/hf/tiny-llama", work / "m.gguf", pre=case["pre"], tokenizer=spec,
                                extra_kv=extra)
            ids[label] = [llama_tokenize(gguf, t, work) for t in texts]
            print(f"{label}: {sum(map(len, ids[label]))} ids", flush=True)
    lines = ",\n".join(f"{json.dumps(p)}: {json.dumps(v)}" for p, v in ids.items())
    OUT.write_text(json.dumps(head, ensure_ascii=False)[:-1] + ', "ids": {\n' + lines + "\n}}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
