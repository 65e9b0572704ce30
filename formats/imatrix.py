"""Importance matrices (docs/formats/imatrix.md): per input column of every
matrix, the mean of x² over calibration text, as llama-imatrix collects it.

The file is an uncompressed zip (numpy's ``.npz``, so ``np.load`` reads it):
one ``NAME.npy`` member per matrix, float32 [cols] (an expert stack
[experts, rows, cols]: [experts, cols], each expert's means over the rows
routed to it), and ``__meta__.json``.
``write`` makes it byte for byte reproducible (members sorted, fixed
timestamps, .npy format 1.0); ``read`` is strict: it reads only regular
files, only stored (never deflated) members of bounded size, and refuses any
member, dtype, shape or value the spec does not allow, with one line naming
the file and the member. ``select_for`` holds an imatrix to a model's
matrices (names and column counts). ``read_any`` also reads llama.cpp's
imatrix files (GGUF, and the legacy ``.dat``), so users can reuse theirs.
"""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .atomic import StagedFiles, write_file_atomic
from .errors import FormatError
from .fileio import read_small
from .jsonio import dumps_canonical, loads_strict

FORMAT = "iekit-imatrix"
VERSION = 1
META = "__meta__.json"
MAX_FILE = 1 << 30        # bytes of a whole imatrix file
MAX_COLS = 1 << 24        # columns of one matrix
MAX_EXPERTS = 1 << 12     # experts of one stack's entry
# The largest importance (a mean of x²: activations of 1e15) read. Larger
# finite values overflowed float32 sums in the weighted scale search, and
# the conversion failed on its own output's NaN losses.
MAX_IMPORTANCE = 1e30
_EPOCH = (1980, 1, 1, 0, 0, 0)
# What zipfile raises on a broken archive (truncated members end in EOFError, an
# encrypted or unknown-method member in RuntimeError / NotImplementedError).
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, RuntimeError,
               NotImplementedError)
# What numpy's .npy header parser raises on a malformed header (it literal_evals a dict).
_NPY_ERRORS = (ValueError, SyntaxError, TypeError, RecursionError, MemoryError)
_META_KEYS = {"format": str, "version": int, "tokens": int, "chunks": int, "ctx": int, "source": dict}


class Imatrix:
    """``entries``: matrix name -> float32 [cols] (a stack: [experts, cols]), the mean of x² per input column;
    ``meta``: format, version, tokens, chunks, ctx and the source (model, text);
    ``routed``: for expert matrices, the rows each mean is over (an int, or [experts] for a stack)
    where a collection knows them. Every other entry is over ``tokens``. Not kept in the .npz
    (a quantizer needs only the means); llama.cpp's GGUF imatrix stores them as counts."""

    def __init__(self, entries: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                 routed: Mapping[str, Any] | None = None):
        self.entries = dict(entries)
        self.meta = dict(meta)
        self.routed = dict(routed or {})

    @property
    def tokens(self) -> int:
        return int(self.meta["tokens"])


def to_bytes(im: Imatrix) -> bytes:
    """The file's bytes: the same Imatrix always gives the same bytes."""
    check_values(im.entries, "imatrix")
    meta = {**im.meta, "format": FORMAT, "version": VERSION}
    check_meta(meta, "imatrix")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(im.entries):
            a = io.BytesIO()
            np.lib.format.write_array(a, np.ascontiguousarray(im.entries[name], "<f4"), version=(1, 0),
                                      allow_pickle=False)
            z.writestr(zipfile.ZipInfo(name + ".npy", _EPOCH), a.getvalue())
        z.writestr(zipfile.ZipInfo(META, _EPOCH), dumps_canonical(meta))
    return buf.getvalue()


def write(path: Path, im: Imatrix, *, overwrite: bool = False) -> None:
    """Staged, fsynced and renamed into place; an existing file only with ``overwrite``."""
    try:
        write_file_atomic(Path(path), to_bytes(im), replace=overwrite)
    except FileExistsError:
        raise FormatError(path, "file", "exists (pass --overwrite to replace it)") from None


