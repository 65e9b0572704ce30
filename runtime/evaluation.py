"""Model quality against a reference, chunk by chunk: perplexity, KL divergence,
top-1 agreement and the change in the reference's top-token probability.

The measurement is llama-perplexity's (``--kl-divergence``), without its
logits file: the ids are cut into chunks of ``ctx``; each chunk runs from
position 0 with an empty KV cache; positions i in [ctx/2, ctx-1) are scored,
each predicting id i+1 (the first half is context only). The model and the
reference run the same chunk in the same process, one after the other, and
only that chunk's logits are held (O(ctx x vocab)), however long the text.

All statistics are float64 (log-softmax by log-sum-exp); per-token values
are kept (a few floats a token) so that medians and percentiles are exact.
Standard errors are those of a mean over independent tokens: tokens in one
chunk are not independent, so they are a lower bound, as llama.cpp's are.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from iekit.formats.errors import IEError

from .decoder import Decoder

DEFAULT_CTX = 512
ROW_BLOCK = 8  # logits rows turned into float64 at once: the float64 temporaries (ROW_BLOCK x vocab) stay
# small enough for the allocator to reuse, where 64-row blocks were mapped and page-faulted afresh (2x slower)


def scored_positions(ctx: int) -> range:
    """Positions of a chunk that are scored: [ctx/2, ctx-1), each predicting the next id."""
    return range(ctx // 2, ctx - 1)


def _log_softmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log-probabilities, probabilities) of logits rows, in float64; the
    probabilities reuse the exponentials the normaliser needed."""
    z = x.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=1, keepdims=True)
    z -= np.log(total)
    e /= total
    return z, e


def score_rows(logits: np.ndarray, targets: np.ndarray, ref_logits: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-row figures of ``logits`` [n, vocab] whose row r predicts ``targets[r]``:
    ``nll`` (-log p(target)) and, with ``ref_logits``, ``nll_ref``, ``kld``
    (KL(ref || model) in nats), ``top1`` (same argmax) and ``dp`` (model's
    minus the reference's probability of the reference's top token)."""
    n = len(targets)
    rows = np.arange(n)
    out: dict[str, np.ndarray] = {"nll": np.empty(n)}
    if ref_logits is not None:
        out.update(nll_ref=np.empty(n), kld=np.empty(n), top1=np.empty(n, bool), dp=np.empty(n))
    for a in range(0, n, ROW_BLOCK):
        b = min(n, a + ROW_BLOCK)
        r, t = rows[a:b] - a, targets[a:b]
        lp, p = _log_softmax(logits[a:b])
        out["nll"][a:b] = -lp[r, t]
        if ref_logits is None:
            continue
        lq, q = _log_softmax(ref_logits[a:b])
        out["nll_ref"][a:b] = -lq[r, t]
        out["kld"][a:b] = (q * (lq - lp)).sum(axis=1)
        top_ref = lq.argmax(axis=1)
        out["top1"][a:b] = lp.argmax(axis=1) == top_ref
        out["dp"][a:b] = p[r, top_ref] - q[r, top_ref]
    return out


def _mean_se(v: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n)); 0 for one value."""
    n = len(v)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0


@dataclass
class Scores:
    """Per-token figures over every chunk so far, and what produced them."""

    ctx: int
    with_ref: bool
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)  # running sums, for the progress line
    chunks: int = 0
    seconds: float = 0.0
    forward_tokens: int = 0  # tokens run through every model, all chunks

    def add(self, rows: dict[str, np.ndarray]) -> None:
        for k, v in rows.items():
            self.parts.setdefault(k, []).append(v)
            self.totals[k] = self.totals.get(k, 0.0) + float(v.sum())
        self.parts.setdefault("pos", []).append(np.asarray(scored_positions(self.ctx), np.int64)[: len(rows["nll"])])
        self.chunks += 1

    def running(self) -> dict[str, float]:
        """PPL, and with a reference mean KL and top-1, from running sums: what a
        progress line shows after each chunk, without re-reading every token."""
        n = sum(len(p) for p in self.parts["nll"])
        r = {"ppl": math.exp(self.totals["nll"] / n)}
        if self.with_ref:
            r.update(kld_mean=self.totals["kld"] / n, top1_agree=self.totals["top1"] / n)
        return r

    def values(self, key: str) -> np.ndarray:
        return np.concatenate(self.parts[key])

    def summary(self) -> dict[str, float | int]:
        """The figures ``ierun eval`` reports (its JSON keys)."""
        nll = self.values("nll")
        n = len(nll)
        mean, se = _mean_se(nll)
        s: dict[str, float | int] = {"chunks": self.chunks, "ctx": self.ctx, "tokens_scored": n,
                                     "ppl": math.exp(mean), "ppl_se": math.exp(mean) * se, "nll_mean": mean}
        if self.with_ref:
            nll_ref = self.values("nll_ref")
            mean_ref, se_ref = _mean_se(nll_ref)
            ratio, ratio_se = _mean_se(nll - nll_ref)  # paired: the two models score the same tokens
            kld, dp = self.values("kld"), self.values("dp")
            kmean, kse = _mean_se(kld)
            top1 = float(self.values("top1").mean())
            s.update({
                "ppl_ref": math.exp(mean_ref), "ppl_ref_se": math.exp(mean_ref) * se_ref,
                "ln_ppl_ratio": ratio, "ln_ppl_ratio_se": ratio_se,
                "kld_mean": kmean, "kld_se": kse, "kld_median": float(np.median(kld)),
                "kld_p90": float(np.percentile(kld, 90)), "kld_p99": float(np.percentile(kld, 99)),
                "kld_max": float(kld.max()),
                "top1_agree": top1, "top1_agree_se": math.sqrt(top1 * (1 - top1) / (n - 1)) if n > 1 else 0.0,
                "dp_mean": float(dp.mean()), "dp_rms": float(np.sqrt(np.mean(dp ** 2))),
                "dp_p1": float(np.percentile(dp, 1)), "dp_p99": float(np.percentile(dp, 99)),
            })
        s["seconds"] = self.seconds
        s["tokens_per_s"] = self.forward_tokens / self.seconds if self.seconds > 0 else 0.0
        return s


