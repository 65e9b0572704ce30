"""Choosing the next token from logits: greedy, or temperature + nucleus (top-p).

Kept apart from the decoder so the benchmark (always greedy, so runs are
comparable) and ``ierun generate`` share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from iekit.formats.errors import IEError


@dataclass
class Sampler:
    """``temp == 0`` is greedy (argmax; ties go to the lowest id, as torch's
    argmax). Otherwise softmax(logits / temp), restricted to the smallest set
    of tokens whose probability reaches ``top_p``, sampled with ``seed``."""

    temp: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temp >= 0 and np.isfinite(self.temp)):
            raise IEError(f"--temp must be a finite number >= 0, got {self.temp}")
        if not 0 < self.top_p <= 1:
            raise IEError(f"--top-p must be in (0, 1], got {self.top_p}")
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.temp == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.temp
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, self.top_p) + 1)]
        q = p[keep] / p[keep].sum()
        return int(keep[self._rng.choice(keep.size, p=q)])


def stream(dec, prompt_ids: list[int], max_new: int, sampler: Sampler, stop_at_eos: bool = True) -> Iterator[int]:
    """The new ids after ``prompt_ids``, one at a time: up to ``max_new``,
    ending after an EOS id (unless ``stop_at_eos`` is false: then exactly
    ``max_new``). Between two yields runs exactly the model's work for the
    next token (the prefill before the first, one step before each later
    one), which is what ``ierun bench`` times."""
    if max_new < 0:
        raise IEError(f"--max-new must be >= 0, got {max_new}")
    if max_new == 0:
        return
    logits = dec.prefill(prompt_ids)
    for i in range(max_new):
        tok = sampler(logits)
        yield tok
        if i + 1 == max_new or (stop_at_eos and tok in dec.eos_ids):
            return
        logits = dec.step(tok)


def generate(dec, prompt_ids: list[int], max_new: int, sampler: Sampler) -> list[int]:
    """``stream`` collected."""
    return list(stream(dec, prompt_ids, max_new, sampler))
