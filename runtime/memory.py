"""How much memory this machine can still give: the bound for sizes a file or
a flag asks the runtime to allocate (the decoder's KV cache for ``--ctx``,
the dense reference of ``ierun verify bsr``), checked before allocating so a
request that cannot fit is one clear error rather than an out-of-memory
kill or a MemoryError."""

from __future__ import annotations

import os


def available_bytes() -> int | None:
    """MemAvailable (Linux), else free physical pages; None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"
