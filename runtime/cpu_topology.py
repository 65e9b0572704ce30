"""How many physical cores this process may run on.

Decode and the bandwidth yardstick are memory-bound: a second hyperthread
on a core adds no bandwidth and steals the first one's cache, so ``ierun
bench`` defaults to one thread per physical core. Linux says which logical
CPUs share a core in /sys/devices/system/cpu/cpuN/topology; elsewhere (or
when that is unreadable) every logical CPU counts as a core.
"""

from __future__ import annotations

import os
from pathlib import Path

_SYS_CPU = Path("/sys/devices/system/cpu")


def allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def physical_cores(sys_cpu: Path = _SYS_CPU) -> int:
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
