"""IEBIN -> GGUF v3: an artifact as a file llama.cpp (Ollama, LM Studio) runs.

The inverse of gguf_to_iebin.py, for every architecture the decoder runs,
with llama.cpp's architecture names, tensor names and layouts
(gguf_names.py): q/k rows interleaved for the Llama family's RoPE (whole
rows move, so quantized rows keep their bytes), per-expert matrices
stacked as ``ffn_*_exps``, gpt-oss's interleaved gate/up stack split in
two.

Bytes, by IEBIN dtype:

- every type llama.cpp also has (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k
  q3_k q4_k q5_k q6_k iq1_s iq1_m iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq4_nl iq4_xs mxfp4 nvfp4): copied byte for
  byte (nvfp4's tensor_scale and input_scale as the `.scale` and `.input_scale` tensors after it);
- int4w with f16 scales (or f32 scales that f16 holds exactly): repacked
  losslessly, the symmetric kind as Q4_0 (d = its group's scale, the same
  nibbles), the affine kind as Q4_1 (d, m = its group's scale and minimum);
  the values are the same floats (tests/test_gguf_export.py proves it);
- anything else (int4w whose f32 scales f16 cannot hold; iq4_xsh, a type
  of ours alone) is refused, naming the tensor and what to quantize with
  instead, unless ``requantize`` names a type: then it is quantized again
  from its values, and the error that adds is reported per tensor;
- vectors (norms, biases, sinks) and float routers (``ffn_gate_inp``) are
  widened to F32, exactly, as llama.cpp's converter writes them;
- Falcon-H1's matrices times its muP multipliers, as its converter writes
  them (gguf_names.falcon_h1_factors): floats multiplied in float32, then
  rounded to their type (the converter's bytes); a block type's f16 scales
  multiplied (its values with them, to f16's rounding).

The header, key-values and tensor table are written by gguf-py's
``GGUFWriter``; the tensor data is streamed into the same file a few MiB
at a time from the mapped ``model.ie.bin`` (``GGUFWriter.write_tensor_data``
takes each tensor as one array in memory, which would make the peak memory
grow with the largest tensor). The file is staged under a temporary name,
fsynced and renamed, like every writer here.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from iekit.formats import delta_net, fused_tensors, iebin, weight_types
from iekit.formats.atomic import StagedFiles
from iekit.formats.casting import decode_f32, encode_f32
from iekit.formats.errors import IEError, UnsupportedError
from iekit.formats.fileio import read_small, read_small_text
from iekit.formats.gguf_file import MAX_SHARDS
from iekit.formats.jsonio import loads_strict
from iekit.formats.model_spec import (LLAMA4_MLP_INTER, DecoderSpec, decoder_spec, every_nth, ntk_alpha_theta, own_name,
                                      rope_kind, rope_tables, yarn_attention_factor)
from iekit.formats.quant import SCHEMES, QuantError, QuantizedRows, QuantParams

from .gguf_names import (CONV_TAPS, DECAY_RATES, FLATTENED, HUNYUAN_NTK_CONTEXT, MLA_KV_B, MTP_EXTRAS, MTP_LAYERS,
                         NO_DENSE_MLP, NVFP4_SCALES, SIGMOID_GATING, SOFTMAX_GATING, GGUFArch, arch_of, attention_scalar,
                         falcon_h1_factors, fused_parts, gguf_2d_shape, gguf_layer_name, mtp_gguf_name, norm_shift,
                         separable, sliding_by_period)
from .gguf_tokenizer import gguf_tokenizer_fields
from .artifact_out import Progress, check_out_file, natural_key

CHUNK_BYTES = 8 * 1024 * 1024
# The llama.cpp architectures whose graphs multiply every matrix they have by its `.scale` (src/models/*.cpp
# pass each weight's *_s on; llama.cpp 0.3.36). The others load the tensor and leave some products unscaled
# (qwen2moe's experts and shared expert, gemma3's MLP, ...): an NVFP4 file with scales would run wrong there.
NVFP4_SCALED_ARCHS = ("llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next")
# IEBIN dtypes llama.cpp has under the same layout (GGMLQuantizationType names: quant.py's GGUF of each)
SAME_BYTES = weight_types.gguf_names()
REQUANTIZE_TARGETS = tuple(n for n in SAME_BYTES if n in SCHEMES)
GPT_OSS_SWIGLU = (1.702, 7.0)  # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants (alpha, limit)
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION


@dataclass
class _Part:
    """Rows of one IEBIN tensor (an expert stack's slice, or a whole one)."""

    entry: dict[str, Any]
    rows: np.ndarray | None = None   # which of its rows, in output order (None: all, in order)


@dataclass
class _Out:
    """One GGUF tensor: its name, ggml type, shape (numpy order) and where its rows come from."""

    name: str
    ggml_type: str
    shape: list[int]
    parts: list[_Part]
    dtype: str                 # the IEBIN dtype it is made from
    how: str = "copy"          # copy | widen | repack | requantize
    target: str | None = None  # repack / requantize: the IEBIN scheme written
    error: QuantError | None = None
    shift: float = 0.0         # widen: added to every value (Gemma's norms: llama.cpp stores 1 + w)
    neg_exp: bool = False      # widen: each value v as -exp(v) (gated DeltaNet's A_log: llama.cpp's ssm_a)
    values: np.ndarray | None = None  # how "values": the float32 data itself (an NVFP4 weight's scales)
    # what the values are multiplied by on the way, in order (Falcon-H1's muP multipliers: gguf_names.falcon_h1_factors)
    factors: list[Any] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def nbytes(self) -> int:
        cols = self.shape[-1]
        if self.how == "values":
            return self.values.nbytes
        if self.how == "widen":
            return self.rows * cols * 4
        if self.target is not None:
            return SCHEMES[self.target].nbytes(self.rows, cols, QuantParams(self.target))
        return sum(_part_rows(p) for p in self.parts) * _row_bytes(self.parts[0].entry)


@dataclass
class ExportResult:
    out_path: Path
    tensors: int
    bytes_out: int
    seconds: float
    arch: str
    copied: int = 0
    repacked: int = 0
    widened: int = 0
    multiplied: int = 0  # of those copied or repacked, multiplied on the way (Falcon-H1's muP multipliers)
    requantized: dict[str, QuantError] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # the files written (out_path, or its split's)


def _part_rows(p: _Part) -> int:
    return len(p.rows) if p.rows is not None else math.prod(p.entry["shape"][:-1]) if len(p.entry["shape"]) > 1 else 1


def _row_bytes(e: dict[str, Any]) -> int:
    rows = math.prod(e["shape"][:-1]) if len(e["shape"]) > 1 else 1
    return e["nbytes"] // rows


def _int4w_params(e: dict[str, Any]) -> QuantParams:
    return SCHEMES["int4w"].params_from(e["quant"], e["shape"][-1])


def qk_rows(n: int, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for Llama-family RoPE: the HF row of each GGUF
    row; within a head, GGUF rows run (pair, 2) where HF rows run (2, pair)."""
    return np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(-1)


class _Plan:
    """Every GGUF tensor of an artifact, and the key-values, or one refusal."""

    def __init__(self, model: iebin.IebinModel, arch: GGUFArch, spec: DecoderSpec, requantize: str | None):
        self.model, self.arch, self.spec = model, arch, spec
        self.requantize = requantize
        self.entries = {t["name"]: t for t in model.tensors}
        self.maps: dict[Path, np.memmap] = {}  # each backing file mapped once
        self.used: set[str] = set()
        self.out: list[_Out] = []
        self.keys: dict[str, list[float]] = {}  # what a layer's tensors are written as instead (GGUFArch.layer_keys)

    def where(self, name: str) -> str:
        return f"tensors[{name!r}]"

    def add(self, gguf_name: str, parts: list[_Part], shape: list[int]) -> None:
        dtypes = {p.entry["dtype"] for p in parts}
        first = parts[0].entry
        # an expert stack's NVFP4 matrices may differ in their scales: llama.cpp's `.scale` has one per expert
        own = tuple(NVFP4_SCALES) if len(shape) == 3 else ()
        if len(dtypes) > 1 or len({json.dumps({k: v for k, v in (p.entry.get("quant") or {}).items() if k not in own},
                                              sort_keys=True) for p in parts}) > 1:
            what = "the experts stacked into" if len(shape) == 3 else "the matrices whose rows make"
            kind = f"types ({', '.join(sorted(dtypes))})" if len(dtypes) > 1 else f"{first['dtype']} parameters"
            raise IEError(f"{self.model.meta_path}: {self.where(first['name'])}: {what} {gguf_name} are stored in "
                          f"different {kind}; a GGUF tensor has one type and one scale: quantize them alike (one "
                          "q4_manifest rule)")
        dtype = first["dtype"]
        # what llama.cpp's converter always writes as F32: vectors, biases, sinks and the routers (a shared
        # expert's gate too: a [hidden, 1] row, which ggml counts as a vector), whose
        # product with a BF16 or F16 matrix ggml would take with the activations rounded to that type too
        f32 = (len(shape) == 1 or gguf_name.endswith(".bias") or ".attn_sinks." in gguf_name
               or ".ffn_gate_inp." in gguf_name or ".ffn_gate_inp_shexp." in gguf_name or ".ssm_conv1d." in gguf_name
               or ".shortconv.conv." in gguf_name or first["name"].endswith(FLATTENED))
        o = _Out(gguf_name, SAME_BYTES.get(dtype, ""), shape, parts, dtype, shift=norm_shift(self.arch, first["name"]),
                 neg_exp=first["name"].endswith(DECAY_RATES))
        floats = dtype in ("f16", "bf16", "f32")
        if o.shift and not floats:
            raise IEError(f"{self.model.meta_path}: {self.where(first['name'])}: dtype {dtype!r}; llama.cpp's "
                          f"{self.arch.gguf} stores this norm as 1 + w, which needs it as floats")
        if o.neg_exp and not floats:
            raise IEError(f"{self.model.meta_path}: {self.where(first['name'])}: dtype {dtype!r}; llama.cpp stores "
                          "-exp(A_log), which needs it as floats")
        if f32 and floats:
            o.how, o.ggml_type = (("copy", "F32") if dtype == "f32" and not o.shift and not o.neg_exp
                                  else ("widen", "F32"))
        elif dtype == "int4w":
            p = _int4w_params(first)
            target = "q4_0" if p.symmetric else "q4_1"
            bad = next((q.entry["name"] for q in parts if not self._scales_fit_f16(q.entry)), None)
            if bad is None:
                o.how, o.target, o.ggml_type = "repack", target, SAME_BYTES[target]
            elif self.requantize:
                self._requantized(o, bad)
            else:
                raise IEError(f"{self.model.meta_path}: {self.where(bad)}: int4w with f32 scales that f16 cannot "
                              f"hold has no GGUF type; quantize it with --scale-dtype f16 (exported losslessly as "
                              f"{SAME_BYTES[target]}) or a llama.cpp scheme such as q4_k, or pass --requantize {target} "
                              "to requantize it here")
        elif (dtype == "nvfp4" and self.arch.gguf not in NVFP4_SCALED_ARCHS
              and any(p.entry["quant"].get("tensor_scale", 1.0) != 1.0 for p in parts)):
            if not self.requantize:
                raise IEError(f"{self.model.meta_path}: {self.where(first['name'])}: nvfp4 under a tensor_scale; "
                              f"llama.cpp's {self.arch.gguf} graph does not multiply every matrix by its NVFP4 "
                              f"scale (those of {', '.join(NVFP4_SCALED_ARCHS)} do), so the file would run wrong "
                              "there: pass --requantize q4_0 (or another llama.cpp type) to requantize it here")
            self._requantized(o, first["name"])
        elif dtype not in SAME_BYTES and self.requantize and dtype in SCHEMES:
            self._requantized(o, first["name"])
        elif dtype not in SAME_BYTES:
            hint = ("; quantize with a llama.cpp type (q4-manifest --gguf-types, or --scheme iq4_xs), or pass "
                    "--requantize iq4_xs to requantize it here") if dtype in SCHEMES else ""
            raise IEError(f"{self.model.meta_path}: {self.where(first['name'])}: dtype {dtype!r} has no GGUF type"
                          f"{hint}")
        self.out.append(o)
        self.used.update(p.entry["name"] for p in parts)
        if dtype == "nvfp4" and o.how == "copy":
            self._scales(gguf_name, parts, shape)

    def _scales(self, gguf_name: str, parts: list[_Part], shape: list[int]) -> None:
        """An NVFP4 weight's `.scale` and `.input_scale` (F32, [1], or
        [experts] for a stack) as llama.cpp's converter writes them after it:
        each where a value is not 1 (a missing input scale counts as 1)."""
        per = [(_part_rows(p) // shape[1] if len(shape) == 3 else 1, p.entry["quant"]) for p in parts]
        for key, suffix in NVFP4_SCALES.items():
            v = np.concatenate([np.full(n, q.get(key) or 1.0, np.float32) for n, q in per])
            if (v != 1).any():
                self.out.append(_Out(gguf_name.removesuffix(".weight") + suffix, "F32", [len(v)], [], "f32",
                                     how="values", values=v))

    def _requantized(self, o: _Out, name: str) -> None:
        """o is written as --requantize's type (``name``: the tensor to blame
        where that type cannot hold its shape)."""
        why = SCHEMES[self.requantize].check([o.rows, o.shape[-1]], QuantParams(self.requantize))
        if why:
            raise IEError(f"{self.model.meta_path}: {self.where(name)}: --requantize {self.requantize}: {why}")
        o.how, o.target, o.ggml_type = "requantize", self.requantize, SAME_BYTES[self.requantize]
        o.error = QuantError()

    def _scales_fit_f16(self, e: dict[str, Any]) -> bool:
        p = _int4w_params(e)
        if p.scale_dtype == "f16":
            return True
        rows, cols = math.prod(e["shape"][:-1]), e["shape"][-1]
        _qs, s, m = SCHEMES["int4w"].planes(self.model_bytes(e), rows, cols, p)
        planes = [s] if m is None else [s, m]
        with np.errstate(over="ignore"):
            return all(np.array_equal(x.astype(np.float16).astype(np.float32), x) for x in planes)

    def model_bytes(self, e: dict[str, Any]) -> np.ndarray:
        """A stored tensor's bytes as a read-only uint8 view of its mapped file."""
        path = self.model.path_of(e)
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        off = e["file_data_offset"]
        return self.maps[path][off:off + e["nbytes"]]

    def entry(self, name: str) -> dict[str, Any]:
        if name not in self.entries:
            raise IEError(f"{self.model.meta_path}: no tensor {name!r}, which {self.arch.hf_class} needs")
        return self.entries[name]


