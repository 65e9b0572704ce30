"""GPU GEMV speed as a fraction of the device's copy bandwidth (docs/cuda.md).

For each weight type at the decode shapes the issue names (4096 x 14336
and 14336 x 4096), batch 1 (and 4, 8), times `_native.cuda_bench_gemv`:
the median of --iters repeats, each one GEMV per weight copy back to back
between two CUDA events, the copies together several times the L2, so
every call streams its weights from HBM. The yardstick is a
device-to-device copy measured in the same process before and after
(bytes read + bytes written per second). --sweep also times every split of
a row over 1, 2, 4 and 8 warps and (planar 4-bit) every row-group size R at
batch 1, to check the defaults' choice.
Prints one JSON line per case and a table last.

    python benchmarks/cuda_gemv.py [--iters 30] [--sweep] [--types q4_k,...] [--batches 1,4,8]
                                   [--min-mb 512] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json

from iekit.runtime import cuda

SHAPES = [(4096, 14336), (14336, 4096)]
PLANAR4 = ("int4w", "q4_0", "q4_1")  # the types whose row-group size R can be tuned
# (label, dtype, group_size, symmetric)
TYPES = [("int4w-g32", "int4w", 32, True), ("int4w-g128", "int4w", 128, True), ("int4w-g32-aff", "int4w", 32, False),
         ("q4_0", "q4_0", 0, True), ("q4_1", "q4_1", 0, True), ("q8_0", "q8_0", 0, True), ("bf16", "bf16", 0, True),
         ("f16", "f16", 0, True), ("f32", "f32", 0, True), ("q4_k", "q4_k", 0, True), ("q6_k", "q6_k", 0, True),
         ("q3_k", "q3_k", 0, True), ("q2_k", "q2_k", 0, True), ("iq3_s", "iq3_s", 0, True), ("iq3_xxs", "iq3_xxs", 0, True), ("iq2_xxs", "iq2_xxs", 0, True),
         ("iq2_xs", "iq2_xs", 0, True), ("iq2_s", "iq2_s", 0, True), ("iq1_s", "iq1_s", 0, True),
         ("iq1_m", "iq1_m", 0, True),
         ("iq4_xsh", "iq4_xsh", 0, True), ("q5_k", "q5_k", 0, True), ("iq4_xs", "iq4_xs", 0, True),
         ("iq4_nl", "iq4_nl", 0, True), ("mxfp4", "mxfp4", 0, True), ("q5_0", "q5_0", 0, True)]


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--sweep", action="store_true", help="also time each warps-per-row split at batch 1")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--types", default="", help="comma-separated labels to run (default: all)")
    ap.add_argument("--min-mb", type=positive_int, default=512, metavar="MIB",
                    help="weight copies per case together at least this many MiB (several times the L2)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    cuda.require("cuda_gemv.py")
    copy0 = cuda.copy_gbps()
    rows_out = []
    for label, dtype, gs, sym in TYPES:
        if args.types and label not in args.types.split(","):
            continue
        for rows, cols in SHAPES:
            for batch in map(int, args.batches.split(",")):
                sweep = args.sweep and batch == 1
                p4 = dtype in PLANAR4
                tunings = [(w, r) for w in (0, 1, 2, 4, 8) for r in ((0, 1, 2, 4) if p4 else (0,))
                           ] if sweep else [(0, 0)]
                for split, rpg in tunings:
                    r = cuda.bench_gemv(dtype=dtype, rows=rows, cols=cols, group_size=gs, symmetric=sym,
                                        scale_dtype="f16", batch=batch, min_bytes=args.min_mb << 20, iters=args.iters,
                                        split=split, rows_per_group=rpg)
                    gbps = r["weight_bytes"] / (r["ms_median"] * 1e-3) / 1e9
                    rec = {"type": label, "rows": rows, "cols": cols, "batch": batch, "split": split, "R": rpg,
                           "kernel": r["kernel"], "us": r["ms_median"] * 1e3, "us_min": r["ms_min"] * 1e3,
                           "weight_bytes": r["weight_bytes"], "copies": r["copies"], "gbps": gbps}
                    rows_out.append(rec)
                    print(json.dumps(rec), flush=True)
    copy1 = cuda.copy_gbps()
    copy = (copy0 + copy1) / 2
    for rec in rows_out:
        rec["copy_gbps"] = copy
        rec["fraction"] = rec["gbps"] / copy
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"copy_gbps": [copy0, copy1], "cases": rows_out}, f, indent=1)
    print(f"copy bandwidth {copy0:.0f} / {copy1:.0f} GB/s (read + write), before / after")
    print(f"{'type':<14} {'shape':>12} {'b':>2} {'W':>2} {'R':>2} {'kernel':<8} {'us':>8} {'GB/s':>7} {'of copy':>8}")
    for r in rows_out:
        print(f"{r['type']:<14} {r['rows']:>5}x{r['cols']:<6} {r['batch']:>2} {r['split'] or 'a':>2} {r['R'] or 'a':>2} "
              f"{r['kernel']:<8} "
              f"{r['us']:>8.1f} {r['gbps']:>7.0f} {r['fraction']:>8.1%}")


if __name__ == "__main__":
    main()
