"""Collecting an importance matrix: the decoder runs calibration chunks and
sums x² of every matrix input per column (csrc/decoder: collect_stats); the
means per matrix go into a formats/imatrix.py file.

Which input feeds which matrices is the Llama family's: the attention norm's
output feeds q/k/v, the attention output o, the MLP norm's output gate/up,
SiLU(gate) * up down, and the final norm's output the head (``lm_head``, or
the tied embedding it shares).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from iekit.formats.errors import IEError
from iekit.formats.imatrix import Imatrix

from .decoder import Decoder

# Per layer, the matrices each of the decoder's four statistics slots feeds.
LAYER_INPUTS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
                ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


def collect(dec: Decoder, chunks: list[list[int]], source: dict,
            on_chunk: Callable[[int], None] | None = None) -> Imatrix:
    """Run every chunk as a fresh sequence and return the mean x² per input column."""
    if not chunks or not any(chunks):
        raise IEError("imatrix: no calibration tokens")
    dec._dec.collect_stats(True)
    try:
        for i, c in enumerate(chunks):
            dec.logits(c, start=len(c) - 1)
            if on_chunk:
                on_chunk(i)
        sums, tokens = dec._dec.stats()
    finally:
        dec._dec.collect_stats(False)
    entries: dict[str, np.ndarray] = {}
    for layer in range(dec.spec.n_layers):
        for k, names in enumerate(LAYER_INPUTS):
            mean = (np.asarray(sums[4 * layer + k]) / tokens).astype(np.float32)
            for n in names:
                entries[f"model.layers.{layer}.{n}.weight"] = mean
    entries[dec.head_name] = (np.asarray(sums[-1]) / tokens).astype(np.float32)
    meta = {"tokens": int(tokens), "chunks": len(chunks), "ctx": max(len(c) for c in chunks), "source": source}
    return Imatrix(entries, meta)
