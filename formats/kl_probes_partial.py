"""What an interrupted ``ieconv kl-probes`` run had finished, kept so that
the same command resumes from it (docs/formats/kl_probes_partial.md).

Why: at Llama-3-8B's shapes one probe set takes about 18 minutes on 2
cores (two conversions of the whole model, then one scoring per group and
the base), ``ieconv quantize`` runs two, and the set holds the pipeline's
largest memory peak, so an out-of-memory kill is likely there. A Ctrl-C or
a kill threw all of it away, and a killed run's work folder (then a random
name) stopped the next ``ieconv quantize`` run in its work directory.

The work folder is now ``.NAME.partial`` beside the output file NAME. It
holds the two conversions (``base/``: the all-base artifact with the
all-probe payload beside it), recorded in ``progress.json`` once both are
made, and each scoring's KL once measured. A run of the same inputs takes
what is recorded; one of other inputs refuses, naming what differs, unless
told to discard it. The folder is removed once the output is written.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from . import fingerprints
from .atomic import TEMP_NAME, lock_directory, write_file_atomic
from .errors import FormatError, IEError
from .fileio import file_kind, read_small
from .jsonio import dumps_canonical, loads_strict, schema_check

SUFFIX = ".partial"
STATE_NAME = "progress.json"
CONVERTED = "base"  # the two conversions' folder (an IEBIN artifact plus the probe payload)
STAGING = "probe"   # the all-probe conversion while it is made (its payload and metadata then move into CONVERTED)
PROBE_BIN, PROBE_META = "probe.ie.bin", "probe.ie.json"  # those two, in CONVERTED
FORMAT = "iekit-kl-probes-partial"
VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "kl_probes_partial.schema.json"


def partial_dir(out: Path) -> Path:
    """The work folder of a run writing ``out``: one per output file, so two
    probe sets written into one folder (ieconv quantize's) keep apart."""
    out = Path(out)
    return out.parent / f".{out.name}{SUFFIX}"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


class ProbesRun:
    """The work folder of one run of ``inputs`` (a dict of fingerprints),
    used as a context manager: entering takes the folder's writer lock and
    reads what an interrupted run of the same inputs kept (``converted``,
    ``base_kl``, ``tokens``, ``groups``); leaving on an error removes the
    folder if it keeps nothing. ``finish`` removes it once the output is
    written."""

    def __init__(self, out: Path, inputs: dict[str, Any], resume: bool = True):
        self.dir = partial_dir(out)
        self.state_path = self.dir / STATE_NAME
        self.inputs = inputs
        self.resume = resume
        self.converted: str | None = None  # fingerprint of the conversions, once both are made
        self.tokens: int | None = None
        self.base_kl: float | None = None
        self.groups: dict[str, float] = {}
        self._fd: int | None = None

    # -- the folder

    def __enter__(self) -> "ProbesRun":
        st = _lstat(self.dir)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            what = "a file" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
            raise IEError(f"{self.dir}: is {what}, where kl-probes keeps an interrupted run's work; move it away")
        self.dir.mkdir(exist_ok=True)
        fd = lock_directory(self.dir)
        try:
            self._check_entries()
            if _lstat(self.state_path) is not None:
                if self.resume:
                    self._read()
                else:
                    self._clear()
            for p in self.dir.iterdir():  # staged files of a killed writer, a conversion not recorded
                if TEMP_NAME.match(p.name) or (p.name in (CONVERTED, STAGING) and self.converted is None):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None and not self.kept():
                shutil.rmtree(self.dir, ignore_errors=True)  # a run stopped before keeping anything leaves nothing
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _check_entries(self) -> None:
        """Only what kl-probes writes may be here: anything else is refused,
        never removed."""
        for p in self.dir.iterdir():
            is_dir = p.is_dir() and not p.is_symlink()
            ours = (p.name in (CONVERTED, STAGING)) == is_dir and (
                p.name in (STATE_NAME, CONVERTED, STAGING) or TEMP_NAME.match(p.name))
            if not ours:
                raise IEError(f"{p}: {'a directory' if is_dir else 'a file'} inside {self.dir} that kl-probes did not "
                              "write; move it away")

    def _read(self) -> None:
        obj = from_json(loads_strict(read_small(self.state_path), self.state_path), self.state_path)
        differ = fingerprints.differing(obj["inputs"], self.inputs)
        if differ:
            raise IEError(f"{self.dir}: an interrupted kl-probes run of other inputs ({', '.join(differ)} differ) kept "
                          "its work here; pass --no-resume to discard it")
        if obj["converted"] is not None and obj["converted"] != self.conversions_fingerprint():
            return  # the conversions are not as recorded (removed, changed): made again, scored again
        self.converted, self.tokens, self.base_kl = obj["converted"], obj["tokens"], obj["base_kl"]
        self.groups = {g: float(k) for g, k in obj["groups"].items()}

    def _clear(self) -> None:
        """--no-resume: what an earlier run kept goes."""
        for p in self.dir.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    # -- what is kept

    @property
    def base_dir(self) -> Path:
        return self.dir / CONVERTED

    @property
    def staging_dir(self) -> Path:
        return self.dir / STAGING

    def conversions_fingerprint(self) -> str | None:
        """The two conversions as they are on disk (metadata by content,
        payloads by size and time), or None if one is missing."""
        try:
            return fingerprints.digest(fingerprints.artifact(self.base_dir).encode(),
                                       read_small(self.base_dir / PROBE_META),
                                       fingerprints.stat_line(self.base_dir / PROBE_BIN))
        except (FileNotFoundError, NotADirectoryError, FormatError):
            return None

    def kept(self) -> int:
        """How many things are kept: the conversions (1), the base's scoring, each group's."""
        return (self.converted is not None) + (self.base_kl is not None) + len(self.groups)

    def describe(self, total_groups: int) -> str:
        """'the two conversions and 3 of 9 scorings' (kept() > 0)."""
        scored = (self.base_kl is not None) + len(self.groups)
        return f"the two conversions and {scored} of {total_groups + 1} scorings"

    def put_converted(self) -> None:
        self.converted = self.conversions_fingerprint()
        if self.converted is None:
            raise IEError(f"{self.base_dir}: the conversions just made are not there")
        self._write()

    def put_base(self, kl: float, tokens: int) -> None:
        if math.isfinite(kl):
            self.base_kl, self.tokens = kl, tokens
            self._write()

    def put(self, group: str, kl: float) -> None:
        """A group's KL (one that is not finite is not kept: JSON has no NaN; a resumed run scores it again)."""
        if math.isfinite(kl):
            self.groups[group] = kl
            self._write()

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "inputs": self.inputs, "converted": self.converted,
                "tokens": self.tokens, "base_kl": self.base_kl, "groups": self.groups}

    def _write(self) -> None:
        write_file_atomic(self.state_path, dumps_canonical(self.to_json()))

    def finish(self) -> None:
        """The output is written: the work is no longer needed."""
        shutil.rmtree(self.dir, ignore_errors=True)


def from_json(obj: Any, path: Path) -> dict[str, Any]:
    """progress.json checked against its schema and the rules it cannot
    say: finite KLs, scorings only of recorded conversions, the base's first."""
    schema_check(obj, SCHEMA_PATH, path)
    for key, v in [("base_kl", obj["base_kl"])] + [(f"groups.{g}", k) for g, k in obj["groups"].items()]:
        if v is not None and (not math.isfinite(v) or v < 0):
            raise FormatError(path, key, f"a KL divergence is finite and >= 0, got {v!r}")
    if (obj["groups"] or obj["base_kl"] is not None) and obj["converted"] is None:
        raise FormatError(path, "converted", "scorings are recorded, but not the conversions they scored")
    if (obj["base_kl"] is None) != (obj["tokens"] is None):
        raise FormatError(path, "tokens", "the base's KL and its token count are recorded together")
    if obj["groups"] and obj["base_kl"] is None:
        raise FormatError(path, "base_kl", "groups are scored after the base")
    return obj

