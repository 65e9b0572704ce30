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
latent's (kv_b), in the decoder's slots after the head's (attention_inputs).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from iekit.formats.errors import IEError
from iekit.formats.imatrix import Imatrix
from iekit.formats.model_spec import LINEAR_MATRICES, LINEAR_OUT, MAMBA, SHORT_CONV, own_name

from .decoder import Decoder

# Per layer, the matrices each of the decoder's four statistics slots feeds (the MLP's under its module's name:
# Arch.mlp_module).
LAYER_INPUTS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
                ("{mlp}.gate_proj", "{mlp}.up_proj"), ("{mlp}.down_proj",))


def attention_inputs(s, layer: int) -> list[tuple[str, int]]:
    """Layer ``layer``'s attention matrices (names inside the layer) with the
    statistics slot each reads (the decoder's numbering: csrc/decoder/decoder.h
    collect_stats; latent attention's q_b and kv_b after the head's slot).
    A gated DeltaNet layer's projections read the attention's slots: its
    input projections the normed input, out_proj the heads' gated outputs."""
    if s.mlp_only and s.mlp_only[layer]:  # (Nemotron-H's MLP and expert blocks)
        return []
    if s.linear and s.linear[layer]:
        return [(f"linear_attn.{m}", 4 * layer) for m in LINEAR_MATRICES.values()] + [(LINEAR_OUT, 4 * layer + 1)]
    if s.short_conv and s.short_conv[layer]:  # (LFM2's: in_proj reads the normed input, out_proj the gated sums)
        return [(SHORT_CONV[key].removesuffix(".weight"), 4 * layer + k) for key, k in (("conv_in", 0), ("o", 1))]
    if s.ssm and s.ssm[layer]:  # (Mamba2's: in_proj reads the normed input, out_proj the gated, normed scan)
        module = "mixer." if s.arch.nemotron else "mamba."
        return [(module + MAMBA[key].removesuffix(".weight").removeprefix("mamba."), 4 * layer + k)
                for key, k in (("ssm_in", 0), ("o", 1))]
    if s.arch.nemotron:  # (its attention under mixer.)
        return [(n.replace("self_attn.", "mixer."), 4 * layer + k) for k, names in enumerate(LAYER_INPUTS[:2])
                for n in names]
    if not s.arch.mla:
        return [(n, 4 * layer + k) for k, names in enumerate(LAYER_INPUTS[:2]) for n in names]
    own = 4 * s.n_layers + 1 + 2 * layer
    q = [("self_attn.q_a_proj", 4 * layer), ("self_attn.q_b_proj", own)] if s.q_lora else [("self_attn.q_proj", 4 * layer)]
    return q + [("self_attn.kv_a_proj_with_mqa", 4 * layer), ("self_attn.kv_b_proj", own + 1),
                ("self_attn.o_proj", 4 * layer + 1)]


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
    """Layer ``layer``'s matrices outside any expert (names inside the layer)
    -> the statistics slot each reads: the attention's (attention_inputs),
    and a dense MLP's where the layer has no experts."""
    out = dict(attention_inputs(s, layer))
    if s.mixer_only and s.mixer_only[layer]:  # (Nemotron-H's Mamba2 and attention blocks)
        return out
    if s.arch.nemotron and (s.moe is None or not s.moe.layers[layer]):  # (its ReLU-squared MLP: up, down)
        return {**out, "mixer.up_proj": 4 * layer + 2, "mixer.down_proj": 4 * layer + 3}
    if s.moe is None or not s.moe.layers[layer]:
        out.update({n.format(mlp=s.arch.mlp_module): 4 * layer + k for k in (2, 3) for n in LAYER_INPUTS[k]})
    return {own_name(s.arch, n): slot for n, slot in out.items()}


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
