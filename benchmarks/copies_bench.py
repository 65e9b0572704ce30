"""Prefill and decode of an artifact with and without the rows8 copies that
are larger than their stored bytes (the codebook types': iq2_xxs's 4.25
bits a weight for 2.06 stored, iq2_xs's 4.56 for 2.31), as the decoder
makes them where they fit in memory and skips them where they do not
(runtime/expert_copies.py grow_copies): without them a prefill chunk packs
rows8 tiles as it goes and a decode step reads the stored layout.

    python benchmarks/copies_bench.py MODEL_DIR [MODEL_DIR ...] [-p 128] [-n 32] [--threads 2]

Prints one line per model and case: the bytes of rows8 copies, prefill of
-p tokens (one ``logits`` call) and -n decode steps, in tokens/s, the
faster of --rounds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from iekit.runtime import decoder


def speeds(model: Path, grow: bool, a) -> tuple[float, float, float]:
    """(rows8 MB, prefill tok/s, decode tok/s) of model with grow_copies forced to grow."""
    real = decoder.grow_copies
    decoder.grow_copies = lambda *args, **kw: grow and real(*args, **kw)
    try:
        d = decoder.Decoder(model, threads=a.threads, act="int8")
    finally:
        decoder.grow_copies = real
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 30000, a.p + a.n)]
    d.logits(ids[:16])  # warm
    pp = tg = 0.0
    for _ in range(a.rounds):
        t = time.perf_counter()
        d.logits(ids[:a.p])
        pp = max(pp, a.p / (time.perf_counter() - t))
        d.prefill(ids[:1])
        t = time.perf_counter()
        for k in ids[a.p:a.p + a.n]:
            d.step(k)
        tg = max(tg, a.n / (time.perf_counter() - t))
    return d.rows8_bytes / 1e6, pp, tg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="decode steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for m in a.models:
        for grow in (True, False):
            mb, pp, tg = speeds(m, grow, a)
            print(f"{m.name:<12} {'copies' if grow else 'stored':<7} rows8 {mb:7.0f} MB  pp{a.p} {pp:7.1f} tok/s  "
                  f"tg{a.n} {tg:6.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
