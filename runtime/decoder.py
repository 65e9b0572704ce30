"""The decoder runtime's Python side: IEBIN artifact -> native ``Decoder``
(or, with ``device="cuda"``, the native ``CudaDecoder``).

Reads the model description captured in ``model.ie.json`` (architecture,
dimensions, RoPE: formats/model_spec.py), binds every tensor the
architecture needs (runtime/decoder_weights.py: present, right shape, a
dtype the GEMV kernels read) and hands the native decoder zero-copy views
of the mapped ``model.ie.bin`` (or of a dedup store's members). The per-token step runs entirely
in C++ with the GIL released (csrc/decoder/decoder.cpp, or on a CUDA device
csrc/cuda/decoder.cu, which copies the weights to the device once); this
module only keeps the bookkeeping that makes benchmarks honest: the KV-cache
prefix reuse counters and the weight bytes one step reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from iekit.formats import iebin, weight_types
from iekit.formats.errors import IEError
from iekit.formats.fileio import model_file, read_small
from iekit.formats.library_calls import guarded
from iekit.formats.model_spec import (EXPERT_MATRIX, EXPERTS_KEY, INT32_MAX, LAYERS_KEY, MATRIX, DecoderSpec,
                                      decoder_spec, layer_parts, rope_for_context)

from . import cuda, decoder_weights, kernels, kv_cache
from .expert_copies import copy_experts, grow_copies
from .memory import available_bytes, gib
from .native import _native
from .tensor_source import TensorSource

DEFAULT_MAX_CTX = 4096  # KV cache positions when the model allows more (layers x 2 x kv_dim elements each)

# act="auto": int8 activations where a layer matrix has fewer than 8 bits per
# weight. Measured on SmolLM2 (docs/eval.md): the int8 activations add a KL of
# 0.0022 to the f32 model, a hundredth of what the 4-bit weights cost
# (0.28-0.38), and decode 1.2-1.5x faster; llama.cpp does the same (8-bit
# activations for its 4-bit types). 8-bit and float weights stay precise.
ACT_AUTO_BITS = 8


def resolve_act(act: str, layer_dtypes: set[str]) -> str:
    """The activation precision a Decoder runs for --act ``act`` (f32 | int8 | auto)."""
    if act != "auto":
        return act
    for d in layer_dtypes:
        f = weight_types.get(d)
        if f.int8_act and f.block_bytes * 8 < ACT_AUTO_BITS * f.block_elems:
            return "int8"
    return "f32"


def check_device(device: str) -> None:
    """Nothing when ``device`` can run here, else the one-line IEError saying
    why not (runtime/cuda.py: a CUDA build of the extension and a visible GPU)."""
    if device not in cuda.DEVICES:
        raise IEError(f"--device: {device!r} is not a device ({' or '.join(cuda.DEVICES)})")
    if device == "cuda":
        cuda.require()


def device_act(device: str, act: str, layer_dtypes: set[str]) -> str:
    """The activation precision that runs on ``device`` for --act ``act``:
    the CUDA decoder multiplies f32 activations only, so auto is f32 there."""
    if device == "cpu":
        return resolve_act(act, layer_dtypes)
    if act == "int8":
        raise IEError("--act int8: the CUDA decoder runs f32 activations only (--act f32 or auto)")
    return "f32"


def kv_cache_bytes(s: DecoderSpec, ctx: int, threads: int, types: tuple[str, str]) -> int:
    """What the native decoder allocates per context position, times ``ctx``:
    K and V (every layer with attention, of ``types``) and each thread's attention scores (float32)."""
    k, v = kv_elements(s)
    return ctx * (cached_layers(s) * (k * kv_cache.nbytes(types[0]) + v * kv_cache.nbytes(types[1])) + threads * 4)


def cached_layers(s: DecoderSpec) -> int:
    """The layers with a KV cache: all but gated DeltaNet's, the short convolution's and Mamba2's (Qwen3.5's three in
    four, LFM2's convolutions keep states instead), and Nemotron-H's MLP blocks."""
    return sum(s.attends)


def kv_elements(s: DecoderSpec) -> tuple[int, int]:
    """K and V cache elements per position and layer: a head's each, or
    latent attention's one key (kv_lora + rope dims) whose latent part is
    also the values (csrc/decoder/decoder.h DecoderConfig::kv_lora)."""
    if s.arch.mla:
        return s.kv_lora + s.rotary_dim, 0
    return s.n_kv_heads * s.head_dim, s.n_kv_heads * s.v_dim


