"""GGUF files (llama.cpp's model format), read strictly.

The ``gguf`` package's ``GGUFReader`` is a field library, not a validator:
it trusts every count and length in the file, so a hostile array count makes
it loop for ever, and a tensor whose data runs past the end comes back as a
short array; it is also slow (4-7 s for SmolLM2's 49152-token vocabulary,
one numpy view per string). So ``open_gguf`` walks the header itself,
checking each length against the bytes that remain before reading it, and
decodes the key-values as it goes (the tests check them against
``GGUFReader``'s, which stays the reference). The rules:

- magic ``GGUF``, version 2 or 3, little-endian (a big-endian file says so);
- counts bounded by what the file could hold; strings and arrays inside the
  file; no arrays of arrays; ``general.alignment`` a power of two;
- every tensor: a unique name, 1..4 dimensions, each >= 1, whose product
  does not overflow and whose rows are whole blocks of its ggml type; its
  data offset a multiple of the alignment; its bytes inside the file; no two
  tensors' bytes overlapping.

A model split by llama.cpp's ``gguf-split`` (or gguf-py's writer with
``split_max_tensors``/``split_max_size``) is opened from its first file,
``NAME-00001-of-0000N.gguf``, as llama.cpp's loader opens it: the first
file holds every key-value, each holds ``split.no`` (0-based),
``split.count`` and ``split.tensors.count``; the other files are found by
name beside it, each checked as above, and their tensors join one table
(``GGUFTensor.shard``). Every shard must be there and be the one its name
says; a tensor in two shards, a count that disagrees, or a key a later
shard holds with another value than the first's is an error.

Each broken rule is one ``FormatError`` naming the file and the field.
``read_header`` stops after the header's rules (the tensors' ggml type ids
as stored, unresolved): a tool can size the tensors of a file whose types
this reader does not know (ik_llama.cpp's, benchmarks/quality_bench.py).
"""

from __future__ import annotations

import io
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FormatError
from .fileio import check_regular

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 1 << 16
DEFAULT_ALIGNMENT = 32
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1

# GGUF value types: the scalars (7 is a bool byte); 8 is a string, 9 an array.
_SCALAR = {k: struct.Struct("<" + c) for k, c in
           {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}.items()}
_NUMPY = {k: np.dtype("<" + c) for k, c in
          {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "u1", 10: "u8", 11: "i8", 12: "f8"}.items()}
_BOOL, _STRING, _ARRAY = 7, 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: str      # gguf.GGMLQuantizationType name: "Q4_1", "F32", ...
    shape: list[int]    # row-major, as numpy and Hugging Face see it (GGUF stores it reversed)
    offset: int         # absolute offset of the data in its file
    nbytes: int
    shard: int = 0      # which of the model's files holds it (GGUFModel.paths)


@dataclass
class GGUFModel:
    path: Path
    version: int
    alignment: int
    fields: dict[str, Any]       # key -> decoded value (str, int, float, bool, list)
    tensors: list[GGUFTensor]    # in file order (a split model: shard by shard)
    files: list[io.FileIO]       # per shard, open for the tensors' reads (one for an unsplit file)
    paths: list[Path]            # per shard; paths[0] is ``path``

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> "GGUFModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def rows(self, t: GGUFTensor, r0: int, r1: int, row_bytes: int) -> np.ndarray:
        """Bytes [r0 * row_bytes, r1 * row_bytes) of ``t`` as uint8 [r1 - r0, row_bytes].
        Read, not mapped: a file truncated while it is imported is one error
        line ("shrank"), where a mapping's page past the new end was SIGBUS."""
        start, n = r0 * row_bytes, (r1 - r0) * row_bytes
        if not (0 <= r0 <= r1 and start + n <= t.nbytes):
            raise IndexError(f"{t.name}: bytes [{start}, {start + n}) of {t.nbytes}")
        buf = os.pread(self.files[t.shard].fileno(), n, t.offset + start)
        if len(buf) != n:
            raise FormatError(self.paths[t.shard], f"tensor {t.name!r}", "file shrank while reading (truncated "
                                                                         "during the import?)")
        return np.frombuffer(buf, np.uint8).reshape(r1 - r0, row_bytes)

    def take_rows(self, t: GGUFTensor, rows: np.ndarray, row_bytes: int) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) of ``t`` as uint8
        [len(rows), row_bytes]: one read per run of consecutive rows, so
        rows sampled across a large tensor read those rows, not the span
        between them."""
        rows = np.asarray(rows, np.int64)
        uniq = np.unique(rows)
        out = np.empty((len(uniq), row_bytes), np.uint8)
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(uniq)]):
            out[lo:hi] = self.rows(t, int(uniq[lo]), int(uniq[hi - 1]) + 1, row_bytes)
        return out[np.searchsorted(uniq, rows)]

    def tensor_bytes(self, t: GGUFTensor) -> np.ndarray:
        """The tensor's bytes (uint8), read whole: for small tensors (``rows`` streams)."""
        return self.rows(t, 0, 1, t.nbytes).reshape(-1)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    alignment: int
    fields: dict[str, Any]
    infos: list[tuple[str, list[int], int, int]]  # per tensor: name, dims (GGUF order), ggml type id, offset
    data_start: int  # file offset the tensors' offsets count from
    size: int  # of the file