def check_values(entries: Mapping[str, np.ndarray], where: str | Path) -> None:
    if not entries:
        raise FormatError(where, "members", "no matrices")
    for name, a in entries.items():
        if not isinstance(name, str) or not name or name.startswith("/"):
            raise FormatError(where, repr(name), "not a matrix name")
        if a.ndim not in (1, 2) or not 1 <= a.shape[-1] <= MAX_COLS or (a.ndim == 2 and not 1 <= a.shape[0] <= MAX_EXPERTS):
            raise FormatError(where, name, f"shape {list(a.shape)}, expected [cols] (1..{MAX_COLS}) or "
                                           f"[experts, cols] (1..{MAX_EXPERTS} experts)")
        bad = ~np.isfinite(a) | (a < 0) | (a > MAX_IMPORTANCE)
        if bad.any():
            at = np.unravel_index(int(np.argmax(bad)), a.shape)
            what = f"column {at[-1]}" + (f" of expert {at[0]}" if a.ndim == 2 else "")
            raise FormatError(where, name, f"{what} is {float(a[at])!r}; importances are finite, >= 0 and at most "
                                           f"{MAX_IMPORTANCE:g}")


def check_meta(meta: Any, where: str | Path) -> None:
    if not isinstance(meta, dict):
        raise FormatError(where, META, "expected a JSON object")
    for key, typ in _META_KEYS.items():
        v = meta.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise FormatError(where, f"{META}: {key}", f"expected {typ.__name__}, got {v!r}")
    if meta["format"] != FORMAT or meta["version"] != VERSION:
        raise FormatError(where, META, f"format {meta['format']!r} version {meta['version']}, "
                                       f"this reader knows {FORMAT!r} version {VERSION}")
    for key in ("tokens", "chunks", "ctx"):
        if meta[key] < 1:
            raise FormatError(where, f"{META}: {key}", f"{meta[key]} (must be >= 1)")


def read(path: Path) -> Imatrix:
    """The imatrix at ``path``, checked against every rule of the spec."""
    path = Path(path)
    raw = read_small(path, MAX_FILE)
    try:
        z = zipfile.ZipFile(io.BytesIO(raw))
        infos = z.infolist()
    except _ZIP_ERRORS as e:
        raise FormatError(path, "file", f"not an imatrix file (a zip of .npy members): {e}") from None
    entries: dict[str, np.ndarray] = {}
    meta: Any = None
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        if name in seen:
            raise FormatError(path, name, "member appears twice")
        seen.add(name)
        if info.compress_type != zipfile.ZIP_STORED:
            raise FormatError(path, name, "compressed member; imatrix members are stored")
        if info.file_size > MAX_FILE:
            raise FormatError(path, name, f"{info.file_size} bytes")
        try:
            data = z.read(info)
        except _ZIP_ERRORS as e:
            raise FormatError(path, name, f"unreadable ({type(e).__name__}: {e})") from None
        if name == META:
            meta = loads_strict(data, f"{path}: {name}")
            continue
        if not name.endswith(".npy"):
            raise FormatError(path, name, f"unexpected member (NAME.npy or {META})")
        entries[name[:-4]] = _array(data, path, name)
    if meta is None:
        raise FormatError(path, META, "missing")
    check_meta(meta, path)
    check_values(entries, path)
    return Imatrix(entries, meta)


LLAMACPP_LEGACY = "llama.cpp-legacy"
LLAMACPP_GGUF = "llama.cpp-gguf"
LLAMACPP_FORMATS = (LLAMACPP_LEGACY, LLAMACPP_GGUF)  # entries under llama.cpp's tensor names (blk.0.attn_q.weight)
MAX_ENTRIES = 1 << 17     # matrices in a llama.cpp file
MAX_NAME = 1 << 10        # bytes of a tensor name there
GGUF_SUFFIXES = (".in_sum2", ".counts")


def read_any(path: Path) -> Imatrix:
    """Ours (a zip, or any .npz), llama.cpp's GGUF imatrix (``read_llamacpp_gguf``)
    or its legacy ``.dat`` (``read_llamacpp_legacy``), told apart by their first bytes."""
    path = Path(path)
    head = read_small(path, MAX_FILE)[:4]
    if head == b"GGUF":
        return read_llamacpp_gguf(path)
    return read(path) if head[:2] == b"PK" or path.suffix == ".npz" else read_llamacpp_legacy(path)


