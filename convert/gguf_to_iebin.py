"""GGUF (llama.cpp) -> IEBIN schema2, keeping quantized blocks byte for byte.

The artifact is what ``hf-to-iebin`` makes of the Hugging Face checkpoint the
GGUF file was converted from: tensors under their HF names (llama.cpp's
``blk.N.attn_q.weight`` is ``model.layers.N.self_attn.q_proj.weight``), in
the same order, with llama.cpp's q/k row interleaving for its RoPE undone
(Llama family), a ``config.json`` rebuilt from the metadata and a
``tokenizer.json`` rebuilt from the vocabulary (gguf_tokenizer.py).

Each tensor's bytes, by ggml type:

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
  IQ3_S, IQ4_NL, IQ4_XS, MXFP4, NVFP4
  matrices:
  copied as they are (iekit's types of those names are ggml's layouts); only whole rows move when q/k are
  un-interleaved. Their block scales are checked finite on the way through. An NVFP4 weight's F32 `.scale`
  and `.input_scale` tensors become its quant's tensor_scale and input_scale (_tensor_scales).
- F32, F16, BF16: kept, or cast to ``--dtype`` when given (like hf-to-iebin).
- every other type gguf-py can dequantize (k-quants, i-quants, Q5_x, ...):
  dequantized with ``gguf.quants`` (the reference) to ``--dtype`` (f32 by
  default), and checked finite.

Everything is read through ``formats.gguf_file.open_gguf`` (the strict
reader) and written the way hf-to-iebin writes: streamed a few MiB of rows
at a time, staged under temporary names, renamed at the end; on any error
nothing is left behind. Refusals (an architecture, RoPE variant, tensor,
type or tokenizer kind this cannot carry over faithfully) are one line.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np

from iekit.formats import checksums, delta_net, fused_tensors, iebin, weight_types
from iekit.formats.casting import cast_bytes, decode_f32, encode_f32
from iekit.formats.dtypes import DTYPES
from iekit.formats.errors import FormatError, IEError
from iekit.formats.finite import checker
from iekit.formats.gguf_file import GGUFModel, GGUFTensor, open_gguf
from iekit.formats.hf_config import model_summary
from iekit.formats.library_calls import guarded
from iekit.formats.model_spec import ARCHS as DECODER_ARCHS
from iekit.formats.model_spec import (EXPERT_STACKS, FALCON_H1_MULTIPLIER_LISTS, FALCON_H1_MULTIPLIERS, HF_ACTS,
                                      MAMBA_DEFAULTS, OLMO_EPS, check_convertible, every_nth,
                                      longrope_attention_factor,
                                      rope_tables)
from iekit.formats.q4_manifest import Manifest, plan
from iekit.formats.quant import SCHEMES, QuantError, QuantParams

from .gguf_names import (ARCHS as GGUF_ARCHS_BY_CLASS, CONVERTER_FUSED, GGUF_ARCHS, IMPORTED_AS, CONV_TAPS,
                         DECAY_RATES, FLATTENED, GRANITE_HYBRID_DENSE, HUNYUAN_NTK_BASE, LAYER_KEYS, MLA_KV_B, MROPE_NEOX, NEMOTRON_H_DENSE,
                         NO_DENSE_MLP, NVFP4_SCALES, SIGMOID_GATING, SOFTMAX_GATING, GGUFArch, attention_scalar,
                         beside, hf_layer_name, mtp_extra_hf_name, norm_shift, sliding_by_period)
from .gguf_tokenizer import CONFIG_TOKEN_IDS, end_of_generation, pre_name, tokenizer_config_json, tokenizer_json
from .ollama_layout import Read, as_llamacpp
from .artifact_out import ArtifactOut, ConvertResult, Progress, check_dtype, natural_key
from .hf_to_iebin import load_importance
from .source_hashes import SourceHashes

CHUNK_BYTES = 8 * 1024 * 1024  # source bytes per step
# ggml block types kept byte for byte, and the float types, by GGML name (quant.py's GGUF of each)
COPIED = {g: n for n, g in weight_types.gguf_names(quantized=True).items()}
FLOATS = {g: n for n, g in weight_types.gguf_names(quantized=False).items()}


def _arch_of(g: GGUFModel) -> GGUFArch:
    """The decoder architecture of a GGUF file: llama.cpp's ``llama`` is Mixtral
    when it has experts (as llama.cpp writes Mixtral), Llama otherwise (and so
    is Mistral: llama.cpp runs it as Llama)."""
    key = _field(g, "general.architecture", str)
    if key not in GGUF_ARCHS:
        raise FormatError(g.path, "general.architecture", f"{key!r} is not supported (supported: {', '.join(GGUF_ARCHS)})")
    def has(suffix: str) -> bool:  # (a positive count the file states: which of two models it is)
        v = g.fields.get(f"{key}.{suffix}", 0)
        return type(v) is int and v > 0

    by_class = GGUF_ARCHS_BY_CLASS
    if key == "llama":
        return by_class["MixtralForCausalLM" if has("expert_count") else "LlamaForCausalLM"]
    if key == "deepseek2":  # DeepSeek-V3's router is sigmoid-gated, V2's softmax; GLM-4.7-Flash's file keeps its MTP
        if not has("expert_count"):  # (Youtu-LLM's: no experts, every layer dense)
            return by_class["YoutuForCausalLM"]
        if _deepseek2_gating(g) != SIGMOID_GATING:
            return by_class["DeepseekV2ForCausalLM"]
        return by_class["Glm4MoeLiteForCausalLM" if has("nextn_predict_layers") else "DeepseekV3ForCausalLM"]
    if key == "granitehybrid" and not has("expert_count"):  # Granite 4 without experts: its shared MLP as dense
        return GRANITE_HYBRID_DENSE
    if key == "granite_swa":  # with experts: GraniteMoeSWA
        return by_class["GraniteMoeSWAForCausalLM" if has("expert_count") else "GraniteSWAForCausalLM"]
    if key == "granitemoe":  # with a shared MLP: GraniteMoeShared
        return by_class["GraniteMoeSharedForCausalLM" if has("expert_shared_feed_forward_length")
                        else "GraniteMoeForCausalLM"]
    if key == NEMOTRON_H_DENSE.gguf:  # (with experts: nemotron_h_moe)
        return NEMOTRON_H_DENSE
    if key == "glm4moe" and "glm4moe.feed_forward_length" not in g.fields:  # (Solar Open's: experts in every layer,
        # no dense width, which its converter writes from a config that has one, as GLM-4.5's always do)
        return by_class["SolarOpenForCausalLM"]
    if key == "mamba":  # Falcon Mamba's norms of dt, B and C
        falcon = g.fields.get("mamba.ssm.dt_b_c_rms") is True
        return by_class["FalconMambaForCausalLM" if falcon else "MambaForCausalLM"]
    if key == "olmo2":  # OLMo 3 is llama.cpp's olmo2 with a window
        return by_class["Olmo3ForCausalLM" if has("attention.sliding_window") else "Olmo2ForCausalLM"]
    return next(a for a in (*GGUF_ARCHS_BY_CLASS.values(), *IMPORTED_AS) if a.gguf == key)


def _deepseek2_gating(g: GGUFModel) -> int:
    """A deepseek2 file's expert_gating_func as llama.cpp's loader takes it:
    where the key is missing, sigmoid for GLM-4.7-Flash's shape (47 or 48
    blocks, a vocabulary of 154880), else softmax (DeepSeek-V2's files)."""
    gating = _field(g, "deepseek2.expert_gating_func", int, 0)
    if gating:
        return gating
    embed = next((t for t in g.tensors if t.name == "token_embd.weight"), None)
    vocab = g.fields.get("deepseek2.vocab_size", embed.shape[0] if embed is not None else 0)
    glm_shape = g.fields.get("deepseek2.block_count") in (47, 48) and vocab == 154880
    return SIGMOID_GATING if glm_shape else SOFTMAX_GATING


def row_order(g: GGUFModel, t: GGUFTensor, cfg: dict[str, Any]) -> np.ndarray | None:
    """The source row of each output row of ``t`` (None: rows stay in place),
    undoing llama.cpp's q/k permutation for the architectures it applies to:
    within a head, GGUF rows run (pair, 2), Hugging Face rows (2, pair)."""
    kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
    if kind not in ("attn_q", "attn_k"):  # (a model without attention has no head counts: Mamba-2's)
        return None
    heads = cfg["num_attention_heads"] if kind == "attn_q" else cfg["num_key_value_heads"]
    return _qk_rows(g, t, t.shape[0], heads, cfg)


def _qk_rows(g: GGUFModel, t: GGUFTensor, n: int, heads: int, cfg: dict[str, Any]) -> np.ndarray | None:
    """row_order of ``n`` q or k rows of ``heads`` heads held by ``t`` (also a part of a fused attn_qkv): llama.cpp's
    q/k interleaving undone (permute_qk), or NeoX's order of a file with MRoPE sections (MROPE_NEOX); else None."""
    arch = _arch_of(g)
    if arch.gguf in MROPE_NEOX and f"{arch.gguf}.rope.dimension_sections" in g.fields:
        return _from_neox(g, t, n, heads, cfg)
    return _unpermuted(g, t, n, heads) if arch.permute_qk else None


def _from_neox(g: GGUFModel, t: GGUFTensor, n: int, heads: int, cfg: dict[str, Any]) -> np.ndarray:
    """_qk_rows' source rows for q or k rows (or biases) whose heads' rotated rows the converter wrote in NeoX's
    order (MROPE_NEOX): Hugging Face's rotated row 2i is the file's i, row 2i + 1 the file's rot / 2 + i."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    if n != heads * hd or rot % 2 or not 0 < rot <= hd:
        raise FormatError(g.path, f"tensor {t.name!r} dims", f"{n} rows are not {heads} heads of {hd} with {rot} "
                                                             "rotated")
    within = np.arange(hd)
    within[:rot] = np.arange(rot).reshape(2, rot // 2).T.reshape(-1)  # (interleaved row j: j // 2, or half + j // 2)
    return (np.arange(heads)[:, None] * hd + within[None, :]).reshape(-1)


def _unpermuted(g: GGUFModel, t: GGUFTensor, n: int, heads: int) -> np.ndarray:
    """row_order's source rows for ``n`` q or k rows of ``heads`` heads (of tensor ``t``)."""
    if n % (2 * heads):
        raise FormatError(g.path, f"tensor {t.name!r} dims", f"{n} rows do not split into {heads} heads of pairs")
    return np.arange(n).reshape(heads, n // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _converter_fused(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], t: GGUFTensor, layer: int,
                     suffix: str) -> list[_Tensor] | None:
    """The tensors a file written with the converter's --fuse-qkv or --fuse-gate-up-exps (CONVERTER_FUSED) holds
    in ``t`` (block ``layer``'s ``suffix``), read as the separate ones would be: attn_qkv's q rows (all but two kv
    widths), k rows, v rows, q/k un-interleaved where the architecture's are; ffn_gate_up_exps' per expert gate
    rows, then up rows. None where ``t`` is none of those (a gated DeltaNet's own attn_qkv, phi3's)."""
    base, _, kind = suffix.rpartition(".")
    parts = CONVERTER_FUSED.get(base)
    n = cfg["num_hidden_layers"]
    linear = base == "attn_qkv" and arch.linear and layer < n and cfg["layer_types"][layer] == "linear_attention"
    if parts is None or suffix in arch.fused or linear:
        return None
    where = f"tensor {t.name!r}"
    if base == "attn_qkv":
        names = [hf_layer_name(arch, f"blk.{layer}.{x}.{kind}") for x in parts]
        if None in names:
            return None
        heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        kv_rows = kv * (cfg.get("head_dim") or cfg["hidden_size"] // heads)
        rows = [t.shape[0] - 2 * kv_rows, kv_rows, kv_rows]
        if rows[0] < 1:
            raise FormatError(g.path, where, f"{t.shape[0]} rows cannot hold q, k and v with k and v "
                                             f"{kv_rows} rows each")
        out, r0 = [], 0
        for x, name, m in zip(parts, names, rows):
            qk = _qk_rows(g, t, m, heads if x == "attn_q" else kv, cfg) if x != "attn_v" else None
            order = r0 + (np.arange(m) if qk is None else qk)
            out.append(_Tensor(t, name, "", order, "", shape_=[m, *t.shape[1:]]))
            r0 += m
        return out
    if len(t.shape) != 3 or t.shape[1] % 2:
        raise FormatError(g.path, where, f"an expert stack of gate and up rows must be [experts, 2 × rows, cols], "
                                         f"got {t.shape}")
    n_exp, ff = t.shape[0], t.shape[1] // 2
    stacks = {v: k for k, v in arch.experts.items()}
    if all(f"{x}.weight" in stacks for x in parts):  # (one matrix per expert)
        return [_Tensor(t, f"model.layers.{layer}.{stacks[f'{x}.weight'].format(e=e)}", "",
                        e * 2 * ff + k * ff + np.arange(ff), "", shape_=[ff, t.shape[2]])
                for e in range(n_exp) for k, x in enumerate(parts)]
    pair = next((hf for hf, two in arch.paired.items() if two == tuple(f"{x}.weight" for x in parts)), None)
    if pair is None:
        return None
    order = _pair_order(n_exp, ff, 2 * ff, ff, arch.halves)  # (expert e's gate rows, then its up rows)
    return [_Tensor(t, f"model.layers.{layer}.{pair}", "", order, "", shape_=[n_exp, 2 * ff, t.shape[2]])]


def _pair_order(n_exp: int, rows: int, per_expert: int, per_half: int, halves: bool) -> np.ndarray:
    """The source row of each row of a gate/up stack [experts, 2 rows, cols] (gpt-oss's: row (e, 2i + k); Llama
    4's, ``halves``: row (e, k rows + i)), where row i of expert e's gate (k 0) or up (k 1) is source row
    e per_expert + k per_half + i."""
    src = (np.arange(n_exp)[:, None, None] * per_expert + np.arange(2)[None, None, :] * per_half
           + np.arange(rows)[None, :, None])  # [e, i, k]
    return (src.transpose(0, 2, 1) if halves else src).reshape(-1)


@dataclass
class _Tensor:
    src: GGUFTensor     # the (first) source tensor: its ggml type is every source's
    name: str           # Hugging Face name
    dtype: str          # IEBIN dtype written
    order: np.ndarray | None  # row of the sources' rows (concatenated) for each output row, else None: in place
    mode: str           # "copy" | "cast" | "dequant" | "quantize"
    params: QuantParams | None = None  # "quantize": the manifest's choice
    importance: Any = None  # "quantize": its importance vector (--imatrix), or None
    shape_: list[int] | None = None  # the output shape when it is not the source's (an expert, a merged pair)
    srcs: list[GGUFTensor] | None = None  # several sources whose rows are concatenated (gpt-oss's gate and up)
    elementwise: bool = False  # a vector stack whose elements move one by one (gpt-oss's gate/up biases)
    shift: float = 0.0  # subtracted from every value (Gemma's norms: llama.cpp stores 1 + w)
    log_neg: bool = False  # each value v as ln(-v) (gated DeltaNet's A_log: llama.cpp stores -exp(A_log))
    mla: tuple[int, int, int] | None = None  # kv_b_proj from attn_k_b and attn_v_b (srcs): (heads, nope, v) dims
    expert: int | None = None  # the expert of a stack split into one matrix per expert (its scales are that expert's)
    tensor_scale: float = 1.0  # an NVFP4 source's `.scale` (its expert's, in a stack): the values are times it
    source_scales: tuple[float, ...] = ()  # kv_b_proj's: each source's own (its values are assembled as floats)
    input_scale: float | None = None  # and its `.input_scale`, carried (neither llama.cpp's graph nor ours reads it)
    keyed: np.ndarray | None = None  # values read from a key (GGUFArch.layer_keys), not from src's bytes

    @property
    def shape(self) -> list[int]:
        return self.shape_ or self.src.shape

    @property
    def sources(self) -> list[GGUFTensor]:
        return self.srcs or [self.src]

    @property
    def rows(self) -> int:
        """Rows the bytes are split into: a vector is kept whole unless its elements move."""
        if self.elementwise:
            return int(np.prod(self.shape))
        if len(self.shape) >= 2:
            return int(np.prod(self.shape[:-1]))
        return self.shape[0] if self.order is not None else 1

    @property
    def in_nbytes(self) -> int:
        """Source bytes read to make it (gpt-oss's pairs: both halves)."""
        if self.mla:
            return sum(t.nbytes for t in self.sources)
        return self.rows * _src_rows(self)[1]

    @property
    def out_nbytes(self) -> int:
        if self.dtype not in SCHEMES:  # (a float, or values from a key: xIELU's beta has no dimension)
            return int(np.prod(self.shape)) * DTYPES[self.dtype].itemsize
        rows, cols = int(np.prod(self.shape[:-1])), self.shape[-1]
        if self.mode == "quantize":
            return SCHEMES[self.dtype].nbytes(rows, cols, self.params)
        if self.mode == "copy":
            return SCHEMES[self.dtype].nbytes(rows, cols)
        return int(np.prod(self.shape)) * DTYPES[self.dtype].itemsize

    @property
    def quant(self) -> dict[str, Any] | None:
        if self.dtype not in SCHEMES:
            return None
        kept = QuantParams(self.dtype, tensor_scale=self.tensor_scale, input_scale=self.input_scale)
        return SCHEMES[self.dtype].quant_dict(self.shape[-1], self.params or kept)


def _field(g: GGUFModel, key: str, typ: type, default: Any = None) -> Any:
    """A metadata value of the given type (int: non-negative; float: finite and positive)."""
    v = g.fields.get(key, default)
    if v is None:
        raise FormatError(g.path, key, "is missing")
    if typ is int and (type(v) is not int or v < 0):
        raise FormatError(g.path, key, f"expected a non-negative integer, got {v!r}")
    if typ is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
            raise FormatError(g.path, key, f"expected a positive number, got {v!r}")
        v = float(str(np.float32(v)))  # the shortest decimal of the stored float32 (1e-05, not 9.99e-06)
    if typ is str and not isinstance(v, str):
        raise FormatError(g.path, key, f"expected a string, got {v!r}")
    return v


def _llama3_scaling(g: GGUFModel, t, head_dim: int, theta: float) -> dict[str, Any]:
    """Llama-3's rope_scaling from llama.cpp's per-frequency divisors
    (``rope_freqs.weight``, what its converter writes for rope_type llama3).

    The divisors are 1 for wavelengths under original_ctx / high_freq_factor,
    ``factor`` above original_ctx / low_freq_factor, and between them
    1 / ((1 - s) / factor + s) with s = (original_ctx / wavelength - low) / (high - low):
    s is linear in 1 / wavelength, so two or more divisors on the ramp give
    (high - low) / original_ctx and low / original_ctx. The three are known
    only up to a common scale (every choice gives the same divisors), so
    original_ctx is the file's ``rope.scaling.original_context_length`` (which
    iebin-to-gguf writes) or Llama 3's 8192. Equal factors (Llama 4 Scout's)
    make a step without a ramp: low = high, 1 where that puts the step between
    the last kept and the first divided frequency (else a value that does).
    The result is accepted only if it gives the stored divisors back."""
    where = "tensor 'rope_freqs.weight'"
    if t.ggml_type != "F32" or list(t.shape) != [head_dim // 2]:
        raise FormatError(g.path, where, f"expected F32 [{head_dim // 2}] (one divisor per frequency), got "
                                         f"{t.ggml_type} {list(t.shape)}")
    div = g.tensor_bytes(t).view("<f4").astype(np.float64)
    if not np.isfinite(div).all() or div.min() < 1 - 1e-6:
        raise FormatError(g.path, where, "holds a divisor below 1, NaN or Inf; Llama-3 scaling divides by 1..factor")
    a = _arch_of(g).gguf
    old_ctx = float(_field(g, f"{a}.rope.scaling.original_context_length", int, 8192))
    factor = float(f"{div.max():.6g}")
    inv, _ = rope_tables(head_dim, theta, None)
    x = inv.astype(np.float64) / (2 * np.pi)  # 1 / wavelength
    ramp = (div > 1 + 1e-6) & (div < factor * (1 - 1e-6))
    scaling = None
    if factor > 1 and ramp.sum() >= 2:
        s = (1 / div[ramp] - 1 / factor) / (1 - 1 / factor)
        slope, icept = np.polyfit(x[ramp], s, 1)  # s = x * old_ctx / (high - low) - low / (high - low)
        if slope > 0:
            width = old_ctx / slope
            low = float(f"{-icept * width:.6g}")
            scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                       "high_freq_factor": float(f"{low + width:.6g}"), "original_max_position_embeddings": int(old_ctx)}
    if factor > 1 and not ramp.any():  # a step, no ramp: equal factors (Llama 4 Scout's 1 and 1)
        wl = 1 / x
        kept, scaled = wl[div <= 1 + 1e-6], wl[div >= factor * (1 - 1e-6)]
        below = float(kept.max()) if kept.size else float(scaled.min()) / 2
        if scaled.size and below < scaled.min():  # the step's wavelength old_ctx / low: in [below, first scaled)
            low = 1.0 if below <= old_ctx < scaled.min() else float(f"{old_ctx / math.sqrt(below * scaled.min()):.6g}")
            scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": low,
                       "original_max_position_embeddings": int(old_ctx)}
    if scaling is not None and scaling["low_freq_factor"] > 0:
        try:
            back = inv / rope_tables(head_dim, theta, scaling)[0]
        except IEError:
            back = None
        if back is not None and np.allclose(back, div, rtol=1e-5, atol=0):
            return scaling
    raise FormatError(g.path, where, "per-frequency divisors that are not Llama-3's ramp (1, a smooth ramp over two "
                                     "or more frequencies, factor); no other RoPE scaling is read")


# The {arch}.* keys the importer reads (every architecture; the MoE ones
# only for the architectures with experts, the sliding-window ones only for
# gpt-oss), and those that change nothing computed. Any other {arch}.* key
# is refused: a model it changes would be imported as another.
_DENSE_KEYS = frozenset({
    "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "rope.scaling.finetuned",  # llama.cpp records whether the scaling was fine-tuned; it computes nothing
})
_MOE_KEYS = frozenset({"expert_count", "expert_used_count", "expert_feed_forward_length"})


def _check_arch_keys(g: GGUFModel, arch: GGUFArch) -> None:
    a = arch.gguf
    moe = arch.moe
    allowed = _DENSE_KEYS | (_MOE_KEYS if moe else set()) | arch.keys
    read = {k for k, _ in arch.layer_keys.values()}
    for key in sorted(LAYER_KEYS & set(g.fields) - read):  # (Apertus's xielu.* beside another architecture)
        raise FormatError(g.path, key, f"a layer's parameter {arch.hf_class} has no place for; refusing rather than "
                                       "importing another model")
    for key, value in g.fields.items():
        if not key.startswith(a + "."):
            continue
        suffix = key[len(a) + 1:]
        if suffix in allowed or (suffix in _MOE_KEYS and value == 0):  # "no experts", as a dense model
            continue
        what = ("experts" if suffix in _MOE_KEYS else "sliding-window attention" if "sliding_window" in suffix
                else "a setting the importer does not read")
        raise FormatError(g.path, key, f"{value!r:.60}: {what} for {arch.hf_class} cannot be imported as the model "
                                       "computes it; refusing rather than importing another model")


def build_config(g: GGUFModel) -> dict[str, Any]:
    """The ``config.json`` the metadata describes (what transformers would read)."""
    names = {t.name: t for t in g.tensors}
    arch = _arch_of(g)
    a = arch.gguf
    _check_arch_keys(g, arch)
    hidden = _field(g, f"{a}.embedding_length", int)
    if a == "mamba2":
        return _with_token_ids(g, _mamba2_config(g, arch, names, hidden))
    if a == "mamba":
        return _with_token_ids(g, _mamba1_config(g, arch, names, hidden))
    heads = _field(g, f"{a}.attention.head_count", int)
    if hidden < 1 or heads < 1:
        raise FormatError(g.path, f"{a}.attention.head_count", f"{heads} heads of a {hidden}-wide model")
    conv_layers = _conv_layers(g, arch) if arch.short_conv or arch.mamba else []
    blocks = _nemotron_blocks(g, arch) if arch.nemotron else ""
    # (one count per layer: the attention layers', all alike; none of them attending, any count)
    kv = (max(g.fields[f"{a}.attention.head_count_kv"]) or heads) if conv_layers or blocks else \
        _field(g, f"{a}.attention.head_count_kv", int, heads)
    if kv < 1 or heads % kv:
        raise FormatError(g.path, f"{a}.attention.head_count_kv", f"{kv}: must be at least 1 and divide the {heads} "
                                                                  "attention heads (grouped-query attention)")
    mla = _mla_config(g, arch, heads, kv) if arch.mla else {}
    head_dim = mla.get("head_dim") or _field(g, f"{a}.attention.key_length", int, hidden // heads)
    if not mla and _field(g, f"{a}.attention.value_length", int, head_dim) != head_dim:
        raise FormatError(g.path, f"{a}.attention.value_length", "differs from key_length; the decoder needs them equal")
    rot = _field(g, f"{a}.rope.dimension_count", int, head_dim)
    if rot != head_dim and not mla and not (DECODER_ARCHS[arch.hf_class].partial_rope and 2 <= rot < head_dim
                                            and rot % 2 == 0):
        raise FormatError(g.path, f"{a}.rope.dimension_count", f"rotates {rot} of {head_dim} head dimensions; partial "
                                                               f"RoPE is not supported for {a}")
    scaling = _field(g, f"{a}.rope.scaling.type", str, "none")
    if scaling not in ("none", "linear", "yarn"):
        raise FormatError(g.path, f"{a}.rope.scaling.type", f"RoPE scaling {scaling!r} is not supported "
                                                            "(none, linear, yarn)")
    if "rope_freqs.weight" in names and scaling != "none":
        raise FormatError(g.path, "tensor 'rope_freqs.weight'", f"per-frequency RoPE factors beside "
                                                                f"{a}.rope.scaling.type {scaling!r}")
    if arch.embed_head and "output.weight" in names:
        raise FormatError(g.path, "tensor 'output.weight'", f"llama.cpp's {a} reads the embedding as its output head "
                                                            "and never this one; refusing rather than dropping it")
    vocab = _vocab(g, a, names)
    ln_eps = "attention.layer_norm_epsilon"  # LayerNorm's (Cohere's); an RMSNorm architecture listing it reads it too
    rms_eps = g.fields.get(f"{a}.{ln_eps}") if ln_eps in arch.keys else None
    cfg: dict[str, Any] = {
        "architectures": [arch.hf_class], "model_type": arch.model_type, "hidden_act": HF_ACTS[arch.mlp_act],
        # (Qwen3.5-MoE's has no dense MLP to give a width: its files have none)
        "hidden_size": hidden,
        "intermediate_size": max(g.fields[f"{a}.feed_forward_length"]) if blocks else
        _field(g, f"{a}.feed_forward_length", int, 0 if arch.hf_class in NO_DENSE_MLP else None),
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "num_hidden_layers": _field(g, f"{a}.block_count", int),
        "max_position_embeddings": _field(g, f"{a}.context_length", int),
        **({"layer_norm_eps": _field(g, f"{a}.{ln_eps}", float)} if arch.layer_norm else
           {"rms_norm_eps": _field(g, f"{a}.attention.layer_norm_rms_epsilon", float, rms_eps)}),
        "rope_theta": _field(g, f"{a}.rope.freq_base", float, 10000.0),
        "vocab_size": vocab, "tie_word_embeddings": "output.weight" not in names,
    }
    if scaling == "linear":  # llama.cpp divides positions by the factor (a gemma3 file: in its global layers)
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": _field(g, f"{a}.rope.scaling.factor", float)}
    if scaling == "yarn":
        cfg["rope_scaling"] = {
            "rope_type": "yarn", "factor": _field(g, f"{a}.rope.scaling.factor", float),
            "original_max_position_embeddings": _field(g, f"{a}.rope.scaling.original_context_length", int),
            "beta_fast": _field(g, f"{a}.rope.scaling.yarn_beta_fast", float, 32.0),
            "beta_slow": _field(g, f"{a}.rope.scaling.yarn_beta_slow", float, 1.0), "truncate": True}
    if "rope_freqs.weight" in names:
        cfg["rope_scaling"] = _llama3_scaling(g, names["rope_freqs.weight"], head_dim, cfg["rope_theta"])
    if mla:
        _mla_rope(g, arch, cfg, mla, rot)
    # convert_hf_to_gguf.py writes int(factor * hidden) // heads; stated where the class defaults to another (GLM-4)
    if not mla and (rot != head_dim or DECODER_ARCHS[arch.hf_class].default_partial != 1):
        cfg["partial_rotary_factor"] = rot / head_dim
        if int(head_dim * cfg["partial_rotary_factor"]) != rot:  # (transformers' truncation must give it back)
            raise FormatError(g.path, f"{a}.rope.dimension_count", f"{rot} of {head_dim} is no factor transformers "
                                                                   "reads back")
    if arch.gguf == "phi3":
        _phi3_config(g, arch, cfg, names, rot)
    if arch.gguf in ("granite", "granitemoe", "granite_swa"):
        _granite_config(g, arch, cfg)
    if arch.gguf == "granite_swa":
        _granite_swa_config(g, arch, cfg)
    if arch.hf_class == "GraniteMoeSWAForCausalLM":  # (its shared MLP where the width is positive: llama.cpp's too)
        cfg["shared_intermediate_size"] = _field(g, f"{arch.gguf}.expert_shared_feed_forward_length", int, 0)
    if arch.gguf == "stablelm":  # (as llama.cpp's graph reads them: by the tensors the file holds)
        cfg.update(use_qkv_bias="blk.0.attn_q.bias" in names,
                   use_parallel_residual="blk.0.ffn_norm.weight" not in names,
                   qk_layernorm="blk.0.attn_q_norm.weight" in names)
    if arch.gguf == "phi2":  # (PhiConfig's spelling of its unit: the same tanh approximation)
        cfg["hidden_act"] = "gelu_new"
    if arch.gguf == "nemotron":  # (NemotronConfig's name)
        cfg["norm_eps"] = cfg.pop("layer_norm_eps")
    if arch.gguf == "olmo":
        _olmo_config(g, arch, cfg)
    if arch.gguf == "starcoder2":  # (Starcoder2Config's names; llama.cpp's graph attends to every position)
        cfg.update(use_bias="blk.0.attn_output.bias" in names, norm_epsilon=cfg.pop("layer_norm_eps"),
                   sliding_window=None)
    if arch.gguf == "jais2":  # (Jais2Config's switches, as the file holds the biases; llama.cpp's loader needs them)
        cfg.update(attention_bias="blk.0.attn_output.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names)
    if arch.mamba:
        _granite4_config(g, arch, cfg, conv_layers)
    if arch.nemotron:
        _nemotron_config(g, arch, cfg, blocks)
    if arch.gguf == "falcon-h1":
        _falcon_h1_config(g, arch, cfg)
    if arch.gguf == "mistral3":
        _mistral3_config(g, arch, cfg)
    if arch.gguf == "mistral4":
        _mistral4_config(g, arch, cfg)
    if arch.gguf == "exaone4":
        _exaone4_config(g, arch, cfg)
    if DECODER_ARCHS[arch.hf_class].ntk_alpha:
        _ntk_alpha_config(g, arch, cfg, rot)
    if arch.short_conv:  # (Lfm2Config's names; its width as it is, not derived again by LFM2's rule)
        cfg.update(layer_types=[("full_attention", "conv")[c] for c in conv_layers or [False] * cfg["num_hidden_layers"]],
                   conv_L_cache=_field(g, f"{a}.shortconv.l_cache", int), conv_bias=False,
                   block_auto_adjust_ff_dim=False, norm_eps=cfg.pop("rms_norm_eps"))
    if DECODER_ARCHS[arch.hf_class].cohere:
        _cohere_config(g, arch, cfg)
    if arch.hf_class == "Olmo3ForCausalLM":  # layer types by the file's pattern (or every 4th full); one base
        _sliding_layers(g, arch, cfg, "llama.cpp's olmo2 turns the sliding layers by rope.freq_base")
    if arch.nope_step:  # (SmolLM3: no key says which layers; llama.cpp's graph fixes them)
        cfg["no_rope_layers"] = [int(not w) for w in every_nth(arch.nope_step, cfg["num_hidden_layers"])]
    if arch.linear:
        _linear_config(g, arch, cfg)
    elif "rope.dimension_sections" in arch.keys:  # (Qwen3-VL's: one RoPE for text)
        _text_mrope(g, arch)
    _moe_config(g, arch, cfg)
    if arch.hf_class == "YoutuForCausalLM":
        _every_layer_dense(g, arch, cfg)
    if DECODER_ARCHS[arch.hf_class].gemma:
        _gemma_config(g, arch, cfg)
    return _with_token_ids(g, cfg)


def _vocab(g: GGUFModel, a: str, names: dict[str, Any]) -> int:
    """The vocabulary: token_embd's rows, which ``{a}.vocab_size`` must not contradict."""
    embed = names.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise FormatError(g.path, "tensor 'token_embd.weight'", "is missing or not a matrix")
    vocab = embed.shape[0]
    if _field(g, f"{a}.vocab_size", int, vocab) != vocab:
        raise FormatError(g.path, f"{a}.vocab_size", f"{g.fields[f'{a}.vocab_size']} disagrees with the "
                                                     f"{vocab} rows of token_embd.weight")
    return vocab


def _with_token_ids(g: GGUFModel, cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with the tokenizer's special ids (CONFIG_TOKEN_IDS) and the ends of generation llama.cpp stops at."""
    vocab = cfg["vocab_size"]
    for which, key in CONFIG_TOKEN_IDS.items():
        tid = g.fields.get(f"tokenizer.ggml.{key}_token_id")
        if tid is not None:
            cfg[f"{which}_token_id"] = _field(g, f"tokenizer.ggml.{key}_token_id", int)
            if tid >= vocab:
                raise FormatError(g.path, f"tokenizer.ggml.{key}_token_id", f"{tid} is outside the vocabulary "
                                                                            f"(0..{vocab - 1})")
    eog = [i for i in end_of_generation(g.fields) if i < vocab]  # where llama.cpp stops: its EOS first
    if len(eog) > 1 and cfg.get("eos_token_id", eog[0]) == eog[0]:
        cfg["eos_token_id"] = eog
    return cfg


def _mla_config(g: GGUFModel, arch: GGUFArch, heads: int, kv: int) -> dict[str, Any]:
    """Latent attention's dims from a deepseek2 file, as DeepseekV3Config
    says them (``head_dim``: the q/k head's, nope + rope, for build_config).
    llama.cpp writes the latent as one MQA head: head_count_kv 1,
    key_length kv_lora_rank + rope dims, value_length kv_lora_rank; the
    decompressed heads' dims under key_length_mla / value_length_mla, which
    an older file without them (its kv_b unsplit) lacks: refused."""
    a = arch.gguf
    rot = _field(g, f"{a}.rope.dimension_count", int)
    kvl = _field(g, f"{a}.attention.kv_lora_rank", int)
    if kv != 1:
        raise FormatError(g.path, f"{a}.attention.head_count_kv", f"{kv}; llama.cpp's deepseek2 holds latent "
                                                                  "attention as one key/value head")
    for key, want in (("key_length", kvl + rot), ("value_length", kvl)):
        if _field(g, f"{a}.attention.{key}", int) != want:
            raise FormatError(g.path, f"{a}.attention.{key}", f"{g.fields[f'{a}.attention.{key}']}; latent attention "
                                                              f"stores {want} (kv_lora_rank {kvl}, rope dims {rot})")
    if f"{a}.attention.key_length_mla" not in g.fields:
        raise FormatError(g.path, f"{a}.attention.key_length_mla", "is missing: a deepseek2 file from before "
                                                                   "llama.cpp split attn_kv_b; convert it again")
    qk, v = _field(g, f"{a}.attention.key_length_mla", int), _field(g, f"{a}.attention.value_length_mla", int)
    if not 0 < rot < qk or rot % 2 or v < 1 or kvl < 1:
        raise FormatError(g.path, f"{a}.attention.key_length_mla", f"{qk} with {rot} rotated dims, values of {v}, a "
                                                                   f"latent of {kvl}: not latent attention's shape")
    has_q_a = any(t.name == "blk.0.attn_q_a.weight" for t in g.tensors)
    q_lora = _field(g, f"{a}.attention.q_lora_rank", int, 0)
    if has_q_a != (q_lora > 0):
        raise FormatError(g.path, f"{a}.attention.q_lora_rank", f"{q_lora or 'missing'}, but the file "
                                                                f"{'has' if has_q_a else 'has no'} attn_q_a tensors")
    return {"head_dim": qk, "num_key_value_heads": heads, "q_lora_rank": q_lora or None, "kv_lora_rank": kvl,
            "qk_nope_head_dim": qk - rot, "qk_rope_head_dim": rot, "v_head_dim": v}


def _mla_rope(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], mla: dict[str, Any], rot: int) -> None:
    """Latent attention's config keys, and its YaRN as transformers reads it:
    llama.cpp takes mscale to be mscale_all_dim (yarn_log_multiplier / 0.1),
    so cos and sin stay unscaled and the scores gain its factor squared; a
    YaRN without the multiplier (llama.cpp's scores then gain the m = 1
    factor squared, no transformers config's) is refused."""
    a = arch.gguf
    cfg.update({k: v for k, v in mla.items() if k != "head_dim"}, head_dim=rot, rope_interleave=True,
               attention_bias=False)
    log_mul = g.fields.get(f"{a}.rope.scaling.yarn_log_multiplier")
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        if log_mul is not None:
            raise FormatError(g.path, f"{a}.rope.scaling.yarn_log_multiplier", "without YaRN scaling")
        return
    if scaling.get("rope_type") != "yarn":
        raise FormatError(g.path, f"{a}.rope.scaling.type", f"{scaling.get('rope_type')!r}: latent attention's "
                                                            "RoPE scaling is YaRN's")
    if log_mul is None:
        raise FormatError(g.path, f"{a}.rope.scaling.yarn_log_multiplier", "is missing beside YaRN; llama.cpp's "
                                                                          "scores would gain a factor no "
                                                                          "transformers config states")
    m = _field(g, f"{a}.rope.scaling.yarn_log_multiplier", float) / 0.1
    scaling.update(mscale=m, mscale_all_dim=m)


def _phi3_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], names: dict, rot: int) -> None:
    """Phi-3's keys: its original context, and LongRoPE (Phi-3.5, Phi-4-mini,
    the 128k Phi-3s) from the factors llama.cpp's converter stores as
    ``rope_factors_long`` / ``_short`` [rotated dims / 2] and the attention
    factor it stores as ``rope.scaling.attn_factor`` (recorded where it is
    not the one transformers derives from the two contexts). No sliding
    window: llama.cpp's phi3 graph applies none."""
    a = arch.gguf
    old_ctx = _field(g, f"{a}.rope.scaling.original_context_length", int, cfg["max_position_embeddings"])
    if old_ctx < 2:
        raise FormatError(g.path, f"{a}.rope.scaling.original_context_length", f"{old_ctx}: expected at least 2 "
                                                                              "positions")
    cfg.update(original_max_position_embeddings=old_ctx, sliding_window=None)
    have = [k for k in ("long", "short") if f"rope_factors_{k}.weight" in names]
    if not have:
        if f"{a}.rope.scaling.attn_factor" in g.fields:
            raise FormatError(g.path, f"{a}.rope.scaling.attn_factor", "without rope_factors_long/_short: an "
                                                                       "attention factor of no LongRoPE")
        return
    if len(have) == 1:
        raise FormatError(g.path, f"tensor 'rope_factors_{have[0]}.weight'", "without its long/short partner; "
                                                                             "LongRoPE needs both")
    factors = {}
    for k in ("long", "short"):
        t = names[f"rope_factors_{k}.weight"]
        if t.ggml_type != "F32" or list(t.shape) != [rot // 2]:
            raise FormatError(g.path, f"tensor 'rope_factors_{k}.weight'", f"expected F32 [{rot // 2}] (one factor "
                                                                           f"per rotated pair), got {t.ggml_type} "
                                                                           f"{list(t.shape)}")
        v = g.tensor_bytes(t).view("<f4")
        if not (np.isfinite(v).all() and (v > 0).all()):
            raise FormatError(g.path, f"tensor 'rope_factors_{k}.weight'", "holds a factor that is not a positive "
                                                                           "number")
        factors[k] = [float(str(x)) for x in v]  # the shortest decimal of each stored float32
    scaling = {"rope_type": "longrope", "long_factor": factors["long"], "short_factor": factors["short"],
               "original_max_position_embeddings": old_ctx}
    att = _field(g, f"{a}.rope.scaling.attn_factor", float, 1.0)
    derived = longrope_attention_factor(cfg["max_position_embeddings"] / old_ctx, old_ctx)
    if att != float(str(np.float32(derived))):
        scaling["attention_factor"] = att
    cfg["rope_scaling"] = scaling


def _granite_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Granite's multipliers as llama.cpp's granite graph applies them: the
    logit scale (a key it requires), and where a key is absent, no
    embedding or residual multiplier and the scores' 1/sqrt(head_dim)
    (transformers' GraniteConfig would default the attention's to 1).
    ``rope.scaling.finetuned`` false turns RoPE off in every layer there,
    which no Granite checkpoint does: refused."""
    a = arch.gguf
    if g.fields.get(f"{a}.rope.scaling.finetuned", True) is not True and not arch.mamba:
        raise FormatError(g.path, f"{a}.rope.scaling.finetuned", f"false: llama.cpp's {a} then rotates no layer, "
                                                                 f"which {arch.hf_class} cannot say")
    cfg.update(embedding_multiplier=_field(g, f"{a}.embedding_scale", float, 1.0),
               attention_multiplier=_field(g, f"{a}.attention.scale", float, 1.0 / math.sqrt(cfg["head_dim"])),
               residual_multiplier=_field(g, f"{a}.residual_scale", float, 1.0),
               logits_scaling=_field(g, f"{a}.logit_scale", float))


def _granite_swa_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Granite SWA as GraniteSWAConfig says it: the window and its pattern (both required, as llama.cpp's loader
    requires them), one RoPE base for every layer (llama.cpp's granite_swa reads no other), the layers
    attention.rope_pattern marks false without RoPE (layer_rope_theta 0; every layer rotates without the key)."""
    a = arch.gguf
    _sliding_layers(g, arch, cfg, "llama.cpp's granite_swa turns every layer by rope.freq_base")
    key = f"{a}.attention.rope_pattern"
    rotates = g.fields.get(key)
    if rotates is None:
        return
    n = cfg["num_hidden_layers"]
    if not isinstance(rotates, list) or len(rotates) != n or not all(type(x) is bool for x in rotates):
        raise FormatError(g.path, key, f"expected {n} booleans, one per layer (true: RoPE), got {rotates!r:.60}")
    if not all(rotates):
        cfg["layer_rope_theta"] = [cfg["rope_theta"] if r else 0.0 for r in rotates]


def _granite4_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], mamba_layers: list[bool]) -> None:
    """Granite 4 (granitehybrid) as GraniteMoeHybridConfig says it: Granite's multipliers; the Mamba2 layers
    (_conv_layers: head_count_kv 0) and their dims from the ssm.* keys (inner_size a whole multiple of the width,
    time_step_rank its heads); RoPE where rope.scaling.finetuned is true or absent, as llama.cpp's granitehybrid
    switches it; the shared MLP expert_shared_feed_forward_length wide beside experts (llama.cpp runs none without
    the key: _moe_config), or without experts the dense MLP's feed_forward_length."""
    a = arch.gguf
    _granite_config(g, arch, cfg)
    hidden, blocks = cfg["hidden_size"], cfg["num_hidden_layers"]
    # (required where a layer runs Mamba2; else what iebin-to-gguf wrote, or GraniteMoeHybridConfig's defaults)
    def ssm(key: str, default: int) -> int:
        return _ssm_key(g, a, key, any(mamba_layers), default)

    heads, inner = ssm("time_step_rank", 1), ssm("inner_size", 2 * hidden)
    if heads < 1 or inner < 1 or inner % hidden or inner % heads:
        raise FormatError(g.path, f"{a}.ssm.inner_size", f"{inner}: expected a whole multiple of the {hidden}-wide "
                                                         f"model split into time_step_rank {heads} heads")
    rope = g.fields.get(f"{a}.rope.scaling.finetuned", True)
    cfg.update(layer_types=[("attention", "mamba")[m] for m in mamba_layers or [False] * blocks],
               position_embedding_type="rope" if rope is True else "nope", mamba_n_heads=heads,
               mamba_d_head=inner // heads, mamba_expand=inner // hidden, mamba_conv_bias=True, mamba_proj_bias=False,
               mamba_d_state=ssm("state_size", MAMBA_DEFAULTS["mamba_d_state"]),
               mamba_n_groups=ssm("group_count", MAMBA_DEFAULTS["mamba_n_groups"]),
               mamba_d_conv=ssm("conv_kernel", MAMBA_DEFAULTS["mamba_d_conv"]))
    if arch is GRANITE_HYBRID_DENSE:  # (with experts: _moe_config)
        cfg.update(num_local_experts=0, shared_intermediate_size=cfg["intermediate_size"])


