"""Phi-3's and GLM-4's fused matrices, read as the separate ones they hold.

``Phi3ForCausalLM`` stores each layer's attention input projection as one
``self_attn.qkv_proj`` (q rows, then k, then v: models/phi3's
``qkv[..., :q_pos]`` slices) and its MLP's as one ``mlp.gate_up_proj``
(gate rows, then up: ``chunk(2)``); ``Glm4ForCausalLM`` the latter alone
(``FUSED_BY_ARCH``). Every tool here reads a checkpoint through
``collect_tensors``, which lists those as the Llama-named matrices
``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj``: row
ranges of the stored tensor, read in place (whole rows, so nothing is
copied or reshaped). So the artifact, the decoder, the imatrix, the quant
policies and gptq see one layout whatever the source, as llama.cpp's
import of the same file does (convert/gguf_names.py, phi3), and gguf-to-hf
and rotate fuse them again (``joined``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import IEError

PHI3 = "Phi3ForCausalLM"
GLM4 = "Glm4ForCausalLM"
# fused suffix -> (the parts' suffixes, in row order)
FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
# architecture -> the fused tensors its checkpoints hold (GLM-4: gate_up_proj, with q, k, v apart)
FUSED_BY_ARCH = {PHI3: tuple(FUSED), GLM4: ("mlp.gate_up_proj.weight",)}


def fused_of(config: Any) -> dict[str, tuple[str, ...]]:
    """The FUSED entries the config's architecture holds (none for most)."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    held = next((FUSED_BY_ARCH[a] for a in archs if a in FUSED_BY_ARCH), ()) if isinstance(archs, list) else ()
    return {k: FUSED[k] for k in held}


def part_rows(config: dict[str, Any], suffix: str, rows: int, label: str) -> list[int]:
    """The rows of each part of the fused tensor ``suffix`` (a FUSED key) of
    ``rows`` rows, from the config's dimensions (a Hugging Face config, or
    the one the GGUF import builds): q, k, v from the heads and head_dim,
    gate and up intermediate_size each. IEError naming ``label`` where they
    do not add up to ``rows``."""
    def dim(key: str, default: Any = None) -> int:
        v = config.get(key, default)
        if type(v) is not int or v < 1:
            raise IEError(f"{label}: config.{key}: expected a positive integer to split it, got {v!r}")
        return v

    if suffix.startswith("mlp."):
        parts = [dim("intermediate_size")] * 2
    else:
        heads = dim("num_attention_heads")
        hd = dim("head_dim") if config.get("head_dim") is not None else dim("hidden_size") // heads
        parts = [heads * hd] + [dim("num_key_value_heads", heads) * hd] * 2
    if sum(parts) != rows:
        split = " + ".join(f"{n} ({p.split('.')[-2]})" for n, p in zip(parts, FUSED[suffix]))
        raise IEError(f"{label}: {rows} rows; the config's dimensions split it into {split}")
    return parts


def split(config: Any, tensors: dict[str, tuple[Any, Any]], label: str) -> dict[str, tuple[Any, Any]]:
    """``tensors`` (name -> (file, SafetensorsTensor)) with each fused
    matrix of a Phi-3 checkpoint replaced by its parts (row ranges of the
    same file); unchanged for every other architecture."""
    fused = fused_of(config)
    if not fused:
        return tensors
    out = {}
    for name, (sf, t) in tensors.items():
        suffix = next((s for s in fused if name.endswith("." + s)), None)
        if suffix is None:
            out[name] = (sf, t)
            continue
        if len(t.shape) != 2:
            raise IEError(f"{label}: {name}: expected a matrix, got shape {list(t.shape)}")
        row_bytes = t.nbytes // t.shape[0] if t.shape[0] else 0
        start = t.start
        for part, rows in zip(FUSED[suffix], part_rows(config, suffix, t.shape[0], f"{label}: {name}")):
            pname = name[:-len(suffix)] + part
            if pname in tensors:
                raise IEError(f"{label}: {pname} is stored beside {name}, which holds it")
            out[pname] = (sf, dataclasses.replace(t, name=name, shape=(rows, t.shape[1]), start=start,
                                                  nbytes=rows * row_bytes))
            start += rows * row_bytes
    return out


def joined(config: Any, tensors: list[tuple[str, str, list[int]]],
           label: str) -> list[tuple[str, str, list[int], list[str]]]:
    """The inverse of ``split``, for a writer of Hugging Face checkpoints:
    of ``tensors`` (name, dtype, shape) in the order given, each tensor to
    write (name, dtype, shape) with the names whose rows it holds one
    after another (a Phi-3's parts join where the first of them comes;
    every other tensor stands alone). Parts of two dtypes cannot be one
    tensor: IEError naming ``label``."""
    by_name = {n: (d, s) for n, d, s in tensors}
    out = []
    for name, parts in _layout(config, [n for n, _d, _s in tensors]):
        dtypes = {by_name[p][0] for p in parts}
        if len(dtypes) > 1:
            raise IEError(f"{label}: {name} joins rows written as {' and '.join(sorted(dtypes))}; write them "
                          "alike (--dtype)")
        shape = by_name[parts[0]][1]
        out.append((name, dtypes.pop(), [sum(by_name[p][1][0] for p in parts), *shape[1:]], parts))
    return out


def _layout(config: Any, names: list[str]) -> list[tuple[str, list[str]]]:
    """Each tensor to write, with the names it joins (``joined``)."""
    fused_here = fused_of(config)
    if not fused_here:
        return [(n, [n]) for n in names]
    have = set(names)
    group = {}  # part -> (fused name, its parts in row order)
    for n in names:
        for fused, parts in fused_here.items():
            hit = next((p for p in parts if n.endswith("." + p)), None)
            stem = n[:-len(hit)] if hit else None
            if stem is not None and all(stem + p in have for p in parts):
                group[n] = (stem + fused, [stem + p for p in parts])
    out, done = [], set()
    for n in names:
        if n in done:
            continue
        fused, parts = group.get(n, (n, [n]))
        out.append((fused, parts))
        done.update(parts)
    return out
