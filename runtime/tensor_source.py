"""The runtime's one way to a tensor's bytes, whatever stores them.

``TensorSource`` answers "the bytes of tensor NAME" for every runtime
reader (the decoder, ``ierun verify``): from the model's IEBIN backing
files, memory-mapped and read in place, or, for the tensors a dedup store
groups (IE_DEDUP=1, or always for a ``dedup-pack``ed model), from the
native dedup loader (runtime/dedup.py), with IE_DEDUP_STRICT's digest
check on first use. An expert slice ``STACK[e]`` is a tensor like any
other here (formats/tensor_entries.py).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from iekit.formats import checksums
from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.errors import IEError

from .dedup import DedupConfig, DedupWarning, debug_log, open_store
from .native import _native

# Bytes of a member rebuilt at a time when it is verified without a whole copy.
_VERIFY_SLICE = 4 << 20


class TensorSource:
    """Tensor bytes for the runtime: grouped tensors from the dedup loader
    when IE_DEDUP=1 (and the artifact is usable), every other tensor from
    its IEBIN backing file (memory-mapped, zero-copy)."""

    def __init__(self, model_dir: str | os.PathLike, config: DedupConfig | None = None, *,
                 threads: int = 0, isa: str = ""):
        self.model = iebin.load_model(model_dir)
        # Its files are read in place (mapped): one that shrinks under us is one line, not a silent SIGBUS.
        _native.report_sigbus_as(f"error: {self.model.dir}: a model file ierun had mapped (model.ie.bin, a dedup "
                                 "blob) shrank while in use (SIGBUS); model files must not change while ierun runs")
        self.config = config if config is not None else DedupConfig.from_env()
        # A packed model (dedup-pack) keeps its grouped tensors only in the
        # store: it is always used and always strict, whatever IE_DEDUP says.
        self.packed = bool(self.model.in_store)
        if self.packed:
            self.config = dataclasses.replace(self.config, enabled=True, strict=True)
        self.store = None
        self.index: fmt.DedupIndex | None = None
        self.fallback_reason: str | None = None
        self._by_name = {t["name"]: t for t in self.model.tensors}
        self._maps: dict[Path, np.memmap] = {}
        self._stacks: dict[str, np.ndarray] = {}  # stacks the store serves whole, rebuilt once for their slices
        self._verified: set[str] = set()
        if not self.config.enabled:
            return
        try:
            self.store, self.index = open_store(self.model.dir, cache_mb=self.config.cache_mb, debug=self.config.debug,
                                                threads=threads, isa=isa, model=self.model)
        except (IEError, OSError) as e:
            if self.packed:
                raise IEError(f"{self.model.meta_path}: the model's grouped tensors live in the dedup store, "
                              f"which is unusable: {e}") from None
            if self.config.strict:
                raise IEError(f"IE_DEDUP_STRICT=1: dedup artifact unusable: {e}") from None
            self.fallback_reason = str(e)
            warnings.warn(f"dedup artifact unusable, serving every tensor from {iebin.BIN_NAME}: {e}",
                          DedupWarning, stacklevel=2)
            debug_log(self.config.debug, f"fallback: {e}")

    def source_of(self, name: str) -> str:
        t = self.entry(name)
        return "dedup" if self._served(name) or ("stack" in t and self._served(t["stack"])) else "iebin"

    def _served(self, name: str) -> bool:
        return self.store is not None and name in self.store

    def find(self, name: str) -> dict[str, Any] | None:
        """The entry of a tensor model.ie.json lists (or of an expert slice
        already asked for), or None."""
        return self._by_name.get(name)

    def entry(self, name: str) -> dict[str, Any]:
        """A tensor's entry, or an expert slice's ``STACK[e]`` (tensor_entries.expert_slice)."""
        t = self._by_name.get(name)
        if t is None:
            t = self._by_name[name] = self.model.entry(name, in_store=True)
        return t

    def get(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only 1-D uint8 array (an expert slice
        of a stack the store serves whole: a view of the stack, rebuilt once)."""
        t = self.entry(name)
        if "stack" in t and self._served(t["stack"]):
            stack = self._stacks.get(t["stack"])
            if stack is None:
                stack = self._stacks[t["stack"]] = self.get(t["stack"])
            return stack[t["expert"] * t["nbytes"]:(t["expert"] + 1) * t["nbytes"]]
        if self._served(name):
            buf = self.store.get(name)
            if self.config.strict and name not in self._verified:
                self._verify(name, lambda: checksums.digest(self.model.checksum, buf), t)
            return buf
        if t["nbytes"] == 0:
            return np.empty(0, np.uint8)
        path = self.model.path_of(t)
        mm = self._maps.get(path)
        if mm is None:
            mm = self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        return mm[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]

    def member(self, name: str) -> tuple[Any, str] | None:
        """(store, name) for a tensor the store serves, for kernels that read
        the member where it is used (the decoder's fused GEMV, or the store's
        LRU cache); None for a tensor in model.ie.bin. Strict: the member
        must hash to its digest first (``_digest``)."""
        self.entry(name)
        if not self._served(name):
            return None
        if self.config.strict and name not in self._verified:
            self._verify(name, lambda: self._digest(name), self._by_name[name])
        return self.store, name

    def _digest(self, name: str) -> str:
        h = checksums.ALGORITHMS[self.model.checksum].new()
        self._hash_member(name, h)
        return h.hexdigest()

    def _hash_member(self, name: str, h: Any) -> None:
        """Feed the member's bytes to ``h``: the cached rebuild where the cache
        keeps it (the first product then hits), else rebuilt a slice at a time
        into one buffer, since a whole transient rebuild per member would
        leave the allocator's heap tens of MB larger for the rest of the
        process (freed, but not given back)."""
        if self.store.cacheable(name):
            h.update(self.store.get(name))
            return
        n = self.store.nbytes(name)
        buf = np.empty(min(n, _VERIFY_SLICE), np.uint8)
        for off in range(0, n, buf.size):
            view = buf[:min(buf.size, n - off)]
            self.store.read_into(name, off, view)
            h.update(view)

    def read_bytes(self, name: str) -> int:
        """Bytes one product with the tensor reads: the member's default, mask
        and exceptions where the fused GEMV rebuilds it in place (it does not
        fit in the cache), else the tensor's own bytes."""
        t = self.entry(name)
        if not self._served(name) or self.store.cacheable(name):
            return t["nbytes"]
        return self.store.read_bytes(name)

    def _verify(self, name: str, digest: Callable[[], str], t: dict[str, Any]) -> None:
        """IE_DEDUP_STRICT=1: the first rebuild of a tensor must hash to its
        model.ie.json digest, so a corrupted exception byte, mask or default,
        or a member pointed at the wrong group, is an error, not different
        logits. The verdict is cached: later rebuilds (after an LRU eviction)
        read the same mapped blobs. Costs one hash pass over each grouped
        tensor, once, at load (docs/formats/dedup.md gives the measured rate).
        An expert slice has no digest of its own: its whole stack is hashed
        instead (``_verify_stack``)."""
        if "stack" in t:
            return self._verify_stack(t["stack"])
        alg, got = self.model.checksum, digest()
        if got != t[alg]:
            raise IEError(f"{self.index.path}: IE_DEDUP_STRICT=1: {name!r} rebuilds to {alg} {got[:16]}..., "
                          f"model.ie.json says {t[alg][:16]}... (a corrupted default, mask or exception "
                          f"region, or a member in the wrong group; ierun verify dedup names it)")
        self._verified.add(name)

    def _verify_stack(self, stack: str) -> None:
        """Every expert of ``stack``, from the store where it is a member and
        from model.ie.bin where not, in order, must hash to the stack's
        model.ie.json digest; then all its slices count as verified."""
        t = self._by_name[stack]
        names = [f"{stack}[{e}]" for e in range(t["shape"][0])]
        h = checksums.ALGORITHMS[self.model.checksum].new()
        for name in names:
            if self._served(name):
                self._hash_member(name, h)
            else:
                h.update(self.get(name))
        got, alg = h.hexdigest(), self.model.checksum
        if got != t[alg]:
            bad = [n for n in names if n in self.store]
            raise IEError(f"{self.index.path}: IE_DEDUP_STRICT=1: the experts of {stack!r} ({len(bad)} of them from "
                          f"the store, first {bad[0]!r}) hash to {alg} {got[:16]}..., model.ie.json says "
                          f"{t[alg][:16]}... (a corrupted default, mask or exception region, or a member in the "
                          "wrong group; ierun verify dedup names it)")
        self._verified.update(names)

    def stats(self) -> dict[str, Any]:
        base = {"enabled": self.config.enabled, "active": self.store is not None, "fallback_reason": self.fallback_reason}
        return {**base, **(self.store.stats() if self.store is not None else {})}
