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

Experts: each expert of a mixture sees only the rows routed to it, so each
gets its own covariances, from those rows alone (csrc/decoder:
collect_stats(capture_experts=...)): its gate/up input's, and its down
projection's input's. They are divided by all the calibration tokens, as
every other covariance is, so an expert that few rows reach weighs as
little in a predicted error as it does in the model's output. A unit of
collection is (slot, expert): the dense slots are (slot, -1), and an expert
stack [experts, rows, cols] has one unit per expert (``get(name, e)``). An
expert that no calibration row reached takes the mean of the covariances
its window collected for its layer's routed experts of the same input: its
inputs are the layer's, as far as anyone knows (the imatrix does the same
with its means).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from iekit.formats import gptq
from iekit.formats.errors import IEError

from .decoder import Decoder
from .imatrix import dense_inputs, shared_inputs, slot_rank

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


Unit = tuple[int, int]  # (the decoder's statistics slot, the expert or -1)


class Hessians:
    """``get(name)``: the input covariance of matrix ``name`` (float64,
    Σ x xᵀ / tokens), or None for a tensor no slot feeds; ``get(name, e)``
    expert ``e``'s of an expert stack. ``order``: the matrices that will be
    asked for, best in ``forward_order``."""

    def __init__(self, dec: Decoder, chunks: list[list[int]], order: list[str], budget: int = 1 << 30,
                 on_chunk: Callable[[int, int], None] = lambda _i, _n: None, sequential: bool = False,
                 kept: frozenset[str] | set[str] = frozenset()):
        if not chunks or not any(chunks):
            raise IEError("covariances: no calibration tokens")
        self.dec, self.chunks, self.budget, self.on_chunk = dec, chunks, budget, on_chunk
        self.sequential = sequential
        self._settled: dict[str, np.ndarray] = {}  # quantized, not yet swapped into the decoder
        self.tokens = sum(len(c) for c in chunks)
        self._experts = self._expert_units()
        # Windows are runs of units in the order the model reads them (forward_order), fixed up front: a resumed
        # run (``kept``: matrices an interrupted one already quantized, never asked for) takes its covariances from
        # the same windows as the run it resumes, so that with ``sequential`` each sees the same quantized matrices.
        self._windows = self._partition(sorted({u for n in order for u in self.units_of(n)}, key=self._rank))
        self._needed = {u for n in order if n not in kept for u in self.units_of(n)}
        self._have: dict[Unit, np.ndarray] = {}
        self._factors: dict[Unit, np.ndarray] = {}
        self.passes = 0
        self.unrouted: set[Unit] = set()  # expert units no calibration row reached
        # Each chunk's residual stream entering layer _at (None: start from the
        # embedding): a window resumes there instead of running every layer
        # before it again, so the passes run the layers once in all, not once
        # per window (at Llama-3-8B's shapes each down_proj covariance, 1.6 GB,
        # is a window of its own: 64 windows would have run 1056 layers).
        self._at = 0
        self._streams: list[np.ndarray] | None = None

    def _expert_units(self) -> dict[str, list[Unit]]:
        """Each expert matrix's units: a tensor per expert one, a stack one per expert."""
        moe, out = self.dec.spec.moe, {}
        if moe is None:
            return out
        for layer, has in enumerate(moe.layers):
            if not has:
                continue
            pre = f"model.layers.{layer}."
            out[pre + moe.names["router"]] = [(4 * layer + 2, -1)]
            out.update({pre + n: [(4 * layer + k, -1)] for n, k in shared_inputs(moe)})
            for key, k in (("gate", 2), ("up", 2), ("down", 3)):
                pattern = moe.names.get(key)
                if pattern is None:
                    continue
                if "{e}" in pattern:
                    out.update({pre + pattern.format(e=e): [(4 * layer + k, e)] for e in range(moe.n_experts)})
                else:
                    out[pre + pattern] = [(4 * layer + k, e) for e in range(moe.n_experts)]
        return out

    def units_of(self, name: str) -> list[Unit]:
        """The covariances ``name`` is quantized under: one, one per expert of a stack, or none."""
        if name in self._experts:
            return self._experts[name]
        if name == self.dec.head_name:
            return [(4 * self.dec.spec.n_layers, -1)]
        m = _LAYER.match(name)
        if m is None or int(m.group(1)) >= self.dec.spec.n_layers:
            return []
        slot = dense_inputs(self.dec.spec, int(m.group(1))).get(m.group(2))
        return [] if slot is None else [(slot, -1)]

    def _rank(self, unit: Unit) -> tuple[int, float, int]:
        """Where a unit's input arises in a forward pass (slot_rank), then its expert."""
        return (*slot_rank(self.dec.spec, unit[0]), unit[1])

    def slot_of(self, name: str) -> int | None:
        """The decoder's statistics slot whose input ``name`` reads (runtime/imatrix.py's numbering)."""
        units = self.units_of(name)
        return units[0][0] if units else None

    def is_stack(self, name: str) -> bool:
        """Whether ``name`` is an expert stack: one covariance per expert, ``get(name, e)``."""
        return len(self.units_of(name)) > 1

    def forward_order(self, names: list[str]) -> list[str]:
        """``names`` with the matrices that have a covariance in the order
        the model reads them (layer by layer; in a layer q/k/v, o, gate/up
        (or the router, then each expert's gate/up), down (each expert's);
        the head last), the others first as given: the order a sequential
        conversion quantizes them in."""
        unit = {n: self.units_of(n) for n in names}
        return [n for n in names if not unit[n]] + sorted((n for n in names if unit[n]),
                                                          key=lambda n: self._rank(unit[n][0]))

    def settle(self, name: str, w: np.ndarray) -> None:
        """``name`` is quantized, its dequantized values ``w``: in sequential
        mode the covariances collected from now on see them (the converter
        makes ``w`` only then)."""
        if self.sequential and self.units_of(name):
            self._settled[name] = w

    def _width(self, unit: Unit) -> int:
        s = self.dec.spec
        slot, expert = unit
        if slot == 4 * s.n_layers:
            return s.hidden
        if slot > 4 * s.n_layers:  # latent attention's q_b and kv_b inputs; Falcon-H1's Mamba2 out_proj's;
            own = slot - 4 * s.n_layers - 1  # Mamba 1's x_proj and dt_proj
            return s.ssm_heads * s.ssm_head_dim if s.ssm_attends else \
                (s.ssm1_inner, s.ssm1_rank)[own % 2] if s.ssm1 else (s.q_lora, s.kv_lora)[own % 2]
        if expert >= 0:
            return s.hidden if slot % 4 == 2 else s.moe.inter
        if slot % 4 == 3 and s.moe is not None and s.moe.layers[slot // 4]:  # a shared expert's down input
            return s.moe.shared_inter
        if slot % 4 == 1 and s.linear and s.linear[slot // 4]:  # a gated DeltaNet's heads' outputs (its out_proj)
            return s.lin_v_heads * s.lin_v_dim
        if slot % 4 == 1 and s.short_conv and s.short_conv[slot // 4]:  # the short convolution's gated sums
            return s.hidden
        if slot % 4 == 1 and s.ssm1:  # Mamba 1's gated scan (its out_proj)
            return s.ssm1_inner
        if slot % 4 == 1 and s.ssm and s.ssm[slot // 4] and not s.ssm_attends:  # Mamba2's gated, normed scan
            return s.ssm_heads * s.ssm_head_dim
        return (s.hidden, s.n_heads * s.v_dim, s.hidden, s.inter)[slot % 4]

    def get(self, name: str, expert: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """(covariance, its gptq.inverse_factor) of ``name``'s input (of
        expert ``expert``'s, for a stack), or None; the factor is computed
        once for the matrices one input feeds (q/k/v, an expert's gate/up)."""
        units = self.units_of(name)
        if not units or (len(units) > 1) != (expert is not None):
            return None
        unit = units[expert or 0]
        if unit not in self._have:
            self._collect(unit)
        if not self._have[unit].any():  # an unrouted expert with no routed one beside it to stand in
            return None
        if unit not in self._factors:
            self._factors[unit] = gptq.inverse_factor(self._have[unit])
        return self._have[unit], self._factors[unit]

    def of(self, name: str) -> Any:
        """What a quantizer takes for ``name``: ``get(name)``, or for an
        expert stack expert -> ``get(name, expert)``, asked for an expert at
        a time (its experts' covariances need not fit in memory together)."""
        return (lambda e: self.get(name, e)) if self.is_stack(name) else self.get(name)

    def _partition(self, units: list[Unit]) -> list[list[Unit]]:
        """``units`` cut into windows, greedily in order: as many as fit the
        budget (at least one), with ``sequential`` one layer's at most (the
        next layer waits for this one's codes)."""
        windows: list[list[Unit]] = []
        used = 0  # bytes of the last window's covariances
        for u in units:
            size = self._width(u) ** 2 * 8
            if not windows or (self.sequential and self._rank(u)[0] != self._rank(windows[-1][0])[0]) \
                    or used + size > self.budget:
                windows.append([])
                used = 0
            windows[-1].append(u)
            used += size
        return windows

    def _collect(self, first: Unit) -> None:
        """Run the calibration once for the window holding ``first`` (the
        previous window dropped), for its units a matrix still asks for."""
        window = next((w for w in self._windows if first in w), [first])
        take = [u for u in window if u in self._needed or u == first]
        self._have.clear()
        self._factors.clear()
        # The quantized matrices read before this window (all of them, in a run that quantizes in forward order;
        # a resumed run settles the matrices an interrupted one kept as it meets them, so later ones wait).
        ready = {n: w for n, w in self._settled.items() if self._rank(self.units_of(n)[-1]) < self._rank(window[0])}
        if ready:
            self.dec.replace_matrices(ready)
            self._settled = {n: w for n, w in self._settled.items() if n not in ready}
        acc = {u: np.zeros((self._width(u),) * 2) for u in take}
        self.passes += 1
        lo = min(self._rank(u)[0] for u in take)
        layers = min(max(self._rank(u)[0] for u in take) + 1, self.dec.spec.n_layers)  # the head's slot needs them all
        # Where the next window resumes: the input of this one's last layer
        # (the next may start inside it), or with --sequential the input of
        # this window's own layer, which is quantized before the next runs it.
        keep = min(lo, layers - 1) if self.sequential else layers - 1  # (the head's lo is past the last layer)
        if self._at > lo:  # the kept stream is past this window's first layer: from the embedding again
            self._at, self._streams = 0, None
        streams = []
        dense = [u[0] for u in take if u[1] < 0]
        expert_layers = sorted({self._rank(u)[0] for u in take if u[1] >= 0})
        self.dec._dec.collect_stats(True, capture=dense, capture_experts=expert_layers)
        try:
            for i, c in enumerate(self.chunks):
                x, at = (None if self._streams is None else self._streams[i]), self._at
                if at < keep:
                    x, at = self.dec.run_layers(c, keep, at, x), keep
                streams.append(x)
                self.dec.run_layers(c, layers, at, x)
                for slot in dense:
                    add_gram(acc[(slot, -1)], self.dec._dec.take_captured(slot))
                for layer in expert_layers:
                    for e, pair in enumerate(self.dec._dec.take_expert_captured(layer)):
                        for k, x_e in zip((2, 3), pair):
                            if (u := (4 * layer + k, e)) in acc:
                                add_gram(acc[u], x_e)
                self.on_chunk(i + 1, len(self.chunks))
        finally:
            self.dec._dec.collect_stats(False)
        self._at, self._streams = keep, (streams if keep > 0 else None)
        for a in acc.values():
            mirror_upper(a)
            a /= self.tokens
        self._fill_unrouted(acc)
        self._have = acc

    def _fill_unrouted(self, acc: dict[Unit, np.ndarray]) -> None:
        """Each expert unit no row reached (its covariance still zero) takes
        the mean of the routed ones of its slot in ``acc`` (left zero if there
        are none: get then gives None)."""
        routed = {u: a.any() for u, a in acc.items() if u[1] >= 0}
        for u in [u for u, seen in routed.items() if not seen]:
            self.unrouted.add(u)
            peers = [acc[v] for v, seen in routed.items() if seen and v[0] == u[0]]
            if peers:
                acc[u] = sum(peers) / len(peers)
