"""The decoder's weights, bound: every tensor model_spec's layout names
(model_parts, layer_parts) checked against the artifact (present, the shape
the config implies, a dtype the kernels read) and handed to the native
decoder as the nested dict csrc/decoder/bindings.cpp reads:

    {"embed": M, "lm_head": M, "norm": V, "norm_b": V, "lm_head_b": V (the biases, where the model has them),
     "layers": [{"q": M, ..., "attn_norm": V, ...,
                 "experts": [{"gate": M, "down": M, ...}, ...]}, ...]}

M is (WeightSpec, byte view), or (WeightSpec, DedupStore, name) for a dedup
member; V a float32 vector. Binding also counts what one decode step reads
(bytes, parameters, storage dtypes): the figures benchmarks divide by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from iekit.formats import delta_net, weight_types
from iekit.formats.casting import decode_f32
from iekit.formats.errors import IEError
from iekit.formats.model_spec import (EXPERT_MATRIX, EXPERT_VECTOR, EXPERTS_KEY, LAYERS_KEY, MATRIX, NORM_KEYS,
                                      DecoderSpec, Part, layer_parts, model_parts)

from . import kernels
from .native import _native
from .tensor_source import TensorSource

FLOAT_VECTOR_DTYPES = weight_types.names(quantized=False)


@dataclass
class BoundWeights:
    """What ``bind`` returns: the native decoder's weights and what one decode step reads of them."""

    weights: dict[str, Any]
    head_name: str  # the tensor the output head reads (a tied embedding included)
    step_bytes: int = 0  # weight bytes one decode step reads
    active_params: int = 0  # weights one decode step multiplies
    stored: dict[str, int] = field(default_factory=dict)  # bytes per storage dtype of the layer matrices and head
    layer_dtypes: set[str] = field(default_factory=set)  # storage dtypes of the layer matrices


class _Binder:
    """Binds one model's weights (``bind``); its methods are the four kinds of Part."""

    def __init__(self, source: TensorSource, s: DecoderSpec):
        self.source, self.s = source, s
        self.meta_path: Path = source.model.meta_path

    def entry(self, name: str, shape: list[int]) -> dict[str, Any]:
        t = self.source.find(name)
        if t is None:
            raise IEError(f"{self.meta_path}: tensors: {name!r} is missing ({self.s.architecture} needs it)")
        if list(t["shape"]) != shape:
            raise IEError(f"{self.meta_path}: tensors[{name!r}].shape: {t['shape']}, the config implies {shape}")
        return t

    def matrix_value(self, name: str, in_place: bool = False) -> tuple[Any, ...]:
        """The matrix ``name``: a dedup member is multiplied where it lives
        (fused GEMV, or the store's cache), unless ``in_place`` (the
        embedding, whose rows are read one token at a time, is rebuilt
        whole); anything else (an expert slice included) is its bytes in place."""
        t = self.source.entry(name)
        try:
            spec = _native.WeightSpec(**kernels.weight_params(t))
        except ValueError as e:
            raise IEError(f"{self.meta_path}: tensors[{name!r}]: {e}") from None
        member = None if in_place else self.source.member(name)
        return (spec, *member) if member else (spec, self.source.get(name))

    def vector_rows(self, name: str, shape: list[int]) -> tuple[dict[str, Any], np.ndarray]:
        """The float tensor ``name`` (its entry, and its values as float32 of ``shape``)."""
        t = self.entry(name, shape)
        if t["dtype"] not in FLOAT_VECTOR_DTYPES:
            raise IEError(f"{self.meta_path}: tensors[{name!r}].dtype: {t['dtype']!r}; the decoder reads "
                          f"norms and biases as {', '.join(FLOAT_VECTOR_DTYPES)}")
        return t, decode_f32(self.source.get(name).tobytes(), t["dtype"]).reshape(shape)

    def as_multiplied(self, key: str, values: np.ndarray) -> np.ndarray:
        """A vector as the decoder multiplies by it: a norm's weights Gemma's
        ``1 + w``, added in float32 as transformers does; gated DeltaNet's
        and Mamba2's A_log as the rate it decays by, -exp(A_log); the rest as stored."""
        if key in NORM_KEYS and self.s.norm_offset:
            return values + np.float32(self.s.norm_offset)
        if key in ("lin_decay", "ssm_a"):  # gated DeltaNet's and Mamba2's A_log: -exp(A_log) (float32, as transformers)
            return delta_net.decay_rate(values)
        return values

    def count(self, out: BoundWeights, t: dict[str, Any], in_layer: bool) -> None:
        out.stored[t["dtype"]] = out.stored.get(t["dtype"], 0) + t["nbytes"]
        if in_layer:
            out.layer_dtypes.add(t["dtype"])

    def bind_layer(self, out: BoundWeights, i: int) -> dict[str, Any]:
        s, layer = self.s, {}
        experts: list[dict[str, Any]] = [{} for _ in range(s.moe.n_experts)] if s.moe and s.moe.layers[i] else []
        for p in layer_parts(s, i):
            if p.kind == MATRIX:
                t = self.entry(p.name, list(p.shape))
                layer[p.key] = self.matrix_value(p.name)
                out.step_bytes += self.source.read_bytes(p.name)
                out.active_params += p.shape[0] * p.shape[1]
                self.count(out, t, in_layer=True)
            elif p.kind == EXPERT_MATRIX:
                self.bind_expert_matrices(out, p, experts)
            elif not p.required and self.source.find(p.name) is None:
                continue  # a bias the artifact does not store
            elif p.kind == EXPERT_VECTOR:
                t, rows = self.vector_rows(p.name, [len(experts), *p.shape])
                for e, ex in enumerate(experts):
                    ex[p.key] = rows[e]
                out.step_bytes += s.moe.top_k * t["nbytes"] // len(experts)
                out.active_params += s.moe.top_k * p.shape[0]
            else:  # (flat: ERNIE's choice bias is stored as a row [1, experts])
                t, rows = self.vector_rows(p.name, list(p.shape))
                layer[p.key] = self.as_multiplied(p.key, rows.reshape(-1))
                out.step_bytes += t["nbytes"]
                out.active_params += int(np.prod(p.shape))  # (xIELU's beta and eps: no dimension, one value)
        if s.arch.weightless_norms:  # (OLMo's LayerNorms: times ones, x exactly)
            layer["attn_norm"] = layer["mlp_norm"] = np.ones(s.hidden, np.float32)
        if experts:
            layer[EXPERTS_KEY] = experts
        return layer

    def bind_expert_matrices(self, out: BoundWeights, p: Part, experts: list[dict[str, Any]]) -> None:
        """Each expert's matrix: its own tensor, or the slice STACK[e] of the
        stack [experts, rows, cols] (TensorSource: its bytes in place, a dedup
        member of its own, or a view of a stack the store serves whole). A
        decode step reads top_k of them; which, routing decides, so they
        count at their mean size."""
        n, shape = len(experts), list(p.shape)
        if "{e}" in p.name:
            names = [p.name.format(e=e) for e in range(n)]
            for name in names:
                self.entry(name, shape)
        else:
            self.entry(p.name, [n, *shape])
            names = [f"{p.name}[{e}]" for e in range(n)]
        for ex, name in zip(experts, names):
            ex[p.key] = self.matrix_value(name)
            self.count(out, self.source.entry(name), in_layer=True)
        out.step_bytes += self.s.moe.top_k * sum(self.source.read_bytes(m) for m in names) // n
        out.active_params += self.s.moe.top_k * shape[0] * shape[1]


