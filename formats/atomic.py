"""Writers never leave a half-written artifact.

Each output is written under a hidden temporary name in the destination
directory (same filesystem, so rename is atomic), fsynced, and renamed into
place only when everything succeeded. Multi-file artifacts commit their
"index" file last, so a reader never sees an index that points at missing
or stale payloads from this run.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StagedFiles:
    """A set of files written under temporary names and committed together.

    Use as a context manager: on an exception (including KeyboardInterrupt)
    every staged file is removed and nothing in the directory changes.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._staged: list[tuple[Path, Path, BinaryIO | None]] = []
        self._tag = f"{os.getpid()}.{secrets.token_hex(4)}"

    def open(self, name: str) -> BinaryIO:
        """Open a staged binary file that will become ``directory/name``."""
        final = self.directory / name
        tmp = self.directory / f".{name}.{self._tag}.tmp"
        f = open(tmp, "xb")
        self._staged.append((tmp, final, f))
        return f

    def write_bytes(self, name: str, data: bytes) -> None:
        f = self.open(name)
        f.write(data)

    def commit(self) -> None:
        """fsync every staged file, then rename them in staging order."""
        for tmp, _final, f in self._staged:
            if f is not None and not f.closed:
                f.flush()
                os.fsync(f.fileno())
                f.close()
        for tmp, final, _f in self._staged:
            os.replace(tmp, final)
        fsync_dir(self.directory)
        self._staged.clear()

    def abort(self) -> None:
        for tmp, _final, f in self._staged:
            if f is not None and not f.closed:
                f.close()
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        self._staged.clear()

    def __enter__(self) -> "StagedFiles":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._staged:
            self.commit()


def write_file_atomic(path: Path, data: bytes) -> None:
    """Replace one file atomically."""
    path = Path(path)
    with StagedFiles(path.parent) as staged:
        staged.write_bytes(path.name, data)