def _slides(arch: GGUFArch) -> bool:
    """Whether llama.cpp's graph for this architecture slides a window: those whose files carry
    attention.sliding_window, but phi3's, which records the window and attends to every position."""
    return "attention.sliding_window" in arch.keys and arch.gguf != "phi3"


def _check_expressible(model: iebin.IebinModel, arch: GGUFArch, spec: DecoderSpec, cfg: dict[str, Any],
                       allow_full_attention: bool) -> list[str]:
    """Refuse what llama.cpp's graph for this architecture cannot run as the
    decoder does (one line naming the config key); return the warnings."""
    where = f"{model.meta_path}: config"
    warnings = []
    if any(spec.windows) and not _slides(arch):
        w = max(spec.windows)
        if w < spec.max_positions and not allow_full_attention:
            raise IEError(f"{where}.sliding_window: {w} positions; llama.cpp's {arch.gguf} architecture attends to every "
                          "position, so past that the exported model would answer differently. Pass "
                          "--allow-full-attention to export anyway (identical for contexts up to the window)")
        if w < spec.max_positions:
            warnings.append(f"sliding_window {w} is dropped: llama.cpp attends to every position (identical up to {w})")
    moe = spec.moe
    if moe is not None:
        if arch.gguf == "qwen3moe":
            if not all(moe.layers):
                raise IEError(f"{where}.mlp_only_layers: llama.cpp's qwen3moe has experts in every layer; "
                              "this model has dense ones")
            if not moe.norm_topk:
                raise IEError(f"{where}.norm_topk_prob: false; llama.cpp's qwen3moe always renormalises the "
                              "top-k weights")
        if arch.gguf in ("qwen35moe", "qwen3next") and not moe.norm_topk:  # (qwen35moe: a hand-made config)
            raise IEError(f"{where}.norm_topk_prob: false; llama.cpp's {arch.gguf} always renormalises the top-k "
                          "weights")
        if arch.gguf == "qwen3next" and not all(moe.layers):
            raise IEError(f"{where}.mlp_only_layers: llama.cpp's qwen3next has experts in every layer; this model has "
                          "dense ones (mlp_only_layers, decoder_sparse_step)")
        if arch.gguf in ("olmoe", "qwen2moe") and moe.norm_topk:
            raise IEError(f"{where}.norm_topk_prob: true; llama.cpp's {arch.gguf} never renormalises the top-k weights")
        if arch.gguf == "qwen2moe" and not all(moe.layers):
            raise IEError(f"{where}.mlp_only_layers: llama.cpp's qwen2moe has experts in every layer; this model has "
                          "dense ones")
        if arch.gguf == "llama4":
            _check_llama4(where, spec)
        if arch.gguf == "lfm2moe":  # (its graph renormalises always, never scales, and reads a choice bias)
            for key, ok in (("norm_topk_prob", moe.norm_topk), ("routed_scaling_factor", moe.routed_scale == 1.0),
                            ("use_expert_bias", "expert_bias" in moe.names)):
                if not ok:
                    raise IEError(f"{where}.{key}: llama.cpp's lfm2moe renormalises the top-k weights always, never "
                                  "scales them, and reads a choice bias (exp_probs_b); this model differs")
        if arch.gguf in LEADING_DENSE and list(moe.layers) != [i >= _leading_dense(moe)
                                                                for i in range(spec.n_layers)]:
            raise IEError(f"{where}.{LEADING_DENSE[arch.gguf]}: experts at layers "
                          f"{[i for i, e in enumerate(moe.layers) if e]}; llama.cpp's {arch.gguf} has them in every "
                          "layer from the first that has them to the last (leading_dense_block_count)")
        if arch.gguf == "afmoe":  # (its graph: embeddings times sqrt(hidden), every 4th layer full and unrotated)
            if spec.embed_scale == 1.0:
                raise IEError(f"{where}.mup_enabled: false; llama.cpp's afmoe multiplies the embeddings by "
                              "sqrt(hidden_size) always")
            if [w == 0 for w in spec.windows] != list(every_nth(arch.swa_pattern, spec.n_layers)):
                raise IEError(f"{where}.layer_types: full layers at {[i for i, w in enumerate(spec.windows) if not w]}; "
                              f"llama.cpp's afmoe has every {arch.swa_pattern}th layer full and unrotated, the others "
                              "sliding")
        if arch.gguf == "gpt-oss" and (moe.alpha, moe.limit) != GPT_OSS_SWIGLU:
            raise IEError(f"{where}.swiglu_limit: llama.cpp's gpt-oss runs swiglu_alpha {GPT_OSS_SWIGLU[0]} and "
                          f"swiglu_limit {GPT_OSS_SWIGLU[1]}; this model has {moe.alpha} and {moe.limit}")
    scaling = _scaling(model)
    kind = rope_kind(scaling)
    if kind == "longrope" and arch.gguf != "phi3":
        raise IEError(f"{where}.rope_scaling: longrope; llama.cpp reads LongRoPE's factors for phi3 only, not for "
                      f"{arch.gguf}")
    if kind == "yarn" and scaling.get("truncate", True) is False:
        warnings.append("rope_scaling.truncate is false; llama.cpp's YaRN rounds its correction range (as truncate "
                        "true does), so a few RoPE frequencies differ slightly")
    # llama.cpp derives YaRN's attention factor, 0.1 ln(factor) + 1: an explicit one is expressed where it is that
    # (OLMo 3's configs state it)
    derived = yarn_attention_factor(float(scaling["factor"])) if kind == "yarn" else 1.0
    if (log_mul := _yarn_log_multiplier(arch, scaling)) is not None:  # llama.cpp's mistral3: mscale 1 over this
        derived /= yarn_attention_factor(float(scaling["factor"]), log_mul)
    if arch.mla:  # (llama.cpp's deepseek2 takes mscale to be mscale_all_dim: cos and sin unscaled)
        _check_mla(where, spec, scaling, kind)
        derived = 1.0
    if kind == "yarn" and not math.isclose(spec.rope_scale, derived, rel_tol=1e-6):
        raise IEError(f"{where}.rope_scaling: YaRN with an attention factor of {spec.rope_scale:.6g} (from its "
                      f"attention_factor/mscale) is not expressed by llama.cpp's keys, which derive {derived:.6g}")
    if arch.gguf == "exaone-moe":  # (its graph turns the sliding layers alone: EXAONE MoE's with its window)
        if list(spec.nope or [False] * spec.n_layers) != [w == 0 for w in spec.windows]:
            raise IEError(f"{where}.sliding_window: {cfg.get('sliding_window')}; llama.cpp's {arch.gguf} rotates the "
                          "sliding layers alone, and this model rotates its full ones too")
    elif arch.swa_layers:  # exaone4: llama.cpp slides in a model of swa_layers blocks, always, and in no other
        if spec.n_layers != arch.swa_layers and spec.nope:
            raise IEError(f"{where}.sliding_window: {cfg.get('sliding_window')}; llama.cpp's {arch.gguf} slides and "
                          f"leaves full layers unrotated only in {arch.swa_layers}-layer models, and this has "
                          f"{spec.n_layers}: it would attend everywhere and rotate every layer")
        if spec.n_layers == arch.swa_layers and not spec.nope:
            raise IEError(f"{where}.sliding_window: none; llama.cpp's {arch.gguf} gives a {arch.swa_layers}-layer "
                          "model sliding layers and unrotated full ones whatever its file says")
    # (cohere2: llama.cpp turns the sliding layers alone; granitehybrid: rope.scaling.finetuned switches RoPE;
    # granite_swa: attention.rope_pattern; a model that attends nowhere, Mamba-2, rotates nothing)
    elif spec.nope and any(spec.attends) and spec.arch.nope_full != "always" and not arch.mamba and \
            not arch.nemotron and "attention.rope_pattern" not in arch.keys and (
            not arch.nope_step or list(spec.nope) != every_nth(arch.nope_step, spec.n_layers)):
        rule = f"leaves every {arch.nope_step}th layer unrotated, and no other" if arch.nope_step else "rotates every layer"
        raise IEError(f"{where}.no_rope_layers: layers {[i for i, n in enumerate(spec.nope) if n]} without RoPE; "
                      f"llama.cpp's {arch.gguf} {rule}")
    if spec.local_theta and "rope.freq_base_swa" not in arch.keys:  # (Granite SWA's second base: granite_swa has one)
        raise IEError(f"{where}.layer_rope_theta: the sliding layers turn by their own RoPE base {spec.local_theta:g}; "
                      f"llama.cpp's {arch.gguf} turns every layer by one")
    if arch.nemotron and spec.moe is not None and any(o and not e for o, e in zip(spec.mlp_only, spec.moe.layers)):
        raise IEError(f"{where}.layers_block_type: MLP blocks beside expert blocks; llama.cpp's {arch.gguf} runs "
                      "every block with a width as experts")
    if arch.mamba and spec.ssm_heads * spec.ssm_head_dim != 2 * spec.hidden:  # (its loader asserts it)
        raise IEError(f"{where}.mamba_expand: {spec.ssm_heads * spec.ssm_head_dim // spec.hidden}; llama.cpp's "
                      f"{arch.gguf} runs Mamba2 layers twice as wide as the model only")
    if spec.ssm1 and spec.ssm1_inner != 2 * spec.hidden:  # (llama.cpp's mamba loader asserts it)
        raise IEError(f"{where}.intermediate_size: {spec.ssm1_inner}, not twice hidden_size {spec.hidden}; llama.cpp's "
                      f"{arch.gguf} runs Mamba layers twice as wide as the model only")
    if spec.ssm1_norms and not math.isclose(spec.ssm1_eps, spec.eps, rel_tol=1e-6):
        warnings.append(f"mixer_rms_eps {spec.ssm1_eps:g}: llama.cpp norms dt, B and C by the model's eps "
                        f"{spec.eps:g} (layer_norm_epsilon) instead: the same model but for those norms' eps")
    grouped = arch.hf_class in delta_net.GROUPED_IN_GGUF
    if arch.linear and spec.lin_k_heads != spec.lin_v_heads and spec.lin_v_tiled == grouped:
        order, want = ("'tiled'", "Hugging Face's grouped") if grouped else ("'grouped'", "its tiled")
        raise IEError(f"{where}.{delta_net.ORDER_KEY}: {order}; llama.cpp's {arch.gguf} reads the value heads in "
                      f"{want} order, which hf-to-iebin writes: convert the checkpoint again")
    if grouped and spec.lin_k_dim != spec.lin_v_dim:  # (its loader sizes the value heads by ssm.state_size)
        raise IEError(f"{where}.linear_value_head_dim: {spec.lin_v_dim}; llama.cpp's {arch.gguf} takes the value "
                      f"heads' width to be the key heads' ({spec.lin_k_dim})")
    if arch.embed_head and not spec.tied:
        raise IEError(f"{where}.tie_word_embeddings: false; llama.cpp's {arch.gguf} reads the embedding as its output "
                      "head")
    if arch.gguf == "jais2":  # (its loader requires every bias: a model without them would not load)
        for key, on in (("attention_bias", "o" in spec.arch.biases), ("mlp_bias", spec.arch.mlp_biases)):
            if not on:
                raise IEError(f"{where}.{key}: false; llama.cpp's jais2 requires the biases it turns off")
    if arch.gguf in ("olmoe", "dots1") and spec.n_kv_heads != spec.n_heads:  # (their loaders size k and v as q)
        raise IEError(f"{where}.num_key_value_heads: {spec.n_kv_heads} of {spec.n_heads} heads; llama.cpp's "
                      f"{arch.gguf} has a key head per query head")
    if arch.own_head and spec.tied:
        raise IEError(f"{where}.tie_word_embeddings: true; llama.cpp's {arch.gguf} requires an output head of its own")
    if spec.mlp_act != arch.mlp_act:
        key = "hidden_activation" if "hidden_activation" in cfg else "hidden_act"
        raise IEError(f"{where}.{key}: {cfg.get(key)!r}; llama.cpp's {arch.gguf} uses {arch.mlp_act}")
    if arch.hf_class == "Olmo3ForCausalLM" and spec.local_theta != float(model.meta["model"].get("rope_theta") or 0):
        raise IEError(f"{where}.rope_parameters.sliding_attention.rope_theta: {spec.local_theta}; llama.cpp's "
                      f"{arch.gguf} turns the sliding layers by the full layers' base")
    if spec.arch.gemma:  # llama.cpp derives the attention scale from the shapes
        want = attention_scalar(arch, spec.hidden, spec.n_heads, spec.head_dim, spec.n_layers)
        if not math.isclose(spec.attn_scale or spec.head_dim ** -0.5, want ** -0.5, rel_tol=1e-12):
            raise IEError(f"{where}.query_pre_attn_scalar: {cfg.get('query_pre_attn_scalar')}; llama.cpp's "
                          f"{arch.gguf} scales the attention by 1/sqrt({want}) for a model of these shapes")
    if spec.arch.softcaps:  # gemma2: llama.cpp always caps
        for key, cap in (("attn_logit_softcapping", spec.attn_softcap), ("final_logit_softcapping",
                                                                          spec.logit_softcap)):
            if not cap:
                raise IEError(f"{where}.{key}: none; llama.cpp's {arch.gguf} always soft-caps (at 50 and 30 "
                              "unless the file says)")
    return warnings


