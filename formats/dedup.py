"""Lossless dedup: ``tensor_map.json``, ``groups.indices.json``, and the
artifact ``model.dedup.json`` + ``model.defaults.bin`` / ``model.masks.bin`` /
``model.exceptions.bin``.

The spec is docs/formats/dedup.md; the JSON Schemas are
schemas/dedup_tensor_map.schema.json, schemas/dedup_groups.schema.json and
schemas/dedup_index.schema.json. This module is the single implementation of
the format: the encoding (majority default, mask, exceptions), the reference
decoder, the streaming writer used by ``ieconv dedup-extract``, and the strict
validators used by the converter, the runtime loader (which re-checks every
number natively) and ``ierun verify dedup``.

Bytes are bytes: the format never looks at dtypes beyond recording them, so
float and quantized tensors dedup alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from . import checksums
from .atomic import StagedFiles
from .dtypes import DTYPES, shape_elements
from .errors import FormatError
from .fileio import PreadFiles
from .jsonio import dumps_canonical, load_json, schema_check
from .paths import check_relpath, resolve_inside
from .quant import SCHEMES
from .tensor_entries import expert_of, expert_slice, slice_problem

INDEX_FORMAT = "iekit-dedup"
TENSOR_MAP_FORMAT = "iekit-dedup-tensor-map"
GROUPS_FORMAT = "iekit-dedup-groups"
VERSION = 1  # tensor_map.json and groups.indices.json
INDEX_VERSION = 2  # model.dedup.json; 1 stored a bit per byte, an eighth of every member
POLICY = "lossless"
ALIGNMENT = 64  # what the writer uses: one cache line, any aligned SIMD load
INDEX_NAME = "model.dedup.json"  # the name the runtime looks for in a model directory
TENSOR_MAP_NAME = "tensor_map.json"
GROUPS_NAME = "groups.indices.json"
BLOB_KEYS = ("defaults", "masks", "exceptions")
BLOB_SUFFIXES = {"defaults": ".defaults.bin", "masks": ".masks.bin", "exceptions": ".exceptions.bin"}
INDEX_SUFFIX = ".dedup.json"

_SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
INDEX_SCHEMA = _SCHEMAS / "dedup_index.schema.json"
TENSOR_MAP_SCHEMA = _SCHEMAS / "dedup_tensor_map.schema.json"
GROUPS_SCHEMA = _SCHEMAS / "dedup_groups.schema.json"


LINE = 64  # tensor bytes per mask word


def line_count(n: int) -> int:
    return -(-n // LINE)


def line_bits_nbytes(n: int) -> int:
    """Bytes of an n-byte tensor's line bits (the end of its mask region)."""
    return -(-line_count(n) // 8)


def align_up(x: int, a: int) -> int:
    return -(-x // a) * a


# --------------------------------------------------------------------------
# Encoding: the definition
# --------------------------------------------------------------------------


def majority(rows: np.ndarray) -> np.ndarray:
    """Byte-wise majority of ``rows`` (k × c uint8): at each position the most
    frequent byte, ties broken towards the smallest byte value.

    The majority minimises the total number of exceptions of the group at
    every position, hence overall; the tie rule makes it a function of the
    multiset of bytes, so member order never changes the output.
    """
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    k, c = rows.shape
    if k == 1:
        return rows[0].copy()
    # Groups are near-copies: most columns are unanimous, vote on the rest only.
    split = np.zeros(c, bool)
    for r in rows[1:]:
        split |= r != rows[0]
    out = rows[0].copy()
    cols = np.flatnonzero(split)
    if cols.size:
        out[cols] = _vote(rows[:, cols])
    return out


def _vote(rows: np.ndarray) -> np.ndarray:
    k, c = rows.shape
    if k <= 16:  # k passes of k comparisons beat sorting small columns
        best_val = np.zeros(c, np.uint8)
        best_cnt = np.zeros(c, np.uint8)
        cnt = np.empty(c, np.uint8)
        eq = np.empty(c, bool)
        for j in range(k):
            rj = rows[j]
            cnt[:] = 0
            for r in range(k):
                np.equal(rows[r], rj, out=eq)
                cnt += eq
            better = (cnt > best_cnt) | ((cnt == best_cnt) & (rj < best_val))
            np.copyto(best_val, rj, where=better)
            np.copyto(best_cnt, cnt, where=better)
        return best_val
    # Sorted columns: a run is a value, its length the value's count; the
    # first longest run (strict >) is the smallest most frequent value.
    s = np.sort(rows.T, axis=1).T
    best_val = s[0].copy()
    best_len = np.ones(c, np.int32)
    start = np.zeros(c, np.int32)
    for r in range(1, k):
        new = s[r] != s[r - 1]
        start = np.where(new, r, start)
        length = r - start + 1
        better = length > best_len
        best_val = np.where(better, s[r], best_val)
        best_len = np.where(better, length, best_len)
    return best_val


def encode_lines(member: np.ndarray, default: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(words, line bits, exceptions) of ``member`` against ``default``: a
    little-endian 64-bit word per 64-byte line that holds a differing byte
    (bit j: byte j of the line), in line order; a bit per line (LSB first),
    set where the line has a word; the differing bytes in order. Pieces of a
    tensor cut at multiples of 512 bytes (8 lines: whole line-bit bytes)
    encode to pieces of these three that concatenate to the whole's."""
    diff = member != default
    n = diff.size
    words = np.zeros((line_count(n), 8), np.uint8)
    words.reshape(-1)[:-(-n // 8)] = np.packbits(diff, bitorder="little")
    used = words.any(axis=1)
    return words[used].reshape(-1), np.packbits(used, bitorder="little"), member[diff]


def encode(member: np.ndarray, default: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask region, exceptions) of ``member`` against ``default``: the
    region is the words, then the line bits (docs/formats/dedup.md)."""
    words, lines, exc = encode_lines(member, default)
    return np.concatenate([words, lines]), exc


def mask_bits(region: np.ndarray, n: int) -> np.ndarray:
    """The byte mask (bit i: byte i, LSB first; ceil(n / 8) bytes) a line mask
    region of an n-byte tensor stands for. ValueError names the first broken
    rule: the size (words + line bits), line bits past the last line, a count
    of words that is not the count of set line bits, a zero word, bits past
    byte n - 1."""
    lines_n, lb = line_count(n), line_bits_nbytes(n)
    region = np.asarray(region, np.uint8)
    if region.size < lb or (region.size - lb) % 8:
        raise ValueError(f"a {n}-byte tensor's mask is 8-byte words then {lb} bytes of line bits, "
                         f"not {region.size} bytes")
    used = np.unpackbits(region[region.size - lb:], bitorder="little")
    if used[lines_n:].any():
        raise ValueError("line bits past the tensor's last line are set")
    used = used[:lines_n].astype(bool)
    nw = (region.size - lb) // 8
    if int(used.sum()) != nw:
        raise ValueError(f"the line bits name {int(used.sum())} lines but the region holds {nw} words")
    words = region[:8 * nw].reshape(nw, 8)
    zero = np.flatnonzero(~words.any(axis=1))
    if zero.size:
        raise ValueError(f"word {int(zero[0])} (line {int(np.flatnonzero(used)[zero[0]])}) is zero: "
                         "a line without a differing byte has no word")
    full = np.zeros((lines_n, 8), np.uint8)
    full[used] = words
    full = full.reshape(-1)
    nb = -(-n // 8)
    if full[nb:].any() or (n % 8 and full[nb - 1] >> (n % 8)):
        raise ValueError("bits past the tensor's last byte are set")
    return full[:nb]


def decode(default: np.ndarray, mask: np.ndarray, exceptions: np.ndarray) -> np.ndarray:
    """Reference decoder (numpy): out[i] = mask bit i ? exceptions[k++] : default[i],
    ``mask`` a line mask region (ValueError for a malformed one)."""
    n = default.size
    bits = np.unpackbits(mask_bits(mask, n), count=n, bitorder="little").astype(bool)
    if int(bits.sum()) != exceptions.size:
        raise ValueError(f"mask has {int(bits.sum())} set bits but there are {exceptions.size} exceptions")
    out = default.copy()
    out[bits] = exceptions
    return out


_POP8 = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def popcount(mask: np.ndarray | bytes) -> int:
    """Set bits (a byte table: no 8x temporary for large masks)."""
    m = np.frombuffer(mask, np.uint8) if isinstance(mask, bytes) else mask
    return int(_POP8[m].sum(dtype=np.int64))


# --------------------------------------------------------------------------
# Inputs: tensor_map.json and groups.indices.json
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRange:
    name: str
    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: list[int]
    digest: str  # of the tensor's bytes, by the map's checksum


@dataclass(frozen=True)
class TensorMap:
    """A validated tensor_map.json: its digest algorithm (the model's, which
    the dedup artifact records too) and every tensor's range."""

    checksum: str
    tensors: dict[str, TensorRange]


def _check_dtype_shape(dtype: str, shape: list[int], nbytes: int, file: str, where: str) -> None:
    if dtype not in DTYPES and dtype not in SCHEMES:
        raise FormatError(file, f"{where}.dtype", f"unknown dtype {dtype!r}")
    # Quantized payload sizes depend on parameters recorded in model.ie.json
    # only; the runtime cross-checks those members against it.
    if dtype in DTYPES and shape_elements(shape) * DTYPES[dtype].itemsize != nbytes:
        raise FormatError(file, f"{where}.nbytes", f"{nbytes} disagrees with {dtype}{shape}")


def tensor_map_from_model(model: Any) -> dict[str, Any]:
    """The tensor_map.json of an IEBIN model: every stored tensor's byte
    range and digest (by the model's checksum algorithm, which the dedup
    artifact then records too); a packed model's store members have no
    range and are already grouped."""
    alg = model.checksum
    tensors = {t["name"]: {"file": t["file"], "offset": t["file_data_offset"], "nbytes": t["nbytes"],
                           "dtype": t["dtype"], "shape": list(t["shape"]), alg: t[alg]}
               for t in model.stored}
    obj = {"format": TENSOR_MAP_FORMAT, "version": VERSION, "checksum": alg, "tensors": tensors}
    validate_tensor_map(obj, TENSOR_MAP_NAME)
    return obj


def validate_tensor_map(obj: Any, file: str | os.PathLike) -> TensorMap:
    file = os.fspath(file)
    schema_check(obj, TENSOR_MAP_SCHEMA, file)
    # Maps written before the field existed are sha256.
    alg = checksums.algorithm(obj.get("checksum", "sha256"), file)
    out: dict[str, TensorRange] = {}
    for name, t in obj["tensors"].items():
        where = f"tensors.{name}"
        checksums.check_record(t, alg, file, where)
        check_relpath(t["file"], file, f"{where}.file")
        _check_dtype_shape(t["dtype"], t["shape"], t["nbytes"], file, where)
        out[name] = TensorRange(name, t["file"], t["offset"], t["nbytes"], t["dtype"], list(t["shape"]), t[alg.name])
    return TensorMap(alg.name, out)


def load_tensor_map(path: str | os.PathLike) -> TensorMap:
    return validate_tensor_map(load_json(path), path)


def check_tensor_ranges(tmap: dict[str, TensorRange], names: Iterable[str], model_dir: Path,
                        file: str | os.PathLike) -> dict[str, Path]:
    """Resolve the files of ``names`` inside ``model_dir``; ranges must fit."""
    file = os.fspath(file)
    real: dict[str, Path] = {}
    for name in names:
        t = tmap[name]
        p = resolve_inside(model_dir, t.file, file, f"tensors.{name}.file")
        if not p.is_file():
            raise FormatError(file, f"tensors.{name}.file", f"{t.file!r} does not exist in {model_dir}")
        size = p.stat().st_size
        if t.offset + t.nbytes > size:
            raise FormatError(file, f"tensors.{name}.offset", f"bytes [{t.offset}, {t.offset + t.nbytes}) run past the end of {t.file} ({size} bytes)")
        real[name] = p
    return real


@dataclass
class GroupSpec:
    members: list[str]
    default_member: str | None = None
    estimate: dict[str, Any] | None = None


def validate_groups(obj: Any, file: str | os.PathLike, tmap: dict[str, TensorRange]) -> list[GroupSpec]:
    """Groups against their tensor map: members exist, appear in one group
    only, share nbytes and dtype; a named default is a member."""
    file = os.fspath(file)
    schema_check(obj, GROUPS_SCHEMA, file)
    seen: dict[str, int] = {}
    out = []
    for g, grp in enumerate(obj["groups"]):
        members = grp["members"]
        for j, name in enumerate(members):
            where = f"groups[{g}].members[{j}]"
            if name not in tmap:
                raise FormatError(file, where, f"{name!r} is not in the tensor map")
            if name in seen:
                raise FormatError(file, where, f"{name!r} is already in groups[{seen[name]}]" if seen[name] != g
                                  else f"{name!r} is listed twice")
            seen[name] = g
            first = tmap[members[0]]
            t = tmap[name]
            if t.nbytes != first.nbytes:
                raise FormatError(file, where, f"{name!r} has {t.nbytes} bytes but {members[0]!r} has {first.nbytes}; members must have equal nbytes")
            if t.dtype != first.dtype:
                raise FormatError(file, where, f"{name!r} is {t.dtype} but {members[0]!r} is {first.dtype}; members must share a dtype")
        if tmap[members[0]].nbytes == 0:
            raise FormatError(file, f"groups[{g}]", "zero-byte tensors cannot be grouped")
        dm = grp.get("default_member")
        if dm is not None and dm not in members:
            raise FormatError(file, f"groups[{g}].default_member", f"{dm!r} is not a member of this group")
        out.append(GroupSpec(list(members), dm, grp.get("estimate")))
    _check_disjoint(seen, tmap, file)
    return out


def _check_disjoint(names: dict[str, int], tmap: dict[str, TensorRange], file: str) -> None:
    """Grouped tensors must not share bytes (a stack and one of its expert
    slices, or any two overlapping ranges of a hand-written map): each byte
    is stored once, by one member."""
    spans = sorted((tmap[n].file, tmap[n].offset, tmap[n].offset + tmap[n].nbytes, n) for n in names)
    for (fa, _a0, a1, na), (fb, b0, _b1, nb) in zip(spans, spans[1:]):
        if fa == fb and b0 < a1:
            raise FormatError(file, f"groups[{names[nb]}]", f"{nb!r} shares bytes of {fa} with {na!r} "
                              f"(groups[{names[na]}]); a byte belongs to one member")


def load_groups(path: str | os.PathLike, tmap: dict[str, TensorRange]) -> list[GroupSpec]:
    return validate_groups(load_json(path), path, tmap)


# --------------------------------------------------------------------------
# The index: model.dedup.json
# --------------------------------------------------------------------------


@dataclass
class DedupIndex:
    """A validated model.dedup.json. Blob names are relative to ``dir``, the
    directory the index was found in (not the target of a symlink to it)."""

    path: Path
    meta: dict[str, Any]
    dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = self.path.parent

    @property
    def groups(self) -> list[dict[str, Any]]:
        return self.meta["groups"]

    def members(self) -> Iterator[tuple[int, int, dict[str, Any], dict[str, Any]]]:
        """(group index, member index, group, member) in index order."""
        for g, grp in enumerate(self.groups):
            for j, m in enumerate(grp["members"]):
                yield g, j, grp, m

    def blob_path(self, key: str) -> Path:
        return self.dir / self.meta["blobs"][key]["name"]

    def totals(self) -> dict[str, int]:
        original = sum(g["nbytes"] * len(g["members"]) for g in self.groups)
        blobs = {f"{k}_bytes": self.meta["blobs"][k]["nbytes"] for k in BLOB_KEYS}
        return {"groups": len(self.groups), "members": sum(len(g["members"]) for g in self.groups),
                "original_bytes": original, **blobs, "stored_bytes": sum(blobs.values())}

    def arrays(self) -> dict[str, Any]:
        """Plain arrays for the native loader (iekit.runtime._native.DedupStore)."""
        names, mg, mo, mn, eo, ec = [], [], [], [], [], []
        for g, _j, _grp, m in self.members():
            names.append(m["name"])
            mg.append(g)
            mo.append(m["mask"]["offset"])
            mn.append(m["mask"]["nbytes"])
            eo.append(m["exceptions"]["offset"])
            ec.append(m["exceptions"]["count"])
        i64 = lambda v: np.asarray(v, dtype=np.int64).reshape(-1)  # noqa: E731
        return {"blob_names": [self.meta["blobs"][k]["name"] for k in BLOB_KEYS],
                "blob_sizes": [self.meta["blobs"][k]["nbytes"] for k in BLOB_KEYS],
                "alignment": self.meta["alignment"], "names": names,
                "member_group": i64(mg), "mask_offset": i64(mo), "mask_nbytes": i64(mn), "exc_offset": i64(eo), "exc_count": i64(ec),
                "group_nbytes": i64([g["nbytes"] for g in self.groups]),
                "group_default_offset": i64([g["default"]["offset"] for g in self.groups])}


def regions(meta: dict[str, Any]) -> Iterator[tuple[str, int, int, dict[str, Any], str]]:
    """Every (blob key, offset, length, record, field) the index describes;
    the record is the object holding the region's offset and digest."""
    for g, grp in enumerate(meta["groups"]):
        n = grp["nbytes"]
        d = grp["default"]
        yield "defaults", d["offset"], n, d, f"groups[{g}].default"
        for j, m in enumerate(grp["members"]):
            f = f"groups[{g}].members[{j}]"
            yield "masks", m["mask"]["offset"], m["mask"]["nbytes"], m["mask"], f"{f}.mask"
            e = m["exceptions"]
            yield "exceptions", e["offset"], e["count"], e, f"{f}.exceptions"


def validate_index(meta: Any, file: str | os.PathLike = INDEX_NAME) -> None:
    """Every rule that needs only the JSON (docs/formats/dedup.md, "Index rules")."""
    file = os.fspath(file)
    if not isinstance(meta, dict):
        raise FormatError(file, "(root)", "must be a JSON object")
    if meta.get("format") != INDEX_FORMAT:
        raise FormatError(file, "format", f"unknown format {meta.get('format')!r} (expected {INDEX_FORMAT!r})")
    if meta.get("version") != INDEX_VERSION or type(meta.get("version")) is not int:
        hint = (" (version 1 stored a mask bit per byte; re-run ieconv dedup-extract or dedup-pack on the model "
                "to write version 2 line masks)") if meta.get("version") == 1 else ""
        raise FormatError(file, "version", f"unsupported version {meta.get('version')!r} (this build reads "
                          f"{INDEX_VERSION}){hint}")
    if meta.get("policy") != POLICY:
        raise FormatError(file, "policy", f"unsupported policy {meta.get('policy')!r}: only {POLICY!r} exists (bit-exact reconstruction)")
    alg = checksums.algorithm(meta.get("checksum"), file)
    schema_check(meta, INDEX_SCHEMA, file)
    align = meta["alignment"]
    if align & (align - 1):
        raise FormatError(file, "alignment", f"must be a power of two between 1 and 2^20, got {align}")
    real_names: dict[str, str] = {}
    for k in BLOB_KEYS:
        checksums.check_record(meta["blobs"][k], alg, file, f"blobs.{k}")
        name = meta["blobs"][k]["name"]
        check_relpath(name, file, f"blobs.{k}.name")
        if name in real_names:
            raise FormatError(file, f"blobs.{k}.name", f"{name!r} is also blobs.{real_names[name]}; the three blobs are different files")
        real_names[name] = k
    seen: dict[str, str] = {}
    for g, grp in enumerate(meta["groups"]):
        n = grp["nbytes"]
        names = [m["name"] for m in grp["members"]]
        for j, m in enumerate(grp["members"]):
            where = f"groups[{g}].members[{j}]"
            checksums.check_record(m, alg, file, where)
            if m["name"] in seen:
                raise FormatError(file, f"{where}.name", f"duplicate member name {m['name']!r} (also {seen[m['name']]})")
            seen[m["name"]] = where
            _check_dtype_shape(grp["dtype"], m["shape"], n, file, f"groups[{g}]")
            if m["exceptions"]["count"] > n:
                raise FormatError(file, f"{where}.exceptions.count", f"{m['exceptions']['count']} exceptions for a {n}-byte tensor")
            mn, lb = m["mask"]["nbytes"], line_bits_nbytes(n)
            if mn < lb or (mn - lb) % 8 or (mn - lb) // 8 > line_count(n):
                raise FormatError(file, f"{where}.mask.nbytes", f"a {n}-byte tensor's mask is up to {line_count(n)} "
                                  f"8-byte words then {lb} bytes of line bits, not {mn} bytes")
        dm = grp["default"]["member"]
        if dm is not None:
            if dm not in names:
                raise FormatError(file, f"groups[{g}].default.member", f"{dm!r} is not a member of this group")
            if grp["members"][names.index(dm)]["exceptions"]["count"] != 0:
                raise FormatError(file, f"groups[{g}].default.member", f"{dm!r} is the default, so it must have 0 exceptions")
    spans: dict[str, list[tuple[int, int, str]]] = {k: [] for k in BLOB_KEYS}
    for key, off, length, record, where in regions(meta):
        checksums.check_record(record, alg, file, where)
        size = meta["blobs"][key]["nbytes"]
        if off % align:
            raise FormatError(file, f"{where}.offset", f"offset {off} is not a multiple of alignment {align}")
        if off + length > size:
            raise FormatError(file, f"{where}.offset", f"bytes [{off}, {off + length}) run past the end of {meta['blobs'][key]['name']} ({size} bytes)")
        if length:
            spans[key].append((off, off + length, where))
    for key, sp in spans.items():
        sp.sort()
        for (s0, e0, w0), (s1, _e1, w1) in zip(sp, sp[1:]):
            if s1 < e0:
                raise FormatError(file, f"{w1}.offset", f"overlaps {w0} in {meta['blobs'][key]['name']} (offset {s1} < end {e0})")


def check_blobs(index: DedupIndex, deep: bool = False) -> list[FormatError]:
    """The rules that need the blob files. Paths and sizes raise at once;
    with ``deep`` the content rules (each file's and each region's digest,
    mask popcount = exception count, zero tail bits, zero padding) are all
    checked and every failure is returned, so a report can list them."""
    mf = os.fspath(index.path)
    meta = index.meta
    real: dict[str, Path] = {}
    for k in BLOB_KEYS:
        b = meta["blobs"][k]
        p = resolve_inside(index.dir, b["name"], mf, f"blobs.{k}.name")
        if not p.is_file():
            raise FormatError(mf, f"blobs.{k}.name", f"{b['name']!r} does not exist in {index.dir}")
        if p in real.values():
            raise FormatError(mf, f"blobs.{k}.name", f"{b['name']!r} is the same file as another blob")
        if p.stat().st_size != b["nbytes"]:
            raise FormatError(p, "(size)", f"file is {p.stat().st_size} bytes but {index.path.name} blobs.{k}.nbytes says {b['nbytes']} (truncated or replaced?)")
        real[k] = p
    if not deep:
        return []
    errors: list[FormatError] = []
    alg = meta["checksum"]
    for k in BLOB_KEYS:
        b = meta["blobs"][k]
        got = checksums.digest_file_range(real[k], 0, b["nbytes"], alg)
        if got != b[alg]:
            errors.append(FormatError(mf, f"blobs.{k}.{alg}", f"{b['name']}: checksum mismatch (stored {b[alg][:12]}…, actual {got[:12]}…)"))
    files = {k: open(real[k], "rb") for k in BLOB_KEYS}
    try:
        covered: dict[str, list[tuple[int, int]]] = {k: [] for k in BLOB_KEYS}
        for key, off, length, record, where in regions(meta):
            covered[key].append((off, off + length))
            got = checksums.digest_range(files[key], off, length, alg)
            sha = record[alg]
            if got != sha:
                errors.append(FormatError(mf, f"{where}.{alg}", f"checksum mismatch in {meta['blobs'][key]['name']} [{off}, {off + length}) (stored {sha[:12]}…, actual {got[:12]}…)"))
        for g, j, grp, m in index.members():
            n = grp["nbytes"]
            files["masks"].seek(m["mask"]["offset"])
            where = f"groups[{g}].members[{j}]"
            try:
                mask = mask_bits(np.frombuffer(files["masks"].read(m["mask"]["nbytes"]), np.uint8), n)
            except ValueError as e:
                errors.append(FormatError(mf, f"{where}.mask", f"member {m['name']!r}: {e}"))
                continue
            pc = popcount(mask)
            if pc != m["exceptions"]["count"]:
                errors.append(FormatError(mf, f"{where}.exceptions.count", f"member {m['name']!r}: mask has {pc} set bits but the index records {m['exceptions']['count']} exceptions"))
        for k in BLOB_KEYS:
            pos = 0
            for a, e in sorted(covered[k]) + [(meta["blobs"][k]["nbytes"], meta["blobs"][k]["nbytes"])]:
                if a > pos:
                    files[k].seek(pos)
                    gap = np.frombuffer(files[k].read(a - pos), np.uint8)
                    nz = np.flatnonzero(gap)
                    if nz.size:
                        errors.append(FormatError(real[k], "(padding)", f"byte {pos + int(nz[0])} outside every region is not zero"))
                pos = max(pos, e)
    finally:
        for f in files.values():
            f.close()
    return errors


def cross_check(index: DedupIndex, tensors: list[dict[str, Any]], meta_path: Path, checksum: str) -> None:
    """Every member is a tensor of the model (``tensors``, the entries of its
    model.ie.json at ``meta_path``) with the same dtype, shape, nbytes and
    digest: the artifact belongs to this model."""
    by_name = {t["name"]: t for t in tensors}
    mf = os.fspath(index.path)
    alg = index.meta["checksum"]
    if alg != checksum:
        raise FormatError(mf, "checksum", f"{alg!r} digests, but {meta_path.name} records {checksum!r} "
                          "(the artifact was extracted from another conversion of the model)")
    names = {m["name"] for _g, _j, _grp, m in index.members()}
    for g, j, grp, m in index.members():
        where = f"groups[{g}].members[{j}]"
        t = by_name.get(m["name"])
        if t is None:
            t = _expert_member(m["name"], by_name, names, mf, f"{where}.name", meta_path)
        checks = [("dtype", grp["dtype"], t["dtype"]), ("nbytes", grp["nbytes"], t["nbytes"]),
                  ("shape", m["shape"], t["shape"])]
        if alg in t:  # an expert slice has no digest of its own; TensorSource hashes its stack
            checks.append((alg, m[alg], t[alg]))
        for key, mine, theirs in checks:
            if mine != theirs:
                raise FormatError(mf, f"{where}.{key}", f"{m['name']!r}: {key} {mine!r} differs from {meta_path.name} ({theirs!r})")


def _expert_member(name: str, by_name: dict[str, dict[str, Any]], members: set[str], mf: str, field: str,
                   meta_path: Path) -> dict[str, Any]:
    """The entry of a member that names an expert slice ``STACK[e]`` of the
    model (tensor_entries.expert_slice); refused when the stack itself is a member
    too (the same bytes stored twice)."""
    parsed = expert_of(name)
    stack = by_name.get(parsed[0]) if parsed else None
    if stack is None:
        raise FormatError(mf, field, f"{name!r} is not a tensor of {meta_path}, nor an expert of one")
    problem = slice_problem(stack, parsed[1])
    if problem:
        raise FormatError(mf, field, f"{name!r}: {problem} ({meta_path.name})")
    if parsed[0] in members:
        raise FormatError(mf, field, f"{name!r}: its stack {parsed[0]!r} is a member too (the same bytes twice)")
    return expert_slice(stack, parsed[1])


def iter_member(index: DedupIndex, group: dict[str, Any], member: dict[str, Any],
                chunk: int = 1 << 20) -> Iterator[np.ndarray]:
    """A member's original bytes, rebuilt ``chunk`` bytes at a time (the
    reference decoder on slices: memory stays at a few chunks plus the line
    bits, n / 512 bytes, whatever the tensor's size). Raises FormatError
    when the mask is malformed or disagrees with the exceptions."""
    chunk = max(8 * LINE, chunk // (8 * LINE) * (8 * LINE))  # whole line-bit bytes per chunk
    n = group["nbytes"]
    mf = os.fspath(index.path)
    lb = line_bits_nbytes(n)
    moff, mn = member["mask"]["offset"], member["mask"]["nbytes"]
    where = f"member {member['name']!r}"
    with PreadFiles() as files:
        read = lambda key, off, length: np.frombuffer(files.read(index.blob_path(key), off, length), np.uint8)  # noqa: E731
        used = np.unpackbits(read("masks", moff + mn - lb, lb), bitorder="little")
        k = w = 0
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            lines = used[a // LINE:line_count(b)]
            nw = int(lines.sum())
            if 8 * (w + nw) > mn - lb:
                raise FormatError(mf, "mask", f"{where}: the line bits name more words than the mask holds")
            region = np.concatenate([read("masks", moff + 8 * w, 8 * nw), np.packbits(lines, bitorder="little")])
            try:
                bits = mask_bits(region, b - a)
            except ValueError as e:
                raise FormatError(mf, "mask", f"{where}: {e}") from None
            count = popcount(bits)
            if k + count > member["exceptions"]["count"]:
                raise FormatError(mf, "exceptions.count", f"{where}: the mask asks for more "
                                  f"exceptions than the {member['exceptions']['count']} recorded")
            exc = read("exceptions", member["exceptions"]["offset"] + k, count)
            yield decode(read("defaults", group["default"]["offset"] + a, b - a), region, exc)
            k += count
            w += nw


def index_path_for(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / INDEX_NAME if p.is_dir() else p


def load_index(path: str | os.PathLike, deep: bool = False) -> DedupIndex:
    """Load a model directory's (or an explicit) model.dedup.json, validate
    the JSON and the blob files (``deep``: raise the first content error)."""
    ipath = index_path_for(path)
    # A model directory's model.dedup.json (usually dedup-link's symlink) must resolve inside it.
    meta = load_json(ipath, inside=ipath.parent if Path(path).is_dir() else None)
    validate_index(meta, ipath)
    idx = DedupIndex(ipath, meta)
    errors = check_blobs(idx, deep)
    if errors:
        raise errors[0]
    return idx


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------


class _Blob:
    """One staged blob: regions start at multiples of the alignment, gaps are
    zero, the file ends right after the last region. An empty region is
    recorded at offset 0 and occupies nothing."""

    def __init__(self, staged: StagedFiles, name: str, alignment: int, alg: checksums.Algorithm):
        self.name = name
        self.f = staged.open(name)
        self.alignment = alignment
        self.alg = alg
        self.size = 0
        self.file_hash = alg.new()
        self._start = self._n = 0
        self._h = alg.new()

    def begin(self) -> None:
        self._start = align_up(self.size, self.alignment)
        self._n = 0
        self._h = self.alg.new()

    def write(self, c: bytes | np.ndarray) -> None:
        c = memoryview(np.ascontiguousarray(c)).cast("B") if isinstance(c, np.ndarray) else c
        if not len(c):
            return
        if self._n == 0 and self._start > self.size:  # padding only once the region is non-empty
            self._raw(b"\0" * (self._start - self.size))
        self._raw(c)
        self._h.update(c)
        self._n += len(c)

    def end(self) -> tuple[int, int, str]:
        return (self._start if self._n else 0), self._n, self._h.hexdigest()

    def _raw(self, data: bytes | memoryview) -> None:
        self.f.write(data)
        self.file_hash.update(data)
        self.size += len(data)


class DedupWriter:
    """Streams groups into the three staged blobs, then stages the index last.

    Use inside a StagedFiles (``with StagedFiles(dir) as staged``) so that a
    failure leaves the directory as it was.
    """

    def __init__(self, staged: StagedFiles, stem: str, alignment: int = ALIGNMENT,
                 checksum: str = checksums.DEFAULT):
        self.staged = staged
        self.stem = stem
        self.alignment = alignment
        self.alg = checksums.ALGORITHMS[checksum]
        self.blobs = {k: _Blob(staged, stem + BLOB_SUFFIXES[k], alignment, self.alg) for k in BLOB_KEYS}
        self.groups: list[dict[str, Any]] = []

    def add_default(self, chunks: Iterable[bytes | np.ndarray]) -> dict[str, Any]:
        blob = self.blobs["defaults"]
        blob.begin()
        for c in chunks:
            blob.write(c)
        off, n, digest = blob.end()
        return {"offset": off, "nbytes": n, self.alg.name: digest}

    def add_member(self, name: str, shape: list[int],
                   encoded: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, bytes | np.ndarray]]) -> dict[str, Any]:
        """``encoded`` yields encode_lines' (words, line bits, exceptions) of
        consecutive pieces of the member (cut at multiples of 512 bytes) with
        the piece's original bytes, which are only hashed (the member's
        digest is what reconstruction is checked against). Words stream to
        the masks blob; the line bits (n / 512 bytes) are held and end the
        region."""
        h = self.alg.new()
        masks, excs = self.blobs["masks"], self.blobs["exceptions"]
        masks.begin()
        excs.begin()
        lines = []
        for words, line_bits, exc, raw in encoded:
            h.update(raw)
            masks.write(words)
            lines.append(line_bits)
            excs.write(exc)
        masks.write(np.concatenate(lines) if lines else np.zeros(0, np.uint8))
        moff, mn, mdigest = masks.end()
        eoff, count, edigest = excs.end()
        a = self.alg.name
        return {"name": name, "shape": list(shape), a: h.hexdigest(),
                "mask": {"offset": moff, "nbytes": mn, a: mdigest},
                "exceptions": {"offset": eoff, "count": count, a: edigest}}

    def add_group(self, dtype: str, nbytes: int, default: dict[str, Any], default_member: str | None,
                  members: list[dict[str, Any]]) -> None:
        self.groups.append({"dtype": dtype, "nbytes": nbytes,
                            "default": {"offset": default["offset"], self.alg.name: default[self.alg.name],
                                        "member": default_member},
                            "members": members})

    def finish(self) -> dict[str, Any]:
        meta = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "policy": POLICY, "alignment": self.alignment,
                "checksum": self.alg.name, "producer": "ieconv",
                "blobs": {k: {"name": b.name, "nbytes": b.size, self.alg.name: b.file_hash.hexdigest()}
                          for k, b in self.blobs.items()},
                "groups": self.groups}
        validate_index(meta, self.stem + INDEX_SUFFIX)
        self.staged.write_bytes(self.stem + INDEX_SUFFIX, dumps_canonical(meta))
        return meta
