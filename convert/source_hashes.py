"""SHA-256 of a conversion's source files, computed beside the conversion.

The artifact records each source file's checksum (``source.shards``).
Hashing them first, then converting, read every source byte twice in a row
on one core; ``hashlib`` releases the GIL while it hashes, so a worker thread
hashes the files while the main thread converts, and a conversion takes
about as long as the longer of the two instead of their sum. ``records``
waits for the hashes; leaving the ``with`` block early (an error) stops the
worker at its next chunk.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

CHUNK = 8 * 1024 * 1024


class SourceHashes:
    def __init__(self, files: list[tuple[str, Path]], advance: Callable[[int], None]):
        self._files = files
        self._advance = advance
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="iekit-sha256")
        self._futures = [self._pool.submit(self._hash, path) for _name, path in files]

    def _hash(self, path: Path) -> str | None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                if self._stop.is_set():
                    return None
                h.update(chunk)
                self._advance(len(chunk))
        return h.hexdigest()

    def records(self) -> list[dict]:
        """[{name, nbytes, sha256}] of every file, in the order given (waits for the worker)."""
        return [{"name": name, "nbytes": path.stat().st_size, "sha256": fut.result()}
                for (name, path), fut in zip(self._files, self._futures)]

    def __enter__(self) -> "SourceHashes":
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)