# The llama.cpp architectures whose experts sit in every layer from the first that has them to the last (the
# layers before, leading_dense_block_count), by the config key that could place them otherwise
LEADING_DENSE = {"glm4moe": "first_k_dense_replace", "deepseek2": "mlp_layer_types",
                 "mistral4": "first_k_dense_replace", "ernie4_5-moe": "moe_layer_interval",
                 "lfm2moe": "num_dense_layers", "afmoe": "num_dense_layers", "dots1": "first_k_dense_replace",
                 "exaone-moe": "mlp_layer_types"}


def _leading_dense(moe: Any) -> int:
    """The layers before the first with experts (all of them where none has any)."""
    return moe.layers.index(True) if any(moe.layers) else len(moe.layers)


# What llama.cpp's llama4 graph fixes, whatever a file says: chunks of 8192 positions on the layers it turns, and
# the unrotated layers' temperature 1 + 0.1 ln(1 + floor((p + 1) / 8192))
LLAMA4_CHUNK, LLAMA4_TEMP = 8192, (0.1, 8192, 1.0)


def _check_llama4(where: str, spec: DecoderSpec) -> None:
    """What llama.cpp's llama4 cannot run as the decoder does (one line
    naming the config key): its chunks, temperature, q/k norms (by expert
    count: none with 128, Maverick's) and layers with experts (a period)."""
    moe = spec.moe
    want = [0 if n else LLAMA4_CHUNK for n in spec.nope]
    if list(spec.chunks) != want:
        raise IEError(f"{where}.attention_chunk_size: chunks {sorted(set(spec.chunks) - {0})} on layers "
                      f"{[i for i, c in enumerate(spec.chunks) if c]}; llama.cpp's llama4 attends in chunks of "
                      f"{LLAMA4_CHUNK} on every layer it rotates, and on no other")
    temp = (spec.attn_temp_scale, spec.attn_temp_floor, spec.attn_temp_offset)
    if not math.isclose(temp[0], LLAMA4_TEMP[0], rel_tol=1e-6) or temp[1:] != LLAMA4_TEMP[1:]:
        raise IEError(f"{where}.attn_scale: a temperature of scale {temp[0]} every {temp[1]} positions; llama.cpp's "
                      f"llama4 applies scale {LLAMA4_TEMP[0]} every {LLAMA4_TEMP[1]} (attn_temperature_tuning, "
                      "floor_scale), whatever the file says")
    if spec.qk_l2_norm != (moe.n_experts != 128):
        raise IEError(f"{where}.use_qk_norm: {str(spec.qk_l2_norm).lower()}; llama.cpp's llama4 norms q and k in a "
                      f"model of other than 128 experts, and not in one of 128, whatever the file says; this has "
                      f"{moe.n_experts}")
    step = moe.layers.index(True) + 1 if any(moe.layers) else 0
    if not step or list(moe.layers) != every_nth(step, spec.n_layers):
        raise IEError(f"{where}.moe_layers: experts at layers {[i for i, e in enumerate(moe.layers) if e]}; "
                      "llama.cpp's llama4 has them at every interleave_moe_layer_step-th layer")