def check_ctx(s: DecoderSpec, ctx: int | None, threads: int, meta_path: Path, default: int,
              types: tuple[str, str], flag: str) -> int:
    """The KV cache positions to allocate: ``ctx``, else min(max_position_embeddings,
    ``default``); never more than the model's positions, a C int, or
    (with the other KV cache sizes, ``types``: K and V's) the memory
    available. ``flag``: what the messages name as the source of ``ctx``."""
    if ctx is None:
        ctx = min(s.max_positions, default)
    elif isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
        raise IEError(f"{flag}: must be a positive integer, got {ctx!r}")
    elif ctx > min(s.max_positions, INT32_MAX):
        if s.max_positions == INT32_MAX:
            raise IEError(f"{flag}: {ctx} is larger than the decoder supports ({INT32_MAX})")
        raise IEError(f"{flag}: {ctx} exceeds the model's max_position_embeddings ({s.max_positions}) in {meta_path}")
    need = kv_cache_bytes(s, ctx, threads, types)
    avail = available_bytes()
    if avail is not None and need > avail:
        k, v = kv_elements(s)
        raise IEError(f"{flag}: {ctx} positions need a {gib(need)} KV cache ({cached_layers(s)} layers × {k} K + {v} V "
                      f"{'/'.join(types)} elements per position), more than the {gib(avail)} of memory available")
    return ctx


def native_config(s: DecoderSpec, max_ctx: int, types: tuple[str, str]) -> Any:
    """The native decoder's dimensions (csrc/decoder/decoder.h DecoderConfig)
    for ``s``, with a KV cache of ``types`` (K, V)."""
    moe = s.moe
    fields = dict(
        n_layers=s.n_layers, hidden=s.hidden, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim,
        inter=s.inter, vocab=s.vocab, max_ctx=max_ctx, eps=s.eps, windows=list(s.windows),
        inv_freq=rope_for_context(s, max_ctx).tolist(), rope_scale=s.rope_scale, k_cache=types[0], v_cache=types[1],
        inv_freq_swa=[] if s.inv_freq_swa is None else s.inv_freq_swa.tolist(), attn_scale=s.attn_scale,
        embed_scale=s.embed_scale, mlp_act=s.mlp_act, mlp_gated=s.mlp_gated, attn_softcap=s.attn_softcap,
        logit_softcap=s.logit_softcap,
        nope=[int(n) for n in s.nope], residual_scale=s.residual_scale, logits_scaling=s.logits_scaling,
        pre_norms=s.arch.pre_norms, qk_norm_full=s.arch.qk_norm_full, attn_temp_scale=s.attn_temp_scale,
        attn_temp_floor=s.attn_temp_floor, rope_interleaved=s.arch.rope_interleaved, layer_norm=s.arch.layer_norm,
        parallel_block=s.arch.parallel, q_lora=s.q_lora, kv_lora=s.kv_lora, v_head_dim=s.v_head_dim,
        chunks=list(s.chunks), attn_temp_offset=s.attn_temp_offset, attn_temp_nope=s.attn_temp_nope,
        qk_l2_norm=s.qk_l2_norm, qk_norm_after_rope=s.arch.qk_norm_after_rope, attn_gate=s.arch.attn_gate,
        clip_qkv=s.clip_qkv,
        linear=[int(f) for f in s.linear],
        lin_k_heads=s.lin_k_heads, lin_v_heads=s.lin_v_heads, lin_k_dim=s.lin_k_dim, lin_v_dim=s.lin_v_dim,
        lin_conv=s.lin_conv, lin_v_tiled=s.lin_v_tiled, short_conv=[int(f) for f in s.short_conv],
        conv_taps=s.conv_taps, ssm=[int(f) for f in s.ssm], ssm_heads=s.ssm_heads, ssm_head_dim=s.ssm_head_dim,
        ssm_state=s.ssm_state, ssm_groups=s.ssm_groups, ssm_conv=s.ssm_conv,
        mlp_only=[int(f) for f in s.mlp_only], mixer_only=[int(f) for f in s.mixer_only],
        ssm1=[int(f) for f in s.ssm1], ssm1_inner=s.ssm1_inner, ssm1_rank=s.ssm1_rank, ssm1_norms=s.ssm1_norms,
        ssm1_eps=s.ssm1_eps, ssm_attends=s.ssm_attends, q_mult=s.q_mult, k_mult=s.k_mult, v_mult=s.v_mult,
        o_mult=s.o_mult, ssm_out_mult=s.ssm_out_mult, gate_mult=s.gate_mult, down_mult=s.down_mult, ssm_in_mults=list(s.ssm_in_mults),
        **({} if moe is None else dict(n_experts=moe.n_experts, top_k=moe.top_k, expert_inter=moe.inter,
                                       norm_topk=moe.norm_topk, glu=moe.glu, swiglu_alpha=moe.alpha,
                                       swiglu_limit=moe.limit, shared_inter=moe.shared_inter,
                                       sigmoid_gating=moe.sigmoid, n_group=moe.n_group, topk_group=moe.topk_group,
                                       routed_scale=moe.routed_scale, weight_before=moe.weight_before)))
    c = _native.DecoderConfig()  # (every field the struct's default until set; an unknown name: AttributeError)
    for name, value in fields.items():
        setattr(c, name, value)
    return c


