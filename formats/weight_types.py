"""Weight types: look one up by name, list them, show the table.

Importing this module registers every weight type: the table and the
plain float types live in ``weight_table.py``, the quantized schemes in
``quant.py`` (which builds on the table). Adding a weight type on the
Python side: a row in ``weight_table.TABLE``, its class (a quantized one
in ``quant.py``, with its fallback, GGUF name and ladder place as class
attributes), the dtype enums of schemas/iebin.schema.json (and, if the
manifest may select it, schemas/q4_manifest.schema.json), and
docs/formats/quant.md.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from . import quant as _quant  # noqa: F401  (imported for its effect: it registers the quantized schemes)
from .errors import IEError
from .weight_table import BLOCK, TABLE, WeightFacts, WeightType, names, registered

__all__ = ["BLOCK", "TABLE", "WeightFacts", "WeightType", "find", "get", "gguf_names", "manifest_schemes", "names",
           "table"]


def find(name: object) -> WeightType | None:
    """The weight type called ``name``, or None."""
    return registered(name) if isinstance(name, str) else None


def get(name: object) -> WeightType:
    """The weight type called ``name``; an IEError listing the known ones otherwise."""
    wt = find(name)
    if wt is None:
        raise IEError(f"unknown weight type {name!r} (known: {', '.join(names())})")
    return wt


def table() -> list[dict[str, Any]]:
    """The table as plain dicts in registry order (what ``_native.weight_types()`` returns on the C++ side)."""
    return [asdict(f) for f in TABLE]


def gguf_names(*, quantized: bool | None = None) -> dict[str, str]:
    """Weight type -> gguf.GGMLQuantizationType name, for the types whose
    bytes GGUF stores as they are (registry order; ``quantized`` filters)."""
    return {n: t.GGUF for n in names(quantized=quantized) if (t := get(n)).GGUF is not None}


def manifest_schemes() -> tuple[str, ...]:
    """The quantized types a q4_manifest may select (registry order): all but
    those whose class says MANIFEST = False (nvfp4, which comes from
    checkpoints, kept as they are)."""
    return tuple(n for n in names(quantized=True) if get(n).MANIFEST)