def chunk_ids(ids: list[int], ctx: int, chunks: int | None, what: str) -> list[list[int]]:
    """``ids`` cut into whole chunks of ``ctx`` (the tail shorter than a chunk is
    left out, as llama-perplexity does); the first ``chunks`` of them."""
    n = len(ids) // ctx
    if n == 0:
        raise IEError(f"{what}: {len(ids)} tokens, fewer than one chunk of --ctx {ctx}")
    if chunks is not None:
        n = min(n, chunks)
    return [ids[i * ctx:(i + 1) * ctx] for i in range(n)]


def check_comparable(model: Decoder, ref: Decoder) -> None:
    """The reference must read the same token ids the same way: same
    architecture, vocabulary size and (where both have one) tokenizer."""
    a, b = model.spec, ref.spec
    mp, rp = model.model.meta_path, ref.model.meta_path
    if a.architecture != b.architecture:
        raise IEError(f"{rp}: model.architecture: {b.architecture!r}, but {mp} is {a.architecture!r}; "
                      "--ref-dir must be the same model at another precision")
    if a.vocab != b.vocab:
        raise IEError(f"{rp}: model.vocab_size: {b.vocab}, but {mp} has {a.vocab}; KL divergence needs one vocabulary")
    if model.has_tokenizer and ref.has_tokenizer and model.vocabulary() != ref.vocabulary():
        raise IEError(f"{ref.model.dir / 'tokenizer.json'}: maps tokens to other ids than "
                      f"{model.model.dir / 'tokenizer.json'}; the models do not share a tokenizer")


def evaluate(model: Decoder, chunks: list[list[int]], ref: Decoder | None = None,
             on_chunk: Callable[[Scores], None] | None = None, ref_cache: list[np.ndarray] | None = None) -> Scores:
    """Score ``chunks`` (each of one length, ctx) with ``model`` and, if given,
    against ``ref``; ``on_chunk`` sees the running scores after each chunk.
    ``ref_cache``: the reference's logits per chunk, kept across calls that
    score the same chunks against the same reference (kl-probes scores nine
    models so): filled on the first call, read on the next."""
    ctx = len(chunks[0])
    first = scored_positions(ctx).start
    scores = Scores(ctx=ctx, with_ref=ref is not None)
    t0 = time.perf_counter()
    # Logits of positions first..ctx-2 (the chunk's last id is only ever a
    # target), into one buffer per model for the whole run.
    shape = (ctx - 1 - first, model.spec.vocab)
    buf = np.empty(shape, np.float32)
    ref_buf = np.empty(shape, np.float32) if ref is not None else None
    for i, ids in enumerate(chunks):
        logits = model.logits(ids[:-1], first, out=buf)
        if ref is None:
            ref_logits = None
        elif ref_cache is not None and i < len(ref_cache):
            ref_logits = ref_cache[i]
        else:  # a kept copy cannot share the buffer the next chunk overwrites
            ref_logits = ref.logits(ids[:-1], first, out=ref_buf if ref_cache is None else np.empty(shape, np.float32))
            scores.forward_tokens += ctx - 1
            if ref_cache is not None:
                ref_cache.append(ref_logits)
        scores.add(score_rows(logits, np.asarray(ids[first + 1:]), ref_logits))
        scores.forward_tokens += ctx - 1
        scores.seconds = time.perf_counter() - t0
        if on_chunk:
            on_chunk(scores)
    return scores
