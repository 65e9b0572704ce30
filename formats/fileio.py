"""Reading byte ranges of artifact files, with one end-of-file rule.

Two shapes of access, each written once: a range streamed front to back
in bounded chunks (hashing, comparing, compressing a tensor without holding
it), and scattered preads through one descriptor per file (sampling and
extracting many tensors of the same files). A file shorter than the range
asked for is a FormatError naming the file, never a short read passed on.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import FormatError

READ_CHUNK = 8 * 1024 * 1024


def _short(path: str | os.PathLike, end: int) -> FormatError:
    return FormatError(path, "(size)", f"file ends before byte {end}")


def iter_range(f: BinaryIO, offset: int, nbytes: int, chunk: int = READ_CHUNK) -> Iterator[bytes]:
    """Bytes [offset, offset + nbytes) of an open file, at most ``chunk`` at a time."""
    f.seek(offset)
    left = nbytes
    while left:
        buf = f.read(min(chunk, left))
        if not buf:
            raise _short(f.name, offset + nbytes)
        left -= len(buf)
        yield buf


def sha256_range(f: BinaryIO, offset: int, nbytes: int) -> str:
    h = hashlib.sha256()
    for buf in iter_range(f, offset, nbytes):
        h.update(buf)
    return h.hexdigest()


class PreadFiles:
    """``read(path, offset, n)`` by pread, one descriptor per file, closed on exit."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def read(self, path: Path, offset: int, n: int) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        buf = os.pread(fd, n, offset)
        if len(buf) != n:
            raise _short(path, offset + n)
        return buf

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "PreadFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
