"""The dedup store's runtime side: its index validated, cross-checked and
handed to the native loader (``open_store``). TensorSource
(runtime/tensor_source.py) decides when the store serves a tensor and
falls back to model.ie.bin when it cannot.

The native ``DedupStore`` holds no global state and reads no environment;
its settings come from ``DedupConfig`` (runtime/env.py, the one parser of
every IE_* variable; any malformed value is an error, strict or not):

  IE_DEDUP=1          serve grouped tensors from the dedup artifact
  IE_DEDUP_STRICT=1   a missing or malformed artifact is an error; without
                      it: one warning, then every tensor from model.ie.bin
  IE_DEDUP_POLICY     only ``lossless`` (bit-exact) exists; anything else
                      is an error (a typo must not silently change what runs)
  IE_DEDUP_CACHE_MB   LRU cache of reconstructed tensors (default 256)
  IE_DEDUP_DEBUG=1    log parsing and cache decisions on stderr

The index is parsed and validated here (formats.dedup), cross-checked
against model.ie.json, and handed to the loader as plain arrays; the loader
re-validates every number against the blobs before first use.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.errors import IEError

from .env import DEFAULT_CACHE_MB, DedupConfig
from .native import _native

__all__ = ["DedupConfig", "DedupWarning", "open_store"]


class DedupWarning(UserWarning):
    """The dedup artifact could not be used; tensors come from model.ie.bin."""


def debug_log(on: bool, msg: str) -> None:
    if on:
        print(f"ie-dedup: {msg}", file=sys.stderr, flush=True)


def open_store(model_dir: str | os.PathLike, *, cache_mb: float = DEFAULT_CACHE_MB, debug: bool = False,
               threads: int = 0, isa: str = "", model: iebin.IebinModel | None = None,
               index: fmt.DedupIndex | None = None) -> tuple[Any, fmt.DedupIndex]:
    """Validate ``model_dir/model.dedup.json`` and build the native loader.
    Raises IEError (one "FILE: FIELD: message" line) on any broken rule."""
    model_dir = Path(model_dir)
    if index is None:
        debug_log(debug, f"parsing {model_dir / fmt.INDEX_NAME}")
        index = fmt.load_index(model_dir)
    t = index.totals()
    debug_log(debug, f"index ok: {t['groups']} groups, {t['members']} members, {t['original_bytes']} original bytes, "
                  f"blobs {t['defaults_bytes']} + {t['masks_bytes']} + {t['exceptions_bytes']} bytes")
    if model is not None:
        fmt.cross_check(index, model.tensors, model.meta_path, model.checksum)
        debug_log(debug, f"members match {model.meta_path.name}")
    try:
        store = _native.DedupStore(os.fspath(index.dir), **index.arrays(), cache_mb=cache_mb, threads=threads,
                                   debug=debug, isa=isa, index_label=os.fspath(index.path))
    except ValueError as e:  # the loader's rule messages are already "FILE: FIELD: message"
        raise IEError(str(e)) from None
    return store, index
