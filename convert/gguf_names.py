"""llama.cpp's architectures and tensor names, beside the Hugging Face ones.

The one table for everything that crosses between GGUF and IEBIN: the GGUF
importer, the exporter (iebin_to_gguf.py), and the converters reading a
llama.cpp importance matrix (``--imatrix x.dat``). The names are those of
gguf-py's ``constants.py`` (``TENSOR_NAMES``, ``MODEL_TENSORS``) and of
llama.cpp's ``convert_hf_to_gguf.py`` for each model class, restated here
(tests/test_gguf_export.py holds this table against gguf-py's own
``TensorNameMap``).

The ways a tensor crosses:

- one to one: ``model.layers.N.self_attn.q_proj.weight`` is
  ``blk.N.attn_q.weight`` (``LAYER``, per architecture);
- experts (Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE): IEBIN keeps one matrix per expert,
  ``...experts.E.w1.weight``; GGUF one stack per layer,
  ``blk.N.ffn_gate_exps.weight`` [experts, rows, cols]: the experts' bytes
  one after another (``EXPERTS``);
- latent attention's kv_b_proj (DeepSeek): IEBIN keeps the HF matrix
  [heads × (nope + v), latent]; llama.cpp two tensors per layer, attn_k_b
  [heads, latent, nope] (each head's key rows, transposed) and attn_v_b
  [heads, v, latent] (``MLA_KV_B``);
- gpt-oss's gate/up pair: IEBIN (like transformers) keeps gate and up rows
  interleaved in one stack ``mlp.experts.gate_up_proj`` [experts, 2 inter,
  hidden] (gate rows even, up rows odd), llama.cpp two stacks
  ``ffn_gate_exps`` and ``ffn_up_exps``; their biases likewise (``paired``);
  Llama 4's ``feed_forward.experts.gate_up_proj`` the same way, but each
  expert's gate rows first, then its up rows (``halves``);
- an NVFP4 weight's float32 ``X.scale`` / ``X.input_scale``: its quant's
  ``tensor_scale`` / ``input_scale`` (``NVFP4_SCALES``);
- fused matrices (``fused``): phi3's attn_qkv and ffn_up, glm4's ffn_up,
  qwen3next's ssm_ba (and an older file's ssm_in) hold the rows of several
  HF matrices, in formats/fused_tensors.py's ``row_runs`` order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from iekit.formats.errors import FormatError
from iekit.formats.fused_tensors import BA, FUSED, QKVZ
from iekit.formats.model_spec import XIELU_VECTORS, every_nth

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
        "token_embd_norm": "model.embedding_norm"}  # (LFM2's final norm, llama.cpp's OUTPUT_NORM_LFM2)
# GGUF name inside blk.N -> HF name inside model.layers.N, for every Llama-family layer
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_BLK = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp dense-layer tensor, or None when
    it has none here (an importance matrix's entries are matrices of these)."""
    top, _, suffix = gguf_name.partition(".")
    if top in _TOP and suffix in ("weight", "bias"):
        return f"{_TOP[top]}.{suffix}"
    m = _BLK.fullmatch(gguf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"model.layers.{int(m.group(1))}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def importance_to_hf(entries: dict, names: Mapping[str, Sequence[int]] | Collection[str], where: str) -> dict:
    """A llama.cpp importance matrix's entries under the HF names of a model
    whose tensors are ``names`` (with their shapes, where given): a dense
    layer's one to one (hf_name); an expert stack's, [experts, cols] under
    ``blk.N.ffn_*_exps.weight``, as the model holds its experts: a row per
    expert matrix (Mixtral, Qwen3-MoE; rows for another number of experts
    than the layer has are an error naming ``where``: the imatrix of another
    model), or whole for a stack kept as one tensor (gpt-oss's down_proj, and
    its gate_up_proj from ffn_gate_exps or ffn_up_exps: the same routed
    inputs; select_for checks its experts). llama.cpp's legacy .dat keeps a
    stack's rows one after another, [experts × cols]: with the shapes, such
    an entry is split into its experts' rows. A fused matrix's entry (phi3's
    attn_qkv, ffn_up) is each of its parts' where the file has none of its
    own. What no architecture maps onto ``names`` is left out."""
    shape_of = names.get if isinstance(names, Mapping) else (lambda _n: None)
    out = {}
    shared = {}  # a fused matrix's input is each part's (phi3's attn_qkv: q, k, v; its ffn_up: gate, up)
    for n, v in list(entries.items()):  # (a file written with the converter's --fuse-qkv / --fuse-gate-up-exps)
        m = _BLK.fullmatch(n)
        qkv = m and m.group(2) == "attn_qkv" and f"model.layers.{int(m.group(1))}.self_attn.q_proj.weight" in names
        for part in CONVERTER_FUSED.get(m.group(2), ()) if m and (qkv or m.group(2) != "attn_qkv") else ():
            entries = {f"blk.{m.group(1)}.{part}.{m.group(3)}": v, **entries}
    for n, v in entries.items():
        m = _BLK.fullmatch(n)
        if m:
            shared.update({p: v for arch in ARCHS.values()
                           for h in fused_parts(arch).get(f"{m.group(2)}.{m.group(3)}", ())
                           if (p := f"model.layers.{int(m.group(1))}.{h}") in names})
        hf = hf_name(n)
        if hf is not None and hf in names:
            out[hf] = v
            continue
        m = _BLK.fullmatch(n)
        if m is None:
            continue
        pre, suffix = f"model.layers.{int(m.group(1))}.", f"{m.group(2)}.{m.group(3)}"
        for arch in ARCHS.values():
            whole = [h for h, g in arch.layer.items() if g == suffix]
            whole += [h for h, pair in arch.paired.items() if suffix in pair]
            for h in whole:
                if pre + h in names:
                    shape = shape_of(pre + h)
                    out[pre + h] = _experts_rows(v, shape[0], shape[-1]) if shape and len(shape) == 3 else v
            for pattern, g in arch.experts.items():
                if g != suffix or pre + pattern.format(e=0) not in names:
                    continue
                have = next(e for e in range(len(names) + 1) if pre + pattern.format(e=e) not in names)
                shape = shape_of(pre + pattern.format(e=0))
                rows = _experts_rows(v, have, shape[-1]) if shape else v
                if rows.ndim != 2:
                    continue
                if have != rows.shape[0]:
                    raise FormatError(where, n, f"{rows.shape[0]} experts' rows, but layer {int(m.group(1))} of the "
                                                f"model has {have} experts (the imatrix of another model?)")
                out.update(zip((pre + pattern.format(e=e) for e in range(have)), rows))
    return {**shared, **out}


# llama.cpp's converter's layout options (--fuse-qkv, --fuse-gate-up-exps), which its graphs read beside the
# separate tensors: the fused tensor -> the separate ones whose rows it holds one after another (per expert)
CONVERTER_FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps")}


def _experts_rows(v: np.ndarray, experts: int, cols: int) -> np.ndarray:
    """A legacy .dat's [experts × cols] entry as [experts, cols]; anything else as it is."""
    return v.reshape(experts, cols) if v.ndim == 1 and experts > 1 and v.size == experts * cols else v


def importance_to_gguf(entries: dict, routed: dict, tokens: int, arch: "GGUFArch", where: str) -> dict:
    """The inverse of importance_to_hf, for writing llama.cpp's GGUF imatrix:
    HF-named means (a formats/imatrix.py Imatrix's entries, ``routed`` its
    rows per expert entry; where it has none, ``tokens``) -> llama.cpp name ->
    (means, counts). A one-to-one matrix keeps its means over ``tokens``; a
    model's per-expert matrices
    (Mixtral, Qwen3-MoE) become one [experts, cols] entry per layer and
    stack suffix, with each expert's routed rows as its count; a stack kept
    whole (gpt-oss) keeps its rows, gate_up_proj written under both
    ffn_gate_exps and ffn_up_exps (llama.cpp's two stacks see the same
    rows). An entry with no llama.cpp name is an error naming ``where``:
    an imatrix is not written with a matrix left out; but for latent
    attention's kv_b_proj, whose llama.cpp halves read other inputs (attn_k_b
    each head's q_nope, attn_v_b each head's attention output in the latent's
    space) than it does (the latent): llama-quantize takes them without one,
    as it takes what llama-imatrix leaves out."""
    out: dict[str, tuple] = {}
    experts: dict[str, dict[int, tuple]] = {}
    patterns = [(re.compile(re.escape(p).replace(r"\{e\}", r"(\d+)")), g) for p, g in arch.experts.items()]
    for name, v in entries.items():
        if arch.mla and name.endswith(MLA_KV_B[0]):
            continue
        count = np.asarray(routed.get(name, tokens), np.float64).reshape(-1)
        if v.ndim == 2 and count.size == 1:  # a stack's rows without their own counts (a .npz): each over the tokens
            count = np.full(len(v), count[0])
        g = gguf_layer_name(arch, name)
        m = _LAYER.fullmatch(name)
        fused = [f for f, parts in fused_parts(arch).items() if m and m.group(2) in parts]
        for f in fused:  # its parts share the input, and so the means (phi3's attn_qkv, ffn_up)
            out.setdefault(f"blk.{int(m.group(1))}.{f}", (v, count))
        if g is not None:
            out[g] = (v, count)
            continue
        if fused:
            continue
        pair = arch.paired.get(m.group(2)) if m else None
        if pair is not None:
            out.update({f"blk.{int(m.group(1))}.{g}": (v, count) for g in pair})
            continue
        hit = next(((int(e.group(1)), g) for p, g in patterns if m and (e := p.fullmatch(m.group(2)))), None)
        if hit is None:
            raise FormatError(where, name, f"has no tensor in llama.cpp's {arch.gguf}; refusing to write its "
                                           "imatrix without it")
        experts.setdefault(f"blk.{int(m.group(1))}.{hit[1]}", {})[hit[0]] = (v, count[0])
    for g, rows in experts.items():
        if sorted(rows) != list(range(len(rows))):
            raise FormatError(where, g, f"experts {sorted(rows)}: expected 0..{len(rows) - 1}, each once")
        out[g] = (np.stack([rows[e][0] for e in range(len(rows))]), np.array([rows[e][1] for e in range(len(rows))]))
    return out


def _dense(extra: dict[str, str] | None = None, norm_after: str = "ffn_norm") -> dict[str, str]:
    """HF suffix -> GGUF suffix of a layer's one-to-one tensors (weights and biases)."""
    out = {}
    for g, h in LAYER_NAMES.items():
        if g == "ffn_norm":
            out[f"{h}.weight"] = f"{norm_after}.weight"
            continue
        out[f"{h}.weight"] = f"{g}.weight"
        if g.startswith("attn_") and g != "attn_norm":
            out[f"{h}.bias"] = f"{g}.bias"
    out.update(extra or {})
    return out


@dataclass(frozen=True)
class GGUFArch:
    """One decoder architecture as llama.cpp writes it."""

    gguf: str                 # general.architecture
    hf_class: str             # the IEBIN / transformers class
    model_type: str
    permute_qk: bool          # llama.cpp's converter interleaves q/k rows (rotate-half pairs) for these
    layer: dict[str, str]     # HF suffix -> GGUF suffix, one to one
    experts: dict[str, str] = field(default_factory=dict)  # per-expert HF suffix ("{e}") -> GGUF stack suffix
    paired: dict[str, tuple[str, str]] = field(default_factory=dict)  # interleaved HF stack -> (even, odd) GGUF
    halves: bool = False  # a pair's two stacks are each expert's first and second half of rows (Llama 4's), not even/odd
    # fused GGUF suffix -> the fused HF tensor it is (formats/fused_tensors.py FUSED: the parts its rows hold)
    fused: dict[str, str] = field(default_factory=dict)
    # the same for fused tensors only older files hold, which the import reads and the export never writes
    # (qwen3next's ssm_in: q, k, v and z, before the converter wrote attn_qkv and attn_gate)
    fused_legacy: dict[str, str] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()  # {arch}.* keys the importer reads beyond every architecture's
    # llama.cpp's converter stores every RMSNorm weight (HF names ending in norm.weight) plus this:
    # Gemma's norms multiply by 1 + w, and llama.cpp's graph by the stored value
    norm_shift: float = 0.0
    swa_pattern: int = 0  # llama.cpp's default period of full-attention layers where a file has no pattern key
    mlp_act: str = "silu"  # the dense MLP's activation llama.cpp's graph applies (model_spec.MLP_ACTS' values)
    swa_window: int = 0    # llama.cpp's window where a file has no attention.sliding_window (0: no sliding layers)
    # Gemma: the block count llama.cpp takes for the 27B, whose attention scale it derives from hidden / heads
    # (every other size: from head_dim); 0: not derived
    scale_27b_layers: int = 0
    nope_step: int = 0  # every nope_step-th layer without RoPE, as llama.cpp's graph has them (0: none)
    swa_layers: int = 0  # llama.cpp slides only in a model of this many blocks (0: any that has a window)
    eot_token: str = ""  # the token llama.cpp's converter names the end of a turn, by its text (GLM's <|user|>)
    eom_token: str = ""  # and the end of a message (GLM-4.5's <|observation|>)
    layer_norm: bool = False  # LayerNorm, its eps under attention.layer_norm_epsilon (Cohere), not RMSNorm's key
    embed_head: bool = False  # llama.cpp's graph reads the embedding as the output head, whatever the file holds
    own_head: bool = False  # llama.cpp's loader requires an output.weight (no tied head)
    mla: bool = False  # latent attention: kv_b_proj crosses as attn_k_b and attn_v_b (MLA_KV_B)
    drops_mtp: bool = False  # the converter leaves the multi-token prediction layers out (DeepSeek-V3's)
    unshifted: tuple[str, ...] = ()  # HF norm suffixes norm_shift leaves as they are (Qwen3.5's gated DeltaNet norm)
    # Qwen3.5's gated DeltaNet: its tensors as the converter writes them (value heads in tiled order, A_log as
    # -exp(A_log), conv1d [channels, taps]); the import keeps the order (config.linear_value_head_order "tiled")
    linear: bool = False
    mtp_beside: bool = False  # the MTP layers under Hugging Face's mtp.* names (MTP_LAYERS, MTP_EXTRAS), not model.layers.N
    # LFM2's short convolutions: which layers by attention.head_count_kv, one per layer (0 where a layer
    # convolves), the taps under shortconv.l_cache, the taps' tensor [hidden, taps] (CONV_TAPS)
    short_conv: bool = False
    # Granite 4's Mamba2 layers: which by attention.head_count_kv as LFM2's (0 where a layer runs Mamba2), its dims
    # under ssm.*, A_log as -exp(A_log) (DECAY_RATES), A, D and the gated norm's weights 2-D (FLATTENED)
    mamba: bool = False
    # Nemotron-H's blocks, each one mixer: which by attention.head_count_kv and feed_forward_length, one per block
    # (Mamba2 where both are 0, attention where the KV heads are not, an MLP or experts where the width is not);
    # Mamba2's tensors as Granite 4's
    nemotron: bool = False
    # top-level GGUF name -> the HF name where the architecture's differs from _TOP's (Nemotron-H's model.embeddings)
    top: dict[str, str] = field(default_factory=dict)
    # a layer's one-value tensors llama.cpp reads as keys, one array over the layers each (not under {arch}.):
    # HF suffix -> (key, the tensor's shape) (Apertus's xIELU parameters, XIELU_KEYS)
    layer_keys: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    # the export writes {arch}.expert_gating_func of a sigmoid router where the architecture reads the key; False
    # where its converter writes none and llama.cpp's graph is sigmoid-gated without it (Nemotron-H's, AFMoE's)
    gating_key: bool = True

    @property
    def moe(self) -> bool:
        """Whether its files hold experts: stacked per expert, in pairs, or as stacks one to one (GraniteMoeSWA's)."""
        return bool(self.experts or self.paired) or any("_exps." in g for g in self.layer.values())


# An nvfp4 weight's quant keys and the F32 tensors llama.cpp's converter keeps them in beside X.weight (X.scale,
# X.input_scale: one value, or one per expert of a stack)
NVFP4_SCALES = {"tensor_scale": ".scale", "input_scale": ".input_scale"}

# Latent attention's kv_b_proj (HF suffix) and the two llama.cpp tensors it crosses as (gguf_names' docstring)
MLA_KV_B = ("self_attn.kv_b_proj.weight", "attn_k_b.weight", "attn_v_b.weight")
# {arch}.expert_gating_func of a softmax and a sigmoid router (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, _SIGMOID)
SOFTMAX_GATING, SIGMOID_GATING = 1, 2
_MOE_EXPS = {"gate": "ffn_gate_exps.weight", "up": "ffn_up_exps.weight", "down": "ffn_down_exps.weight"}


def _shexp(module: str) -> dict[str, str]:
    """A shared expert's MLP under ``module`` (GLM-4.5's mlp.shared_experts, Qwen2-MoE's mlp.shared_expert, Llama
    4's feed_forward.shared_expert) as llama.cpp's ffn_*_shexp."""
    return {f"{module}.{k}_proj.weight": f"ffn_{k}_shexp.weight" for k in ("gate", "up", "down")}


# Qwen3-MoE's experts (one tensor per expert, "{e}"), as every architecture that names them so (GLM-4.5, DeepSeek,
# OLMoE, Qwen2-MoE, ERNIE 4.5) has them stacked
_QWEN_EXPS = {f"mlp.experts.{{e}}.{k}_proj.weight": v for k, v in _MOE_EXPS.items()}
# Mixtral's (MiniMax-M2's): w1, w3, w2 for gate, up, down
_MIXTRAL_EXPS = {f"block_sparse_moe.experts.{{e}}.{w}.weight": _MOE_EXPS[k]
                 for w, k in (("w1", "gate"), ("w3", "up"), ("w2", "down"))}
_LLAMA = _dense()
_QK_NORM = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
# What convert_hf_to_gguf's HunYuan models assume of an NTK-alpha RoPE ("dynamic" with an alpha): the base it
# stretches (it asserts 10000), and the context it states for every such model, whatever the config says
HUNYUAN_NTK_BASE, HUNYUAN_NTK_CONTEXT = 10000.0, 256 * 1024
# HunYuan's per-head q/k norms (query_layernorm, key_layernorm)
_HUNYUAN_QK_NORM = {"self_attn.query_layernorm.weight": "attn_q_norm.weight",
                    "self_attn.key_layernorm.weight": "attn_k_norm.weight"}
# LayerNorm's biases beside its weights (StableLM's, StarCoder2's, Nemotron's)
_NORM_BIASES = {"input_layernorm.bias": "attn_norm.bias", "post_attention_layernorm.bias": "ffn_norm.bias"}
# Apertus's xIELU parameters (model_spec.XIELU_VECTORS) as convert_hf_to_gguf's ApertusModel writes them: raw (the
# checkpoint's values; llama.cpp's ggml_xielu takes the softplus), one float32 array over the layers per key
XIELU_KEYS = {f"mlp.{hf}": ("xielu." + hf.rpartition(".")[2], shape) for hf, shape in XIELU_VECTORS.values()}
# Apertus's layer: Llama's names under its norm names, per-head q/k norms
_APERTUS = {k.replace("post_attention_layernorm", "feedforward_layernorm").replace("input_layernorm",
                                                                                   "attention_layernorm"): v
            for k, v in _dense(_QK_NORM).items()}
# Gemma's sandwich: its post_attention_layernorm normalizes the attention's output
_GEMMA_NORMS = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}

