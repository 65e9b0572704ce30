"""The calibrated pipeline at Llama-3-8B's shapes: minutes and peak RSS per stage.

Writes a synthetic bf16 checkpoint with Llama-3-8B's config (hidden 4096,
32 heads / 8 KV heads, intermediate 14336, vocab 128256, untied head),
streamed tensor by tensor into --dir, with ``--layers`` of its 32 layers
(the full model is 16 GB; fewer layers give the per-layer slope of each
stage in a fraction of the time and disk). Weights are N(0, 1/fan_in) in
bf16, so activations stay finite through any depth. Calibration and scored
token ids are Zipf-distributed over the vocabulary (the checkpoint has no
tokenizer; the cost of a stage does not depend on which tokens it reads).

Then, each in a child process (child_rss.py: wall seconds, its own peak
RSS), the stages a user runs for a calibrated policy:

    hf-to-iebin (the reference: q8_0, or --ref bf16), imatrix, kl-probes,
    q4-manifest --target-bpw --kl-probes --ref-dir, gptq, ierun eval (against the
    reference)

(``--policy imatrix``: q4-manifest from the imatrix alone, no kl-probes).
It prints one line per stage. With ``--layers`` given twice (``--layers 1,2``)
it also fits each stage's time and peak RSS (and the part of it the stage
allocated, beside the mapped weights) as fixed + per-layer and
extrapolates to the full 32 layers: the figures to read are whether
memory stays flat in depth and time grows linearly.

    python benchmarks/scale_bench.py [--dir /tmp/ie-bench-8b] [--layers 1,2] [--bpw 4.0]
        [--calib-chunks 8] [--chunks 2] [--threads 2] [--policy probes|imatrix] [--keep] [--resume]

A stage stopped (SIGINT to its command, e.g. gptq's hours at 32 layers split
over several sittings) ends this script; ``--resume`` goes on from there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import child_rss  # benchmarks/, beside this script
import synthetic_checkpoint

H, HEADS, KV, HD, INTER, VOCAB, FULL_LAYERS = 4096, 32, 8, 128, 14336, 128256, 32
CHUNK_ROWS = 1024  # rows of a matrix generated at a time (at most 56 MB of float32)


def config(layers: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
            "intermediate_size": INTER, "num_hidden_layers": layers, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": HD, "vocab_size": VOCAB, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"}


def layer_tensors(i: int) -> list[tuple[str, str, list[int]]]:
    p = f"model.layers.{i}."
    return [(p + n, "BF16", shape) for n, shape in (
        ("input_layernorm.weight", [H]), ("post_attention_layernorm.weight", [H]),
        ("self_attn.q_proj.weight", [HEADS * HD, H]), ("self_attn.k_proj.weight", [KV * HD, H]),
        ("self_attn.v_proj.weight", [KV * HD, H]), ("self_attn.o_proj.weight", [H, HEADS * HD]),
        ("mlp.gate_proj.weight", [INTER, H]), ("mlp.up_proj.weight", [INTER, H]),
        ("mlp.down_proj.weight", [H, INTER]))]


def bf16(x: np.ndarray) -> bytes:
    """float32 -> bf16 bytes, rounded to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def write_checkpoint(d: Path, layers: int) -> int:
    """Norms 1, matrices N(0, 1/cols), CHUNK_ROWS rows generated at a time."""
    rng = np.random.default_rng(0)
    shards = [[("model.embed_tokens.weight", "BF16", [VOCAB, H]), ("model.norm.weight", "BF16", [H])],
              *[layer_tensors(i) for i in range(layers)], [("lm_head.weight", "BF16", [VOCAB, H])]]

    def chunks(_name: str, _dtype: str, shape: list[int]):
        if len(shape) == 1:
            yield bf16(np.ones(shape, np.float32))
            return
        rows, cols = shape
        for r in range(0, rows, CHUNK_ROWS):
            yield bf16(rng.standard_normal((min(CHUNK_ROWS, rows - r), cols), np.float32) * cols ** -0.5)

    return synthetic_checkpoint.write_checkpoint(d, config(layers), shards, chunks)


def write_ids(path: Path, n: int, seed: int) -> None:
    """n token ids, Zipf-distributed over the vocabulary (as text's are)."""
    ids = np.random.default_rng(seed).zipf(1.2, n) % VOCAB
    path.write_text(" ".join(map(str, ids)))


