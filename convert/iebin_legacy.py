"""Upgrade legacy (pre-schema2) IEBIN metadata to schema2.

Legacy files name the backing file ``shard`` and its offset
``shard_data_offset``, spell dtypes in uppercase (``BF16``) or long form
(``float32``), and carry no checksums. Users used to patch them with a
hand-written script (see the seed design doc); ``ieconv iebin-upgrade`` does it
properly: every field is mapped, checksums are computed from the bytes the
entries point at, and the result must pass the full schema2 validator before
anything is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from iekit.formats.dtypes import DTYPES, LEGACY_ALIASES
from iekit.formats.errors import FormatError
from iekit.formats.fileio import check_regular
from iekit.formats.hf_config import model_summary
from iekit.formats import checksums
from iekit.formats.iebin import DEFAULT_ALIGNMENT, FORMAT_NAME, LEGACY_KEYS, VERSION
from iekit.formats.jsonio import load_json
from iekit.formats.paths import check_inside, resolve_inside

from .artifact_out import TOKENIZER_FILES



def _dtype(raw: object, file: str, field: str) -> str:
    if isinstance(raw, str):
        if raw in DTYPES:
            return raw
        mapped = LEGACY_ALIASES.get(raw.upper())
        if mapped:
            return mapped
    raise FormatError(file, field, f"unknown dtype {raw!r}")


def _first(entry: dict, keys: tuple[str, ...]) -> Any:
    return next((entry[k] for k in keys if k in entry), None)


def is_schema2(meta: object) -> bool:
    """Already schema2: nothing to upgrade (whether it is valid is `validate`'s business)."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME or meta.get("version") != VERSION:
        return False
    tensors = meta.get("tensors")
    entries = tensors.values() if isinstance(tensors, dict) else tensors if isinstance(tensors, list) else []
    return not any(isinstance(t, dict) and any(k in t for k in LEGACY_KEYS) for t in entries)


def upgrade_legacy(legacy: object, legacy_path: Path,
                   checksum: str = checksums.DEFAULT) -> tuple[dict[str, Any], list[str]]:
    """Return (schema2 metadata, notes). Backing files are read for
    ``checksum`` digests and sizes; they must lie inside the metadata's
    directory."""
    lf = os.fspath(legacy_path)
    model_dir = legacy_path.parent
    if not isinstance(legacy, dict):
        raise FormatError(lf, "(root)", "must be a JSON object")
    ver = legacy.get("version")
    if legacy.get("format") == FORMAT_NAME and type(ver) is int and ver > VERSION:
        raise FormatError(lf, "version", f"{ver} is newer than schema2, not legacy metadata (this build reads {VERSION})")
    raw_tensors = legacy.get("tensors")
    if isinstance(raw_tensors, dict):
        raw_tensors = [{"name": k, **v} if isinstance(v, dict) else v for k, v in raw_tensors.items()]
    if not isinstance(raw_tensors, list):
        raise FormatError(lf, "tensors", "missing, or neither a list nor an object")
    notes: list[str] = []
    tensors: list[dict[str, Any]] = []
    file_sizes: dict[str, int] = {}
    for i, e in enumerate(raw_tensors):
        where = f"tensors[{i}]"
        if not isinstance(e, dict):
            raise FormatError(lf, where, "tensor entry is not an object")
        name = e.get("name")
        if not isinstance(name, str) or not name:
            raise FormatError(lf, f"{where}.name", f"missing or not a string: {name!r}")
        dtype = _dtype(e.get("dtype"), lf, f"{where}.dtype")
        shape = e.get("shape")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise FormatError(lf, f"{where}.shape", f"tensor {name!r}: must be a list of non-negative integers")
        file = _first(e, ("file", "shard"))
        real = resolve_inside(model_dir, file, lf, f"{where}.file")
        if not real.is_file():
            raise FormatError(lf, f"{where}.file", f"tensor {name!r}: {file!r} does not exist in {model_dir}")
        off = _first(e, ("file_data_offset", "shard_data_offset"))
        if type(off) is not int or off < 0:
            raise FormatError(lf, f"{where}.file_data_offset", f"tensor {name!r}: missing or not a non-negative integer")
        expected = 1
        for d in shape:
            expected *= d
        expected *= DTYPES[dtype].itemsize
        nbytes = e.get("nbytes", expected)
        if nbytes != expected:
            raise FormatError(lf, f"{where}.nbytes", f"tensor {name!r}: {nbytes!r} disagrees with {dtype}{shape} = {expected} bytes")
        size = file_sizes.setdefault(file, real.stat().st_size)
        if off + nbytes > size:
            raise FormatError(lf, f"{where}.file_data_offset", f"tensor {name!r}: bytes [{off}, {off + nbytes}) run past the end of {file} ({size} bytes)")
        tensors.append({"name": name, "dtype": dtype, "shape": shape, "file": file,
                        "file_data_offset": off, "nbytes": nbytes,
                        checksum: checksums.digest_file_range(real, off, nbytes, checksum)})
        if e.get("dtype") != dtype:
            notes.append(f"{name}: dtype {e.get('dtype')!r} -> {dtype!r}")

    # The largest power of two (<= the default) that every offset honours.
    align = DEFAULT_ALIGNMENT
    while align > 1 and any(t["file_data_offset"] % align for t in tensors):
        align //= 2
    if align < DEFAULT_ALIGNMENT:
        notes.append(f"offsets are only {align}-byte aligned (schema2 writers use {DEFAULT_ALIGNMENT}); "
                     "re-convert with `ieconv hf-to-iebin` for aligned payloads")

    config = legacy.get("config")
    if not isinstance(config, dict):
        cfg_path = model_dir / "config.json"
        config = load_json(cfg_path, inside=model_dir) if os.path.lexists(cfg_path) else {}
        if not isinstance(config, dict):
            raise FormatError(cfg_path, "(root)", "must be a JSON object")
        if not config:
            notes.append("no config found (neither a 'config' object nor config.json); model summary is empty")
    tok = [n for n in TOKENIZER_FILES if os.path.lexists(model_dir / n)]
    for n in tok:  # the runtime will read them: same rules as any file of the model directory
        check_inside(model_dir, model_dir / n)
        check_regular(model_dir / n)
    dropped = sorted(set(legacy) - {"tensors", "config", "format", "version"})
    if dropped:
        notes.append(f"dropped legacy top-level keys: {', '.join(dropped)}")
    meta = {
        "format": FORMAT_NAME,
        "version": VERSION,
        "alignment": align,
        "checksum": checksum,
        "producer": "ieconv iebin-upgrade",
        "model": model_summary(config),
        "config": config,
        "tokenizer": {"files": tok},
        "source": {"kind": "legacy", "name": legacy_path.name, "revision": None, "shards": []},
        "aux_files": [],
        "files": [{"name": f, "nbytes": s} for f, s in sorted(file_sizes.items())],
        "tensors": tensors,
    }
    return meta, notes
