"""Where the benchmarks find llama.cpp's tools: PATH first, then the build
``make llamacpp`` makes (build/llamacpp/bin), so that a user who built it
that way needs no flag. Imported by the scripts beside it (run as
``python benchmarks/NAME.py``, this folder is on sys.path)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

BUILT = Path(__file__).resolve().parents[1] / "build" / "llamacpp" / "bin"


def tool(name: str) -> str | None:
    """The path of llama.cpp's ``name`` (e.g. llama-bench), or None."""
    built = BUILT / name
    return shutil.which(name) or (str(built) if built.is_file() else None)


def where(name: str) -> str:
    """The --help text of a script's --NAME option."""
    return f"llama.cpp's {name} (default: PATH, then build/llamacpp/bin from `make llamacpp`)"


def run_repack_safe(cmd: list[str], no_repack: list[str]) -> tuple[subprocess.CompletedProcess, str | None]:
    """Run a llama.cpp tool; if a signal kills it, run it once more with
    ``no_repack`` (llama-bench ``--repack 0``, llama-perplexity
    ``--no-repack``). llama.cpp 0.3.36's AMX path, taken by default on a CPU
    with AMX, dies of SIGSEGV on any batch of 16 tokens or more; without
    repacking it runs its plain kernels on the same weights. Returns the
    result and the arguments added, or None (also when ``cmd`` already has
    ``no_repack``'s flag)."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode >= 0 or no_repack[0] in cmd:
        return res, None
    return subprocess.run(cmd + no_repack, capture_output=True, text=True), " ".join(no_repack)
