"""What dedup-pack saves on a layer-duplicated merge: directory size, decode
peak RSS and decode speed beside the plain model.

Builds (in a temporary directory, never in the repository) a Llama-shaped
f32 checkpoint whose --layers layers are near copies of --unique base layers
(layer i is base i % unique with --redraw of its elements drawn anew: a
"layer-duplicated merge"), converts it with `ieconv hf-to-iebin`, packs it
with `ieconv dedup-pack` (planning included), checks `ieconv validate --deep`
on the packed model, and runs `ierun bench` on both: the plain model, and the
packed one with IE_DEDUP_CACHE_MB=0 (fused GEMV: no member is ever rebuilt
whole). Prints one JSON line: the sizes and their ratio, and per run the
median tokens/s, peak RSS and MB read per token over the rounds.

    python benchmarks/dedup_pack.py [--hidden 512] [--layers 16] [--unique 4] [--redraw 0.005]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from iekit.runtime.env import DedupConfig

BIN = Path(sys.executable).parent
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "hf" / "tiny-llama"


def build_checkpoint(hf: Path, hidden: int, inter: int, layers: int, unique: int, vocab: int, redraw: float) -> None:
    from safetensors.numpy import save_file

    hf.mkdir(parents=True)
    cfg = json.loads((GOLDEN / "config.json").read_text())
    heads = hidden // 64
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=heads, head_dim=64, vocab_size=vocab, max_position_embeddings=512)
    (hf / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden),
              "self_attn.v_proj": (hidden, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    base = [{k: (rng.standard_normal(s) * 0.02).astype(np.float32) for k, s in shapes.items()} for _ in range(unique)]
    w = {"model.embed_tokens.weight": (rng.standard_normal((vocab, hidden)) * 0.02).astype(np.float32),
         "lm_head.weight": (rng.standard_normal((vocab, hidden)) * 0.02).astype(np.float32),
         "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        for k, b in base[i % unique].items():
            x = b.copy().reshape(-1)
            idx = rng.choice(x.size, int(x.size * redraw), replace=False)
            x[idx] = (rng.standard_normal(idx.size) * 0.02).astype(np.float32)
            w[f"model.layers.{i}.{k}.weight"] = x.reshape(b.shape)
        for n in ("input_layernorm", "post_attention_layernorm"):
            w[f"model.layers.{i}.{n}.weight"] = np.ones(hidden, np.float32)
    save_file(w, str(hf / "model.safetensors"))


def run(*args: object, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file() and not p.is_symlink())


def bench_round(model: Path, env: dict[str, str], prompts: Path, threads: int) -> dict[str, float]:
    out = run(BIN / "ierun", "bench", "--model-dir", model, "--prompts-file", prompts, "--threads", threads,
              "--rounds", 1, "--max-new", 32, "--ignore-eos", env=env)
    return next(json.loads(x) for x in out.splitlines() if x.startswith("{"))


def summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {"tps": statistics.median(x["tps_true"] for x in rounds),
            "decode_ms_p50": statistics.median(x["latency_p50_ms"] for x in rounds),
            # What the machine streamed while decoding: the plain model is
            # bandwidth-bound, the fused one (defaults shared by k layers, hot
            # in the LLC) rebuild-bound, so their ratio tracks this figure.
            "decode_gbps": statistics.median(x["decode_gbps"] or 0.0 for x in rounds),
            "rss_peak_mb": max(x["rss_peak_mb"] for x in rounds),
            "mb_per_token": statistics.median(x["mb_per_token"] for x in rounds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=1408)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--unique", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--redraw", type=float, default=0.005)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="iekit-dedup-pack-"))
    try:
        hf, plain, packed = tmp / "hf", tmp / "plain", tmp / "packed"
        build_checkpoint(hf, a.hidden, a.inter, a.layers, a.unique, a.vocab, a.redraw)
        run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", plain)
        pack = json.loads(run(BIN / "ieconv", "dedup-pack", "--json", "--model-dir", plain, "--out-dir", packed))
        run(BIN / "ieconv", "validate", "--deep", packed)
        prompts = tmp / "prompts.txt"
        prompts.write_text("ids: 1,2,3,4,5,6,7,8\nids: 9,10,11,12\n")
        res = {"config": vars(a), "plain_dir_bytes": dir_bytes(plain), "packed_dir_bytes": dir_bytes(packed),
               "groups": pack["groups"], "grouped_tensors": pack["members"], "pack_seconds": pack["seconds"]}
        res["dir_ratio"] = res["packed_dir_bytes"] / res["plain_dir_bytes"]
        # Rounds alternate between the two models, so a machine whose speed
        # drifts (shared hosts swing 1.5x from minute to minute) slows both
        # alike; the speed ratio is the median of the per-pair ratios.
        runs: dict[str, list] = {"plain": [], "packed_cache0": []}
        for _ in range(a.rounds):
            runs["plain"].append(bench_round(plain, {}, prompts, a.threads))
            runs["packed_cache0"].append(bench_round(packed, DedupConfig(cache_mb=0).as_env(), prompts, a.threads))
        for k, v in runs.items():
            res[k] = summary(v)
        res["rss_ratio"] = res["packed_cache0"]["rss_peak_mb"] / res["plain"]["rss_peak_mb"]
        res["tps_ratio"] = statistics.median(
            q["tps_true"] / p["tps_true"] for p, q in zip(runs["plain"], runs["packed_cache0"]))
        print(json.dumps(res, sort_keys=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
