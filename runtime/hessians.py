"""Input covariances of a model's matrices, E[x xᵀ] over calibration text,
for error-compensating quantization (formats/gptq.py).

The decoder keeps the inputs of the slots asked for, a chunk at a time
(csrc/decoder: collect_stats(capture=...)); each chunk's X [tokens, n]
adds Xᵀ X. A slot's covariance takes n² × 8 bytes (SmolLM2: 27 MB a
layer), so slots are collected in windows that fit ``budget`` bytes, in the
order the converter asks for them, running the calibration text once per
window: one pass for a model whose covariances all fit.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from iekit.formats import gptq
from iekit.formats.errors import IEError

from .decoder import Decoder
from .imatrix import LAYER_INPUTS

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")


class Hessians:
    """``get(name)``: the input covariance of matrix ``name`` (float64,
    Σ x xᵀ / tokens), or None for a tensor no slot feeds. ``order``: the
    matrices in the order they will be asked for."""

    def __init__(self, dec: Decoder, chunks: list[list[int]], order: list[str], budget: int = 1 << 30,
                 on_chunk: Callable[[int, int], None] = lambda _i, _n: None):
        if not chunks or not any(chunks):
            raise IEError("covariances: no calibration tokens")
        self.dec, self.chunks, self.budget, self.on_chunk = dec, chunks, budget, on_chunk
        self.tokens = sum(len(c) for c in chunks)
        self._slots: list[int] = []
        for n in order:
            s = self.slot_of(n)
            if s is not None and s not in self._slots:
                self._slots.append(s)
        self._have: dict[int, np.ndarray] = {}
        self._factors: dict[int, np.ndarray] = {}
        self.passes = 0

    def slot_of(self, name: str) -> int | None:
        """The decoder's statistics slot whose input ``name`` reads (runtime/imatrix.py's numbering)."""
        if name == self.dec.head_name:
            return 4 * self.dec.spec.n_layers
        m = _LAYER.match(name)
        if m is None or int(m.group(1)) >= self.dec.spec.n_layers:
            return None
        return next((4 * int(m.group(1)) + k for k, names in enumerate(LAYER_INPUTS) if m.group(2) in names), None)

    def _width(self, slot: int) -> int:
        s = self.dec.spec
        if slot == 4 * s.n_layers:
            return s.hidden
        return (s.hidden, s.n_heads * s.head_dim, s.hidden, s.inter)[slot % 4]

    def get(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(covariance, its gptq.inverse_factor) of ``name``'s input, or None;
        the factor is computed once for the matrices one input feeds (q/k/v)."""
        slot = self.slot_of(name)
        if slot is None:
            return None
        if slot not in self._have:
            self._collect(slot)
        if slot not in self._factors:
            self._factors[slot] = gptq.inverse_factor(self._have[slot])
        return self._have[slot], self._factors[slot]

    def _collect(self, first: int) -> None:
        """Run the calibration once for ``first`` and the slots after it in
        ``order`` that fit the budget with it (the previous window dropped)."""
        ahead = self._slots[self._slots.index(first):] if first in self._slots else [first]
        window: list[int] = []
        used = 0
        for s in ahead:
            size = self._width(s) ** 2 * 8
            if window and used + size > self.budget:
                break
            window.append(s)
            used += size
        self._have.clear()
        self._factors.clear()
        acc = {s: np.zeros((self._width(s),) * 2) for s in window}
        self.passes += 1
        self.dec._dec.collect_stats(True, capture=window)
        try:
            for i, c in enumerate(self.chunks):
                self.dec.logits(c, start=len(c) - 1)
                for s in window:
                    x = self.dec._dec.take_captured(s)
                    acc[s] += x.T @ x
                self.on_chunk(i + 1, len(self.chunks))
        finally:
            self.dec._dec.collect_stats(False)
        self._have = {s: a / self.tokens for s, a in acc.items()}
