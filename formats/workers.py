"""Worker threads for the converters' numpy work, and the CPUs a process may use.

Decode is memory-bound: a second hyperthread on a core adds no bandwidth and
steals the first one's cache, so the default thread count of every command
is one per physical core (``physical_cores``). Linux says which logical
CPUs share a core in /sys/devices/system/cpu/cpuN/topology; elsewhere (or
when that is unreadable) every logical CPU counts as a core.

numpy releases the GIL inside element-wise operations on arrays this large,
so independent pieces of one matrix (row pieces, block spans) quantize in
parallel on threads. ``ordered_map`` hands back results in the order of its
inputs, so what a converter writes is the same bytes whatever the number of
threads. Work already running on a worker runs nested maps inline: a
quantizer that splits its own work (quant_search) inside a row piece does
not start threads x threads threads. For the same reason a map's workers
run their BLAS products (gptq's updates, numpy's matmul and solve) on one
BLAS thread each while the map runs: OpenBLAS's own pool of one thread per
CPU, started from every worker, oversubscribed the CPUs and made gptq
1.3-1.4x slower for the same bytes (docs/quality.md). Products outside a
map (the covariance passes, inverse_factor) keep every BLAS thread, except
in the commands whose codes come from float products (``one_blas_thread``).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")
R = TypeVar("R")

_local = threading.local()


def allowed_cpus() -> set[int]:
    """The logical CPUs this process may run on (its affinity mask; every
    CPU where the platform has none)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def physical_cores(sys_cpu: Path = Path("/sys/devices/system/cpu")) -> int:
    """Distinct (package, core) pairs among the CPUs this process may use (>= 1)."""
    cpus = allowed_cpus()
    cores = set()
    for cpu in cpus:
        topo = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def worker_count() -> int:
    """One worker per allowed CPU, at least 1."""
    return max(1, len(allowed_cpus()))


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread for the whole of a command whose codes come from
    float products (gptq's compensation, a policy measured as gptq
    quantizes), so that the same run gives the same bytes. OpenBLAS's
    results depend on its thread count (a Cholesky, or a 256-wide product,
    differs in the last bit between one and two threads), and ordered_map's
    limit is process-wide: a factor taken on the main thread while a map ran
    got one thread, and two otherwise, so a gptq run's codes depended on
    timing (a resumed run differed from the uninterrupted one under load,
    tests/test_quantize_cmd.py). The maps' products ran on one thread each
    already; the factors and covariance products now do too."""
    with threadpool_limits(1, user_api="blas"):
        yield


def _enter_worker() -> None:
    _local.worker = True


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None) -> Iterator[R]:
    """fn(item) for every item, yielded in item order, on up to ``workers``
    threads (default: worker_count()) with at most two per thread in flight,
    so memory stays a few items' worth. Inline where one worker is asked
    for, or where the caller is itself a worker. An exception from fn is
    raised where its item's result is due; leaving early cancels the rest.
    While the workers run, BLAS libraries run one thread each (module
    docstring); the previous limit is back when the map ends."""
    workers = workers or worker_count()
    if workers <= 1 or getattr(_local, "worker", False):
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="iekit-work", initializer=_enter_worker)
    pending: deque[Future] = deque()
    with threadpool_limits(1, user_api="blas"):  # lifted only once no worker runs (after shutdown)
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