def _falcon_h1_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Falcon-H1 as FalconH1Config says it: Mamba2 beside attention in every layer, its dims from the ssm.* keys
    (inner_size time_step_rank heads of whole dims: mamba_d_ssm, which need not be a multiple of the width); every
    muP multiplier 1, as the converter multiplies them into the matrices it writes (FalconH1Model.modify_tensors);
    no gated norm (llama.cpp runs one where ssm_norm is stored: such a file is refused by its tensor)."""
    a = arch.gguf
    heads, inner = _ssm_key(g, a, "time_step_rank", True, 0), _ssm_key(g, a, "inner_size", True, 0)
    if heads < 1 or inner < 1 or inner % heads:
        raise FormatError(g.path, f"{a}.ssm.inner_size", f"{inner}: expected time_step_rank {heads} heads of whole "
                                                         "dims")
    cfg.update(mamba_d_ssm=inner, mamba_n_heads=heads, mamba_d_head=inner // heads,
               mamba_d_state=_ssm_key(g, a, "state_size", True, 0),
               mamba_n_groups=_ssm_key(g, a, "group_count", True, 0), mamba_d_conv=_ssm_key(g, a, "conv_kernel", True, 0),
               mamba_conv_bias=True, mamba_proj_bias=False,
               mamba_rms_norm=False, mamba_norm_before_gate=False, projectors_bias=False, attention_bias=False,
               mlp_bias=False, **{k: 1.0 for k in FALCON_H1_MULTIPLIERS},
               **{k: [1.0] * n for k, n in FALCON_H1_MULTIPLIER_LISTS.items()})


def _ssm_key(g: GGUFModel, a: str, key: str, required: bool, default: int) -> int:
    """A Mamba2 dimension, ``{a}.ssm.KEY``: required where a layer runs Mamba2, else the file's or ``default``."""
    return _field(g, f"{a}.ssm.{key}", int, None if required else default)


