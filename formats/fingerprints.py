"""Fingerprints of a run's inputs and outputs: what a resumed run compares
to decide whether the work an interrupted one kept is still its own
(formats/gptq_partial.py, formats/quantize_stages.py).

Large files go in by name, size and modification time (hashing a 16 GB
checkpoint would cost minutes on every resume), small ones by content.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import iebin
from .fileio import read_small
from .hf_checkpoint import HFSource
from .jsonio import dumps_canonical


def digest(*parts: bytes) -> str:
    """SHA-256 over the parts, each prefixed by its length (no two splits collide)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little") + p)
    return h.hexdigest()


def stat_line(path: Path, whole_path: bool = False) -> bytes:
    """A file's name (or whole path), size and modification time, not
    following a symlink at the end."""
    st = os.lstat(path)
    return f"{path if whole_path else path.name}:{st.st_size}:{st.st_mtime_ns}".encode()


def small_file(path: Path | None) -> str | None:
    """A small input file (a manifest, an importance matrix) by content; None for none."""
    return None if path is None else digest(read_small(path))


def token_chunks(parts: list[list[int]]) -> str:
    """Calibration or scored token ids as cut into chunks (so the text or ids
    file, the context, the chunk count and the tokenizer are all in it)."""
    return digest(json.dumps(parts).encode())


def differing(recorded: dict, now: dict) -> list[str]:
    """The input names whose fingerprints differ between a kept record and
    this run (one missing on either side counts), sorted: what a refusal
    to resume names."""
    return sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))


def checkpoint(src: HFSource) -> str:
    """A checkpoint: its config by content, its shards by stat_line."""
    return digest(dumps_canonical(src.config), *(stat_line(src.dir / s) for s in src.shards))


def artifact(model_dir: Path) -> str:
    """An IEBIN artifact: its model.ie.json by content, its bin by stat_line."""
    return digest(read_small(model_dir / iebin.META_NAME), stat_line(model_dir / iebin.BIN_NAME))


def outputs(paths: list[Path]) -> str | None:
    """What a stage left: each output's whole path, size and modification
    time; None if one is missing."""
    try:
        return digest(*(stat_line(p, whole_path=True) for p in paths))
    except (FileNotFoundError, NotADirectoryError):
        return None
