"""Collecting an importance matrix: the decoder runs calibration chunks and
sums x² of every matrix input per column (csrc/decoder: collect_stats); the
means per matrix go into a formats/imatrix.py file.

Which input feeds which matrices is the Llama family's: the attention norm's
output feeds q/k/v, the attention output o, the MLP norm's output gate/up,
SiLU(gate) * up down, and the final norm's output the head (``lm_head``, or
the tied embedding it shares). In a layer with experts the MLP norm's output
feeds the router, and each expert's gate/up see only the rows routed to it
and its down only its own GLU outputs: they get means over those rows, per
expert, as llama-imatrix collects them (an expert stack [E, rows, cols] one
entry [E, cols]; per-expert tensors one entry each). A shared expert beside
them (Qwen2-MoE) sees every row, as a dense MLP does. Latent attention
(DeepSeek) reads the attention norm's output in q_a (or q_proj) and kv_a, and
has two inputs of its own per layer: q_a's normed output (q_b) and the
latent's (kv_b), in the decoder's slots after the head's (dense_inputs), where
Falcon-H1's Mamba2 out_proj (beside its attention's o) reads its own too, and
Mamba 1's x_proj and dt_proj theirs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from iekit.formats.errors import IEError
from iekit.formats.imatrix import Imatrix
from iekit.formats.model_spec import MATRIX, layer_parts

from .decoder import Decoder

# The statistics slot of its layer's four (csrc/decoder/decoder.h collect_stats) each matrix outside the experts
# reads, by the key the decoder binds it under (model_spec.layer_parts): the mixer's input projections (attention's,
# latent attention's, gated DeltaNet's, the short convolution's, Mamba2's) the normed input, its output projection
# its output, the dense MLP's or the shared expert's gate and up the MLP norm's output, its down the unit's output.
MIXER_SLOTS = {"q": 0, "k": 0, "v": 0, "q_a": 0, "kv_a": 0, "lin_qkv": 0, "lin_z": 0, "lin_b": 0, "lin_a": 0,
               "conv_in": 0, "ssm_in": 0, "q_gate": 0, "o": 1}
MLP_SLOTS = {"gate": 2, "up": 2, "down": 3}


def slot_rank(s, slot: int) -> tuple[int, float]:
    """Where a statistics slot's input arises in a forward pass, (layer,
    order within it): the attention norm's output 0, latent attention's q_b
    and kv_b inputs 0.5 and 0.75 (made from it), the attention output 1, the
    MLP's 2 and 3; the head's after every layer."""
    n = s.n_layers
    if slot < 4 * n:
        return slot // 4, float(slot % 4)
    if slot == 4 * n:
        return n, 0.0
    layer, k = divmod(slot - 4 * n - 1, 2)
    return layer, 0.5 + 0.25 * k


def dense_inputs(s, layer: int) -> dict[str, int]:
    """Layer ``layer``'s matrices outside any expert (names inside the layer, as the model spells them) -> the
    statistics slot each reads: its token mixing's (MIXER_SLOTS; latent attention's q_b and kv_b in their own slots
    after the head's; none in a block that is its MLP alone, Nemotron-H's), and its dense MLP's (MLP_SLOTS) where it
    has one and no experts (a shared expert's: shared_inputs)."""
    slots = {k: 4 * layer + v for k, v in MIXER_SLOTS.items()}
    own = 4 * s.n_layers + 1 + 2 * layer
    if s.arch.mla:
        slots.update(kv_b=own + 1, **({"q": own} if s.q_lora else {}))
    if s.ssm_attends:  # (Falcon-H1: its Mamba2's out_proj beside the attention's o)
        slots["ssm_out"] = own
    if s.ssm1:  # (Mamba 1: x_proj reads the convolved x, dt_proj dt's low rank)
        slots.update(ssm_x=own, ssm_dt_w=own + 1)
    if s.moe is None or not s.moe.layers[layer]:
        slots.update({k: 4 * layer + v for k, v in MLP_SLOTS.items()})
    pre = f"model.layers.{layer}."
    return {p.name[len(pre):].removesuffix(".weight"): slots[p.key] for p in layer_parts(s, layer)
            if p.kind == MATRIX and p.key in slots}


def collect(dec: Decoder, chunks: list[list[int]], source: dict,
            on_chunk: Callable[[int], None] | None = None) -> tuple[Imatrix, list[str]]:
    """Run every chunk as a fresh sequence; the mean x² per input column of
    every matrix, and warnings (experts no calibration row was routed to)."""
    if not chunks or not any(chunks):
        raise IEError("imatrix: no calibration tokens")
    dec._dec.collect_stats(True)
    try:
        for i, c in enumerate(chunks):
            dec.logits(c, start=len(c) - 1)
            if on_chunk:
                on_chunk(i)
        sums, tokens = dec._dec.stats()
        per_expert = dec._dec.expert_stats()
    finally:
        dec._dec.collect_stats(False)
    entries: dict[str, np.ndarray] = {}
    routed: dict[str, object] = {}
    unrouted = 0
    for layer in range(dec.spec.n_layers):
        pre = f"model.layers.{layer}."
        means = [np.asarray(sums[4 * layer + k]) / tokens for k in range(4)]
        for n, slot in dense_inputs(dec.spec, layer).items():
            entries[f"{pre}{n}.weight"] = (np.asarray(sums[slot]) / tokens).astype(np.float32)
        if per_expert[layer] is not None:
            unrouted += _expert_entries(entries, routed, pre, dec.spec.moe.names, means[2], *per_expert[layer])
            entries.update({pre + n: means[k].astype(np.float32) for n, k in shared_inputs(dec.spec.moe)})
    entries[dec.head_name] = (np.asarray(sums[4 * dec.spec.n_layers]) / tokens).astype(np.float32)
    meta = {"tokens": int(tokens), "chunks": len(chunks), "ctx": max(len(c) for c in chunks), "source": source}
    warnings = []
    if unrouted:
        n = dec.spec.moe.n_experts * sum(dec.spec.moe.layers)
        warnings.append(f"{unrouted} of {n} experts got no calibration row; they take their layer's means over "
                        "all rows (more calibration text routes to more experts)")
    return Imatrix(entries, meta, routed), warnings


def shared_inputs(moe) -> list[tuple[str, int]]:
    """A layer's shared expert (Qwen2-MoE's, GLM-4.5's), which every token runs: each
    of its matrices (names inside the layer) with the statistics slot its
    input is, as a dense MLP's: the MLP norm's output for gate, up and its
    gate, its own GLU outputs for down. None without one."""
    if not moe.shared_inter:
        return []
    return [(moe.names[key], k) for key, k in (("shared_gate", 2), ("shared_up", 2), ("shared_router", 2),
                                                ("shared_down", 3)) if key in moe.names]


def _expert_entries(entries: dict[str, np.ndarray], routed: dict[str, object], pre: str, names: dict[str, str],
                    mlp_in: np.ndarray, in_sums: np.ndarray, mid_sums: np.ndarray, rows: np.ndarray) -> int:
    """One MoE layer's entries: the router's (every token's MLP input), and
    each expert's means over the rows routed to it (``routed``: how many);
    an expert with none takes the means over all rows (its inputs are the
    layer's, as far as anyone knows). Returns how many had none."""
    entries[pre + names["router"]] = mlp_in.astype(np.float32)
    seen = rows > 0
    per_in = np.where(seen[:, None], in_sums / np.maximum(rows, 1)[:, None], mlp_in[None, :])
    pooled_mid = mid_sums.sum(axis=0) / max(rows.sum(), 1)
    per_mid = np.where(seen[:, None], mid_sums / np.maximum(rows, 1)[:, None], pooled_mid[None, :])
    for key, means in (("gate", per_in), ("up", per_in), ("down", per_mid)):
        pattern = names.get(key)
        if pattern is None:
            continue
        if "{e}" in pattern:
            for e in range(len(rows)):
                entries[pre + pattern.format(e=e)] = means[e].astype(np.float32)
                routed[pre + pattern.format(e=e)] = int(rows[e])
        else:  # a stack [E, rows, cols]: one [E, cols] entry
            entries[pre + pattern] = means.astype(np.float32)
            routed[pre + pattern] = np.asarray(rows, np.int64).copy()
    return int((~seen).sum())