def _olmo_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """OLMo 1 as OlmoConfig says it: its LayerNorm's eps is OlmoLayerNorm's constant 1e-5, which no key states (a
    file whose eps differs is another model, refused); attention.clamp_kqv as clip_qkv (none without the key, as
    llama.cpp's graph then clamps nothing)."""
    a = arch.gguf
    key = f"{a}.attention.layer_norm_epsilon"
    if cfg.pop("layer_norm_eps") != OLMO_EPS:
        raise FormatError(g.path, key, f"{g.fields[key]}: OLMo's LayerNorm has eps {OLMO_EPS} and no other")
    if f"{a}.attention.clamp_kqv" in g.fields:  # (positive and finite, its shortest decimal: _field)
        cfg["clip_qkv"] = _field(g, f"{a}.attention.clamp_kqv", float)


def _mamba2_config(g: GGUFModel, arch: GGUFArch, names: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Mamba-2 as Mamba2Config says it, from what convert_hf_to_gguf's Mamba2Model writes: every layer Mamba2 alone
    (no attention heads, no MLP width: 0 or absent, else refused), its dims from the ssm.* keys (inner_size
    time_step_rank heads of whole dims, a whole multiple of the width: Mamba2Config's expand), the RMS eps; the
    context_length (2^20, "arbitrary" in the converter) and any rope.* read as nothing, as llama.cpp's graph."""
    a = arch.gguf
    _attends_nowhere(g, a)
    heads, inner = _ssm_key(g, a, "time_step_rank", True, 0), _ssm_key(g, a, "inner_size", True, 0)
    if hidden < 1 or heads < 1 or inner < 1 or inner % heads or inner % hidden:
        raise FormatError(g.path, f"{a}.ssm.inner_size", f"{inner}: expected time_step_rank {heads} heads of whole "
                                                         f"dims, a whole multiple of embedding_length {hidden}")
    return {"architectures": [arch.hf_class], "model_type": arch.model_type, "hidden_size": hidden,
            "num_hidden_layers": _field(g, f"{a}.block_count", int), "vocab_size": _vocab(g, a, names),
            "num_heads": heads, "head_dim": inner // heads, "expand": inner // hidden,
            "state_size": _ssm_key(g, a, "state_size", True, 0), "n_groups": _ssm_key(g, a, "group_count", True, 0),
            "conv_kernel": _ssm_key(g, a, "conv_kernel", True, 0),
            "layer_norm_epsilon": _field(g, f"{a}.attention.layer_norm_rms_epsilon", float),
            "hidden_act": "silu", "use_bias": False, "use_conv_bias": True,
            "tie_word_embeddings": "output.weight" not in names}


def _attends_nowhere(g: GGUFModel, a: str) -> None:
    """llama.cpp's mamba2 and mamba have neither attention nor an MLP: a head count or width other than 0 (or absent,
    as their converters write them) is another model, refused."""
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if _field(g, f"{a}.{key}", int, 0) != 0:
            raise FormatError(g.path, f"{a}.{key}", f"{g.fields[f'{a}.{key}']!r:.40}: llama.cpp's {a} has no "
                                                   "attention or MLP (0 expected)")


def _mamba1_config(g: GGUFModel, arch: GGUFArch, names: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Mamba 1 as MambaConfig (FalconMambaConfig where ssm.dt_b_c_rms is true) says it, from what convert_hf_to_gguf's
    MambaModel writes: every layer its selective scan alone (no attention heads, no MLP width: 0 or absent, else
    refused), inner_size a whole multiple of the width (MambaConfig's expand), state_size, time_step_rank,
    conv_kernel; the RMS eps, which llama.cpp also norms dt, B and C by (Falcon Mamba's mixer_rms_eps); the
    context_length (2^20, "arbitrary" in the converter) read as nothing, as llama.cpp's graph."""
    a = arch.gguf
    _attends_nowhere(g, a)
    inner = _ssm_key(g, a, "inner_size", True, 0)
    if hidden < 1 or inner < 1 or inner % hidden:
        raise FormatError(g.path, f"{a}.ssm.inner_size", f"{inner}: expected a whole multiple of embedding_length "
                                                         f"{hidden}")
    eps = _field(g, f"{a}.attention.layer_norm_rms_epsilon", float)
    return {"architectures": [arch.hf_class], "model_type": arch.model_type, "hidden_size": hidden,
            "num_hidden_layers": _field(g, f"{a}.block_count", int), "vocab_size": _vocab(g, a, names),
            "intermediate_size": inner, "expand": inner // hidden, "state_size": _ssm_key(g, a, "state_size", True, 0),
            "time_step_rank": _ssm_key(g, a, "time_step_rank", True, 0),
            "conv_kernel": _ssm_key(g, a, "conv_kernel", True, 0), "layer_norm_epsilon": eps, "hidden_act": "silu",
            "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": "output.weight" not in names,
            **({"mixer_rms_eps": eps} if arch.hf_class == "FalconMambaForCausalLM" else {})}


def _nemotron_blocks(g: GGUFModel, arch: GGUFArch) -> str:
    """Nemotron-H's blocks as hybrid_override_pattern spells them, as llama.cpp's nemotron_h graph tells them apart:
    attention.head_count_kv and feed_forward_length, one per block; Mamba2 (M) where both are 0, attention (*)
    where the KV heads are not (the attention blocks' all the same), an MLP (-) or, in nemotron_h_moe, experts (E)
    where the width is not."""
    a = arch.gguf
    n = _field(g, f"{a}.block_count", int)
    kv, ff = g.fields.get(f"{a}.attention.head_count_kv"), g.fields.get(f"{a}.feed_forward_length")
    for key, per in ((f"{a}.attention.head_count_kv", kv), (f"{a}.feed_forward_length", ff)):
        if not isinstance(per, list) or len(per) != n or any(type(v) is not int or v < 0 for v in per):
            raise FormatError(g.path, key, f"{per!r:.60}: expected {n} counts, one per block (0 where the block has "
                                           "none)")
    if len({v for v in kv if v}) > 1 or any(h and f for h, f in zip(kv, ff)):
        raise FormatError(g.path, f"{a}.attention.head_count_kv", f"{kv!r:.60}: expected the attention blocks' KV "
                                                                  "heads all the same, in blocks without an MLP")
    if len({f for f in ff if f}) > 1:  # (NVIDIA's Puzzle models: experts of a width per block)
        raise FormatError(g.path, f"{a}.feed_forward_length", f"{ff!r:.60}: MLP or expert blocks of different "
                                                              "widths are not supported")
    mlp = "E" if arch.experts else "-"
    return "".join("*" if h else mlp if f else "M" for h, f in zip(kv, ff))


def _nemotron_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], blocks: str) -> None:
    """Nemotron-H as NemotronHConfig says it: its blocks (_nemotron_blocks) as the Hub's hybrid_override_pattern
    (which transformers 5 and llama.cpp's converter read too); the Mamba2 blocks' dims from the ssm.* keys
    (inner_size time_step_rank heads of whole dims); no RoPE (llama.cpp's graph turns none: rope.* is read as nothing); the MLP blocks' ReLU-squared
    width; the eps under its LayerNorm key (llama.cpp reads the RMS one first)."""
    a = arch.gguf

    def ssm(key: str, default: int) -> int:  # (NemotronHConfig's defaults)
        return _ssm_key(g, a, key, "M" in blocks, default)

    heads, inner = ssm("time_step_rank", 128), ssm("inner_size", 8192)
    if heads < 1 or inner < 1 or inner % heads:
        raise FormatError(g.path, f"{a}.ssm.inner_size", f"{inner}: expected time_step_rank {heads} heads of whole "
                                                         "dims")
    for key in ("rope_theta", "rope_scaling", "partial_rotary_factor", "hidden_act"):
        cfg.pop(key, None)
    if "-" not in blocks:  # (the experts' width: _nemotron_moe_config)
        cfg.pop("intermediate_size")
    cfg.update(hybrid_override_pattern=blocks, mlp_hidden_act="relu2", mamba_hidden_act="silu",
               layer_norm_epsilon=cfg.pop("rms_norm_eps"), mamba_num_heads=heads, mamba_head_dim=inner // heads,
               ssm_state_size=ssm("state_size", 128), n_groups=ssm("group_count", 8), conv_kernel=ssm("conv_kernel", 4),
               use_conv_bias=True, use_bias=False, mlp_bias=False, attention_bias=False)


def _nemotron_moe_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Nemotron 3's experts as NemotronHConfig says them: sigmoid-gated (llama.cpp's nemotron_h_moe graph has no
    other router), their width expert_feed_forward_length (each expert block's feed_forward_length without it), the
    shared expert's expert_shared_feed_forward_length (required: the graph runs one), renormalised and scaled as
    expert_weights_norm and expert_weights_scale say (neither without them, as llama.cpp), groups as
    expert_group_count and expert_group_used_count."""
    a = arch.gguf
    _gated(g, arch, SIGMOID_GATING, SIGMOID_GATING)
    shared = _field(g, f"{a}.expert_shared_feed_forward_length", int, 0)
    if shared < 1:
        raise FormatError(g.path, f"{a}.expert_shared_feed_forward_length",
                          f"{shared}: llama.cpp's {a} runs a shared expert of this width beside the routed ones")
    cfg.update(n_routed_experts=cfg.pop("num_local_experts"), n_shared_experts=_field(g, f"{a}.expert_shared_count",
                                                                                      int, 1),
               moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int,
                                            max(g.fields[f"{a}.feed_forward_length"])),
               moe_shared_expert_intermediate_size=shared, **_v3_router(g, a))


def _mistral3_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """mistral3 as Ministral3ForCausalLM, in transformers 5's rope_parameters
    (where Ministral3Attention reads them): llama.cpp's
    ``attention.temperature_scale`` is llama_4_scaling_beta (0 without it:
    Mistral Small 3.x, which has none), over the
    ``rope.scaling.original_context_length`` positions llama.cpp steps by
    (the context without the key); YaRN's ``yarn_log_multiplier`` is
    mscale_all_dim beside an mscale of 1, which llama.cpp assumes."""
    a = arch.gguf
    beta = _temperature_scale(g, a)
    rp = cfg.pop("rope_scaling", None) or {"rope_type": "default"}
    log_mul = f"{a}.rope.scaling.yarn_log_multiplier"
    if log_mul in g.fields:
        if rp["rope_type"] != "yarn":
            raise FormatError(g.path, log_mul, "without rope.scaling.type yarn: a YaRN factor of no YaRN")
        rp.update(mscale=1.0, mscale_all_dim=_field(g, log_mul, float))
    old_ctx = _field(g, f"{a}.rope.scaling.original_context_length", int, cfg["max_position_embeddings"])
    if old_ctx < 1:
        raise FormatError(g.path, f"{a}.rope.scaling.original_context_length", "0: expected at least 1 position")
    _temperature_rope(cfg, rp, old_ctx, beta)


def _temperature_scale(g: GGUFModel, a: str) -> float:
    """llama.cpp's ``attention.temperature_scale``: Llama 4's attention
    temperature as Ministral 3 and Mistral 4 state it (llama_4_scaling_beta),
    0 without the key, as llama.cpp runs such a file; the float32 it holds, as
    its shortest decimal."""
    key = f"{a}.attention.temperature_scale"
    beta = g.fields.get(key, 0.0)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise FormatError(g.path, key, f"expected a non-negative number, got {beta!r}")
    return float(str(np.float32(beta)))


def _temperature_rope(cfg: dict[str, Any], rp: dict[str, Any], old_ctx: int, beta: float) -> None:
    """transformers 5's rope_parameters of a model with Llama 4's temperature, where its attention reads it: the
    RoPE ``rp``, the base, the original context the temperature steps over, and the temperature's beta."""
    cfg["rope_parameters"] = {**rp, "rope_theta": cfg.pop("rope_theta"), "original_max_position_embeddings": old_ctx,
                              "llama_4_scaling_beta": beta}


def _mistral4_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """mistral4 as Mistral4ForCausalLM: its head_dim the q/k head's (nope +
    rope, as Mistral4Config derives it), and its RoPE in rope_parameters,
    where Mistral4Attention reads Llama 4's attention temperature:
    ``attention.temperature_scale`` is llama_4_scaling_beta (0 without it,
    as llama.cpp runs a file without it: its own converter writes none), the
    temperature stepping every ``attention.temperature_length`` positions,
    which transformers takes from YaRN's original context, so the two must
    agree."""
    a = arch.gguf
    beta = _temperature_scale(g, a)
    rp = cfg.pop("rope_scaling", None) or {"rope_type": "default"}
    old_ctx = rp.get("original_max_position_embeddings", cfg["max_position_embeddings"])
    if beta:
        floor = _field(g, f"{a}.attention.temperature_length", int)
        if floor != old_ctx:
            raise FormatError(g.path, f"{a}.attention.temperature_length", f"{floor}: Mistral 4's temperature steps "
                                                                           f"over YaRN's original context ({old_ctx} "
                                                                           "positions), and no other")
    cfg["head_dim"] = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    _temperature_rope(cfg, rp, old_ctx, beta)


def _ntk_alpha_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], rot: int) -> None:
    """HunYuan's NTK-alpha RoPE as convert_hf_to_gguf's HunYuan models write it: rope.freq_base the base of 10000
    stretched by alpha^(d / (d - 2)), rope.scaling.type "none" (written in that case alone) beside a 256k context.
    Read back as the Hub's configs state it, a "dynamic" rope_scaling with the alpha that stretches 10000 to the
    file's base: the same frequencies (the float32 base of the alpha is the file's), and an export writes the same
    keys again."""
    a = arch.gguf
    if g.fields.get(f"{a}.rope.scaling.type") != "none":
        return
    base = cfg["rope_theta"]
    if not (base > 0 and math.isfinite(base)) or rot <= 2:
        raise FormatError(g.path, f"{a}.rope.freq_base", f"{base} over {rot} rotated dims is no NTK-alpha base")
    cfg.update(rope_theta=HUNYUAN_NTK_BASE, rope_scaling={"rope_type": "dynamic", "factor": 1.0,
                                                          "alpha": (base / HUNYUAN_NTK_BASE) ** ((rot - 2) / rot)})


def _exaone4_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """EXAONE 4's attention as llama.cpp's exaone4 graph runs it: in a
    64-layer model (the 32B) sliding layers by the file's pattern (or every
    4th full) with its window (or 4096), the full ones unrotated, one RoPE
    base; in any other, every layer full and rotated (sliding_window None,
    as EXAONE 4.0 1.2B's config has it). A window in such a file, which
    llama.cpp would not apply, is refused rather than imported as either
    model."""
    a = arch.gguf
    layers = cfg["num_hidden_layers"]
    if layers != arch.swa_layers:
        key = next((k for k in (f"{a}.attention.sliding_window", f"{a}.attention.sliding_window_pattern")
                    if k in g.fields), None)
        if key is not None:
            raise FormatError(g.path, key, f"llama.cpp's {a} slides only in {arch.swa_layers}-layer models (EXAONE "
                                           f"4.0 32B) and ignores this {layers}-layer file's window; refusing "
                                           "rather than importing another model")
        cfg.update(sliding_window=None, layer_types=["full_attention"] * layers)
        return
    _sliding_layers(g, arch, cfg, f"{arch.hf_class} rotates every sliding layer by the model's base", arch.swa_window)


def _cohere_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Cohere as llama.cpp's command-r and cohere2 graphs run it: the
    embedding as the head (build_config), logit_scale (command-r: 1 without the key, as its
    graph then scales nothing); cohere2's sliding_window (a key it requires)
    and sliding layers by the file's pattern (every 4th full without it),
    one RoPE base. Cohere's configs derive head_dim from hidden / heads: a
    file with other heads is refused."""
    a = arch.gguf
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        raise FormatError(g.path, f"{a}.attention.key_length", f"{cfg['head_dim']} × {cfg['num_attention_heads']} "
                                                               f"heads is not the {cfg['hidden_size']} hidden "
                                                               "dims Cohere2Config derives head_dim from")
    cfg.update(logit_scale=_field(g, f"{a}.logit_scale", float, None if arch.swa_pattern else 1.0),
               tie_word_embeddings=True)
    if arch.swa_pattern:  # (command-r: every layer full and rotated)
        _sliding_layers(g, arch, cfg, f"{arch.hf_class} rotates every sliding layer by the model's base")


def _moe_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """The experts, windows and SwiGLU of the MoE architectures, as the HF
    config keys the decoder reads, with what llama.cpp's graph for each does
    where the file cannot say otherwise (qwen3moe renormalises the top-k
    weights in every layer, olmoe and qwen2moe never; gpt-oss's SwiGLU is alpha 1.702,
    limit 7)."""
    a = arch.gguf
    if not arch.moe:  # a dense architecture (a llama file with experts is Mixtral: _arch_of)
        return
    n = _field(g, f"{a}.expert_count", int)
    k = _field(g, f"{a}.expert_used_count", int)
    if n < 1 or not 1 <= k <= n:
        raise FormatError(g.path, f"{a}.expert_used_count", f"{k} of {n} experts")
    cfg.update(num_local_experts=n, num_experts_per_tok=k)
    if arch.hf_class == "OlmoeForCausalLM":  # (OlmoeConfig's key; llama.cpp's olmoe never renormalises)
        cfg.update(num_experts=cfg.pop("num_local_experts"), norm_topk_prob=False)
    if arch.hf_class == "Qwen2MoeForCausalLM":  # never renormalised; llama.cpp's widths where a file has none (or 0)
        ff = _field(g, f"{a}.feed_forward_length", int)
        cfg.update(num_experts=cfg.pop("num_local_experts"), norm_topk_prob=False, mlp_only_layers=[],
                   decoder_sparse_step=1, qkv_bias=any(t.name == "blk.0.attn_q.bias" for t in g.tensors),
                   moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int, 0) or ff // k,
                   shared_expert_intermediate_size=_field(g, f"{a}.expert_shared_feed_forward_length", int, 0) or ff)
    if arch.hf_class in ("Glm4MoeForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
                         "Glm4MoeLiteForCausalLM", "Mistral4ForCausalLM", "Dots1ForCausalLM", "SolarOpenForCausalLM"):
        _v3_router_config(g, arch, cfg)
    if arch.hf_class == "MiniMaxM2ForCausalLM":  # (llama.cpp's minimax-m2 graph aborts without the key)
        _gated(g, arch, SIGMOID_GATING, None)
        cfg.update(intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int, cfg["intermediate_size"]))
    if arch.hf_class == "Qwen3_5MoeForCausalLM":  # (renormalised always; llama.cpp's shared width where none is given)
        inter = _field(g, f"{a}.expert_feed_forward_length", int)
        cfg.update(num_experts=cfg.pop("num_local_experts"), intermediate_size=None, moe_intermediate_size=inter,
                   shared_expert_intermediate_size=_field(g, f"{a}.expert_shared_feed_forward_length", int, 0)
                   or cfg["intermediate_size"] or inter)
    if arch.hf_class == "Qwen3NextForCausalLM":  # (experts in every layer, renormalised: llama.cpp's qwen3next)
        inter = _field(g, f"{a}.expert_feed_forward_length", int)
        cfg.update(num_experts=cfg.pop("num_local_experts"), moe_intermediate_size=inter, norm_topk_prob=True,
                   mlp_only_layers=[], decoder_sparse_step=1,
                   shared_expert_intermediate_size=_field(g, f"{a}.expert_shared_feed_forward_length", int, 0)
                   or cfg["intermediate_size"] or inter)
    if arch.hf_class == "Qwen3MoeForCausalLM":
        cfg.update(moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int), norm_topk_prob=True,
                   mlp_only_layers=[], decoder_sparse_step=1)
    if arch.hf_class == "Llama4ForCausalLM":
        _llama4_config(g, arch, cfg)
    if arch.hf_class == "HYV3ForCausalLM":
        _hy_v3_config(g, arch, cfg)
    if arch.hf_class == "AfmoeForCausalLM":
        _afmoe_config(g, arch, cfg)
    if arch.hf_class == "ExaoneMoeForCausalLM":
        _exaone_moe_config(g, arch, cfg)
    if arch.hf_class == "HunYuanMoEV1ForCausalLM":  # (llama.cpp's hunyuan-moe: softmax, renormalised, one shared MLP
        # of expert_shared_feed_forward_length channels, feed_forward_length's without it; expert_shared_count unread)
        cfg.update(num_experts=cfg.pop("num_local_experts"), moe_topk=cfg.pop("num_experts_per_tok"),
                   moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int),
                   intermediate_size=_field(g, f"{a}.expert_shared_feed_forward_length", int, 0)
                   or cfg["intermediate_size"])
    if arch.hf_class == "Ernie4_5_MoeForCausalLM":
        _ernie_moe_config(g, arch, cfg)
    if arch.hf_class == "Lfm2MoeForCausalLM":  # (llama.cpp's lfm2moe: renormalised always, never scaled)
        _gated(g, arch, SIGMOID_GATING, None)
        cfg.update(num_experts=cfg.pop("num_local_experts"), norm_topk_prob=True, routed_scaling_factor=1.0,
                   moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int),
                   num_dense_layers=_field(g, f"{a}.leading_dense_block_count", int, 0),
                   use_expert_bias=any(t.name.endswith(".exp_probs_b.bias") for t in g.tensors))
    if arch.hf_class == "NemotronHForCausalLM":
        _nemotron_moe_config(g, arch, cfg)
    if arch.hf_class in ("GraniteMoeSharedForCausalLM", "GraniteMoeHybridForCausalLM"):  # (their shared MLP)
        shared = _field(g, f"{a}.expert_shared_feed_forward_length", int, 0)
        if shared < 1:
            raise FormatError(g.path, f"{a}.expert_shared_feed_forward_length",
                              f"{shared}: llama.cpp's {a} then runs no shared MLP, which {arch.hf_class} has")
        cfg["shared_intermediate_size"] = shared
    if arch.hf_class == "GptOssForCausalLM":
        cfg.update(intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int), swiglu_limit=7.0,
                   swiglu_alpha=1.702, attention_bias=True,
                   sliding_window=_field(g, f"{a}.attention.sliding_window", int),
                   layer_types=_layer_types(g, arch, cfg["num_hidden_layers"]))


def _mtp_trunk(g: GGUFModel, a: str, cfg: dict[str, Any]) -> tuple[int, int]:
    """The multi-token prediction layers a file counts in block_count after the last (nextn_predict_layers: GLM-4.5's,
    DeepSeek's, Hy3's) and the trunk before them, transformers' num_hidden_layers (at least one, else refused)."""
    nextn = _field(g, f"{a}.nextn_predict_layers", int, 0)
    trunk = cfg["num_hidden_layers"] - nextn
    if trunk < 1:
        raise FormatError(g.path, f"{a}.nextn_predict_layers", f"{nextn} of the {cfg['num_hidden_layers']} blocks "
                                                               "leave no layer to run")
    return nextn, trunk


def _shared_experts(g: GGUFModel, a: str) -> tuple[int, int]:
    """An expert's width and how many experts' the shared MLP is, as llama.cpp sizes it (Hy3's, EXAONE MoE's):
    expert_shared_feed_forward_length, an expert's width without it; a whole number of experts, else refused."""
    inter = _field(g, f"{a}.expert_feed_forward_length", int)
    shared = _field(g, f"{a}.expert_shared_feed_forward_length", int, inter)
    if inter < 1 or shared % inter:
        raise FormatError(g.path, f"{a}.expert_shared_feed_forward_length", f"{shared}: not a whole number of "
                                                                            f"experts' {inter} channels")
    return inter, shared // inter


def _exaone_moe_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """EXAONE MoE's layers as ExaoneMoeConfig says them, as llama.cpp's exaone-moe runs them: sigmoid-gated (its
    loader requires the key), DeepSeek-V3's router keys (_v3_router), dense layers before leading_dense_block_count;
    the shared experts expert_shared_feed_forward_length wide (an expert's without it), a whole number of experts;
    its sliding layers by the pattern, one per trunk layer as llama.cpp's loader reads it (every 4th full without
    one; the full ones unrotated, as EXAONE 4's with a window); the multi-token prediction layers counted in
    block_count, kept beside the model as mtp.*."""
    a = arch.gguf
    _gated(g, arch, SIGMOID_GATING, None)
    nextn, trunk = _mtp_trunk(g, a, cfg)
    inter, shared = _shared_experts(g, a)
    dense = _field(g, f"{a}.leading_dense_block_count", int, 0)
    cfg.update(num_experts=cfg.pop("num_local_experts"), num_hidden_layers=trunk, moe_intermediate_size=inter,
               num_shared_experts=shared, first_k_dense_replace=dense,
               mlp_layer_types=["dense" if i < dense else "sparse" for i in range(trunk)], **_v3_router(g, a),
               scoring_func="sigmoid", topk_method="noaux_tc")
    _sliding_layers(g, arch, cfg, "EXAONE MoE turns its sliding layers by rope_theta")  # (over the trunk's layers)
    if nextn:
        cfg["num_nextn_predict_layers"] = nextn


def _hy_v3_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Hy3's router and layers as llama.cpp's hy_v3 reads them: sigmoid-gated (the default without the key), the
    chosen experts' scores renormalised (expert_weights_norm, which HYV3 always does: false is refused) and times
    expert_weights_scale; experts in the layers that have a router (ffn_gate_inp), a dense MLP in the others
    (mlp_layer_types); the shared experts expert_shared_feed_forward_length wide (an expert's without it), a whole
    number of experts; the multi-token prediction layers counted in block_count (num_hidden_layers: the trunk)."""
    a = arch.gguf
    _renormalised_sigmoid(g, arch)
    nextn, trunk = _mtp_trunk(g, a, cfg)
    inter, shared = _shared_experts(g, a)
    routers = {t.name for t in g.tensors if t.name.endswith(".ffn_gate_inp.weight")}
    cfg.update(num_experts=cfg.pop("num_local_experts"), num_hidden_layers=trunk, num_nextn_predict_layers=nextn,
               moe_intermediate_size=inter, num_shared_experts=shared,
               router_scaling_factor=_field(g, f"{a}.expert_weights_scale", float, 1.0),
               mlp_layer_types=["sparse" if f"blk.{i}.ffn_gate_inp.weight" in routers else "dense"
                                for i in range(trunk)])


def _afmoe_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """AFMoE's config as llama.cpp's afmoe reads a file: sigmoid-gated (the default without the key), the chosen
    experts' scores renormalised (expert_weights_norm: transformers' AFMoE always does; false is refused) and times
    expert_weights_scale, beside expert_shared_count shared ones, after leading_dense_block_count dense layers;
    embeddings times sqrt(hidden) always (mup_enabled); sliding layers by the pattern (every 4th full), whose full
    layers must be every 4th, the ones llama.cpp's graph leaves unrotated (its fixed n_no_rope_layer_step)."""
    a, period = arch.gguf, arch.swa_pattern
    _renormalised_sigmoid(g, arch)
    _sliding_layers(g, arch, cfg, "llama.cpp's afmoe turns the sliding layers by rope.freq_base")
    full = every_nth(period, cfg["num_hidden_layers"])
    if cfg["layer_types"] != ["full_attention" if f else "sliding_attention" for f in full]:
        raise FormatError(g.path, f"{a}.attention.sliding_window_pattern", f"full layers other than every {period}th: "
                                                                           f"llama.cpp's afmoe leaves every {period}th "
                                                                           "layer unrotated, the full ones in AFMoE")
    cfg.update(num_experts=cfg.pop("num_local_experts"),
               moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int),
               num_shared_experts=_field(g, f"{a}.expert_shared_count", int),
               num_dense_layers=_field(g, f"{a}.leading_dense_block_count", int, 0),
               route_scale=_field(g, f"{a}.expert_weights_scale", float, 1.0), route_norm=True, mup_enabled=True,
               global_attn_every_n_layers=period)


