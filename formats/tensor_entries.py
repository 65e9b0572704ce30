"""Keys of a model.ie.json tensor entry that other formats read too, and
the expert slices of a stack entry.

Its own module so that the formats built on IEBIN (the dedup store,
formats/dedup.py) read an entry without importing iebin.py, which
validates a model with its dedup store and so imports them.
"""

from __future__ import annotations

from typing import Any

from .errors import IEError

STORE_KEY = "store"  # present when the tensor's bytes live in a store (dedup-pack), not in a file
QUANT_KEY = "quant"  # present exactly when dtype is a quantized scheme


def expert_of(name: str) -> tuple[str, int] | None:
    """``(stack, e)`` for ``STACK[e]``, the name of expert ``e`` of a stack
    ``[experts, rows, cols]`` where a tool treats each expert as a matrix of
    its own (dedup-plan's units, block-sparse's --tensor); None for any
    other name. ``e`` is written in decimal without leading zeros, so each
    slice has exactly one name."""
    if not name.endswith("]"):
        return None
    stack, sep, idx = name[:-1].rpartition("[")
    if not sep or not stack or not (idx.isascii() and idx.isdigit()) or (len(idx) > 1 and idx[0] == "0"):
        return None
    return stack, int(idx)


def slice_problem(stack: dict[str, Any], e: int, in_store: bool = False) -> str | None:
    """Why expert ``e`` of the entry ``stack`` is no slice to read (not a
    stack, past its experts, or, unless ``in_store``, the stack lives whole
    in the dedup store), or None."""
    shape, name = stack["shape"], stack["name"]
    if len(shape) != 3 or shape[0] < 1:
        return f"{name!r} is not an expert stack [experts, rows, cols] (shape {shape})"
    if e >= shape[0]:
        return f"{name!r} has {shape[0]} experts (0 to {shape[0] - 1})"
    if STORE_KEY in stack and not in_store:
        return f"{name!r} lives in the {stack[STORE_KEY]} store as a whole; its experts are not tensors of their own"
    return None


def expert_slice(t: dict[str, Any], e: int) -> dict[str, Any]:
    """Expert ``e`` of the stack entry ``t`` as an entry of its own: its
    shape ``[rows, cols]``, its bytes the e-th of the stack's equal parts
    (a stack stores its experts one after another, in every dtype that
    stacks: docs/formats/quant.md), read in place from the stack's file.
    It carries no digest (model.ie.json records the stack's only), and
    ``stack`` / ``expert`` say where it comes from."""
    n = t["shape"][0]
    if t["nbytes"] % n:
        raise IEError(f"tensor {t['name']!r}: {t['nbytes']} bytes do not split into {n} equal experts")
    per = t["nbytes"] // n
    keep = ("dtype", "file", QUANT_KEY)
    out = {k: t[k] for k in keep if k in t}
    out.update(name=f"{t['name']}[{e}]", shape=list(t["shape"][1:]), nbytes=per, stack=t["name"], expert=e)
    if "file_data_offset" in t:
        out["file_data_offset"] = t["file_data_offset"] + e * per
    return out
