"""``ieconv rotate``: the same model with its residual stream rotated, as
an HF checkpoint any of the tools here (and transformers) reads.

Why: quantization error is set by a block's largest values, and a trained
model's residual stream has a few channels far larger than the rest (outlier
features), so every matrix that reads or writes the stream has columns or
rows that spoil their blocks. A random orthogonal Q spreads each channel
over all of them (incoherence processing: QuIP#, QuaRot, SpinQuant's R1)
without changing what the model computes, and costs nothing at run time:
the rotated matrices are just other matrices. It pays under gptq (which
rounds knowing the input covariance: 0.44x the KL at 3.5 bits on SmolLM2)
and costs under an importance matrix with nearest rounding, which leans on
exactly those channels (docs/quality.md, "Rotating the residual stream").
The quality bench also rotates to take SmolLM2's weights off their Q4_1
grid.

The transform (rows are outputs, as HF stores them; x a row vector):
- each RMSNorm's weight g is folded into the matrices that read its output
  (their columns times g) and becomes ones, since RMSNorm(x Q) =
  RMSNorm(x) Q only without a per-channel weight;
- the stream is x Q: the embedding E Q; every matrix that reads it
  (q/k/v, gate/up, a router, the experts' gate/up, the head) W Q; every one
  that writes it (o_proj, down_proj, the experts' down) and such a bias Qᵀ W;
- the head is untied (it is E g Q, the embedding E Q): its extra bytes are
  the price, counted by every bits-per-weight figure here.
Q is Haar-random (QR of a seeded Gaussian matrix, signs fixed), so a seed
names the checkpoint. A tensor without a rule here is refused, never
copied unrotated.

Memory: a matrix that reads the stream is rotated a chunk of rows at a time,
one that writes it whole (each output row needs every input row), so peak
RSS is Q plus the largest writing matrix in f32, never the model.
"""

from __future__ import annotations

import math
import json
import os
import re
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from iekit.formats import fused_tensors, hf_fp8
from iekit.formats.casting import decode_f32, encode_f32
from iekit.formats.dtypes import DTYPES
from iekit.formats.errors import IEError
from iekit.formats.finite import checker
from iekit.formats.hf_checkpoint import HFSource, SINGLE_NAME, collect_tensors, read_aux
from iekit.formats.safetensors_reader import SafetensorsFile, SafetensorsTensor
from iekit.formats.safetensors_writer import SafetensorsWriter

from .artifact_out import CONFIG_FILES, TOKENIZER_FILES, Progress, checkpoint_out, natural_key

# The architectures whose every tensor has a rule below: RMSNorm before each
# block, residual writers o_proj and down_proj (Mixtral: w2), nothing after
# a block but the add (times a scalar: Granite's multipliers commute with
# the rotation; SmolLM3's layers without RoPE and Ministral 3's query
# temperature rotate nothing on the stream; q/k norms, per head or over the
# whole projection (OLMoE), act inside the attention; a shared expert and
# its gate (Qwen2-MoE) read and write the stream as a dense MLP; Phi-3's fused
# matrices are read as their parts and written fused again,
# formats/fused_tensors.py; DeepSeek's latent attention reads the stream in
# q_a (or q_proj) and kv_a, its q_b, kv_b and their norms act on the latents,
# and its shared experts and choice bias are Qwen2-MoE's and GLM-4.5's (as
# ERNIE 4.5's, its bias moe_statics'); HunYuan's q/k norms after RoPE act
# inside the attention too, its router and shared MLP read and write the
# stream as Qwen2-MoE's (Hy3's likewise, its choice bias kept; dots.llm1's: Qwen3's attention, DeepSeek-V3's
# router and shared experts; Solar Open's: Llama's attention, GLM-4.5's router and shared experts; Youtu-LLM's:
# DeepSeek-V3's attention, a dense MLP); DeepSeek-V3's
# and Hy3's MTP layers and ERNIE
# 4.5's model.mtp_* tensors, which read the embedding and the stream side by
# side, are refused, naming the tensor). Gemma's, OLMo 2's, EXAONE 4's and
# GLM-4's norms after blocks, Cohere's LayerNorm (the mean it takes out is no
# rotation's), gpt-oss's sinks and MXFP4 experts, Llama 4's stacks stored
# [experts, in, out] would each need rules of their own. Apertus is Llama's
# layer under its own norm names (NORM_NAMES), its xIELU's parameters acting
# on the MLP's channels, not on the stream.
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "smollm3", "granite", "phi3",
                 "ministral3", "seed_oss", "olmoe", "qwen2_moe", "deepseek_v3", "deepseek_v2", "ernie4_5",
                 "ernie4_5_moe", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "apertus", "dots1",
                 "solar_open", "youtu", "granite_swa")