def _renormalised_sigmoid(g: GGUFModel, arch: GGUFArch) -> None:
    """Hy3's and AFMoE's router as llama.cpp reads it: sigmoid-gated (the default without the key), the chosen
    experts' scores renormalised (expert_weights_norm, which transformers' HYV3 and AFMoE always do: false or missing
    is refused)."""
    a = arch.gguf
    _gated(g, arch, SIGMOID_GATING, SIGMOID_GATING)
    if _field(g, f"{a}.expert_weights_norm", bool, False) is not True:
        raise FormatError(g.path, f"{a}.expert_weights_norm", "false or missing: llama.cpp then leaves the chosen "
                                                              f"experts' scores unnormalised, which {arch.hf_class} "
                                                              "never does")


def _ernie_moe_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """ERNIE 4.5's experts as Ernie4_5_MoeConfig says them, as llama.cpp's
    ernie4_5-moe graph runs them: from leading_dense_block_count (0 without
    the key) every interleave_moe_layer_step-th layer to the last; softmax
    probabilities chosen with exp_probs_b and renormalised; the shared
    experts expert_shared_feed_forward_length wide in all (none without the
    key, as llama.cpp reads it), a whole number of experts' width."""
    a = arch.gguf
    n, inter = cfg.pop("num_local_experts"), _field(g, f"{a}.expert_feed_forward_length", int)
    shared = _field(g, f"{a}.expert_shared_feed_forward_length", int, 0)
    if inter < 1 or shared < 0 or shared % inter:
        raise FormatError(g.path, f"{a}.expert_shared_feed_forward_length", f"{shared}: the shared experts' width must "
                                                                            f"be a whole number of experts' ({inter})")
    count = _field(g, f"{a}.expert_shared_count", int, shared // inter)
    if count != shared // inter:
        raise FormatError(g.path, f"{a}.expert_shared_count", f"{count}, but the shared width {shared} is "
                                                              f"{shared // inter} experts of {inter}")
    cfg.update(moe_num_experts=n, moe_k=cfg.pop("num_experts_per_tok"), moe_intermediate_size=inter,
               moe_num_shared_experts=count, moe_layer_interval=_field(g, f"{a}.interleave_moe_layer_step", int),
               moe_layer_start_index=_field(g, f"{a}.leading_dense_block_count", int, 0), moe_layer_end_index=-1)
    if cfg["moe_layer_interval"] < 1:
        raise FormatError(g.path, f"{a}.interleave_moe_layer_step", f"{cfg['moe_layer_interval']}: must be at least 1")


def _conv_layers(g: GGUFModel, arch: GGUFArch) -> list[bool]:
    """LFM2's layers that convolve, Granite 4's that run Mamba2 ([] where every layer attends):
    attention.head_count_kv, one per block, 0 where a layer convolves, the KV heads of the attention layers (all
    the same) elsewhere."""
    key = f"{arch.gguf}.attention.head_count_kv"
    per = g.fields.get(key)
    if not isinstance(per, list):
        return []
    blocks = _field(g, f"{arch.gguf}.block_count", int)
    heads = {v for v in per if v}
    if (len(per) != blocks or any(type(v) is not int or v < 0 for v in per) or len(heads) != 1):
        raise FormatError(g.path, key, f"{per!r:.60}: expected {blocks} counts, one per block (0 where it "
                                       "convolves), the attention blocks' all the same")
    return [v == 0 for v in per]


def _linear_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Qwen3.5's layers as Qwen3_5TextConfig says them: which are gated DeltaNet (attention.recurrent_layers, else
    all but every full_attention_interval-th), its heads and dims from the ssm.* keys, and the value heads in the
    order llama.cpp's converter writes them (linear_value_head_order "tiled", which the decoder reads as it is;
    Qwen3-Next's grouped, Hugging Face's).
    Text positions turn its interleaved MRoPE as one RoPE (_text_mrope)."""
    a, blocks = arch.gguf, cfg["num_hidden_layers"]
    # (the multi-token prediction blocks after the last: kept beside the model as mtp.*, _sources)
    mtp = _field(g, f"{a}.nextn_predict_layers", int, 0)
    if not 0 <= mtp < blocks:
        raise FormatError(g.path, f"{a}.nextn_predict_layers", f"{mtp} of {blocks} blocks (block_count)")
    n = cfg["num_hidden_layers"] = blocks - mtp
    if mtp:
        cfg["mtp_num_hidden_layers"] = mtp
    recurrent = g.fields.get(f"{a}.attention.recurrent_layers")
    if recurrent is None:
        step = _field(g, f"{a}.full_attention_interval", int, 4)
        recurrent = [(i + 1) % step != 0 and i < n for i in range(blocks)] if step >= 1 else None
    if (not isinstance(recurrent, list) or len(recurrent) != blocks or not all(type(r) is bool for r in recurrent)
            or any(recurrent[n:])):
        raise FormatError(g.path, f"{a}.attention.recurrent_layers", f"{recurrent!r:.60}: expected {blocks} booleans, "
                                                                     "one per block (the MTP blocks' false)")
    recurrent = recurrent[:n]
    k_heads, v_heads = _field(g, f"{a}.ssm.group_count", int), _field(g, f"{a}.ssm.time_step_rank", int)
    inner = _field(g, f"{a}.ssm.inner_size", int)
    if k_heads < 1 or v_heads < 1 or v_heads % k_heads or inner < 1 or inner % v_heads:
        raise FormatError(g.path, f"{a}.ssm.inner_size", f"{inner} over {v_heads} value heads (ssm.time_step_rank) "
                                                         f"and {k_heads} key heads (ssm.group_count): expected whole "
                                                         "heads, value heads a multiple of key heads")
    sections = _text_mrope(g, arch)
    cfg.update(layer_types=["linear_attention" if r else "full_attention" for r in recurrent],
               linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
               linear_key_head_dim=_field(g, f"{a}.ssm.state_size", int), linear_value_head_dim=inner // v_heads,
               linear_conv_kernel_dim=_field(g, f"{a}.ssm.conv_kernel", int),
               full_attention_interval=_field(g, f"{a}.full_attention_interval", int, 4),
               **({} if arch.hf_class in delta_net.GROUPED_IN_GGUF else {delta_net.ORDER_KEY: "tiled"}))
    if sections:  # (transformers' Qwen3_5TextRotaryEmbedding reads its three)
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                  "partial_rotary_factor": cfg["partial_rotary_factor"], "mrope_section": sections[:3]}


def _text_mrope(g: GGUFModel, arch: GGUFArch) -> list[int]:
    """The file's MRoPE sections (Qwen3.5's, Qwen3-VL's; [] without the key): text positions are the same on the
    first three, which then turn as one RoPE; a fourth section (positions 0 in llama.cpp's text batches) would not,
    and is refused."""
    a = arch.gguf
    sections = g.fields.get(f"{a}.rope.dimension_sections", [])
    if not isinstance(sections, list) or any(type(v) is not int for v in sections) or any(sections[3:]):
        raise FormatError(g.path, f"{a}.rope.dimension_sections", f"{sections!r:.60}: a fourth section turns by "
                                                                  "another position than a text token's")
    return sections


def _llama4_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Llama 4 as llama.cpp's llama4 graph runs it, which no key but the
    experts' period and width says: chunks of 8192 positions on the layers
    it turns (every 4th unturned: nope_step), the unturned layers' query
    temperature (0.1 per power step of 8192 positions), q and k normed
    unless the model has 128 experts (Maverick); feed_forward_length the
    dense layers' width."""
    a, n = arch.gguf, cfg["num_hidden_layers"]
    step = _field(g, f"{a}.interleave_moe_layer_step", int)
    if not 1 <= step <= n:
        raise FormatError(g.path, f"{a}.interleave_moe_layer_step", f"{step}: expected 1..{n} (block_count)")
    cfg.update(intermediate_size_mlp=cfg["intermediate_size"],
               intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int),
               interleave_moe_layer_step=step, moe_layers=[i for i in range(n) if (i + 1) % step == 0],
               attention_chunk_size=8192, layer_types=["full_attention" if not r else "chunked_attention"
                                                       for r in cfg["no_rope_layers"]],
               attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
               use_qk_norm=cfg["num_local_experts"] != 128)


