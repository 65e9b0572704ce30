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

class _Stopped(Exception):
    """Raised from the progress callback: the conversion left early."""


class SourceHashes:
    def __init__(self, files: list[tuple[str, Path]], advance: Callable[[int], None],
                 checksum: str = checksums.DEFAULT):
        self._files = files
        self._alg = checksums.ALGORITHMS[checksum]
        self._advance = advance
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="iekit-hash")
        self._futures = [self._pool.submit(self._hash, path) for _name, path in files]

    def _hash(self, path: Path) -> tuple[int, str] | None:
        """(size, digest) of the file as it was when hashing began."""
        if self._stop.is_set():  # the files still queued when the conversion left early
            return None
        size = path.stat().st_size
        try:
            return size, checksums.digest_file_range(path, 0, size, self._alg.name, self._tick)
        except _Stopped:
            return None

    def _tick(self, n: int) -> None:
        if self._stop.is_set():
            raise _Stopped
        self._advance(n)

    def records(self) -> list[dict]:
        """[{name, nbytes, <algorithm>}] of every file, in the order given (waits for the worker)."""
        return [{"name": name, "nbytes": size, self._alg.name: digest}
                for (name, _path), (size, digest) in zip(self._files, (f.result() for f in self._futures))]

    def __enter__(self) -> "SourceHashes":
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)
