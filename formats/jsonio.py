"""Strict JSON reading and canonical JSON writing for every JSON artifact.

Strict: duplicate keys and NaN/Infinity literals are errors (Python's json
module silently accepts both, which lets two tools read one file two ways).
Canonical: sorted keys, 2-space indent, UTF-8, trailing newline, so that
write -> read -> write is byte-identical and conversions are reproducible.

Every JSON file iekit reads (model.ie.json, model.dedup.json, tensor maps,
q4 manifests, config.json, safetensors index files) goes through
``load_json``: a regular file only (a FIFO or a device is one error line,
never a hang), at most ``JSON_MAX_BYTES`` (100 MiB) unless the caller names
another cap, and with ``inside=DIR`` it must not resolve (symlinks included)
outside that model directory.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from .errors import FormatError
from .fileio import SMALL_FILE_MAX, read_small, utf8
from .paths import check_inside

JSON_MAX_BYTES = SMALL_FILE_MAX
INSTANCE_CHARS = 80  # of a value quoted in a schema error


class _Reject(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Reject(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise _Reject(f"non-standard JSON constant {name}")


def loads_strict(data: bytes, file: str | os.PathLike) -> Any:
    text = utf8(data, file)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Reject as e:
        raise FormatError(file, "(file)", f"invalid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise FormatError(file, "(file)", f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise FormatError(file, "(file)", "invalid JSON: nesting too deep") from None
    except ValueError as e:  # e.g. an integer literal past Python's digit limit
        raise FormatError(file, "(file)", f"invalid JSON: {str(e).splitlines()[0]}") from None


def load_json(path: str | os.PathLike, *, max_bytes: int = JSON_MAX_BYTES,
              inside: str | os.PathLike | None = None) -> Any:
    """Read and strictly parse one JSON file (regular, at most ``max_bytes``;
    with ``inside``, contained in that directory)."""
    path = Path(path)
    if inside is not None:
        check_inside(inside, path)
    return loads_strict(read_small(path, max_bytes), path)


def aux_json_check(data: bytes, path: Path) -> None:
    """A ``.json`` config or tokenizer file must be one JSON object, read as
    strictly as every other JSON file. Why here: a converter copies these
    files byte for byte, and a broken tokenizer.json carried into an
    artifact passed ``validate --deep`` and failed only when ``ierun`` first
    loaded it, far from the checkpoint that held it."""
    if path.suffix == ".json" and not isinstance(loads_strict(data, path), dict):
        raise FormatError(path, "(root)", "must be a JSON object")


@functools.lru_cache(maxsize=None)
def _validator(schema_path: Path) -> Any:
    """The compiled validator of one schema file. jsonschema-rs, not the
    pure-Python jsonschema: importing that took 0.11-0.18 s and checking a
    75-tensor model.ie.json ~55 ms (0.7 ms a tensor), paid by every command
    that loads a model; jsonschema-rs imports in ~50 ms and checks the same
    file in ~0.3 ms (a 2000-tensor one: 27 ms against 1.3 s). The tests keep
    the Python jsonschema as an independent second reading of the same
    schemas (tests/test_schemas.py)."""
    import jsonschema_rs

    return jsonschema_rs.validator_for(load_json(schema_path))


def schema_check(obj: Any, schema_path: Path, file: str | os.PathLike) -> None:
    """Validate against a JSON Schema; the most relevant error becomes one
    FormatError naming the field (``rules[0].group_size``). Most relevant is
    the error highest in the document (shortest path; the first of those),
    the rule jsonschema's ``best_match`` ranks by first."""
    try:
        errors = list(_validator(Path(schema_path)).iter_errors(obj))
    except ValueError as e:  # jsonschema-rs takes at most 255 levels of nesting ("Recursion limit reached")
        raise FormatError(file, "(file)", f"cannot be checked against {Path(schema_path).name}: {e}") from None
    err = min(errors, key=lambda e: len(e.instance_path), default=None)
    if err is None:
        return
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.instance_path).lstrip(".") or "(root)"
    raise FormatError(file, field, _shorten_instance(err.message, err.instance))


def _shorten_instance(message: str, instance: Any) -> str:
    """jsonschema-rs starts most messages with the offending value as compact
    JSON; a whole object or list there would make the error line as long as
    the file, so a value over ``INSTANCE_CHARS`` is cut to its first ones."""
    if len(message) <= INSTANCE_CHARS:
        return message
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    if len(text) <= INSTANCE_CHARS or not message.startswith(text):
        return message
    return text[:INSTANCE_CHARS] + "..." + message[len(text):]


def dumps_canonical(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
