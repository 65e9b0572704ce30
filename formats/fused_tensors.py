"""Fused matrices (Phi-3's, GLM-4's, Qwen3-Next's, Granite 4's), read as the separate ones they hold.

``Phi3ForCausalLM`` stores each layer's attention input projection as one
``self_attn.qkv_proj`` (q rows, then k, then v: models/phi3's
``qkv[..., :q_pos]`` slices) and its MLP's as one ``mlp.gate_up_proj``
(gate rows, then up: ``chunk(2)``); ``Glm4ForCausalLM`` the latter alone
(``FUSED_BY_ARCH``). ``Qwen3NextForCausalLM`` stores its gated DeltaNet's
q, k, v and z projections as one ``linear_attn.in_proj_qkvz`` and its b and
a as one ``in_proj_ba``, both blocked by key head (models/qwen3_next's
``fix_query_key_value_ordering``: per key head its q rows, k rows, the
value heads' v rows, their z rows; its value heads' b rows, their a rows),
where Qwen3.5 keeps ``in_proj_qkv`` (every q row, then every k, then every
v), ``in_proj_z``, ``in_proj_b`` and ``in_proj_a``.
``GraniteMoeHybridForCausalLM`` (and ``GraniteMoeSharedForCausalLM``, ``GraniteMoeSWAForCausalLM``)
stores its shared MLP's gate and up rows as one ``shared_mlp.input_linear``
(``chunk(2)``), read as ``shared_mlp.gate_proj`` and ``shared_mlp.up_proj``.
Every tool here reads a
checkpoint through ``collect_tensors``, which lists those as the matrices
they hold (Llama's ``q_proj`` ... ``up_proj``; Qwen3.5's four): views of the
stored tensor's whole rows, read in place (``row_runs``: the file's byte
ranges one after another, so nothing is copied or reshaped). So the
artifact, the decoder, the imatrix, the quant policies and gptq see one
layout whatever the source, as llama.cpp's import of the same file does
(convert/gguf_names.py: phi3, qwen3next), and gguf-to-hf and rotate fuse
them again (``joined``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterable, Iterator

import numpy as np

from .errors import IEError
from .hf_fp8 import Fp8Matrix

PHI3 = "Phi3ForCausalLM"
GLM4 = "Glm4ForCausalLM"
QWEN3_NEXT = "Qwen3NextForCausalLM"
GRANITE_HYBRID = "GraniteMoeHybridForCausalLM"
QKVZ, BA = "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight"
SHARED_MLP = "shared_mlp.input_linear.weight"
# fused suffix -> (the parts' suffixes)
FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
         QKVZ: ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight"),
         BA: ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
         SHARED_MLP: ("shared_mlp.gate_proj.weight", "shared_mlp.up_proj.weight")}
# architecture -> the fused tensors its checkpoints hold (GLM-4: gate_up_proj, with q, k, v apart)
FUSED_BY_ARCH = {PHI3: ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"), GLM4: ("mlp.gate_up_proj.weight",),
                 QWEN3_NEXT: (QKVZ, BA), GRANITE_HYBRID: (SHARED_MLP,),
                 "GraniteMoeSharedForCausalLM": (SHARED_MLP,), "GraniteMoeSWAForCausalLM": (SHARED_MLP,)}
# Qwen3NextConfig's defaults of the dimensions that block its fused DeltaNet projections
_LINEAR_DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                    "linear_value_head_dim": 128}


def fused_of(config: Any) -> dict[str, tuple[str, ...]]:
    """The FUSED entries the config's architecture holds (none for most)."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    held = next((FUSED_BY_ARCH[a] for a in archs if a in FUSED_BY_ARCH), ()) if isinstance(archs, list) else ()
    return {k: FUSED[k] for k in held}


def row_runs(config: dict[str, Any], suffix: str, rows: int, label: str) -> list[tuple[int, int, int]]:
    """The fused tensor ``suffix`` (a FUSED key) of ``rows`` rows as runs of
    its parts' rows, in its own row order: (part, first row in the part,
    rows), from the config's dimensions (a Hugging Face config, or the one the
    GGUF import builds): q, k, v from the heads and head_dim, gate and up
    intermediate_size each, one run per part; Qwen3-Next's per key head.
    IEError naming ``label`` where they do not add up to ``rows``."""
    def dim(key: str, default: Any = None) -> int:
        v = config.get(key, default)
        if type(v) is not int or v < 1:
            raise IEError(f"{label}: config.{key}: expected a positive integer to split it, got {v!r}")
        return v

    if suffix in (QKVZ, BA):
        kh, vh, kd, vd = (dim(k, _LINEAR_DEFAULTS[k]) for k in _LINEAR_DEFAULTS)
        if vh % kh:
            raise IEError(f"{label}: config.linear_num_value_heads: {vh} is not a multiple of "
                          f"linear_num_key_heads ({kh})")
        r = vh // kh
        if suffix == BA:  # per key head: its value heads' b rows, then their a rows
            runs = [run for h in range(kh) for run in ((0, h * r, r), (1, h * r, r))]
        else:  # per key head: q, k (each kd rows), then its value heads' v and z rows (r vd each)
            runs = [run for h in range(kh) for run in ((0, h * kd, kd), (0, kh * kd + h * kd, kd),
                                                       (0, 2 * kh * kd + h * r * vd, r * vd), (1, h * r * vd, r * vd))]
        names = ("key and value heads' rows",)
    else:
        if suffix == SHARED_MLP:  # (GraniteMoeHybridConfig's default width)
            sizes = [dim("shared_intermediate_size", 1024)] * 2
        elif suffix.startswith("mlp."):
            sizes = [dim("intermediate_size")] * 2
        else:
            heads = dim("num_attention_heads")
            hd = dim("head_dim") if config.get("head_dim") is not None else dim("hidden_size") // heads
            sizes = [heads * hd] + [dim("num_key_value_heads", heads) * hd] * 2
        runs = [(k, 0, n) for k, n in enumerate(sizes)]
        names = tuple(f"{n} ({p.split('.')[-2]})" for n, p in zip(sizes, FUSED[suffix]))
    total = sum(n for _k, _r, n in runs)
    if total != rows:
        raise IEError(f"{label}: {rows} rows; the config's dimensions split it into "
                      f"{' + '.join(names) if len(names) > 1 else f'{total} {names[0]}'}")
    return runs


