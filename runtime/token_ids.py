"""Token ids written by hand ("1, 17,256"), for --ids and prompts files."""

from __future__ import annotations


def parse_ids(text: str) -> list[int]:
    """Comma-separated non-negative integers; ValueError saying what is wrong.
    Whether they fit the vocabulary is the decoder's check."""
    parts = [p.strip() for p in text.split(",")]
    try:
        ids = [int(p) for p in parts if p]
    except ValueError:
        raise ValueError(f"expected comma-separated token ids, got {text.strip()!r}") from None
    if not ids or min(ids) < 0:
        raise ValueError(f"expected comma-separated token ids >= 0, got {text.strip()!r}")
    return ids
