"""Where the benchmarks find llama.cpp's tools: PATH first, then the build
``make llamacpp`` makes (build/llamacpp/bin), so that a user who built it
that way needs no flag. Imported by the scripts beside it (run as
``python benchmarks/NAME.py``, this folder is on sys.path)."""

from __future__ import annotations

import shutil
from pathlib import Path

BUILT = Path(__file__).resolve().parents[1] / "build" / "llamacpp" / "bin"


def tool(name: str) -> str | None:
    """The path of llama.cpp's ``name`` (e.g. llama-bench), or None."""
    built = BUILT / name
    return shutil.which(name) or (str(built) if built.is_file() else None)


def where(name: str) -> str:
    """The --help text of a script's --NAME option."""
    return f"llama.cpp's {name} (default: PATH, then build/llamacpp/bin from `make llamacpp`)"