def _gated(g: GGUFModel, arch: GGUFArch, want: int, default: int | None) -> None:
    """Refuse a router the file gates otherwise than ``want`` (SIGMOID_GATING
    or SOFTMAX_GATING; ``default``: what llama.cpp's graph takes where the key
    is missing; None: required)."""
    key = f"{arch.gguf}.expert_gating_func"
    gating = _field(g, key, int, default)
    if gating != want:
        kind = "sigmoid" if want == SIGMOID_GATING else "softmax"
        raise FormatError(g.path, key, f"{gating}: {arch.hf_class}'s router is {kind}-gated ({want}), and it has no "
                                       "other")


def _v3_router(g: GGUFModel, a: str) -> dict[str, Any]:
    """DeepSeek-V3's router keys (GLM-4.5's, Nemotron 3's) as its config says them, with what llama.cpp's graphs do
    where a key is missing: weights neither renormalised nor scaled (a scale of 0 scales nothing), one group."""
    groups = _field(g, f"{a}.expert_group_count", int, 0) or 1
    return dict(norm_topk_prob=bool(g.fields.get(f"{a}.expert_weights_norm", False)),
                routed_scaling_factor=_field(g, f"{a}.expert_weights_scale", float) if g.fields.get(
                    f"{a}.expert_weights_scale") else 1.0,
                n_group=groups, topk_group=_field(g, f"{a}.expert_group_used_count", int, 0) or groups)


