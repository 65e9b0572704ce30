"""Strict, streaming reader for safetensors files (the HF checkpoint input).

Why not ``safetensors.safe_open``? Its numpy framework cannot represent
bf16, and the converter needs the tensors' *exact bytes* (a tensor in
``model.ie.bin`` must equal its bytes in the shard). So this module parses
the header itself -- 8-byte little-endian length, JSON header, byte buffer --
applying every rule of the format, and hands out bytes in bounded chunks via
``pread``. Reading in chunks rather than through one big mmap keeps peak RSS
at a few chunk sizes however large the checkpoint is (mmapped pages that were
read count towards RSS until the kernel reclaims them).
"""

from __future__ import annotations

import bisect
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .dtypes import FROM_SAFETENSORS, INT64_MAX, DType, shape_elements
from .errors import FormatError
from .fileio import copy_range
from .jsonio import loads_strict

MAX_HEADER_BYTES = 100_000_000  # the limit safetensors itself enforces
CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class SafetensorsTensor:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int
    # a view of whole rows kept in several places (formats/fused_tensors.py: Qwen3-Next's blocked projections):
    # its (absolute start, bytes) ranges, read one after another; empty: the one range at start
    runs: tuple[tuple[int, int], ...] = ()

    def ranges(self) -> tuple[tuple[int, int], ...]:
        """(absolute start, bytes) of the tensor's bytes, in order."""
        return self.runs or ((self.start, self.nbytes),)