def _check_mla(where: str, spec: DecoderSpec, scaling: dict[str, Any] | None, kind: str) -> None:
    """What llama.cpp's deepseek2 (and mistral4, its graph) cannot run as the
    decoder does (one line naming the config key)."""
    if not spec.arch.rope_interleaved:
        raise IEError(f"{where}.rope_interleave: false; llama.cpp's deepseek2 turns interleaved pairs (the Hub "
                      "checkpoints' layout)")
    if kind not in ("default", "yarn"):
        raise IEError(f"{where}.rope_scaling: {kind}; llama.cpp's deepseek2 reads YaRN or no scaling")
    if not spec.q_lora and not (spec.n_layers in (26, 27) or spec.n_layers == 48 and spec.vocab == 128256):
        raise IEError(f"{where}.q_lora_rank: none; llama.cpp's deepseek2 reads a q_proj (no q_lora_rank) only in "
                      f"V2-Lite's shapes (26 or 27 layers, or 48 with a 128256 vocabulary), and this has "
                      f"{spec.n_layers} layers: it would refuse the file")
    if kind == "yarn" and not scaling.get("mscale_all_dim"):
        raise IEError(f"{where}.rope_scaling.mscale_all_dim: none; llama.cpp's deepseek2 would scale the scores "
                      "by YaRN's factor squared, which transformers applies only with mscale_all_dim")


def _yarn_log_multiplier(arch: GGUFArch, scaling: dict[str, Any] | None) -> float | None:
    """The rope.scaling.yarn_log_multiplier a mistral3 export writes: YaRN's
    mscale_all_dim, where transformers divides by it (beside an mscale;
    llama.cpp takes that one to be 1, which _check_expressible holds it
    to); None where there is none to write."""
    if arch.gguf != "mistral3" or rope_kind(scaling) != "yarn" or not (scaling.get("mscale")
                                                                       and scaling.get("mscale_all_dim")):
        return None
    return float(scaling["mscale_all_dim"])


def _scaling(model: iebin.IebinModel) -> dict[str, Any] | None:
    s = model.meta["model"].get("rope_scaling")
    return s if isinstance(s, dict) else None