def part_sizes(runs: list[tuple[int, int, int]]) -> list[int]:
    """Each part's rows, of ``row_runs``' runs."""
    sizes = [0] * (max(k for k, _r, _n in runs) + 1)
    for k, _r, n in runs:
        sizes[k] += n
    return sizes


def part_index(runs: list[tuple[int, int, int]], part: int) -> np.ndarray:
    """The fused tensor's rows that make part ``part``, in the part's row order."""
    out = np.empty(part_sizes(runs)[part], np.int64)
    at = 0
    for k, r0, n in runs:
        if k == part:
            out[r0:r0 + n] = np.arange(at, at + n)
        at += n
    return out


def split(config: Any, tensors: dict[str, tuple[Any, Any]], label: str) -> dict[str, tuple[Any, Any]]:
    """``tensors`` (name -> (file, SafetensorsTensor)) with each fused
    matrix of a Phi-3, GLM-4 or Qwen3-Next checkpoint replaced by its parts
    (views of whole rows of the same file: a byte range, or ranges read one
    after another); unchanged for every other architecture."""
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
        runs = row_runs(config, suffix, t.shape[0], f"{label}: {name}")
        at = [0]
        for _k, _r, n in runs:
            at.append(at[-1] + n)
        for k, (part, rows) in enumerate(zip(FUSED[suffix], part_sizes(runs))):
            pname = name[:-len(suffix)] + part
            if pname in tensors:
                raise IEError(f"{label}: {pname} is stored beside {name}, which holds it")
            pieces = sorted((r0, t.start + at[i] * row_bytes, n * row_bytes)
                            for i, (kk, r0, n) in enumerate(runs) if kk == k)
            view = dataclasses.replace(t, name=name, shape=(rows, t.shape[1]), start=pieces[0][1],
                                       nbytes=rows * row_bytes)
            if isinstance(sf, Fp8Matrix):  # (its own rows of the codes, each with its block's scale)
                out[pname] = (dataclasses.replace(sf, tensor=view, rows=tuple(part_index(runs, k).tolist())), view)
                continue
            if len(pieces) > 1:
                view = dataclasses.replace(view, runs=tuple((s0, nb) for _r0, s0, nb in pieces))
            out[pname] = (sf, view)
    return out


def joined(config: Any, tensors: list[tuple[str, str, list[int]]],
           label: str) -> list[tuple[str, str, list[int], list[str], list[tuple[int, int, int]]]]:
    """The inverse of ``split``, for a writer of Hugging Face checkpoints:
    of ``tensors`` (name, dtype, shape) in the order given, each tensor to
    write (name, dtype, shape) with the names whose rows it holds and their
    ``row_runs`` (a Phi-3's or Qwen3-Next's parts join where the first of
    them comes; every other tensor stands alone, one run); ``in_order``
    makes its bytes. Parts of two dtypes cannot be one tensor: IEError
    naming ``label``."""
    by_name = {n: (d, s) for n, d, s in tensors}
    out = []
    for name, parts in _layout(config, [n for n, _d, _s in tensors]):
        dtypes = {by_name[p][0] for p in parts}
        if len(dtypes) > 1:
            raise IEError(f"{label}: {name} joins rows written as {' and '.join(sorted(dtypes))}; write them "
                          "alike (--dtype)")
        shape = by_name[parts[0]][1]
        if len(parts) == 1:  # (as it is: xIELU's beta has no dimension)
            out.append((name, dtypes.pop(), shape, parts, [(0, 0, shape[0] if shape else 1)]))
            continue
        rows = sum(by_name[p][1][0] for p in parts)
        suffix = next((f for f in FUSED if name.endswith("." + f)), None)
        runs = row_runs(config, suffix, rows, f"{label}: {name}") if suffix else [(0, 0, rows)]
        out.append((name, dtypes.pop(), [rows, *shape[1:]], parts, runs))
    return out


def in_order(parts: list[Iterable[bytes]], runs: list[tuple[int, int, int]], row_bytes: int) -> Iterator[bytes]:
    """The bytes of a tensor ``joined`` made of ``parts`` (each part's bytes, in its row order): streamed where
    the parts follow one another whole, else each part read whole (a layer's projection) and its runs cut out."""
    if all(r0 == 0 and k == i for i, (k, r0, _n) in enumerate(runs)):
        return itertools.chain.from_iterable(parts)
    whole = [b"".join(p) for p in parts]
    return (whole[k][r0 * row_bytes:(r0 + n) * row_bytes] for k, r0, n in runs)


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