class SafetensorsFile:
    """One open safetensors file; use as a context manager."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise FormatError(self.path, "(file)", "no such file") from None
        except IsADirectoryError:
            raise FormatError(self.path, "(file)", "is a directory") from None
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                raise FormatError(self.path, "(file)", "is a directory or not a regular file")
            self.metadata, self.tensors = self._parse()
        except BaseException:
            os.close(self._fd)
            raise

    def _err(self, field: str, msg: str) -> FormatError:
        return FormatError(self.path, field, msg)

    def _parse(self) -> tuple[dict[str, str], dict[str, SafetensorsTensor]]:
        size = os.fstat(self._fd).st_size
        if size < 8:
            raise self._err("header_size", f"file is {size} bytes, too short for the 8-byte header length")
        (hlen,) = struct.unpack("<Q", os.pread(self._fd, 8, 0))
        if hlen > MAX_HEADER_BYTES:
            raise self._err("header_size", f"header length {hlen} exceeds the {MAX_HEADER_BYTES}-byte limit")
        if 8 + hlen > size:
            raise self._err("header_size", f"header length {hlen} runs past the end of the {size}-byte file (truncated?)")
        header = loads_strict(os.pread(self._fd, hlen, 8), self.path)
        if not isinstance(header, dict):
            raise self._err("header", "header is not a JSON object")
        data_start = 8 + hlen
        data_len = size - data_start
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise self._err("__metadata__", "must be an object of string to string")
        tensors: dict[str, SafetensorsTensor] = {}
        for name, info in header.items():
            tensors[name] = self._parse_entry(name, info, data_start, data_len)
        self._check_coverage(tensors, data_start, data_len)
        return metadata, tensors

    def _check_coverage(self, tensors: dict[str, SafetensorsTensor], data_start: int, data_len: int) -> None:
        """The tensors' ranges tile the data section exactly, as the safetensors
        library requires ("file not fully covered"): sorted by (begin, end),
        each begins where the previous one ended, the first at 0, and the last
        ends at the end of the file. Without this a header length off by a
        few bytes (JSON may end in padding spaces) would still parse and
        shift every tensor's bytes. Zero-size tensors sit on a boundary."""
        spans = sorted((t.start - data_start, t.start - data_start + t.nbytes, t.name) for t in tensors.values())
        pos, prev = 0, None
        for b, e, name in spans:
            if b < pos:
                raise self._err(f"{name}.data_offsets", f"[{b}, {e}] overlaps tensor {prev!r} (which ends at {pos})")
            if b > pos:
                where = f"after tensor {prev!r}" if prev is not None else "at the start of the data section"
                raise self._err(f"{name}.data_offsets", f"begins at {b}, leaving bytes [{pos}, {b}) {where} covered "
                                "by no tensor (the data section must be fully covered)")
            pos, prev = e, name
        if pos != data_len:
            raise self._err("header_size", f"the tensors cover {pos} of the {data_len} bytes after the header; "
                            f"{data_len - pos} trailing bytes belong to no tensor (wrong header length or "
                            "appended bytes: the data section must be fully covered)")

    def _parse_entry(self, name: str, info: object, data_start: int, data_len: int) -> SafetensorsTensor:
        if not isinstance(info, dict):
            raise self._err(name, "tensor entry is not an object")
        st_dtype = info.get("dtype")
        if not isinstance(st_dtype, str):
            raise self._err(f"{name}.dtype", "missing or not a string")
        dtype = FROM_SAFETENSORS.get(st_dtype)
        if dtype is None:
            raise self._err(f"{name}.dtype", f"unsupported dtype {st_dtype!r} (supported: {', '.join(FROM_SAFETENSORS)})")
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise self._err(f"{name}.shape", f"must be a list of non-negative integers, got {shape!r}")
        n = shape_elements(shape)
        if n * dtype.itemsize > INT64_MAX:
            raise self._err(f"{name}.shape", f"byte size of shape {shape} overflows int64")
        offs = info.get("data_offsets")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)):
            raise self._err(f"{name}.data_offsets", f"must be [begin, end] integers, got {offs!r}")
        b, e = offs
        if not 0 <= b <= e:
            raise self._err(f"{name}.data_offsets", f"invalid range [{b}, {e}]")
        if e > data_len:
            raise self._err(f"{name}.data_offsets", f"end {e} is past the {data_len}-byte data section (truncated?)")
        if e - b != n * dtype.itemsize:
            raise self._err(f"{name}.data_offsets", f"range holds {e - b} bytes but {st_dtype}{shape} needs {n * dtype.itemsize}")
        return SafetensorsTensor(name, dtype, tuple(shape), data_start + b, e - b)

    def iter_chunks(self, t: SafetensorsTensor, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The tensor's bytes in order, in chunks of at most ``chunk_bytes``
        (a multiple of 8, so chunks never split an element)."""
        for start, nbytes in t.ranges():
            pos, end = start, start + nbytes
            while pos < end:
                want = min(chunk_bytes, end - pos)
                buf = os.pread(self._fd, want, pos)
                if len(buf) != want:
                    raise self._err(t.name, "file shrank while reading (truncated during conversion?)")
                yield buf
                pos += want

    def copy_to(self, t: SafetensorsTensor, dst_fd: int, dst_offset: int,
                advance: Callable[[int], None] | None = None) -> None:
        """The tensor's bytes, unchanged, into ``dst_fd`` at ``dst_offset``
        (fileio.copy_range: in the kernel where it can)."""
        for start, nbytes in t.ranges():
            if copy_range(self._fd, start, dst_fd, dst_offset, nbytes, advance) != nbytes:
                raise self._err(t.name, "file shrank while reading (truncated during conversion?)")
            dst_offset += nbytes

    def read_rows(self, t: SafetensorsTensor, rows: Iterable[int]) -> bytes:
        """The bytes of rows ``rows`` of ``t`` viewed as a matrix
        [prod(shape[:-1]), shape[-1]] (an expert stack's matrices' rows one
        after another), concatenated: one read each, nothing else of the tensor."""
        n_rows = math.prod(t.shape[:-1])
        row_bytes = t.nbytes // n_rows
        out = []
        starts = [0]  # (the first row of each range)
        for _s, nbytes in t.ranges():
            starts.append(starts[-1] + nbytes // row_bytes if row_bytes else 0)
        for r in rows:
            if not 0 <= r < n_rows:
                raise IndexError(f"{t.name}: row {r} of {n_rows}")
            i = bisect.bisect_right(starts, r) - 1
            buf = os.pread(self._fd, row_bytes, t.ranges()[i][0] + (r - starts[i]) * row_bytes)
            if len(buf) != row_bytes:
                raise self._err(t.name, "file shrank while reading (truncated during conversion?)")
            out.append(buf)
        return b"".join(out)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
