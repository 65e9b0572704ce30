"""Input covariances of a model's matrices, E[x xᵀ] over calibration text,
for error-compensating quantization (formats/gptq.py).

The decoder keeps the inputs of the slots asked for, a chunk at a time
(csrc/decoder: collect_stats(capture=...)); each chunk's X [tokens, n]
adds Xᵀ X. A slot's covariance takes n² × 8 bytes (SmolLM2: 27 MB a
layer), so slots are collected in windows that fit ``budget`` bytes, in the
order the model reads them (the converter asks in that order), running the
calibration text once per window: one pass for a model whose covariances
all fit. A window resumes from each chunk's residual stream that the last
one kept (``Decoder.run_layers(..., first, stream)``), so many windows
still run each layer about once, not once per window.

``sequential``: each layer's covariances come from a model whose earlier
layers are already quantized (GPTQ's "sequential" mode): the converter
hands every compensated matrix back (``settle``), the decoder swaps its
dequantized values in, and each layer gets a pass of its own, so the
later layers' codes are fitted to the inputs the quantized model will
really give them, errors of the earlier layers included. One pass per
layer instead of one in all.
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


GRAM_BLOCK = 512  # columns per block of add_gram and mirror_upper


def add_gram(acc: np.ndarray, rows: np.ndarray, block: int = GRAM_BLOCK) -> None:
    """acc += rowsᵀ rows (each block's product in rows' dtype), its upper
    triangle only (mirror_upper completes it), a block of columns at a
    time: half the multiply-adds, and no n × n temporary beside acc (at
    Llama-3-8B's shapes a down_proj input's is 1.6 GB)."""
    n = acc.shape[0]
    for j in range(0, n, block):
        jb = slice(j, min(j + block, n))
        acc[:jb.stop, jb] += rows[:, :jb.stop].T @ rows[:, jb]


def mirror_upper(a: np.ndarray, block: int = GRAM_BLOCK) -> None:
    """a's upper triangle copied onto its lower one, in place, by blocks."""
    n = a.shape[0]
    for j in range(0, n, block):
        jb = slice(j, min(j + block, n))
        a[jb.stop:, jb] = a[jb, jb.stop:].T
        a[jb, jb] = np.triu(a[jb, jb]) + np.triu(a[jb, jb], 1).T