def read_llamacpp_gguf(path: Path) -> Imatrix:
    """llama.cpp's GGUF imatrix (what llama-imatrix writes by default):
    ``general.type`` "imatrix", ``imatrix.datasets`` (strings),
    ``imatrix.chunk_count`` and ``imatrix.chunk_size``; per matrix NAME the
    F32 tensors NAME.in_sum2 ([cols]: Σ x² per input column) and NAME.counts
    ([1]: the tokens summed); an expert stack (llama.cpp's ``ffn_*_exps``)
    has one row of each per expert, in_sum2 [experts, cols] and counts
    [experts, 1] (the rows routed to each). Entries keep llama.cpp's tensor
    names (convert/gguf_names.py maps them) and are the means in_sum2 /
    counts (counts rounded to integers; all ones where a count is 0), as
    llama-quantize computes them: [cols], or [experts, cols] for a stack,
    whose counts are kept as ``routed``.
    The file is first read as any GGUF is (formats/gguf_file.py), so every
    length and offset is checked."""
    from .gguf_file import open_gguf

    path = Path(path)
    g = open_gguf(path)
    kind = g.fields.get("general.type")
    if kind != "imatrix":
        raise FormatError(path, "general.type", f"is {kind!r}, not 'imatrix': a GGUF model, not an importance "
                                                "matrix (models are imported with ieconv gguf-to-iebin)")
    datasets = g.fields.get("imatrix.datasets")
    if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
        raise FormatError(path, "imatrix.datasets", f"expected an array of strings, got {datasets!r}")
    counts_kv = {}
    for key in ("imatrix.chunk_count", "imatrix.chunk_size"):
        v = g.fields.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise FormatError(path, key, "missing" if v is None else f"expected a count (u32), got {v!r}")
        counts_kv[key] = v
    found: dict[str, dict[str, Any]] = {}
    for t in g.tensors:
        suffix = next((s for s in GGUF_SUFFIXES if t.name.endswith(s) and len(t.name) > len(s)), None)
        if suffix is None:
            raise FormatError(path, t.name, "unexpected tensor: an imatrix holds NAME.in_sum2 and NAME.counts")
        if t.ggml_type != "F32":
            raise FormatError(path, t.name, f"is {t.ggml_type}, expected F32")
        found.setdefault(t.name[:-len(suffix)], {})[suffix] = t
    if len(found) > MAX_ENTRIES:
        raise FormatError(path, "tensors", f"{len(found)} matrices, more than {MAX_ENTRIES}")
    entries: dict[str, np.ndarray] = {}
    routed: dict[str, Any] = {}
    tokens = 0
    for name, pair in found.items():
        for s in GGUF_SUFFIXES:
            if s not in pair:
                raise FormatError(path, name + s, "missing: every matrix has .in_sum2 and .counts")
        sums, counts = pair[".in_sum2"], pair[".counts"]
        stack = len(sums.shape) == 2
        experts = sums.shape[0] if stack else 1
        if not (len(sums.shape) == 1 and counts.shape == [1] or stack and counts.shape == [experts, 1]):
            raise FormatError(path, name, f"in_sum2 {sums.shape}, counts {counts.shape}: expected [cols] and [1], "
                                          "or per expert [experts, cols] and [experts, 1]")
        if not 1 <= experts <= MAX_EXPERTS:
            raise FormatError(path, name + ".in_sum2", f"{experts} experts, expected 1..{MAX_EXPERTS}")
        if not 1 <= sums.shape[-1] <= MAX_COLS:
            raise FormatError(path, name + ".in_sum2", f"{sums.shape[-1]} columns, expected 1..{MAX_COLS}")
        count = g.tensor_bytes(counts).view("<f4").astype(np.float64)
        bad = next((c for c in count if not (np.isfinite(c) and 0 <= c < 2**53)), None)
        if bad is not None:
            raise FormatError(path, name + ".counts", f"has {bad!r}; a token count is finite and >= 0")
        n = np.floor(count + 0.5)  # lround, as llama.cpp reads it
        v = g.tensor_bytes(sums).view("<f4").astype(np.float32).reshape(experts, -1)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # inf/NaN: check_values names them
            means = np.where(n[:, None] > 0, v / n[:, None].astype(np.float32), np.float32(1))
        entries[name] = means.astype(np.float32) if stack else means[0].astype(np.float32)
        if stack:  # a stack's counts are the rows routed to each expert, not the tokens
            routed[name] = n.astype(np.int64)
        else:
            tokens = max(tokens, int(n[0]))
    check_values(entries, path)
    meta = {"format": LLAMACPP_GGUF, "chunks": counts_kv["imatrix.chunk_count"],
            "ctx": counts_kv["imatrix.chunk_size"], "tokens": tokens, "dataset": ", ".join(datasets) or None}
    return Imatrix(entries, meta, routed)


