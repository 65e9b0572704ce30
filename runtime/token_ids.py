"""Token ids written by hand or by a script ("1, 17,256", one per line), for
--ids, --ids-file and prompts files; and the ids a scoring or calibration
command reads from --text-file or --ids-file."""

from __future__ import annotations

import re
from pathlib import Path

import click

from iekit.formats.errors import IEError
from iekit.formats.fileio import read_small, read_utf8

TEXT_MAX = 1 << 30  # --text-file / --ids-file: 1 GiB at most

_SEP = re.compile(r"[,\s]+")


def parse_ids(text: str) -> list[int]:
    """Non-negative integers separated by commas and/or whitespace; ValueError
    saying what is wrong. Whether they fit the vocabulary is the decoder's check."""
    ids = []
    for p in (p for p in _SEP.split(text) if p):
        try:
            ids.append(int(p))
        except ValueError:  # the part int() refused is the one named ("--2" looked like a number to a digit test)
            raise ValueError(f"expected token ids separated by commas or whitespace, got {p[:40]!r}") from None
    if not ids:
        raise ValueError("no token ids")
    if min(ids) < 0:
        raise ValueError(f"token ids must be >= 0, got {min(ids)}")
    return ids


def read_source(text_file: Path | None, ids_file: Path | None) -> tuple[str | list[int], str]:
    """The text (UTF-8, not empty) or the token ids to evaluate, as read and
    before any model is loaded, and the option they came from (for
    messages). ``ieconv quantize`` reads its texts through here up front, so
    an empty or binary file is refused before its first stage, not minutes
    later where the imatrix stage first tokenizes it."""
    if (text_file is None) == (ids_file is None):
        raise click.UsageError("give exactly one of --text-file and --ids-file")
    if ids_file is not None:
        raw = read_small(ids_file, TEXT_MAX)
        try:
            return parse_ids(raw.decode("ascii")), f"--ids-file {ids_file}"
        except (UnicodeDecodeError, ValueError) as e:
            raise IEError(f"{ids_file}: {e if isinstance(e, ValueError) else 'expected ASCII token ids'}") from None
    text = read_utf8(text_file, TEXT_MAX)
    if not text.strip():
        raise IEError(f"{text_file}: no text to evaluate (the file is empty)")
    return text, f"--text-file {text_file}"


def load_ids(model, text_file: Path | None, ids_file: Path | None) -> tuple[list[int], str]:
    """The token ids to evaluate (``read_source``'s, text encoded by ``model``), and the option they came from."""
    src, what = read_source(text_file, ids_file)
    return (src if isinstance(src, list) else model.encode(src)), what