def bind(source: TensorSource, s: DecoderSpec) -> BoundWeights:
    """Every weight of the model in ``source`` the decoder ``s`` runs,
    checked and bound (the module docstring says how); an IEError naming
    model.ie.json and the tensor for anything missing or mis-shaped."""
    b = _Binder(source, s)
    embed_part, head_part, *rest = model_parts(s)
    norm_part = next((p for p in rest if p.key == "norm"), None)  # (none: OLMo's weightless LayerNorm)
    biases = [p for p in rest if p is not norm_part]
    embed = b.entry(embed_part.name, list(embed_part.shape))
    tied = s.tied or source.find(head_part.name) is None
    head = embed if tied else b.entry(head_part.name, list(head_part.shape))
    out = BoundWeights(weights={}, head_name=head["name"])
    w = out.weights
    w["embed"] = b.matrix_value(embed_part.name, in_place=True)
    out.step_bytes += embed["nbytes"] // s.vocab  # one row per token
    w["lm_head"] = w["embed"] if tied else b.matrix_value(head_part.name)
    out.step_bytes += head["nbytes"] if tied else source.read_bytes(head_part.name)
    out.active_params += s.vocab * s.hidden
    b.count(out, head, in_layer=False)
    if norm_part is None:
        w["norm"] = np.ones(s.hidden, np.float32)
    else:
        t, norm = b.vector_rows(norm_part.name, list(norm_part.shape))
        w["norm"] = b.as_multiplied(norm_part.key, norm)
        out.step_bytes += t["nbytes"]
        out.active_params += s.hidden
    for p in biases:  # (the final LayerNorm's bias, StableLM's; the head's, Phi-2's)
        t, w[p.key] = b.vector_rows(p.name, list(p.shape))
        out.step_bytes += t["nbytes"]
    w[LAYERS_KEY] = [b.bind_layer(out, i) for i in range(s.n_layers)]
    return out