OUT_DTYPES = ("f32", "bf16", "f16")
ROWS_BYTES = 8 << 20  # source bytes rotated per step: bounded memory, still large BLAS calls

LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT = r"(?:mlp\.experts\.\d+\.|block_sparse_moe\.experts\.\d+\.)"
READS_ATTN = re.compile(r"self_attn\.(?:[qkv]_proj|q_a_proj|kv_a_proj_with_mqa)\.weight")
READS_MLP = re.compile(rf"mlp\.(?:shared_experts?\.|shared_mlp\.)?(?:gate|up)_proj\.weight|mlp\.gate\.weight"
                       rf"|mlp\.gate\.wg\.weight|mlp\.router\.gate\.weight"
                       rf"|block_sparse_moe\.gate\.weight|mlp\.shared_expert_gate\.weight"
                       rf"|{_EXPERT}(?:gate_proj|up_proj|w1|w3)\.weight")
WRITES = re.compile(rf"self_attn\.o_proj\.(?:weight|bias)|mlp\.(?:shared_experts?\.|shared_mlp\.)?down_proj\.(?:weight|bias)"
                    rf"|{_EXPERT}(?:down_proj|w2)\.(?:weight|bias)")
# inside a head or a latent, not on the stream (and the router's choice bias: the router's logits do not change;
# Granite SWA's sinks, a logit per head beside its scores)
KEPT = re.compile(r"self_attn\.[qkv]_proj\.bias|self_attn\.[qk]_norm\.weight|self_attn\.(?:q_b|kv_b)_proj\.weight"
                  r"|self_attn\.(?:q_a|kv_a)_layernorm\.weight|self_attn\.(?:query|key)_layernorm\.weight"
                  r"|mlp\.(?:gate|moe_statics)\.e_score_correction_bias|mlp\.expert_bias"
                  r"|mlp\.act_fn\.(?:alpha_p|alpha_n|beta|eps)|self_attn\.sinks")
# The norms the attention's and the MLP's readers read the stream through: Llama's names, or the model type's own
NORM_NAMES = {"apertus": ("attention_layernorm.weight", "feedforward_layernorm.weight")}
LLAMA_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


@dataclass
class Rule:
    """How output tensor ``name`` is made: ``kind`` "read" ((W * g) Q; g
    the norm ``norm``, or none), "write" (Qᵀ W), "ones", "keep"; from
    tensor ``src``."""

    name: str
    kind: str
    shape: list[int]
    src: str | None = None
    norm: str | None = None


@dataclass
class RotateResult:
    out_dir: Path
    tensors: int
    bytes_in: int
    bytes_out: int
    head_bytes: int  # the untied head's, included in bytes_out
    seconds: float
    removed: list[str]  # a previous checkpoint's files the run removed (--overwrite)


