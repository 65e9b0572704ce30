"""Token ids written by hand or by a script ("1, 17,256", one per line), for
--ids, --ids-file and prompts files."""

from __future__ import annotations

import re

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