def write_llamacpp_gguf(path: Path, entries: Mapping[str, tuple[np.ndarray, np.ndarray]], *, arch: str,
                        datasets: list[str], chunk_count: int, chunk_size: int, overwrite: bool = False) -> None:
    """llama.cpp's GGUF imatrix, as llama-imatrix writes it (``read_llamacpp_gguf``
    reads it): ``entries`` maps llama.cpp's tensor names to (means, counts):
    means [cols] with counts [1], or an expert stack's [experts, cols] with
    [experts] (the rows routed to each). Written as NAME.in_sum2 = means ×
    counts (0 where the count is 0, as llama-imatrix leaves an expert no row
    reached; llama-quantize then weights it evenly) and NAME.counts, names
    sorted as llama-imatrix sorts them, by gguf-py's GGUFWriter (so gguf's own
    reader and llama.cpp's take it); ``arch`` only labels the file
    (general.architecture). Staged, fsynced and renamed; an existing file
    only with ``overwrite``."""
    import gguf

    path = Path(path)
    check_values({n: m for n, (m, _c) in entries.items()}, path)
    for key, v in (("imatrix.chunk_count", chunk_count), ("imatrix.chunk_size", chunk_size)):
        if not 0 <= v < 2**32:
            raise FormatError(path, key, f"{v} does not fit a u32")
    tensors: list[tuple[str, np.ndarray]] = []
    for name in sorted(entries):
        means, counts = entries[name]
        counts = np.asarray(counts, np.float64).reshape(-1)
        rows = means.reshape(-1, means.shape[-1])
        if len(counts) != len(rows) or not (np.isfinite(counts).all() and (counts >= 0).all()):
            raise FormatError(path, name, f"counts {counts.tolist()} for {len(rows)} rows of means")
        sums = np.where(counts[:, None] > 0, rows.astype(np.float64) * counts[:, None], 0.0).astype(np.float32)
        stack = means.ndim == 2
        tensors.append((name + ".in_sum2", sums if stack else sums[0]))
        tensors.append((name + ".counts", counts.astype(np.float32).reshape(-1, 1) if stack else
                        counts.astype(np.float32)))
    try:
        with StagedFiles(path.parent, replace=overwrite) as staged:
            f = staged.open(path.name)  # GGUFWriter writes the same (staged) file through its own handle
            w = gguf.GGUFWriter(f.name, arch)
            w.add_type("imatrix")
            w.add_array("imatrix.datasets", list(datasets))
            w.add_uint32("imatrix.chunk_count", chunk_count)
            w.add_uint32("imatrix.chunk_size", chunk_size)
            for name, a in tensors:
                w.add_tensor(name, a)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
    except FileExistsError:
        raise FormatError(path, "file", "exists (pass --overwrite to replace it)") from None


