"""The matrices an interrupted ``ieconv gptq`` run had finished, kept so
that the same command resumes from them (docs/formats/gptq_partial.md).

Why: at Llama-3-8B's shapes gptq runs for hours on a CPU, and a Ctrl-C, an
out-of-memory kill or a reboot used to throw all of it away. Each
compensated matrix's payload is written to ``OUT/.gptq-partial/`` as soon
as it is made (staged, fsynced, renamed), then ``progress.json`` (the
run's inputs and one record per finished matrix) is replaced the same way:
a matrix is kept only once its record is on disk. A new run of the same
inputs takes the kept matrices' bytes instead of quantizing them again,
and skips their covariances; the artifact is byte for byte the one an
uninterrupted run writes. The directory is removed once the artifact is
committed.

The inputs are fingerprints (the manifest's and the calibration file's
SHA-256, the checkpoint shards' and the float artifact's sizes and
modification times, the options that change a code): a run of other
inputs refuses the directory, naming what differs, rather than mix two
runs' matrices.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from . import fingerprints
from .atomic import TEMP_NAME, write_file_atomic
from .errors import IEError
from .fileio import file_kind, read_small
from .jsonio import dumps_canonical, loads_strict, schema_check
from .quant import QuantError

PARTIAL_DIR = ".gptq-partial"
STATE_NAME = "progress.json"
FORMAT = "iekit-gptq-partial"
VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "gptq_partial.schema.json"
_PAYLOAD = re.compile(r"^[0-9a-f]{24}\.bin$")


def payload_name(tensor: str) -> str:
    """The file a matrix's payload is kept in: named by a digest, so no
    tensor name ever becomes a path."""
    return hashlib.sha256(tensor.encode()).hexdigest()[:24] + ".bin"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # (--out-dir a file: the converter's own check says so)
        return None


class PartialRun:
    """``OUT/.gptq-partial`` for one run of ``inputs`` (a dict of
    fingerprints). Made before the run's work: reads what an interrupted
    run left (``done``: tensor -> record) or, with ``resume`` False, plans
    to discard it. ``begin`` (under the output directory's writer lock)
    makes the directory ready; ``get``/``put`` read and keep matrices;
    ``finish`` removes it once the artifact is committed."""

    def __init__(self, out_dir: Path, inputs: dict[str, Any], resume: bool = True):
        self.dir = Path(out_dir) / PARTIAL_DIR
        self.state_path = self.dir / STATE_NAME
        self.inputs = inputs
        self.done: dict[str, dict[str, Any]] = {}
        self._discard = False
        self._state: bytes | None = None  # progress.json as read, to find a change before begin()
        st = _lstat(self.dir)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise IEError(f"{self.dir}: is {file_kind(st.st_mode)}, where gptq keeps an interrupted run's matrices; "
                          "move it away")
        self._check_entries()
        if not resume:
            self._discard = True
            return
        if _lstat(self.state_path) is None:  # stopped before its first matrix was kept
            return
        raw = read_small(self.state_path)
        obj = loads_strict(raw, self.state_path)
        schema_check(obj, SCHEMA_PATH, self.state_path)
        if not obj["matrices"]:  # stopped before its first matrix: nothing to keep
            self._discard = True
            return
        differ = fingerprints.differing(obj["inputs"], inputs)
        if differ:
            raise IEError(f"{self.dir}: an interrupted gptq run of other inputs ({', '.join(differ)} differ) kept "
                          f"{len(obj['matrices'])} matrices here; pass --no-resume to discard them, or choose another "
                          "--out-dir")
        for name, rec in obj["matrices"].items():
            self.done[name] = rec
            self._read(name)  # every kept payload checked now, not hours into the run
        self._state = raw

    def _check_entries(self) -> None:
        """Only what gptq writes may be here (progress.json, payloads, staged
        temporary files): anything else is refused, never removed."""
        for p in self.dir.iterdir():
            is_dir = p.is_dir() and not p.is_symlink()
            if is_dir or not (p.name == STATE_NAME or _PAYLOAD.match(p.name) or TEMP_NAME.match(p.name)):
                raise IEError(f"{p}: {'a directory' if is_dir else 'a file'} inside {self.dir} that gptq did not "
                              "write; move it away")

    def check_names(self, expected: set[str]) -> None:
        """Every kept matrix must be one this run compensates."""
        extra = sorted(set(self.done) - expected)
        if extra:
            raise IEError(f"{self.state_path}: keeps {extra[0]}, which this run does not compensate; "
                          "pass --no-resume to discard the kept matrices")

    def begin(self) -> None:
        """Called once the output directory is locked: the discarded
        directory removed, or the one read checked unchanged, and files no
        record names (a payload written just before a kill) removed."""
        if self._discard:
            shutil.rmtree(self.dir)
        elif self._state is not None:
            try:
                now = read_small(self.state_path)
            except IEError:
                now = None
            if now != self._state:
                raise IEError(f"{self.state_path}: changed since this run read it (another gptq run?); run again")
        self.dir.mkdir(exist_ok=True)
        st = os.lstat(self.dir)
        if not stat.S_ISDIR(st.st_mode):
            raise IEError(f"{self.dir}: is {file_kind(st.st_mode)}, expected a directory")
        self._check_entries()
        keep = {STATE_NAME, *(r["file"] for r in self.done.values())}
        for p in self.dir.iterdir():
            if p.name not in keep and _PAYLOAD.match(p.name):
                p.unlink()  # a payload whose record was never written (dead writers' temporary files: StagedFiles)
        if self._state is None:
            self._write_state()

    def get(self, name: str) -> tuple[bytes, QuantError] | None:
        """A kept matrix's payload and predicted loss, or None."""
        return self._read(name) if name in self.done else None

    def _read(self, name: str) -> tuple[bytes, QuantError]:
        """A kept payload, checked against its record: named as payload_name
        says, a regular file (no FIFO, no link) of its size and SHA-256."""
        rec = self.done[name]
        path = self.dir / rec["file"]
        if rec["file"] != payload_name(name):
            raise IEError(f"{self.state_path}: matrices.{name}.file is {rec['file']!r}, expected "
                          f"{payload_name(name)!r}; pass --no-resume to discard the kept matrices")
        st = _lstat(path)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != rec["nbytes"]:
            what = "missing" if st is None else (f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode)
                                                 else file_kind(st.st_mode))
            raise IEError(f"{path}: the kept payload of {name} is {what}, its record says {rec['nbytes']} bytes; "
                          "pass --no-resume to discard the kept matrices")
        data = read_small(path, rec["nbytes"])
        if len(data) != rec["nbytes"] or hashlib.sha256(data).hexdigest() != rec["sha256"]:
            raise IEError(f"{path}: the kept payload of {name} does not match its record (sha256); "
                          "pass --no-resume to discard the kept matrices")
        return data, QuantError(**rec["quant_error"])

    def put(self, name: str, data: bytes, error: QuantError) -> None:
        """Keep a finished matrix: its payload, then its record. A loss that
        is not finite (JSON has no NaN) is not kept: a resumed run makes it again."""
        if not (math.isfinite(error.sq_error) and math.isfinite(error.sq_norm)):
            return
        rec = {"file": payload_name(name), "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
               "quant_error": {"weighted": error.weighted, "sq_error": error.sq_error, "sq_norm": error.sq_norm,
                               "compensated": error.compensated}}
        write_file_atomic(self.dir / rec["file"], data)
        self.done[name] = rec
        self._write_state()

    def _write_state(self) -> None:
        obj = {"format": FORMAT, "version": VERSION, "inputs": self.inputs, "matrices": self.done}
        write_file_atomic(self.state_path, dumps_canonical(obj))

    def finish(self) -> None:
        """The artifact is committed: the kept matrices are no longer needed."""
        if _lstat(self.dir) is not None:
            shutil.rmtree(self.dir)
