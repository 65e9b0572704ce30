"""BSR GEMV vs dense float32 GEMV on the same matrix (for ``ierun microbench --kernel bsr``).

What a block-sparse matrix buys is bytes not read, so the time of one GEMV
should scale with the stored density. Both kernels are timed the same way:
single calls from Python (the call overhead, a few microseconds, is the same
for both), rotating through enough copies of the weights (> ``min_bytes``,
by default 4x the last-level cache and at least 256 MiB:
cpu_topology.dram_probe_bytes) that every call streams its matrix from
DRAM rather than from cache. The median is reported, next to
the machine's read bandwidth measured in the same run, so a number can be
judged as a fraction of what the memory can deliver.

The dense side is the runtime's own f32 GEMV (``_native.gemv``) on the
reference's dense form of the same matrix.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from iekit.formats import bsr

from .cpu_topology import dram_probe_bytes
from .kernels import max_rel_error
from .native import _native


def random_bsr(rng: np.random.Generator, rows: int, cols: int, br: int, bc: int, density: float) -> bsr.BsrMatrix:
    """ceil(density × blocks) blocks at uniformly random positions, N(0, 1)
    values, zero padding in the tail blocks (the reference matrix; the
    kernel runs on ``native(m)``)."""
    nbr, nbc = -(-rows // br), -(-cols // bc)
    total = nbr * nbc
    k = max(1, bsr.keep_count(density, total))
    chosen = np.sort(rng.choice(total, size=k, replace=False))
    r, c = chosen // nbc, chosen % nbc
    row_ptr = np.zeros(nbr + 1, np.uint32)
    row_ptr[1:] = np.cumsum(np.bincount(r, minlength=nbr))
    values = rng.standard_normal((k, br, bc), dtype=np.float32)
    if rows % br:
        values[r == nbr - 1, rows % br:, :] = 0
    if cols % bc:
        values[c == nbc - 1, :, cols % bc:] = 0
    return bsr.BsrMatrix(rows, cols, br, bc, row_ptr, c.astype(np.uint32), values)


def native(m: bsr.BsrMatrix):
    return _native.BsrMatrix(m.rows, m.cols, m.block_rows, m.block_cols, m.row_ptr, m.col_idx, m.values)


def _time(calls: list, iters: int) -> list[float]:
    """Milliseconds of `iters` calls, cycling through `calls` (one warm-up pass first)."""
    for f in calls:
        f()
    out = []
    for i in range(iters):
        f = calls[i % len(calls)]
        t0 = time.perf_counter_ns()
        f()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def bench_bsr(rows: int, cols: int, block_rows: int, block_cols: int, density: float, threads: int, seed: int,
              *, iters: int = 40, min_bytes: int | None = None, isa: str = "", bandwidth: bool = True) -> dict:
    """Time y = A x for a random BSR matrix of the given density and for the same
    matrix dense. ``gbps`` is the BSR bytes read (row_ptr + col_idx + values) per
    second; ``fraction`` is that over ``read_bw_gbps``."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    min_bytes = min_bytes or dram_probe_bytes()
    rng = np.random.default_rng(seed)
    ref = random_bsr(rng, rows, cols, block_rows, block_cols, density)
    first = native(ref)
    n_bsr = max(1, math.ceil(min_bytes / first.payload_bytes))
    mats = [first] + [native(random_bsr(rng, rows, cols, block_rows, block_cols, density)) for _ in range(n_bsr - 1)]
    x = rng.standard_normal(cols, dtype=np.float32)

    dense = np.ascontiguousarray(ref.to_dense())
    n_dense = max(1, math.ceil(min_bytes / dense.nbytes))
    flat = [dense.reshape(-1).view(np.uint8)] + [dense.copy().reshape(-1).view(np.uint8) for _ in range(n_dense - 1)]
    dense_calls = [lambda w=w: _native.gemv(w, "f32", rows, cols, x, threads=threads, isa=isa) for w in flat]

    # Both kernels are right on the shared matrix (a benchmark of a wrong kernel is worthless).
    a64 = ref.to_dense(np.float64)
    max_rel_diff = max(max_rel_error(first.gemv(x, threads=threads, isa=isa)[None], x[None], a64),
                       max_rel_error(dense_calls[0]()[None], x[None], a64))

    bsr_ms = statistics.median(_time([lambda m=m: m.gemv(x, threads=threads, isa=isa) for m in mats], iters))
    dense_ms = statistics.median(_time(dense_calls, iters))
    bsr_bytes = first.payload_bytes
    gbps = bsr_bytes / (bsr_ms * 1e-3) / 1e9
    read_bw = _native.read_bandwidth(bytes=dram_probe_bytes(), threads=threads, passes=5)["gbps"] if bandwidth else None
    resolved = _native.kernel_isa("bsr", isa)
    return {
        "kernel": "bsr",
        "rows": rows,
        "cols": cols,
        "block_rows": block_rows,
        "block_cols": block_cols,
        "density": density,
        "kept_density": first.density,
        "nnzb": first.nnzb,
        "threads": threads,
        "isa": resolved,
        "seed": seed,
        "iters": iters,
        "dense_ms": dense_ms,
        "bsr_ms": bsr_ms,
        "speedup": dense_ms / bsr_ms,
        "bsr_bytes": bsr_bytes,
        "dense_bytes": dense.nbytes,
        "gbps": gbps,
        "dense_gbps": dense.nbytes / (dense_ms * 1e-3) / 1e9,
        "read_bw_gbps": read_bw,
        "fraction": gbps / read_bw if read_bw else None,
        "copies_bsr": len(mats),
        "copies_dense": len(flat),
        "max_rel_diff": max_rel_diff,
    }