def stages(a, d: Path) -> list[tuple[str, list[str], Path | None]]:
    """(stage, command, stdout file) in the order a user runs them."""
    ec, er = str(a.bin / "ieconv"), str(a.bin / "ierun")
    hf, ref, out, t = str(d / "hf"), str(d / "ref"), str(d / "q"), str(a.threads)
    calib, held, im, probes, man = (str(d / n) for n in ("calib.txt", "held.txt", "imatrix.npz", "kl-probes.json",
                                                         "q4_manifest.json"))
    ref_map = str(d / "ref_map.json")
    to_ref = [ec, "hf-to-iebin", "-q", "--overwrite", "--hf-dir", hf, "--out-dir", ref]
    first = [(f"hf-to-iebin ({a.ref} reference)", to_ref, None)]
    if a.ref == "q8_0":  # every matrix but the embedding (a lookup) at q8_0: half the bytes every stage maps
        first = [("q4-manifest (q8_0 reference)", [ec, "q4-manifest", "--overwrite", "--hf-dir", hf, "--scheme", "q8_0",
                                                   "--quantize-head", "-o", ref_map], None),
                 (first[0][0], [*to_ref, "--q4-map", ref_map], None)]
    manifest = [ec, "q4-manifest", "--overwrite", "--hf-dir", hf, "--target-bpw", str(a.bpw), "--quantize-head",
                "--imatrix", im, "--gguf-types", "-o", man]
    policy = [(f"q4-manifest --target-bpw {a.bpw} (imatrix only)", manifest, None)]
    if a.policy == "probes":
        policy = [
            ("kl-probes", [ec, "kl-probes", "-q", "--overwrite", "--hf-dir", hf, "--ref-dir", ref, "--ids-file", calib,
                           "--imatrix", im, "--chunks", str(a.chunks), "--threads", t, "-o", probes], None),
            # measured as gptq will quantize (--ref-dir): a covariance pass and compensated candidates on sampled rows
            (f"q4-manifest --target-bpw {a.bpw} --ref-dir",
             [*manifest, "--kl-probes", probes, "--ref-dir", ref, "--ids-file", calib, "--chunks", str(a.calib_chunks),
              "--threads", t], None)]
    return first + [
        ("imatrix", [ec, "imatrix", "-q", "--overwrite", "--model-dir", ref, "--ids-file", calib, "--chunks",
                     str(a.calib_chunks), "--threads", t, "-o", im], None),
        *policy,
        ("gptq", [ec, "gptq", "-q", "--overwrite", "--hf-dir", hf, "--ref-dir", ref, "--q4-map", man, "--ids-file",
                  calib, "--chunks", str(a.calib_chunks), "--threads", t, "--out-dir", out], None),
        ("ierun eval", [er, "eval", "--model-dir", out, "--ref-dir", ref, "--ids-file", held, "--chunks",
                        str(a.chunks), "--threads", t, "--json"], d / "eval.json"),
    ]


