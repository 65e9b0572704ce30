"""``ierun microbench``: one kernel's speed against this machine's memory bandwidth.

Both numbers come from the same run: the kernel is timed (median of
``--iters`` calls, rotating through enough weight copies that every call
streams its weights from DRAM), and the plain streaming read (``ierun info
--bandwidth``) is measured with the same thread count, before and after.
Both the weight copies and the read's buffer cover 4x the last-level
cache, at least 256 MiB (cpu_topology.dram_probe_bytes). ``fraction`` =
kernel GB/s / read GB/s, where kernel GB/s = bytes the kernel must read /
time of one call.

Kernel families are looked up in ``KERNELS`` (name -> runner); each runner
checks the options that apply to it and returns the whole JSON result.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import click
from rich.table import Table

from iekit.cli.support import SEED, stdout_console, threads_option
from iekit.formats import weight_types
from iekit.formats.quant import QuantParams

from . import cuda
from .cpu_topology import dram_probe_bytes
from .kernels import native_weight_args
from .memory import available_bytes

# Every weight type with a GEMV kernel (packed ones first), and those with an int8-activation path.
DENSE = weight_types.names(gemv=True, quantized=True) + weight_types.names(gemv=True, quantized=False)
PACKED = weight_types.names(gemv=True, int8_act=True)

# Options that only some kernels read -> those kernels. Given on the command
# line for any other kernel, they are a usage error, never silently ignored.
# (Their click default is None or False, so "given" is "not None/False".)
ONLY_FOR: dict[str, tuple[str, ...]] = {
    "rows": DENSE + ("bsr",), "cols": DENSE + ("bsr",), "min_mib": DENSE + ("bsr",),
    "group_size": ("int4w",), "affine": ("int4w",), "scale_dtype": ("int4w",),
    "act": PACKED, "batch": DENSE, "layout": PACKED,
    "block_rows": ("bsr",), "block_cols": ("bsr",), "density": ("bsr", "dedup"),
    "seed": ("bsr", "dedup"), "nbytes": ("dedup",),
}


def _or(v: Any, default: Any) -> Any:
    return default if v is None else v


def _min_bytes(o: dict[str, Any]) -> int:
    """Weight bytes a CPU kernel rotates through per timing: --min-mib, else the DRAM probe size."""
    return o["min_mib"] << 20 if o["min_mib"] is not None else dram_probe_bytes()


def _run_dense(o: dict[str, Any], device: str = "cpu") -> tuple[dict[str, Any], float]:
    """The dense GEMV family (float and packed weights), on the CPU or, with
    device="cuda", the GPU (act f32, the stored bytes uploaded)."""
    k = o["kernel"]
    rows, cols, batch = _or(o["rows"], 16384), _or(o["cols"], 8192), _or(o["batch"], 1)
    act, layout = _or(o["act"], "f32"), _or(o["layout"], "stored")
    from .native import MAX_BATCH, MAX_ROWS8_BATCH

    max_batch = MAX_BATCH if layout == "stored" else MAX_ROWS8_BATCH
    if not 1 <= batch <= max_batch:
        raise click.UsageError(f"--batch must be 1..{max_batch} with --layout {layout}, got {batch}")
    wt = weight_types.get(k)
    params = (QuantParams(k, _or(o["group_size"], 64) or None, not o["affine"], _or(o["scale_dtype"], "f16"))
              if k == "int4w" else None)
    weights = native_weight_args(wt, rows, cols, params)
    if device == "cuda":
        if act != "f32" or layout != "stored":
            raise click.UsageError("--device cuda runs the float-activation GEMV on the stored layout "
                                   "(no --act int8, no --layout rows8 or packing)")
        r = cuda.bench_gemv(**weights, batch=batch, min_bytes=_or(o["min_mib"], 512) << 20, iters=o["iters"])
        where = {"device": "cuda", "cuda_kernel": r["kernel"]}
    else:
        from .native import bench_gemv

        r = bench_gemv(**weights, act=act, threads=o["threads"], batch=batch,
                       min_bytes=_min_bytes(o), iters=o["iters"], isa=o["isa"], layout=layout)
        where = {"threads": o["threads"], "isa": r["isa"]}
    res = {
        "kernel": k, "rows": rows, "cols": cols, "batch": batch, "act": act, "layout": layout, **where,
        "group_size": r["group_size"] if k == "int4w" else (wt.block_elems if wt.quantized else 0),
        "symmetric": r["symmetric"], "scale_dtype": r["scale_dtype"] if k == "int4w" else None,
        "ms": r["ms_median"], "ms_min": r["ms_min"], "weight_bytes": r["weight_bytes"], "copies": r["copies"],
        "iters": o["iters"],
    }
    return res, r["weight_bytes"] / (r["ms_median"] * 1e-3) / 1e9


def _run_bsr(o: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """BSR GEMV against the dense f32 GEMV of the same matrix (runtime/bench_bsr.py)."""
    from .bench_bsr import bench_bsr

    r = bench_bsr(_or(o["rows"], 4096), _or(o["cols"], 4096), _or(o["block_rows"], 16), _or(o["block_cols"], 16),
                  _or(o["density"], 0.1), o["threads"], _or(o["seed"], 0), iters=o["iters"],
                  min_bytes=_min_bytes(o), isa=o["isa"], bandwidth=False)
    return r, r["gbps"]


def _run_dedup(o: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """Dedup reconstruction of one synthetic member (runtime/bench_dedup.py)."""
    from .bench_dedup import bench_dedup

    r = bench_dedup(nbytes=_or(o["nbytes"], 256) << 20, density=_or(o["density"], 0.01), threads=o["threads"],
                    seed=_or(o["seed"], 0), passes=o["iters"], isa=o["isa"], bandwidth=False)
    return r, r["gbps"]


# name -> runner(options) -> (JSON result without the bandwidth fields, kernel GB/s)
KERNELS: dict[str, Callable[[dict[str, Any]], tuple[dict[str, Any], float]]] = {
    **{name: _run_dense for name in DENSE}, "bsr": _run_bsr, "dedup": _run_dedup}


MAX_ITERS = 1_000_000
MAX_MIB = 65_535  # below the native 64 GiB cap on a benchmark's buffers; the memory available is checked too


def _fraction(_ctx, _param, v: float | None) -> float | None:
    """--density: in (0, 1] (NaN is not)."""
    if v is not None and not 0 < v <= 1:
        raise click.BadParameter(f"{v} is not a fraction in (0, 1]")
    return v


def _check_memory(o: dict[str, Any]) -> None:
    """The buffers a run asks for must fit the memory available: a usage line, not an allocation failure."""
    avail = available_bytes()
    need = max((o["min_mib"] or 0) << 20, 3 * ((o["nbytes"] or 0) << 20))  # dedup: default, member and output
    if avail is not None and need > avail:
        raise click.UsageError(f"--min-mib/--nbytes ask for {need >> 20} MiB of buffers; {avail >> 20} MiB is available")


@click.command()
@click.option("--kernel", required=True, type=click.Choice(list(KERNELS)), help="Kernel (weight format) to time.")
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="Output features (weight rows) [dense 16384, bsr 4096].")
@click.option("--cols", type=click.IntRange(min=1), default=None,
              help="Input features (weight columns) [dense 8192, bsr 4096].")
@threads_option("Threads, for the kernel and the bandwidth yardstick.")
@click.option("--group-size", type=int, default=None, help="int4w group size: 32, 64, 128 or 0 = whole row [64].")
@click.option("--affine", is_flag=True, help="int4w affine (w = s*q + m) instead of symmetric.")
@click.option("--scale-dtype", type=click.Choice(["f16", "f32"]), default=None, help="int4w scale dtype [f16].")
@click.option("--act", type=click.Choice(["f32", "int8"]), default=None,
              help="Packed formats: activations f32 (precise) or int8 (a scale per 32 elements, per 256 for the "
              "super-block types; faster) [f32].")
@click.option("--batch", type=int, default=None, help="Dense kernels: activation rows per call, 1..8 [1]; with --layout rows8 "
              "or packing up to 64 (a decoder's int8 prefill chunk).")
@click.option("--layout", type=click.Choice(["stored", "rows8", "packing"]), default=None,
              help="Packed formats: read the stored layout, the row-interleaved copy a decoder makes at load "
                   "for its act=int8 GEMVs (rows8; needs --act int8 and AVX2), or the stored bytes packed into that "
                   "layout tile by tile as the kernel runs, packing timed (packing: a decoder's experts in an int8 "
                   "prefill chunk) [stored].")
@click.option("--block-rows", type=click.IntRange(min=1), default=None, help="bsr: block rows [16].")
@click.option("--block-cols", type=click.IntRange(min=1), default=None, help="bsr: block columns [16].")
@click.option("--density", type=float, default=None, callback=_fraction,
              help="bsr: fraction of blocks kept [0.1]; dedup: fraction of bytes that differ [0.01].")
@click.option("--nbytes", type=click.IntRange(min=1, max=MAX_MIB), default=None, help="dedup: member size in MiB [256].")
@click.option("--seed", type=SEED, default=None, help="bsr/dedup: seed of the random data [0].")
@click.option("--iters", type=click.IntRange(min=1, max=MAX_ITERS), default=20, show_default=True,
              help="Timed calls (median reported).")
@click.option("--min-mib", type=click.IntRange(min=1, max=MAX_MIB), default=None,
              help="Dense/bsr: weight copies are rotated until their total exceeds this (defeats the LLC) "
                   "[4x the last-level cache, at least 256; --device cuda 512].")
@click.option("--isa", default="", help="Kernel ISA (scalar, avx2, avxvnni: rows8 only, avx512: dedup and rows8, amx: rows8 at --batch 16 or more); a kernel without that variant runs the best one below it; default: best available / IE_ISA.")
@click.option("--device", type=click.Choice(cuda.DEVICES), default="cpu", show_default=True,
              help="cuda: time the dense GEMV kernels on the GPU (a `make build-cuda` build), against the "
                   "device-to-device copy bandwidth measured in the same run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def microbench(as_json: bool, device: str, **o: Any) -> None:
    """Time one kernel and report it as a fraction of memory read bandwidth.

    Dense GEMV kernels (every weight type) report GB/s of
    stored weight bytes; bsr also times the dense f32 GEMV of the same
    matrix (speedup); dedup reports bytes read (default + mask +
    exceptions) per second of reconstruction. With --device cuda the
    yardstick is the device's copy bandwidth (bytes read + written per
    second), measured before and after the kernel.
    """
    if device == "cuda":
        cuda.require("ierun microbench")
        if o["kernel"] not in DENSE:
            raise click.UsageError(f"--device cuda times the dense GEMV kernels ({', '.join(DENSE)}), "
                                   f"not {o['kernel']}")
        _report(o["kernel"], as_json, _with_yardstick(lambda: _run_dense(o, "cuda"), cuda.copy_gbps), "copy")
        return
    from .native import read_bandwidth

    for name, kernels in ONLY_FOR.items():
        if o[name] not in (None, False) and o["kernel"] not in kernels:
            raise click.UsageError(f"--{name.replace('_', '-')} does not apply to --kernel {o['kernel']} "
                                   f"(only {', '.join(kernels)})")
    _check_memory(o)
    measured: list[dict[str, Any]] = []

    def read_gbps() -> float:
        measured.append(read_bandwidth(bytes=dram_probe_bytes(), threads=o["threads"], passes=5))
        return measured[-1]["gbps"]

    res = _with_yardstick(lambda: KERNELS[o["kernel"]](o), read_gbps)
    res["read_bw_bytes"] = measured[0]["bytes"]
    _report(o["kernel"], as_json, res, "read")


def _with_yardstick(run: Callable[[], tuple[dict[str, Any], float]],
                    yardstick: Callable[[], float]) -> dict[str, Any]:
    """The kernel's result with the bandwidth measured before and after it
    (``read_bw_gbps``: their mean) and ``fraction`` = kernel GB/s / that."""
    bw0 = yardstick()
    res, gbps = run()
    bw1 = yardstick()
    bw = (bw0 + bw1) / 2
    res.update(gbps=gbps, read_bw_gbps=bw, read_bw_samples_gbps=[bw0, bw1], fraction=gbps / bw)
    return res


def _report(kernel: str, as_json: bool, res: dict[str, Any], yard: str) -> None:
    """The result as JSON or a table; ``yard`` names the yardstick (read, copy)."""
    if as_json:
        click.echo(json.dumps(res))
        return
    t = Table(title=f"ierun microbench --kernel {kernel}", show_header=False)
    for key, v in res.items():
        if v is None or isinstance(v, list):
            continue
        t.add_row(key, f"{v:.4g}" if isinstance(v, float) else str(v))
    t.add_row(f"[bold]fraction of {yard} bandwidth", f"[bold]{res['fraction']:.1%}")
    stdout_console().print(t)