def read_llamacpp_legacy(path: Path) -> Imatrix:
    """llama.cpp's legacy imatrix (llama-imatrix ``--output-format dat``): an
    int32 entry count, then per entry an int32 name length, the name, int32
    ncall, int32 nval and nval float32 values (the means times ncall); then,
    optionally, an int32 chunk count and an int32-length dataset name. All
    little-endian. Entries keep llama.cpp's tensor names (blk.0.attn_q.weight);
    the values are turned into means (divided by ncall when it is > 0, as
    llama-quantize does). Strict: every count is bounded, nothing may follow
    the trailer."""
    path = Path(path)
    raw = read_small(path, MAX_FILE)
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if pos + n > len(raw):
            raise FormatError(path, what, f"file ends at byte {len(raw)}, {n} more bytes needed at {pos}")
        pos += n
        return raw[pos - n:pos]

    def i32(what: str, lo: int, hi: int) -> int:
        v = int.from_bytes(take(4, what), "little", signed=True)
        if not lo <= v <= hi:
            raise FormatError(path, what, f"{v} (expected {lo}..{hi})")
        return v

    n = int.from_bytes(take(4, "entry count"), "little", signed=True)
    if not 1 <= n <= MAX_ENTRIES:  # the one number every legacy file starts with: anything else is not one
        raise FormatError(path, "file", "not an importance matrix (not our .npz, not llama.cpp's GGUF imatrix, and "
                                        f"not its legacy .dat, whose first 4 bytes count 1..{MAX_ENTRIES} entries)")
    entries: dict[str, np.ndarray] = {}
    for i in range(n):
        size = i32(f"entry {i}: name length", 1, MAX_NAME)
        try:
            name = take(size, f"entry {i}: name").decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(path, f"entry {i}: name", "not UTF-8") from None
        if name in entries:
            raise FormatError(path, name, "appears twice")
        ncall = i32(f"{name}: ncall", 0, 2**31 - 1)
        nval = i32(f"{name}: nval", 1, MAX_COLS)
        v = np.frombuffer(take(4 * nval, f"{name}: values"), "<f4").astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN values: check_values names them below
            entries[name] = v / np.float32(ncall) if ncall > 0 else v.copy()
    meta: dict[str, Any] = {"format": LLAMACPP_LEGACY, "chunks": None, "dataset": None}
    if pos < len(raw):
        meta["chunks"] = i32("trailer: chunk count", 0, 2**31 - 1)
        if pos < len(raw):
            size = i32("trailer: dataset name length", 0, MAX_NAME * 64)
            meta["dataset"] = take(size, "trailer: dataset name").decode("utf-8", "replace")
    if pos != len(raw):
        raise FormatError(path, "file", f"{len(raw) - pos} bytes after the trailer")
    check_values(entries, path)
    return Imatrix(entries, meta)


def _array(data: bytes, path: Path, name: str) -> np.ndarray:
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version != (1, 0):
            raise ValueError(f".npy format {version}, expected 1.0")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    except _NPY_ERRORS as e:
        raise FormatError(path, name, f"not a .npy array ({type(e).__name__}: {e})") from None
    if dtype != np.dtype("<f4") or fortran or len(shape) not in (1, 2):
        raise FormatError(path, name, f"{dtype.str} {list(shape)}, expected <f4 [cols] or [experts, cols]")
    n = math.prod(shape)  # Python's integers: a hostile header's shape cannot wrap to 0 (np.prod did)
    if len(data) - f.tell() != 4 * n:
        raise FormatError(path, name, f"{list(shape)} in {len(data) - f.tell()} data bytes")
    return np.frombuffer(data, "<f4", count=n, offset=f.tell()).reshape(shape).copy()


def select_for(im: Imatrix, matrices: Mapping[str, list[int]], where: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """The entries for the matrices a quantizer will weight (``matrices``: name ->
    tensor shape), and the names it has no entry for (those are quantized unweighted:
    llama-imatrix leaves out what it never sees, e.g. an untied input embedding).
    A matrix takes a [cols] entry; an expert stack [experts, rows, cols] a
    [experts, cols] one (each expert its own) or a [cols] one (shared). A
    shape that differs, or no entry for any of them (an imatrix of another
    model), is an error."""
    found: dict[str, np.ndarray] = {}
    missing: list[str] = []
    for name, shape in matrices.items():
        a = im.entries.get(name)
        cols, stack = shape[-1], len(shape) == 3
        if a is None:
            missing.append(name)
        elif a.shape[-1] != cols:
            raise FormatError(where, name, f"{a.shape[-1]} columns, the matrix has {cols}")
        elif a.ndim == 2 and not (stack and a.shape[0] == shape[0]):
            raise FormatError(where, name, f"{a.shape[0]} experts' importances, but the tensor is "
                              + (f"a stack of {shape[0]}" if stack else f"one matrix {list(shape)}"))
        else:
            found[name] = a
    if matrices and not found:
        raise FormatError(where, next(iter(matrices)), f"no entry for any of the {len(matrices)} matrices to "
                          "quantize (the imatrix was collected on another model?)")
    return found, missing
