"""``q4_manifest.json``: which tensors to quantize, and how.

Precedence: an exact name in ``tensors`` wins over ``rules`` (fnmatch globs,
first match wins), which win over ``default``. The schema is
schemas/q4_manifest.schema.json; the semantic checks against a concrete
checkpoint (2-D, divisible rows, rules that match nothing, embeddings and
norms) are in ``plan``.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dtypes import DTYPES
from .errors import FormatError
from .jsonio import load_json, schema_check
from .model_spec import ARCHS, EXPERT_STACKS, MOE_NAMES
from .quant import SCHEMES, QuantParams

VERSION = 1
KEEP = "keep"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "q4_manifest.schema.json"

# Tensors that lose the most from 4-bit storage; selecting them needs --force.
# MoE routers too (gpt-oss's mlp.router, Mixtral's block_sparse_moe.gate,
# Qwen3-MoE's mlp.gate): a small matrix whose error changes which experts
# run (llama.cpp keeps ffn_gate_inp unquantized as well); and Qwen2-MoE's
# shared_expert_gate, one row scaling a whole MLP's output (llama.cpp's F32
# ffn_gate_inp_shexp, which ggml counts as a vector and never quantizes).
# And latent attention's kv_b_proj (DeepSeek): every key and value is
# decompressed through it, and llama.cpp's attn_k_b holds it transposed per
# head, which a block type's rows cannot be (an export needs it float).
_SENSITIVE = re.compile(r"(embed|wte|wpe|norm|(^|\.)ln_|layernorm|\.router\.|moe\.gate\.|mlp\.gate\.|"
                        r"shared_expert_gate\.|kv_b_proj\.)", re.IGNORECASE)
# Every MoE layout's router and shared-expert gate by its name in a layer (model_spec.MOE_NAMES: LFM2-MoE's
# feed_forward.gate and Nemotron-H's mixer.gate, which the patterns above do not name, besides theirs)
_ROUTERS = tuple(sorted({"." + n for names in MOE_NAMES.values() for k, n in names.items()
                         if k in ("router", "shared_router")}))


def is_sensitive(name: str) -> bool:
    return bool(_SENSITIVE.search(name)) or name.endswith(_ROUTERS)


@dataclass
class Manifest:
    path: str
    rules: list[tuple[str, QuantParams | None]]
    tensors: dict[str, QuantParams | None]
    default: QuantParams | None
    imatrix: Path | None = None  # "imatrix", resolved against the manifest's directory

    def resolve(self, name: str) -> tuple[QuantParams | None, str]:
        """The selection for ``name`` and where it came from."""
        if name in self.tensors:
            return self.tensors[name], f"tensors[{name!r}]"
        for i, (pattern, sel) in enumerate(self.rules):
            if fnmatch.fnmatchcase(name, pattern):
                return sel, f"rules[{i}]"
        return self.default, "default"


def selection_params(obj: dict[str, Any]) -> QuantParams | None:
    scheme = obj["scheme"]
    if scheme == KEEP:
        return None
    if scheme == "int4w":
        g = obj.get("group_size", 64)
        return QuantParams("int4w", None if g == "row" else g, obj.get("symmetric", True),
                           obj.get("scale_dtype", "f16"))
    return QuantParams(scheme)


INT4W_KEYS = ("group_size", "symmetric", "scale_dtype")


def _check_int4w_only_keys(obj: Any, path: Path) -> None:
    """A precise message for the commonest mistake (the schema would only say
    'not allowed'): int4w parameters on another scheme."""
    if not isinstance(obj, dict):
        return
    rules, tensors = obj.get("rules"), obj.get("tensors")
    sels = [(f"rules[{i}]", r) for i, r in enumerate(rules)] if isinstance(rules, list) else []
    sels += [(f"tensors.{k}", v) for k, v in tensors.items()] if isinstance(tensors, dict) else []
    sels.append(("default", obj.get("default")))
    for where, sel in sels:
        if isinstance(sel, dict) and sel.get("scheme") != "int4w":
            for key in INT4W_KEYS:
                if key in sel:
                    raise FormatError(path, f"{where}.{key}", f"only scheme int4w takes {key!r} (scheme is {sel.get('scheme')!r})")


def load_manifest(path: str | os.PathLike) -> Manifest:
    path = Path(path)
    return manifest_from(load_json(path), path)


def manifest_from(obj: Any, path: Path) -> Manifest:
    """A manifest object (as read from ``path``, or about to be written there), checked."""
    _check_int4w_only_keys(obj, path)
    schema_check(obj, SCHEMA_PATH, path)
    rules = [(r["match"], selection_params(r)) for r in obj.get("rules", [])]
    tensors = {k: selection_params(v) for k, v in obj.get("tensors", {}).items()}
    imatrix = path.parent / obj["imatrix"] if "imatrix" in obj else None
    return Manifest(os.fspath(path), rules, tensors, selection_params(obj.get("default", {"scheme": KEEP})), imatrix)


@dataclass
class Plan:
    quantize: dict[str, QuantParams] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def plan(m: Manifest, tensors: dict[str, tuple[str, list[int]]], force: bool = False) -> Plan:
    """Apply the manifest to a checkpoint's {name: (dtype, shape)}.

    Errors (raised): a selected tensor that is not a float matrix, or whose
    rows the scheme cannot split. Warnings: rules or names that select
    nothing, and embeddings/norms selected by a rule or the default without
    ``force`` (kept as they are). An exact ``tensors`` entry is deliberate:
    it needs no ``force`` (the usual policy names a tied embedding/head so).
    """
    out = Plan()
    used_rules: set[str] = set()
    for name in tensors:
        sel, src = m.resolve(name)
        if src.startswith("rules["):
            used_rules.add(src)
        if sel is None:
            continue
        dtype, shape = tensors[name]
        where = src
        if not DTYPES[dtype].is_float:
            raise FormatError(m.path, where, f"selects {name!r} of dtype {dtype}; only float tensors can be quantized")
        why = SCHEMES[sel.scheme].check(shape, sel)
        if why:
            raise FormatError(m.path, where, f"selects {name!r}: {why}")
        if is_sensitive(name) and not force and not src.startswith("tensors["):
            out.warnings.append(f"{m.path}: {where}: selects {name!r}, an embedding/norm; kept unquantized (pass --force, "
                                "or name it in \"tensors\", to quantize it)")
            continue
        out.quantize[name] = sel
    for i, (pattern, _sel) in enumerate(m.rules):
        if f"rules[{i}]" not in used_rules:
            out.warnings.append(f"{m.path}: rules[{i}]: {pattern!r} matches no tensor")
    for name in m.tensors:
        if name not in tensors:
            out.warnings.append(f"{m.path}: tensors[{name!r}]: no such tensor in the checkpoint")
    return out


def _is_stack(name: str) -> bool:
    """An expert stack [experts, ...] (or gpt-oss's bias stacks [experts, n]): under an ``experts`` module, or
    one of model_spec's EXPERT_STACKS (Granite's block_sparse_moe.input_linear)."""
    return ".experts." in name or name.endswith(EXPERT_STACKS)


def _is_matrix(name: str, shape: list[int]) -> bool:
    """A projection the usual policy quantizes: a 2-D ``*.weight``, or a 3-D
    expert stack [experts, out, in] (gpt-oss's ``mlp.experts.gate_up_proj``;
    int4w, which cannot stack, gives it STACK_FALLBACK's block scheme)."""
    return (len(shape) == 2 and name.endswith("weight")) or (len(shape) == 3 and _is_stack(name))


def layer_pattern(name: str) -> str:
    """model.layers.3.mlp.up_proj.weight -> model.layers.*.mlp.up_proj.weight"""
    return re.sub(r"\.\d+\.", ".*.", name)


HEAD_NAMES = ("lm_head.weight", "output.weight")
# (model.embeddings.weight: Nemotron-H's, model_spec.NEMOTRON_NAMES)
EMBED_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight", "embed_tokens.weight", "model.embeddings.weight")


def is_tied(tensors: dict[str, Any], config: dict[str, Any]) -> bool:
    """The embedding is the output head: no head tensor, or the config says so."""
    return not any(n in tensors for n in HEAD_NAMES) or config.get("tie_word_embeddings") is True


def _fitting(scheme: str, sel: dict[str, Any], shape: list[int]) -> dict[str, Any] | None:
    """``sel``, or int4w's whole-row variant (for a stack its STACK_FALLBACK),
    or the scheme's FALLBACK (quant.py, on each scheme), if it can store
    ``shape``; else None."""
    if SCHEMES[scheme].check(shape, selection_params(sel)) is None:
        return sel
    if scheme == "int4w" and len(shape) == 3:
        stack = SCHEMES["int4w"].STACK_FALLBACK[sel["symmetric"]]
        return _fitting(stack["scheme"], stack, shape)
    if scheme == "int4w":
        row = {**sel, "group_size": "row"}
        if SCHEMES[scheme].check(shape, selection_params(row)) is None:
            return row
    fallback = SCHEMES[scheme].FALLBACK
    return None if fallback is None else _fitting(fallback["scheme"], fallback, shape)


def default_manifest(tensors: dict[str, tuple[str, list[int]]], scheme: str = "int4w", group_size: int | str = 64,
                     symmetric: bool = True, scale_dtype: str = "f16", *, head: str = KEEP, embedding: str = KEEP,
                     tied: bool = False, imatrix: str | None = None) -> dict[str, Any]:
    """The usual policy: every 2-D float ``*.weight`` projection matrix and
    expert stack is quantized (attention, MLP, experts) with ``scheme``; norms and biases are kept.
    The output head gets ``head`` and the input embedding ``embedding`` (each
    ``keep`` or a scheme, int4w taking the same parameters), as exact
    ``tensors`` entries; with ``tied`` the embedding *is* the head (read in
    full every token as the output projection) and gets ``head``. One rule
    per layer pattern; matrices whose rows the group size does not divide get
    a per-tensor whole-row entry (q4_k, q5_k, q6_k, iq4_xs: their FALLBACK), or are kept when even
    that is impossible. ``imatrix`` is recorded as the manifest's importance
    matrix."""
    def selection(s: str) -> dict[str, Any]:
        sel: dict[str, Any] = {"scheme": s}
        if s == "int4w":
            sel.update(group_size=group_size, symmetric=symmetric, scale_dtype=scale_dtype)
        return sel

    main = selection(scheme)
    rules: list[dict[str, Any]] = []
    exact: dict[str, Any] = {}
    patterns: dict[str, list[str]] = {}
    for name, (dtype, shape) in tensors.items():
        if not DTYPES[dtype].is_float or not _is_matrix(name, shape):
            continue
        if name in HEAD_NAMES:
            special = head
        elif name in EMBED_NAMES:
            special = head if tied else embedding
        else:
            special = None
        if special is not None:
            if special != KEEP and (sel := _fitting(special, selection(special), shape)) is not None:
                exact[name] = sel
            continue
        if not is_sensitive(name):
            patterns.setdefault(layer_pattern(name), []).append(name)
    for pattern, names in sorted(patterns.items()):
        fits = {n: _fitting(scheme, main, tensors[n][1]) for n in names}
        if all(v == main for v in fits.values()):
            rules.append({"match": pattern, **main})
            continue
        exact.update({n: v for n, v in fits.items() if v is not None})
    out = {"version": VERSION, "rules": rules, "tensors": dict(sorted(exact.items())), "default": {"scheme": KEEP}}
    if imatrix is not None:
        out["imatrix"] = imatrix
    return out


_LAYER = re.compile(r"model\.layers\.(\d+)\.")
# one tensor per expert: model.layers.N.<...>.experts.E.<matrix>
_PER_EXPERT = re.compile(r"(.*\.experts\.)(\d+)(\..*)")


def step_reads(config: Any) -> tuple[int | None, int | None, tuple[str, ...]]:
    """What bytes_per_token needs of a config beyond the tensors: a mixture
    of experts' top_k (num_experts_per_tok; ERNIE's moe_k), the layer count
    (the MTP layers after it are not read), the prefixes the decoder leaves
    unread beside the model (model_spec's Arch.unread)."""
    cfg = config if isinstance(config, dict) else {}
    top_k, n_layers = cfg.get("num_experts_per_tok", cfg.get("moe_k")), cfg.get("num_hidden_layers")
    archs = cfg.get("architectures")
    arch = ARCHS.get(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    return (*(v if type(v) is int and v > 0 else None for v in (top_k, n_layers)),
            arch.unread if arch is not None else ())


def bytes_per_token(tensors: dict[str, tuple[str, list[int]]], quantize: dict[str, QuantParams], tied: bool,
                    top_k: int | None = None, n_layers: int | None = None, unread: tuple[str, ...] = ()) -> int:
    """The weight bytes one decode step reads under a plan (the decoder's
    ``weight_bytes_per_token``): every tensor, but of the input embedding one
    row, plus all of it when it is tied (then it is the head, and a stored
    lm_head is not read); of a mixture of experts (``top_k``: its
    num_experts_per_tok) the share top_k / experts of each expert's tensors,
    a stack's [experts, ...] or a layer's one per expert (on average: which
    ones, routing decides); none of the layers from ``n_layers`` on (the
    multi-token prediction layers, which the decoder leaves unread), nor of
    the tensors under ``unread`` (step_reads gives all three)."""
    experts: dict[tuple[str, str], int] = {}  # (prefix, suffix) of a per-expert name -> the layer's expert count
    for name in tensors:
        if (m := _PER_EXPERT.fullmatch(name)) is not None:
            experts[m.group(1), m.group(3)] = experts.get((m.group(1), m.group(3)), 0) + 1
    total = 0.0
    for name, (dtype, shape) in tensors.items():
        if tied and name in HEAD_NAMES:
            continue
        if name.startswith(unread) or n_layers is not None and (layer := _LAYER.match(name)) and \
                int(layer.group(1)) >= n_layers:
            continue
        p = quantize.get(name)
        n = SCHEMES[p.scheme].tensor_nbytes(shape, p) if p else math.prod(shape) * DTYPES[dtype].itemsize
        if name in EMBED_NAMES and len(shape) == 2:
            total += n // shape[0] + (n if tied else 0)
            continue
        m = _PER_EXPERT.fullmatch(name)
        # (a stack: [experts, rows, cols], or gpt-oss's biases [experts, n]; not a convolution's taps [channels, 1,
        # taps], Qwen3.5's conv1d)
        count = experts[m.group(1), m.group(3)] if m else shape[0] if _is_stack(name) else 0
        total += n * min(1.0, top_k / count) if top_k and count else n
    return round(total)
