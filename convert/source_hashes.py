"""Digests of a conversion's source files, computed beside the conversion.

The artifact records each source file's checksum (``source.shards``).
Hashing them first, then converting, read every source byte twice in a row
on one core; the hashes release the GIL while they hash, so a worker thread
hashes the files while the main thread converts, and a conversion takes
about as long as the longer of the two instead of their sum. ``records``
waits for the hashes; leaving the ``with`` block early (an error) stops the
worker at its next chunk.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from iekit.formats import checksums

CHUNK = 8 * 1024 * 1024


class SourceHashes:
    def __init__(self, files: list[tuple[str, Path]], advance: Callable[[int], None],
                 checksum: str = checksums.DEFAULT):
        self._files = files
        self._alg = checksums.ALGORITHMS[checksum]
        self._advance = advance
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="iekit-hash")
        self._futures = [self._pool.submit(self._hash, path) for _name, path in files]

    def _hash(self, path: Path) -> str | None:
        h = self._alg.new()
        view = memoryview(bytearray(CHUNK))  # one buffer: a fresh one per chunk costs page faults
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                if self._stop.is_set():
                    return None
                h.update(view[:n])
                self._advance(n)
        return h.hexdigest()

    def records(self) -> list[dict]:
        """[{name, nbytes, <algorithm>}] of every file, in the order given (waits for the worker)."""
        return [{"name": name, "nbytes": path.stat().st_size, self._alg.name: fut.result()}
                for (name, path), fut in zip(self._files, self._futures)]

    def __enter__(self) -> "SourceHashes":
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)
