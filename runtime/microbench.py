"""``ierun microbench``: one kernel's speed against this machine's memory bandwidth.

Both numbers come from the same run: the kernel is timed (median of
``--iters`` calls, rotating through enough weight copies that every call
streams its weights from DRAM), and the plain streaming read (``ierun info
--bandwidth``) is measured with the same thread count on a >= 256 MiB
buffer, before and after. ``fraction`` = kernel GB/s / read GB/s, where
kernel GB/s = bytes the kernel must read / time of one call.

Kernel families are looked up in ``KERNELS`` (name -> runner); each runner
checks the options that apply to it and returns the whole JSON result.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

READ_BW_MIN_BYTES = 256 << 20

DENSE = ("int4w", "q4_0", "q4_1", "q8_0", "f32", "f16", "bf16")


def _run_dense(o: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The dense GEMV family (float and packed weights)."""
    from .native import bench_gemv

    k = o["kernel"]
    _no_opts(o, k, ("block_rows", "block_cols", "density", "nbytes"))
    if k != "int4w":
        for opt, val, default in (("--group-size", o["group_size"], None), ("--scale-dtype", o["scale_dtype"], None)):
            if val is not default and not (opt == "--group-size" and k in ("q4_0", "q4_1", "q8_0") and val == 32):
                raise click.UsageError(f"{opt} applies to --kernel int4w only")
        if o["affine"]:
            raise click.UsageError("--affine applies to --kernel int4w only")
    gs = o["group_size"] if o["group_size"] is not None else 64
    r = bench_gemv(k, o["rows"], o["cols"],
                   group_size=(gs or o["cols"]) if k == "int4w" else 0,
                   symmetric=not o["affine"], scale_dtype=o["scale_dtype"] or "f16", act=o["act"],
                   threads=o["threads"], batch=o["batch"], min_bytes=o["min_mib"] << 20, iters=o["iters"],
                   isa=o["isa"])
    res = {
        "kernel": k, "rows": o["rows"], "cols": o["cols"], "threads": o["threads"], "batch": o["batch"],
        "act": o["act"], "isa": r["isa"],
        "group_size": r["group_size"] if k == "int4w" else (32 if k in ("q4_0", "q4_1", "q8_0") else 0),
        "symmetric": r["symmetric"], "scale_dtype": r["scale_dtype"] if k == "int4w" else None,
        "ms": r["ms_median"], "ms_min": r["ms_min"], "weight_bytes": r["weight_bytes"], "copies": r["copies"],
        "iters": o["iters"],
    }
    return res, r["weight_bytes"] / (r["ms_median"] * 1e-3) / 1e9


def _no_opts(o: dict[str, Any], kernel: str, names: tuple[str, ...]) -> None:
    for n in names:
        if o[n] is not None:
            raise click.UsageError(f"--{n.replace('_', '-')} does not apply to --kernel {kernel}")