class _Walk:
    """Bounded reads over the mapped file: every length checked before use."""

    def __init__(self, path: Path, buf: mmap.mmap):
        self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)

    def need(self, n: int, field: str) -> None:
        if n > self.size - self.pos:
            raise FormatError(self.path, field, f"needs {n} bytes at offset {self.pos}, past the end of the "
                                                f"{self.size}-byte file (truncated?)")

    def uint(self, size: int, field: str) -> int:
        self.need(size, field)
        v = int.from_bytes(self.buf[self.pos:self.pos + size], "little")
        self.pos += size
        return v

    def string(self, field: str, max_len: int | None = None) -> bytes:
        n = self.uint(8, field)
        if max_len is not None and n > max_len:
            raise FormatError(self.path, field, f"string length {n} exceeds {max_len}")
        self.need(n, field)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, vtype: int, field: str) -> Any:
        """Decode one value of GGUF type ``vtype`` (what GGUFReader's ``contents()`` gives)."""
        if vtype in _SCALAR:
            fmt = _SCALAR[vtype]
            self.need(fmt.size, field)
            v = fmt.unpack_from(self.buf, self.pos)[0]
            self.pos += fmt.size
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self.string(field).decode("utf-8", "replace")
        if vtype != _ARRAY:
            raise FormatError(self.path, field, f"unknown value type {vtype}")
        item = self.uint(4, field + " (array item type)")
        count = self.uint(8, field + " (array count)")
        if item in _SCALAR:
            size = _SCALAR[item].size
            if count > (self.size - self.pos) // size:
                raise FormatError(self.path, field, f"array of {count} items of {size} bytes runs past the end of the file")
            a = np.frombuffer(self.buf, _NUMPY[item], count, self.pos)
            self.pos += count * size
            return [bool(x) for x in a] if item == _BOOL else a.tolist()
        if item == _STRING:
            if count > (self.size - self.pos) // 8:
                raise FormatError(self.path, field, f"array of {count} strings cannot fit in the rest of the file")
            out, buf, pos, end = [], self.buf, self.pos, self.size
            for _ in range(count):  # the hot loop of a tokenizer's vocabulary: no calls but these
                n = _U64.unpack_from(buf, pos)[0] if end - pos >= 8 else -1
                if n < 0 or n > end - pos - 8:
                    self.pos = pos
                    self.need(8 if n < 0 else 8 + n, field)
                out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", "replace"))
                pos += 8 + n
            self.pos = pos
            return out
        if item == _ARRAY:
            raise FormatError(self.path, field, "arrays of arrays are not supported")
        raise FormatError(self.path, field, f"unknown array item type {item}")


def _type_sizes() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block elements, block bytes), from gguf's table."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """The header of GGUF file ``path``, checked up to the tensor infos (see
    the module docstring): their type ids are not resolved nor their bytes
    sized."""
    path = Path(path)
    size, f, buf = _map(path)
    with f, buf:
        return _header(path, size, buf)


def is_gguf_file(path: str | os.PathLike) -> bool:
    """A regular file that starts with GGUF's magic. This, not the name, is
    how a GGUF is told apart wherever one may be given: Ollama keeps its
    models as ``sha256-<digest>`` blobs, with no ``.gguf`` to go by."""
    try:
        if not Path(path).is_file():
            return False
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def open_gguf(path: str | os.PathLike) -> GGUFModel:
    """Validate ``path`` as a GGUF file (the first file of a split model, with
    the others beside it) and describe it (see the module docstring)."""
    path = Path(path)
    g = _open_one(path)
    try:
        paths = _shard_paths(path, g.fields)
        shard_of = {t.name: 0 for t in g.tensors}
        for i, p in enumerate(paths[1:], 1):
            _join(g, _open_one(p), i, len(paths), shard_of)
        if len(paths) > 1:
            total = g.fields[SPLIT_TENSORS]
            if total != len(g.tensors):
                raise FormatError(path, SPLIT_TENSORS, f"is {total}, but the {len(paths)} files hold "
                                                       f"{len(g.tensors)} tensors")
    except BaseException:
        g.close()
        raise
    return g


def shard_paths(path: str | os.PathLike) -> list[Path]:
    """The files of the GGUF model opened from ``path``: itself, or every
    shard of a split model, from the first's header (for hashing them all).
    A name that is not gguf-split's is one file without reading it (a
    split's first file so renamed is refused by ``open_gguf``)."""
    path = Path(path)
    if not _SHARD_NAME.fullmatch(path.name):
        return [path]
    return _shard_paths(path, read_header(path).fields)


SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
_SHARD_NAME = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.gguf")
MAX_SHARDS = 99999  # what the five-digit names of llama.cpp's gguf-split count to


def _count(fields: dict[str, Any], path: Path, key: str, lo: int, hi: int) -> int:
    v = fields.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise FormatError(path, key, f"expected an integer {lo}..{hi}, got {v!r}")
    return v


def _shard_paths(path: Path, fields: dict[str, Any]) -> list[Path]:
    """[path] for an unsplit file; a split model's files, named as gguf-split names them."""
    if SPLIT_COUNT not in fields:
        return [path]
    count = _count(fields, path, SPLIT_COUNT, 1, MAX_SHARDS)
    no = _count(fields, path, SPLIT_NO, 0, count - 1)
    _count(fields, path, SPLIT_TENSORS, 0, 2**31 - 1)
    if count == 1:
        return [path]
    m = _SHARD_NAME.fullmatch(path.name)
    if no != 0:
        first = f"{m.group(1)}-00001-of-{m.group(3)}.gguf" if m else "the file whose split.no is 0"
        raise FormatError(path, SPLIT_NO, f"is {no}: file {no + 1} of a model split in {count}; open it from "
                                          f"its first file, {first}")
    if m is None or int(m.group(2)) != 1 or int(m.group(3)) != count:
        raise FormatError(path, SPLIT_COUNT, f"is {count}, but the name is not NAME-00001-of-{count:05d}.gguf, "
                                             "so the other files cannot be found (keep gguf-split's names)")
    return [path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _open_one(path: Path) -> GGUFModel:
    size, f, buf = _map(path)
    try:
        with buf:
            return _tensors(path, _header(path, size, buf), f)
    except BaseException:
        f.close()
        raise


def _join(g: GGUFModel, part: GGUFModel, i: int, count: int, shard_of: dict[str, int]) -> None:
    """Shard ``i`` (0-based) of ``count`` into ``g`` (``shard_of``: which shard holds each tensor name so
    far); ``g`` owns its file from here."""
    g.files.append(part.files[0])
    g.paths.append(part.path)
    for key, want in ((SPLIT_NO, i), (SPLIT_COUNT, count), (SPLIT_TENSORS, g.fields[SPLIT_TENSORS])):
        if part.fields.get(key) != want:
            raise FormatError(part.path, key, f"is {part.fields.get(key)!r}, expected {want!r} (file {i + 1} of "
                                              f"{g.path.name}'s {count})")
    for key, v in part.fields.items():
        if key.startswith("split.") or key == "general.alignment":  # each file's own
            continue
        if key not in g.fields or g.fields[key] != v:
            raise FormatError(part.path, key, f"a key the first file, {g.path.name}, "
                                              + ("holds with another value" if key in g.fields else "does not hold")
                                              + ": llama.cpp reads the model's key-values from the first file only")
    for t in part.tensors:
        if t.name in shard_of:
            raise FormatError(part.path, f"tensor {t.name!r}", f"is in {g.paths[shard_of[t.name]].name} too")
        shard_of[t.name] = i
        g.tensors.append(GGUFTensor(t.name, t.ggml_type, t.shape, t.offset, t.nbytes, i))


def _map(path: Path) -> tuple[int, io.FileIO, mmap.mmap]:
    """(size, open file, its read-only mapping) of a regular file at least a GGUF header long."""
    size = check_regular(path).st_size
    if size < 24:
        raise FormatError(path, "header", f"is {size} bytes, shorter than a GGUF header (24)")
    try:
        f = io.FileIO(path, "r")
    except OSError as e:  # unreadable, or out of descriptors (a split of very many files)
        raise FormatError(path, "(file)", f"cannot open: {e.strerror}") from None
    try:
        return size, f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        f.close()
        raise FormatError(path, "(file)", f"cannot map: {e.strerror}") from None
    except BaseException:
        f.close()
        raise


def _header(path: Path, size: int, header: mmap.mmap) -> GGUFHeader:
    w = _Walk(path, header)
    if header[:4] != MAGIC:
        raise FormatError(path, "magic", f"is {header[:4]!r}, expected {MAGIC!r}: not a GGUF file")
    w.pos = 4
    version = w.uint(4, "version")
    if version not in VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
            raise FormatError(path, "version", "big-endian GGUF files are not supported")
        raise FormatError(path, "version", f"unsupported GGUF version {version} (this reader takes 2 and 3)")
    n_tensors = w.uint(8, "tensor_count")
    n_kv = w.uint(8, "kv_count")
    # The smallest key-value is 8 + 1 + 4 + 1 bytes, the smallest tensor info 8 + 1 + 4 + 8 + 4 + 8.
    if n_kv > size // 14:
        raise FormatError(path, "kv_count", f"{n_kv} key-values cannot fit in a {size}-byte file")
    if n_tensors > size // 33:
        raise FormatError(path, "tensor_count", f"{n_tensors} tensors cannot fit in a {size}-byte file")

    fields: dict[str, Any] = {}
    for i in range(n_kv):
        key = w.string(f"kv[{i}].key", MAX_NAME).decode("utf-8", "replace")
        if key in fields:
            raise FormatError(path, key, "duplicate key")
        fields[key] = w.value(w.uint(4, f"{key} (type)"), key)
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1) or alignment > (1 << 20):
        raise FormatError(path, "general.alignment", f"must be a power of two up to 2^20, got {alignment!r}")

    infos = []
    for i in range(n_tensors):
        raw = w.string(f"tensors[{i}].name", MAX_NAME)
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(path, f"tensors[{i}].name", "is not UTF-8") from None
        where = f"tensor {name!r}"
        n_dims = w.uint(4, f"{where} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise FormatError(path, f"{where} n_dims", f"must be 1..{MAX_DIMS}, got {n_dims}")
        dims = [w.uint(8, f"{where} dims") for _ in range(n_dims)]
        tid = w.uint(4, f"{where} type")
        offset = w.uint(8, f"{where} offset")
        infos.append((name, dims, tid, offset))
    return GGUFHeader(version, alignment, fields, infos, -(-w.pos // alignment) * alignment, size)


def _tensors(path: Path, h: GGUFHeader, f: io.FileIO) -> GGUFModel:
    """The model of header ``h``: every tensor's type resolved and its bytes checked."""
    size, alignment, data_start = h.size, h.alignment, h.data_start
    types = _type_sizes()
    tensors, seen = [], set()
    for name, dims, tid, offset in h.infos:
        where = f"tensor {name!r}"
        if name in seen:
            raise FormatError(path, where, "duplicate tensor name")
        seen.add(name)
        if tid not in types:
            raise FormatError(path, f"{where} type", f"unknown ggml type {tid}")
        tname, block, block_bytes = types[tid]
        if any(d < 1 for d in dims):
            raise FormatError(path, f"{where} dims", f"every dimension must be >= 1, got {dims}")
        n = 1
        for d in dims:
            if d > _I64_MAX // n:
                raise FormatError(path, f"{where} dims", f"{dims}: the element count overflows 64 bits")
            n *= d
        if dims[0] % block:
            raise FormatError(path, f"{where} dims", f"rows of {dims[0]} elements are not whole {tname} blocks of {block}")
        nbytes = n // block * block_bytes
        if offset % alignment:
            raise FormatError(path, f"{where} offset", f"{offset} is not a multiple of the alignment {alignment}")
        if offset > size or nbytes > size - data_start - min(offset, size):
            raise FormatError(path, f"{where} offset", f"data [{data_start + offset}, +{nbytes}) runs past the end of "
                                                       f"the {size}-byte file (truncated?)")
        tensors.append(GGUFTensor(name, tname, list(reversed(dims)), data_start + offset, nbytes))
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise FormatError(path, f"tensor {b.name!r} offset", f"its data overlaps tensor {a.name!r}'s")

    return GGUFModel(path, h.version, alignment, h.fields, tensors, [f], [path])
