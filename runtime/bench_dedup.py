"""Dedup reconstruction throughput against the machine's read bandwidth,
both measured in the same run (what ``ierun microbench --kernel dedup``
reports).

A synthetic member: ``nbytes`` random default bytes, a mask with each bit
set with probability ``density`` (independently, the hardest layout for the
kernel at a given density: no long runs), and its exceptions. Buffers are
64-byte aligned and far larger than the last-level cache, so every pass
streams from DRAM; the chunk prefix table is built once, as the loader does
at open time. ``gbps`` counts the bytes the kernel must read (default +
mask + exceptions) per second, the same unit as the read-bandwidth
yardstick; ``out_gbps`` counts reconstructed bytes. The output is checked
against the numpy reference once.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from iekit.formats import dedup as fmt

from .cpu_topology import dram_probe_bytes
from .native import _native, read_bandwidth


def _aligned(n: int) -> np.ndarray:
    raw = np.empty(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n]


def bench_dedup(nbytes: int = 256 << 20, density: float = 0.01, threads: int = 2, seed: int = 0,
                passes: int = 7, isa: str = "", bw_bytes: int | None = None,
                bandwidth: bool = True) -> dict[str, Any]:
    """Time ``passes`` reconstructions (median) and, unless ``bandwidth`` is
    False (the caller measures it), the read bandwidth (``bw_bytes`` buffer,
    default max(cpu_topology.dram_probe_bytes(), nbytes)) in one run."""
    if nbytes < 1:
        raise ValueError("nbytes must be >= 1")
    if not 0.0 <= density <= 1.0:
        raise ValueError("density must be in [0, 1]")
    rng = np.random.default_rng(seed)
    default = _aligned(nbytes)
    default[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    words, lines, count = [], [], 0
    step = 1 << 24  # a multiple of 512: whole bytes of line bits per step
    for a in range(0, nbytes, step):
        c = min(step, nbytes - a)
        member = default[a:a + c] ^ (rng.random(c, dtype=np.float32) < density).astype(np.uint8)
        w, ln, exc_part = fmt.encode_lines(member, default[a:a + c])
        words.append(w)
        lines.append(ln)
        count += exc_part.size
    mask = np.concatenate(words + [np.concatenate(lines)])
    exc = rng.integers(0, 256, count, dtype=np.uint8)
    prefix = _native.dedup_prefix(default, mask, count)  # checked once, as the loader does at open time
    out = _aligned(nbytes)
    kw = dict(prefix=prefix, threads=threads, isa=isa, out=out)
    _native.dedup_reconstruct(default, mask, exc, **kw)  # warm-up: page faults, clocks
    # The yardstick is the machine's bandwidth (the best streaming-read kernel,
    # whatever ISA the dedup kernel was forced to), sampled before and after
    # the timed passes like `ierun microbench` does, and averaged.
    bw_bytes = bw_bytes or max(dram_probe_bytes(), nbytes)
    bw0 = read_bandwidth(bytes=bw_bytes, threads=threads, passes=5) if bandwidth else None
    exact = bool(np.array_equal(out, fmt.decode(default, mask, exc)))
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        _native.dedup_reconstruct(default, mask, exc, **kw)
        times.append(time.perf_counter() - t0)
    times.sort()
    t = times[len(times) // 2]
    read_bytes = nbytes + mask.size + exc.size
    gbps = read_bytes / t / 1e9
    res: dict[str, Any] = {
        "kernel": "dedup",
        "isa": isa or _native.cpu_features()["selected_isa"],
        "nbytes": nbytes,
        "density": density,
        "exceptions": int(exc.size),
        "mask_bytes": int(mask.size),
        "threads": threads,
        "seed": seed,
        "passes": passes,
        "seconds": t,
        "bytes_read": read_bytes,
        "gbps": gbps,
        "gbps_best": read_bytes / times[0] / 1e9,
        "out_gbps": nbytes / t / 1e9,
        "exact": exact,
    }
    if bw0 is not None:
        bw1 = read_bandwidth(bytes=bw_bytes, threads=threads, passes=5)
        read_bw = (bw0["gbps"] + bw1["gbps"]) / 2
        res.update(read_bw_gbps=read_bw, read_bw_samples_gbps=[bw0["gbps"], bw1["gbps"]],
                   read_bw_bytes=bw0["bytes"], fraction=gbps / read_bw)
    return res
