"""The last-level caches of the CPUs this process may run on (their physical
cores: formats/workers.py, the default of every --threads).

A read that is meant to measure memory must stream through more bytes than
the caches hold, or it measures the caches: a 256 MiB yardstick is eight
times this development VM's 32 MiB L3 but fits in the 300 MiB L3 of a
16-core Xeon, where it read 132-179 GB/s against 105-130 GB/s over 1200
MiB, and a decode that streamed 1.2 GB a token from DRAM read 0.70 of it
against 0.78 of the larger one (medians).
``dram_probe_bytes`` sizes such buffers from the caches /sys reports
(cpuN/cache/indexM: level, type, size, shared_cpu_list).
"""

from __future__ import annotations

from pathlib import Path

from iekit.formats.workers import allowed_cpus

_SYS_CPU = Path("/sys/devices/system/cpu")
DRAM_PROBE_MIN_BYTES = 256 << 20  # the yardstick where the caches are unknown or small
LLC_MULTIPLE = 4  # a streaming read over 4x the LLC finds at most a quarter of it cached


def _size_bytes(text: str) -> int:
    """A sysfs cache size: "32768K", "300M", "1G" or plain bytes."""
    text = text.strip()
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if unit > 1 else text) * unit


def last_level_cache_bytes(sys_cpu: Path = _SYS_CPU) -> int | None:
    """Bytes of the highest-level data or unified caches that the CPUs this
    process may use sit under, each cache counted once however many CPUs
    share it (two sockets: two L3s; a Zen part: one L3 per CCX). None where
    /sys does not say."""
    caches: dict[tuple[int, str], int] = {}  # (level, shared_cpu_list) -> bytes
    for cpu in allowed_cpus():
        try:
            for index in (sys_cpu / f"cpu{cpu}" / "cache").glob("index*"):
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                level = int((index / "level").read_text())
                caches[(level, (index / "shared_cpu_list").read_text().strip())] = _size_bytes(
                    (index / "size").read_text())
        except (OSError, ValueError):
            return None
    if not caches:
        return None
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


def dram_probe_bytes(sys_cpu: Path = _SYS_CPU) -> int:
    """The buffer a streaming read needs to measure memory, not cache:
    LLC_MULTIPLE times the last-level caches, at least 256 MiB, whole MiB."""
    llc = last_level_cache_bytes(sys_cpu) or 0
    return max(DRAM_PROBE_MIN_BYTES, -(-LLC_MULTIPLE * llc >> 20) << 20)
