"""What benchmarks/mla_shape.py and llama4_shape.py share: a synthetic
checkpoint of random weights (no download) with tiny-llama's tokenizer,
converted by ``ieconv hf-to-iebin`` (bf16, or quantized by a q4-manifest
``--scheme``: q4_0 is llama.cpp's type too, so both sides run the same
blocks), exported by ``ieconv iebin-to-gguf``, and run by ``ierun bench``
and llama.cpp's ``llama-bench`` with llama-bench's tests (pp512, tg32, each
at depth 0 and 4096) on the same threads. Each script gives its layer's
tensors and config."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

import llamacpp

ROOT = Path(__file__).resolve().parents[1]


class Weights:
    """Random float32 tensors (N(0, 0.02), seeded), ones for the norms."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def m(self, *shape: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * 0.02).astype(np.float32)

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    def mamba2(self, pre: str, hidden: int, heads: int, head_dim: int, state: int, groups: int,
               taps: int) -> dict[str, np.ndarray]:
        """A Mamba2 layer's tensors under ``pre`` (Granite 4's mamba., Nemotron-H's mixer.): A_log, D and dt_bias as
        transformers' Mamba2 mixers initialise them (log 1..heads, ones, ones), the taps ten times the others'
        scale."""
        inner = heads * head_dim
        channels = inner + 2 * groups * state
        return {pre + "in_proj.weight": self.m(inner + channels + heads, hidden),
                pre + "conv1d.weight": self.m(channels, 1, taps) * 10, pre + "conv1d.bias": self.m(channels),
                pre + "dt_bias": self.ones(heads), pre + "A_log": np.log(np.arange(1, heads + 1, dtype=np.float32)),
                pre + "D": self.ones(heads), pre + "norm.weight": self.ones(inner),
                pre + "out_proj.weight": self.m(hidden, inner)}

    def attention(self, pre: str, hidden: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, np.ndarray]:
        """An attention layer's q, k, v and o under ``pre``."""
        return {pre + "q_proj.weight": self.m(heads * head_dim, hidden),
                pre + "k_proj.weight": self.m(kv_heads * head_dim, hidden),
                pre + "v_proj.weight": self.m(kv_heads * head_dim, hidden),
                pre + "o_proj.weight": self.m(hidden, heads * head_dim)}


def run(cmd: list[Any]) -> str:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{cmd[0]}: {res.stderr.strip()[-2000:]}")
    return res.stdout


def write_checkpoint(out: Path, hidden: int, layers: Callable[[Weights], dict[str, np.ndarray]],
                     config: dict[str, Any], final_norm: str = "model.norm.weight",
                     embed: str = "model.embed_tokens.weight") -> None:
    """The checkpoint: the embedding (under ``embed``), an untied head, the final norm (under ``final_norm``),
    ``layers(w)``'s tensors and ``config`` (vocab_size and the ids added: tiny-llama's 320 tokens)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "golden/hf/tiny-llama" / f, out / f)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    w = Weights()
    t = {embed: w.m(vocab, hidden), "lm_head.weight": w.m(vocab, hidden),
         final_norm: w.ones(hidden), **layers(w)}
    save_file(dict(sorted(t.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {**config, "hidden_size": hidden, "vocab_size": vocab, "tie_word_embeddings": False, "bos_token_id": 1,
           "eos_token_id": 2, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))


def main(doc: str, checkpoint: Callable[[Path], None]) -> None:
    """The command line of a shape benchmark whose module docstring is ``doc``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scheme", default="bf16", help="bf16, or a q4-manifest --scheme (q4_0: llama.cpp's type too)")
    a = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    checkpoint(a.work / "hf")
    weights: list[Any] = ["--dtype", "bf16"]
    if a.scheme != "bf16":
        run([bin_dir / "ieconv", "q4-manifest", "--overwrite", "--hf-dir", a.work / "hf", "-o", a.work / "q.json",
             "--scheme", a.scheme])
        weights = ["--q4-map", a.work / "q.json"]
    run([bin_dir / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", a.work / "hf", "--out-dir", a.work / "ie",
         *weights])
    run([bin_dir / "ieconv", "iebin-to-gguf", "-q", "--overwrite", "--model-dir", a.work / "ie", "--out",
         a.work / "m.gguf"])
    tests = ["-p", "512", "-n", "32", "-d", "0,4096", "-t", str(a.threads), "-r", "2"]
    print("ierun:")
    print(run([bin_dir / "ierun", "bench", "-m", a.work / "ie", *tests, "-o", "md"]))
    llama_bench = llamacpp.tool("llama-bench")
    if llama_bench:  # (its AMX path crashes where the CPU has AMX: run again without repacking, and say so)
        res, added = llamacpp.run_repack_safe([llama_bench, "-m", str(a.work / "m.gguf"), *tests, "-o", "md"],
                                              ["--repack", "0"])
        if res.returncode != 0:
            sys.exit(f"llama-bench: {res.stderr.strip()[-2000:]}")
        print(f"llama.cpp{f' ({added}: its AMX path crashed)' if added else ''}:")
        print(res.stdout)
    else:
        print("llama.cpp: llama-bench not built (make llamacpp)")