def run_depth(a, layers: int) -> list[dict]:
    d = a.dir / f"layers{layers}"
    log, done_file = d / "log.txt", d / "stages.jsonl"
    done = [json.loads(x) for x in done_file.read_text().splitlines()] if a.resume and done_file.exists() else []
    if not (a.resume and (d / "size.txt").exists()):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        gen_s, _ = child_rss.run([sys.executable, __file__, "--generate", str(d / "hf"), "--layers", str(layers)], log,
                                 d / "size.txt")
        print(f"{layers} layer(s): checkpoint written in {gen_s:.0f} s", file=sys.stderr)
        write_ids(d / "calib.txt", a.calib_chunks * 512, seed=1)
        write_ids(d / "held.txt", a.chunks * 512, seed=2)
    size = int((d / "size.txt").read_text())
    print(f"{layers} layer(s): checkpoint {size / 1e9:.2f} GB", file=sys.stderr)
    rows = []
    for name, cmd, stdout in stages(a, d):
        # --resume: a stage that ended is not run again; one that was stopped (gptq keeps its finished matrices
        # and goes on from them) runs again, its times summed and its peaks the largest
        parts = [r for r in done if r["stage"] == name]
        if parts and not parts[-1].get("stopped"):
            rows.append(parts[-1])
            print(f"  {name:<32} done before: {parts[-1]['minutes']:7.2f} min", file=sys.stderr)
            continue
        anon: list[float] = []
        try:
            secs, rss = child_rss.run(cmd, log, stdout, anon)
        except child_rss.Failed as e:
            row = {"layers": layers, "stage": name, "minutes": e.seconds / 60, "stopped": True}
            with done_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
            raise SystemExit(f"{name} stopped after {e.seconds / 60:.1f} min (--resume goes on): {e}") from None
        row = {"layers": layers, "stage": name, "minutes": (secs + sum(r["minutes"] * 60 for r in parts)) / 60,
               "rss_gib": rss / 1024, "anon_gib": anon[0] / 1024, "runs": len(parts) + 1}
        with done_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        print(f"  {name:<32} {row['minutes']:7.2f} min  peak RSS {rss / 1024:6.2f} GiB, of it allocated "
              f"{anon[0] / 1024:6.2f} GiB{f' (this run; {len(parts) + 1} runs)' if parts else ''}", file=sys.stderr)
    ev = json.loads((d / "eval.json").read_text().strip().splitlines()[-1])
    info = json.loads(subprocess.run([str(a.bin / "ieconv"), "inspect", str(d / "q"), "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    rows.append({"layers": layers, "stage": "result", "checkpoint_gb": size / 1e9, "kld_mean": ev["kld_mean"],
                 "bpw": info["quantized_bits_per_weight"], "by_dtype": info["by_dtype"]})
    if not a.keep:
        shutil.rmtree(d)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ie-bench-8b"))
    ap.add_argument("--layers", default="1,2", help="Layer counts to run, comma-separated (Llama-3-8B has 32).")
    ap.add_argument("--bpw", type=float, default=4.0, help="The policy's --target-bpw.")
    ap.add_argument("--calib-chunks", type=int, default=8, help="512-token chunks for imatrix and gptq.")
    ap.add_argument("--chunks", type=int, default=2, help="512-token chunks scored by kl-probes and eval.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ref", choices=["q8_0", "bf16"], default="q8_0",
                    help="The float reference every stage maps (imatrix, kl-probes and gptq run it; eval scores "
                         "against it): bf16 is the checkpoint itself (16 GB at 32 layers), q8_0 half that.")
    ap.add_argument("--policy", choices=["probes", "imatrix"], default="probes",
                    help="How q4-manifest places the bits: probes (kl-probes, then --kl-probes --ref-dir: the "
                         "calibrated policy, an hour at 32 layers) or imatrix (the imatrix alone: minutes; to time "
                         "the stages after it).")
    ap.add_argument("--keep", action="store_true", help="Keep each depth's checkpoint and artifacts.")
    ap.add_argument("--resume", action="store_true",
                    help="Go on with the depths in --dir: stages that ended are not run again, a stopped one (Ctrl-C "
                         "to its command; gptq resumes from the matrices it kept) runs again. Implies --keep.")
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.keep = a.keep or a.resume
    depths = sorted({int(x) for x in a.layers.split(",")})
    if a.generate:
        print(write_checkpoint(a.generate, depths[0]))
        return
    a.bin = Path(sys.executable).parent
    rows = [r for n in depths for r in run_depth(a, n)]
    for r in rows:
        print(json.dumps(r))
    if len(depths) < 2:
        return
    lo, hi = depths[0], depths[-1]
    print(f"\nfitted as fixed + per layer from {lo} and {hi} layers, extrapolated to Llama-3-8B's {FULL_LAYERS}:")
    print(f"{'stage':<32} {'min/layer':>10} {'min @32':>9} {'RSS GiB/layer':>14} {'RSS @32':>8} {'allocated @32':>14}")
    for name in [r["stage"] for r in rows if r["layers"] == lo and r["stage"] != "result"]:
        x, y = (next(r for r in rows if r["layers"] == n and r["stage"] == name) for n in (lo, hi))
        dm, dg, da = ((y[k] - x[k]) / (hi - lo) for k in ("minutes", "rss_gib", "anon_gib"))
        print(f"{name:<32} {dm:10.3f} {x['minutes'] + dm * (FULL_LAYERS - lo):9.1f} {dg:14.3f} "
              f"{x['rss_gib'] + dg * (FULL_LAYERS - lo):8.2f} {x['anon_gib'] + da * (FULL_LAYERS - lo):14.2f}")


if __name__ == "__main__":
    main()