def haar_orthogonal(n: int, seed: int) -> np.ndarray:
    """A Haar-random n x n orthogonal matrix (float64): Q of a seeded
    Gaussian matrix's QR, each column's sign set by R's diagonal (without it
    the distribution is not uniform)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def plan(config: dict, tensors: dict[str, SafetensorsTensor], config_path: Path) -> list[Rule]:
    """A rule for every tensor of the rotated checkpoint, in file order; an
    IEError naming the first tensor or config field no rule covers."""
    mt = config.get("model_type")
    if mt not in ARCHITECTURES:
        raise IEError(f"{config_path}: model_type {mt!r}: rotation is implemented for {', '.join(ARCHITECTURES)}")
    if config.get("quantization_config") is not None:  # its weights, or transformers' loading, are not floats
        raise IEError(f"{config_path}: quantization_config: a quantized checkpoint cannot be rotated; "
                      "rotate the float checkpoint")
    h = config.get("hidden_size")
    if type(h) is not int or h < 1:
        raise IEError(f"{config_path}: hidden_size must be a positive integer, got {h!r}")
    for name, t in tensors.items():
        if not t.dtype.is_float:
            raise IEError(f"{name}: dtype {t.dtype.name}: only float tensors can be rotated")

    def shape(name: str) -> list[int]:
        return list(tensors[name].shape)

    def need(name: str, want: list[int | None], what: str) -> None:
        s = shape(name)
        if len(s) != len(want) or any(w is not None and d != w for d, w in zip(s, want)):
            dims = " x ".join("*" if w is None else str(w) for w in want)
            raise IEError(f"{name}: shape {s}: {what} must be [{dims}] (hidden_size {h})")

    for top in ("model.embed_tokens.weight", "model.norm.weight"):
        if top not in tensors:
            raise IEError(f"{config_path.parent}: no tensor {top!r}")
    need("model.embed_tokens.weight", [None, h], "the embedding")
    need("model.norm.weight", [h], "a norm")
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    if head != "lm_head.weight" and config.get("tie_word_embeddings") is False:
        raise IEError(f"{config_path}: tie_word_embeddings is false but the checkpoint has no 'lm_head.weight'")
    need(head, shape("model.embed_tokens.weight"), "the head")
    norms = NORM_NAMES.get(mt, LLAMA_NORMS)
    readers = tuple(zip((READS_ATTN, READS_MLP), norms))
    rules = [Rule("model.embed_tokens.weight", "read", shape("model.embed_tokens.weight"), "model.embed_tokens.weight"),
             Rule("lm_head.weight", "read", shape(head), head, "model.norm.weight"),
             Rule("model.norm.weight", "ones", [h])]
    for name in tensors:
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            continue
        m = LAYER.fullmatch(name)
        rest = m.group(2) if m else ""
        reads = next((n for pattern, n in readers if pattern.fullmatch(rest)), None)  # through this norm
        if rest in norms:
            need(name, [h], "a norm")
            rules.append(Rule(name, "ones", [h]))
        elif reads is not None:
            norm = f"model.layers.{m.group(1)}.{reads}"
            if norm not in tensors:
                raise IEError(f"{name}: reads the residual stream through {norm!r}, which the checkpoint lacks")
            need(name, [None, h], "a matrix that reads the residual stream")
            rules.append(Rule(name, "read", shape(name), name, norm))
        elif WRITES.fullmatch(rest):
            need(name, [h, None] if rest.endswith("weight") else [h], "a matrix or bias that writes the stream")
            rules.append(Rule(name, "write", shape(name), name))
        elif KEPT.fullmatch(rest):
            rules.append(Rule(name, "keep", shape(name), name))
        else:
            raise IEError(f"{name}: no rotation rule for this tensor ({mt}); nothing is written")
    return sorted(rules, key=lambda r: natural_key(r.name))


def _rows(sf: SafetensorsFile, t: SafetensorsTensor, advance) -> Iterator[np.ndarray]:
    """The tensor as float32 rows [k, cols], ROWS_BYTES of them at a time;
    a NaN or ±inf is refused (rotated, it would spread over a whole row or
    column of every matrix it meets)."""
    cols = t.shape[-1] if t.shape else 1
    row_bytes = max(1, cols * t.dtype.itemsize)
    check = checker({"dtype": t.dtype.name, "shape": list(t.shape)}, sf.path, t.name, hint=False)
    for raw in sf.iter_chunks(t, max(1, ROWS_BYTES // row_bytes) * row_bytes):
        check(raw)
        advance(len(raw))
        yield decode_f32(raw, t.dtype.name).reshape(-1, cols)


def _values(rule: Rule, tensors, norms: dict[str, np.ndarray], q32: np.ndarray, dtype: str,
            advance) -> Iterator[bytes]:
    """Output tensor ``rule.name``'s bytes in ``dtype``, a chunk at a time
    (``norms``: the norm weights by name, read once)."""
    if rule.kind == "ones":
        yield encode_f32(np.ones(rule.shape, np.float32), dtype)
        return
    sf, t = tensors[rule.src]
    if rule.kind == "keep":
        for w in _rows(sf, t, advance):
            yield encode_f32(w, dtype)
    elif rule.kind == "read":
        g = norms.get(rule.norm)
        for w in _rows(sf, t, advance):
            yield encode_f32((w * g if g is not None else w) @ q32, dtype)
    else:  # write: Qᵀ W, a chunk of output rows at a time from the whole of W
        w = np.concatenate(list(_rows(sf, t, advance)), axis=0).reshape(q32.shape[0], -1)
        step = max(1, ROWS_BYTES // max(1, 4 * w.shape[1]))
        for r0 in range(0, w.shape[0], step):
            yield encode_f32(q32[:, r0:r0 + step].T @ w, dtype)


def rotate(src: HFSource, out_dir: str | os.PathLike, *, seed: int = 0, dtype: str = "f32",
           overwrite: bool = False, progress: Progress | None = None) -> RotateResult:
    """Write ``src`` rotated (module docstring) into ``out_dir`` as
    model.safetensors, config.json (tie_word_embeddings false) and the
    source's generation and tokenizer files, staged and renamed together
    (artifact_out.py's rules for the directory, and no other checkpoint's
    shards beside them)."""
    progress = progress or Progress()
    if dtype not in OUT_DTYPES:
        raise IEError(f"--dtype {dtype!r}: expected one of {', '.join(OUT_DTYPES)}")
    aux = {n: d for n in CONFIG_FILES + TOKENIZER_FILES if n != "config.json" and (d := read_aux(src, n)) is not None}
    out = checkpoint_out(out_dir, overwrite, ["config.json", *aux], src.dir)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        tensors = collect_tensors(src, stack)
        base = hf_fp8.float_config(src.config, tensors)  # (FP8 weights are read as floats: a float checkpoint)
        rules = plan(base, {n: t for n, (_sf, t) in tensors.items()}, src.dir / "config.json")
        norms = {n: np.concatenate(list(_rows(*tensors[n], lambda k: None)), axis=None)
                 for n in {r.norm for r in rules if r.norm is not None}}
        h = src.config["hidden_size"]
        q32 = haar_orthogonal(h, seed).astype(np.float32)
        config = {**base, "tie_word_embeddings": False}
        if "torch_dtype" in config:
            config["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dtype]
        meta = {"format": "pt", "iekit.rotation": json.dumps({"kind": "haar", "seed": seed, "hidden_size": h})}
        bytes_in = sum(tensors[r.src][1].nbytes for r in rules if r.src is not None)
        progress.start("rotating", bytes_in)
        by_name = {r.name: r for r in rules}
        layout = fused_tensors.joined(config, [(r.name, dtype, r.shape) for r in rules], str(src.dir))  # (Phi-3)
        with out.writing() as staged:
            writer = SafetensorsWriter(staged.open(SINGLE_NAME), [t[:3] for t in layout], meta)
            for name, _dtype, shape, parts, runs in layout:
                progress.describe(name)
                writer.write(name, fused_tensors.in_order(
                    [_values(by_name[p], tensors, norms, q32, dtype, progress.advance) for p in parts], runs,
                    math.prod(shape[1:]) * DTYPES[dtype].itemsize))
            writer.finish()
            staged.write_bytes("config.json", (json.dumps(config, indent=2) + "\n").encode())
            for n, d in aux.items():
                staged.write_bytes(n, d)
    head = next(r for r in rules if r.name == "lm_head.weight")
    return RotateResult(out.dir, len(layout), bytes_in, (out.dir / SINGLE_NAME).stat().st_size,
                        int(np.prod(head.shape)) * DTYPES[dtype].itemsize, time.perf_counter() - t0, out.stale)

