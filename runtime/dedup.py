"""The dedup runtime loader's Python side: index, cross-check, fallback.

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
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from iekit.formats import checksums
from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.errors import FormatError, IEError

from .env import DEFAULT_CACHE_MB, DedupConfig
from .native import _native

__all__ = ["DedupConfig", "DedupWarning", "TensorSource", "cross_check", "open_store"]


class DedupWarning(UserWarning):
    """The dedup artifact could not be used; tensors come from model.ie.bin."""


def _debug(on: bool, msg: str) -> None:
    if on:
        print(f"ie-dedup: {msg}", file=sys.stderr, flush=True)


def cross_check(index: fmt.DedupIndex, model: iebin.IebinModel) -> None:
    """Every member is a tensor of the model with the same dtype, shape,
    nbytes and digest: the artifact belongs to this model."""
    by_name = {t["name"]: t for t in model.tensors}
    mf = os.fspath(index.path)
    alg = index.meta["checksum"]
    if alg != model.checksum:
        raise FormatError(mf, "checksum", f"{alg!r} digests, but {model.meta_path.name} records {model.checksum!r} "
                          "(the artifact was extracted from another conversion of the model)")
    for g, j, grp, m in index.members():
        where = f"groups[{g}].members[{j}]"
        t = by_name.get(m["name"])
        if t is None:
            raise FormatError(mf, f"{where}.name", f"{m['name']!r} is not a tensor of {model.meta_path}")
        for key, mine, theirs in (("dtype", grp["dtype"], t["dtype"]), ("nbytes", grp["nbytes"], t["nbytes"]),
                                  ("shape", m["shape"], t["shape"]), (alg, m[alg], t[alg])):
            if mine != theirs:
                raise FormatError(mf, f"{where}.{key}", f"{m['name']!r}: {key} {mine!r} differs from model.ie.json ({theirs!r})")


def open_store(model_dir: str | os.PathLike, *, cache_mb: float = DEFAULT_CACHE_MB, debug: bool = False,
               threads: int = 0, isa: str = "", model: iebin.IebinModel | None = None,
               index: fmt.DedupIndex | None = None) -> tuple[Any, fmt.DedupIndex]:
    """Validate ``model_dir/model.dedup.json`` and build the native loader.
    Raises IEError (one "FILE: FIELD: message" line) on any broken rule."""
    model_dir = Path(model_dir)
    if index is None:
        _debug(debug, f"parsing {model_dir / fmt.INDEX_NAME}")
        index = fmt.load_index(model_dir)
    t = index.totals()
    _debug(debug, f"index ok: {t['groups']} groups, {t['members']} members, {t['original_bytes']} original bytes, "
                  f"blobs {t['defaults_bytes']} + {t['masks_bytes']} + {t['exceptions_bytes']} bytes")
    if model is not None:
        cross_check(index, model)
        _debug(debug, f"members match {model.meta_path.name}")
    try:
        store = _native.DedupStore(os.fspath(index.dir), **index.arrays(), cache_mb=cache_mb, threads=threads,
                                   debug=debug, isa=isa, index_label=os.fspath(index.path))
    except ValueError as e:  # the loader's rule messages are already "FILE: FIELD: message"
        raise IEError(str(e)) from None
    return store, index


class TensorSource:
    """Tensor bytes for the runtime: grouped tensors from the dedup loader
    when IE_DEDUP=1 (and the artifact is usable), every other tensor from
    its IEBIN backing file (memory-mapped, zero-copy)."""

    def __init__(self, model_dir: str | os.PathLike, config: DedupConfig | None = None, *,
                 threads: int = 0, isa: str = ""):
        self.model = iebin.load_model(model_dir)
        self.config = config if config is not None else DedupConfig.from_env()
        self.store = None
        self.index: fmt.DedupIndex | None = None
        self.fallback_reason: str | None = None
        self._by_name = {t["name"]: t for t in self.model.tensors}
        self._maps: dict[Path, np.memmap] = {}
        self._verified: set[str] = set()
        if not self.config.enabled:
            return
        try:
            self.store, self.index = open_store(self.model.dir, cache_mb=self.config.cache_mb, debug=self.config.debug,
                                                threads=threads, isa=isa, model=self.model)
        except (IEError, OSError) as e:
            if self.config.strict:
                raise IEError(f"IE_DEDUP_STRICT=1: dedup artifact unusable: {e}") from None
            self.fallback_reason = str(e)
            warnings.warn(f"dedup artifact unusable, serving every tensor from {iebin.BIN_NAME}: {e}",
                          DedupWarning, stacklevel=2)
            _debug(self.config.debug, f"fallback: {e}")

    def source_of(self, name: str) -> str:
        self._entry(name)
        return "dedup" if self.store is not None and name in self.store else "iebin"

    def _entry(self, name: str) -> dict[str, Any]:
        t = self._by_name.get(name)
        if t is None:
            raise IEError(f"{self.model.meta_path}: no tensor named {name!r}")
        return t

    def get(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only 1-D uint8 array."""
        t = self._entry(name)
        if self.store is not None and name in self.store:
            buf = self.store.get(name)
            if self.config.strict and name not in self._verified:
                self._verify(name, buf, t)
            return buf
        if t["nbytes"] == 0:
            return np.empty(0, np.uint8)
        path = self.model.path_of(t)
        mm = self._maps.get(path)
        if mm is None:
            mm = self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        return mm[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]

    def _verify(self, name: str, buf: np.ndarray, t: dict[str, Any]) -> None:
        """IE_DEDUP_STRICT=1: the first rebuild of a tensor must hash to its
        model.ie.json digest, so a corrupted exception byte, mask or default,
        or a member pointed at the wrong group, is an error, not different
        logits. The verdict is cached: later rebuilds (after an LRU eviction)
        read the same mapped blobs. Costs one hash pass over each grouped
        tensor, once, at load (docs/formats/dedup.md gives the measured rate)."""
        alg = self.model.checksum
        digest = checksums.digest(alg, buf)
        if digest != t[alg]:
            raise IEError(f"{self.index.path}: IE_DEDUP_STRICT=1: {name!r} rebuilds to {alg} {digest[:16]}..., "
                          f"model.ie.json says {t[alg][:16]}... (a corrupted default, mask or exception "
                          f"region, or a member in the wrong group; ierun verify dedup names it)")
        self._verified.add(name)

    def stats(self) -> dict[str, Any]:
        base = {"enabled": self.config.enabled, "active": self.store is not None, "fallback_reason": self.fallback_reason}
        return {**base, **(self.store.stats() if self.store is not None else {})}
