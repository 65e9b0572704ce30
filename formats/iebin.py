"""IEBIN schema2: ``model.ie.json`` (metadata) + ``model.ie.bin`` (payloads).

The spec is docs/formats/iebin.md and the JSON Schema is
schemas/iebin.schema.json. This module is the single implementation of the
format: the writer used by ``ieconv``, the strict validator used by
``ieconv validate`` and the tests, and the loader the runtime builds on.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import checksums
from . import dedup
from .atomic import StagedFiles, start_writeback, write_file_atomic
from .dtypes import DTYPES, INT64_MAX, shape_elements
from .errors import FormatError, IEError
from .fileio import iter_range, read_small
from .hf_config import check_summary
from .finite import PayloadScan
from .jsonio import aux_json_check, dumps_canonical, load_json, schema_check
from .paths import check_relpath, resolve_inside
from .quant import SCHEMES, QuantDictError, QuantError
from .tensor_entries import QUANT_KEY, STORE_KEY, expert_of, expert_slice, slice_problem

FORMAT_NAME = "iebin"
VERSION = 2
DEFAULT_ALIGNMENT = 64
# Disk writes of the payload file are started every this many bytes (IebinWriter._write_back).
WRITEBACK_BYTES = 16 << 20
META_NAME = "model.ie.json"
BIN_NAME = "model.ie.bin"
TENSOR_KEYS = ("name", "dtype", "shape", "file", "file_data_offset", "nbytes")  # + the digest (formats/checksums.py)
# A tensor whose bytes are not in a backing file but in the model's dedup
# store (model.dedup.json + blobs, docs/formats/dedup.md) says so with
# "store": "dedup" in place of file and file_data_offset, so every reader
# knows where it lives (and an older reader refuses it instead of guessing).
STORES = ("dedup",)
STORE_TENSOR_KEYS = ("name", "dtype", "shape", STORE_KEY, "nbytes")
# Optional on quantized tensors: the quantizer's predicted loss (QuantError.record);
# its keys and types are the JSON Schema's to check (validate_meta's backstop).
ERROR_KEY = "quant_error"
LEGACY_KEYS = ("shard", "shard_data_offset")

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "iebin.schema.json"


def _is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass and must not pass


# --------------------------------------------------------------------------
# Model summary
# --------------------------------------------------------------------------

# The fields of the ``model`` object: the source config normalised (the
# converter fills them in from config.json, formats/hf_config.py), null where
# unknown.
MODEL_FIELDS = ("architecture", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
                "rope_theta", "rope_scaling", "norm_eps", "hidden_act", "tie_word_embeddings", "torch_dtype",
                "bos_token_id", "eos_token_id")


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------


class IebinWriter:
    """Streams tensors into a staged ``model.ie.bin``, then writes the JSON.

    Payloads start at multiples of ``alignment``; the gap before each is
    zero-filled. A zero-size tensor still gets its own offset (the next
    tensor starts at least one byte later), so no two tensors share a start
    and the overlap rule needs no special case.
    """

    def __init__(self, staged: StagedFiles, alignment: int = DEFAULT_ALIGNMENT,
                 checksum: str = checksums.DEFAULT):
        self.alignment = alignment
        self.checksum = checksums.ALGORITHMS[checksum]
        self._f = staged.open(BIN_NAME)
        self._staged = staged
        self._written = 0  # bytes actually in the file
        self._next = 0  # first offset the next tensor may use
        self.tensors: list[dict[str, Any]] = []
        # Payloads are hashed on this worker while the next chunk or payload
        # is produced (hashes and file I/O release the GIL), so hashing does
        # not add to a conversion's time on two cores. add_copy's digests
        # are collected by finish().
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="iekit-hash")
        self._pending: list[tuple[dict[str, Any], Any]] = []
        self._pending_done = 0  # how many of them _raise_failed has seen finish
        self._flushed = 0  # bytes whose writeback has been started (start_writeback)

    def _write_back(self) -> None:
        """Start the disk writes of what was written since the last call,
        once that is at least WRITEBACK_BYTES."""
        if self._written - self._flushed >= WRITEBACK_BYTES:
            self._f.flush()
            start_writeback(self._f.fileno(), self._flushed, self._written - self._flushed)
            self._flushed = self._written

    def _raise_failed(self) -> None:
        """Raise what a finished read-back of add_copy raised (a short read,
        a non-finite value), without waiting for the ones still running."""
        while self._pending_done < len(self._pending) and self._pending[self._pending_done][1].done():
            self._pending[self._pending_done][1].result()
            self._pending_done += 1

    def _start(self) -> int:
        """Zero-fill up to the next aligned offset and return it."""
        offset = -(-self._next // self.alignment) * self.alignment
        if offset > self._written:
            self._f.write(b"\0" * (offset - self._written))
        return offset

    def add_copy(self, name: str, dtype: str, shape: list[int], nbytes: int,
                 copy: Callable[[int, int], None], extra: dict[str, Any] | None = None,
                 check: Callable[[memoryview], None] | None = None) -> dict[str, Any]:
        """A payload the source already holds as it must be stored:
        ``copy(fd, offset)`` puts its ``nbytes`` into the staged file's
        descriptor at ``offset`` (SafetensorsFile.copy_to: in the kernel, never
        through Python). The digest is of the bytes as written, read back
        from the staged file on a worker while the next payload is copied;
        ``check`` (finite.checker) is fed the same bytes there, and what it
        raises is raised by a later add_* or by finish()."""
        self._raise_failed()
        offset = self._start()
        self._f.flush()
        copy(self._f.fileno(), offset)
        self._f.seek(offset + nbytes)
        self._written = offset + nbytes
        self._next = offset + max(nbytes, 1)
        entry = {"name": name, "dtype": dtype, "shape": list(shape), "file": BIN_NAME,
                 "file_data_offset": offset, "nbytes": nbytes, **(extra or {})}
        digest = self._hasher.submit(checksums.digest_range, self._f, offset, nbytes, self.checksum.name, check)
        self._pending.append((entry, digest))
        self.tensors.append(entry)
        self._write_back()
        return entry

    def add_tensor(self, name: str, dtype: str, shape: list[int], chunks: Iterable[bytes],
                   expected_nbytes: int, extra: dict[str, Any] | None = None,
                   error: QuantError | None = None) -> dict[str, Any]:
        """Write one payload from ``chunks``; ``error``, filled while they are
        produced (Scheme.stream), is recorded as the entry's quant_error."""
        self._raise_failed()
        offset = self._start()
        h = self.checksum.new()
        n = 0
        pending = None
        for c in chunks:
            if pending is not None:
                pending.result()
            pending = self._hasher.submit(h.update, c)
            self._f.write(c)
            n += len(c)
        if pending is not None:
            pending.result()
        if n != expected_nbytes:
            raise IEError(f"{name}: produced {n} bytes, expected {expected_nbytes}")
        self._written = offset + n
        self._next = offset + max(n, 1)
        entry = {"name": name, "dtype": dtype, "shape": list(shape), "file": BIN_NAME,
                 "file_data_offset": offset, "nbytes": n, self.checksum.name: h.hexdigest(), **(extra or {})}
        if error is not None:
            entry[ERROR_KEY] = error.record()
        self.tensors.append(entry)
        self._write_back()
        return entry

    def add_in_store(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A tensor whose bytes the dedup store holds (dedup-pack): its entry
        as validated elsewhere, file and offset replaced by the store."""
        out = {k: v for k, v in entry.items() if k not in ("file", "file_data_offset")}
        out[STORE_KEY] = "dedup"
        self.tensors.append(out)
        return out

    def stage_aux(self, files: dict[str, bytes]) -> list[dict[str, Any]]:
        """Stage the non-tensor files (config, tokenizer) beside the payload;
        their ``aux_files`` records for ``finish``."""
        records = []
        for name, data in files.items():
            self._staged.write_bytes(name, data)
            records.append({"name": name, "nbytes": len(data), self.checksum.name: checksums.digest(self.checksum.name, data)})
        return records

    def finish(self, *, config: dict, source: dict, tokenizer_files: list[str],
               aux_files: list[dict[str, Any]], model: dict[str, Any] | None = None) -> dict[str, Any]:
        """Build the metadata, self-validate it and stage ``model.ie.json``.
        ``model`` is the normalised summary of ``config`` (MODEL_FIELDS);
        without it every field is null."""
        for entry, digest in self._pending:
            entry[self.checksum.name] = digest.result()
        self._pending.clear()
        self._pending_done = 0
        self._hasher.shutdown()
        meta = {
            "format": FORMAT_NAME,
            "version": VERSION,
            "alignment": self.alignment,
            "checksum": self.checksum.name,
            "producer": "ieconv",
            "model": model if model is not None else dict.fromkeys(MODEL_FIELDS),
            "config": config,
            "tokenizer": {"files": tokenizer_files},
            "source": source,
            "aux_files": aux_files,
            "files": [{"name": BIN_NAME, "nbytes": self._written}],
            "tensors": self.tensors,
        }
        validate_meta(meta, META_NAME)
        self._staged.write_bytes(META_NAME, dumps_canonical(meta))
        return meta


# --------------------------------------------------------------------------
# Validator
# --------------------------------------------------------------------------


def plain_nbytes(dtype: str, shape: list[int]) -> int:
    return shape_elements(shape) * DTYPES[dtype].itemsize


def dtype_totals(tensors: Iterable[dict[str, Any]]) -> dict[str, list[int]]:
    """Per dtype of an artifact's tensor entries: [tensors, bytes, elements]
    (ieconv inspect's totals and ieconv quantize's summary)."""
    totals: dict[str, list[int]] = {}
    for t in tensors:
        c = totals.setdefault(t["dtype"], [0, 0, 0])
        c[0] += 1
        c[1] += t["nbytes"]
        c[2] += shape_elements(t["shape"])
    return totals


def quantized_totals(totals: dict[str, list[int]]) -> tuple[int, int, float | None]:
    """(tensors, bytes, bits per weight, scales included; None without any) of
    the quantized dtypes in dtype_totals' ``totals``."""
    q = [v for k, v in totals.items() if k in SCHEMES]
    elems = sum(v[2] for v in q)
    return sum(v[0] for v in q), sum(v[1] for v in q), (8 * sum(v[1] for v in q) / elems if elems else None)


def tensor_nbytes(dtype: str, shape: list[int], quant: dict | None = None) -> int:
    """Payload size of a (validated) tensor entry, plain or quantized."""
    scheme = SCHEMES.get(dtype)
    if scheme is None:
        return plain_nbytes(dtype, shape)
    return scheme.tensor_nbytes(shape, scheme.params_from(quant, shape[-1]))


def _check_tensor(i: int, t: object, meta_file: str, alignment: int, alg: checksums.Algorithm) -> None:
    where = f"tensors[{i}]"
    if not isinstance(t, dict):
        raise FormatError(meta_file, where, "tensor entry is not an object")
    name = t.get("name")
    label = f"tensor {name!r}: " if isinstance(name, str) else ""
    for k in LEGACY_KEYS:
        if k in t:
            raise FormatError(meta_file, f"{where}.{k}", f"{label}legacy key {k!r}; run `ieconv iebin-upgrade` to convert to schema2")
    keys = STORE_TENSOR_KEYS if STORE_KEY in t else TENSOR_KEYS
    for k in keys:
        if k not in t:
            raise FormatError(meta_file, where, f"{label}missing key {k!r}")
    if STORE_KEY in t and t[STORE_KEY] not in STORES:
        raise FormatError(meta_file, f"{where}.{STORE_KEY}", f"{label}unknown store {t[STORE_KEY]!r} (known: {', '.join(STORES)})")
    checksums.check_record(t, alg, meta_file, where, label)
    quantized = isinstance(t.get("dtype"), str) and t["dtype"] in SCHEMES
    allowed = keys + (alg.name,) + ((QUANT_KEY, ERROR_KEY) if quantized else ())
    unknown = sorted(set(t) - set(allowed))
    if unknown:
        raise FormatError(meta_file, f"{where}.{unknown[0]}", f"{label}unknown key {unknown[0]!r}")
    if not isinstance(name, str) or not name:
        raise FormatError(meta_file, f"{where}.name", f"must be a non-empty string, got {name!r}")
    dtype = t["dtype"]
    if not isinstance(dtype, str):
        raise FormatError(meta_file, f"{where}.dtype", f"{label}must be a string, got {dtype!r}")
    if dtype not in DTYPES and dtype not in SCHEMES:
        if dtype.lower() in DTYPES or dtype.lower() in SCHEMES:
            raise FormatError(meta_file, f"{where}.dtype", f"{label}dtype {dtype!r} must be lowercase ({dtype.lower()!r})")
        raise FormatError(meta_file, f"{where}.dtype", f"{label}unknown dtype {dtype!r} (known: {', '.join([*DTYPES, *SCHEMES])})")
    shape = t["shape"]
    if not isinstance(shape, list):
        raise FormatError(meta_file, f"{where}.shape", f"{label}must be a list, got {shape!r}")
    for j, d in enumerate(shape):
        if not _is_int(d):
            raise FormatError(meta_file, f"{where}.shape[{j}]", f"{label}dimension {d!r} is not an integer")
        if d < 0:
            raise FormatError(meta_file, f"{where}.shape[{j}]", f"{label}dimension {d} is negative")
    if dtype in SCHEMES:
        if QUANT_KEY not in t:
            raise FormatError(meta_file, where, f"{label}quantized dtype {dtype!r} needs a 'quant' object")
        try:
            params = SCHEMES[dtype].parse_quant(t[QUANT_KEY], shape)
        except QuantDictError as e:
            field = f"{where}.quant" + (f".{e.key}" if e.key else "")
            raise FormatError(meta_file, field, f"{label}{e}") from None
        expected = SCHEMES[dtype].tensor_nbytes(shape, params)
    else:
        expected = plain_nbytes(dtype, shape)
    if expected > INT64_MAX:
        raise FormatError(meta_file, f"{where}.shape", f"{label}byte size of shape {shape} overflows 64 bits")
    nbytes = t["nbytes"]
    if not _is_int(nbytes) or nbytes < 0:
        raise FormatError(meta_file, f"{where}.nbytes", f"{label}must be a non-negative integer, got {nbytes!r}")
    if nbytes != expected:
        raise FormatError(meta_file, f"{where}.nbytes", f"{label}{nbytes} disagrees with {dtype}{shape} = {expected} bytes")
    if STORE_KEY in t:
        return
    off = t["file_data_offset"]
    if not _is_int(off) or off < 0:
        raise FormatError(meta_file, f"{where}.file_data_offset", f"{label}must be a non-negative integer, got {off!r}")
    if off > INT64_MAX - nbytes:
        raise FormatError(meta_file, f"{where}.file_data_offset", f"{label}offset + nbytes overflows 64 bits")
    if off % alignment:
        raise FormatError(meta_file, f"{where}.file_data_offset", f"{label}offset {off} is not a multiple of alignment {alignment}")
    check_relpath(t["file"], meta_file, f"{where}.file")


def validate_meta(meta: object, meta_file: str | os.PathLike = META_NAME) -> None:
    """Every rule that needs only the JSON (no backing files)."""
    meta_file = os.fspath(meta_file)
    if not isinstance(meta, dict):
        raise FormatError(meta_file, "(root)", "must be a JSON object")
    fmt = meta.get("format")
    if fmt != FORMAT_NAME:
        raise FormatError(meta_file, "format", f"unknown format {fmt!r} (expected {FORMAT_NAME!r})")
    ver = meta.get("version")
    if ver != VERSION or not _is_int(ver):
        raise FormatError(meta_file, "version", f"unsupported version {ver!r} (this build reads {VERSION})")
    align = meta.get("alignment")
    if not _is_int(align) or align < 1 or align > (1 << 20) or align & (align - 1):
        raise FormatError(meta_file, "alignment", f"must be a power of two between 1 and 2^20, got {align!r}")
    alg = checksums.algorithm(meta.get("checksum"), meta_file)
    tensors = meta.get("tensors")
    if not isinstance(tensors, list):
        raise FormatError(meta_file, "tensors", "missing or not a list")
    seen: dict[str, int] = {}
    for i, t in enumerate(tensors):
        _check_tensor(i, t, meta_file, align, alg)
        if t["name"] in seen:
            raise FormatError(meta_file, f"tensors[{i}].name", f"duplicate tensor name {t['name']!r} (also tensors[{seen[t['name']]}])")
        seen[t["name"]] = i
    for key in ("files", "aux_files"):
        # The type first: this loop and check_backing_files iterate it (a missing
        # key is left to the schema check below).
        if key not in meta:
            continue
        if not isinstance(meta[key], list):
            raise FormatError(meta_file, key, f"must be a list of file records, got {meta[key]!r:.40}")
        for i, f in enumerate(meta[key]):
            if isinstance(f, dict) and "name" in f:
                check_relpath(f["name"], meta_file, f"{key}[{i}].name")
    # The other records with a digest (the schema checks their other keys).
    source = meta.get("source")
    shards = source.get("shards") if isinstance(source, dict) else None
    for key, records in (("aux_files", meta.get("aux_files")), ("source.shards", shards)):
        for i, f in enumerate(records if isinstance(records, list) else []):
            if isinstance(f, dict):
                checksums.check_record(f, alg, meta_file, f"{key}[{i}]")
    # The schema is the backstop for everything else (types of the other
    # top-level objects); the checks above give the precise messages.
    schema_check(meta, SCHEMA_PATH, meta_file)
    check_summary(meta, meta_file)


@dataclass
class IebinModel:
    """A validated IEBIN artifact."""

    dir: Path
    meta_path: Path
    meta: dict[str, Any]

    @property
    def tensors(self) -> list[dict[str, Any]]:
        return self.meta["tensors"]

    @property
    def checksum(self) -> str:
        """The algorithm (formats/checksums.py) whose name keys every digest here."""
        return self.meta["checksum"]

    def tensor(self, name: str) -> dict[str, Any]:
        for t in self.tensors:
            if t["name"] == name:
                return t
        raise IEError(f"{self.meta_path}: no tensor named {name!r}")

    def path_of(self, entry: dict[str, Any]) -> Path:
        """The backing file of a stored tensor (not one in the dedup store)."""
        if STORE_KEY in entry:
            raise IEError(f"{self.meta_path}: tensor {entry['name']!r} lives in the {entry[STORE_KEY]} store, "
                          "not in a backing file")
        return self.dir / entry["file"]

    def entry(self, name: str, in_store: bool = False) -> dict[str, Any]:
        """A tensor's entry by name, or an expert slice's (``STACK[e]``: expert)."""
        if expert_of(name) is not None and all(t["name"] != name for t in self.tensors):
            return self.expert(name, in_store)
        return self.tensor(name)

    def expert(self, name: str, in_store: bool = False) -> dict[str, Any]:
        """The entry of the expert slice ``STACK[e]`` (expert_slice), for
        the tools that treat each expert of a stack as a matrix of its own;
        of a stack in the dedup store only with ``in_store`` (the runtime,
        which slices the rebuilt stack)."""
        parsed = expert_of(name)
        if parsed is None:
            raise IEError(f"{self.meta_path}: {name!r} does not name an expert slice (STACK[e])")
        t = self.tensor(parsed[0])
        problem = slice_problem(t, parsed[1], in_store)
        if problem:
            raise FormatError(self.meta_path, f"tensors[{self.tensors.index(t)}]", f"{name!r}: {problem}")
        return expert_slice(t, parsed[1])

    @property
    def stored(self) -> list[dict[str, Any]]:
        """The tensors whose bytes are in a backing file."""
        return [t for t in self.tensors if STORE_KEY not in t]

    @property
    def in_store(self) -> list[dict[str, Any]]:
        """The tensors whose bytes are in the dedup store (empty unless packed)."""
        return [t for t in self.tensors if STORE_KEY in t]


def meta_path_for(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / META_NAME if p.is_dir() else p


def load_model(path: str | os.PathLike, deep: bool = False, allow_nonfinite: bool = False) -> IebinModel:
    """Load and fully validate an IEBIN artifact (a dir or its model.ie.json).

    ``deep`` also re-hashes every tensor and auxiliary file and reads what
    the payloads hold: non-finite quantization scales are errors, and so are
    non-finite float weights unless ``allow_nonfinite``.
    """
    meta_path = meta_path_for(path)
    # A directory's model.ie.json must resolve inside it, like every file it names.
    meta = load_json(meta_path, inside=meta_path.parent if Path(path).is_dir() else None)
    validate_meta(meta, meta_path)
    check_backing_files(meta, meta_path, deep, allow_nonfinite)
    return IebinModel(meta_path.parent, meta_path, meta)


def check_backing_files(meta: dict[str, Any], meta_path: Path, deep: bool = False,
                        allow_nonfinite: bool = False) -> None:
    """The rules that need the files next to ``meta_path``: sizes, containment,
    ranges, overlaps, and (``deep``) checksums and stored values: one
    streaming pass per tensor (formats/finite.py), so memory stays at a few
    chunks whatever the model size. ``meta`` must have passed
    validate_meta. Files are identified by their resolved path, so an alias
    (``./model.ie.bin``, an in-directory symlink) cannot hide an overlap."""
    model_dir = meta_path.parent
    mf = os.fspath(meta_path)
    alg = meta["checksum"]
    by_name: dict[str, tuple[Path, int]] = {}
    seen_real: dict[Path, int] = {}
    for i, f in enumerate(meta["files"]):
        real = resolve_inside(model_dir, f["name"], mf, f"files[{i}].name")
        if real in seen_real:
            raise FormatError(mf, f"files[{i}].name", f"{f['name']!r} is listed twice (same file as files[{seen_real[real]}])")
        seen_real[real] = i
        if not real.is_file():
            raise FormatError(mf, f"files[{i}].name", f"{f['name']!r} does not exist in {model_dir}")
        actual = real.stat().st_size
        if actual != f["nbytes"]:
            raise FormatError(real, "(size)", f"file is {actual} bytes but {META_NAME} files[{i}].nbytes says {f['nbytes']} (truncated or replaced?)")
        by_name[f["name"]] = (real, actual)

    spans: dict[Path, list[tuple[int, int, int]]] = {}
    for i, t in enumerate(meta["tensors"]):
        if STORE_KEY in t:
            continue
        resolve_inside(model_dir, t["file"], mf, f"tensors[{i}].file")
        if t["file"] not in by_name:
            raise FormatError(mf, f"tensors[{i}].file", f"tensor {t['name']!r}: {t['file']!r} is not listed in files")
        real, size = by_name[t["file"]]
        off, n = t["file_data_offset"], t["nbytes"]
        if off + n > size:
            raise FormatError(mf, f"tensors[{i}].file_data_offset", f"tensor {t['name']!r}: bytes [{off}, {off + n}) run past the end of {t['file']} ({size} bytes)")
        spans.setdefault(real, []).append((off, off + max(n, 1), i))
    for real, sp in spans.items():
        sp.sort()
        for (s0, e0, i0), (s1, _e1, i1) in zip(sp, sp[1:]):
            if s1 < e0:
                n0, n1 = meta["tensors"][i0]["name"], meta["tensors"][i1]["name"]
                raise FormatError(mf, f"tensors[{i1}].file_data_offset", f"tensor {n1!r} overlaps tensor {n0!r} in {real.name} (offset {s1} < end {e0})")

    for i, a in enumerate(meta["aux_files"]):
        real = resolve_inside(model_dir, a["name"], mf, f"aux_files[{i}].name")
        if not real.is_file():
            raise FormatError(mf, f"aux_files[{i}].name", f"{a['name']!r} does not exist in {model_dir}")
        if real.stat().st_size != a["nbytes"]:
            raise FormatError(real, "(size)", f"file is {real.stat().st_size} bytes but aux_files[{i}].nbytes says {a['nbytes']}")
        if deep:  # the checksum and the JSON check on one read: a file changing between two reads passes neither
            data = read_small(real)
            if len(data) != a["nbytes"] or checksums.digest(alg, data) != a[alg]:
                raise FormatError(mf, f"aux_files[{i}].{alg}", f"{a['name']!r}: checksum mismatch")
            aux_json_check(data, real)

    if any(STORE_KEY in t for t in meta["tensors"]):
        check_store(meta, meta_path, deep, allow_nonfinite)
    if deep:
        for i, t in enumerate(meta["tensors"]):
            if STORE_KEY in t:
                continue
            scan = PayloadScan(t, allow_nonfinite)
            h = checksums.ALGORITHMS[alg].new()
            with open(by_name[t["file"]][0], "rb") as f:
                for buf in iter_range(f, t["file_data_offset"], t["nbytes"]):
                    h.update(buf)
                    scan.feed(buf)
            got = h.hexdigest()
            if got != t[alg]:
                raise FormatError(mf, f"tensors[{i}].{alg}", f"tensor {t['name']!r}: checksum mismatch (stored {t[alg][:12]}…, actual {got[:12]}…)")
            if scan.problem:
                raise FormatError(mf, f"tensors[{i}]", f"tensor {t['name']!r}: {scan.problem}")


def check_store(meta: dict[str, Any], meta_path: Path, deep: bool = False, allow_nonfinite: bool = False) -> None:
    """The tensors in the dedup store: model.dedup.json must be in the model
    directory (a packed model without it has no bytes for them: an error
    naming the file, never a fallback), pass the index rules with its blobs,
    and hold each such tensor as a member with the same dtype, shape, nbytes
    and digest; every member must be a tensor of the model. ``deep``:
    each member rebuilt (streamed) hashes to its digest and holds finite
    values, as a stored tensor's payload must."""
    mf = os.fspath(meta_path)
    index_path = meta_path.parent / dedup.INDEX_NAME
    if not os.path.lexists(index_path):
        i, t = next((i, t) for i, t in enumerate(meta["tensors"]) if STORE_KEY in t)
        raise FormatError(mf, f"tensors[{i}].{STORE_KEY}", f"tensor {t['name']!r} lives in the dedup store, but "
                          f"{index_path} does not exist (the store's files must travel with the model)")
    index = dedup.load_index(meta_path.parent)
    alg = meta["checksum"]
    dedup.cross_check(index, meta["tensors"], meta_path, alg)
    members = {m["name"]: (grp, m) for _g, _j, grp, m in index.members()}
    for i, t in enumerate(meta["tensors"]):
        if STORE_KEY not in t:
            continue
        if t["name"] not in members:
            raise FormatError(mf, f"tensors[{i}].{STORE_KEY}", f"tensor {t['name']!r} lives in the dedup store, but "
                              f"{index.path.name} has no member of that name")
        if not deep:
            continue
        grp, m = members[t["name"]]
        scan = PayloadScan(t, allow_nonfinite)
        h = checksums.ALGORITHMS[alg].new()
        for buf in dedup.iter_member(index, grp, m):
            h.update(buf)
            scan.feed(buf)
        if h.hexdigest() != t[alg]:
            raise FormatError(mf, f"tensors[{i}].{alg}", f"tensor {t['name']!r}: rebuilt from the dedup store, "
                              f"checksum mismatch (stored {t[alg][:12]}…, actual {h.hexdigest()[:12]}…)")
        if scan.problem:
            raise FormatError(mf, f"tensors[{i}]", f"tensor {t['name']!r}: {scan.problem}")


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """Validate and atomically (re)write a model.ie.json."""
    validate_meta(meta, path)
    write_file_atomic(path, dumps_canonical(meta))
