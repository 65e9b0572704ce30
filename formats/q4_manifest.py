"""``q4_manifest.json``: which tensors to quantize, and how.

Precedence: an exact name in ``tensors`` wins over ``rules`` (fnmatch globs,
first match wins), which win over ``default``. The schema is
schemas/q4_manifest.schema.json; the semantic checks against a concrete
checkpoint (2-D, divisible rows, rules that match nothing, embeddings and
norms) are in ``plan``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dtypes import DTYPES
from .errors import FormatError
from .jsonio import load_json, schema_check
from .quant import SCHEMES, QuantParams

VERSION = 1
KEEP = "keep"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "q4_manifest.schema.json"

# Tensors that lose the most from 4-bit storage; selecting them needs --force.
_SENSITIVE = re.compile(r"(embed|wte|wpe|norm|(^|\.)ln_|layernorm)", re.IGNORECASE)


def is_sensitive(name: str) -> bool:
    return bool(_SENSITIVE.search(name))


@dataclass
class Manifest:
    path: str
    rules: list[tuple[str, QuantParams | None]]
    tensors: dict[str, QuantParams | None]
    default: QuantParams | None

    def resolve(self, name: str) -> tuple[QuantParams | None, str]:
        """The selection for ``name`` and where it came from."""
        if name in self.tensors:
            return self.tensors[name], f"tensors[{name!r}]"
        for i, (pattern, sel) in enumerate(self.rules):
            if fnmatch.fnmatchcase(name, pattern):
                return sel, f"rules[{i}]"
        return self.default, "default"


def _selection(obj: dict[str, Any]) -> QuantParams | None:
    scheme = obj["scheme"]
    if scheme == KEEP:
        return None
    if scheme == "int4w":
        g = obj.get("group_size", 64)
        return QuantParams("int4w", None if g == "row" else g, obj.get("symmetric", True),
                           obj.get("scale_dtype", "f16"))
    return QuantParams(scheme)


INT4W_KEYS = ("group_size", "symmetric", "scale_dtype")


def _check_int4w_only_keys(obj: Any, path: Path) -> None:
    """A precise message for the commonest mistake (the schema would only say
    'not allowed'): int4w parameters on another scheme."""
    if not isinstance(obj, dict):
        return
    rules, tensors = obj.get("rules"), obj.get("tensors")
    sels = [(f"rules[{i}]", r) for i, r in enumerate(rules)] if isinstance(rules, list) else []
    sels += [(f"tensors.{k}", v) for k, v in tensors.items()] if isinstance(tensors, dict) else []
    sels.append(("default", obj.get("default")))
    for where, sel in sels:
        if isinstance(sel, dict) and sel.get("scheme") != "int4w":
            for key in INT4W_KEYS:
                if key in sel:
                    raise FormatError(path, f"{where}.{key}", f"only scheme int4w takes {key!r} (scheme is {sel.get('scheme')!r})")


def load_manifest(path: str | os.PathLike) -> Manifest:
    path = Path(path)
    obj = load_json(path)
    _check_int4w_only_keys(obj, path)
    schema_check(obj, SCHEMA_PATH, path)
    rules = [(r["match"], _selection(r)) for r in obj.get("rules", [])]
    tensors = {k: _selection(v) for k, v in obj.get("tensors", {}).items()}
    return Manifest(os.fspath(path), rules, tensors, _selection(obj.get("default", {"scheme": KEEP})))


@dataclass
class Plan:
    quantize: dict[str, QuantParams] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def plan(m: Manifest, tensors: dict[str, tuple[str, list[int]]], force: bool = False) -> Plan:
    """Apply the manifest to a checkpoint's {name: (dtype, shape)}.

    Errors (raised): a selected tensor that is not a float matrix, or whose
    rows the scheme cannot split. Warnings: rules or names that select
    nothing, and embeddings/norms selected without ``force`` (kept as they are).
    """
    out = Plan()
    used_rules: set[str] = set()
    for name in tensors:
        sel, src = m.resolve(name)
        if src.startswith("rules["):
            used_rules.add(src)
        if sel is None:
            continue
        dtype, shape = tensors[name]
        where = src
        if not DTYPES[dtype].is_float:
            raise FormatError(m.path, where, f"selects {name!r} of dtype {dtype}; only float tensors can be quantized")
        why = SCHEMES[sel.scheme].check(shape, sel)
        if why:
            raise FormatError(m.path, where, f"selects {name!r}: {why}")
        if is_sensitive(name) and not force:
            out.warnings.append(f"{m.path}: {where}: selects {name!r}, an embedding/norm; kept unquantized (pass --force to quantize it)")
            continue
        out.quantize[name] = sel
    for i, (pattern, _sel) in enumerate(m.rules):
        if f"rules[{i}]" not in used_rules:
            out.warnings.append(f"{m.path}: rules[{i}]: {pattern!r} matches no tensor")
    for name in m.tensors:
        if name not in tensors:
            out.warnings.append(f"{m.path}: tensors[{name!r}]: no such tensor in the checkpoint")
    return out


def _layer_pattern(name: str) -> str:
    """model.layers.3.mlp.up_proj.weight -> model.layers.*.mlp.up_proj.weight"""
    return re.sub(r"\.\d+\.", ".*.", name)


def default_manifest(tensors: dict[str, tuple[str, list[int]]], scheme: str = "int4w", group_size: int | str = 64,
                     symmetric: bool = True, scale_dtype: str = "f16", quantize_head: bool = False) -> dict[str, Any]:
    """The usual policy: every 2-D float ``*.weight`` projection matrix is
    quantized (attention and MLP); embeddings, norms, biases and, unless
    ``quantize_head``, the output head are kept. One rule per layer-pattern;
    matrices whose rows the group size does not divide get a per-tensor
    whole-row entry, or are kept when even that is impossible."""
    sel: dict[str, Any] = {"scheme": scheme}
    if scheme == "int4w":
        sel.update(group_size=group_size, symmetric=symmetric, scale_dtype=scale_dtype)
    keep = {"scheme": KEEP}
    rules: list[dict[str, Any]] = []
    exact: dict[str, Any] = {}
    patterns: dict[str, list[str]] = {}
    for name, (dtype, shape) in tensors.items():
        head = name in ("lm_head.weight", "output.weight")
        if (len(shape) != 2 or not DTYPES[dtype].is_float or not name.endswith("weight")
                or is_sensitive(name) or (head and not quantize_head)):
            continue
        patterns.setdefault(_layer_pattern(name), []).append(name)
    params = _selection(sel)
    for pattern, names in sorted(patterns.items()):
        fits = [n for n in names if SCHEMES[scheme].check(tensors[n][1], params) is None]
        if len(fits) == len(names):
            rules.append({"match": pattern, **sel})
            continue
        for n in names:
            if n in fits:
                exact[n] = sel
            elif scheme == "int4w" and SCHEMES[scheme].check(tensors[n][1], QuantParams("int4w", None, symmetric, scale_dtype)) is None:
                exact[n] = {**sel, "group_size": "row"}
    return {"version": VERSION, "rules": rules, "tensors": exact, "default": keep}