def _v3_router_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """DeepSeek-V3's router and layers (GLM-4.5's, GLM-4.7-Flash's, Solar
    Open's, dots.llm1's; and DeepSeek-V2's softmax one) as their configs say them, with what
    llama.cpp's graphs do where a key is missing: no leading dense layer,
    sigmoid gating (glm4moe; deepseek2 as its loader decides), weights
    neither renormalised nor scaled, one group. The multi-token prediction
    layers are counted in block_count; num_hidden_layers is the trunk
    (transformers' count)."""
    a = arch.gguf
    v2 = arch.hf_class == "DeepseekV2ForCausalLM"  # (_arch_of: softmax-gated)
    mistral4 = arch.hf_class == "Mistral4ForCausalLM"
    if mistral4:  # (softmax, llama.cpp's default where the key is missing)
        _gated(g, arch, SOFTMAX_GATING, SOFTMAX_GATING)
    elif not v2:  # (dots1: required, as llama.cpp's graph has no default)
        _gated(g, arch, SIGMOID_GATING, SIGMOID_GATING if a == "glm4moe" else None if a == "dots1" else
               _deepseek2_gating(g))
    nextn, trunk = _mtp_trunk(g, a, cfg)
    names = {t.name for t in g.tensors}
    cfg.update(n_routed_experts=cfg.pop("num_local_experts"), num_hidden_layers=trunk, num_nextn_predict_layers=nextn,
               moe_intermediate_size=_field(g, f"{a}.expert_feed_forward_length", int),
               n_shared_experts=_field(g, f"{a}.expert_shared_count", int, None if a == "dots1" else 0),
               first_k_dense_replace=_field(g, f"{a}.leading_dense_block_count", int, 0), **_v3_router(g, a))
    if (v2 or mistral4) and cfg["topk_group"] < cfg["n_group"]:
        raise FormatError(g.path, f"{a}.expert_group_used_count", f"{cfg['topk_group']} of {cfg['n_group']} groups "
                                                                  "with softmax gating: llama.cpp ranks groups by "
                                                                  "their best two, DeepSeek-V2 by its best one, and "
                                                                  "the decoder groups sigmoid-scored experts alone")
    if arch.hf_class == "SolarOpenForCausalLM":  # (no q/k norms, no MTP layers: their tensors and key are not its)
        if cfg["first_k_dense_replace"]:
            raise FormatError(g.path, f"{a}.feed_forward_length", f"is missing, and leading_dense_block_count makes "
                                                                  f"{cfg['first_k_dense_replace']} layers dense: they "
                                                                  "have no width")
        cfg.pop("num_nextn_predict_layers")
        cfg.update(intermediate_size=None, attention_bias="blk.0.attn_q.bias" in names)
        return
    if a == "glm4moe":
        cfg.update(use_qk_norm="blk.0.attn_q_norm.weight" in names, attention_bias="blk.0.attn_q.bias" in names)
        return
    if mistral4:
        if nextn:
            raise FormatError(g.path, f"{a}.nextn_predict_layers", f"{nextn}: Mistral 4 has no multi-token "
                                                                   "prediction layers")
        cfg.pop("num_nextn_predict_layers")
        cfg.update(n_group=1, topk_group=1)  # (every group used: one)
        return
    if a == "dots1":  # (the Hub's keys; no MTP layers: their key is not dots1's; llama.cpp's dots1 slides no window)
        cfg.pop("num_nextn_predict_layers")
        cfg.update(scoring_func="sigmoid", topk_method="noaux_tc", sliding_window=None)
        return
    cfg.update(scoring_func="softmax" if v2 else "sigmoid", topk_method="greedy" if v2 else "noaux_tc")
    if arch.hf_class == "Glm4MoeLiteForCausalLM":  # its dense layers per layer; first_k_dense_replace as the Hub's
        first = cfg["first_k_dense_replace"]
        cfg["mlp_layer_types"] = ["dense" if i < first else "sparse" for i in range(cfg["num_hidden_layers"])]
        return
    cfg.pop("num_nextn_predict_layers")  # (llama.cpp's converter drops DeepSeek's MTP layer; none is read)
    if v2 and cfg["norm_topk_prob"]:
        raise FormatError(g.path, f"{a}.expert_weights_norm", "true with softmax gating: DeepSeek-V2's router never "
                                                              "renormalises (transformers' DeepseekV2 has no such "
                                                              "option)")
    if v2:
        cfg.update(n_group=None, topk_group=None)


