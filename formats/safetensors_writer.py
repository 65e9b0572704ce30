"""A safetensors file written as a stream: the header first, from the
tensors' names, dtypes and shapes, then each tensor's bytes in header order.

Why a writer of our own: ``safetensors.numpy.save_file`` takes every tensor
in memory at once, and a rotated 8B checkpoint is 32 GB of f32
(``ieconv rotate``). The layout is the format's (its README): an 8-byte
little-endian header length, the JSON header padded with spaces so that the
data begins on an 8-byte boundary, then the data section, fully covered by
the tensors in order. safetensors' own reader is the test
(tests/test_rotate.py).
"""

from __future__ import annotations

import json
import struct
from typing import BinaryIO, Callable, Iterable

from .dtypes import DTYPES, INT64_MAX, shape_elements


class SafetensorsWriter:
    """Writes ``tensors`` (name, dtype, shape: IEBIN dtype names) into ``f``,
    in that order: ``write(name, chunks)`` or ``copy(name, fn)`` for each,
    then ``finish()``."""

    def __init__(self, f: BinaryIO, tensors: Iterable[tuple[str, str, list[int]]], metadata: dict[str, str]):
        header: dict = {"__metadata__": dict(metadata)}
        self._sizes: list[tuple[str, int]] = []
        at = 0
        for name, dtype, shape in tensors:
            if name in header:
                raise ValueError(f"safetensors writer: tensor {name!r} given twice")
            n = shape_elements(shape) * DTYPES[dtype].itemsize
            if at + n > INT64_MAX:
                raise ValueError(f"safetensors writer: {name!r} runs past 2^63 bytes")
            header[name] = {"dtype": DTYPES[dtype].safetensors, "shape": list(shape), "data_offsets": [at, at + n]}
            self._sizes.append((name, n))
            at += n
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        f.write(struct.pack("<Q", len(text)) + text)
        self._f = f
        self._next = 0

    def write(self, name: str, chunks: Iterable[bytes]) -> None:
        """The bytes of the next tensor in header order, which must be ``name``."""
        want_name, want = self._sizes[self._next]
        if name != want_name:
            raise ValueError(f"safetensors writer: {name!r} written where {want_name!r} comes next")
        got = 0
        for c in chunks:
            self._f.write(c)
            got += len(c)
        if got != want:
            raise ValueError(f"safetensors writer: {name!r} got {got} bytes, its header says {want}")
        self._next += 1

    def copy(self, name: str, copy: Callable[[int, int], None]) -> None:
        """The next tensor in header order, ``name``, put in place by
        ``copy(fd, offset)`` from a source that holds its bytes as they are
        (SafetensorsFile.copy_to: in the kernel, never through Python)."""
        want_name, want = self._sizes[self._next]
        if name != want_name:
            raise ValueError(f"safetensors writer: {name!r} written where {want_name!r} comes next")
        self._f.flush()
        at = self._f.tell()
        copy(self._f.fileno(), at)
        self._f.seek(at + want)
        self._next += 1

    def finish(self) -> None:
        if self._next != len(self._sizes):
            raise ValueError(f"safetensors writer: {self._sizes[self._next][0]!r} and after never written")