class Decoder:
    """Greedy/sampled decoding of an IEBIN model (model_spec.ARCHITECTURES)
    on the CPU or, with ``device="cuda"`` (dense models without per-head
    q/k norms or sinks), on the current CUDA device (f32 activations).

    ``prefill`` reuses the longest cached prefix of the previous sequence
    (``kv_hits`` counts reused positions, ``kv_misses`` computed ones), so a
    benchmark that repeats prompts measures a real cache, not a stub.

    ``cache_type_k`` / ``cache_type_v``: the KV cache's element types
    (runtime/kv_cache.py); f32 here, so a caller gets the exact cache unless
    it asks, and None for the commands' default (f16 on the CPU).
    ``ctx_flag``: what a refusal of ``ctx`` names as its source (a command's option).
    ``experts``: a mixture of experts' matrices copied for the fast kernels
    or read in place (copy_experts; ``copied_experts`` says which).
    """

    def __init__(self, model_dir: str | os.PathLike, *, threads: int = 1, act: str = "auto",
                 affinity: str | None = None, ctx: int | None = None, default_ctx: int = DEFAULT_MAX_CTX,
                 isa: str = "", device: str = "cpu", cache_type_k: str | None = "f32",
                 cache_type_v: str | None = "f32", ctx_flag: str = "--ctx", experts: str = "auto"):
        if threads < 1:
            raise IEError(f"threads must be >= 1, got {threads}")
        check_device(device)  # before the model is read: an impossible device fails at once
        self.device = device
        self.cache_types = types = kv_cache.resolve(device, cache_type_k, cache_type_v)
        self.source = TensorSource(model_dir, threads=threads, isa=isa)
        self.model = self.source.model
        meta_path = self.model.meta_path
        self.spec = s = decoder_spec(self.model.meta, meta_path)
        self.max_ctx = check_ctx(s, ctx, threads, meta_path, default_ctx, types, ctx_flag)
        bound = decoder_weights.bind(self.source, s)
        self._step_bytes, self._active_params = bound.step_bytes, bound.active_params
        self.head_name: str = bound.head_name  # the tensor the output head reads (a tied embedding included)
        cfg = native_config(s, self.max_ctx, types)
        self.act = run_act = device_act(device, act, bound.layer_dtypes)  # what runs: f32 | int8
        self._weights = weights = bound.weights
        copied = copy_experts(experts, weights, run_act, device)
        grow = grow_copies(weights, run_act, device)
        # Closes over the weights (replace_matrices changes them in place), not over self: a
        # Decoder in a reference cycle outlived its last name until Python's cycle collector ran,
        # and a loop that makes one decoder after another (kl-probes: one per group) held
        # several models' weights at once.
        self._make = lambda: (_native.CudaDecoder(cfg, weights) if device == "cuda" else
                              _native.Decoder(cfg, weights, act=run_act, threads=threads, isa=isa,
                                              affinity=affinity or "", copy_experts=copied, grow_copies=grow))
        self._dec = self._build()
        # Each decoder thread's CPU (-1: not pinned), or None without an affinity mode (or on CUDA).
        self.pinned: list[int] | None = list(self._dec.pinned) if affinity and device != "cuda" else None
        # The matrices' storage dtypes, most bytes first.
        self.precisions: tuple[str, ...] = tuple(d for d, _ in sorted(bound.stored.items(), key=lambda kv: -kv[1]))
        self.model_bytes = sum(t["nbytes"] for t in self.model.tensors)
        self._tokens: list[int] = []
        self._tokenizer = None
        self.kv_hits = 0
        self.kv_misses = 0
        self._touch_pos = 0
        self._touch_map: np.memmap | None = None

    def _build(self) -> Any:
        """The native decoder over ``self._weights``."""
        try:
            return self._make()
        except ValueError as e:
            raise IEError(f"{self.model.meta_path}: {e}") from None
        except RuntimeError as e:  # a CUDA failure (out of device memory, ...): one line, already says where
            raise IEError(str(e)) from None

    def replace_matrices(self, values: dict[str, np.ndarray]) -> None:
        """Run on from now with the layer matrices (experts' included; a
        stack's values [experts x rows, cols]) and head ``values`` names
        (HF tensor names -> float32 [rows, cols]) in place of the
        artifact's: sequential error compensation (runtime/hessians.py)
        takes each layer's input covariances from a model whose earlier
        layers are already quantized, and this swaps them in (their
        dequantized values) without writing an artifact. A tied head is
        the embedding too, so both change. The native decoder is rebuilt
        (its KV cache starts empty); the caller's arrays are kept
        referenced, not copied, until then."""
        tied = self._weights["embed"] is self._weights["lm_head"]
        # name -> where its values go: (path, expert) pairs, expert None for a whole matrix, else a stack's
        # [experts x rows, cols] values split among its experts.
        where = {self.head_name: [(("lm_head",), None), (("embed",), None)] if tied else [(("lm_head",), None)]}
        for i in range(self.spec.n_layers):
            for p in layer_parts(self.spec, i):
                if p.kind == MATRIX:
                    where[p.name] = [((LAYERS_KEY, i, p.key), None)]
                elif p.kind == EXPERT_MATRIX:
                    experts = range(self.spec.moe.n_experts)
                    if "{e}" in p.name:
                        where.update({p.name.format(e=e): [((LAYERS_KEY, i, EXPERTS_KEY, e, p.key), None)]
                                      for e in experts})
                    else:
                        where[p.name] = [((LAYERS_KEY, i, EXPERTS_KEY, e, p.key), e) for e in experts]
        staged = []
        for name, a in values.items():
            if name not in where:
                raise IEError(f"replace_matrices: {name!r} is not a layer matrix or the head of {self.model.dir}")
            a = np.ascontiguousarray(a, dtype=np.float32)
            if a.ndim != 2:
                raise IEError(f"replace_matrices: {name}: expected a matrix, got shape {list(a.shape)}")
            if where[name][0][1] is not None:  # a stack: expert e's rows
                if a.shape[0] % len(where[name]):
                    raise IEError(f"replace_matrices: {name}: {a.shape[0]} rows are not {len(where[name])} experts'")
                a = a.reshape(len(where[name]), -1, a.shape[1])
            for path, expert in where[name]:
                a_e = a if expert is None else a[expert]
                d = self._weights
                for k in path[:-1]:
                    d = d[k]
                old = d[path[-1]][0]
                if a_e.shape != (old.rows, old.cols):
                    raise IEError(f"replace_matrices: {name}: {list(a_e.shape)} where the model has "
                                  f"[{old.rows}, {old.cols}]" + ("" if expert is None else f" (expert {expert})"))
                spec = _native.WeightSpec(**kernels.weight_params({"name": name, "dtype": "f32",
                                                                   "shape": list(a_e.shape)}))
                staged.append((d, path[-1], (spec, kernels.as_bytes(a_e))))
        for d, key, value in staged:  # all checked first: a refusal changes nothing
            d[key] = value
        self._dec = None  # the old copies go before the new ones are made
        self._dec = self._build()
        self._tokens = []

    # -- facts for reports ------------------------------------------------

    @property
    def precision(self) -> str:
        """``int4w``, or ``mixed(int4w,f16)`` when the matrices are stored several ways."""
        p = self.precisions
        return p[0] if len(p) == 1 else f"mixed({','.join(p)})"

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.spec.eos_ids

    @property
    def copied_experts(self) -> bool:
        """Whether a mixture's experts got rows8 copies at load, as the
        native decoder made them: ``experts`` asks (copy_experts), and an
        ISA without the kernels (scalar) copies none."""
        return self.device != "cuda" and bool(self._dec.experts_copied)

    @property
    def rows8_bytes(self) -> int:
        """Bytes of the row-interleaved weight copies the decode steps read
        (csrc/gemv/rows8.h): made at load for act=int8 on AVX2, in place of
        the mapped file's pages (a mixture's experts too where
        ``copied_experts``); 0 otherwise (the stored bytes are then copied
        as they are, docs/native.md)."""
        return self._dec.rows8_bytes

    @property
    def device_bytes(self) -> int:
        """Device memory the weights take on ``device="cuda"`` (matrices as
        uploaded, the f32 embedding table, norms, biases); 0 on the CPU."""
        return self._dec.device_bytes if self.device == "cuda" else 0

    @property
    def weight_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every layer matrix, norms and
        biases, the output head and one embedding row; of a mixture of
        experts the router and the top_k experts a token is routed to, not
        the others (their bytes are never touched)."""
        return self._step_bytes

    @property
    def active_params_per_token(self) -> int:
        """Weights one decode step multiplies: as weight_bytes_per_token
        counts them, in parameters, less the embedding row (a lookup)."""
        return self._active_params

    @property
    def dedup_stats(self) -> dict[str, Any]:
        """IE_DEDUP state: enabled, active (false after a fallback), the
        fallback reason and the loader's cache counters. Every tensor is
        fetched once when the decoder is built, so the counters describe
        loading; decoding reads the rebuilt bytes in place."""
        return self.source.stats()

    @property
    def solo_jobs(self) -> int:
        """Parallel jobs the CPU decoder's pool ran on the calling thread alone
        because the machine was busy (csrc/common/thread_pool.h); 0 on CUDA."""
        return int(getattr(self._dec, "solo_jobs", 0))

    @property
    def n_past(self) -> int:
        return self._dec.n_past

    def step_times(self) -> dict[str, float] | None:
        """Where the decode steps' time went since ``reset_step_times``
        (csrc/decoder/decoder.h, StepTimes): {"steps", "total_s",
        "matmul_s", "attention_s"} of the single-token forward calls; None
        on CUDA, whose steps are not split."""
        return None if self.device == "cuda" else self._dec.step_times()

    def reset_step_times(self) -> None:
        if self.device != "cuda":
            self._dec.reset_step_times()

    # -- tokens -------------------------------------------------------------

    @property
    def has_tokenizer(self) -> bool:
        return model_file(self.model.dir, "tokenizer.json") is not None

    def _tok(self):
        if self._tokenizer is None:
            path = model_file(self.model.dir, "tokenizer.json")  # regular, bounded, inside the model directory
            if path is None:
                raise IEError(f"{self.model.dir}: no tokenizer.json; give prompts as token ids")
            from tokenizers import Tokenizer

            try:
                text = read_small(path).decode("utf-8")
            except UnicodeDecodeError as e:
                raise IEError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            self._tokenizer = (path, guarded(path, "loading the tokenizer", Tokenizer.from_str, text))
        return self._tokenizer

    def vocabulary(self) -> dict[str, int]:
        """The tokenizer's token -> id map, added tokens included."""
        path, tok = self._tok()
        return guarded(path, "reading the vocabulary", tok.get_vocab, with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` with the tokenizer's own post-processing (BOS
        where it adds one), unless ``add_special_tokens`` is false."""
        path, tok = self._tok()
        return list(guarded(path, "tokenizing", tok.encode, text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        path, tok = self._tok()
        return guarded(path, "detokenizing", tok.decode, list(ids), skip_special_tokens=False)

    # -- running ------------------------------------------------------------

    def check_vocab(self, ids: list[int]) -> None:
        """Every id in the vocabulary, or the message saying which is not."""
        bad = next((i for i in ids if not 0 <= i < self.spec.vocab), None)
        if bad is not None:
            raise IEError(f"token id {bad} is outside the vocabulary (0..{self.spec.vocab - 1})")

    def check_ids(self, ids: list[int], final_len: int | None = None) -> None:
        """Every id in the vocabulary, and a sequence of ``final_len`` tokens
        (default: ``len(ids)``) within the context. The native forward checks
        the same as a backstop; this is where the message is made."""
        self.check_vocab(ids)
        n = len(ids) if final_len is None else final_len
        if n > self.max_ctx:
            raise IEError(f"a sequence of {n} tokens exceeds the context of {self.max_ctx} tokens")

    def _run(self, ids: list[int], all_logits: bool, out: np.ndarray | None = None) -> np.ndarray:
        # Every path to logits (prefill, step, logits; so generate, bench and
        # `ierun logits`) comes through here.
        try:
            out = self._dec.forward(np.asarray(ids, np.int32), all_logits, out)
        except (ValueError, RuntimeError) as e:  # RuntimeError: a CUDA failure, one line
            raise IEError(str(e)) from None
        fin = np.isfinite(out)
        if not fin.all():
            # NaN/Inf logits would be sampled as id 0 forever: stop, and leave
            # the cache as it was before these ids (linear attention's and the
            # short convolution's states, which cannot be rewound: empty).
            if self.spec.recurrent:
                self.reset()
            else:
                self._dec.truncate(len(self._tokens))
            pos = len(self._tokens) + (int(np.argwhere(~fin.reshape(-1, out.shape[-1]).all(axis=1))[0][0])
                                       if all_logits else len(ids) - 1)
            raise IEError(f"{self.model.meta_path}: logits: non-finite (NaN/Inf) at position {pos}; the weights or "
                          "activations hold NaN/Inf (`ieconv validate --deep` checks the stored values)")
        self._tokens.extend(ids)
        self.kv_misses += len(ids)
        return out

    def reset(self) -> None:
        self._dec.truncate(0)
        self._tokens.clear()

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Logits [vocab] after ``ids``, computing only what the cache lacks:
        the longest common prefix with the cached sequence is kept (at least
        the last id is always run, since its logits are the result)."""
        ids = list(ids)
        if not ids:
            raise IEError("empty prompt")
        self.check_ids(ids)
        keep = 0
        limit = min(len(ids) - 1, len(self._tokens))
        while keep < limit and self._tokens[keep] == ids[keep]:
            keep += 1
        if self.spec.recurrent and keep < len(self._tokens):  # (recurrent states continue, or start again)
            keep = 0
        self._dec.truncate(keep)
        del self._tokens[keep:]
        out = self._run(ids[keep:], all_logits=False)
        self.kv_hits += keep
        return out

    def step(self, token: int) -> np.ndarray:
        """Append one token; logits [vocab] for the next."""
        self.check_ids([token], final_len=len(self._tokens) + 1)
        return self._run([token], all_logits=False)

    def logits(self, ids: list[int], start: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """Float32 logits [len(ids) - start, vocab] of a fresh sequence, one row
        per position from ``start`` on; ids[:start] run as context only
        (batched like any prefill, without the output head over them).
        ``out``, a C-contiguous float32 array of that shape, receives them
        instead of a new array: a caller scoring chunk after chunk (`ierun
        eval`) reuses one buffer rather than page-faulting in a fresh one."""
        ids = list(ids)
        if not ids:
            raise IEError("no ids")
        if not 0 <= start < len(ids):
            raise IEError(f"logits: start {start} is outside 0..{len(ids) - 1}")
        self.check_ids(ids)
        self.reset()
        if start:
            self._run(ids[:start], all_logits=False)
        return self._run(ids[start:], all_logits=True, out=out)

    def run_layers(self, ids: list[int], layers: int, first: int = 0, stream: np.ndarray | None = None) -> np.ndarray:
        """A fresh sequence ``ids`` through layers ``first`` .. ``layers``-1
        only, no head: a calibration pass (runtime/hessians.py) that collects
        the statistics of those layers' inputs stops where they end (CPU
        only). It starts from the embedding, or from ``stream`` [len(ids),
        hidden], the residual stream entering layer ``first``; it returns the
        stream leaving the last layer run, so the next pass can resume there."""
        ids = list(ids)
        if not ids:
            raise IEError("no ids")
        self.check_ids(ids)
        self.reset()
        try:
            return self._dec.run_layers(np.asarray(ids, np.int32), layers, first, stream)
        except ValueError as e:
            raise IEError(str(e)) from None

    def touch(self, nbytes: int, stride: int) -> int:
        """The benchmark's work-touch: read one byte every ``stride`` of the
        mapped model.ie.bin, ``nbytes`` in all, continuing where the last
        call stopped. Returns the checksum of the bytes read."""
        if self._touch_map is None:
            self._touch_map = np.memmap(self.model.dir / iebin.BIN_NAME, dtype=np.uint8, mode="r")
        total = _native.touch_bytes(self._touch_map, self._touch_pos, nbytes, stride)
        reads = -(-nbytes // stride)  # one byte every stride: the next call starts after the last one read
        self._touch_pos = (self._touch_pos + reads * stride) % max(1, self._touch_map.size)
        return int(total)
