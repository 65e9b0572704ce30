"""Strict JSON reading and canonical JSON writing for every JSON artifact.

Strict: duplicate keys and NaN/Infinity literals are errors (Python's json
module silently accepts both, which lets two tools read one file two ways).
Canonical: sorted keys, 2-space indent, UTF-8, trailing newline, so that
write -> read -> write is byte-identical and conversions are reproducible.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import FormatError


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
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(file, "(file)", f"not valid UTF-8 at byte {e.start}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Reject as e:
        raise FormatError(file, "(file)", f"invalid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise FormatError(file, "(file)", f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise FormatError(file, "(file)", "invalid JSON: nesting too deep") from None
    except ValueError as e:  # e.g. an integer literal past Python's digit limit
        raise FormatError(file, "(file)", f"invalid JSON: {str(e).splitlines()[0]}") from None


def load_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(path, "(file)", "no such file") from None
    except IsADirectoryError:
        raise FormatError(path, "(file)", "is a directory, expected a JSON file") from None
    return loads_strict(data, path)


def schema_check(obj: Any, schema_path: Path, file: str | os.PathLike) -> None:
    """Validate against a JSON Schema; the most relevant error becomes one
    FormatError naming the field (``rules[0].group_size``)."""
    import jsonschema

    schema = load_json(schema_path)
    validator = jsonschema.validators.validator_for(schema)(schema)
    err = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if err is None:
        return
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".") or "(root)"
    msg = err.message
    raise FormatError(file, field, msg)


def dumps_canonical(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
