"""BSR GEMV vs dense float32 GEMV on the same matrix (for ``ierun microbench --kernel bsr``).

What a block-sparse matrix buys is bytes not read, so the time of one GEMV
should scale with the stored density. Both kernels are timed the same way:
single calls from Python (the call overhead, a few microseconds, is the same
for both), rotating through enough copies of the weights (> ``min_bytes``,
three times the 32 MiB last-level cache by default) that every call streams
its matrix from DRAM rather than from cache. The median is reported, next to
the machine's read bandwidth measured in the same run, so a number can be
judged as a fraction of what the memory can deliver.

The dense side is the runtime's own f32 GEMV (``_native.gemv``); only when
that is missing from the build does it fall back to numpy (``dense_impl``
says which).
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from .native import _native

LLC_BYTES = 32 << 20
MIN_BYTES = 3 * LLC_BYTES
BANDWIDTH_BYTES = 256 << 20


def random_bsr(rng: np.random.Generator, rows: int, cols: int, br: int, bc: int, density: float):
    """A native BsrMatrix with ceil(density × blocks) blocks at uniformly random
    positions, N(0, 1) values, zero padding in the tail blocks."""
    from iekit.convert.block_sparse import keep_count

    nbr, nbc = -(-rows // br), -(-cols // bc)
    total = nbr * nbc
    k = max(1, keep_count(density, total))
    chosen = np.sort(rng.choice(total, size=k, replace=False))
    r, c = chosen // nbc, chosen % nbc
    row_ptr = np.zeros(nbr + 1, np.uint32)
    row_ptr[1:] = np.cumsum(np.bincount(r, minlength=nbr))
    values = rng.standard_normal((k, br, bc), dtype=np.float32)
    if rows % br:
        values[r == nbr - 1, rows % br:, :] = 0
    if cols % bc:
        values[c == nbc - 1, :, cols % bc:] = 0
    return _native.BsrMatrix(rows, cols, br, bc, row_ptr, c.astype(np.uint32), values)


def to_dense(m) -> np.ndarray:
    nbr, nbc, br, bc = m.n_block_rows, m.n_block_cols, m.block_rows, m.block_cols
    grid = np.zeros((nbr, nbc, br, bc), np.float32)
    r = np.repeat(np.arange(nbr), np.diff(m.row_ptr.astype(np.int64)))
    grid[r, m.col_idx] = m.values
    return np.ascontiguousarray(grid.transpose(0, 2, 1, 3).reshape(nbr * br, nbc * bc)[: m.rows, : m.cols])


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
              *, iters: int = 40, min_bytes: int = MIN_BYTES, isa: str = "", bandwidth: bool = True) -> dict:
    """Time y = A x for a random BSR matrix of the given density and for the same
    matrix dense. ``gbps`` is the BSR bytes read (row_ptr + col_idx + values) per
    second; ``fraction`` is that over ``read_bw_gbps``."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    rng = np.random.default_rng(seed)
    first = random_bsr(rng, rows, cols, block_rows, block_cols, density)
    n_bsr = max(1, math.ceil(min_bytes / first.payload_bytes))
    mats = [first] + [random_bsr(rng, rows, cols, block_rows, block_cols, density) for _ in range(n_bsr - 1)]
    x = rng.standard_normal(cols, dtype=np.float32)

    dense = to_dense(first)
    n_dense = max(1, math.ceil(min_bytes / dense.nbytes))
    dense_copies = [dense] + [dense.copy() for _ in range(n_dense - 1)]
    if hasattr(_native, "gemv"):
        dense_impl = "native f32"
        flat = [d.reshape(-1).view(np.uint8) for d in dense_copies]
        dense_calls = [lambda w=w: _native.gemv(w, "f32", rows, cols, x, threads=threads, isa=isa) for w in flat]
    else:  # pragma: no cover - only while the dense GEMV is not in the build
        dense_impl = "numpy"
        dense_calls = [lambda w=w: w @ x for w in dense_copies]

    # The two agree on the shared matrix (a benchmark of a wrong kernel is worthless).
    y_bsr = first.gemv(x, threads=threads, isa=isa)
    y_dense = dense_calls[0]()
    scale = np.abs(dense).astype(np.float64) @ np.abs(x).astype(np.float64) + 1e-30
    max_rel_diff = float((np.abs(y_bsr.astype(np.float64) - y_dense) / scale).max())

    bsr_ms = statistics.median(_time([lambda m=m: m.gemv(x, threads=threads, isa=isa) for m in mats], iters))
    dense_ms = statistics.median(_time(dense_calls, iters))
    bsr_bytes = first.payload_bytes
    gbps = bsr_bytes / (bsr_ms * 1e-3) / 1e9
    read_bw = _native.read_bandwidth(bytes=BANDWIDTH_BYTES, threads=threads, passes=5)["gbps"] if bandwidth else None
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
        "copies_dense": len(dense_copies),
        "dense_impl": dense_impl,
        "max_rel_diff": max_rel_diff,
    }