def _run_bsr(o: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """BSR GEMV against the dense f32 GEMV of the same matrix (runtime/bench_bsr.py)."""
    from .bench_bsr import bench_bsr

    _no_opts(o, "bsr", ("group_size", "scale_dtype", "nbytes"))
    r = bench_bsr(o["rows"], o["cols"], o["block_rows"], o["block_cols"],
                  0.1 if o["density"] is None else o["density"], o["threads"], o["seed"],
                  iters=o["iters"], min_bytes=o["min_mib"] << 20, isa=o["isa"], bandwidth=False)
    return r, r["gbps"]


def _run_dedup(o: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """Dedup reconstruction of one synthetic member (runtime/bench_dedup.py)."""
    from .bench_dedup import bench_dedup

    _no_opts(o, "dedup", ("rows", "cols", "group_size", "scale_dtype", "block_rows", "block_cols"))
    r = bench_dedup(nbytes=(o["nbytes"] or 256) << 20, density=0.01 if o["density"] is None else o["density"],
                    threads=o["threads"], seed=o["seed"], passes=o["iters"], isa=o["isa"], bandwidth=False)
    return r, r["gbps"]


# name -> runner(options) -> (JSON result without the bandwidth fields, kernel GB/s)
KERNELS: dict[str, Callable[[dict[str, Any]], tuple[dict[str, Any], float]]] = {
    **{name: _run_dense for name in DENSE}, "bsr": _run_bsr, "dedup": _run_dedup}


@click.command()
@click.option("--kernel", required=True, type=click.Choice(list(KERNELS)), help="Kernel (weight format) to time.")
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="Output features (weight rows) [dense 16384, bsr 4096].")
@click.option("--cols", type=click.IntRange(min=1), default=None,
              help="Input features (weight columns) [dense 8192, bsr 4096].")
@click.option("--threads", default=1, show_default=True, help="Threads, for the kernel and the bandwidth yardstick.")
@click.option("--group-size", type=int, default=None, help="int4w group size: 32, 64, 128 or 0 = whole row [64].")
@click.option("--affine", is_flag=True, help="int4w affine (w = s*q + m) instead of symmetric.")
@click.option("--scale-dtype", type=click.Choice(["f16", "f32"]), default=None, help="int4w scale dtype [f16].")
@click.option("--act", type=click.Choice(["f32", "int8"]), default="f32", show_default=True,
              help="Activations: f32 (precise) or int8 (quantized per 32, faster; packed formats only).")
@click.option("--batch", default=1, show_default=True, help="Activation rows per call (1..8).")
@click.option("--block-rows", type=click.IntRange(min=1), default=None, help="bsr: block rows [16].")
@click.option("--block-cols", type=click.IntRange(min=1), default=None, help="bsr: block columns [16].")
@click.option("--density", type=float, default=None,
              help="bsr: fraction of blocks kept [0.1]; dedup: fraction of bytes that differ [0.01].")
@click.option("--nbytes", type=click.IntRange(min=1), default=None, help="dedup: member size in MiB [256].")
@click.option("--seed", default=0, show_default=True, help="bsr/dedup: seed of the random data.")
@click.option("--iters", default=20, show_default=True, help="Timed calls (median reported).")
@click.option("--min-mib", default=256, show_default=True,
              help="Weight copies are rotated until their total exceeds this (defeats the LLC).")
@click.option("--isa", default="", help="Kernel ISA (scalar, avx2, avx512: dedup only, the others use avx2 there); default: best available / IE_ISA.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def microbench(as_json: bool, **o: Any) -> None:
    """Time one kernel and report it as a fraction of memory read bandwidth.

    Dense GEMV kernels (f32 f16 bf16 int4w q4_0 q4_1 q8_0) report GB/s of
    stored weight bytes; bsr also times the dense f32 GEMV of the same
    matrix (speedup); dedup reports bytes read (default + mask +
    exceptions) per second of reconstruction.
    """
    from .native import read_bandwidth

    if not 1 <= o["batch"] <= 8:
        raise click.UsageError(f"--batch must be 1..8, got {o['batch']}")
    if o["threads"] < 1:
        raise click.UsageError(f"--threads must be >= 1, got {o['threads']}")
    if o["kernel"] == "bsr":
        o["block_rows"] = o["block_rows"] or 16
        o["block_cols"] = o["block_cols"] or 16
        o["rows"], o["cols"] = o["rows"] or 4096, o["cols"] or 4096
    elif o["kernel"] != "dedup":
        o["rows"], o["cols"] = o["rows"] or 16384, o["cols"] or 8192
    bw0 = read_bandwidth(bytes=READ_BW_MIN_BYTES, threads=o["threads"], passes=5)
    res, gbps = KERNELS[o["kernel"]](o)
    bw1 = read_bandwidth(bytes=READ_BW_MIN_BYTES, threads=o["threads"], passes=5)
    read_bw = (bw0["gbps"] + bw1["gbps"]) / 2
    res.update(gbps=gbps, read_bw_gbps=read_bw, read_bw_samples_gbps=[bw0["gbps"], bw1["gbps"]],
               read_bw_bytes=bw0["bytes"], fraction=gbps / read_bw)
    if as_json:
        click.echo(json.dumps(res))
        return
    t = Table(title=f"ierun microbench --kernel {o['kernel']}", show_header=False)
    for key, v in res.items():
        if v is None or isinstance(v, list):
            continue
        t.add_row(key, f"{v:.4g}" if isinstance(v, float) else str(v))
    t.add_row("[bold]fraction of read bandwidth", f"[bold]{res['fraction']:.1%}")
    Console(highlight=False).print(t)
