"""Gated DeltaNet's tensors as llama.cpp and Hugging Face hold them (Qwen3.5):
the value heads' order, and the decay rate.

The decay: transformers multiplies by -exp(A_log), taken in float32;
llama.cpp's converter stores that product (ssm_a), its exp in float32,
correctly rounded as torch's is. ``decay_rate`` is that function (the
decoder binds it, the exporter writes it); ``a_log_of`` its inverse, which
gguf-to-iebin stores as A_log: of the float32 values whose rate is the
stored one it picks the nearest to the log, so the decoder runs exactly the
file's rates and an export writes back exactly its bytes.

A gated DeltaNet layer with fewer key heads than value heads (Qwen3.5-9B: 16
and 32) serves each key head to several value heads. Hugging Face stores
the value heads grouped by the key head they read ([K0 v0, K0 v1, K1 v0,
K1 v1]: value head h reads key head h // (value heads / key heads));
llama.cpp's converter reorders every value-head axis to the tiled order
([K0 v0, K1 v0, K0 v1, K1 v1]: head h reads key head h % key heads), so
ggml can broadcast the key heads. The decoder runs either order
(DecoderConfig::lin_v_tiled), but one artifact has one: hf-to-iebin writes
the tiled order (expert_stacks.AsWritten, before anything is quantized, so
a quantized out_proj's columns never have to move), recorded as
``config.linear_value_head_order: "tiled"``; gguf-to-iebin keeps llama.cpp's
bytes as they are, under the same key; iebin-to-gguf then copies; gguf-to-hf
turns them back (``untile``). Qwen3-Next's llama.cpp graph reads the grouped
order (``GROUPED_IN_GGUF``): its artifacts and files keep Hugging Face's.

The axes that run over value heads, per tensor under linear_attn.: the rows
of in_proj_qkv's v part and of conv1d's v channels, of in_proj_z, in_proj_b
and in_proj_a; A_log's and dt_bias' elements; out_proj's columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .model_spec import ARCHS, LINEAR_DEFAULTS

ORDER_KEY = "linear_value_head_order"  # config.json: "grouped" (absent: Hugging Face's) or "tiled"
# Architectures whose llama.cpp graph reads Hugging Face's grouped order, each key head repeated in place
# (qwen3next), so that hf-to-iebin keeps it and gguf-to-iebin reads the file's order as grouped
GROUPED_IN_GGUF = ("Qwen3NextForCausalLM",)
_HEADS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def _dims(config: Any) -> tuple[int, int, int, int] | None:
    """(key heads, value heads, key dim, value dim) of a grouped checkpoint whose order differs from llama.cpp's."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    arch = ARCHS.get(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None or not arch.linear_attn or config.get(ORDER_KEY) == "tiled" or archs[0] in GROUPED_IN_GGUF:
        return None
    dims = tuple(config.get(k, LINEAR_DEFAULTS[k]) for k in _HEADS)
    if not all(type(v) is int and v > 0 for v in dims) or dims[1] % dims[0] or dims[0] == dims[1]:
        return None  # (one order where each key head has one value head; a bad config is model_spec's to refuse)
    return dims


def tiled_index(k_heads: int, v_heads: int, dim: int) -> np.ndarray:
    """The grouped position of each tiled one, over v_heads heads of ``dim`` (llama.cpp's _reorder_v_heads)."""
    return np.arange(v_heads * dim).reshape(k_heads, v_heads // k_heads, dim).transpose(1, 0, 2).reshape(-1)


def tiled_axis(name: str, config: Any) -> tuple[int, np.ndarray] | None:
    """(axis, index): tensor ``name`` of a grouped checkpoint of ``config`` in the tiled order is
    ``np.take(t, index, axis)``; None for a tensor (or model) the order leaves as it is."""
    dims = _dims(config)
    if dims is None or ".linear_attn." not in name:
        return None
    k_heads, v_heads, k_dim, v_dim = dims
    qk = np.arange(2 * k_heads * k_dim)
    v = tiled_index(k_heads, v_heads, v_dim)
    suffix = name.rsplit(".linear_attn.", 1)[1]
    return {"in_proj_qkv.weight": (0, np.concatenate([qk, qk.size + v])),
            "conv1d.weight": (0, np.concatenate([qk, qk.size + v])),
            "in_proj_z.weight": (0, v), "in_proj_b.weight": (0, tiled_index(k_heads, v_heads, 1)),
            "in_proj_a.weight": (0, tiled_index(k_heads, v_heads, 1)), "A_log": (0, tiled_index(k_heads, v_heads, 1)),
            "dt_bias": (0, tiled_index(k_heads, v_heads, 1)), "out_proj.weight": (1, v)}.get(suffix)


def tiled_config(config: Any) -> Any:
    """``config`` as the tiled artifact records it (the same object where the order changes nothing)."""
    return config if _dims(config) is None else {**config, ORDER_KEY: "tiled"}


def untile(values: np.ndarray, axis: int, index: np.ndarray) -> np.ndarray:
    """A tiled tensor in Hugging Face's grouped order, (``axis``, ``index``) being tiled_axis's of its name under
    the grouped config: what np.take(grouped, index, axis) made, undone."""
    out = np.empty_like(values)
    idx = [slice(None)] * values.ndim
    idx[axis] = index
    out[tuple(idx)] = values
    return out


def decay_rate(a_log: np.ndarray) -> np.ndarray:
    """-exp(A_log) as float32, correctly rounded (torch's exp of float32, which llama.cpp's converter stores)."""
    return (-np.exp(np.asarray(a_log, np.float32).astype(np.float64))).astype(np.float32)


def a_log_of(rate: np.ndarray) -> np.ndarray:
    """A float32 A_log whose decay_rate is ``rate`` (negative float32s), found among the neighbours of log(-rate)
    (the nearest where no float32 maps onto a rate exactly)."""
    rate = np.asarray(rate, np.float32)
    best = np.log(-rate.astype(np.float64)).astype(np.float32)
    found = decay_rate(best) == rate
    up, down = best.copy(), best.copy()
    for _ in range(4):  # (one step further each way at a time: the nearest that maps onto the rate wins)
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        for cand in (up, down):
            hit = ~found & (decay_rate(cand) == rate)
            best[hit], found = cand[hit], found | hit
    return best
