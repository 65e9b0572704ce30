"""``ieconv q4-manifest --target-bpw B``: a per-tensor mix of schemes that
meets an average bits-per-weight budget, spending bits where they buy most.

What llama.cpp's Q4_K_M hard-codes (some attention-value and FFN-down
matrices at 6 bits), derived here per model from its own numbers: every
matrix the policy quantizes gets a ladder of candidate selections ordered by
bits per weight; for each, the quantizer's own importance-weighted squared
error is measured on a sample of the matrix's rows (the imatrix's column
means of x², or 1 without one), scaled to the whole matrix. That error is
the expected squared error the matrix adds to its outputs per token
(E[(ΔW x)²] = Σ ΔW² E[x²] for independent columns), so it is comparable
across matrices. Starting from every matrix's cheapest candidate, the step
with the largest error saved per extra bit is taken while the budget allows
(a greedy knapsack: each matrix's error falls convexly enough with bits).

The budget is the average over all quantized matrices (bytes × 8 / elements,
scales and minimums included), as llama.cpp counts its file types.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from iekit.formats.errors import IEError
from iekit.formats.q4_manifest import selection_params
from iekit.formats.quant import SCHEMES

SAMPLE_ROWS = 64  # rows measured per matrix (evenly spaced)

# The candidates, cheapest first; a matrix gets those its shape allows, and of
# several with the same size the one with the least error on its rows.
LADDER: tuple[dict[str, Any], ...] = (
    {"scheme": "int4w", "group_size": 128, "symmetric": True, "scale_dtype": "f16"},   # 4.125
    {"scheme": "int4w", "group_size": 64, "symmetric": True, "scale_dtype": "f16"},    # 4.25
    {"scheme": "iq4_xs"},                                                              # 4.25
    {"scheme": "q4_k"},                                                                # 4.5
    {"scheme": "iq4_nl"},                                                              # 4.5
    {"scheme": "int4w", "group_size": 64, "symmetric": False, "scale_dtype": "f16"},   # 4.5
    {"scheme": "q4_0"},                                                                # 4.5
    {"scheme": "int4w", "group_size": 32, "symmetric": False, "scale_dtype": "f16"},   # 5.0
    {"scheme": "q4_1"},                                                                # 5.0
    {"scheme": "q5_k"},                                                                # 5.5
    {"scheme": "q5_0"},                                                                # 5.5
    {"scheme": "q5_1"},                                                                # 6.0
    {"scheme": "q6_k"},                                                                # 6.5625
    {"scheme": "q8_0"},                                                                # 8.5
)


@dataclass
class Choice:
    """One matrix's candidates (ascending bits) and which is chosen."""

    name: str
    elems: int
    options: list[tuple[dict[str, Any], int, float]] = field(default_factory=list)  # (selection, bytes, error)
    at: int = 0

    @property
    def selection(self) -> dict[str, Any]:
        return self.options[self.at][0]

    @property
    def bits(self) -> int:
        return self.options[self.at][1] * 8


def sample_rows(rows: int) -> list[int]:
    """The rows each candidate is measured on: all, or SAMPLE_ROWS evenly spaced."""
    if rows <= SAMPLE_ROWS:
        return list(range(rows))
    return sorted({int(r) for r in np.linspace(0, rows - 1, SAMPLE_ROWS).round()})


def _options(name: str, shape: list[int], rows: np.ndarray, imp: np.ndarray | None) -> list[tuple[dict, int, float]]:
    """Per size, the fitting candidate with the least predicted error, with its
    bytes; a size that buys no less error than the one below is dropped."""
    best: dict[int, tuple[dict, int, float]] = {}
    weights = np.ones(shape[1]) if imp is None else imp.astype(np.float64)
    for sel in LADDER:
        scheme = SCHEMES[sel["scheme"]]
        p = selection_params(sel)
        if scheme.check(shape, p):
            continue
        nbytes = scheme.nbytes(*shape, p)
        raw = scheme.quantize(rows, p, name=name, importance=imp)
        d = rows.astype(np.float64) - scheme.dequantize(raw, *rows.shape, p)
        err = float((d * d * weights).sum()) * shape[0] / rows.shape[0]
        if nbytes not in best or err < best[nbytes][2]:
            best[nbytes] = (sel, nbytes, err)
    out: list[tuple[dict, int, float]] = []
    for nbytes in sorted(best):
        if not out or best[nbytes][2] < out[-1][2]:
            out.append(best[nbytes])
    return out


def choose(shapes: dict[str, list[int]], rows_of: Callable[[str, list[int]], np.ndarray],
           importance: dict[str, np.ndarray], target_bpw: float,
           progress: Callable[[str], None] = lambda _n: None) -> list[Choice]:
    """The chosen selection per matrix (``shapes``: the matrices to quantize;
    ``rows_of(name, rows)``: those float32 rows of it, read from the source:
    only sample_rows(...) are). Raises IEError when even the cheapest
    candidates exceed the budget."""
    choices = []
    for name, shape in shapes.items():
        progress(name)
        rows = rows_of(name, sample_rows(shape[0]))
        c = Choice(name, math.prod(shape), _options(name, shape, rows, importance.get(name)))
        if not c.options:
            raise IEError(f"{name}: no candidate scheme can store a {shape[0]}x{shape[1]} matrix")
        choices.append(c)
    elems = sum(c.elems for c in choices)
    budget = target_bpw * elems
    used = sum(c.bits for c in choices)
    if used > budget:
        raise IEError(f"--target-bpw {target_bpw}: the cheapest candidates already average "
                      f"{used / elems:.3f} bits per weight")
    heap: list[tuple[float, int]] = []

    def push(i: int) -> None:
        c = choices[i]
        if c.at + 1 < len(c.options):
            _sel, nb, err = c.options[c.at + 1]
            gain = (c.options[c.at][2] - err) / (nb * 8 - c.bits)
            heapq.heappush(heap, (-gain, i))

    for i in range(len(choices)):
        push(i)
    while heap:
        _g, i = heapq.heappop(heap)
        c = choices[i]
        extra = c.options[c.at + 1][1] * 8 - c.bits
        if used + extra > budget:
            continue  # too dear now; a cheaper step elsewhere may still fit
        used += extra
        c.at += 1
        push(i)
    return choices


def summary(choices: list[Choice]) -> dict[str, Any]:
    """Average bits per weight, and the count per selection."""
    elems = sum(c.elems for c in choices)
    counts: dict[str, int] = {}
    for c in choices:
        k = label(c.selection)
        counts[k] = counts.get(k, 0) + 1
    return {"bits_per_weight": sum(c.bits for c in choices) / elems, "counts": counts}


def label(sel: dict[str, Any]) -> str:
    if sel["scheme"] != "int4w":
        return sel["scheme"]
    return f"int4w g{sel['group_size']} {'sym' if sel['symmetric'] else 'affine'}"
