"""Whether a mixture of experts' matrices get the decoder's row-interleaved
copies (rows8) at load, and ``--experts``, the flag that asks; and whether
dense matrices get copies larger than their stored bytes (grow_copies).

Kept apart from runtime/decoder.py so the commands can offer the flag
without loading the native runtime (``--help`` stays fast)."""

from __future__ import annotations

from typing import Any

import click

from iekit.formats.errors import IEError
from iekit.formats.model_spec import EXPERTS_KEY, LAYERS_KEY

from .memory import available_bytes, gib

MODES = ("auto", "copy", "in-place")


def copy_experts(mode: str, weights: dict[str, Any], act: str, device: str) -> bool:
    """Whether the native decoder gives a mixture of experts' matrices
    rows8 copies, as it gives every dense matrix: decode then reads them
    with the tile kernels instead of the stored layout's (and a Silu
    mixture's gate and up in one pass), 1.74x faster on a Qwen3-MoE-shaped
    Q4_K_M on AVX2 (docs/benchmarks.md), at the price of the whole model
    resident. In place, the mapped file pages in only the experts a prompt
    routes to, and a model larger than memory still runs. ``in-place`` as
    asked; ``copy`` as asked unless the copies exceed the memory available:
    an IEError; ``auto``: copy when the copies take at most two thirds of the
    memory available now. The copies' size is the stored one but for the
    codebook types, whose copies hold 4.25 bits a weight (iq2_xxs: twice
    its 2.06; iq2_xs's, iq2_s's, iq1_s's and iq1_m's 4.56 bits). Only act=int8 on the CPU has the
    kernels that read them (and the native decoder copies nothing on an ISA
    without them: scalar)."""
    if mode not in MODES:
        raise IEError(f"experts: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "in-place" or act != "int8" or device != "cpu":
        return False
    nbytes = sum(v[0].rows8_nbytes for layer in weights[LAYERS_KEY] for ex in layer.get(EXPERTS_KEY, ())
                 for v in ex.values() if isinstance(v, tuple))
    if nbytes == 0:
        return False
    avail = available_bytes()
    if mode == "copy":
        # Asked for, so done even when tight; but copies past the memory there
        # is would end in the kernel's out-of-memory kill, not an error.
        if avail is not None and nbytes > avail:
            raise IEError(f"experts copy: the experts' copies take {gib(nbytes)}, more than the {gib(avail)} "
                          "of memory available (in-place reads them from the mapped file)")
        return True
    return avail is not None and 3 * nbytes <= 2 * avail


def grow_copies(weights: dict[str, Any], act: str, device: str) -> bool:
    """Whether the dense matrices whose rows8 copies are larger than their
    stored bytes (the codebook types': 4.25 bits a weight, iq2_xxs's twice
    its 2.06) get them: decode then reads them with the tile kernels (about
    twice as fast as their stored layout's gathers, docs/benchmarks.md), at
    the price of that memory. Yes where every dense matrix's copy together
    takes at most two thirds of the memory available now (and where the
    memory available is unknown, as before); else those matrices keep their
    stored bytes, so a model picked for its size runs at that size. Every
    other matrix's copy is its stored size and is always made."""
    if act != "int8" or device != "cpu":
        return True
    dense = [v[0] for layer in weights[LAYERS_KEY] for k, v in layer.items() if k != EXPERTS_KEY and _matrix(v)]
    dense += [weights["lm_head"][0]] if _matrix(weights.get("lm_head")) else []  # (a tied embedding's copy is the head's)
    if all(s.rows8_nbytes <= s.nbytes for s in dense):
        return True
    avail = available_bytes()
    return avail is None or 3 * sum(s.rows8_nbytes for s in dense) <= 2 * avail


def _matrix(v: Any) -> bool:
    """Whether a weights entry is a matrix (a WeightSpec first) rather than a vector or a list."""
    return isinstance(v, tuple) and hasattr(v[0], "rows8_nbytes")


def option(f):
    """--experts, for every command that runs the decoder on a user's model
    (generate, logits, eval, verify model, bench); the parameter is experts."""
    return click.option("--experts", type=click.Choice(MODES), default="auto", show_default=True,
                        help="A mixture of experts' matrices: copy them into the fast kernels' layout at load "
                             "(the whole model resident; MoE decode 1.7x on AVX2), or read them in place from "
                             "the mapped file (only the experts a prompt routes to are paged in, and a model "
                             "larger than memory runs); auto copies when the copies fit in two thirds of the "
                             "memory available. Only int8 activations on the CPU copy.")(f)