def _every_layer_dense(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """A deepseek2 file without experts (Youtu-LLM's): llama.cpp's graph runs a dense MLP only in the first
    leading_dense_block_count layers, so it must name every one (without it, llama.cpp's loader asks for experts
    the file has none of). The expert keys its loader requires beside them are read by nothing."""
    a = arch.gguf
    dense = _field(g, f"{a}.leading_dense_block_count", int, 0)
    if dense != cfg["num_hidden_layers"]:
        raise FormatError(g.path, f"{a}.leading_dense_block_count", f"{dense} of {cfg['num_hidden_layers']} layers "
                                                                    "dense, and the file has no experts for the rest")


def _layer_types(g: GGUFModel, arch: GGUFArch, layers: int) -> list[str]:
    """Each layer's attention as llama.cpp's load_swa_pattern reads it: the
    file's ``attention.sliding_window_pattern``, a boolean per layer or a
    period (every period-th layer full), else the architecture's period."""
    a = arch.gguf
    pattern = g.fields.get(f"{a}.attention.sliding_window_pattern", arch.swa_pattern)
    if type(pattern) is int and pattern >= 1:
        swa = sliding_by_period(pattern, layers)
    elif isinstance(pattern, list) and len(pattern) == layers and all(type(x) is bool for x in pattern):
        swa = pattern
    else:
        raise FormatError(g.path, f"{a}.attention.sliding_window_pattern", f"expected a period or {layers} "
                                                                           f"booleans, got {pattern!r}")
    return ["sliding_attention" if w else "full_attention" for w in swa]


def _gemma_config(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any]) -> None:
    """Gemma's config keys, as llama.cpp's gemma, gemma2 and gemma3 graphs compute:
    GELU (gemma: that alone); sliding layers where the file has a window (gemma2: always, 4096
    without the key), by its pattern; the attention scale llama.cpp derives
    (1/sqrt(head_dim); 1/sqrt(hidden/heads) for the 27B); gemma3's sliding
    layers' RoPE base (``rope.freq_base_swa``, 10000 without it), gemma2's
    one base and its soft-caps (llama.cpp's 50 and 30 without the keys)."""
    a = arch.gguf
    if DECODER_ARCHS[arch.hf_class].gemma == 1:  # (GemmaConfig's keys: hidden_act, no windows, no scalar)
        return
    del cfg["hidden_act"]
    layers = cfg["num_hidden_layers"]
    window = _field(g, f"{a}.attention.sliding_window", int, arch.swa_window)
    types = _layer_types(g, arch, layers) if window > 0 else ["full_attention"] * layers
    scalar = attention_scalar(arch, cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], layers)
    cfg.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=scalar, layer_types=types,
               sliding_window=window if window > 0 else None)
    if not DECODER_ARCHS[arch.hf_class].softcaps:
        cfg.update(rope_local_base_freq=_field(g, f"{a}.rope.freq_base_swa", float, 10000.0),
                   attn_logit_softcapping=None, final_logit_softcapping=None)
        return
    _one_rope_base(g, arch, cfg, f"{arch.hf_class} rotates every layer by one base")
    cfg.update(attn_logit_softcapping=_field(g, f"{a}.attn_logit_softcapping", float, 50.0),
               final_logit_softcapping=_field(g, f"{a}.final_logit_softcapping", float, 30.0))


def _sliding_layers(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], why: str, window: int | None = None) -> None:
    """config.sliding_window and layer_types as llama.cpp reads a hybrid
    model (OLMo 3, EXAONE 4, Cohere 2): the file's window (``window``
    without it; required where None), its pattern or the architecture's
    period, and one RoPE base for every layer (``why``: _one_rope_base)."""
    a = arch.gguf
    w = _field(g, f"{a}.attention.sliding_window", int, window)
    if w < 1:
        raise FormatError(g.path, f"{a}.attention.sliding_window", "0: expected a window of at least 1 position")
    cfg.update(sliding_window=w, layer_types=_layer_types(g, arch, cfg["num_hidden_layers"]))
    _one_rope_base(g, arch, cfg, why)


def _one_rope_base(g: GGUFModel, arch: GGUFArch, cfg: dict[str, Any], why: str) -> None:
    """Refuse a ``rope.freq_base_swa`` other than ``rope.freq_base`` where
    the model the import builds has one base (``why``: where that comes from)."""
    a = arch.gguf
    if _field(g, f"{a}.rope.freq_base_swa", float, cfg["rope_theta"]) != cfg["rope_theta"]:
        raise FormatError(g.path, f"{a}.rope.freq_base_swa", f"differs from rope.freq_base; {why}")


SCALE_SUFFIXES = tuple(NVFP4_SCALES.values())  # beside an NVFP4 weight X.weight: X.scale, X.input_scale


def _tensor_scales(g: GGUFModel) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """{weight name: (scale, input scale)} of the NVFP4 weights: the float32
    ``X.scale`` and ``X.input_scale`` llama.cpp's converter writes beside an
    NVFP4 ``X.weight`` (ModelOpt's weight_scale_2 and input_scale), one value
    per matrix ([1]) or per expert of a stack ([experts]); ones and None
    where the file has none (the converter leaves out a scale of 1). A
    scale beside any other weight, or of another shape or type, or not a
    positive finite number, is refused: llama.cpp would multiply any weight
    by one, and only nvfp4 carries one here."""
    by_name = {t.name: t for t in g.tensors}
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for t in g.tensors:
        suffix = next((x for x in SCALE_SUFFIXES if t.name.endswith(x)), None)
        if suffix is None:
            continue
        where = f"tensor {t.name!r}"
        w = by_name.get(t.name[:-len(suffix)] + ".weight")
        if w is None or w.ggml_type != "NVFP4":
            raise FormatError(g.path, where, f"scales {'no weight' if w is None else f'a {w.ggml_type} weight'}; "
                                             "only an NVFP4 weight's scales are read here")
        n = w.shape[0] if len(w.shape) == 3 else 1
        if t.ggml_type != "F32" or list(t.shape) != [n]:
            raise FormatError(g.path, where, f"{t.ggml_type} {t.shape}; the scales of {w.name} {w.shape} are F32 [{n}]")
        v = g.rows(t, 0, 1, t.nbytes)[0].view("<f4").astype(np.float32)
        if not (np.isfinite(v) & (v > 0)).all():
            raise FormatError(g.path, where, f"holds {v[~(np.isfinite(v) & (v > 0))][0]}; scales must be positive "
                                             "and finite")
        scale, inp = out.get(w.name, (np.ones(n, np.float32), None))
        out[w.name] = (v, inp) if suffix == NVFP4_SCALES["tensor_scale"] else (scale, v)
    return out


def _scaled(g: GGUFModel, p: _Tensor, scales: dict[str, tuple[np.ndarray, np.ndarray | None]],
            e: int | None = None) -> _Tensor:
    """p with its sources' NVFP4 scales: expert e's of a stack, or (None)
    the one scale of the whole tensor, which a stack kept whole (or a
    gate/up pair joined into one) must have throughout."""
    def one(v: np.ndarray | None, t: GGUFTensor) -> float | None:
        if v is None:
            return None
        if e is not None and len(v) > 1:
            return float(v[e])
        if (v != v[0]).any():
            raise FormatError(g.path, f"tensor {t.name!r}", f"has a scale per expert, but {p.name} keeps them as one "
                                                            "tensor under one scale")
        return float(v[0])
    got = {(one(sc, t), one(inp, t)) for t in p.sources for sc, inp in [scales.get(t.name, (None, None))]}
    if len(got) > 1:
        raise FormatError(g.path, f"tensor {p.src.name!r}", f"is joined into {p.name} with a tensor under other "
                                                            "NVFP4 scales; they cannot share one")
    sc, inp = got.pop()
    p.tensor_scale, p.input_scale = 1.0 if sc is None else sc, inp
    return p


def _sources(g: GGUFModel, cfg: dict[str, Any]) -> list[_Tensor]:
    """Each IEBIN tensor the file holds, by where its rows come from (mode
    not yet chosen): one-to-one tensors, each expert of a ``ffn_*_exps``
    stack (Mixtral, Qwen3-MoE: one matrix per expert), gpt-oss's gate
    and up stacks interleaved row by row into ``gate_up_proj``, and phi3's
    fused tensors' row ranges as the matrices they hold."""
    arch = _arch_of(g)
    by_name = {t.name: t for t in g.tensors}
    scales = _tensor_scales(g)
    stacks = {v: k for k, v in arch.experts.items()}
    paired = {g2: (hf, k) for hf, pair in arch.paired.items() for k, g2 in enumerate(pair)}
    out: list[_Tensor] = []
    for t in g.tensors:
        where = f"tensor {t.name!r}"
        m = re.fullmatch(r"blk\.(\d{1,9})\.(.+)", t.name)
        layer, suffix = (m.group(1), m.group(2)) if m else ("", "")
        name = mtp_extra_hf_name(arch, t.name, cfg["num_hidden_layers"]) or hf_layer_name(arch, t.name)
        if t.name == "rope_freqs.weight" or t.name.endswith(SCALE_SUFFIXES):
            continue  # read into the config's rope_scaling (build_config); an NVFP4 weight's scales (_scaled)
        if m and (parts := _converter_fused(g, arch, cfg, t, int(layer), suffix)) is not None:
            out.extend(parts)
        elif name is not None:
            if len(t.shape) > 2 and not name.endswith(EXPERT_STACKS):
                raise FormatError(g.path, where, f"has {len(t.shape)} dimensions; expected a matrix or vector")
            # (a convolution's taps: [channels, 1, taps] as Hugging Face keeps them, the same bytes)
            shape = [t.shape[0], 1, t.shape[1]] if name.endswith(CONV_TAPS) and len(t.shape) == 2 else None
            # (Mamba2's A, D, gated norm: 1-D, the same bytes; Mamba 1's A_log is [channels, state] in both)
            flat = name.endswith(FLATTENED) and not DECODER_ARCHS[arch.hf_class].mamba1
            out.append(_Tensor(t, name, "", None, "", shift=norm_shift(arch, name),
                               shape_=[int(np.prod(t.shape))] if flat else shape, log_neg=name.endswith(DECAY_RATES),
                               elementwise=flat))
        elif suffix in stacks:
            if len(t.shape) != 3:
                raise FormatError(g.path, where, f"an expert stack must be [experts, rows, cols], got {t.shape}")
            n_exp, rows = t.shape[0], t.shape[1]
            for e in range(n_exp):
                out.append(_Tensor(t, f"model.layers.{int(layer)}.{stacks[suffix].format(e=e)}", "",
                                   np.arange(e * rows, (e + 1) * rows), "", shape_=list(t.shape[1:]), expert=e))
        elif suffix in arch.fused or suffix in arch.fused_legacy:
            if len(t.shape) != 2:
                raise FormatError(g.path, where, f"shape {t.shape}: expected a matrix")
            fused = arch.fused.get(suffix) or arch.fused_legacy[suffix]
            runs = fused_tensors.row_runs(cfg, fused, t.shape[0], f"{g.path}: {where}")
            for k, hf in enumerate(fused_tensors.FUSED[fused]):  # whole rows: a quantized part keeps its bytes
                rows = fused_tensors.part_index(runs, k)
                out.append(_Tensor(t, f"model.layers.{int(layer)}.{hf}", "", rows, "", shape_=[len(rows), t.shape[1]]))
        elif arch.mla and suffix in MLA_KV_B[1:]:
            if suffix == MLA_KV_B[2]:
                continue  # made with attn_k_b
            out.append(_mla_kv_b(g, t, by_name.get(f"blk.{layer}.{MLA_KV_B[2]}"), int(layer), cfg))
        elif t.name in ("rope_factors_long.weight", "rope_factors_short.weight") and arch.gguf == "phi3":
            continue  # read into the config's rope_scaling (_phi3_config)
        elif suffix in paired:
            hf, k = paired[suffix]
            if k == 1:
                continue  # made with its even partner
            odd = by_name.get(f"blk.{layer}.{arch.paired[hf][1]}")
            if odd is None or odd.shape != t.shape or odd.ggml_type != t.ggml_type:
                raise FormatError(g.path, where, f"needs blk.{layer}.{arch.paired[hf][1]} of the same shape and type")
            n_exp, rows = t.shape[0], int(np.prod(t.shape[1:-1])) if len(t.shape) == 3 else t.shape[1]
            # row (e, i) of source k is row k n_exp rows + e rows + i of the sources' rows concatenated
            order = _pair_order(n_exp, rows, rows, n_exp * rows, arch.halves)
            shape = [n_exp, 2 * rows, *t.shape[2:]]
            out.append(_Tensor(t, f"model.layers.{int(layer)}.{hf}", "", order, "", shape_=shape, srcs=[t, odd],
                               elementwise=len(t.shape) == 2))
        else:
            raise FormatError(g.path, where, f"has no Hugging Face counterpart for {cfg['architectures'][0]}; "
                                             "this tensor cannot be carried over")
    out += _keyed(g, arch, cfg["num_hidden_layers"])
    for p in out:  # (Qwen3.5's MTP layers: beside the model); NVFP4 scales (kv_b_proj's: per source, _mla_floats)
        p.name = beside(arch, p.name, cfg["num_hidden_layers"])
        if p.mla:
            p.source_scales = tuple(_scaled(g, _source(p, t), scales).tensor_scale for t in p.sources)
        else:
            _scaled(g, p, scales, p.expert)
    first: dict[str, str] = {}
    for p in out:  # e.g. a phi3 layer with attn_qkv and attn_q both
        if first.setdefault(p.name, p.src.name) != p.src.name:
            raise FormatError(g.path, f"tensor {p.src.name!r}", f"holds {p.name}, which tensor "
                                                                f"{first[p.name]!r} holds too")
    return out


def _keyed(g: GGUFModel, arch: GGUFArch, layers: int) -> list[_Tensor]:
    """Each layer's tensors llama.cpp keeps as keys (GGUFArch.layer_keys: Apertus's xIELU parameters), float32 as
    its converter stored them: an array of one value per layer, or one value for every layer (llama.cpp's
    get_key_or_arr reads either)."""
    out = []
    for hf, (key, shape) in arch.layer_keys.items():
        v = g.fields.get(key)
        if v is None:
            raise FormatError(g.path, key, f"is missing; llama.cpp's {arch.gguf} requires it")
        values = v if isinstance(v, list) else [v] * layers
        if len(values) != layers or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in values):
            raise FormatError(g.path, key, f"{v!r:.60}: expected a number or an array of {layers} numbers (one per "
                                           "layer)")
        arr = np.asarray(values, np.float32)
        if not np.isfinite(arr).all():
            raise FormatError(g.path, key, f"holds {arr[~np.isfinite(arr)][0]} (layer "
                                           f"{int(np.argmin(np.isfinite(arr)))}); expected finite values")
        src = GGUFTensor(key, "F32", list(shape), 0, 4)
        out += [_Tensor(src, f"model.layers.{i}.{hf}", "", None, "", shape_=list(shape), keyed=arr[i:i + 1])
                for i in range(layers)]
    return out


def _mla_kv_b(g: GGUFModel, k_b: GGUFTensor, v_b: GGUFTensor | None, layer: int, cfg: dict[str, Any]) -> _Tensor:
    """kv_b_proj [heads × (nope + v), latent] as llama.cpp splits it (MLA_KV_B): attn_k_b [heads, latent, nope],
    each head's key rows transposed, and attn_v_b [heads, v, latent], its value rows."""
    h, nope, v, lat = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"))
    for t, want in ((k_b, [h, lat, nope]), (v_b, [h, v, lat])):
        if t is None or list(t.shape) != want:
            name = k_b.name.replace(MLA_KV_B[1], MLA_KV_B[2]) if t is None else t.name
            raise FormatError(g.path, f"tensor {name!r}", f"{'is missing' if t is None else f'shape {t.shape}'}; "
                                                          f"latent attention needs {want}")
    return _Tensor(k_b, f"model.layers.{layer}.{MLA_KV_B[0]}", "", None, "", shape_=[h * (nope + v), lat],
                   srcs=[k_b, v_b], mla=(h, nope, v))


def _source(p: _Tensor, t: GGUFTensor) -> _Tensor:
    """kv_b_proj's source ``t`` read on its own (_mla_floats)."""
    return replace(p, src=t, srcs=None, order=None, mla=None, source_scales=())


