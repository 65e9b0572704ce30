"""Choosing the next token from logits: greedy, or temperature + nucleus (top-p).

Kept apart from the decoder so the benchmark (always greedy, so runs are
comparable) and ``ierun generate`` share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from iekit.formats.errors import IEError


@dataclass
class Sampler:
    """``temp == 0`` is greedy (argmax; ties go to the lowest id, as torch's
    argmax). Otherwise softmax(logits / temp), restricted to the ``top_k``
    most likely tokens (0: all), to the smallest set whose probability
    reaches ``top_p``, and to the tokens at least ``min_p`` times as likely
    as the most likely one, then sampled with ``seed`` -- transformers'
    order (temperature, then the filters). Before any of it, llama.cpp's
    repetition penalty: the logit of every id among the last
    ``repeat_last_n`` of the sequence is divided by ``repeat_penalty`` when
    positive and multiplied by it when negative (greedy decoding too)."""

    temp: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64

    def __post_init__(self) -> None:
        if not (self.temp >= 0 and np.isfinite(self.temp)):
            raise IEError(f"--temp must be a finite number >= 0, got {self.temp}")
        if not 0 < self.top_p <= 1:
            raise IEError(f"--top-p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise IEError(f"--top-k must be an integer >= 0 (0: off), got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise IEError(f"--min-p must be in [0, 1), got {self.min_p}")
        if not (self.repeat_penalty > 0 and np.isfinite(self.repeat_penalty)):
            raise IEError(f"--repeat-penalty must be a finite number > 0 (1: off), got {self.repeat_penalty}")
        if self.repeat_last_n < 0:
            raise IEError(f"--repeat-last-n must be >= 0, got {self.repeat_last_n}")
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.repeat_penalty != 1 and self.repeat_last_n and len(history):
            seen = np.unique(np.asarray(history[-self.repeat_last_n:], dtype=np.int64))
            logits = logits.copy()
            v = logits[seen]
            logits[seen] = np.where(v > 0, v / self.repeat_penalty, v * self.repeat_penalty)
        if self.temp == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.temp
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        if self.top_k:
            order = order[:self.top_k]
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, self.top_p * cum[-1]) + 1)]
        if self.min_p:
            keep = keep[p[keep] >= self.min_p * p[keep[0]]]
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
    seq = list(prompt_ids)  # the repetition penalty's window
    for i in range(max_new):
        tok = sampler(logits, seq)
        seq.append(tok)
        yield tok
        if i + 1 == max_new or (stop_at_eos and tok in dec.eos_ids):
            return
        logits = dec.step(tok)


def generate(dec, prompt_ids: list[int], max_new: int, sampler: Sampler) -> list[int]:
    """``stream`` collected."""
    return list(stream(dec, prompt_ids, max_new, sampler))
