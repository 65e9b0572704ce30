"""The stages ``ieconv quantize`` has finished in its work directory, kept
so that the same command goes on from the first one not yet done
(docs/formats/quantize_stages.md).

Why: the calibrated pipeline (a float reference, an importance matrix, KL
probes, a measured policy, gptq) runs for hours at 8B on a CPU, in stages
that each take minutes to an hour. After a Ctrl-C, an out-of-memory kill or
a failed stage, running the same command again must not redo the stages
that finished. Each finished stage appends its record (name, the command
line it ran, its outputs' fingerprint, its time and peak memory) to
``WORK/stages.json``, replaced atomically. A new run keeps the longest run
of leading stages whose records equal its own plan and whose outputs are as
they were left, and runs the rest: a later
stage reads the earlier ones' outputs, so once one runs again every later
one does. The run's inputs are fingerprinted (formats/fingerprints.py: the
checkpoint's shards and the calibration file by size and modification
time): other inputs keep nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fingerprints
from .atomic import write_file_atomic
from .fileio import read_small
from .jsonio import dumps_canonical, loads_strict, schema_check

STATE_NAME = "stages.json"
FORMAT = "iekit-quantize-stages"
VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "quantize_stages.schema.json"


@dataclass(frozen=True)
class Finished:
    """One finished stage: its name, the ieconv command line it ran (the
    sub-command and its arguments, paths absolute; without --overwrite and
    -q, which change no output), its outputs' fingerprint as it left them
    (fingerprints.outputs), and what it cost."""

    name: str
    argv: tuple[str, ...]
    outputs: str
    seconds: float
    peak_rss_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "argv": list(self.argv), "outputs": self.outputs, "seconds": self.seconds,
                "peak_rss_bytes": self.peak_rss_bytes}


class StageLog:
    """``WORK/stages.json`` for one run of ``inputs`` (fingerprints): the
    stages an earlier run of the same inputs finished (``finished``), and
    the record this run keeps as it goes (``keep_prefix``, ``add``)."""

    def __init__(self, work: Path, inputs: dict[str, Any]):
        self.path = Path(work) / STATE_NAME
        self.inputs = inputs
        self.finished: list[Finished] = []
        self.inputs_changed = False
        if not os.path.lexists(self.path):
            return
        obj = loads_strict(read_small(self.path), self.path)  # (read_small refuses a FIFO or device)
        schema_check(obj, SCHEMA_PATH, self.path)
        if obj["inputs"] != inputs:
            self.inputs_changed = True  # every stage runs again; the record is replaced at the first one's end
            return
        self.finished = [Finished(s["name"], tuple(s["argv"]), s["outputs"], s["seconds"], s["peak_rss_bytes"])
                         for s in obj["stages"]]

    def matching(self, planned: list[tuple[str, tuple[str, ...], list[Path]]]) -> int:
        """How many leading stages of ``planned`` ((name, argv, fingerprinted
        paths) each) an earlier run finished with the same command line and
        whose paths are still as it left them. The record is left as it is:
        the stages that write the checkpoint ask this before the rest of the
        plan, which needs that checkpoint, exists."""
        n = 0
        for (name, argv, paths), rec in zip(planned, self.finished):
            if rec.name != name or rec.argv != tuple(argv) or rec.outputs != fingerprints.outputs(paths):
                break
            n += 1
        return n

    def keep_prefix(self, planned: list[tuple[str, tuple[str, ...], list[Path]]]) -> int:
        """``matching(planned)``, the records after those stages dropped."""
        n = self.matching(planned)
        self.finished = self.finished[:n]
        return n

    def add(self, rec: Finished) -> None:
        """Record a finished stage (staged, fsynced, renamed)."""
        self.finished.append(rec)
        write_file_atomic(self.path, encode(self.inputs, self.finished))


def encode(inputs: dict[str, Any], finished: list[Finished]) -> bytes:
    """The record's bytes: canonical JSON, so reading and writing it again
    gives the same bytes (tests/test_quantize_cmd.py)."""
    return dumps_canonical({"format": FORMAT, "version": VERSION, "inputs": inputs,
                            "stages": [f.as_json() for f in finished]})