class Hessians:
    """``get(name)``: the input covariance of matrix ``name`` (float64,
    Σ x xᵀ / tokens), or None for a tensor no slot feeds. ``order``: the
    matrices that will be asked for, best in ``forward_order``."""

    def __init__(self, dec: Decoder, chunks: list[list[int]], order: list[str], budget: int = 1 << 30,
                 on_chunk: Callable[[int, int], None] = lambda _i, _n: None, sequential: bool = False,
                 kept: frozenset[str] | set[str] = frozenset()):
        if not chunks or not any(chunks):
            raise IEError("covariances: no calibration tokens")
        self.dec, self.chunks, self.budget, self.on_chunk = dec, chunks, budget, on_chunk
        self.sequential = sequential
        self._settled: dict[str, np.ndarray] = {}  # quantized, not yet swapped into the decoder
        self.tokens = sum(len(c) for c in chunks)
        # Windows are runs of slots in the order the model reads them (forward_order), fixed up front: a resumed
        # run (``kept``: matrices an interrupted one already quantized, never asked for) takes its covariances from
        # the same windows as the run it resumes, so that with ``sequential`` each sees the same quantized matrices.
        self._windows = self._partition(sorted({s for n in order if (s := self.slot_of(n)) is not None}))
        self._needed = {s for n in order if n not in kept and (s := self.slot_of(n)) is not None}
        self._have: dict[int, np.ndarray] = {}
        self._factors: dict[int, np.ndarray] = {}
        self.passes = 0
        # Each chunk's residual stream entering layer _at (None: start from the
        # embedding): a window resumes there instead of running every layer
        # before it again, so the passes run the layers once in all, not once
        # per window (at Llama-3-8B's shapes each down_proj covariance, 1.6 GB,
        # is a window of its own: 64 windows would have run 1056 layers).
        self._at = 0
        self._streams: list[np.ndarray] | None = None

    def slot_of(self, name: str) -> int | None:
        """The decoder's statistics slot whose input ``name`` reads (runtime/imatrix.py's numbering)."""
        if name == self.dec.head_name:
            return 4 * self.dec.spec.n_layers
        m = _LAYER.match(name)
        if m is None or int(m.group(1)) >= self.dec.spec.n_layers:
            return None
        return next((4 * int(m.group(1)) + k for k, names in enumerate(LAYER_INPUTS) if m.group(2) in names), None)

    def forward_order(self, names: list[str]) -> list[str]:
        """``names`` with the matrices that have a slot in the order the
        model reads them (layer by layer; in a layer q/k/v, o, gate/up,
        down; the head last), the others first as given: the order a
        sequential conversion quantizes them in."""
        slot = {n: self.slot_of(n) for n in names}
        return [n for n in names if slot[n] is None] + sorted((n for n in names if slot[n] is not None),
                                                               key=lambda n: slot[n])

    def settle(self, name: str, w: np.ndarray) -> None:
        """``name`` is quantized, its dequantized values ``w``: in sequential
        mode the covariances collected from now on see them (the converter
        makes ``w`` only then)."""
        if self.sequential and self.slot_of(name) is not None:
            self._settled[name] = w

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

    def _partition(self, slots: list[int]) -> list[list[int]]:
        """``slots`` cut into windows, greedily in order: as many as fit the
        budget (at least one), with ``sequential`` one layer's at most (the
        next layer waits for this one's codes)."""
        windows: list[list[int]] = []
        used = 0  # bytes of the last window's covariances
        for s in slots:
            size = self._width(s) ** 2 * 8
            if not windows or (self.sequential and s // 4 != windows[-1][0] // 4) or used + size > self.budget:
                windows.append([])
                used = 0
            windows[-1].append(s)
            used += size
        return windows

    def _collect(self, first: int) -> None:
        """Run the calibration once for the window holding ``first`` (the
        previous window dropped), for its slots a matrix still asks for."""
        window = next((w for w in self._windows if first in w), [first])
        take = [s for s in window if s in self._needed or s == first]
        self._have.clear()
        self._factors.clear()
        # The quantized matrices read before this window (all of them, in a run that quantizes in forward order;
        # a resumed run settles the matrices an interrupted one kept as it meets them, so later ones wait).
        ready = {n: w for n, w in self._settled.items() if self.slot_of(n) < window[0]}
        if ready:
            self.dec.replace_matrices(ready)
            self._settled = {n: w for n, w in self._settled.items() if n not in ready}
        acc = {s: np.zeros((self._width(s),) * 2) for s in take}
        self.passes += 1
        lo = min(take) // 4
        layers = min(max(take) // 4 + 1, self.dec.spec.n_layers)  # the head's slot needs them all
        # Where the next window resumes: the input of this one's last layer
        # (the next may start inside it), or with --sequential the input of
        # this window's own layer, which is quantized before the next runs it.
        keep = min(lo, layers - 1) if self.sequential else layers - 1  # (the head's lo is past the last layer)
        if self._at > lo:  # the kept stream is past this window's first layer: from the embedding again
            self._at, self._streams = 0, None
        streams = []
        self.dec._dec.collect_stats(True, capture=take)
        try:
            for i, c in enumerate(self.chunks):
                x, at = (None if self._streams is None else self._streams[i]), self._at
                if at < keep:
                    x, at = self.dec.run_layers(c, keep, at, x), keep
                streams.append(x)
                self.dec.run_layers(c, layers, at, x)
                for s in take:
                    add_gram(acc[s], self.dec._dec.take_captured(s))
                self.on_chunk(i + 1, len(self.chunks))
        finally:
            self.dec._dec.collect_stats(False)
        self._at, self._streams = keep, (streams if keep > 0 else None)
        for a in acc.values():
            mirror_upper(a)
            a /= self.tokens
        self._have = acc