# OLMo 2 and 3: no norm before the blocks; their outputs' norms under Gemma's names
_OLMO2 = {**{k: v for k, v in _dense(_QK_NORM).items()
             if k not in ("input_layernorm.weight", "post_attention_layernorm.weight")},
          "post_attention_layernorm.weight": "post_attention_norm.weight",
          "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}

# Cohere's layer: one norm (attn_norm) before its parallel attention and MLP, no biases
_COHERE = {k: v for k, v in _LLAMA.items() if not k.endswith(".bias") and not k.startswith("post_attention_")}

# The multi-token prediction layer's own tensors (GLM-4.5's, GLM-4.7-Flash's), beside a whole layer's
_NEXTN = {f"{h}.weight": f"nextn.{g}.weight" for h, g in (
    ("eh_proj", "eh_proj"), ("enorm", "enorm"), ("hnorm", "hnorm"), ("embed_tokens", "embed_tokens"),
    ("shared_head.norm", "shared_head_norm"), ("shared_head.head", "shared_head_head"))}
# Hy3's MTP layer: GLM-4.5's tensors, its last norm named final_layernorm
_HY_V3_NEXTN = {**{h: g for h, g in _NEXTN.items() if h != "shared_head.norm.weight"},
                "final_layernorm.weight": "nextn.shared_head_norm.weight"}
# DeepSeek's layer as convert_hf_to_gguf's DeepseekV2Model names it, but kv_b_proj (MLA_KV_B) and the choice bias
_DEEPSEEK2 = {**{k: v for k, v in _LLAMA.items() if not k.startswith("self_attn.") or k.startswith(
                 ("self_attn.q_proj.weight", "self_attn.o_proj.weight"))},
              "self_attn.q_a_proj.weight": "attn_q_a.weight", "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
              "self_attn.q_b_proj.weight": "attn_q_b.weight",
              "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
              "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
              **_shexp("mlp.shared_experts")}
# DeepSeek-V3's router and layers as convert_hf_to_gguf writes them (GLM-4.5's, dots.llm1's, Solar Open's, ...)
_V3_ROUTER_KEYS = frozenset({"expert_shared_count", "leading_dense_block_count", "expert_weights_scale",
                             "expert_weights_norm", "expert_gating_func", "expert_group_count",
                             "expert_group_used_count"})
_DEEPSEEK2_KEYS = _V3_ROUTER_KEYS | {"attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla",
                                    "attention.value_length_mla", "rope.scaling.yarn_log_multiplier"}
_BIAS = {"mlp.gate.e_score_correction_bias": "exp_probs_b.bias"}
# Qwen3.5's gated DeltaNet (convert_hf_to_gguf's Qwen3NextModel names): its projections, convolution, decay
# (A_log, stored -exp(A_log)), step bias, gated norm and output
_LINEAR = {"linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
           "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
           "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.A_log": "ssm_a",
           "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.norm.weight": "ssm_norm.weight",
           "linear_attn.out_proj.weight": "ssm_out.weight"}
# A_log, which llama.cpp's converter stores as -exp(A_log): gated DeltaNet's, Mamba2's
DECAY_RATES = ("linear_attn.A_log", "mamba.A_log", "mixer.A_log")
# What Qwen3.5's two architectures share: the DeltaNet's dims as ssm.* keys, the layers' kinds, the MTP blocks; every
# norm but the DeltaNet's stored 1 + w; the MTP layers beside the model
_QWEN35_KEYS = frozenset({"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
                          "attention.recurrent_layers", "full_attention_interval", "rope.dimension_sections",
                          "nextn_predict_layers"})
_QWEN35 = dict(norm_shift=1.0, unshifted=("linear_attn.norm.weight",), linear=True, mtp_beside=True)
# experts in every layer: llama.cpp's converter writes no feed_forward_length (Solar Open's config has no dense width)
NO_DENSE_MLP = ("Qwen3_5MoeForCausalLM", "SolarOpenForCausalLM")
# Qwen3.5's multi-token prediction block: Hugging Face keeps it beside the model (mtp.layers.I: a full-attention
# layer; mtp.fc, its two input norms and its output norm), llama.cpp as blocks after the last (blk.N+I with the
# nextn.* tensors of the first), every norm stored 1 + w
MTP_LAYERS = "mtp.layers."
MTP_EXTRAS = {"mtp.fc.weight": "nextn.eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
              "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight", "mtp.norm.weight": "nextn.shared_head_norm.weight"}
# architectures whose converter writes each head's rotated q/k rows in NeoX's order (evens, then odds) where the file
# has rope.dimension_sections, its RoPE being interleaved pairs otherwise (GLM-4V's language model: glm4)
MROPE_NEOX = ("glm4",)
# convolutions' taps (gated DeltaNet's conv1d, LFM2's short convolution): [channels, 1, taps] in Hugging Face's
# layout, [channels, taps] in GGUF, the same bytes
CONV_TAPS = ("linear_attn.conv1d.weight", "conv.conv.weight", "mamba.conv1d.weight", "mixer.conv1d.weight")
# Mamba2's vectors llama.cpp keeps 2-D (and F32), the same bytes: A and D [heads, 1], the gated norm's weights
# [groups, inner / groups] (gguf_2d_shape)
FLATTENED = ("mamba.A_log", "mamba.D", "mamba.norm.weight", "mixer.A_log", "mixer.D", "mixer.norm.weight")


def gguf_2d_shape(hf: str, n: int, groups: int) -> list[int] | None:
    """llama.cpp's shape of the FLATTENED vector ``hf`` of ``n`` elements (``groups``: Mamba2's groups of B and C),
    or None for any other tensor."""
    if not hf.endswith(FLATTENED):
        return None
    rows = groups if hf.endswith(("mamba.norm.weight", "mixer.norm.weight")) else n
    return [rows, n // rows]

# Granite 4's layer (models/granitemoehybrid) as convert_hf_to_gguf's GraniteHybridModel names it: Llama's attention
# beside Mamba2's tensors (ssm_*), its MLP under ffn_*_shexp beside experts (ffn_gate_exps and ffn_up_exps the halves
# of each expert's input_linear), or, without experts, under the dense MLP's names
_GRANITE_MAMBA = {"mamba.in_proj.weight": "ssm_in.weight", "mamba.conv1d.weight": "ssm_conv1d.weight",
                  "mamba.conv1d.bias": "ssm_conv1d.bias", "mamba.dt_bias": "ssm_dt.bias", "mamba.A_log": "ssm_a",
                  "mamba.D": "ssm_d", "mamba.norm.weight": "ssm_norm.weight", "mamba.out_proj.weight": "ssm_out.weight"}
_GRANITE_SHARED = ("shared_mlp.gate_proj.weight", "shared_mlp.up_proj.weight", "shared_mlp.output_linear.weight")
# Granite's four multipliers (gguf-py's add_embedding_scale, add_attention_scale, add_residual_scale, add_logit_scale)
_GRANITE_SCALES = frozenset({"embedding_scale", "attention.scale", "residual_scale", "logit_scale"})
_GRANITE_KEYS = _GRANITE_SCALES | {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size",
                                   "ssm.time_step_rank", "expert_shared_feed_forward_length"}


# Granite SWA: granite's layer with gpt-oss's sinks (attn_sinks), its window and sliding layers by a pattern llama.cpp
# requires, the layers without RoPE by attention.rope_pattern (one base for every layer)
_GRANITE_SWA = _dense({"self_attn.sinks": "attn_sinks.weight"})
_GRANITE_SWA_KEYS = _GRANITE_SCALES | {"attention.sliding_window", "attention.sliding_window_pattern",
                                       "attention.rope_pattern"}
# Granite's experts (3.x MoE, 4.0 H): the router and output_linear one to one, input_linear's halves (GRANITE_PAIRED)
_GRANITE_EXPERTS = {"block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
                    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight"}
GRANITE_PAIRED = {"block_sparse_moe.input_linear.weight": ("ffn_gate_exps.weight", "ffn_up_exps.weight")}
_GRANITE_SHEXP = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
_GRANITE_ATTN = {k: v for k, v in _LLAMA.items() if not k.startswith("mlp.")}


def _granite4(mlp: tuple[str, str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """Granite's attention layer with Mamba2's tensors and its shared MLP under llama.cpp's ``mlp`` names (gate,
    up, down)."""
    return {**_GRANITE_ATTN, **_GRANITE_MAMBA, **{h: f"{g}.weight" for h, g in zip(_GRANITE_SHARED, mlp)},
            **(extra or {})}

# Nemotron-H's blocks (models/nemotron_h) as convert_hf_to_gguf's NemotronHModel names them: each block's norm as
# attn_norm; Mamba2's tensors as Granite 4's, attention's and the ReLU-squared MLP's (up and down alone) as Llama's,
# all under mixer. (q/k rows interleaved as the converter's LlamaModel does, though no RoPE turns them); with experts (nemotron_h_moe), DeepSeek-V3's router and choice bias, the shared expert as
# ffn_*_shexp, the experts' up and down as stacks
_NEMOTRON = {"norm.weight": "attn_norm.weight",
             **{"mixer." + h.removeprefix("mamba."): g for h, g in _GRANITE_MAMBA.items()},
             **{f"mixer.{p}_proj.weight": f"attn_{p}.weight" for p in "qkv"}, "mixer.o_proj.weight": "attn_output.weight"}
_NEMOTRON_MLP = {"mixer.up_proj.weight": "ffn_up.weight", "mixer.down_proj.weight": "ffn_down.weight"}
_NEMOTRON_MOE = {"mixer.gate.weight": "ffn_gate_inp.weight", "mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
                 "mixer.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
                 "mixer.shared_experts.down_proj.weight": "ffn_down_shexp.weight"}
_NEMOTRON_KEYS = frozenset({"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size",
                            "ssm.time_step_rank", "attention.layer_norm_epsilon"})
_NEMOTRON_TOP = {"token_embd": "model.embeddings", "output_norm": "model.norm_f"}

# Falcon-H1's layer (models/falcon_h1) as convert_hf_to_gguf's FalconH1Model writes it: Llama's attention (rows as
# they are: llama.cpp turns NeoX pairs) beside Granite 4's Mamba2 tensors without the gated norm, in every layer;
# pre_ff_layernorm as ffn_norm with no .weight (as llama.cpp's loader names it); the MLP under feed_forward
_FALCON_H1 = {"input_layernorm.weight": "attn_norm.weight",
              **{f"self_attn.{p}_proj.weight": f"attn_{p}.weight" for p in "qkv"},
              "self_attn.o_proj.weight": "attn_output.weight",
              **{k: v for k, v in _GRANITE_MAMBA.items() if k != "mamba.norm.weight"},
              "pre_ff_layernorm.weight": "ffn_norm",
              **{f"feed_forward.{p}_proj.weight": f"ffn_{p}.weight" for p in ("gate", "up", "down")}}



def falcon_h1_factors(cfg: dict[str, Any], name: str, rows: int) -> list[Any]:
    """The muP multipliers convert_hf_to_gguf's FalconH1Model multiplies Falcon-H1's tensor ``name`` (an HF name, of
    ``rows`` rows) by, in its order, each rounding to the tensor's type (FalconH1Config's 1.0 where a key is absent;
    [] for a tensor it leaves alone): a float for every row, or float32 [rows] for Mamba2's in_proj, whose row groups
    z, x, B, C, dt take ssm_multipliers' five after ssm_in_multiplier. A tied head is the embedding, which takes
    embedding_multiplier alone."""
    def get(key: str, n: int = 0) -> Any:
        v = cfg.get(key)
        return (1.0 if v is None else float(v)) if not n else ([1.0] * n if v is None else [float(x) for x in v])

    suffix = name.split(".", 3)[3] if name.startswith("model.layers.") else name
    a_in = get("attention_in_multiplier")
    if suffix == "mamba.in_proj.weight":
        inner = int(cfg.get("mamba_d_ssm") or cfg.get("mamba_expand", 2) * cfg["hidden_size"])
        gn = int(cfg["mamba_n_groups"]) * int(cfg["mamba_d_state"])
        ends = np.cumsum([inner, inner, gn, gn, rows - 2 * inner - 2 * gn])
        groups = np.searchsorted(ends, np.arange(rows), side="right")
        return [get("ssm_in_multiplier"), np.asarray(get("ssm_multipliers", 5), np.float32)[groups]]
    return {"model.embed_tokens.weight": [get("embedding_multiplier")], "lm_head.weight": [get("lm_head_multiplier")],
            "self_attn.q_proj.weight": [a_in], "self_attn.k_proj.weight": [get("key_multiplier"), a_in],
            "self_attn.v_proj.weight": [a_in], "self_attn.o_proj.weight": [get("attention_out_multiplier")],
            "mamba.out_proj.weight": [get("ssm_out_multiplier")],
            "feed_forward.gate_proj.weight": [get("mlp_multipliers", 2)[0]],
            "feed_forward.down_proj.weight": [get("mlp_multipliers", 2)[1]]}.get(suffix, [])


# Mamba 1's layer (models/mamba, models/falcon_mamba) as convert_hf_to_gguf's MambaModel writes it: its norm as
# attn_norm, its mixer's tensors one to one (A_log as -exp(A_log) [channels, state], D and the biases 1-D), the
# model's under backbone. (Nemotron-H's top names)
_MAMBA1 = {"norm.weight": "attn_norm.weight", "mixer.in_proj.weight": "ssm_in.weight",
           "mixer.conv1d.weight": "ssm_conv1d.weight", "mixer.conv1d.bias": "ssm_conv1d.bias",
           "mixer.x_proj.weight": "ssm_x.weight", "mixer.dt_proj.weight": "ssm_dt.weight",
           "mixer.dt_proj.bias": "ssm_dt.bias", "mixer.A_log": "ssm_a", "mixer.D": "ssm_d",
           "mixer.out_proj.weight": "ssm_out.weight"}
_MAMBA1_KEYS = frozenset({"ssm.conv_kernel", "ssm.state_size", "ssm.inner_size", "ssm.time_step_rank",
                          "ssm.dt_b_c_rms"})

# LFM2's layer (models/lfm2), one to one: Qwen3's attention under its names beside the short convolution's tensors
_LFM2 = {"operator_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
         **{f"self_attn.{p}_proj.weight": f"attn_{p}.weight" for p in "qkv"},
         "self_attn.out_proj.weight": "attn_output.weight", "self_attn.q_layernorm.weight": "attn_q_norm.weight",
         "self_attn.k_layernorm.weight": "attn_k_norm.weight", "feed_forward.w1.weight": "ffn_gate.weight",
         "feed_forward.w3.weight": "ffn_up.weight", "feed_forward.w2.weight": "ffn_down.weight",
         "conv.in_proj.weight": "shortconv.in_proj.weight", "conv.conv.weight": "shortconv.conv.weight",
         "conv.out_proj.weight": "shortconv.out_proj.weight"}

ARCHS: dict[str, GGUFArch] = {a.hf_class: a for a in (
    GGUFArch("llama", "LlamaForCausalLM", "llama", True, _LLAMA),
    # llama.cpp converts Mistral and Mixtral as "llama" (convert_hf_to_gguf: LlamaModel)
    GGUFArch("llama", "MistralForCausalLM", "mistral", True, _LLAMA),
    GGUFArch("llama", "MixtralForCausalLM", "mixtral", True,
             {**_dense(), "block_sparse_moe.gate.weight": "ffn_gate_inp.weight"},
             experts=_MIXTRAL_EXPS),
    GGUFArch("qwen2", "Qwen2ForCausalLM", "qwen2", False, _LLAMA),
    GGUFArch("qwen3", "Qwen3ForCausalLM", "qwen3", False, _dense(_QK_NORM)),
    GGUFArch("qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe", False,
             _dense({**_QK_NORM, "mlp.gate.weight": "ffn_gate_inp.weight"}),
             experts=_QWEN_EXPS),
    # Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's layer, Qwen3-MoE's experts, the shared expert as ffn_*_shexp
    # beside its gate, an F32 [hidden] row (ffn_gate_inp_shexp)
    GGUFArch("qwen2moe", "Qwen2MoeForCausalLM", "qwen2_moe", False,
             _dense({"mlp.gate.weight": "ffn_gate_inp.weight",
                     **_shexp("mlp.shared_expert"),
                     "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}),
             experts=_QWEN_EXPS,
             keys=frozenset({"expert_shared_feed_forward_length"}), own_head=True),
    # MiniMax-M2: Mixtral's experts with the block's choice bias as exp_probs_b, sigmoid-gated (expert_gating_func),
    # whole-projection q/k norms, rotate-half RoPE over rope.dimension_count dims: rows as they are
    GGUFArch("minimax-m2", "MiniMaxM2ForCausalLM", "minimax_m2", False,
             _dense({**_QK_NORM, "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
                     "block_sparse_moe.e_score_correction_bias": "exp_probs_b.bias"}),
             experts=_MIXTRAL_EXPS,
             keys=frozenset({"expert_gating_func"}), own_head=True),
    # OLMoE: Qwen3-MoE's names with OLMo 2's whole-projection q/k norms, rows as they are
    GGUFArch("olmoe", "OlmoeForCausalLM", "olmoe", False,
             _dense({**_QK_NORM, "mlp.gate.weight": "ffn_gate_inp.weight"}),
             experts=_QWEN_EXPS, own_head=True),
    GGUFArch("gpt-oss", "GptOssForCausalLM", "gpt_oss", False,
             _dense({"self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
                     "mlp.router.bias": "ffn_gate_inp.bias", "mlp.experts.down_proj": "ffn_down_exps.weight",
                     "mlp.experts.down_proj_bias": "ffn_down_exps.bias"}, norm_after="post_attention_norm"),
             paired={"mlp.experts.gate_up_proj": ("ffn_gate_exps.weight", "ffn_up_exps.weight"),
                     "mlp.experts.gate_up_proj_bias": ("ffn_gate_exps.bias", "ffn_up_exps.bias")},
             keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern"}), swa_pattern=2),
    # Gemma 1: Llama's names, rows as they are (NeoX RoPE), its norms stored as 1 + w; the embedding is the head
    GGUFArch("gemma", "GemmaForCausalLM", "gemma", False, _LLAMA, norm_shift=1.0, mlp_act="gelu_tanh",
             embed_head=True),
    GGUFArch("gemma2", "Gemma2ForCausalLM", "gemma2", False, _dense(_GEMMA_NORMS),
             keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa",
                             "attn_logit_softcapping", "final_logit_softcapping"}),
             norm_shift=1.0, swa_pattern=2, mlp_act="gelu_tanh", swa_window=4096, scale_27b_layers=46,
             embed_head=True),
    GGUFArch("gemma3", "Gemma3ForCausalLM", "gemma3_text", False, _dense({**_QK_NORM, **_GEMMA_NORMS}),
             keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"}),
             norm_shift=1.0, swa_pattern=6, mlp_act="gelu_tanh", scale_27b_layers=62),
    # OLMo 2: rows as they are (convert_hf_to_gguf's Olmo2Model is no LlamaModel); no norm before the blocks,
    # the norms of their outputs under Gemma's names, q/k norms over the whole projections
    GGUFArch("olmo2", "Olmo2ForCausalLM", "olmo2", False, _OLMO2),
    # OLMo 3: llama.cpp's olmo2 with a window (how the import tells them apart), sliding layers by a pattern
    # (every 4th full without one), their RoPE the full layers' base without YaRN
    GGUFArch("olmo2", "Olmo3ForCausalLM", "olmo3", False, _OLMO2, swa_pattern=4,
             keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"})),
    # Granite 3: Llama's layer and names with four multipliers as keys (gguf-py's add_embedding_scale,
    # add_attention_scale, add_residual_scale, add_logit_scale)
    GGUFArch("granite", "GraniteForCausalLM", "granite", True, _LLAMA,
             keys=_GRANITE_SCALES),
    # Granite SWA (_GRANITE_SWA), without experts
    GGUFArch("granite_swa", "GraniteSWAForCausalLM", "granite_swa", True, _GRANITE_SWA, keys=_GRANITE_SWA_KEYS),
    # with experts (expert_count > 0: GraniteMoeSWA): the router, the stacks one to one (gate_up_proj, gate's rows then
    # up's, as ffn_gate_up_exps: what the converter writes), the shared MLP's input_linear fused as ffn_up_shexp (the
    # one layout llama.cpp's granite_swa reads)
    GGUFArch("granite_swa", "GraniteMoeSWAForCausalLM", "granitemoe_swa", True,
             {**{k: v for k, v in _GRANITE_SWA.items() if not k.startswith("mlp.")},
              "block_sparse_moe.router.weight": "ffn_gate_inp.weight",
              "block_sparse_moe.experts.gate_up_proj": "ffn_gate_up_exps.weight",
              "block_sparse_moe.experts.down_proj": "ffn_down_exps.weight",
              "shared_mlp.output_linear.weight": "ffn_down_shexp.weight"},
             fused={"ffn_up_shexp.weight": "shared_mlp.input_linear.weight"},
             keys=_GRANITE_SWA_KEYS | {"expert_shared_feed_forward_length"}),
    # SmolLM3: Llama's layer, q/k rows interleaved as for llama; llama.cpp leaves every 4th layer unrotated
    # (its n_no_rope_layer_step, read from no file)
    GGUFArch("smollm3", "SmolLM3ForCausalLM", "smollm3", True, _LLAMA, nope_step=4),
    # Arcee (AFM-4.5B): Llama's layer, q/k rows interleaved as for llama, its MLP ffn_up and ffn_down alone (ReLU
    # squared between, no gate)
    GGUFArch("arcee", "ArceeForCausalLM", "arcee", True, _LLAMA, mlp_act="relu2"),
    # StableLM (StableLM 2 1.6B, StableLM 3B, Stable Code 3B): Llama's names, rows as they are (NeoX RoPE over
    # rope.dimension_count dims), LayerNorms with biases (attention.layer_norm_epsilon); q/k/v biases where stored;
    # llama.cpp's graph runs the parallel layer where a block has no ffn_norm (use_parallel_residual, descriptive)
    # OLMo 1: Llama's names and q/k reordering without norm tensors (its LayerNorms have no weights; llama.cpp's olmo
    # graph norms with none), the eps under LayerNorm's key, clip_qkv as attention.clamp_kqv
    GGUFArch("olmo", "OlmoForCausalLM", "olmo", True, {k: v for k, v in _LLAMA.items() if "norm" not in v},
             keys=frozenset({"attention.layer_norm_epsilon", "attention.clamp_kqv"}), layer_norm=True),
    GGUFArch("stablelm", "StableLmForCausalLM", "stablelm", False,
             _dense(_NORM_BIASES),
             keys=frozenset({"attention.layer_norm_epsilon", "use_parallel_residual"}), layer_norm=True,
             own_head=True),
    # Nemotron (Nemotron-Mini-4B, Minitron): Llama's names with the LayerNorms' biases, their weights stored as 1 + w
    # (LayerNorm1P's), ffn_up and ffn_down alone (ReLU squared between); rows as they are (NeoX RoPE)
    GGUFArch("nemotron", "NemotronForCausalLM", "nemotron", False,
             _dense(_NORM_BIASES),
             keys=frozenset({"attention.layer_norm_epsilon"}), layer_norm=True, norm_shift=1.0, mlp_act="relu2",
             own_head=True),
    # Phi-2, Phi-1.5: one LayerNorm (attn_norm, with its bias) for the parallel attention and MLP, every projection's
    # bias, self_attn.dense as attn_output, fc1 and fc2 as ffn_up and ffn_down (GELU between, no gate), the head's
    # bias as output.bias; rows as they are (NeoX RoPE over rope.dimension_count dims)
    GGUFArch("phi2", "PhiForCausalLM", "phi", False,
             {**{f"self_attn.{p}_proj.{w}": f"attn_{p}.{w}" for p in "qkv" for w in ("weight", "bias")},
              **{f"{h}.{w}": f"{g}.{w}" for h, g in (("input_layernorm", "attn_norm"),
                                                     ("self_attn.dense", "attn_output"), ("mlp.fc1", "ffn_up"),
                                                     ("mlp.fc2", "ffn_down")) for w in ("weight", "bias")}},
             keys=frozenset({"attention.layer_norm_epsilon"}), layer_norm=True, mlp_act="gelu_tanh", own_head=True,
             top={"output_norm": "model.final_layernorm"}),
    # StarCoder2: Llama's attention names, every projection's bias, LayerNorms with biases, its MLP's c_fc and c_proj
    # as ffn_up and ffn_down (GELU between, no gate); rows as they are (NeoX RoPE); no window (llama.cpp's graph
    # attends to every position)
    GGUFArch("starcoder2", "Starcoder2ForCausalLM", "starcoder2", False,
             {**{k: v for k, v in _LLAMA.items() if not k.startswith("mlp.")},
              "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_fc.bias": "ffn_up.bias",
              "mlp.c_proj.weight": "ffn_down.weight", "mlp.c_proj.bias": "ffn_down.bias",
              **_NORM_BIASES},
             keys=frozenset({"attention.layer_norm_epsilon"}), layer_norm=True, mlp_act="gelu_tanh"),
    # EXAONE MoE (K-EXAONE) as convert_hf_to_gguf's ExaoneMoEModel writes it: Llama's names with per-head q/k norms,
    # rows as they are; after leading_dense_block_count dense layers, the router, its choice bias (the block's own
    # e_score_correction_bias) as exp_probs_b.bias, Qwen3-MoE's experts, the shared ones as ffn_*_shexp; sliding
    # layers by the pattern, the full ones unrotated; its MTP layers (dense) after the last, from mtp.* beside the model
    GGUFArch("exaone-moe", "ExaoneMoeForCausalLM", "exaone_moe", False,
             _dense({**_QK_NORM, "mlp.gate.weight": "ffn_gate_inp.weight",
                     "mlp.e_score_correction_bias": "exp_probs_b.bias", **_shexp("mlp.shared_experts")}),
             experts=_QWEN_EXPS,
             keys=_V3_ROUTER_KEYS | {"attention.sliding_window", "attention.sliding_window_pattern",
                                     "expert_shared_feed_forward_length", "nextn_predict_layers"},
             swa_pattern=4, mtp_beside=True),
    # Jais 2: Llama's names with every projection's bias, LayerNorms' biases, ffn_up and ffn_down with theirs (ReLU
    # squared between, no gate); rows as they are (NeoX RoPE)
    GGUFArch("jais2", "Jais2ForCausalLM", "jais2", False,
             {**{k: v for k, v in _LLAMA.items() if not k.startswith("mlp.gate_proj")},
              "mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias", **_NORM_BIASES},
             keys=frozenset({"attention.layer_norm_epsilon"}), layer_norm=True, mlp_act="relu2"),
    # EXAONE 4: OLMo 2's names (its norms of the blocks' outputs; q/k norms per head), rows as they are
    # (convert_hf_to_gguf's Exaone4Model is no LlamaModel); llama.cpp slides only in the 64-layer 32B, every
    # 4th layer full and unrotated there by default, and every layer full and rotated in any other size
    # LFM2, LFM2.5 (dense): rows as they are (NeoX RoPE); attention.head_count_kv one per layer, 0 where it convolves
    GGUFArch("lfm2", "Lfm2ForCausalLM", "lfm2", False, _LFM2, keys=frozenset({"shortconv.l_cache"}),
             short_conv=True),
    # LFM2-8B-A1B: LFM2's layers; after the leading_dense_block_count dense ones, experts as ffn_*_exps stacks, the
    # router ffn_gate_inp and its choice bias exp_probs_b, sigmoid-gated (llama.cpp's lfm2moe graph renormalises
    # the top k always and never scales them)
    GGUFArch("lfm2moe", "Lfm2MoeForCausalLM", "lfm2_moe", False,
             {**_LFM2, "feed_forward.gate.weight": "ffn_gate_inp.weight",
              "feed_forward.expert_bias": "exp_probs_b.bias"},
             experts={f"feed_forward.experts.{{e}}.{w}.weight": _MOE_EXPS[k]
                      for w, k in (("w1", "gate"), ("w3", "up"), ("w2", "down"))},
             keys=frozenset({"shortconv.l_cache", "leading_dense_block_count", "expert_gating_func"}),
             short_conv=True),
    # Granite 4.0 H (Tiny, Small): Mamba2 layers beside attention ones (q/k rows interleaved as for llama), experts
    # softmax-routed beside the shared MLP; RoPE only where rope.scaling.finetuned is true (llama.cpp's switch),
    # which the converter writes for a model without Mamba2 layers alone. Granite 4.0 H Micro, 1B, 350M: the same
    # without experts (GRANITE_HYBRID_DENSE)
    GGUFArch("granitehybrid", "GraniteMoeHybridForCausalLM", "granitemoehybrid", True,
             _granite4(_GRANITE_SHEXP, _GRANITE_EXPERTS), paired=GRANITE_PAIRED, halves=True, keys=_GRANITE_KEYS,
             mamba=True),
    # Granite 3.0 and 3.1 MoE (1B-A400M, 3B-A800M): granite's layer and keys with granitehybrid's experts; with a
    # shared MLP (expert_shared_feed_forward_length > 0) GraniteMoeShared
    GGUFArch("granitemoe", "GraniteMoeForCausalLM", "granitemoe", True, {**_GRANITE_ATTN, **_GRANITE_EXPERTS},
             paired=GRANITE_PAIRED, halves=True,
             keys=_GRANITE_SCALES),
    # Nemotron 3 Nano (30B-A3B): Nemotron-H's blocks with experts (nemotron_h_moe); without them, NEMOTRON_H_DENSE
    GGUFArch("nemotron_h_moe", "NemotronHForCausalLM", "nemotron_h", True, {**_NEMOTRON, **_NEMOTRON_MOE},
             experts={f"mixer.experts.{{e}}.{k}_proj.weight": _MOE_EXPS[k] for k in ("up", "down")},
             keys=_NEMOTRON_KEYS | {"expert_shared_feed_forward_length", "expert_shared_count", "expert_weights_norm",
                                    "expert_weights_scale", "expert_gating_func", "expert_group_count",
                                    "expert_group_used_count"},
             nemotron=True, top=_NEMOTRON_TOP, mlp_act="relu2", gating_key=False),
    GGUFArch("granitemoe", "GraniteMoeSharedForCausalLM", "granitemoeshared", True,
             {**_GRANITE_ATTN, **_GRANITE_EXPERTS,
              **{h: f"{g}.weight" for h, g in zip(_GRANITE_SHARED, _GRANITE_SHEXP)}},
             paired=GRANITE_PAIRED, halves=True,
             keys=_GRANITE_SCALES | {"expert_shared_feed_forward_length"}),
    GGUFArch("exaone4", "Exaone4ForCausalLM", "exaone4", False, _OLMO2,
             keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"}),
             swa_pattern=4, swa_window=4096, swa_layers=64),
    # Mamba-2 (Mamba-Codestral-7B) as convert_hf_to_gguf's Mamba2Model writes it: Nemotron-H's Mamba2 block in every
    # layer (its norm and mixer. tensors, the model's under backbone.), no attention, no MLP
    GGUFArch("mamba2", "Mamba2ForCausalLM", "mamba2", False,
             {k: v for k, v in _NEMOTRON.items() if not k.startswith(("mixer.q_", "mixer.k_", "mixer.v_", "mixer.o_"))},
             keys=_NEMOTRON_KEYS - {"attention.layer_norm_epsilon"}, top=_NEMOTRON_TOP),
    # Mamba 1 (state-spaces' Mamba 130M to 2.8B) and Falcon Mamba 7B (ssm.dt_b_c_rms true: dt's low rank, B and C
    # RMS-normed): llama.cpp's mamba, its selective scan alone in every layer, no attention, no MLP
    GGUFArch("mamba", "MambaForCausalLM", "mamba", False, _MAMBA1, keys=_MAMBA1_KEYS, top=_NEMOTRON_TOP),
    GGUFArch("mamba", "FalconMambaForCausalLM", "falcon_mamba", False, _MAMBA1, keys=_MAMBA1_KEYS, top=_NEMOTRON_TOP),
    # Falcon-H1 (0.5B to 34B): every layer Mamba2 beside attention (_FALCON_H1), the Mamba2 dims under
    # ssm.*; the converter multiplies the muP multipliers into the matrices (FALCON_H1_BAKED) and writes none
    GGUFArch("falcon-h1", "FalconH1ForCausalLM", "falcon_h1", False, _FALCON_H1,
             keys=_NEMOTRON_KEYS - {"attention.layer_norm_epsilon"}, top={"output_norm": "model.final_layernorm"}),
    # GLM-4 (0414, Z1): interleaved RoPE, which is llama.cpp's own (ROPE_TYPE_NORM), so rows as they are;
    # rope.dimension_count the rotated half; its four norms (input, post_self_attn, post_attention, post_mlp) as
    # attn_norm, post_attention_norm, ffn_norm, post_ffw_norm; gate_up_proj fused into ffn_up as phi3's. GLM-4.1V's
    # and GLM-4.6V-Flash's language model adds rope.dimension_sections (MRoPE, one RoPE for text), where the
    # converter turns each head's rotated q/k rows to NeoX's order (llama.cpp's MRoPE has no other): MROPE_NEOX
    GGUFArch("glm4", "Glm4ForCausalLM", "glm4", False,
             {**{k: v for k, v in _LLAMA.items()
                 if not k.startswith(("mlp.gate_proj.", "mlp.up_proj.", "post_attention_layernorm."))},
              "post_self_attn_layernorm.weight": "post_attention_norm.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "post_mlp_layernorm.weight": "post_ffw_norm.weight"},
             fused={"ffn_up.weight": "mlp.gate_up_proj.weight"}, eot_token="<|user|>",
             keys=frozenset({"rope.dimension_sections"})),
    # GLM-4.5, GLM-4.5-Air, GLM-4.6: rows as they are (rotate-half RoPE over rope.dimension_count dims); the
    # first leading_dense_block_count layers dense, the others' router sigmoid-gated with its choice bias as
    # exp_probs_b, the shared experts as ffn_*_shexp; the multi-token prediction layer after the last (blk.N with
    # nextn.* tensors besides a whole layer's), which llama.cpp's graph leaves to speculative decoding. GLM-4.5V's
    # and GLM-4.6V's language model adds rope.dimension_sections (MRoPE over the same rotate-half pairs, rows as
    # they are: one RoPE for text)
    GGUFArch("glm4moe", "Glm4MoeForCausalLM", "glm4_moe", False,
             _dense({**_QK_NORM, "mlp.gate.weight": "ffn_gate_inp.weight",
                     "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
                     **_shexp("mlp.shared_experts"),
                     **_NEXTN},
                    norm_after="post_attention_norm"),
             experts=_QWEN_EXPS,
             keys=_V3_ROUTER_KEYS | {"nextn_predict_layers", "rope.dimension_sections"},
             eot_token="<|user|>", eom_token="<|observation|>"),
    # Solar Open as convert_hf_to_gguf's SolarOpenModel (a Glm4MoeModel) writes it: GLM-4.5's file with experts in
    # every layer, no q/k norms, no MTP layers, no dense width; its import is GLM-4.5's (the same model)
    GGUFArch("glm4moe", "SolarOpenForCausalLM", "solar_open", False,
             _dense({"mlp.gate.weight": "ffn_gate_inp.weight",
                     "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", **_shexp("mlp.shared_experts")},
                    norm_after="post_attention_norm"),
             experts=_QWEN_EXPS,
             keys=_V3_ROUTER_KEYS, eot_token="<|endoftext|>"),
    # DeepSeek-V3, R1, Kimi K2 and (softmax-gated: expert_gating_func 1, or none) DeepSeek-V2: latent attention's
    # matrices one to one but kv_b_proj (MLA_KV_B), interleaved RoPE (llama.cpp's own: rows as they are) over
    # rope.dimension_count dims, GLM-4.5's router and shared experts; llama.cpp's converter drops V3's MTP layer
    GGUFArch("deepseek2", "DeepseekV3ForCausalLM", "deepseek_v3", False, {**_DEEPSEEK2, **_BIAS},
             experts=_QWEN_EXPS, keys=_DEEPSEEK2_KEYS,
             mla=True, drops_mtp=True),
    GGUFArch("deepseek2", "DeepseekV2ForCausalLM", "deepseek_v2", False, _DEEPSEEK2,
             experts=_QWEN_EXPS, keys=_DEEPSEEK2_KEYS,
             mla=True),
    # Youtu-LLM as convert_hf_to_gguf's DeepseekV2Model writes it: DeepSeek-V3's attention, every layer dense
    # (leading_dense_block_count all of them; expert_feed_forward_length and expert_shared_count 0, which the loader
    # requires, beside no expert_count); the import tells it by the missing expert_count
    GGUFArch("deepseek2", "YoutuForCausalLM", "youtu", False, _DEEPSEEK2,
             keys=_DEEPSEEK2_KEYS | {"expert_feed_forward_length"}, mla=True),
    # GLM-4.7-Flash: DeepSeek-V3's, its MTP layer kept (nextn_predict_layers, counted in block_count) as GLM-4.5's
    GGUFArch("deepseek2", "Glm4MoeLiteForCausalLM", "glm4_moe_lite", False, {**_DEEPSEEK2, **_BIAS, **_NEXTN},
             experts=_QWEN_EXPS,
             keys=_DEEPSEEK2_KEYS | {"nextn_predict_layers"}, mla=True, eot_token="<|user|>",
             eom_token="<|observation|>"),
    # Mistral Small 4 as the converter writes its Mistral3ForConditionalGeneration (its Mistral4Model, a
    # DeepseekV2Model under its own name): DeepSeek-V2's names and softmax router, the experts' stacks whole
    # (ffn_gate_up_exps; gate_up_proj's halves as ffn_gate_exps and ffn_up_exps here); Llama 4's attention
    # temperature as attention.temperature_scale over attention.temperature_length positions (the converter
    # writes neither: llama.cpp then applies none)
    GGUFArch("mistral4", "Mistral4ForCausalLM", "mistral4", False,
             {**_DEEPSEEK2, "mlp.experts.down_proj": "ffn_down_exps.weight"},
             paired={"mlp.experts.gate_up_proj": ("ffn_gate_exps.weight", "ffn_up_exps.weight")}, halves=True,
             keys=_DEEPSEEK2_KEYS | {"attention.temperature_scale", "attention.temperature_length"}, mla=True),
    # Cohere 2 (Command R7B, Command A): one LayerNorm per layer (attn_norm) for its parallel attention and MLP,
    # rows as they are (llama.cpp turns interleaved pairs, as Cohere does), the head always the embedding; every
    # 4th layer full and unrotated by default, logit_scale a key
    GGUFArch("cohere2", "Cohere2ForCausalLM", "cohere2", False, _COHERE,
             keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa",
                             "logit_scale", "attention.layer_norm_epsilon"}),
             swa_pattern=4, layer_norm=True, embed_head=True),
    # Cohere (Command R, Aya): Cohere 2's layer without windows; q/k norms (Command R+) are not read
    GGUFArch("command-r", "CohereForCausalLM", "cohere", False, _COHERE,
             keys=frozenset({"logit_scale", "attention.layer_norm_epsilon"}), layer_norm=True, embed_head=True),
    # Seed-OSS: Llama's names but the MLP's norm, which llama.cpp names post_attention_norm; rows as they are
    # (convert_hf_to_gguf's SeedOssModel is no LlamaModel)
    GGUFArch("seed_oss", "SeedOssForCausalLM", "seed_oss", False, _dense(norm_after="post_attention_norm")),
    # AFMoE (Arcee's Trinity) as convert_hf_to_gguf's AfmoeModel writes it: Llama's names with rows as they are
    # (NeoX RoPE), its sandwich norms as Gemma's (attn_norm, post_attention_norm, ffn_norm, post_ffw_norm), the
    # attention gate self_attn.gate_proj as attn_gate, per-head q/k norms, the router mlp.router.gate as
    # ffn_gate_inp and its choice bias mlp.expert_bias as exp_probs_b.bias, Qwen3-MoE's experts, the shared ones
    # as ffn_*_shexp; every 4th layer full and unrotated (llama.cpp's graph fixes the step), the others sliding
    GGUFArch("afmoe", "AfmoeForCausalLM", "afmoe", False,
             _dense({**_QK_NORM, "post_attention_layernorm.weight": "post_attention_norm.weight",
                     "pre_mlp_layernorm.weight": "ffn_norm.weight", "post_mlp_layernorm.weight": "post_ffw_norm.weight",
                     "self_attn.gate_proj.weight": "attn_gate.weight", "mlp.router.gate.weight": "ffn_gate_inp.weight",
                     "mlp.expert_bias": "exp_probs_b.bias", **_shexp("mlp.shared_experts")}),
             experts=_QWEN_EXPS, swa_pattern=4, gating_key=False,
             keys=frozenset({"expert_shared_count", "leading_dense_block_count", "expert_weights_norm",
                             "expert_weights_scale", "expert_gating_func", "attention.sliding_window",
                             "attention.sliding_window_pattern", "rope.freq_base_swa"})),
    # Apertus (8B, 70B) as convert_hf_to_gguf's ApertusModel writes it: Llama's names (its norms' as attn_norm and
    # ffn_norm), rows as they are (NeoX RoPE), per-head attn_q_norm / attn_k_norm, ffn_up and ffn_down alone (xIELU
    # between, no gate), its parameters as keys (XIELU_KEYS); Llama-3 scaling as rope_freqs; llama.cpp's loader
    # requires an output.weight
    GGUFArch("apertus", "ApertusForCausalLM", "apertus", False, _APERTUS, mlp_act="xielu", own_head=True,
             layer_keys=XIELU_KEYS),
    # HunYuan dense (Hunyuan 0.5B to 7B, Hunyuan-MT-7B) as convert_hf_to_gguf's HunYuanModel writes it: Llama's names,
    # rows as they are (NeoX RoPE), query_layernorm / key_layernorm as attn_q_norm / attn_k_norm (llama.cpp's graph
    # applies them after RoPE, as transformers does); the NTK-alpha base in rope.freq_base
    GGUFArch("hunyuan-dense", "HunYuanDenseV1ForCausalLM", "hunyuan_v1_dense", False, _dense(_HUNYUAN_QK_NORM)),
    # HunYuan-MoE (Hunyuan-A13B) as HunYuanMoEModel writes it: the dense model's attention, the router mlp.gate.wg as
    # ffn_gate_inp, Qwen3-MoE's experts, the shared MLP as ffn_*_shexp (softmax, renormalised: llama.cpp's graph)
    GGUFArch("hunyuan-moe", "HunYuanMoEV1ForCausalLM", "hunyuan_v1_moe", False,
             _dense({**_HUNYUAN_QK_NORM, "mlp.gate.wg.weight": "ffn_gate_inp.weight", **_shexp("mlp.shared_mlp")}),
             experts=_QWEN_EXPS, keys=frozenset({"expert_shared_feed_forward_length", "expert_shared_count"})),
    # Hy3 as convert_hf_to_gguf's HYV3Model writes it: Qwen3's attention names, the router mlp.router.gate as
    # ffn_gate_inp, its choice bias mlp.expert_bias as exp_probs_b (no suffix), Qwen3-MoE's experts, the shared ones
    # as ffn_*_shexp; a layer's experts by its router (llama.cpp's graph: a dense MLP where there is none); its MTP
    # layers after the last, as GLM-4.5's but for the final norm (final_layernorm as nextn.shared_head_norm)
    GGUFArch("hy_v3", "HYV3ForCausalLM", "hy_v3", False,
             _dense({**_QK_NORM, "mlp.router.gate.weight": "ffn_gate_inp.weight", "mlp.expert_bias": "exp_probs_b",
                     **_shexp("mlp.shared_mlp"), **_HY_V3_NEXTN}),
             experts=_QWEN_EXPS,
             keys=frozenset({"expert_shared_feed_forward_length", "expert_weights_norm", "expert_weights_scale",
                             "expert_gating_func", "nextn_predict_layers"})),
    # dots.llm1 as convert_hf_to_gguf's Dots1Model (a Qwen2MoeModel) writes it: Qwen3's attention names, GLM-4.5's
    # router (its choice bias as exp_probs_b.bias), experts and shared experts; the first leading_dense_block_count
    # layers dense. llama.cpp's dots1 has no default gating (its graph aborts without expert_gating_func), no window
    GGUFArch("dots1", "Dots1ForCausalLM", "dots1", False,
             _dense({**_QK_NORM, "mlp.gate.weight": "ffn_gate_inp.weight",
                     "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", **_shexp("mlp.shared_experts")}),
             experts=_QWEN_EXPS,
             keys=_V3_ROUTER_KEYS),
    # Ministral 3, Devstral Small 2, and Mistral Small 3.x as the converter writes Mistral3ForConditionalGeneration
    # (convert_hf_to_gguf's Ministral3Model, a LlamaModel): Llama's names and interleaved q/k rows, YaRN's
    # mscale_all_dim as rope.scaling.yarn_log_multiplier, Llama 4's attention temperature as
    # attention.temperature_scale (over rope.scaling.original_context_length positions)
    GGUFArch("mistral3", "Ministral3ForCausalLM", "ministral3", True, _LLAMA,
             keys=frozenset({"attention.temperature_scale", "rope.scaling.yarn_log_multiplier"})),
    # ERNIE 4.5 0.3B: Llama's names, rows as they are (its interleaved RoPE is llama.cpp's own)
    GGUFArch("ernie4_5", "Ernie4_5ForCausalLM", "ernie4_5", False, _LLAMA),
    # ERNIE 4.5 MoE (21B-A3B, 300B-A47B): the same, Qwen3-MoE's experts and router, GLM-4.5's shared experts, the
    # choice bias [1, experts] as exp_probs_b; the leading dense layers and the shared width as keys; the MTP
    # tensors left out, as the converter leaves them (model_spec's Arch.unread)
    GGUFArch("ernie4_5-moe", "Ernie4_5_MoeForCausalLM", "ernie4_5_moe", False,
             _dense({"mlp.gate.weight": "ffn_gate_inp.weight",
                     "mlp.moe_statics.e_score_correction_bias": "exp_probs_b.bias",
                     **_shexp("mlp.shared_experts")}),
             experts=_QWEN_EXPS,
             keys=frozenset({"interleave_moe_layer_step", "leading_dense_block_count", "expert_shared_count",
                             "expert_shared_feed_forward_length"})),
    # Llama 4 (Scout, Maverick): Llama's names under feed_forward, rows as they are (its complex RoPE is llama.cpp's
    # own); gate_up_proj's halves as ffn_gate_exps and ffn_up_exps, the shared expert as ffn_*_shexp; chunks,
    # unrotated layers and their temperature fixed by llama.cpp's graph (every 4th layer; 8192, 8192, 0.1)
    GGUFArch("llama4", "Llama4ForCausalLM", "llama4_text", False,
             {**{k.replace("mlp.", "feed_forward.", 1): v for k, v in _LLAMA.items() if not k.endswith(".bias")},
              "feed_forward.router.weight": "ffn_gate_inp.weight",
              "feed_forward.experts.down_proj": "ffn_down_exps.weight",
              **_shexp("feed_forward.shared_expert")},
             paired={"feed_forward.experts.gate_up_proj": ("ffn_gate_exps.weight", "ffn_up_exps.weight")}, halves=True,
             keys=frozenset({"interleave_moe_layer_step", "expert_feed_forward_length"}), nope_step=4),
    # Qwen3.5 (0.8B to 27B): Qwen3's attention layer (its q_proj's rows each head's query then gate, as they are)
    # and gated DeltaNet layers (_LINEAR); every norm but the DeltaNet's stored 1 + w; the layers' kinds as
    # attention.recurrent_layers, the DeltaNet's dims as ssm.* keys; interleaved MRoPE's sections, which text
    # positions turn as one RoPE
    GGUFArch("qwen35", "Qwen3_5ForCausalLM", "qwen3_5_text", False,
             _dense({**_QK_NORM, **_LINEAR}, norm_after="post_attention_norm"), keys=_QWEN35_KEYS, **_QWEN35),
    # Qwen3.5-MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's layers with Qwen2-MoE's experts, router and gated
    # shared expert in every one (and in its MTP block)
    GGUFArch("qwen35moe", "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", False,
             _dense({**_QK_NORM, **_LINEAR, "mlp.gate.weight": "ffn_gate_inp.weight", **_shexp("mlp.shared_expert"),
                     "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}, norm_after="post_attention_norm"),
             experts=_QWEN_EXPS, keys=_QWEN35_KEYS | {"expert_shared_feed_forward_length"}, **_QWEN35),
    # Qwen3-Next (80B-A3B, Qwen3-Coder-Next): Qwen3.5-MoE's layers, but the DeltaNet's value heads in Hugging
    # Face's grouped order (its graph repeats each key head in place), and its b and a rows in one ssm_ba, blocked
    # by key head as Hugging Face's in_proj_ba (formats/fused_tensors.py); plain RoPE, no MRoPE sections
    GGUFArch("qwen3next", "Qwen3NextForCausalLM", "qwen3_next", False,
             _dense({**_QK_NORM, **{k: v for k, v in _LINEAR.items()
                                    if v not in ("ssm_beta.weight", "ssm_alpha.weight")},
                     "mlp.gate.weight": "ffn_gate_inp.weight", **_shexp("mlp.shared_expert"),
                     "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}, norm_after="post_attention_norm"),
             experts=_QWEN_EXPS, fused={"ssm_ba.weight": BA}, fused_legacy={"ssm_in.weight": QKVZ},
             keys=(_QWEN35_KEYS - {"rope.dimension_sections"}) | {"expert_shared_feed_forward_length"}, **_QWEN35),
    # Phi-3, Phi-3.5, Phi-4, Phi-4-mini: q, k, v in one matrix (or three: llama.cpp reads either) and gate,
    # up in one; rotate-half RoPE, so q/k rows are Hugging Face's; LongRoPE's factors as rope_factors_long/
    # _short, its attention factor as rope.scaling.attn_factor; the sliding window recorded, and not applied
    # (llama.cpp's phi3 graph disables it)
    GGUFArch("phi3", "Phi3ForCausalLM", "phi3", False,
             {k: v for k, v in _LLAMA.items() if not k.startswith(("mlp.gate_proj.", "mlp.up_proj."))},
             fused={"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"},
             keys=frozenset({"attention.sliding_window", "rope.scaling.attn_factor"})),
)}
# Architectures the import reads as another, which the export then writes: EXAONE 3.5 (ExaoneForCausalLM, remote
# code transformers does not ship) is llama.cpp's llama graph with its rows as they are (rotate-half RoPE).
# Its eps: the RMS key llama.cpp's graph reads (LG's files carry it), else the LayerNorm key, where llama.cpp's current
# converter alone writes it (build_config reads that one for an RMSNorm architecture that lists it).
# Qwen3-VL's language model (2B to 32B; llama.cpp's qwen3vl, its vision tower in a separate mmproj file) is Qwen3's
# layer under interleaved MRoPE, whose sections text positions turn as one RoPE; its deepstack count says how many
# layers add image features, which text adds none of. Qwen3-VL-30B-A3B and 235B-A22B (qwen3vlmoe) likewise
# have Qwen3-MoE's.
_QWEN3VL_KEYS = frozenset({"rope.dimension_sections", "n_deepstack_layers"})
# Qwen2-VL's and Qwen2.5-VL's language model (llama.cpp's qwen2vl, its vision tower in a separate mmproj file) is
# Qwen2's layer under MRoPE over rotate-half pairs, whose sections text positions turn as one RoPE
IMPORTED_AS = (GGUFArch("exaone", "LlamaForCausalLM", "llama", False, _LLAMA,
                        keys=frozenset({"attention.layer_norm_epsilon"})),
               GGUFArch("qwen3vl", "Qwen3ForCausalLM", "qwen3", False, _dense(_QK_NORM), keys=_QWEN3VL_KEYS),
               GGUFArch("qwen2vl", "Qwen2ForCausalLM", "qwen2", False, _LLAMA,
                        keys=frozenset({"rope.dimension_sections"})),
               GGUFArch("qwen3vlmoe", "Qwen3MoeForCausalLM", "qwen3_moe", False,
                        _dense({**_QK_NORM, "mlp.gate.weight": "ffn_gate_inp.weight"}), experts=_QWEN_EXPS,
                        keys=_QWEN3VL_KEYS))
# Granite 4 without experts: its shared MLP as llama.cpp's dense one (a file's expert_used_count, which the converter
# writes whatever the experts, is read as nothing)
GRANITE_HYBRID_DENSE = GGUFArch("granitehybrid", "GraniteMoeHybridForCausalLM", "granitemoehybrid", True,
                                _granite4(("ffn_gate", "ffn_up", "ffn_down")),
                                keys=_GRANITE_KEYS | {"expert_used_count"}, mamba=True)
# Nemotron-H without experts (4B, 8B, 47B, 56B; Nemotron Nano 9B v2, 12B v2): llama.cpp's nemotron_h
NEMOTRON_H_DENSE = GGUFArch("nemotron_h", "NemotronHForCausalLM", "nemotron_h", True, {**_NEMOTRON, **_NEMOTRON_MLP},
                            keys=_NEMOTRON_KEYS, nemotron=True, top=_NEMOTRON_TOP, mlp_act="relu2",
                            gating_key=False)
# every key a layer's tensors are read from (GGUFArch.layer_keys): one in a file whose architecture reads none is refused
LAYER_KEYS = frozenset(k for a in ARCHS.values() for k, _ in a.layer_keys.values())
# what the importer reads
GGUF_ARCHS = tuple(dict.fromkeys(a.gguf for a in (*ARCHS.values(), *IMPORTED_AS, NEMOTRON_H_DENSE)))


def arch_of(meta: dict, meta_path) -> GGUFArch:
    """The llama.cpp architecture of an IEBIN model (its model.ie.json ``meta``), or one error line."""
    cls = meta["model"].get("architecture")
    if cls not in ARCHS:
        raise FormatError(meta_path, "model.architecture", f"{cls!r} has no llama.cpp architecture here "
                                                           f"(written as GGUF: {', '.join(ARCHS)})")
    if cls == GRANITE_HYBRID_DENSE.hf_class and not (meta.get("config") or {}).get("num_local_experts", 8):
        return GRANITE_HYBRID_DENSE  # (GraniteMoeHybridConfig's default: 8 experts)
    if cls == NEMOTRON_H_DENSE.hf_class and not _nemotron_experts(meta.get("config") or {}):
        return NEMOTRON_H_DENSE
    return ARCHS[cls]


def _nemotron_experts(config: dict) -> bool:
    """Whether a Nemotron-H config has expert blocks (E, "moe")."""
    blocks = config.get("layers_block_type") or config.get("hybrid_override_pattern") or ()
    return any(b in ("E", "moe") for b in blocks)


def sliding_by_period(period: int, layers: int) -> list[bool]:
    """Which layers slide in llama.cpp's reading of a period (its
    load_swa_pattern): every period-th layer full, the others sliding."""
    return [not full for full in every_nth(period, layers)]


def fused_parts(arch: GGUFArch) -> dict[str, tuple[str, ...]]:
    """Fused GGUF suffix -> the HF suffixes its rows hold, in order."""
    return {g: FUSED[hf] for g, hf in arch.fused.items()}


def separable(arch: GGUFArch, parts: tuple[str, ...]) -> bool:
    """Whether llama.cpp also reads a fused tensor's parts as tensors of
    their own (phi3's q, k, v as attn_q/k/v; not its gate, up: ffn_up only)."""
    return all(hf in arch.layer for hf in parts)


def joint_types(hf_class: str | None, names) -> list[tuple[str, ...]]:
    """Per layer, the matrices a GGUF export of ``hf_class`` must store in
    one type, where the model holds them all: the parts of each fused
    tensor llama.cpp reads no other way (phi3's gate_proj and up_proj)."""
    arch = ARCHS.get(hf_class)
    if arch is None:
        return []
    layers = sorted({int(m.group(1)) for n in names if (m := _LAYER.fullmatch(n))})
    groups = [tuple(f"model.layers.{i}.{hf}" for hf in parts)
              for parts in fused_parts(arch).values() if not separable(arch, parts) for i in layers]
    return [g for g in groups if all(n in names for n in g)]


def attention_scalar(arch: GGUFArch, hidden: int, heads: int, head_dim: int, layers: int) -> int:
    """The query_pre_attn_scalar llama.cpp's Gemma graphs derive from the
    shapes (they read none): hidden / heads for the 27B, known by its block
    count, else head_dim."""
    return hidden // heads if layers == arch.scale_27b_layers else head_dim


def norm_shift(arch: GGUFArch, hf: str) -> float:
    """What llama.cpp's converter adds to the HF tensor ``hf`` (Gemma's norms: 1), else 0."""
    norm = hf.endswith("norm.weight") or arch.mtp_beside and hf in MTP_EXTRAS and "norm" in hf
    return arch.norm_shift if norm and not hf.endswith(arch.unshifted) else 0.0


def mtp_extra_hf_name(arch: GGUFArch, gguf_name: str, trunk: int) -> str | None:
    """The HF name of the first MTP block's nextn.* tensor where the MTP layers are kept beside the model
    (GGUFArch.mtp_beside; block ``trunk``: MTP_EXTRAS), else None."""
    g = next((h for h, g in MTP_EXTRAS.items() if gguf_name == f"blk.{trunk}.{g}"), None)
    return g if arch.mtp_beside else None


def beside(arch: GGUFArch, hf: str, trunk: int) -> str:
    """An HF layer tensor's name as the model keeps it: model.layers.B.* for a block B >= ``trunk`` (an MTP
    layer) as mtp.layers.(B - trunk).* where they are kept beside the model (GGUFArch.mtp_beside)."""
    m = _LAYER.fullmatch(hf)
    if not arch.mtp_beside or m is None or int(m.group(1)) < trunk:
        return hf
    return f"{MTP_LAYERS}{int(m.group(1)) - trunk}.{m.group(2)}"


def mtp_gguf_name(arch: GGUFArch, hf: str, trunk: int) -> str | None:
    """The GGUF name of an HF mtp.* tensor (beside's and mtp_extra_hf_name's inverse), or None."""
    if not arch.mtp_beside:
        return None
    if hf in MTP_EXTRAS:
        return f"blk.{trunk}.{MTP_EXTRAS[hf]}"
    m = re.fullmatch(re.escape(MTP_LAYERS) + r"(\d+)\.(.+)", hf)
    g = gguf_layer_name(arch, f"model.layers.0.{m.group(2)}") if m else None
    return None if g is None else f"blk.{trunk + int(m.group(1))}.{g[len('blk.0.'):]}"


def gguf_layer_name(arch: GGUFArch, hf: str) -> str | None:
    """The GGUF name of a one-to-one HF tensor (top-level or in a layer), or None."""
    for top, h in {**_TOP, **arch.top}.items():
        if hf.startswith(h + ".") and hf[len(h) + 1:] in ("weight", "bias"):
            return f"{top}.{hf[len(h) + 1:]}"
    m = _LAYER.fullmatch(hf)
    if m and m.group(2) in arch.layer:
        return f"blk.{int(m.group(1))}.{arch.layer[m.group(2)]}"
    return None


def hf_layer_name(arch: GGUFArch, gguf_name: str) -> str | None:
    """The HF name of a one-to-one GGUF tensor, or None."""
    top, _, suffix = gguf_name.partition(".")
    tops = {**_TOP, **arch.top}
    if top in tops and suffix in ("weight", "bias"):
        return f"{tops[top]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m:
        for h, g in arch.layer.items():
            if g == m.group(2):
                return f"model.layers.{int(m.group(1))}.{h}"
    return None