def llama3_divisors(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    """Llama-3 scaling's divisor of each frequency as convert_hf_to_gguf's LlamaModel computes it, bit for bit:
    in float32, each of its divisions by a tensor being torch's reciprocal times the numerator (Tensor.__rtruediv__),
    so that the file's rope_freqs.weight is the converter's (dividing the tables, an ulp off now and then, was not)."""
    f32 = np.float32
    factor, lo, hi = (f32(scaling.get(k, d)) for k, d in (("factor", 8.0), ("low_freq_factor", 1.0),
                                                          ("high_freq_factor", 4.0)))
    old = float(scaling.get("original_max_position_embeddings", 8192))
    out = []
    for freq in inv_freq.astype(np.float32):
        wavelen = f32(1) / freq * f32(2 * math.pi)
        if wavelen < f32(old / float(hi)):  # (torch compares a float32 tensor with the float as float32)
            out.append(f32(1))
        elif wavelen > f32(old / float(lo)):
            out.append(factor)
        else:
            smooth = (f32(1) / wavelen * f32(old) - lo) / (hi - lo)
            out.append(f32(1) / ((f32(1) - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _plan_tensors(plan: _Plan) -> None:
    """Every GGUF tensor, in the order llama.cpp's converter writes them
    (token_embd, then layer by layer, output_norm, output)."""
    model, arch, spec = plan.model, plan.arch, plan.spec
    names = sorted(plan.entries, key=natural_key)

    def one(hf: str, order: np.ndarray | None = None) -> None:
        e = plan.entry(hf)
        shape = list(e["shape"])
        if hf.endswith(CONV_TAPS):  # [channels, 1, taps] as llama.cpp's [channels, taps]: the same bytes
            shape = [shape[0], shape[-1]]
        if not spec.ssm1:  # (Mamba 1's A_log and D as they are)
            shape = gguf_2d_shape(hf, shape[0], spec.ssm_groups) or shape
        plan.add(mtp_gguf_name(arch, hf, spec.n_layers) or gguf_layer_name(arch, hf), [_Part(e, order)], shape)
        if arch.gguf == "falcon-h1":
            _multiplied(plan, plan.out[-1], falcon_h1_factors(cfg, hf, shape[0]))

    cfg = model.meta.get("config") or {}

    one(own_name(spec.arch, "model.embed_tokens.weight"))
    heads = {"attn_q": spec.n_heads, "attn_k": spec.n_kv_heads}  # (by llama.cpp's names: Nemotron-H's are mixer.*)
    for i in range(spec.n_layers + _mtp_written(arch, spec)):  # (the MTP layers after the last)
        # (Qwen3.5's beside the model: mtp.layers.I, and the first one's MTP_EXTRAS)
        pre = f"{MTP_LAYERS}{i - spec.n_layers}." if arch.mtp_beside and i >= spec.n_layers else f"model.layers.{i}."
        if arch.mtp_beside and i == spec.n_layers:
            for hf in [n for n in MTP_EXTRAS if n in plan.entries]:
                one(hf)
        joined = _join_fused(plan, pre, i)
        if arch.mla:
            _split_kv_b(plan, pre, i)
        for hf in [n for n in names if n.startswith(pre)]:
            sub = hf[len(pre):]
            if sub not in arch.layer or hf in joined:
                continue
            order = None
            proj = arch.layer[sub].rsplit(".", 1)[0]
            if arch.permute_qk and proj in heads:
                order = qk_rows(plan.entries[hf]["shape"][0], heads[proj])
            one(hf, order)
        # (an MTP layer has experts where it stores them: Qwen3.5-MoE's and GLM-4.5's do, EXAONE MoE's is dense)
        experts_here = spec.moe is not None and (spec.moe.layers[i] if i < spec.n_layers else any(
            pre + p.format(e=0) in plan.entries for p in arch.experts) or any(pre + p in plan.entries for p in arch.paired))
        for pattern, stack in arch.experts.items():
            if not experts_here:
                continue
            parts = [_Part(plan.entry(pre + pattern.format(e=e))) for e in range(spec.moe.n_experts)]
            shape = [spec.moe.n_experts, *parts[0].entry["shape"]]
            plan.add(f"blk.{i}.{stack}", parts, shape)
        for hf_stack, (even, odd) in arch.paired.items():
            if not experts_here:
                continue
            e = plan.entry(pre + hf_stack)
            n_exp, rows = e["shape"][0], e["shape"][1]
            base = np.arange(n_exp)[:, None] * rows
            for k, g in enumerate((even, odd)):  # (halves: the first rows, then the second)
                own = np.arange(k * rows // 2, (k + 1) * rows // 2) if arch.halves else np.arange(k, rows, 2)
                order = (base + own[None, :]).reshape(-1)
                if len(e["shape"]) == 2:  # a bias stack [experts, 2 inter]: elements are its rows
                    plan.add(f"blk.{i}.{g}", [_Part(_as_rows(e), order)], [n_exp, rows // 2])
                else:
                    plan.add(f"blk.{i}.{g}", [_Part(e, order)], [n_exp, rows // 2, e["shape"][2]])
    for hf, (key, _shape) in arch.layer_keys.items():  # (Apertus's xIELU parameters: keys, one value per layer)
        plan.keys[key] = [_one_value(plan, f"model.layers.{i}.{hf}") for i in range(spec.n_layers)]
    if not spec.arch.weightless_norms:  # (OLMo's final LayerNorm has no weights: no output_norm)
        one(own_name(spec.arch, "model.norm.weight"))
    if spec.arch.norm_bias:  # (LayerNorm's: StableLM's)
        one(own_name(spec.arch, "model.norm.bias"))
    if "lm_head.weight" in plan.entries and not spec.tied:
        one("lm_head.weight")
    elif arch.gguf == "falcon-h1" and spec.tied and falcon_h1_factors(cfg, "lm_head.weight", 0) != \
            falcon_h1_factors(cfg, "model.embed_tokens.weight", 0):  # (llama.cpp would read token_embd's multiplier)
        e = plan.entry("model.embed_tokens.weight")
        plan.add("output.weight", [_Part(e)], list(e["shape"]))
        _multiplied(plan, plan.out[-1], falcon_h1_factors(cfg, "lm_head.weight", 0))
    if spec.arch.head_bias:  # (Phi-2's)
        one("lm_head.bias")
    mtp = tuple(f"model.layers.{i}." for i in range(spec.n_layers + _mtp_written(arch, spec),
                                                    spec.n_layers + spec.mtp_layers))
    mtp += spec.arch.unread if not arch.mtp_beside else ()  # (Qwen3.5's are written: nothing of them is left out)
    left = sorted(n for n in set(plan.entries) - plan.used - ({"lm_head.weight"} if spec.tied else set())
                  if not (mtp and n.startswith(mtp)))
    if left:
        raise IEError(f"{model.meta_path}: {plan.where(left[0])}: has no place in llama.cpp's {arch.gguf} "
                      f"({len(left)} such tensors); refusing rather than dropping it")


def _multiplied(plan: _Plan, o: _Out, factors: list[Any]) -> None:
    """o's values multiplied by ``factors`` on the way (each a float or one per row; those of 1 left out), as
    llama.cpp's converter multiplies them (_times: floats in float32, rounded to their type once; a block type's f16
    scales by their product, its values with them); refused for a type whose scales are not f16 (MXFP4's powers of
    two, NVFP4's), which only --requantize can multiply."""
    o.factors = [f for f in factors if not np.all(np.asarray(f) == 1.0)]
    if not o.factors or o.dtype in ("f16", "bf16", "f32") or o.how == "requantize":
        return
    scheme = SCHEMES.get(o.target or o.dtype)
    if not getattr(scheme, "F16_FIELDS", ()) or scheme.E8M0_FIELDS or scheme.UE4M3_FIELDS:
        raise IEError(f"{plan.model.meta_path}: {plan.where(o.parts[0].entry['name'])}: dtype {o.dtype!r}: llama.cpp's "
                      f"{plan.arch.gguf} stores this matrix times its muP multiplier, and its scales cannot be "
                      "multiplied: export the float artifact, or pass --requantize q8_0 (or another llama.cpp type)")


def _scaled_rows(o: _Out, w: np.ndarray, sel: Any) -> np.ndarray:
    """Float rows ``w`` (``sel`` of the tensor's) times o.factors, in float32 (what --requantize quantizes again)."""
    for f in o.factors:
        w = w * (np.asarray(f, np.float32)[sel][:, None] if np.ndim(f) else np.float32(f))
    return w


def _times(o: _Out, out: np.ndarray, sel: Any, cols: int, where: str) -> np.ndarray:
    """Rows ``out`` [n, row bytes] (``sel`` of the tensor's) times o.factors: floats step by step in float32,
    rounded to o's type once, as the converter multiplies the float32 tensors it reads; a block type's f16 scales by
    the product."""
    n = len(out)
    if o.dtype in ("f16", "bf16", "f32"):
        w = _scaled_rows(o, decode_f32(np.ascontiguousarray(out).tobytes(), o.dtype).reshape(n, cols), sel)
        return np.frombuffer(encode_f32(w, o.dtype), np.uint8).reshape(n, -1)
    scheme = SCHEMES[o.target or o.dtype]
    scale = _scaled_rows(o, np.ones((n, 1), np.float32), sel)
    blocks = np.ascontiguousarray(out).reshape(-1, scheme.block_bytes).copy()
    per_block = np.repeat(scale[:, 0], len(blocks) // n)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(len(scheme.F16_FIELDS)):
            v = (scheme.f16_field(blocks, k).astype(np.float32) * per_block).astype(np.float16)
            if not np.isfinite(v).all():
                raise IEError(f"{where}: a block scale times its muP multiplier is beyond float16; export the float "
                              "artifact")
            scheme.set_f16_field(blocks, k, v)
    return blocks.reshape(n, -1)


def _one_value(plan: _Plan, name: str) -> float:
    """The float value of the one-element tensor ``name``, which a key carries (GGUFArch.layer_keys), float32 as
    llama.cpp's converter writes it."""
    e = plan.entry(name)
    if e["dtype"] not in ("f32", "f16", "bf16") or math.prod(e["shape"]) != 1:
        raise IEError(f"{plan.model.meta_path}: {plan.where(name)}: {e['dtype']} {e['shape']}; llama.cpp keeps it as "
                      "one float32 key value")
    plan.used.add(name)
    v = float(decode_f32(plan.model_bytes(e).tobytes(), e["dtype"])[0])
    if not math.isfinite(v):
        raise IEError(f"{plan.model.meta_path}: {plan.where(name)}: {v}; expected a finite value")
    return v


def _split_kv_b(plan: _Plan, pre: str, i: int) -> None:
    """Layer ``i``'s kv_b_proj as llama.cpp's attn_k_b [heads, latent, nope]
    (each head's key rows transposed) and attn_v_b [heads, v, latent]
    (MLA_KV_B): element by element, so a float kv_b_proj alone; a quantized
    one's blocks run along the latent, which attn_k_b's rows do not."""
    s = plan.spec
    e = plan.entry(pre + MLA_KV_B[0])
    if e["dtype"] not in ("f32", "f16", "bf16"):
        raise IEError(f"{plan.model.meta_path}: {plan.where(e['name'])}: dtype {e['dtype']!r}; llama.cpp's attn_k_b "
                      "holds this matrix transposed per head, which a block type's rows cannot be: keep it float "
                      "(a q4_manifest rule for kv_b_proj)")
    h, nope, v, lat = s.n_heads, s.head_dim - s.rotary_dim, s.v_dim, s.kv_lora
    row = (np.arange(h)[:, None] * (nope + v))  # each head's first row
    k_b = ((row[:, :, None] + np.arange(nope)[None, None, :]) * lat + np.arange(lat)[None, :, None]).reshape(-1)
    v_b = ((row + nope + np.arange(v)[None, :])[:, :, None] * lat + np.arange(lat)[None, None, :]).reshape(-1)
    for g, order, shape in ((MLA_KV_B[1], k_b, [h, lat, nope]), (MLA_KV_B[2], v_b, [h, v, lat])):
        plan.add(f"blk.{i}.{g}", [_Part(_as_rows(e), order)], shape)


def _join_fused(plan: _Plan, pre: str, i: int) -> set[str]:
    """Layer ``i``'s fused GGUF tensors (phi3's attn_qkv and ffn_up; qwen3next's
    ssm_ba), each the rows of its HF matrices in fused_tensors.row_runs' order
    (phi3's one after another, qwen3next's blocked by key head); the names joined. q, k
    and v stored in different types are written as attn_q, attn_k, attn_v
    instead (llama.cpp's phi3 reads either); a fused tensor llama.cpp
    requires (ffn_up) needs its parts in one type (Plan.add says so)."""
    joined: set[str] = set()
    for suffix, parts in fused_parts(plan.arch).items():
        if any(pre + hf not in plan.entries for hf in parts):  # (qwen3next's ssm_ba: the DeltaNet layers')
            continue
        entries = [plan.entry(pre + hf) for hf in parts]
        alone = separable(plan.arch, parts)  # each has a GGUF name of its own
        kinds = {(e["dtype"], json.dumps(e.get("quant"), sort_keys=True)) for e in entries}
        if alone and len(kinds) > 1:
            continue
        rows = sum(e["shape"][0] for e in entries)
        runs = fused_tensors.row_runs(plan.model.meta.get("config") or {}, plan.arch.fused[suffix], rows,
                                      f"{plan.model.meta_path}: {plan.where(entries[0]['name'])}")
        plan.add(f"blk.{i}.{suffix}", [_Part(entries[k], None if (r0, n) == (0, entries[k]["shape"][0])
                                             else np.arange(r0, r0 + n)) for k, r0, n in runs],
                 [rows, entries[0]["shape"][1]])
        joined.update(e["name"] for e in entries)
    return joined


def _as_rows(e: dict[str, Any]) -> dict[str, Any]:
    """A float tensor seen as one-element rows: a bias stack [experts, n] as
    experts × n of them, latent attention's kv_b_proj as its elements."""
    return {**e, "shape": [*e["shape"], 1]}


def _repack_int4w(qs: np.ndarray, s: np.ndarray, m: np.ndarray | None, cols: int) -> np.ndarray:
    """int4w rows as Q4_0 (symmetric) or Q4_1 (affine) blocks: the same
    nibbles (both pack element j low and j+16 high in each 32), the group's
    scale as d and its minimum as m, so every value is the same float."""
    k = qs.shape[0]
    nb = cols // 32
    per_group = cols // s.shape[1] // 32  # blocks per group
    d = np.repeat(s, per_group, axis=1).astype(np.float16).view(np.uint8).reshape(k, nb, 2)
    heads = [d]
    if m is not None:
        heads.append(np.repeat(m, per_group, axis=1).astype(np.float16).view(np.uint8).reshape(k, nb, 2))
    return np.concatenate([*heads, qs.reshape(k, nb, 16)], axis=2).reshape(k, -1)


def _requantized(o: _Out, w: np.ndarray, cols: int) -> np.ndarray:
    """Rows w [n, cols] quantized to o's --requantize target; the error
    that adds is summed into o.error."""
    target, tp = SCHEMES[o.target], QuantParams(o.target)
    out = target.quantize(w, tp, o.name)
    o.error.add(w, target.dequantize(out, w.shape[0], cols, tp), None)
    return out


def _chunks(plan: _Plan, o: _Out, advance: Callable[[int], None]) -> Iterator[bytes]:
    """The tensor's GGUF bytes, a few MiB of rows at a time (an int4w part's
    planes are split once per part, then rows are taken from them)."""
    cols = o.shape[-1]
    if o.how == "values":
        advance(o.values.nbytes)
        yield o.values.tobytes()
    for part in o.parts:
        e = part.entry
        n = _part_rows(part)
        raw = plan.model_bytes(e)
        if e["dtype"] == "int4w":
            p = _int4w_params(e)
            qs, s, m = SCHEMES["int4w"].planes(raw, math.prod(e["shape"][:-1]), cols, p)
        else:
            rows = raw.reshape(-1, _row_bytes(e))
        step = max(1, CHUNK_BYTES // _row_bytes(e))
        for r0 in range(0, n, step):
            sel = part.rows[r0:r0 + step] if part.rows is not None else slice(r0, min(r0 + step, n))
            if e["dtype"] != "int4w" and o.how == "requantize":  # a type of ours alone, from its values
                out = np.asarray(rows[sel])
                src = SCHEMES[e["dtype"]]
                w = src.dequantize(out, out.shape[0], cols, src.params_from(e["quant"], cols))
                out = _requantized(o, _scaled_rows(o, w, sel), cols)
            elif e["dtype"] != "int4w":
                out = np.asarray(rows[sel])
                if o.how == "widen":
                    out = decode_f32(out.tobytes(), e["dtype"])
                    if o.shift:  # float32, as llama.cpp's converter adds it
                        out = out + np.float32(o.shift)
                    if o.neg_exp:
                        out = delta_net.decay_rate(out)
            elif o.how == "repack":
                out = _repack_int4w(np.asarray(qs[sel]), s[sel], None if m is None else m[sel], cols)
            else:  # requantize from int4w's values, measuring what that adds
                w = SCHEMES["int4w"].dequantize_rows(QuantizedRows(np.asarray(qs[sel]), s[sel],
                                                                   None if m is None else m[sel]), cols, p)
                out = _requantized(o, _scaled_rows(o, w, sel), cols)
            if o.factors and o.how in ("copy", "repack"):
                out = _times(o, out, sel, cols, f"{plan.model.meta_path}: {plan.where(e['name'])}")
            b = np.ascontiguousarray(out).tobytes()
            advance(len(b))
            yield b


def _metadata(model: iebin.IebinModel, arch: GGUFArch, spec: DecoderSpec, cfg: dict[str, Any],
              outs: list[_Out]) -> dict[str, Any]:
    """Key -> value (stored by its Python type: add_kv): every hyperparameter
    llama.cpp reads for the architecture, general.* and the provenance."""
    from gguf.constants import LlamaFileType

    a = arch.gguf
    m = model.meta["model"]
    kv: dict[str, Any] = {}
    src = model.meta["source"]
    kv["general.type"] = "model"
    kv["general.name"] = src.get("name") or model.dir.name
    weight_elems: dict[str, int] = {}
    for o in outs:
        if len(o.shape) >= 2 and o.ggml_type:
            t = (o.target or o.dtype)
            weight_elems[t] = weight_elems.get(t, 0) + math.prod(o.shape)
    main = max(weight_elems, key=weight_elems.get) if weight_elems else "f32"
    kv["general.file_type"] = int(LlamaFileType[weight_types.get(main).GGUF_FILE_TYPE or "ALL_F32"])
    kv["general.quantization_version"] = QUANTIZATION_VERSION
    # (Granite 4 with Mamba2 layers: 2^20, as convert_hf_to_gguf's GraniteHybridModel writes for a model without RoPE;
    # Mamba-2's and Mamba 1's too; Falcon-H1's converter writes the model's own)
    kv[f"{a}.context_length"] = 2 ** 20 if (any(spec.ssm) and not spec.ssm_attends) or any(spec.ssm1) else \
        spec.max_positions
    kv[f"{a}.embedding_length"] = spec.hidden
    # (llama.cpp counts the MTP layers it reads: nextn_predict_layers)
    kv[f"{a}.block_count"] = spec.n_layers + _mtp_written(arch, spec)
    moe = spec.moe
    if spec.arch.llama4:  # (as convert_hf_to_gguf's Llama4Model: the dense layers' width, which every model states)
        dense_ff = spec.inter if not all(moe.layers) else cfg.get("intermediate_size_mlp") or LLAMA4_MLP_INTER
    else:
        dense_ff = spec.inter if moe is None or not all(moe.layers) else (cfg.get("intermediate_size") or moe.inter)
    if arch.hf_class not in NO_DENSE_MLP:
        kv[f"{a}.feed_forward_length"] = int(dense_ff)
    kv[f"{a}.attention.head_count"] = spec.n_heads
    # (LFM2's and Granite 4's: one per layer, 0 where it convolves or runs Mamba2, as convert_hf_to_gguf's LFM2Model
    # and GraniteHybridModel write it)
    kv[f"{a}.attention.head_count_kv"] = [0 if c else spec.n_kv_heads for c in spec.short_conv or spec.ssm] \
        or spec.n_kv_heads
    if spec.short_conv:
        kv[f"{a}.shortconv.l_cache"] = spec.conv_taps
    kv[f"{a}.attention.key_length"] = spec.head_dim
    kv[f"{a}.attention.value_length"] = spec.head_dim
    kv[f"{a}.rope.dimension_count"] = spec.rotary_dim  # (partial RoPE, latent attention: fewer than head_dim)
    kv[f"{a}.rope.freq_base"] = float(m.get("rope_theta") or 10000.0)
    scaling = _scaling(model)
    kind = rope_kind(scaling)
    if spec.arch.ntk_alpha and kind == "dynamic":  # as convert_hf_to_gguf's HunYuanModel: the stretched base, and the
        # 256k context it states for Hunyuan's NTK-alpha models whatever the config says
        kv[f"{a}.rope.freq_base"] = ntk_alpha_theta(kv[f"{a}.rope.freq_base"], float(scaling["alpha"]),
                                                    spec.rotary_dim)
        kv[f"{a}.rope.scaling.type"] = "none"
        kv[f"{a}.rope.scaling.factor"] = 1.0
        kv[f"{a}.rope.scaling.original_context_length"] = kv[f"{a}.context_length"] = HUNYUAN_NTK_CONTEXT
    kv[f"{a}.attention.layer_norm_{'epsilon' if arch.layer_norm else 'rms_epsilon'}"] = float(spec.eps)
    kv[f"{a}.vocab_size"] = spec.vocab
    if kind == "yarn":
        kv[f"{a}.rope.scaling.type"] = "yarn"
        kv[f"{a}.rope.scaling.factor"] = float(scaling["factor"])
        kv[f"{a}.rope.scaling.original_context_length"] = int(scaling["original_max_position_embeddings"])
        kv[f"{a}.rope.scaling.yarn_beta_fast"] = float(scaling.get("beta_fast") or 32.0)
        kv[f"{a}.rope.scaling.yarn_beta_slow"] = float(scaling.get("beta_slow") or 1.0)
    elif kind == "linear":
        kv[f"{a}.rope.scaling.type"] = "linear"
        kv[f"{a}.rope.scaling.factor"] = float(scaling["factor"])
    elif kind == "llama3":  # the divisors are rope_freqs.weight; the original context pins their scale on import
        kv[f"{a}.rope.scaling.original_context_length"] = int(scaling["original_max_position_embeddings"])
    if arch.mamba:
        _granite4_kv(kv, a, spec)
    if arch.nemotron:
        _nemotron_kv(kv, a, spec, cfg)
    if spec.clip_qkv:  # (OLMo's, as convert_hf_to_gguf's OlmoModel writes it)
        kv[f"{a}.attention.clamp_kqv"] = float(spec.clip_qkv)
    if arch.gguf == "stablelm":  # as convert_hf_to_gguf.py's StableLMModel writes it (llama.cpp reads the tensors)
        kv[f"{a}.use_parallel_residual"] = bool(cfg.get("use_parallel_residual", False))
    if arch.gguf == "granite_swa":  # as GraniteSWAModel writes them: the pattern always (llama.cpp requires it), the
        # layers without RoPE where there are any (from layer_rope_theta's zeros, as from Hub configs' no_rope_layers)
        kv[f"{a}.attention.sliding_window"] = max(spec.windows) or int(cfg.get("sliding_window") or spec.max_positions)
        kv[f"{a}.attention.sliding_window_pattern"] = [w > 0 for w in spec.windows]
        if spec.nope:
            kv[f"{a}.attention.rope_pattern"] = [not n for n in spec.nope]
    if arch.gguf in ("granite", "granitehybrid", "granitemoe", "granite_swa"):  # as convert_hf_to_gguf's GraniteModel
        kv[f"{a}.attention.scale"] = float(spec.attn_scale)
        kv[f"{a}.embedding_scale"] = float(spec.embed_scale)
        kv[f"{a}.residual_scale"] = float(spec.residual_scale)
        kv[f"{a}.logit_scale"] = float(spec.logits_scaling)
    if (log_mul := _yarn_log_multiplier(arch, scaling)) is not None:
        kv[f"{a}.rope.scaling.yarn_log_multiplier"] = log_mul
    if arch.mla:
        _mla_kv(kv, a, spec, scaling)
    if arch.hf_class == "YoutuForCausalLM":  # (as DeepseekV2Model writes a dense model: every layer before the
        # experts, and the expert keys llama.cpp's loader requires, the width that of the dense MLP, no shared one)
        kv.update({f"{a}.leading_dense_block_count": spec.n_layers, f"{a}.expert_feed_forward_length": spec.inter,
                   f"{a}.expert_shared_count": 0})
    if spec.arch.cohere:  # as convert_hf_to_gguf's CommandR2Model and Cohere2Model write them
        kv[f"{a}.logit_scale"] = 1.0 / spec.logits_scaling
        kv[f"{a}.rope.scaling.type"] = "none"
    if arch.gguf == "nemotron":  # as convert_hf_to_gguf's NemotronModel writes them (llama.cpp reads the LayerNorm eps)
        kv[f"{a}.attention.layer_norm_rms_epsilon"] = float(spec.eps)
    if arch.gguf in ("nemotron", "exaone-moe") and not scaling:  # (as NemotronModel and ExaoneMoEModel write it)
        kv[f"{a}.rope.scaling.type"] = "none"
    if arch.gguf == "cohere2":
        _window_kv(kv, a, arch, spec, max(spec.windows) or int(cfg["sliding_window"]))
    # (Mistral Small 3.x has none; llama4's is fixed) llama.cpp's mistral3 steps it over YaRN's original context,
    # else over the whole one; its deepseek2 graph (mistral4's) over attention.temperature_length
    if spec.attn_temp_scale and not spec.arch.llama4:
        kv[f"{a}.attention.temperature_scale"] = float(spec.attn_temp_scale)
        if arch.mla:
            kv[f"{a}.attention.temperature_length"] = spec.attn_temp_floor
        elif spec.attn_temp_floor != (scaling or {}).get("original_max_position_embeddings", spec.max_positions):
            kv[f"{a}.rope.scaling.original_context_length"] = spec.attn_temp_floor
    if arch.gguf == "phi3":  # as convert_hf_to_gguf.py's Phi3MiniModel: LongRoPE's factors are tensors (_layout)
        old_ctx = spec.rope_original_ctx or cfg.get("original_max_position_embeddings")
        if old_ctx:
            kv[f"{a}.rope.scaling.original_context_length"] = int(old_ctx)
        if kind == "longrope":
            kv[f"{a}.rope.scaling.attn_factor"] = float(spec.rope_scale)
        kv[f"{a}.attention.sliding_window"] = max(spec.windows)  # recorded; llama.cpp's phi3 applies none
    if moe is not None:
        kv[f"{a}.expert_count"] = moe.n_experts
        kv[f"{a}.expert_used_count"] = moe.top_k
        if arch.gguf in ("qwen3moe", "gpt-oss", "qwen2moe", "minimax-m2", "glm4moe", "deepseek2", "mistral4",
                         "llama4", "ernie4_5-moe", "qwen35moe", "qwen3next", "lfm2moe", "nemotron_h_moe",
                         "hunyuan-moe", "hy_v3", "afmoe", "dots1", "exaone-moe"):
            kv[f"{a}.expert_feed_forward_length"] = moe.inter
        # (as convert_hf_to_gguf's Glm4MoeModel, DeepseekV2Model, Ernie4_5MoeModel and LFM2MoeModel write them:
        # the shared experts' count where the architecture has a key for it)
        if arch.gguf in LEADING_DENSE and "expert_shared_count" in arch.keys:
            kv[f"{a}.expert_shared_count"] = moe.shared_inter // moe.inter
        if arch.gguf in LEADING_DENSE and arch.hf_class not in NO_DENSE_MLP:  # (Solar Open's converter: no key)
            kv[f"{a}.leading_dense_block_count"] = _leading_dense(moe)
        if arch.gguf == "ernie4_5-moe":
            kv[f"{a}.interleave_moe_layer_step"] = 1
            if moe.shared_inter:
                kv[f"{a}.expert_shared_feed_forward_length"] = moe.shared_inter
        if arch.gguf == "llama4":
            kv[f"{a}.interleave_moe_layer_step"] = moe.layers.index(True) + 1
        # (the converter writes it for glm4moe, and for minimax-m2 from the Hub config's scoring_func; llama4's graph
        # is sigmoid-gated without it)
        if moe.sigmoid and "expert_gating_func" in arch.keys and arch.gating_key:
            kv[f"{a}.expert_gating_func"] = SIGMOID_GATING
        elif arch.mla:  # softmax (DeepSeek-V2's Hub configs' scoring_func; Mistral 4's router)
            kv[f"{a}.expert_gating_func"] = SOFTMAX_GATING
        if moe.shared_inter and arch.gguf in ("qwen2moe", "qwen35moe", "qwen3next", "granitemoe", "granite_swa",
                                              "nemotron_h_moe", "hunyuan-moe", "hy_v3", "exaone-moe"):
            kv[f"{a}.expert_shared_feed_forward_length"] = moe.shared_inter
        if arch.gguf == "hunyuan-moe":  # (as HunYuanMoEModel writes num_shared_expert; llama.cpp reads the width)
            kv[f"{a}.expert_shared_count"] = 1
        if arch.gguf in ("hy_v3", "afmoe"):  # (as HYV3Model and AfmoeModel write them)
            kv[f"{a}.expert_weights_norm"] = moe.norm_topk
            kv[f"{a}.expert_weights_scale"] = float(moe.routed_scale)
        if arch.gguf == "afmoe":  # (its window; the full layers every 4th, llama.cpp's default period: no pattern key)
            kv[f"{a}.attention.sliding_window"] = max(spec.windows)
        # (as convert_hf_to_gguf's Glm4MoeModel, DeepseekV2Model, NemotronHModel and Dots1Model write DeepSeek-V3's
        # router)
        if arch.gguf in ("glm4moe", "deepseek2", "mistral4", "nemotron_h_moe", "dots1", "exaone-moe"):
            if moe.sigmoid or arch.gguf == "mistral4":  # (DeepSeek-V2's config has no groups to write; Mistral 4's one)
                kv[f"{a}.expert_group_count"] = moe.n_group
                kv[f"{a}.expert_group_used_count"] = moe.topk_group
            kv[f"{a}.expert_weights_scale"] = float(moe.routed_scale)
            if moe.norm_topk or not arch.mla:  # (deepseek2's and mistral4's: written only where true)
                kv[f"{a}.expert_weights_norm"] = moe.norm_topk
    if mtp := _mtp_written(arch, spec):  # (counted in block_count)
        kv[f"{a}.nextn_predict_layers"] = mtp
    # (as convert_hf_to_gguf writes them; exaone4: where the model has a window, which gives it NoPE layers)
    if arch.gguf in ("gpt-oss", "exaone-moe") or arch.hf_class == "Olmo3ForCausalLM" or arch.gguf == "exaone4" and spec.nope:
        kv[f"{a}.attention.sliding_window"] = max(spec.windows) or cfg.get("sliding_window") or spec.max_positions
        kv[f"{a}.attention.sliding_window_pattern"] = [w > 0 for w in spec.windows]
    if arch.linear:
        _linear_kv(kv, a, arch, spec, cfg)
    if spec.local_theta:  # the sliding layers' own base (gemma3; olmo3's, its full layers')
        kv[f"{a}.rope.freq_base_swa"] = spec.local_theta
    if spec.arch.gemma:  # sliding layers by llama.cpp's period unless a pattern says otherwise
        if any(spec.windows) or arch.swa_window:  # (gemma2 always slides: no window is all layers global)
            _window_kv(kv, a, arch, spec, max(spec.windows) or arch.swa_window)
        if spec.attn_softcap:
            kv[f"{a}.attn_logit_softcapping"] = float(spec.attn_softcap)
            kv[f"{a}.final_logit_softcapping"] = float(spec.logit_softcap)
    if a == "falcon-h1":  # as convert_hf_to_gguf's FalconH1Model writes it: one KV head count, the Mamba2 dims; no
        # rope.dimension_count (every dim turns)
        kv[f"{a}.attention.head_count_kv"] = spec.n_kv_heads
        del kv[f"{a}.rope.dimension_count"]
        _mamba2_kv(kv, a, spec)
    if a in ("mamba2", "mamba"):  # as convert_hf_to_gguf's Mamba2Model and MambaModel write them: no attention heads
        # and no MLP width (0, which llama.cpp's loader reads all the same), the scan's dims, the RMS eps; no RoPE, no
        # vocabulary size
        kept = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon")
        for key in [k for k in kv if k.startswith(a + ".") and k[len(a) + 1:] not in kept]:
            del kv[key]
        kv.update({f"{a}.feed_forward_length": 0, f"{a}.attention.head_count": 0})
        if a == "mamba2":
            _mamba2_kv(kv, a, spec)
        else:  # (ssm.dt_b_c_rms: Falcon Mamba's norms of dt, B and C)
            kv.update({f"{a}.ssm.conv_kernel": spec.ssm_conv, f"{a}.ssm.inner_size": spec.ssm1_inner,
                       f"{a}.ssm.state_size": spec.ssm_state, f"{a}.ssm.time_step_rank": spec.ssm1_rank,
                       f"{a}.ssm.dt_b_c_rms": spec.ssm1_norms})
    # where it came from: the artifact's own digest and its source's
    alg = model.checksum
    kv["iekit.artifact.checksum"] = f"{alg}:{_digest(model)}"
    kv["iekit.source.kind"] = str(src.get("kind"))
    kv["iekit.source.shards"] = [f"{s['name']} {alg}:{s[alg]}" for s in src.get("shards", []) if alg in s] or ["(none)"]
    return kv


def _granite4_kv(kv: dict[str, Any], a: str, spec: DecoderSpec) -> None:
    """Granite 4's keys as convert_hf_to_gguf's GraniteHybridModel writes them: the Mamba2 dims under ssm.*, RoPE's
    switch (rope.scaling.finetuned, which llama.cpp's granitehybrid reads as one), the shared MLP's width; without
    experts, expert counts of 0 (llama.cpp's loader asserts no more experts are used than there are)."""
    _mamba2_kv(kv, a, spec)
    kv[f"{a}.rope.scaling.finetuned"] = not spec.nope
    if spec.moe is None:
        kv[f"{a}.expert_count"] = 0
        kv[f"{a}.expert_used_count"] = 0
    kv[f"{a}.expert_shared_feed_forward_length"] = spec.moe.shared_inter if spec.moe else spec.inter


def _mamba2_kv(kv: dict[str, Any], a: str, spec: DecoderSpec) -> None:
    """Mamba2's dims under ssm.*, as convert_hf_to_gguf's Mamba2Model writes them (Granite 4's, Nemotron-H's): the
    convolution's taps, the state's dims, B and C's groups, the inner width and the heads (time_step_rank)."""
    kv[f"{a}.ssm.conv_kernel"] = spec.ssm_conv
    kv[f"{a}.ssm.state_size"] = spec.ssm_state
    kv[f"{a}.ssm.group_count"] = spec.ssm_groups
    kv[f"{a}.ssm.inner_size"] = spec.ssm_heads * spec.ssm_head_dim
    kv[f"{a}.ssm.time_step_rank"] = spec.ssm_heads


def _nemotron_kv(kv: dict[str, Any], a: str, spec: DecoderSpec, cfg: dict[str, Any]) -> None:
    """Nemotron-H's keys as convert_hf_to_gguf's NemotronHModel writes them: per block, the KV heads (0 but in
    attention blocks) and the MLP's or experts' width (0 but in MLP or expert blocks), by which llama.cpp's graph
    tells the blocks apart; the Mamba2 dims under ssm.*; no RoPE base, RoPE's switch off and a context of 2^20 where
    there are Mamba2 blocks (its values for a model without RoPE: _metadata); the eps under LayerNorm's key; the
    shared experts' count."""
    moe = spec.moe
    width = spec.inter if moe is None else moe.inter
    kv[f"{a}.feed_forward_length"] = [width if only else 0 for only in spec.mlp_only]
    kv[f"{a}.attention.head_count_kv"] = [spec.n_kv_heads if on else 0 for on in spec.attends]
    del kv[f"{a}.rope.freq_base"], kv[f"{a}.attention.layer_norm_rms_epsilon"]
    kv[f"{a}.attention.layer_norm_epsilon"] = float(spec.eps)
    _mamba2_kv(kv, a, spec)
    kv[f"{a}.rope.scaling.finetuned"] = not any(spec.ssm)
    if moe is not None:  # (the router's keys: _metadata's, as DeepSeek-V3's)
        kv[f"{a}.expert_shared_count"] = int(cfg.get("n_shared_experts", 1))  # (read by nothing in llama.cpp's graph)


def _linear_kv(kv: dict[str, Any], a: str, arch: GGUFArch, spec: DecoderSpec, cfg: dict[str, Any]) -> None:
    """Qwen3.5's and Qwen3-Next's gated DeltaNet keys, as convert_hf_to_gguf's Qwen3NextModel and
    Qwen3_5TextModel write them (Qwen3.5's MRoPE sections: the config's, else [11, 11, 10, 0], which text
    positions turn as one RoPE)."""
    kv[f"{a}.ssm.conv_kernel"] = spec.lin_conv
    kv[f"{a}.ssm.state_size"] = spec.lin_k_dim
    kv[f"{a}.ssm.group_count"] = spec.lin_k_heads
    kv[f"{a}.ssm.time_step_rank"] = spec.lin_v_heads
    kv[f"{a}.ssm.inner_size"] = spec.lin_v_dim * spec.lin_v_heads
    if "layer_types" in cfg:  # (else the interval says it, as the converter leaves it)
        kv[f"{a}.attention.recurrent_layers"] = list(spec.linear) + [False] * spec.mtp_layers  # (MTP blocks: attention)
    kv[f"{a}.full_attention_interval"] = int(cfg.get("full_attention_interval", 4))
    if "rope.dimension_sections" not in arch.keys:  # (Qwen3-Next: plain RoPE)
        return
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    sections = rp.get("mrope_section") or [11, 11, 10]
    kv[f"{a}.rope.dimension_sections"] = [int(v) for v in sections] + [0] * (4 - len(sections))


def _mtp_written(arch: GGUFArch, spec: DecoderSpec) -> int:
    """The multi-token prediction layers an export writes: GLM-4.5's,
    GLM-4.7-Flash's, Qwen3.5's and Hy3's; none of DeepSeek-V3's, which
    llama.cpp's converter drops (GGUFArch.drops_mtp: the layer computes no
    logit of the model's)."""
    return 0 if arch.drops_mtp else spec.mtp_layers


def _mla_kv(kv: dict[str, Any], a: str, spec: DecoderSpec, scaling: dict[str, Any] | None) -> None:
    """Latent attention's keys as convert_hf_to_gguf's DeepseekV2Model
    writes them: the latent as one MQA head (head_count_kv 1, key_length
    kv_lora_rank + rope dims, value_length kv_lora_rank), the decompressed
    heads' dims as key_length_mla / value_length_mla, YaRN's mscale_all_dim
    as 0.1 times it (llama.cpp's deepseek2 divides it back)."""
    kv[f"{a}.attention.head_count_kv"] = 1
    kv[f"{a}.attention.key_length"] = spec.kv_lora + spec.rotary_dim
    kv[f"{a}.attention.value_length"] = spec.kv_lora
    if spec.q_lora:
        kv[f"{a}.attention.q_lora_rank"] = spec.q_lora
    kv[f"{a}.attention.kv_lora_rank"] = spec.kv_lora
    kv[f"{a}.attention.key_length_mla"] = spec.head_dim
    kv[f"{a}.attention.value_length_mla"] = spec.v_dim
    if rope_kind(scaling) == "yarn":
        kv[f"{a}.rope.scaling.yarn_log_multiplier"] = 0.1 * float(scaling["mscale_all_dim"])


def _window_kv(kv: dict[str, Any], a: str, arch: GGUFArch, spec: DecoderSpec, window: int) -> None:
    """The window, and the layers that slide where they are not llama.cpp's
    default period for the architecture (convert_hf_to_gguf.py writes no
    pattern for gemma2, gemma3 or cohere2, so llama.cpp runs its default)."""
    kv[f"{a}.attention.sliding_window"] = window
    swa = [w > 0 for w in spec.windows]
    if swa != sliding_by_period(arch.swa_pattern, spec.n_layers):
        kv[f"{a}.attention.sliding_window_pattern"] = swa


def add_kv(w: Any, key: str, v: Any) -> None:
    """One key-value, typed as llama.cpp reads these keys: every integer
    uint32, every real float32, lists as arrays (of their elements' type)."""
    if isinstance(v, list):
        w.add_array(key, v)
    elif isinstance(v, bool):
        w.add_bool(key, v)
    elif isinstance(v, int):
        w.add_uint32(key, v)
    elif isinstance(v, float):
        w.add_float32(key, v)
    else:
        w.add_string(key, v)


def _digest(model: iebin.IebinModel) -> str:
    from iekit.formats import checksums

    return checksums.digest(model.checksum, read_small(model.meta_path))


def _tokenizer(model: iebin.IebinModel, arch: GGUFArch, cfg: dict[str, Any]) -> dict[str, Any]:
    files = model.meta.get("tokenizer", {}).get("files") or []
    if "tokenizer.json" not in files:
        raise IEError(f"{model.meta_path}: tokenizer.files: no tokenizer.json; llama.cpp needs the vocabulary in "
                      "the GGUF file")
    path = model.dir / "tokenizer.json"
    tok_cfg: dict[str, Any] = {}
    if "tokenizer_config.json" in files:
        tc = loads_strict(read_small(model.dir / "tokenizer_config.json"), model.dir / "tokenizer_config.json")
        tok_cfg = tc if isinstance(tc, dict) else {}
    if "chat_template.jinja" in files:  # transformers' own file for it, which wins over tokenizer_config's
        tok_cfg = {**tok_cfg, "chat_template": read_small_text(model.dir / "chat_template.jinja")}
    merged = {**cfg, **{k: v for k, v in model.meta["model"].items() if k.endswith("_token_id")}}
    fields = gguf_tokenizer_fields(read_small(path), tok_cfg, merged, path)
    for key, text in (("eot", arch.eot_token), ("eom", arch.eom_token)):  # (as the converter names them, by text)
        if text in fields["tokenizer.ggml.tokens"]:
            fields[f"tokenizer.ggml.{key}_token_id"] = fields["tokenizer.ggml.tokens"].index(text)
    return fields


def shard_names(out_path: Path, count: int) -> list[Path]:
    """gguf-split's names: m.gguf split in 3 is m-00001-of-00003.gguf ... (one file keeps its name)."""
    if count == 1:
        return [out_path]
    return [out_path.with_name(f"{out_path.stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _shards(sizes: list[int], max_bytes: int | None, max_tensors: int | None) -> list[int]:
    """How many of the tensors (in order, of these byte sizes) go in each file: a new file when the
    next would pass either limit, as convert_hf_to_gguf's --split-max-size / --split-max-tensors do
    (a tensor larger than the size limit gets a file of its own)."""
    counts = [0]
    held = 0
    for n in sizes:
        if counts[-1] and (max_tensors and counts[-1] >= max_tensors or max_bytes and held + n > max_bytes):
            counts.append(0)
            held = 0
        counts[-1] += 1
        held += n
    return counts


@dataclass
class _Layout:
    """What an export writes, planned before anything is: its tensors in order (rope_freqs first, when
    there is one), their bytes, how many go in each file, and the files."""

    plan: _Plan
    items: list  # (name, float32 array) or _Out, in file order
    sizes: list[int]
    counts: list[int]
    paths: list[Path]
    warnings: list[str]


def _layout(model_dir: str | os.PathLike, out_path: Path, requantize: str | None, allow_full_attention: bool,
            split_max_size: int | None, split_max_tensors: int | None) -> _Layout:
    model = iebin.load_model(model_dir)
    if model.in_store:
        raise IEError(f"{model.meta_path}: tensors[{model.in_store[0]['name']!r}]: lives in the dedup store; "
                      "export the model before `ieconv dedup-pack` (GGUF has no shared regions)")
    cfg = model.meta.get("config") or {}
    arch = arch_of(model.meta, model.meta_path)
    try:
        spec = decoder_spec(model.meta, model.meta_path)
    except UnsupportedError as e:
        raise IEError(f"{e} (llama.cpp cannot run it either)") from None
    warnings = _check_expressible(model, arch, spec, cfg, allow_full_attention)
    plan = _Plan(model, arch, spec, requantize)
    _plan_tensors(plan)
    items: list[tuple[str, np.ndarray] | _Out] = []
    scaling = _scaling(model)
    if rope_kind(scaling) == "llama3":
        # llama.cpp reads Llama-3 scaling as per-frequency divisors (its converter's rope_freqs.weight)
        base, _ = rope_tables(spec.head_dim, float(model.meta["model"].get("rope_theta") or 10000.0), None)
        items.append(("rope_freqs.weight", llama3_divisors(np.asarray(base, np.float32), scaling)))
    if rope_kind(scaling) == "longrope":  # (phi3: _check_expressible)
        items += [(f"rope_factors_{k}.weight", np.asarray(scaling[f"{k}_factor"], np.float32)) for k in ("long", "short")]
    items += plan.out
    sizes = [x[1].nbytes if isinstance(x, tuple) else x.nbytes for x in items]
    counts = _shards(sizes, split_max_size, split_max_tensors)
    if len(counts) > MAX_SHARDS:
        raise IEError(f"{out_path}: {len(counts)} files; gguf-split's names count to {MAX_SHARDS} (a larger "
                      "--split-max-size / --split-max-tensors)")
    return _Layout(plan, items, sizes, counts, shard_names(out_path, len(counts)), warnings)


def planned_files(model_dir: str | os.PathLike, out_path: str | os.PathLike, *, split_max_size: int | None = None,
                  split_max_tensors: int | None = None) -> list[Path]:
    """The files ``export_gguf`` would write for these limits (ieconv quantize records them)."""
    return _layout(model_dir, Path(out_path), None, True, split_max_size, split_max_tensors).paths


def export_gguf(model_dir: str | os.PathLike, out_path: str | os.PathLike, *, overwrite: bool = False,
                requantize: str | None = None, allow_full_attention: bool = False,
                progress: Progress | None = None, split_max_size: int | None = None,
                split_max_tensors: int | None = None) -> ExportResult:
    """Write the IEBIN artifact in ``model_dir`` as the GGUF file ``out_path``
    (see the module docstring), or, given a limit, as files of at most
    ``split_max_size`` tensor bytes / ``split_max_tensors`` tensors named as
    llama.cpp's gguf-split names them (m-00001-of-0000N.gguf): the first
    holds every key-value, each split.no / split.count / split.tensors.count,
    as gguf-split writes them (llama.cpp loads them from the first file).
    Nothing is written unless all of it can be."""
    import gguf
    from gguf.constants import GGMLQuantizationType

    progress = progress or Progress()
    out_path = Path(out_path)
    if requantize is not None and requantize not in REQUANTIZE_TARGETS:
        raise IEError(f"--requantize {requantize!r}: expected one of {', '.join(REQUANTIZE_TARGETS)}")
    split = bool(split_max_size or split_max_tensors)
    if not split:
        check_out_file(out_path, overwrite, "the .gguf file")  # at once: a split's names wait for the plan
    lay = _layout(model_dir, out_path, requantize, allow_full_attention, split_max_size, split_max_tensors)
    plan, items, sizes, counts, paths = lay.plan, lay.items, lay.sizes, lay.counts, lay.paths
    for p in paths if split else ():
        check_out_file(p, overwrite, "the .gguf file")
    outs, cfg = plan.out, plan.model.meta.get("config") or {}
    kv = {**_metadata(plan.model, plan.arch, plan.spec, cfg, outs), **plan.keys, **_tokenizer(plan.model, plan.arch, cfg)}

    t0 = time.perf_counter()
    progress.start("exporting", sum(sizes))
    nbytes = 0
    with StagedFiles(out_path.parent, replace=overwrite) as staged:
        start = 0
        for i, (path, n) in enumerate(zip(paths, counts)):
            f = staged.open(path.name)  # GGUFWriter writes the same (staged) file through its own handle
            w = gguf.GGUFWriter(f.name, plan.arch.gguf)
            for k, v in (kv.items() if i == 0 else ()):
                add_kv(w, k, v)
            if len(paths) > 1:
                w.add_uint16("split.no", i)
                w.add_uint16("split.count", len(paths))
                w.add_int32("split.tensors.count", len(items))
            shard = items[start:start + n]
            start += n
            for x in shard:
                if isinstance(x, tuple):
                    w.add_tensor_info(x[0], x[1].shape, np.dtype(np.float32), x[1].nbytes)
                else:
                    w.add_tensor_info(x.name, x.shape, np.dtype(np.float32), x.nbytes,
                                      raw_dtype=GGMLQuantizationType[x.ggml_type])
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            fout = w.fout[0]
            w.write_padding(fout, fout.tell())
            for x in shard:
                if isinstance(x, tuple):
                    fout.write(x[1].tobytes())
                    w.write_padding(fout, x[1].nbytes)
                    progress.advance(x[1].nbytes)
                    continue
                progress.describe(x.name)
                written = 0
                for b in _chunks(plan, x, progress.advance):
                    fout.write(b)
                    written += len(b)
                if written != x.nbytes:
                    raise AssertionError(f"{x.name}: wrote {written} bytes, planned {x.nbytes}")
                w.write_padding(fout, written)
            w.close()
            nbytes += os.path.getsize(f.name)
    return ExportResult(paths[0], len(items), nbytes, time.perf_counter() - t0, plan.arch.gguf,
                        copied=sum(o.how == "copy" for o in outs), repacked=sum(o.how == "repack" for o in outs),
                        widened=sum(o.how == "widen" for o in outs),
                        multiplied=sum(bool(o.factors) and o.how != "requantize" for o in outs),
                        requantized={o.name: o.error for o in outs if o.error is not None}, warnings=lay.warnings,
                        files=paths)
