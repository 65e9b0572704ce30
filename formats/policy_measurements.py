"""The candidates' errors ``q4-manifest --target-bpw`` measured, kept in a
file so that an interrupted run goes on from them and a run at another
budget does not measure again (docs/formats/policy_measurements.md).

Why: with ``--ref-dir`` every candidate of every matrix is quantized as
gptq quantizes it, under the matrix's input covariance. At Llama-3-8B's
shapes on 2 cores that took 45 minutes, none of it depending on the
budget, and ``ieconv quantize`` at another budget (or after a Ctrl-C)
paid it again. The errors depend on the weights, the importance (the
imatrix, or the covariances: the reference over the calibration text) and
the candidate; so the file records those inputs as fingerprints and, per
matrix, each candidate measured (its bytes and error). A run of the same
inputs takes what is there and measures only what is not, adding it as it
goes; a file of other inputs is said so and replaced (it is a cache of
this run's numbers, given by ``--measurements`` for that).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from . import fingerprints
from .atomic import refuse_non_regular, write_file_atomic
from .errors import FormatError
from .fileio import read_small
from .jsonio import dumps_canonical, loads_strict, schema_check

FORMAT = "iekit-policy-measurements"
VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "policy_measurements.schema.json"
# What a matrix's errors were measured for: the candidates the policy places ("placed": as gptq quantizes with
# --ref-dir, nearest rounding without), and the KL probes' selections under the covariance ("probed", --ref-dir only).
KINDS = ("placed", "probed")


class Measurements:
    """``path`` for a run of ``inputs`` (a dict of fingerprints): what it
    holds of the same inputs (``matrices``: name -> kind -> selection key
    -> [bytes, error]); ``note`` says why nothing was taken from a file of
    other inputs. ``put`` adds, ``save`` writes the file (staged, fsynced,
    renamed)."""

    def __init__(self, path: Path, inputs: dict[str, Any]):
        self.path = Path(path)
        self.inputs = inputs
        self.matrices: dict[str, dict[str, dict[str, list]]] = {}
        self.note: str | None = None
        refuse_non_regular(self.path)  # (read_small refuses one that turns into a FIFO meanwhile)
        if not os.path.lexists(self.path):
            return
        obj = from_json(loads_strict(read_small(self.path), self.path), self.path)
        differ = fingerprints.differing(obj["inputs"], inputs)
        if differ:
            self.note = (f"{self.path}: measured for other inputs ({', '.join(differ)} differ): every candidate is "
                         "measured again, and the file replaced")
            return
        self.matrices = obj["matrices"]

    def get(self, name: str, kind: str) -> dict[str, list]:
        return self.matrices.get(name, {}).get(kind, {})

    def put(self, name: str, kind: str, measured: dict[str, tuple[int, float]]) -> None:
        """Errors just measured (selection key -> (bytes, error)); one that is
        not finite is not kept (JSON has no NaN): a later run measures it again."""
        keep = {k: [nb, e] for k, (nb, e) in measured.items() if math.isfinite(e)}
        if keep:
            self.matrices.setdefault(name, {}).setdefault(kind, {}).update(keep)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "inputs": self.inputs, "matrices": self.matrices}

    def save(self) -> None:
        write_file_atomic(self.path, dumps_canonical(self.to_json()))


def from_json(obj: Any, path: Path) -> dict[str, Any]:
    """The file checked against its schema and what it cannot say: each key
    a selection in canonical form (sorted keys, as bpw_policy.selection_key
    writes it), each error finite."""
    schema_check(obj, SCHEMA_PATH, path)
    for name, kinds in obj["matrices"].items():
        for kind, measured in kinds.items():
            for key, (_nbytes, error) in measured.items():
                field = f"matrices.{name}.{kind}.{key}"
                try:
                    sel = json.loads(key)
                except ValueError:
                    sel = None
                if not isinstance(sel, dict) or json.dumps(sel, sort_keys=True) != key:
                    raise FormatError(path, field, "not a selection as the policy keys it (canonical JSON object)")
                if not math.isfinite(error):
                    raise FormatError(path, field, f"an error is finite, got {error!r}")
    return obj