def _mla_floats(g: GGUFModel, p: _Tensor) -> np.ndarray:
    """kv_b_proj's rows (float32) from its two sources, whole (a layer's: small)."""
    h, nope, v = p.mla
    k_b, v_b = (_floats(g, replace(_source(p, t), tensor_scale=s), 0,
                        g.rows(t, 0, math.prod(t.shape[:-1]), t.nbytes // math.prod(t.shape[:-1])))
                for t, s in zip(p.sources, p.source_scales, strict=True))
    lat = p.shape[-1]
    k = k_b.reshape(h, lat, nope).transpose(0, 2, 1)
    return np.concatenate([k, v_b.reshape(h, v, lat)], axis=1).reshape(-1, lat)


def plan_tensors(g: GGUFModel, cfg: dict[str, Any], dtype: str | None, dequantize_all: bool) -> list[_Tensor]:
    """Every output tensor, in name order, with how its bytes are made
    (``mode``: copied, cast to ``dtype``, or dequantized to ``dtype`` or
    f32; ``dequantize_all``: no block is kept) and its rows' order."""
    plans = []
    for p in _sources(g, cfg):
        t = p.src
        where = f"tensor {t.name!r}"
        if p.keyed is not None:  # (from a key: float32 values)
            p.dtype, p.mode = dtype or "f32", "keys"
            plans.append(p)
            continue
        if p.mla:  # assembled from its sources' values: floats of theirs where they share one, else f32
            kinds = {s.ggml_type for s in p.sources}
            p.dtype = dtype or (FLOATS[t.ggml_type] if len(kinds) == 1 and t.ggml_type in FLOATS else "f32")
            p.mode = "dequant"
            plans.append(p)
            continue
        if t.ggml_type in COPIED and len(p.shape) >= 2 and not p.elementwise and not dequantize_all:
            out, mode = COPIED[t.ggml_type], "copy"
        elif t.ggml_type in FLOATS:
            out = dtype or FLOATS[t.ggml_type]
            mode = ("dequant" if p.shift or p.log_neg  # (values changed: as floats)
                    else "copy" if out == FLOATS[t.ggml_type] else "cast")
        else:
            row_bytes = t.nbytes // (math.prod(t.shape[:-1]) if len(t.shape) >= 2 else 1)
            try:
                dequantize_blocks(g.rows(t, 0, 1, row_bytes)[0], t.ggml_type)
            except (NotImplementedError, KeyError, ValueError):
                raise FormatError(g.path, f"{where} type", f"ggml type {t.ggml_type} cannot be converted "
                                                           "(gguf.quants cannot dequantize it)") from None
            out, mode = dtype or "f32", "dequant"
        order = row_order(g, t, cfg) if p.order is None else p.order
        if order is not None and len(p.shape) == 1 and mode == "dequant":
            raise FormatError(g.path, f"{where} type", "a quantized q/k bias cannot be un-interleaved")
        if p.elementwise and mode == "dequant" and t.ggml_type not in FLOATS:
            raise FormatError(g.path, f"{where} type", "a quantized expert bias cannot be interleaved")
        p.dtype, p.mode, p.order = out, mode, order
        plans.append(p)
    return sorted(plans, key=lambda p: natural_key(p.name))


def aux_files(g: GGUFModel, cfg: dict[str, Any]) -> dict[str, bytes]:
    """config.json (``cfg``), and tokenizer.json and tokenizer_config.json
    rebuilt from the vocabulary and the chat template (gguf_tokenizer.py)."""
    aux = {"config.json": (json.dumps(cfg, indent=2) + "\n").encode(),
           "tokenizer.json": guarded(g.path, "rebuilding the tokenizer", tokenizer_json, g.fields, g.path)}
    if (tok_cfg := tokenizer_config_json(g.fields, g.path)) is not None:
        aux["tokenizer_config.json"] = tok_cfg
    return aux


def tensor_shapes(g: GGUFModel) -> dict[str, tuple[str, list[int]]]:
    """{HF name: (float dtype, shape)} of the tensors a manifest can select:
    quantized tensors count as the f32 they dequantize to."""
    return {p.name: (FLOATS.get(p.src.ggml_type, "f32"), p.shape) for p in _sources(g, build_config(g))}


class GGUFRows:
    """Float rows of a GGUF file's tensors under their IEBIN names and layout
    (q/k un-interleaved, experts split, gpt-oss's pair merged), dequantized
    by gguf.quants: what q4-manifest --target-bpw measures candidates on."""

    def __init__(self, g: GGUFModel):
        self.g = g
        cfg = build_config(g)
        self.plans = {p.name: p for p in plan_tensors(g, cfg, "f32", True)}

    def shape(self, name: str) -> list[int]:
        return self.plans[name].shape

    def rows(self, name: str, rows: list[int]) -> np.ndarray:
        p = self.plans[name]
        return _floats(self.g, p, 0, _gather(self.g, p, np.asarray(rows))).reshape(len(rows), -1)


def _qtype(name: str):
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType[name]


def dequantize_blocks(part: np.ndarray, ggml_type: str) -> np.ndarray:
    """Rows of blocks of a ggml type as float32: gguf.quants' dequantization
    (the reference), or, for a type of ours it lacks (Q1_0: gguf-py knows its
    size, not its values), our own decoder's, which the tests hold to
    llama.cpp's (tests/test_q1_0.py)."""
    from gguf.quants import dequantize

    try:
        return dequantize(part, _qtype(ggml_type)).astype(np.float32)
    except NotImplementedError:
        if ggml_type not in COPIED:
            raise
        rows = part.shape[0] if part.ndim > 1 else 1
        s = SCHEMES[COPIED[ggml_type]]
        cols = part.size // rows // s.block_bytes * s.block_elems
        return s.dequantize(np.ascontiguousarray(part).reshape(-1), rows, cols, s.params_from({}, cols))


def file_type_name(g: GGUFModel) -> str | None:
    """llama.cpp's ``general.file_type`` by name (MOSTLY_Q4_1, ...)."""
    from gguf.constants import LlamaFileType

    v = g.fields.get("general.file_type")
    if type(v) is not int:
        return None
    try:
        return LlamaFileType(v).name
    except ValueError:
        return f"unknown ({v})"


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str | None = None,
                 overwrite: bool = False, progress: Progress | None = None, dequantize_all: bool = False,
                 manifest: Manifest | None = None, force: bool = False,
                 imatrix: str | os.PathLike | None = None, checksum: str = checksums.DEFAULT,
                 allow_nonfinite: bool = False, text_only: bool = False) -> ConvertResult:
    """Import ``gguf_path`` into ``out_dir`` (see the module docstring).
    ``dequantize_all``: no block is kept, every tensor becomes a float
    (``dtype``, f32 by default): the float reference of a quantized file.
    ``manifest``: the tensors it selects are quantized again from their
    dequantized values (q4_manifest.json, as hf-to-iebin --q4-map), weighted
    by ``imatrix`` (default: the manifest's) where it has an entry.
    ``checksum``: the digest algorithm recorded (formats/checksums.py).
    A float tensor holding NaN or ±inf is refused unless ``allow_nonfinite``
    (a block's scale never is). ``text_only``: a multimodal file's other
    modalities are left out (ollama_layout), else refused."""
    progress = progress or Progress()
    check_dtype(dtype)
    g, read = open_model(gguf_path, text_only)
    cfg = build_config(g)
    plans = plan_tensors(g, cfg, dtype, dequantize_all)
    warnings: list[str] = []
    importance: dict = {}
    if manifest is not None:
        shapes = tensor_shapes(g)
        qplan = plan(manifest, shapes, force=force)
        warnings = qplan.warnings
        for p in plans:
            sel = qplan.quantize.get(p.name)
            if sel is not None and not (p.mode == "copy" and p.dtype == sel.scheme):  # same blocks: kept as they are
                p.params = sel
                p.dtype, p.mode = sel.scheme, "quantize"
        requant = {p.name: p.params for p in plans if p.mode == "quantize"}
        importance, iwarn = load_importance(imatrix or manifest.imatrix, requant,
                                            {n: shape for n, (_dt, shape) in shapes.items()})
        warnings = warnings + iwarn
        for p in plans:
            p.importance = importance.get(p.name)
    aux_data = aux_files(g, cfg)
    if g.fields.get("tokenizer.ggml.model") == "gpt2" and pre_name(g.fields) == "default":
        warnings.append("tokenizer.ggml.pre: the file names no pre-tokenizer, so llama.cpp splits text with its "
                        "default regexes (warning that generation quality will suffer), and so does the import; "
                        "the model was trained with its own, which a file made by a recent convert_hf_to_gguf.py names")
    if (unsupported := check_convertible(model_summary(cfg), cfg, {p.name: p.shape for p in plans}, g.path)):
        warnings.append(unsupported)
    out = ArtifactOut(out_dir, overwrite, list(aux_data))
    t0 = time.perf_counter()
    bytes_in = sum(p.in_nbytes for p in plans)
    progress.start("converting", bytes_in + sum(p.stat().st_size for p in g.paths))  # hashed beside the import
    errors: dict[str, QuantError] = {}
    with SourceHashes([(p.name, p) for p in g.paths], progress.advance, checksum) as hashes, out.writing() as staged:
        writer = iebin.IebinWriter(staged, checksum=checksum)
        for p in plans:
            progress.describe(p.name)
            extra = {iebin.QUANT_KEY: p.quant} if p.quant else None
            error = QuantError() if p.mode == "quantize" else None
            if error is not None:
                errors[p.name] = error
            writer.add_tensor(p.name, p.dtype, p.shape, tensor_chunks(g, p, progress, error, allow_nonfinite), p.out_nbytes,
                              extra=extra, error=error)
        aux = writer.stage_aux(aux_data)
        source = {"kind": "gguf", "name": g.path.name, "revision": None, "shards": hashes.records(),
                  "gguf": {"version": g.version, "architecture": g.fields["general.architecture"],
                           "file_type": file_type_name(g), **read.record()}}
        meta = writer.finish(config=cfg, model=model_summary(cfg), source=source,
                             tokenizer_files=out.tokenizer_files, aux_files=aux)
    return ConvertResult(out.dir, len(plans), bytes_in, meta["files"][0]["nbytes"], time.perf_counter() - t0,
                         sum(p.mode in ("cast", "dequant") for p in plans), sum(p.mode == "quantize" for p in plans),
                         warnings, out.stale, kept_blocks=sum(p.mode == "copy" and p.dtype in SCHEMES for p in plans),
                         weighted_tensors=len(importance), errors=errors, read_as=read.describe())


def open_model(path: str | os.PathLike, text_only: bool = False) -> tuple[GGUFModel, Read]:
    """The GGUF model at ``path`` as llama.cpp lays it out (an Ollama blob's layout read as llama.cpp's; with
    ``text_only``, a multimodal file's language model alone: ollama_layout), and how it was read."""
    return as_llamacpp(open_gguf(path), text_only)


def _row_blocks(g: GGUFModel, p: _Tensor, progress: Progress) -> Iterator[tuple[int, np.ndarray]]:
    """(first output row, source bytes [k, row bytes]) in output row order, a few MiB at a time."""
    step = max(1, CHUNK_BYTES // _src_rows(p)[1])
    for r0 in range(0, p.rows, step):
        part = _gather(g, p, slice(r0, min(r0 + step, p.rows)))
        progress.advance(part.nbytes)
        yield r0, part


def _gather(g: GGUFModel, p: _Tensor, sel: slice | np.ndarray) -> np.ndarray:
    """Output rows ``sel`` of ``p`` as source bytes [k, row bytes]: row i of
    the sources' rows concatenated is row i % n of source i // n."""
    n, width = _src_rows(p)
    if p.order is None and isinstance(sel, slice):
        return g.rows(p.sources[0], sel.start, sel.stop, width)
    idx = np.arange(p.rows)[sel] if p.order is None else p.order[sel]
    part = np.empty((len(idx), width), np.uint8)
    for k, t in enumerate(p.sources):
        hit = idx // n == k
        if hit.any():
            part[hit] = g.take_rows(t, idx[hit] % n, width)
    return part


def _src_rows(p: _Tensor) -> tuple[int, int]:
    """(rows of each source, bytes per row) in the units ``p.rows`` counts."""
    t = p.src
    if p.elementwise:
        n = int(np.prod(t.shape))
    elif len(t.shape) >= 2:
        n = int(np.prod(t.shape[:-1]))
    else:
        n = t.shape[0] if p.order is not None else 1
    return n, t.nbytes // n


def _floats(g: GGUFModel, p: _Tensor, r0: int, part: np.ndarray) -> np.ndarray:
    """Source rows as float32 [k, cols] (dequantize_blocks for block types), checked finite,
    less the tensor's shift (in float32: exact for a stored 1 + w of at least 0.5, Sterbenz)."""
    if p.src.ggml_type in FLOATS:
        w = decode_f32(part.tobytes(), FLOATS[p.src.ggml_type]).reshape(part.shape[0], -1)
    else:
        w = dequantize_blocks(part, p.src.ggml_type) * np.float32(p.tensor_scale)
    if not np.isfinite(w).all():
        i = np.unravel_index(int(np.argmin(np.isfinite(w))), w.shape)
        raise FormatError(g.path, f"tensor {p.src.name!r}", f"holds {w[i]} at row {r0 + int(i[0])}"
                                                            f"{' (a non-finite block scale)' if p.src.ggml_type not in FLOATS else ''}")
    if p.log_neg:
        if not (w < 0).all():
            raise FormatError(g.path, f"tensor {p.src.name!r}", f"holds {w[w >= 0].flat[0]}; a decay rate -exp(A_log) "
                                                                "is negative")
        return delta_net.a_log_of(w)
    return w - np.float32(p.shift) if p.shift else w


def _float_rows(g: GGUFModel, p: _Tensor, progress: Progress) -> Iterator[np.ndarray]:
    """The tensor's values as float32 rows in output order, a few MiB at a
    time (latent attention's kv_b_proj whole, assembled from its two
    sources: a layer's is small)."""
    if p.mla:
        progress.advance(p.in_nbytes)
        yield _mla_floats(g, p)
        return
    for r0, part in _row_blocks(g, p, progress):
        yield _floats(g, p, r0, part)


def tensor_chunks(g: GGUFModel, p: _Tensor, progress: Progress, error: QuantError | None = None,
            allow_nonfinite: bool = False) -> Iterator[bytes]:
    """The tensor's output bytes, streamed (a quantized one's predicted loss
    added to ``error``). What is copied or cast is checked finite
    (finite.py) before it is passed on: a float's elements unless
    ``allow_nonfinite``, a block's scales always; what is dequantized was
    checked by ``_floats`` already."""
    if p.mode == "keys":
        progress.advance(p.in_nbytes)
        yield encode_f32(p.keyed, p.dtype)
        return
    if p.mode in ("quantize", "dequant"):
        rows = _float_rows(g, p, progress)
        if p.mode == "quantize":
            yield from (piece.tobytes() for piece in SCHEMES[p.dtype].stream(rows, p.params, p.shape[0], p.name,
                                                                               p.importance, error))
        else:
            yield from (encode_f32(w, p.dtype) for w in rows)
        return
    check = checker({"dtype": p.dtype, "shape": p.shape}, g.path, p.src.name, allow_nonfinite)
    for _r0, part in _row_blocks(g, p, progress):
        out = part.tobytes() if p.mode == "copy" else cast_bytes(part.tobytes(), FLOATS[p.src.ggml_type], p.dtype)
        if check is not None:  # (none: a float's elements with allow_nonfinite)
            check(out)
        yield out
