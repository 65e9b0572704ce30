"""``kl-probes.json``: what quantizing each group of matrices more coarsely
costs a model, measured as KL divergence against its float reference.

``ieconv kl-probes`` writes it; ``ieconv q4-manifest --target-bpw B
--kl-probes FILE`` reads it to turn each matrix's predicted (importance-
weighted) error into KL: within one group the error model ranks matrices
well, across groups it does not (on SmolLM2 a value projection at 4 bits
costs 40x the KL per bit saved of a down projection with the same predicted
error). Spec: docs/formats/kl_probes.md; schema: schemas/kl_probes.schema.json.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import FormatError
from .jsonio import dumps_canonical, load_json, schema_check
from .q4_manifest import KEEP, manifest_from

FORMAT = "iekit-kl-probes"
VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "kl_probes.schema.json"


@dataclass(frozen=True)
class KLProbes:
    base: dict[str, Any]     # the selection every matrix had (a q4_manifest selection)
    probe: dict[str, Any]    # the coarser one each group took in turn
    tokens: int              # tokens scored per measurement
    base_kl: float           # mean KL of the all-base model against the reference
    groups: dict[str, float]  # manifest pattern or tensor name -> mean KL with that group at probe

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "base": self.base, "probe": self.probe, "tokens": self.tokens,
                "base_kl": self.base_kl, "groups": dict(sorted(self.groups.items()))}


def _selection(sel: dict[str, Any], key: str, path: Path) -> None:
    """A quantizing q4_manifest selection (the manifest's own checks)."""
    try:
        manifest_from({"version": 1, "default": sel}, path)
    except FormatError as e:
        raise FormatError(path, key + e.field.removeprefix("default"), e.message) from None
    if sel["scheme"] == KEEP:
        raise FormatError(path, f"{key}.scheme", "must be a quantized scheme, not 'keep'")


def from_json(obj: Any, path: str | os.PathLike) -> KLProbes:
    path = Path(path)
    schema_check(obj, SCHEMA_PATH, path)
    _selection(obj["base"], "base", path)
    _selection(obj["probe"], "probe", path)
    for key, v in [("base_kl", obj["base_kl"])] + [(f"groups.{g}", k) for g, k in obj["groups"].items()]:
        if not math.isfinite(v) or v < 0:
            raise FormatError(path, key, f"a KL divergence is finite and >= 0, got {v!r}")
    return KLProbes(obj["base"], obj["probe"], obj["tokens"], float(obj["base_kl"]),
                    {g: float(k) for g, k in obj["groups"].items()})


def read(path: str | os.PathLike) -> KLProbes:
    return from_json(load_json(Path(path)), path)


def dumps(p: KLProbes) -> bytes:
    return dumps_canonical(p.to_json())
