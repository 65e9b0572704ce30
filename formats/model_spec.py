"""What the decoder runs, read from ``model.ie.json``: per architecture the
dimensions, attention variant, RoPE tables and mixture-of-experts routing,
and the HF tensor names each part lives under.

Every option is read the way transformers 5.x reads it (the modeling files
named beside each architecture below); an option the decoder does not
implement is an error naming the config key, never a silently different
model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IEError, UnsupportedError

INT32_MAX = (1 << 31) - 1  # every dimension and --ctx reach the native decoder as a C int
OLMO_EPS = 1e-5  # OlmoLayerNorm's eps, a constant no config states (Arch.weightless_norms)


@dataclass(frozen=True)
class Arch:
    """One architecture's shape of a layer. ``moe``: where its experts live
    (None: a dense MLP); ``qk_norm``: RMSNorm of q and k (per head, or
    whole with ``qk_norm_full``) before RoPE; ``sinks``: learned attention
    sinks; ``biases``: the attention projections (q, k, v, o) that must
    carry a bias. A bias present in the artifact is read whatever the
    architecture (Llama's attention_bias puts one on all four), but where
    ``no_biases`` rules it out (there it is an unused tensor, refused)."""

    moe: str | None = None
    qk_norm: bool = False
    sinks: bool = False
    biases: tuple[str, ...] = ()
    no_biases: tuple[str, ...] = ()  # the attention projections the config rules a bias out of (a stored one is unread)
    # the config key that switches the biases away from their default (_switched_biases): StableLM's use_qkv_bias
    # turns q/k/v biases on; Qwen2-MoE's qkv_bias and StarCoder2's use_bias, false, turn every one off
    bias_switch: str = ""
    window_everywhere: bool = False  # config.sliding_window applies to every layer (Mistral, Mixtral)
    # Gemma's generation (models/gemma, models/gemma2, models/gemma3; 0: not
    # Gemma): every RMSNorm multiplies by 1 + w; embeddings times
    # sqrt(hidden); GELU-tanh. From Gemma 2 on, norms of the attention's and
    # the MLP's outputs too (GEMMA_LAYER_VECTORS), scores times
    # query_pre_attn_scalar^-1/2 (Gemma 1: 1/sqrt(head_dim)) and, without
    # layer_types, every window_period-th layer global (Gemma 3:
    # config.sliding_window_pattern's period).
    gemma: int = 0
    window_period: int = 0
    local_rope: bool = False  # sliding layers rotate by their own table, unscaled (Gemma 3, OLMo 3)
    default_theta: float = 10000.0  # rope_theta where the config has none (its config class's default)
    softcaps: bool = False    # attn_logit_softcapping, final_logit_softcapping (Gemma 2)
    # Phi-3's attention: RoPE on a head's first partial_rotary_factor of its
    # dims (Phi-4-mini: 3/4), the rest passed through (models/phi3's
    # apply_rotary_pos_emb); config.sliding_window on every layer.
    partial_rope: bool = False
    nope: bool = False  # layers whose q and k are not rotated (SmolLM3's config.no_rope_layers)
    # Granite's four multipliers (models/granite): embeddings times embedding_multiplier, scores times
    # attention_multiplier (not 1/sqrt(head_dim)), each block's output times residual_multiplier, logits
    # divided by logits_scaling
    granite: bool = False
    # OLMo 2 (models/olmo2): no norm before the attention or the MLP, only
    # of their outputs (OLMO2_LAYER_VECTORS), and q_norm / k_norm over the
    # whole q and k projections, not per head
    pre_norms: bool = True
    qk_norm_full: bool = False
    # Ministral 3 (models/ministral3): after RoPE, queries times
    # 1 + llama_4_scaling_beta ln(1 + floor(position / original_max_position_embeddings))
    attn_temp: bool = False
    # Full-attention layers that rotate nothing: "windowed", EXAONE 4's (models/exaone4), where
    # config.sliding_window is set (without one every layer is full and rotates); "always", Cohere 2's
    # (models/cohere2: only sliding layers turn)
    nope_full: str = ""
    # GLM-4 (models/glm4): RoPE turns interleaved pairs (2i, 2i + 1) (repeat_interleave of cos and sin), and the
    # layer norms its blocks' inputs and outputs both (GLM4_LAYER_VECTORS; RMSNorm by w, not Gemma's 1 + w)
    rope_interleaved: bool = False
    glm_norms: bool = False
    default_partial: float = 1.0  # partial_rotary_factor where the config has none (its config class's default)
    # Cohere (models/cohere, models/cohere2): LayerNorm without bias for the layer's and the model's input norms,
    # attention and MLP in parallel from one norm (COHERE_LAYER_VECTORS), logits times config.logit_scale
    cohere: bool = False
    # LayerNorm (the mean taken out) where RMSNorm normalizes the layer's and the model's inputs (Cohere's,
    # StableLM's); with norm_bias, each with its bias (input_layernorm.bias, ..., model.norm.bias)
    layer_norm: bool = False
    norm_bias: bool = False
    # OLMo (models/olmo): those LayerNorms without weights or biases (OlmoLayerNorm), eps 1e-5 whatever the config
    # (it has no key); the decoder multiplies by ones, which is x exactly
    weightless_norms: bool = False
    clip_qkv: bool = False  # config.clip_qkv clamps q, k and v to [-clip, clip] after their projections (OLMo's)
    # Granite SWA (models/granite_swa): sliding layers by layer_types (without it every 4th full, from the first), a
    # RoPE base per layer (layer_rope_theta, 0: none), one for the full layers and one for the sliding ones
    # (_granite_swa_thetas)
    granite_swa: bool = False
    # the attention and the MLP read one norm's output and join the residual together (Cohere's, Phi-2's;
    # COHERE_LAYER_VECTORS)
    parallel: bool = False
    head_bias: bool = False  # the output head carries a bias (Phi-2's lm_head.bias)
    # DeepSeek's multi-head latent attention (models/deepseek_v2, models/deepseek_v3; MLA_MATRICES): q through
    # a low-rank q_a / q_b pair (or q_proj), keys and values decompressed per head from one latent
    mla: bool = False
    # Llama 4 (models/llama4): its MLP under feed_forward (mlp_module); on the layers RoPE turns, attention within
    # chunks of attention_chunk_size positions and q/k divided by their RMS after RoPE (use_qk_norm); on the others,
    # full attention and the query times attn_temperature_tuning's temperature (_llama4)
    llama4: bool = False
    mlp_module: str = "mlp"
    # prefixes of tensors stored beside the model that the decoder, as transformers, leaves unread (ERNIE 4.5's
    # multi-token prediction: model.mtp_block.0, mtp_emb_norm, ...)
    unread: tuple[str, ...] = ()
    # Qwen3.5 (models/qwen3_5): RMSNorms that multiply by 1 + w (Gemma's, without its other changes; the gated
    # DeltaNet's own norm excepted; Nemotron's LayerNorm1P likewise); gated attention (q_proj's rows per head: the
    # query, then its sigmoid gate on the attention's output); config.layer_types' "linear_attention" layers mixing tokens by gated DeltaNet
    # (LINEAR_MATRICES, LINEAR_VECTORS) instead of attention
    zero_centered: bool = False
    attn_gate: bool = False
    linear_attn: bool = False
    # LFM2 (models/lfm2): config.layer_types' "conv" layers mix tokens by a short gated convolution (SHORT_CONV:
    # in_proj's rows B, C and x; B x through a causal depthwise convolution of conv_L_cache taps, times C;
    # out_proj) instead of attention; the dense MLP as wide as LFM2's rule makes it (_lfm2)
    short_conv: bool = False
    # Granite 4 (models/granitemoehybrid): config.layer_types' "mamba" layers mix tokens by Mamba2's selective state
    # space (MAMBA: in_proj's z, x B C and dt; x B C through a causal depthwise convolution plus bias and SiLU; the
    # scan; its output times SiLU(z), RMS-normed by groups; out_proj) instead of attention (_mamba); RoPE only where
    # position_embedding_type is "rope"
    mamba: bool = False
    # Nemotron-H (models/nemotron_h): blocks of one norm and one mixer each, by config.layers_block_type (or the
    # Hub's hybrid_override_pattern): Mamba2 (Granite 4's, its inner width mamba_num_heads x mamba_head_dim), attention
    # without RoPE, a ReLU-squared MLP without a gate, or experts (sigmoid router, ReLU-squared experts beside a shared
    # one) (_nemotron_h, _nemotron_moe); _nemotron_parts and MOE_NAMES["nemotron_h"] name them
    nemotron: bool = False
    # Mamba-2 (models/mamba2): Nemotron-H's Mamba2 block in every layer and nothing else (no attention, no MLP), under
    # Mamba2Config's keys (_mamba2)
    mamba2: bool = False
    # Mamba 1 (models/mamba, models/falcon_mamba): its selective scan alone in every layer, Nemotron-H's block names
    # (MAMBA1: in_proj, conv1d, x_proj, dt_proj, A_log [channels, state], D, out_proj under mixer.), no attention, no
    # MLP (_mamba1); Falcon Mamba's weightless RMS norms of dt's low rank, B and C where falcon_mamba
    mamba1: bool = False
    falcon_mamba: bool = False
    # Falcon-H1 (models/falcon_h1): Granite 4's Mamba2 (its inner width mamba_d_ssm; no gated norm) beside attention
    # in every layer, reading one norm's output, their outputs joining the residual together, then the MLP (under
    # feed_forward, normed by pre_ff_layernorm); muP multipliers on the embeddings, logits and projections
    # (_falcon_h1)
    falcon_h1: bool = False
    # the dense MLP is up, config.hidden_act, down, without a gate (Arcee's, StarCoder2's, Phi-2's, Nemotron-H's)
    ungated: bool = False
    # HunYuan (models/hunyuan_v1_dense, hunyuan_v1_moe): the per-head q/k RMSNorms (query_layernorm, key_layernorm)
    # applied after RoPE, not before it; a "dynamic" rope_scaling with an alpha is its fixed NTK-alpha stretch of the
    # base, theta alpha^(d / (d - 2)) (HunYuanDenseV1RotaryEmbedding's ntk_alpha), not dynamic NTK
    qk_norm_after_rope: bool = False
    ntk_alpha: bool = False
    mlp_biases: bool = False  # the dense MLP's up and down carry biases (StarCoder2's c_fc and c_proj)
    # the config key that turns those biases off, false, apart from the attention's (Jais 2's mlp_bias; "": none,
    # and a config's mlp_bias is refused: Llama's MLP biases are not supported)
    mlp_bias_switch: str = ""
    default_act: str = "silu"  # config.hidden_act where the config has none (its config class's default)
    # Llama's names (model_parts, layer_parts) -> this model's, the first that a tensor name holds replaced
    renames: tuple[tuple[str, str], ...] = ()
    # AFMoE (models/afmoe, Arcee's Trinity): norms before and after each block (Gemma 2's sandwich, GEMMA_LAYER_VECTORS
    # under AFMOE_NAMES, the weights as they are), the attention's output times the sigmoid of a matrix of its own
    # (self_attn.gate_proj: the decoder's q_gate), embeddings times sqrt(hidden) where config.mup_enabled
    sandwich: bool = False
    gate_proj: bool = False
    mup: bool = False
    period_key: str = "sliding_window_pattern"  # the config key of window_period (every so many layers full)
    # without layer_types, the layers from config.max_window_layers (this its default) on slide where
    # config.sliding_window is set (Dots1Config's rule; 0: none but by layer_types)
    max_window_layers: int = 0

    @property
    def attends_nowhere(self) -> bool:
        """No layer attends (Mamba-2's, Mamba 1's): no head counts to read."""
        return self.mamba2 or self.mamba1


# LFM2's names for Llama's (Arch.renames)
LFM2_NAMES = (("self_attn.o_proj", "self_attn.out_proj"), ("self_attn.q_norm", "self_attn.q_layernorm"),
              ("self_attn.k_norm", "self_attn.k_layernorm"), ("mlp.gate_proj", "feed_forward.w1"),
              ("mlp.up_proj", "feed_forward.w3"), ("mlp.down_proj", "feed_forward.w2"),
              ("input_layernorm", "operator_norm"), ("post_attention_layernorm", "ffn_norm"),
              ("model.norm.", "model.embedding_norm."))
# Granite 4's names for Llama's (Arch.renames): its MLP, shared_mlp, whose fused input_linear is read as the gate and
# up matrices it holds (formats/fused_tensors.py)
GRANITE_SHARED_NAMES = (("mlp.gate_proj", "shared_mlp.gate_proj"), ("mlp.up_proj", "shared_mlp.up_proj"),
                        ("mlp.down_proj", "shared_mlp.output_linear"))
# Nemotron-H's model-level names for Llama's (Arch.renames): its checkpoints' backbone. prefix is read as model.,
# as transformers 5 reads it (formats/hf_checkpoint.py PREFIXES)
NEMOTRON_NAMES = (("model.embed_tokens.", "model.embeddings."), ("model.norm.", "model.norm_f."))
# Falcon-H1's names for Llama's (Arch.renames)
FALCON_H1_NAMES = (("post_attention_layernorm", "pre_ff_layernorm"), ("model.norm.", "model.final_layernorm."))
# HunYuan's q/k norm names for Llama's (Arch.renames)
HUNYUAN_NAMES = (("self_attn.q_norm", "self_attn.query_layernorm"), ("self_attn.k_norm", "self_attn.key_layernorm"))
# Apertus's norm names for Llama's (Arch.renames)
APERTUS_NAMES = (("input_layernorm", "attention_layernorm"), ("post_attention_layernorm", "feedforward_layernorm"))
# AFMoE's names for Gemma's sandwich norms (Arch.renames)
AFMOE_NAMES = (("pre_feedforward_layernorm", "pre_mlp_layernorm"), ("post_feedforward_layernorm", "post_mlp_layernorm"))
# Phi-2's names for Llama's (Arch.renames)
PHI_NAMES = (("self_attn.o_proj", "self_attn.dense"), ("mlp.up_proj", "mlp.fc1"), ("mlp.down_proj", "mlp.fc2"),
             ("model.norm.", "model.final_layernorm."))
# StarCoder2's MLP names for Llama's (Arch.renames)
STARCODER2_NAMES = (("mlp.up_proj", "mlp.c_fc"), ("mlp.down_proj", "mlp.c_proj"))
ARCHS = {
    "LlamaForCausalLM": Arch(),                                     # models/llama
    "MistralForCausalLM": Arch(window_everywhere=True),             # models/mistral
    "Qwen2ForCausalLM": Arch(biases=("q", "k", "v")),               # models/qwen2
    "Qwen3ForCausalLM": Arch(qk_norm=True),                         # models/qwen3
    "Qwen3MoeForCausalLM": Arch(moe="qwen3_moe", qk_norm=True),     # models/qwen3_moe
    # models/glm4_moe (GLM-4.5, GLM-4.5-Air, GLM-4.6): Llama's norms, q/k/v biases where stored, per-head q/k
    # norms with use_qk_norm, rotate-half RoPE over half of each head; the first first_k_dense_replace layers
    # dense, the others routed by sigmoid scores (DeepSeek-V3's router) beside n_shared_experts shared ones; the
    # multi-token prediction layers after the last (num_nextn_predict_layers) are left unread, as transformers does
    "Glm4MoeForCausalLM": Arch(moe="glm4_moe", partial_rope=True, default_partial=0.5),
    # models/qwen2_moe (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's layer (q/k/v biases unless config.qkv_bias is false),
    # routed experts beside a shared expert every token runs, its output times the sigmoid of shared_expert_gate
    "Qwen2MoeForCausalLM": Arch(moe="qwen2_moe", biases=("q", "k", "v"), bias_switch="qkv_bias"),
    # models/minimax_m2 (MiniMax-M2, M2.1): experts in every layer under Mixtral's names, chosen by sigmoid score plus
    # the block's e_score_correction_bias and renormalised (GLM-4.5's router, no groups, no scale); q/k RMS-normed
    # over the whole projections; rotate-half RoPE over the first rotary_dim dims of each head
    "MiniMaxM2ForCausalLM": Arch(moe="minimax_m2", qk_norm=True, qk_norm_full=True, partial_rope=True),
    "MixtralForCausalLM": Arch(moe="mixtral", window_everywhere=True),  # models/mixtral
    "GptOssForCausalLM": Arch(moe="gpt_oss", sinks=True, biases=("q", "k", "v", "o")),  # models/gpt_oss
    # models/gemma (Gemma 2B and 7B, Gemma 1.1, CodeGemma): Llama's layer with Gemma's norms, embedding scale and GELU
    "GemmaForCausalLM": Arch(gemma=1, default_act="gelu_pytorch_tanh"),
    "Gemma2ForCausalLM": Arch(gemma=2, window_period=2, softcaps=True,  # models/gemma2
                              default_act="gelu_pytorch_tanh"),
    "Gemma3ForCausalLM": Arch(qk_norm=True, gemma=3, window_period=6, local_rope=True,  # models/gemma3
                              default_theta=1e6, default_act="gelu_pytorch_tanh"),
    # models/phi3; its fused qkv_proj and gate_up_proj are read as the q/k/v
    # and gate/up matrices they hold (formats/fused_tensors.py)
    "Phi3ForCausalLM": Arch(window_everywhere=True, partial_rope=True),
    "SmolLM3ForCausalLM": Arch(nope=True),  # models/smollm3
    "ArceeForCausalLM": Arch(ungated=True, default_act="relu2"),  # models/arcee (AFM-4.5B): its MLP without a gate
    # models/stablelm (StableLM 2 1.6B, StableLM 3B, Stable Code 3B): Llama's layer with LayerNorms and their biases,
    # RoPE over a quarter of each head by default, q/k/v biases with use_qkv_bias; StableLM 2 12B's per-head q/k
    # LayerNorm and parallel layer are refused (_check_config)
    "StableLmForCausalLM": Arch(layer_norm=True, norm_bias=True, partial_rope=True, default_partial=0.25,
                                no_biases=("q", "k", "v", "o"), bias_switch="use_qkv_bias"),
    # models/nemotron (Nemotron-Mini-4B, Minitron 4B and 8B, Nemotron-4): LayerNorm1P (weights plus 1, biases),
    # RoPE over half of each head by default, an MLP of up, ReLU squared and down without a gate
    "NemotronForCausalLM": Arch(layer_norm=True, norm_bias=True, zero_centered=True, ungated=True, partial_rope=True,
                                default_partial=0.5, default_act="relu2"),
    # models/phi (Phi-2, Phi-1.5): Cohere's parallel layer with LayerNorm's bias, biases on every projection and the
    # head, RoPE over half of each head by default (Phi-2's config: 0.4), an MLP of fc1, GELU and fc2 without a gate
    "PhiForCausalLM": Arch(layer_norm=True, norm_bias=True, parallel=True, ungated=True, mlp_biases=True,
                           biases=("q", "k", "v", "o"), head_bias=True, partial_rope=True, default_partial=0.5,
                           default_act="gelu_new", renames=PHI_NAMES),
    # models/jais2 (Inception's Jais 2): Llama's attention with biases on all four projections (attention_bias),
    # LayerNorms with biases, an MLP of up, ReLU squared and down without a gate, their biases with mlp_bias
    # models/exaone_moe (LG's K-EXAONE): EXAONE 4's attention (per-head q/k norms; every 4th layer full and
    # unrotated, the others sliding) in pre-norm layers; dense layers by mlp_layer_types (first_k_dense_replace
    # without it), the others DeepSeek-V3's router and shared experts; its MTP layers beside the model (mtp.*), unread
    "ExaoneMoeForCausalLM": Arch(moe="exaone_moe", qk_norm=True, window_period=4, nope_full="windowed",
                                 unread=("mtp.",)),
    "Jais2ForCausalLM": Arch(layer_norm=True, norm_bias=True, ungated=True, mlp_biases=True, mlp_bias_switch="mlp_bias",
                             biases=("q", "k", "v", "o"), bias_switch="attention_bias", default_act="relu2"),
    # models/starcoder2 (StarCoder2 3B, 7B, 15B): LayerNorms with biases, biases on every projection (use_bias), an
    # MLP of c_fc, GELU-tanh and c_proj without a gate, config.sliding_window on every layer
    "Starcoder2ForCausalLM": Arch(layer_norm=True, norm_bias=True, ungated=True, mlp_biases=True,
                                  biases=("q", "k", "v", "o"), bias_switch="use_bias", window_everywhere=True,
                                  default_act="gelu_pytorch_tanh", renames=STARCODER2_NAMES),
    "GraniteForCausalLM": Arch(granite=True),  # models/granite
    # models/granite_swa (Granite SWASH): Granite's layer and multipliers with a learned sink per head in every layer
    # (applied as the sigmoid of the scores' log-sum-exp minus the sink: gpt-oss's extra softmax logit, the same)
    "GraniteSWAForCausalLM": Arch(granite=True, sinks=True, granite_swa=True),
    # models/granitemoe_swa: that layer with GraniteMoeShared's experts and shared MLP, under their own names
    "GraniteMoeSWAForCausalLM": Arch(moe="granitemoe_swa", granite=True, sinks=True, granite_swa=True),
    # models/olmo (OLMo 1B, 7B, 7B-0424, 7B-0724): Llama's layer under weightless LayerNorms, q, k and v clamped
    "OlmoForCausalLM": Arch(layer_norm=True, weightless_norms=True, clip_qkv=True),
    "Olmo2ForCausalLM": Arch(qk_norm=True, pre_norms=False, qk_norm_full=True),  # models/olmo2
    # models/olmo3: OLMo 2's layer; every 4th layer full, the others sliding with their own RoPE (the full
    # layers' base, unscaled where the full ones take YaRN)
    "Olmo3ForCausalLM": Arch(qk_norm=True, pre_norms=False, qk_norm_full=True, window_period=4, local_rope=True,
                             default_theta=5e5),
    # models/ministral3 (Ministral 3, Devstral Small 2; llama.cpp's mistral3, as which it also converts Mistral
    # Small 3.x): Llama's layer, YaRN, and Llama 4's attention temperature
    "Ministral3ForCausalLM": Arch(window_everywhere=True, attn_temp=True, default_theta=1e6),
    # models/exaone4: OLMo 2's norms of the blocks' outputs with per-head q/k norms; every 4th layer full and
    # unrotated, the others sliding (EXAONE 4.0 32B; the 1.2B has no window: every layer full, rotated)
    "Exaone4ForCausalLM": Arch(qk_norm=True, pre_norms=False, window_period=4, nope_full="windowed"),
    # models/olmoe: Llama's norms, q/k norms over the whole projections (as OLMo 2's), experts in every layer
    # under Qwen3-MoE's names, the top-k of the softmax over all experts (renormalised with norm_topk_prob)
    "OlmoeForCausalLM": Arch(moe="olmoe", qk_norm=True, qk_norm_full=True),
    # models/seed_oss (Seed-OSS-36B): Llama's layer; q/k/v biases (attention_bias), an o bias only with
    # attention_out_bias, each read where the checkpoint stores it; its dropouts are training's alone
    "SeedOssForCausalLM": Arch(),
    # models/afmoe (Arcee's Trinity Nano, Mini, Large): sandwich norms, per-head q/k norms, a gated attention output;
    # every 4th layer full and unrotated, the others sliding; the first num_dense_layers dense, then experts chosen
    # by sigmoid score plus a choice bias, renormalised and times route_scale, beside shared ones (_afmoe_moe),
    # summed before the MLP's output norm
    "AfmoeForCausalLM": Arch(moe="afmoe", qk_norm=True, sandwich=True, gate_proj=True, mup=True, window_period=4,
                             period_key="global_attn_every_n_layers", nope_full="always", renames=AFMOE_NAMES),
    # models/apertus (Apertus 8B, 70B): Llama's layer under its own norm names, per-head q/k RMSNorms before RoPE
    # (Qwen3's), an MLP of up, xIELU and down without a gate, each layer's xIELU with its own four parameters
    # (mlp.act_fn.alpha_p, alpha_n, beta, eps: XIELU_VECTORS); Llama-3 RoPE scaling by default (hf_config)
    "ApertusForCausalLM": Arch(qk_norm=True, ungated=True, default_act="xielu", default_theta=12e6,
                               renames=APERTUS_NAMES),
    # models/hunyuan_v1_dense (Hunyuan 0.5B to 7B, Hunyuan-MT-7B): Llama's layer, its per-head q/k RMSNorms after RoPE
    "HunYuanDenseV1ForCausalLM": Arch(qk_norm=True, qk_norm_after_rope=True, ntk_alpha=True, renames=HUNYUAN_NAMES),
    # models/hunyuan_v1_moe (Hunyuan-A13B): the dense model's attention; in every layer a shared MLP beside
    # moe_topk of num_experts routed experts, weighted by their renormalised softmax scores (_hunyuan_moe)
    "HunYuanMoEV1ForCausalLM": Arch(moe="hunyuan_moe", qk_norm=True, qk_norm_after_rope=True, ntk_alpha=True,
                                    renames=HUNYUAN_NAMES),
    # models/hy_v3 (Hy3): Qwen3's attention; dense or expert MLPs by mlp_layer_types, the experts chosen by sigmoid
    # score plus a choice bias, renormalised and scaled (GLM-4.5's router), beside shared ones (_hy_v3_moe); the
    # multi-token prediction layers after the last (num_nextn_predict_layers) left unread, as transformers does
    "HYV3ForCausalLM": Arch(moe="hy_v3", qk_norm=True, default_theta=11_158_840.0),
    # models/dots1 (rednote's dots.llm1): Qwen3's attention (sliding from max_window_layers on, or by layer_types);
    # the first first_k_dense_replace layers dense, the others DeepSeek-V3's router and shared experts under
    # GLM-4.5's names (sigmoid scores plus a choice bias, within groups)
    "Dots1ForCausalLM": Arch(moe="dots1", qk_norm=True, max_window_layers=62),
    # models/solar_open (Upstage's Solar Open): Llama's attention (q/k/v biases with attention_bias, none on o_proj,
    # every dim rotated), GLM-4.5's router and shared experts in every layer
    "SolarOpenForCausalLM": Arch(moe="solar_open", no_biases=("o",), default_theta=1_000_000.0),
    # models/glm4 (GLM-4-0414, GLM-Z1): partial interleaved RoPE (half of each head by default), norms before and
    # after each block, gate_up_proj fused as Phi-3's (formats/fused_tensors.py), q/k/v biases where stored
    "Glm4ForCausalLM": Arch(partial_rope=True, rope_interleaved=True, glm_norms=True, default_partial=0.5),
    # models/cohere2 (Command R7B, Command A): Cohere's parallel layer; every 4th layer full and unrotated, the
    # others sliding with interleaved RoPE
    "Cohere2ForCausalLM": Arch(cohere=True, layer_norm=True, parallel=True, rope_interleaved=True, window_period=4,
                               nope_full="always"),
    # models/cohere (Command R, Command R+ without its q/k norms, Aya 23 and Expanse): the same layer, every layer
    # full and rotated
    "CohereForCausalLM": Arch(cohere=True, layer_norm=True, parallel=True, rope_interleaved=True),
    # models/deepseek_v3 (DeepSeek-V3, R1, V3.1, Kimi K2): latent attention, interleaved RoPE unless
    # config.rope_interleave is false, YaRN's mscale on the scores; GLM-4.5's router and layers (leading dense ones,
    # shared experts, sigmoid scores within groups); the multi-token prediction layers left unread, as transformers does
    "DeepseekV3ForCausalLM": Arch(moe="deepseek_v3", mla=True, rope_interleaved=True),
    # models/youtu (Tencent's Youtu-LLM): DeepSeek-V3's latent attention (interleaved RoPE unless
    # config.rope_interleave is false) with a dense MLP in every layer
    "YoutuForCausalLM": Arch(mla=True, rope_interleaved=True),
    # models/deepseek_v2 (DeepSeek-V2-Lite, V2): the same attention (interleaved RoPE always); the top-k of the
    # softmax over all experts, never renormalised, times routed_scaling_factor
    "DeepseekV2ForCausalLM": Arch(moe="deepseek_v2", mla=True, rope_interleaved=True),
    # models/mistral4 (Mistral Small 4; the text model of its Mistral3ForConditionalGeneration): DeepSeek-V3's
    # attention (interleaved RoPE unless rope_interleave is false) under Llama 4's attention temperature
    # (Ministral 3's), the top k of the softmax over all experts renormalised, times routed_scaling_factor, beside
    # shared experts; the experts stored as two stacks (MOE_NAMES)
    "Mistral4ForCausalLM": Arch(moe="mistral4", mla=True, rope_interleaved=True, attn_temp=True),
    # models/glm4_moe_lite (GLM-4.7-Flash): DeepSeek-V3's attention, GLM-4.5's router and shared experts; its dense
    # layers where mlp_layer_types says "dense" (the first alone by default); the MTP layers left unread
    "Glm4MoeLiteForCausalLM": Arch(moe="glm4_moe_lite", mla=True, rope_interleaved=True),
    # models/llama4 (Llama 4 Scout, Maverick; the text model of Llama4ForConditionalGeneration): interleaved RoPE
    # (its complex rotation), every no_rope_layer_interval-th layer unrotated; experts at moe_layers (every
    # interleave_moe_layer_step-th) beside a shared one, the top-k by logit each weighted by its sigmoid, which
    # scales the expert's input; gate_up_proj's halves gate and up; the dense layers intermediate_size_mlp wide
    # models/ernie4_5 (ERNIE 4.5 0.3B): Llama's layer, GLM-4's interleaved RoPE over whole heads, head_dim 128 unless
    # stated (hf_config.HEAD_DIM_DEFAULTS); use_bias (every projection's) refused
    "Ernie4_5ForCausalLM": Arch(rope_interleaved=True, default_theta=500000.0),
    # models/ernie4_5_moe (ERNIE-4.5-21B-A3B, 300B-A47B): the same attention (hidden / heads wide); experts from
    # moe_layer_start_index to moe_layer_end_index every moe_layer_interval-th layer, chosen by softmax probability
    # plus moe_statics' correction bias and weighted by their probabilities renormalised, beside
    # moe_num_shared_experts shared ones; its MTP tensors (model.mtp_*) left unread, as transformers does
    "Ernie4_5_MoeForCausalLM": Arch(moe="ernie4_5_moe", rope_interleaved=True, default_theta=500000.0,
                                    unread=("model.mtp_",)),
    # models/qwen3_5 (Qwen3.5 0.8B to 27B, text): three of four layers gated DeltaNet, the fourth gated full
    # attention over heads whose first quarter RoPE turns (its interleaved MRoPE is plain RoPE for text: all three
    # sections see the same position); per-head q/k norms; its MTP tensors (mtp.*) left unread, as transformers does
    "Qwen3_5ForCausalLM": Arch(qk_norm=True, partial_rope=True, default_partial=0.25, zero_centered=True,
                               attn_gate=True, linear_attn=True, unread=("mtp.",)),
    # models/qwen3_5_moe (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's layers with Qwen2-MoE's experts in every
    # one (softmax over all, the top k renormalised, always), beside a sigmoid-gated shared expert
    "Qwen3_5MoeForCausalLM": Arch(moe="qwen3_5_moe", qk_norm=True, partial_rope=True, default_partial=0.25,
                                  zero_centered=True, attn_gate=True, linear_attn=True, unread=("mtp.",)),
    # models/qwen3_next (Qwen3-Next-80B-A3B, Qwen3-Coder-Next): Qwen3.5-MoE's layers, its DeltaNet's projections
    # stored fused and blocked by key head (read as Qwen3.5's: formats/fused_tensors.py); Qwen2-MoE's
    # decoder_sparse_step, mlp_only_layers and norm_topk_prob
    "Qwen3NextForCausalLM": Arch(moe="qwen3_next", qk_norm=True, partial_rope=True, default_partial=0.25,
                                 zero_centered=True, attn_gate=True, linear_attn=True, unread=("mtp.",)),
    "Llama4ForCausalLM": Arch(moe="llama4", rope_interleaved=True, nope=True, llama4=True, mlp_module="feed_forward",
                              default_theta=500000.0),
    # models/lfm2 (LFM2, LFM2.5): Qwen3's attention layer (per-head q/k norms) under other names where layer_types
    # says full_attention, a short gated convolution where it says conv; the final norm embedding_norm
    "Lfm2ForCausalLM": Arch(qk_norm=True, short_conv=True, default_theta=1e6, renames=LFM2_NAMES),
    # models/lfm2_moe (LFM2-8B-A1B): LFM2's layers; after the first num_dense_layers, experts chosen by sigmoid
    # score plus expert_bias (GLM-4.5's router, no groups, no shared expert), renormalised with norm_topk_prob
    "Lfm2MoeForCausalLM": Arch(moe="lfm2_moe", qk_norm=True, short_conv=True, default_theta=1e6, renames=LFM2_NAMES),
    # models/granitemoehybrid (Granite 4.0 H, Granite 4.0): Granite's four multipliers; Mamba2 layers beside Llama's
    # attention where layer_types says so; every layer's MLP a shared_mlp (SwiGLU, shared_intermediate_size wide)
    # beside num_local_experts experts where there are any (_granite_moe)
    "GraniteMoeHybridForCausalLM": Arch(moe="granitemoe", granite=True, mamba=True, renames=GRANITE_SHARED_NAMES),
    # models/granitemoe (Granite 3.0 and 3.1 MoE: 1B-A400M, 3B-A800M): Granite's layer with Granite 4's experts in
    # every layer; models/granitemoeshared: the same beside Granite 4's shared MLP where shared_intermediate_size > 0
    "GraniteMoeForCausalLM": Arch(moe="granitemoe", granite=True),
    "GraniteMoeSharedForCausalLM": Arch(moe="granitemoe", granite=True),
    # models/nemotron_h (Nemotron-H 4B to 56B, Nemotron Nano 9B v2 and 12B v2; Nemotron 3 Nano 30B-A3B with experts)
    "NemotronHForCausalLM": Arch(moe="nemotron_h", mamba=True, nemotron=True, renames=NEMOTRON_NAMES,
                                 ungated=True, default_act="relu2"),
    # models/falcon_h1 (Falcon-H1 0.5B to 34B)
    "FalconH1ForCausalLM": Arch(falcon_h1=True, renames=FALCON_H1_NAMES, mlp_module="feed_forward"),
    # models/mamba2 (Mamba-Codestral-7B; the Mamba-2 checkpoints in transformers' layout)
    "Mamba2ForCausalLM": Arch(mamba=True, nemotron=True, mamba2=True, renames=NEMOTRON_NAMES, ungated=True,
                              default_act="silu"),
    # models/mamba (state-spaces' Mamba 130M to 2.8B) and models/falcon_mamba (Falcon Mamba 7B)
    "MambaForCausalLM": Arch(nemotron=True, mamba1=True, renames=NEMOTRON_NAMES, ungated=True, default_act="silu"),
    "FalconMambaForCausalLM": Arch(nemotron=True, mamba1=True, falcon_mamba=True, renames=NEMOTRON_NAMES,
                                   ungated=True, default_act="silu"),
}
ARCHITECTURES = tuple(ARCHS)
LLAMA4_MLP_INTER = 16384  # Llama4TextConfig's intermediate_size_mlp: its dense layers' width

# Per MoE layout: the router, and each expert's matrices. "{e}" is an expert
# index; a name without it is a stack [experts, rows, cols] (gpt-oss: its
# gate_up rows alternate gate, up; IEBIN stores every stack as [experts,
# out, in], hf-to-iebin transposing gpt-oss's float [experts, in, out]).
MOE_NAMES = {
    "gpt_oss": {"router": "mlp.router.weight", "router_bias": "mlp.router.bias",
                "gate": "mlp.experts.gate_up_proj", "bgate": "mlp.experts.gate_up_proj_bias",
                "down": "mlp.experts.down_proj", "bdown": "mlp.experts.down_proj_bias"},
    "mixtral": {"router": "block_sparse_moe.gate.weight", "gate": "block_sparse_moe.experts.{e}.w1.weight",
                "up": "block_sparse_moe.experts.{e}.w3.weight", "down": "block_sparse_moe.experts.{e}.w2.weight"},
    "qwen3_moe": {"router": "mlp.gate.weight", "gate": "mlp.experts.{e}.gate_proj.weight",
                  "up": "mlp.experts.{e}.up_proj.weight", "down": "mlp.experts.{e}.down_proj.weight"},
}
MOE_NAMES["olmoe"] = MOE_NAMES["qwen3_moe"]
# GLM-4.5's: Qwen3-MoE's experts and router, the router's choice bias, its shared experts as one MLP (no gate).
MOE_NAMES["glm4_moe"] = {**MOE_NAMES["qwen3_moe"], "expert_bias": "mlp.gate.e_score_correction_bias",
                         "shared_gate": "mlp.shared_experts.gate_proj.weight",
                         "shared_up": "mlp.shared_experts.up_proj.weight",
                         "shared_down": "mlp.shared_experts.down_proj.weight"}
# DeepSeek-V3's: GLM-4.5's; DeepSeek-V2's the same without the choice bias.
MOE_NAMES["deepseek_v3"] = MOE_NAMES["glm4_moe_lite"] = MOE_NAMES["dots1"] = MOE_NAMES["solar_open"] = \
    MOE_NAMES["glm4_moe"]
# EXAONE MoE's: GLM-4.5's, the choice bias the block's own (mlp.e_score_correction_bias, as the Hub's checkpoints
# name it)
MOE_NAMES["exaone_moe"] = {**MOE_NAMES["glm4_moe"], "expert_bias": "mlp.e_score_correction_bias"}
MOE_NAMES["deepseek_v2"] = {k: v for k, v in MOE_NAMES["glm4_moe"].items() if k != "expert_bias"}
# Mistral 4's: DeepSeek-V2's router and shared experts, the routed ones in two stacks as Granite's (gate_up_proj
# [experts, 2 inter, hidden], gate's rows then up's: MoeSpec.glu "halves"; down_proj [experts, hidden, inter])
MOE_NAMES["mistral4"] = {**{k: v for k, v in MOE_NAMES["deepseek_v2"].items() if k not in ("gate", "up", "down")},
                         "gate": "mlp.experts.gate_up_proj", "down": "mlp.experts.down_proj"}
# The config classes' defaults of the keys GLM-4.5's and DeepSeek's routers read (a config.json without them).
ROUTER_DEFAULTS = {"glm4_moe": {"first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                                "routed_scaling_factor": 1.0},
                   "deepseek_v3": {"first_k_dense_replace": 3, "n_shared_experts": 1, "n_group": 8, "topk_group": 4,
                                   "routed_scaling_factor": 2.5},
                   "deepseek_v2": {"first_k_dense_replace": 0, "n_shared_experts": 2, "n_group": 1, "topk_group": 1,
                                   "routed_scaling_factor": 1.0},
                   "mistral4": {"first_k_dense_replace": 0, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                                "routed_scaling_factor": 1.0},
                   # (its dense layers: mlp_layer_types, not first_k_dense_replace)
                   "glm4_moe_lite": {"n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                                     "routed_scaling_factor": 1.8},
                   # (Dots1Config has no shared experts' default: the key is required; its top-k weights are not
                   # renormalised by default, unlike the others')
                   "dots1": {"first_k_dense_replace": 0, "n_shared_experts": None, "n_group": 1, "topk_group": 1,
                             "routed_scaling_factor": 1.0, "norm_topk_prob": False},
                   # (experts in every layer whatever first_k_dense_replace says: SolarOpenConfig has no such key)
                   "solar_open": {"first_k_dense_replace": 0, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                                  "routed_scaling_factor": 1.0},
                   # (its dense layers: mlp_layer_types where stated, else first_k_dense_replace)
                   "exaone_moe": {"first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                                  "routed_scaling_factor": 2.5}}
# The router's keys where a config class spells them otherwise than DeepseekV3Config (ExaoneMoeConfig's)
ROUTER_KEYS = {"exaone_moe": {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts"}}
# HunYuan-MoE's: Qwen3-MoE's experts, its router mlp.gate.wg, one shared MLP (no gate of its own).
MOE_NAMES["hunyuan_moe"] = {**MOE_NAMES["qwen3_moe"], "router": "mlp.gate.wg.weight",
                            **{f"shared_{k}": f"mlp.shared_mlp.{k}_proj.weight" for k in ("gate", "up", "down")}}
# Hy3's, as the Hub's checkpoints name them (transformers 5 renames them on load and back on save): Qwen3-MoE's
# experts, the router mlp.router.gate, its choice bias mlp.expert_bias, the shared experts as one MLP, mlp.shared_mlp
MOE_NAMES["hy_v3"] = {**MOE_NAMES["hunyuan_moe"], "router": "mlp.router.gate.weight", "expert_bias": "mlp.expert_bias"}
# AFMoE's: Hy3's router and choice bias, its shared experts GLM-4.5's (mlp.shared_experts)
MOE_NAMES["afmoe"] = {**MOE_NAMES["hy_v3"], **{f"shared_{k}": f"mlp.shared_experts.{k}_proj.weight"
                                                for k in ("gate", "up", "down")}}
# MiniMax-M2's: Mixtral's, and the block's choice bias.
MOE_NAMES["minimax_m2"] = {**MOE_NAMES["mixtral"], "expert_bias": "block_sparse_moe.e_score_correction_bias"}
# ERNIE 4.5's: Qwen3-MoE's experts and router, GLM-4.5's shared experts, the choice bias a row [1, experts] of
# moe_statics (MoeSpec.bias_row).
MOE_NAMES["ernie4_5_moe"] = {**MOE_NAMES["glm4_moe"], "expert_bias": "mlp.moe_statics.e_score_correction_bias"}
# Llama 4's: a router, the experts' two stacks [experts, hidden, 2 inter] (gate, then up) and [experts, inter,
# hidden], transposed at conversion (formats/expert_stacks.py), a shared expert as GLM-4.5's.
MOE_NAMES["llama4"] = {"router": "feed_forward.router.weight", "gate": "feed_forward.experts.gate_up_proj",
                       "down": "feed_forward.experts.down_proj",
                       **{f"shared_{k}": f"feed_forward.shared_expert.{k}_proj.weight" for k in ("gate", "up", "down")}}
# Qwen2-MoE's shared expert: a SwiGLU MLP (bound as the layer's dense gate/up/down) and its gate, a [1, hidden] row.
MOE_NAMES["qwen2_moe"] = {**MOE_NAMES["qwen3_moe"], "shared_gate": "mlp.shared_expert.gate_proj.weight",
                          "shared_up": "mlp.shared_expert.up_proj.weight",
                          "shared_down": "mlp.shared_expert.down_proj.weight",
                          "shared_router": "mlp.shared_expert_gate.weight"}
MOE_NAMES["qwen3_5_moe"] = MOE_NAMES["qwen3_next"] = MOE_NAMES["qwen2_moe"]
# LFM2-MoE's: Mixtral's expert names under feed_forward, its router feed_forward.gate and its choice bias
# feed_forward.expert_bias (where use_expert_bias)
MOE_NAMES["lfm2_moe"] = {"router": "feed_forward.gate.weight", "expert_bias": "feed_forward.expert_bias",
                         **{k: f"feed_forward.experts.{{e}}.{w}.weight" for k, w in (("gate", "w1"), ("up", "w3"),
                                                                                   ("down", "w2"))}}
# Granite's experts (models/granitemoe, checkpoints' names): stacks [experts, 2 inter, hidden] (gate's rows, then up's:
# MoeSpec.glu "halves") and [experts, hidden, inter], the router's [experts, hidden]; the shared MLP
# (GRANITE_SHARED_NAMES)
MOE_NAMES["granitemoe"] = {"router": "block_sparse_moe.router.layer.weight",
                           "gate": "block_sparse_moe.input_linear.weight", "down": "block_sparse_moe.output_linear.weight",
                           "shared_gate": "shared_mlp.gate_proj.weight", "shared_up": "shared_mlp.up_proj.weight",
                           "shared_down": "shared_mlp.output_linear.weight"}
# Granite SWA's experts (models/granitemoe_swa): Granite's, their stacks under experts. and the router's under its
# own name
MOE_NAMES["granitemoe_swa"] = {**MOE_NAMES["granitemoe"], "router": "block_sparse_moe.router.weight",
                               "gate": "block_sparse_moe.experts.gate_up_proj",
                               "down": "block_sparse_moe.experts.down_proj"}
# Nemotron-H's (under model.layers.N.): DeepSeek-V3's router and choice bias under mixer.gate, ReLU-squared experts
# of up and down alone, one shared expert likewise
MOE_NAMES["nemotron_h"] = {"router": "mixer.gate.weight", "expert_bias": "mixer.gate.e_score_correction_bias",
                           "up": "mixer.experts.{e}.up_proj.weight", "down": "mixer.experts.{e}.down_proj.weight",
                           "shared_up": "mixer.shared_experts.up_proj.weight",
                           "shared_down": "mixer.shared_experts.down_proj.weight"}
# Every layout's stacks [experts, ...] (the names without an expert index): gpt-oss's, Llama 4's, Granite's
EXPERT_STACKS = tuple(sorted({v for names in MOE_NAMES.values() for k, v in names.items()
                              if k in ("gate", "up", "down", "bgate", "bdown") and "{e}" not in v}))
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}
# Arch.linear_attn's layer_types: which layers are gated DeltaNet (True) and which attention.
LINEAR_LAYER_TYPES = {"full_attention": False, "linear_attention": True}
# Gated DeltaNet's matrices and vectors (under model.layers.N.linear_attn.) by their decoder keys; its out_proj
# is bound as "o". conv1d is stored [channels, 1, taps]; A_log is bound as -exp(A_log) (decoder_weights).
LINEAR_MATRICES = {"lin_qkv": "in_proj_qkv", "lin_z": "in_proj_z", "lin_b": "in_proj_b", "lin_a": "in_proj_a"}
LINEAR_VECTORS = {"lin_conv": "conv1d.weight", "lin_dt": "dt_bias", "lin_decay": "A_log", "lin_norm": "norm.weight"}
LINEAR_OUT = "linear_attn.out_proj"
# Qwen3_5TextConfig's defaults of the keys its linear layers read.
LINEAR_DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                   "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4}
# Latent attention's matrices and norms (Arch.mla) by their decoder keys: q_a / q_b with config.q_lora_rank (q_b
# bound as "q"), else q_proj; o_proj as every architecture's.
MLA_MATRICES = {"q_a": "self_attn.q_a_proj", "kv_a": "self_attn.kv_a_proj_with_mqa", "kv_b": "self_attn.kv_b_proj"}
MLA_VECTORS = {"q_a_norm": "self_attn.q_a_layernorm.weight", "kv_a_norm": "self_attn.kv_a_layernorm.weight"}
MLA_Q_B = "self_attn.q_b_proj"
# LFM2's short convolution (Arch.short_conv) by its decoder keys: in_proj [3 hidden, hidden] bound as conv_in, the
# convolution's taps [hidden, 1, taps] as conv_w, out_proj as o
SHORT_CONV = {"conv_in": "conv.in_proj.weight", "conv_w": "conv.conv.weight", "o": "conv.out_proj.weight"}
# Granite 4's Mamba2 layers (Arch.mamba) by their decoder keys: in_proj bound as ssm_in, the convolution's taps
# [channels, 1, taps] and bias, dt_bias, A_log (bound as -exp(A_log)), D, the gated norm, out_proj bound as o
MAMBA = {"ssm_in": "mamba.in_proj.weight", "ssm_conv_w": "mamba.conv1d.weight", "ssm_conv_b": "mamba.conv1d.bias",
         "ssm_dt": "mamba.dt_bias", "ssm_a": "mamba.A_log", "ssm_d": "mamba.D", "ssm_norm": "mamba.norm.weight",
         "o": "mamba.out_proj.weight"}
# Arch.mamba's layer_types (the Hub's spellings, and transformers 5's): Mamba2 (True) or attention
MAMBA_LAYER_TYPES = {"mamba": True, "attention": False, "linear_attention": True, "full_attention": False}
# GraniteMoeHybridConfig's defaults of the Mamba2 keys
MAMBA_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4,
                  "mamba_expand": 2}
# FalconH1Config's defaults of the Mamba2 keys (mamba_d_ssm None: mamba_expand x hidden_size)
FALCON_H1_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4,
                      "mamba_expand": 2, "mamba_d_ssm": 1024}
# Falcon-H1's muP multipliers of one value each (FalconH1Config's default 1.0), and of several
FALCON_H1_MULTIPLIERS = ("embedding_multiplier", "lm_head_multiplier", "attention_in_multiplier", "key_multiplier",
                         "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")
FALCON_H1_MULTIPLIER_LISTS = {"mlp_multipliers": 2, "ssm_multipliers": 5}
# Mamba 1's layer (Arch.mamba1) by its decoder keys: in_proj bound as ssm_in, the convolution's taps and bias, x_proj,
# dt_proj and its bias, A_log (bound as -exp(A_log)), D; out_proj as o
MAMBA1 = {"ssm_in": "in_proj.weight", "ssm_conv_w": "conv1d.weight", "ssm_conv_b": "conv1d.bias",
          "ssm_x": "x_proj.weight", "ssm_dt_w": "dt_proj.weight", "ssm_dt": "dt_proj.bias", "ssm_a": "A_log",
          "ssm_d": "D", "o": "out_proj.weight"}
MAMBA1_MATRICES = ("ssm_in", "ssm_x", "ssm_dt_w", "o")
# MambaConfig's defaults of the keys its layers read (time_step_rank "auto": ceil(hidden_size / 16))
MAMBA1_DEFAULTS = {"state_size": 16, "expand": 2, "conv_kernel": 4}
# Nemotron-H's blocks: config.layers_block_type's values (transformers 5's, and the Hub's legacy ones) and
# hybrid_override_pattern's characters, as M (Mamba2), * (attention), - (MLP), E (experts)
NEMOTRON_BLOCKS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-",
                   "moe": "E", "M": "M", "*": "*", "-": "-", "E": "E"}
# Mamba2Config's defaults of the keys its layers read
MAMBA2_DEFAULTS = {"num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2}
# NemotronHConfig's defaults of the keys its blocks read
NEMOTRON_DEFAULTS = {"mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
                     "conv_kernel": 4, "intermediate_size": 21504, "n_routed_experts": 8, "num_experts_per_tok": 2,
                     "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688, "n_group": 1,
                     "topk_group": 1}
# Arch.short_conv's layer_types: which layers are short convolutions (True) and which attention.
SHORT_CONV_LAYER_TYPES = {"full_attention": False, "conv": True}
# Per layer (under model.layers.N.): the attention and dense MLP matrices
# (NAME.weight), the norms, and the optional attention biases, by the keys
# the native decoder binds them under.
ATTN_MATRICES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj"}
MLP_MATRICES = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}  # (under Arch.mlp_module)
LAYER_VECTORS = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight"}
# Gemma's names: its post_attention_layernorm normalizes the attention's
# output (Llama's is the MLP's input norm, Gemma's pre_feedforward_layernorm).
GEMMA_LAYER_VECTORS = {"attn_norm": "input_layernorm.weight", "attn_post_norm": "post_attention_layernorm.weight",
                       "mlp_norm": "pre_feedforward_layernorm.weight",
                       "mlp_post_norm": "post_feedforward_layernorm.weight"}
# GLM-4's: the same four norms under its names (its post_attention_layernorm is the MLP's input norm).
GLM4_LAYER_VECTORS = {"attn_norm": "input_layernorm.weight", "attn_post_norm": "post_self_attn_layernorm.weight",
                      "mlp_norm": "post_attention_layernorm.weight", "mlp_post_norm": "post_mlp_layernorm.weight"}
# Cohere's: one norm, whose output both blocks read.
COHERE_LAYER_VECTORS = {"attn_norm": "input_layernorm.weight"}
# OLMo 2's: its post_attention_layernorm and post_feedforward_layernorm norm the blocks' outputs.
OLMO2_LAYER_VECTORS = {"attn_post_norm": "post_attention_layernorm.weight",
                       "mlp_post_norm": "post_feedforward_layernorm.weight"}
# The RMSNorm weights (a Gemma model's are stored as w and applied as 1 + w).
NORM_KEYS = frozenset({"norm", "attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm", "q_norm", "k_norm",
                       "q_a_norm", "kv_a_norm"})
# The dense MLP's activations the decoder runs (config.hidden_act, or
# Gemma's hidden_activation), by the name the native decoder takes.
MLP_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "relu2": "relu2",
            "xielu": "xielu"}
HF_ACTS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "relu2": "relu2", "xielu": "xielu"}  # each unit's config.hidden_act
# xIELU's parameters (transformers' XIELUActivation, the MLP's act_fn; an MLP without a gate): the decoder's key,
# the tensor under the MLP and its shape (alpha_p, alpha_n parameters [1], beta and eps buffers of no dimension)
XIELU_VECTORS = {"xielu_alpha_p": ("act_fn.alpha_p", (1,)), "xielu_alpha_n": ("act_fn.alpha_n", (1,)),
                 "xielu_beta": ("act_fn.beta", ()), "xielu_eps": ("act_fn.eps", ())}
LAYER_BIASES = {"q": "self_attn.q_proj.bias", "k": "self_attn.k_proj.bias", "v": "self_attn.v_proj.bias",
                "o": "self_attn.o_proj.bias"}
# Buffers old checkpoints saved that transformers ignores on load (it
# recomputes them from the config), so the decoder may too.
IGNORED_BUFFERS = ("self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class MoeSpec:
    n_experts: int
    top_k: int
    inter: int            # each expert's channels
    norm_topk: bool       # weights: softmax over the selected logits (else over all experts)
    glu: str              # "silu" | "gpt_oss" | "halves" (Llama 4's gate_up_proj: gate's rows, then up's)
    alpha: float          # gpt-oss's swiglu_alpha
    limit: float          # gpt-oss's swiglu_limit
    layers: tuple[bool, ...]  # per layer: experts (True) or a dense MLP
    names: dict[str, str]
    shared_inter: int = 0  # the shared expert's channels beside the routed ones in a layer with experts (0: none)
    # GLM-4.5's router (DeepSeek-V3's): experts chosen by sigmoid score plus the expert_bias, within the best
    # topk_group of n_group groups, weighted by their scores (renormalised with norm_topk); every router's
    # weights times routed_scale
    sigmoid: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0
    weight_before: bool = False  # each expert reads its input times its weight, its output added as it is (Llama 4)
    bias_row: bool = False  # the choice bias is stored [1, experts] (ERNIE 4.5's moe_statics), not [experts]


@dataclass(frozen=True)
class DecoderSpec:
    """The dimensions the decoder runs with, from model.ie.json."""

    architecture: str
    arch: Arch
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    inter: int            # the dense MLP's channels (every layer without experts)
    vocab: int
    max_positions: int    # the model's max_position_embeddings (INT32_MAX when it does not say)
    eps: float
    inv_freq: np.ndarray  # [rotary_dim / 2]: rotary_dim is head_dim but for partial RoPE
    rope_scale: float     # YaRN's and LongRoPE's attention factor on cos/sin (1 otherwise)
    tied: bool
    eos_ids: frozenset[int]
    windows: tuple[int, ...]  # per layer, the sliding-window span (0: full attention)
    moe: MoeSpec | None
    mlp_act: str = "silu"     # the dense MLP's gate activation: a value of MLP_ACTS
    mlp_gated: bool = True    # false: its unit is mlp_act(up) alone, no gate matrix (Arch.ungated, Nemotron-H)
    attn_scale: float = 0.0   # scores' factor (0: 1/sqrt(head_dim))
    embed_scale: float = 1.0  # embeddings' factor (Gemma: sqrt(hidden))
    norm_offset: float = 0.0  # added to every RMSNorm weight (Gemma: 1)
    local_theta: float = 0.0  # the sliding layers' own RoPE base (Gemma 3, OLMo 3; 0: none)
    inv_freq_swa: np.ndarray | None = None  # its frequencies
    attn_softcap: float = 0.0   # scores become c tanh(s / c) (Gemma 2; 0: none)
    logit_softcap: float = 0.0  # logits likewise
    # LongRoPE (Phi-3.5, Phi-4-mini): inv_freq holds the short factors'
    # frequencies, these the long ones', which a context longer than
    # rope_original_ctx (original_max_position_embeddings) rotates by
    # (rope_for_context).
    inv_freq_long: np.ndarray | None = None
    rope_original_ctx: int = 0
    nope: tuple[bool, ...] = ()  # per layer, True where q and k are not rotated (SmolLM3); empty: every layer rotates
    residual_scale: float = 1.0  # each block's output times this before the residual add (Granite)
    logits_scaling: float = 1.0  # logits divided by this (Granite; Cohere: 1 / its logit_scale)
    attn_temp_scale: float = 0.0  # Ministral 3's llama_4_scaling_beta (0: none)
    attn_temp_floor: int = 0      # the positions per step of its log (original_max_position_embeddings)
    # The multi-token prediction layers stored after the last (GLM-4.5's num_nextn_predict_layers; Qwen3.5's beside
    # the model, mtp.layers.I), which the decoder, as transformers, leaves unread: they serve speculative decoding,
    # not the model's logits
    mtp_layers: int = 0
    # Latent attention (Arch.mla): q_lora_rank (0: q_proj), kv_lora_rank, v_head_dim; head_dim is
    # qk_nope_head_dim + qk_rope_head_dim, the rotary dims qk_rope_head_dim
    q_lora: int = 0
    kv_lora: int = 0
    v_head_dim: int = 0
    # Llama 4: per layer, the chunk its queries attend within (0: none; empty: no layer), its weightless q/k norm
    # after RoPE, and its temperature's (attn_temp_scale, attn_temp_floor) position offset, on unrotated layers only
    chunks: tuple[int, ...] = ()
    qk_l2_norm: bool = False
    clip_qkv: float = 0.0  # OLMo's clamp of q, k and v (0: none; Arch.clip_qkv)
    attn_temp_offset: float = 0.0
    attn_temp_nope: bool = False
    # Qwen3.5 (Arch.linear_attn): per layer, gated DeltaNet (True) or attention (empty: every layer attention); its
    # key and value heads and dims, the convolution's taps; the value heads in llama.cpp's tiled order (value head
    # h reads key head h % key heads) rather than Hugging Face's grouped one (h // (value heads / key heads))
    linear: tuple[bool, ...] = ()
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    lin_conv: int = 0
    lin_v_tiled: bool = False
    # LFM2 (Arch.short_conv): per layer, a short convolution (True) or attention; its taps (conv_L_cache)
    short_conv: tuple[bool, ...] = ()
    conv_taps: int = 0
    # Granite 4 (Arch.mamba): per layer, Mamba2 (True) or attention; its heads, head and state dims, groups of B and
    # C, and the convolution's taps
    ssm: tuple[bool, ...] = ()
    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_state: int = 0
    ssm_groups: int = 0
    ssm_conv: int = 0
    # Nemotron-H (Arch.nemotron): per layer, its MLP or experts alone (mlp_only) or its Mamba2 or attention alone
    # (mixer_only); empty: every layer both
    mlp_only: tuple[bool, ...] = ()
    mixer_only: tuple[bool, ...] = ()
    # Mamba 1 (Arch.mamba1): per layer, its selective scan (every layer); its channels, dt's rank (ssm_state and
    # ssm_conv: its state's dims and taps), Falcon Mamba's norms of dt, B and C and their eps
    ssm1: tuple[bool, ...] = ()
    ssm1_inner: int = 0
    ssm1_rank: int = 0
    ssm1_norms: bool = False
    ssm1_eps: float = 0.0
    # Falcon-H1 (Arch.falcon_h1): every Mamba2 layer also attends (its out_proj bound as ssm_out, o the attention's);
    # its muP multipliers as factors on projections' outputs (csrc/decoder/decoder.h: q_mult ... ssm_in_mults)
    ssm_attends: bool = False
    q_mult: float = 1.0
    k_mult: float = 1.0
    v_mult: float = 1.0
    o_mult: float = 1.0
    ssm_out_mult: float = 1.0
    gate_mult: float = 1.0
    down_mult: float = 1.0
    ssm_in_mults: tuple[float, ...] = ()

    @property
    def attends(self) -> tuple[bool, ...]:
        """Per layer, whether it attends (keeping a KV cache): not where it keeps a recurrent state instead (but
        beside it, Falcon-H1's), nor in Nemotron-H's MLP blocks."""
        rec, mlp = self.recurrent or (False,) * self.n_layers, self.mlp_only or (False,) * self.n_layers
        return tuple(not ((r and not self.ssm_attends) or m) for r, m in zip(rec, mlp))

    @property
    def recurrent(self) -> tuple[bool, ...]:
        """Per layer, whether it keeps a state instead of a KV cache (gated DeltaNet's, the short
        convolution's, Mamba2's, Mamba 1's), which cannot be rewound; empty: no layer does."""
        kinds = [k for k in (self.linear, self.short_conv, self.ssm, self.ssm1) if k]
        return tuple(any(k[i] for k in kinds) for i in range(self.n_layers)) if kinds else ()

    @property
    def v_dim(self) -> int:
        """A value head's dims (head_dim but with latent attention)."""
        return self.v_head_dim or self.head_dim

    @property
    def rotary_dim(self) -> int:
        """The dims of a q/k head RoPE turns (head_dim but for partial RoPE and latent attention)."""
        return 2 * len(self.inv_freq)


def rope_for_context(s: DecoderSpec, ctx: int) -> np.ndarray:
    """The frequencies a decoder of ``ctx`` positions rotates by: LongRoPE's
    long factors' where ``ctx`` exceeds original_max_position_embeddings,
    as llama.cpp chooses them (by the context, for every position).
    transformers chooses by the length of the sequence at hand instead, so
    the two agree on every sequence within the original context and on
    every longer one run in a context longer than that."""
    if s.inv_freq_long is not None and ctx > s.rope_original_ctx:
        return s.inv_freq_long
    return s.inv_freq


def _scaling_number(scaling: dict, key: str, default: float | None = None) -> float:
    v = scaling.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise IEError(f"rope_scaling.{key}: expected a positive number, got {v!r}")
    return float(v)


def _llama3(inv: np.ndarray, scaling: dict) -> np.ndarray:
    factor = _scaling_number(scaling, "factor")
    low, high = _scaling_number(scaling, "low_freq_factor", 1.0), _scaling_number(scaling, "high_freq_factor", 4.0)
    if high < low:
        raise IEError(f"rope_scaling.high_freq_factor: {high} is below low_freq_factor {low}")
    old_ctx = _scaling_number(scaling, "original_max_position_embeddings")
    low_wl, high_wl = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    # (equal factors, Llama 4 Scout's: no band between the two, the frequencies scaled or kept)
    smooth = (old_ctx / wavelen - low) / (high - low) if high > low else np.zeros_like(inv)
    scaled = np.where(wavelen > low_wl, inv / factor, inv)
    medium = (wavelen >= high_wl) & (wavelen <= low_wl) & (high > low)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled).astype(np.float32)


def yarn_attention_factor(factor: float, m: float = 1.0) -> float:
    """YaRN's attention factor for a scaling ``factor`` (transformers'
    get_mscale): 0.1 m ln(factor) + 1, 1 where factor <= 1. llama.cpp derives
    the m = 1 one and reads no key for it."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def longrope_attention_factor(factor: float, original: float) -> float:
    """LongRoPE's attention factor where the config states none
    (transformers' _compute_longrope_parameters, llama.cpp's converter):
    sqrt(1 + ln factor / ln original), the factor being max positions over
    the ``original`` context's; 1 where factor <= 1."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


def every_nth(n: int, layers: int) -> list[bool]:
    """True at every n-th layer (layers n-1, 2n-1, ...): Gemma's, OLMo 3's
    and gpt-oss's full-attention layers among sliding ones, SmolLM3's
    layers without RoPE."""
    return [(i + 1) % n == 0 for i in range(layers)]


def _yarn(head_dim: int, theta: float, scaling: dict) -> tuple[np.ndarray, float]:
    """transformers' _compute_yarn_parameters: frequencies ramped between
    interpolated (divided by factor) and extrapolated ones over the band
    [beta_fast, beta_slow] rotations fall in, and the attention factor
    0.1 ln(factor) + 1 (or the config's attention_factor / mscale ratio)."""
    if theta <= 1:
        raise IEError(f"rope_theta: yarn needs a base above 1, got {theta}")
    factor = _scaling_number(scaling, "factor")
    old_ctx = _scaling_number(scaling, "original_max_position_embeddings")
    # transformers reads `beta_fast or 32`: an absent or null beta takes its default.
    beta_fast = _scaling_number(scaling, "beta_fast") if scaling.get("beta_fast") is not None else 32.0
    beta_slow = _scaling_number(scaling, "beta_slow") if scaling.get("beta_slow") is not None else 1.0

    if scaling.get("attention_factor") is not None:
        att = _scaling_number(scaling, "attention_factor")
    elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
        att = (yarn_attention_factor(factor, _scaling_number(scaling, "mscale"))
               / yarn_attention_factor(factor, _scaling_number(scaling, "mscale_all_dim")))
    else:
        att = yarn_attention_factor(factor)

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    pos = np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation = np.float32(1) - ramp
    inv = (1 / (np.float32(factor) * pos)) * (1 - extrapolation) + (1 / pos) * extrapolation
    return inv.astype(np.float32), float(att)


def rope_kind(scaling: Any) -> str:
    """A rope_scaling's type under one name: rope_type, else the older
    type, else default; Phi-3's first 128k configs' "su" is longrope (as
    transformers' Phi3Config and llama.cpp's converter read it)."""
    s = scaling if isinstance(scaling, dict) else {}
    kind = s.get("rope_type", s.get("type", "default"))
    return "longrope" if kind == "su" else kind


def _factors(scaling: dict, key: str, n: int) -> np.ndarray:
    v = scaling.get(key)
    if (not isinstance(v, list) or len(v) != n
            or not all(not isinstance(f, bool) and isinstance(f, (int, float)) and math.isfinite(f) and f > 0 for f in v)):
        got = f"{len(v)} values" if isinstance(v, list) and len(v) != n else repr(v)[:80]
        raise IEError(f"rope_scaling.{key}: expected {n} positive numbers (the rotated dims' half), got {got}")
    return np.asarray(v, np.float32)


def _longrope(rotary_dim: int, theta: float, scaling: dict, max_positions: int) -> tuple[np.ndarray, np.ndarray, float]:
    """transformers' _compute_longrope_parameters: the base frequencies
    divided by short_factor and by long_factor (one each per rotated pair),
    and the attention factor on cos/sin, sqrt(1 + ln f / ln original) with
    f = max_position_embeddings / original_max_position_embeddings (or the
    config's attention_factor; 1 where f <= 1)."""
    base = rope_tables(rotary_dim, theta, None)[0]
    short = (base / _factors(scaling, "short_factor", rotary_dim // 2)).astype(np.float32)
    long = (base / _factors(scaling, "long_factor", rotary_dim // 2)).astype(np.float32)
    if scaling.get("attention_factor") is not None:
        return short, long, _scaling_number(scaling, "attention_factor")
    old_ctx = _scaling_number(scaling, "original_max_position_embeddings")
    if old_ctx < 2:
        raise IEError(f"rope_scaling.original_max_position_embeddings: {old_ctx}; LongRoPE needs an original "
                      "context of at least 2 positions")
    factor = _scaling_number(scaling, "factor") if scaling.get("factor") is not None else max_positions / old_ctx
    return short, long, longrope_attention_factor(factor, old_ctx)


def rope_tables(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> tuple[np.ndarray, float]:
    """RoPE inverse frequencies (float32, as transformers computes them) and
    the factor cos and sin are multiplied by, for rope types default,
    linear, llama3 and yarn (``head_dim``: the dims rotated; longrope's
    two tables come from ``_longrope``)."""
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))))
    inv = inv.astype(np.float32)
    kind = rope_kind(scaling)
    if kind in (None, "default"):
        return inv, 1.0
    if kind == "llama3":
        return _llama3(inv, scaling), 1.0
    if kind == "linear":  # positions divided by factor (Gemma 3's global layers)
        return (inv / np.float32(_scaling_number(scaling, "factor"))).astype(np.float32), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling)
    raise UnsupportedError(f"rope_scaling: rope scaling {kind!r} is not supported (default, linear, llama3, yarn "
                           "and longrope are)")


def check_convertible(model: dict[str, Any], config: dict[str, Any], shapes: dict[str, list[int]],
                      label: Path) -> str | None:
    """Before a converter writes anything: a model of an architecture the
    decoder runs must be a valid one (an expert count below top-k, a
    swiglu_limit of 0, layer_types of the wrong length are refused: IEError,
    naming ``label``). A valid one the decoder does not implement converts:
    the reason is returned, for a warning, as it is for a config without
    the dimensions of a whole model (a partial checkpoint converts as
    tensors)."""
    if model.get("architecture") not in ARCHS:
        return None
    needed = ("hidden_size", "num_hidden_layers") + (() if ARCHS[model["architecture"]].attends_nowhere else
                                                     ("num_attention_heads",))  # (Mamba-2, Mamba 1)
    missing = [k for k in needed if model.get(k) is None]
    if missing:
        return f"ierun cannot run this model: {label}: no {', '.join(missing)} (not the config of a whole model)"
    meta = {"model": model, "config": config, "tensors": [{"name": n, "shape": s} for n, s in shapes.items()]}
    try:
        spec = decoder_spec(meta, label)
    except UnsupportedError as e:
        return f"ierun cannot run this model: {e}"
    _check_shapes(spec, shapes, label)
    return None


def _check_shapes(s: DecoderSpec, shapes: dict[str, list[int]], label: Path) -> None:
    """Every tensor the decoder binds that the model holds has the shape
    the config implies (transformers refuses such a checkpoint, "size
    mismatch", and llama.cpp such a file): IEError naming ``label`` and the
    tensor, before anything is written."""
    parts = [*model_parts(s), *(p for i in range(s.n_layers) for p in layer_parts(s, i))]
    for p in parts:
        for name, shape in part_tensors(s, p).items():
            got = shapes.get(name)
            if got is not None and list(got) != shape:
                raise IEError(f"{label}: tensors[{name!r}].shape: {list(got)}, the config implies {shape}")


def _int(model: dict, meta_path: Path, key: str, default: int | None = None, section: str = "model",
         allow_zero: bool = False) -> int:
    """A positive (``allow_zero``: non-negative) integer; ``default`` stands in only for an absent/null value."""
    v = model.get(key)
    if v is None and default is not None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
        raise IEError(f"{meta_path}: {section}.{key}: expected a {'non-negative' if allow_zero else 'positive'} "
                      f"integer, got {v!r}")
    if v > INT32_MAX:
        raise IEError(f"{meta_path}: {section}.{key}: {v} is larger than the decoder supports ({INT32_MAX})")
    return v


def _positive(model: dict, meta_path: Path, key: str, default: float, allow_zero: bool = False,
              section: str = "model") -> float:
    v = model.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise IEError(f"{meta_path}: {section}.{key}: expected a {'non-negative' if allow_zero else 'positive'} "
                      f"number, got {v!r}")
    return float(v)


def _rotary_dim(arch: Arch, cfg: dict[str, Any], scaling: Any, head_dim: int, meta_path: Path,
                qk_head: int = 0) -> int:
    """The dims of a head RoPE turns: head_dim times partial_rotary_factor
    (the config's, or transformers 5's in rope_parameters), truncated as
    transformers does; partial RoPE only where the architecture has it."""
    rp = cfg.get("rope_parameters")
    where, v = next(((w, d["partial_rotary_factor"]) for w, d in (
        ("config", cfg), ("model.rope_scaling", scaling), ("config.rope_parameters", rp))
        if isinstance(d, dict) and d.get("partial_rotary_factor") is not None), ("config", None))
    where += ".partial_rotary_factor"
    if v is None and arch.moe == "minimax_m2" and cfg.get("rotary_dim") is not None:  # (the Hub's configs' legacy key)
        rot = cfg["rotary_dim"]
        if type(rot) is not int or not 2 <= rot <= head_dim:
            raise IEError(f"{meta_path}: config.rotary_dim: expected an integer in 2..head_dim {head_dim}, got {rot!r}")
        where, v = "config.rotary_dim", rot / head_dim
    if qk_head:  # latent attention turns qk_rope_head_dim (head_dim here); a share of the q/k head stated beside
        # it (Mistral 4's rope_parameters) must name the same dims, as transformers' RoPE takes them from it
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or int(qk_head * v) != head_dim):
            raise IEError(f"{meta_path}: {where}: {v!r} of the {qk_head}-dim q/k head is not qk_rope_head_dim "
                          f"({head_dim})")
        return head_dim
    if v is None:
        v = arch.default_partial
    if v == 1:
        return head_dim
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise IEError(f"{meta_path}: {where}: expected a number in (0, 1], got {v!r}")
    if not arch.partial_rope:
        raise UnsupportedError(f"{meta_path}: {where}: partial rotary embeddings are not supported for this "
                               "architecture (Phi-3's and GLM-4's are)")
    dim = int(head_dim * v)
    if dim < 2 or dim % 2:
        raise IEError(f"{meta_path}: {where}: {v} of head_dim {head_dim} is {dim} dims; RoPE turns an even number")
    return dim


def _rope(arch: Arch, m: dict[str, Any], cfg: dict[str, Any], head_dim: int, theta: float,
          meta_path: Path, qk_head: int = 0) -> dict[str, Any]:
    """The DecoderSpec fields of the model's RoPE: its frequencies, the
    attention factor, and LongRoPE's second table (``qk_head``: latent
    attention's q/k head, of which ``head_dim`` dims turn)."""
    scaling = m.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise IEError(f"{meta_path}: model.rope_scaling: expected an object or null, got {scaling!r}")
    dim = _rotary_dim(arch, cfg, scaling, head_dim, meta_path, qk_head)
    try:
        if arch.ntk_alpha and rope_kind(scaling) == "dynamic" and scaling.get("alpha") is not None:
            theta, scaling = ntk_alpha_theta(theta, _scaling_number(scaling, "alpha"), dim), None
        if rope_kind(scaling) != "longrope":
            inv, scale = rope_tables(dim, theta, scaling)
            return {"inv_freq": inv, "rope_scale": scale}
        # Phi-3 keeps the original context beside the scaling, and transformers
        # prefers that one; without either it is max_position_embeddings.
        max_pos = _int(m, meta_path, "max_position_embeddings")
        old_ctx = next((v for v in (cfg.get("original_max_position_embeddings"),
                                    scaling.get("original_max_position_embeddings")) if v is not None), max_pos)
        scaling = {**scaling, "original_max_position_embeddings": old_ctx}
        short, long, scale = _longrope(dim, theta, scaling, max_pos)
        return {"inv_freq": short, "rope_scale": scale, "inv_freq_long": long,
                "rope_original_ctx": int(_scaling_number(scaling, "original_max_position_embeddings"))}
    except IEError as e:  # (UnsupportedError stays one)
        raise type(e)(f"{meta_path}: model.{e}") from None


def ntk_alpha_theta(theta: float, alpha: float, dim: int) -> float:
    """HunYuan's fixed NTK-alpha RoPE base, theta alpha^(dim / (dim - 2)) over ``dim`` rotated dims (as
    transformers' compute_ntk_alpha_rope_parameters and llama.cpp's converter compute it, in double)."""
    if dim <= 2:
        raise IEError(f"rope_scaling.alpha: NTK-alpha scaling needs more than 2 rotated dims, got {dim}")
    try:
        base = theta * alpha ** (dim / (dim - 2))
    except OverflowError:
        base = math.inf
    if not math.isfinite(base) or base > np.finfo(np.float32).max:
        raise IEError(f"rope_scaling.alpha: {alpha} makes a RoPE base beyond float32 ({theta} x alpha^({dim}/{dim - 2}))")
    return base


def _windows(arch: Arch, cfg: dict, n_layers: int, meta_path: Path) -> tuple[int, ...]:
    """Per layer, the sliding window: config.layer_types names each layer's
    attention (gpt-oss alternates); Mistral and Mixtral slide every layer.
    Qwen's use_sliding_window (windows from max_window_layers on) is refused."""
    if arch.llama4 or arch.linear_attn or arch.short_conv or arch.mamba:  # (their layer_types name other layers)
        return (0,) * n_layers
    if cfg.get("use_sliding_window"):
        raise UnsupportedError(f"{meta_path}: config.use_sliding_window: Qwen's per-layer sliding windows are not "
                               "supported")
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if types is None and arch.granite_swa:  # (GraniteSWAConfig: the first of every 4 full)
        types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    if types is None and arch.max_window_layers and window is not None:  # (Dots1Config: from max_window_layers on)
        first = _int(cfg, meta_path, "max_window_layers", arch.max_window_layers, section="config", allow_zero=True)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if types is None and arch.window_period:  # Gemma's configs on the Hub: every pattern-th layer is global
        pattern = _int(cfg, meta_path, arch.period_key, arch.window_period, section="config")
        types = ["full_attention" if full else "sliding_attention" for full in every_nth(pattern, n_layers)]
    if types is None:
        if arch.window_everywhere and window is not None:
            return (_int(cfg, meta_path, "sliding_window", section="config"),) * n_layers
        return (0,) * n_layers
    sliding = _per_layer(types, "layer_types", n_layers, LAYER_TYPES, meta_path)
    if not any(sliding):
        return (0,) * n_layers
    w = _int(cfg, meta_path, "sliding_window", section="config")
    return tuple(w if t else 0 for t in sliding)


def _per_layer(values: Any, key: str, n_layers: int, meaning: dict[Any, Any], meta_path: Path,
               what: str = "") -> list[Any]:
    """config.KEY, a list of one value per layer (num_hidden_layers), each a
    key of ``meaning``, as what each means; or one IEError naming it and the
    values it takes (``what``, else their reprs)."""
    bad = [v for v in values if not isinstance(v, (str, int)) or v not in meaning] if isinstance(values, list) else []
    if not isinstance(values, list) or len(values) != n_layers or bad:
        got = (repr(bad[0]) if bad else f"{len(values)} entries") if isinstance(values, list) else repr(values)
        raise IEError(f"{meta_path}: config.{key}: expected {n_layers} values, one per layer (num_hidden_layers), "
                      f"each {what or ' or '.join(map(repr, meaning))}; got {got[:80]}")
    return [meaning[v] for v in values]


def _granite(cfg: dict, meta_path: Path) -> dict[str, float]:
    """Granite's multipliers as DecoderSpec fields, with GraniteConfig's
    defaults (1.0 each: its attention_multiplier replaces 1/sqrt(head_dim))."""
    def get(key):
        return _positive(cfg, meta_path, key, 1.0, section="config")

    return {"embed_scale": get("embedding_multiplier"), "attn_scale": get("attention_multiplier"),
            "residual_scale": get("residual_multiplier"), "logits_scaling": get("logits_scaling")}


def _attn_temp(cfg: dict, meta_path: Path) -> dict[str, Any]:
    """Ministral 3's attention temperature as DecoderSpec fields: where
    transformers' Ministral3Attention reads them, rope_parameters'
    llama_4_scaling_beta and original_max_position_embeddings (which it
    requires: it multiplies by None otherwise)."""
    rp = cfg.get("rope_parameters", cfg.get("rope_scaling"))
    key = "rope_parameters" if "rope_parameters" in cfg else "rope_scaling"
    if not isinstance(rp, dict):
        raise IEError(f"{meta_path}: config.{key}: expected an object holding llama_4_scaling_beta, got {rp!r:.80}")
    if rp.get("llama_4_scaling_beta") is None:
        raise IEError(f"{meta_path}: config.{key}.llama_4_scaling_beta: is missing (Ministral 3's attention "
                      "temperature; 0 for none)")
    return {"attn_temp_scale": _positive(rp, meta_path, "llama_4_scaling_beta", None, allow_zero=True,
                                         section=f"config.{key}"),
            "attn_temp_floor": _int(rp, meta_path, "original_max_position_embeddings", section=f"config.{key}")}


def _nope(arch: Arch, cfg: dict, windows: tuple[int, ...], meta_path: Path) -> tuple[bool, ...]:
    """The layers without RoPE (empty: every layer rotates). SmolLM3's:
    config.no_rope_layers (1: rotate, 0: not), else every
    no_rope_layer_interval-th layer (4), as SmolLM3Config derives them.
    EXAONE 4's: the full-attention layers where config.sliding_window is
    set (Exaone4Attention rotates where sliding_window is None or the
    layer slides); Cohere 2's: every full-attention layer."""
    n_layers = len(windows)
    if arch.granite_swa:  # (a RoPE base of 0: no RoPE)
        thetas = _layer_thetas(cfg, n_layers, meta_path) or []
        nope = tuple(t == 0 for t in thetas) if 0.0 in thetas else ()
        flags = cfg.get("no_rope_layers")  # (the Hub's, which llama.cpp's converter reads and transformers does not)
        if flags is not None and tuple(_per_layer(flags, "no_rope_layers", n_layers, {1: False, 0: True}, meta_path,
                                                  "1 (RoPE) or 0 (none)")) != (nope or (False,) * n_layers):
            raise IEError(f"{meta_path}: config.no_rope_layers: {flags!r:.60} disagrees with layer_rope_theta's zeros "
                          "(transformers reads the latter, llama.cpp's converter the former)")
        return nope
    if arch.mamba:  # (GraniteMoeHybridModel rotates only with position_embedding_type "rope")
        kind = cfg.get("position_embedding_type")
        if kind not in (None, "nope", "rope"):
            raise IEError(f"{meta_path}: config.position_embedding_type: expected 'rope', 'nope' or null, "
                          f"got {kind!r:.40}")
        return () if kind == "rope" else (True,) * n_layers
    if arch.nope_full == "always" or arch.nope_full == "windowed" and cfg.get("sliding_window") is not None:
        return tuple(w == 0 for w in windows)
    if not arch.nope:
        return ()
    flags = cfg.get("no_rope_layers")
    if flags is None or (arch.llama4 and flags == []):  # (Llama4TextConfig takes an empty list for its default)
        return tuple(every_nth(_int(cfg, meta_path, "no_rope_layer_interval", 4, section="config"), n_layers))
    return tuple(_per_layer(flags, "no_rope_layers", n_layers, {1: False, 0: True}, meta_path, "1 (RoPE) or 0 (none)"))


def _check_top_k(top_k: int, n_experts: int, k_key: str, e_key: str, meta_path: Path) -> None:
    """A router may choose no more experts (config.``k_key``) than the layer has (config.``e_key``)."""
    if top_k > n_experts:
        raise IEError(f"{meta_path}: config.{k_key}: {top_k} is more than the {n_experts} experts ({e_key})")


def _moe(arch: Arch, cfg: dict, n_layers: int, meta_path: Path) -> MoeSpec | None:
    """The routing of gpt-oss, Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE, GLM-4.5,
    MiniMax-M2, DeepSeek-V3 and V2, GLM-4.7-Flash and Mistral 4, from their
    config keys (configuration_gpt_oss / _mixtral / _qwen3_moe / _qwen2_moe /
    _olmoe / _glm4_moe / _minimax_m2 / _deepseek_v3 / _deepseek_v2 /
    _glm4_moe_lite / _mistral4)."""
    if arch.moe is None:
        return None
    if arch.moe == "ernie4_5_moe":
        return _ernie_moe(cfg, n_layers, meta_path)
    if arch.moe in ("qwen3_5_moe", "qwen3_next"):
        return _qwen3_5_moe(cfg, n_layers, meta_path, arch.moe == "qwen3_next")
    if arch.moe == "lfm2_moe":
        return _lfm2_moe(cfg, n_layers, meta_path)
    if arch.moe in ("granitemoe", "granitemoe_swa"):
        return _granite_moe(cfg, n_layers, meta_path, arch.mamba, MOE_NAMES[arch.moe])
    if arch.moe == "nemotron_h":
        return _nemotron_moe(cfg, n_layers, meta_path)
    if arch.moe == "hunyuan_moe":
        return _hunyuan_moe(cfg, n_layers, meta_path)
    if arch.moe == "hy_v3":
        return _hy_v3_moe(cfg, n_layers, meta_path)
    if arch.moe == "afmoe":
        return _afmoe_moe(cfg, n_layers, meta_path)
    qwen, glm = arch.moe in ("qwen3_moe", "qwen2_moe"), arch.moe in ROUTER_DEFAULTS  # (glm: GLM-4.5's or DeepSeek's)
    # Qwen3-MoE's published configs say num_experts; transformers 5 writes num_local_experts. OLMoE's and
    # Qwen2-MoE's: num_experts; GLM-4.5's: n_routed_experts.
    keys = ROUTER_KEYS.get(arch.moe, {})
    e_key = (keys.get("n_routed_experts", "n_routed_experts") if glm else
             "num_experts" if (qwen or arch.moe == "olmoe") and "num_experts" in cfg else "num_local_experts")
    n_experts = _int(cfg, meta_path, e_key, section="config")
    top_k = _int(cfg, meta_path, "num_experts_per_tok", section="config")
    _check_top_k(top_k, n_experts, "num_experts_per_tok", e_key, meta_path)
    inter = _int(cfg, meta_path, "moe_intermediate_size" if qwen or glm else "intermediate_size", section="config")
    layers = (True,) * n_layers
    norm_topk, glu, alpha, limit = True, "silu", 1.702, 7.0
    if qwen or glm or arch.moe == "olmoe":
        # (Glm4MoeConfig's and DeepseekV3Config's default is true, Dots1Config's and the others' false)
        norm = cfg.get("norm_topk_prob", ROUTER_DEFAULTS.get(arch.moe, {}).get("norm_topk_prob", glm))
        if not isinstance(norm, bool):
            raise IEError(f"{meta_path}: config.norm_topk_prob: expected true or false, got {norm!r}")
        if norm and arch.moe == "deepseek_v2":
            raise UnsupportedError(f"{meta_path}: config.norm_topk_prob: true; transformers' DeepseekV2 never "
                                   "renormalises its top-k weights, and llama.cpp would: the two would compute "
                                   "different models")
        norm_topk = norm
    if qwen:
        layers = _sparse_layers(cfg, n_layers, meta_path)
    if arch.moe == "gpt_oss":
        glu = "gpt_oss"
        limit = _positive(cfg, meta_path, "swiglu_limit", 7.0, section="config")
        alpha = cfg.get("swiglu_alpha", 1.702)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise IEError(f"{meta_path}: config.swiglu_alpha: expected a number, got {alpha!r}")
    shared, routing = 0, {}
    if arch.moe == "qwen2_moe":
        shared = _int(cfg, meta_path, "shared_expert_intermediate_size", section="config")
    if glm:
        dflt = ROUTER_DEFAULTS[arch.moe]
        if arch.moe == "glm4_moe_lite" or arch.moe == "exaone_moe" and cfg.get("mlp_layer_types") is not None:
            layers = _mlp_layer_types(cfg, n_layers, meta_path)
        elif arch.moe == "solar_open":  # (SolarOpenDecoderLayer: experts always; llama.cpp's converter reads the key)
            if cfg.get("first_k_dense_replace", 0) != 0:
                raise UnsupportedError(f"{meta_path}: config.first_k_dense_replace: {cfg['first_k_dense_replace']!r}; "
                                       "Solar Open has experts in every layer (transformers reads no such key), and "
                                       "llama.cpp would run the first layers dense")
            layers = (True,) * n_layers
        else:
            first = _int(cfg, meta_path, "first_k_dense_replace", dflt["first_k_dense_replace"], section="config",
                         allow_zero=True)
            layers = tuple(i >= first for i in range(n_layers))
        shared = inter * _int(cfg, meta_path, keys.get("n_shared_experts", "n_shared_experts"),
                              dflt["n_shared_experts"], section="config", allow_zero=True)
        groups = _int(cfg, meta_path, "n_group", dflt["n_group"], section="config")
        used = _int(cfg, meta_path, "topk_group", dflt["topk_group"], section="config")
        if arch.moe == "deepseek_v2":  # softmax scores; groups only with group_limited_greedy
            method = cfg.get("topk_method", "greedy")
            if method == "group_limited_greedy" and groups > 1 and used < groups:
                raise UnsupportedError(f"{meta_path}: config.topk_method: 'group_limited_greedy' (DeepSeek-V2's "
                                       "groups ranked by their best expert) is not supported; llama.cpp ranks "
                                       "groups by their best two")
            if method not in ("greedy", "group_limited_greedy"):
                raise IEError(f"{meta_path}: config.topk_method: expected 'greedy' or 'group_limited_greedy', "
                              f"got {method!r}")
            groups = used = 1
        if arch.moe in ("dots1", "exaone_moe"):  # (sigmoid always, as DeepseekV3TopkRouter; the Hub's scoring_func
            # says so)
            _sigmoid_scored(cfg, meta_path)
        if arch.moe == "mistral4":  # softmax scores (Mistral4TopkRouter); its groups ranked by their best two
            if used < groups:
                raise UnsupportedError(f"{meta_path}: config.topk_group: {used} of n_group {groups}; groups of "
                                       "softmax-scored experts are not supported by the decoder (Mistral Small 4 "
                                       "has one)")
            groups = used = 1
            glu = "halves"
        if n_experts % groups or used > groups or (used < groups and (
                n_experts // groups < 2 or top_k > used * (n_experts // groups))):
            raise IEError(f"{meta_path}: config.topk_group: {used} of n_group {groups} groups of {n_experts} experts; "
                          f"expected at most n_group groups of 2 or more experts each, the kept ones holding "
                          f"num_experts_per_tok ({top_k})")
        routing = dict(sigmoid=arch.moe not in ("deepseek_v2", "mistral4"), n_group=groups, topk_group=used,
                       routed_scale=_positive(cfg, meta_path, "routed_scaling_factor", dflt["routed_scaling_factor"],
                                              section="config"))
    if arch.moe == "minimax_m2":  # (MiniMaxM2TopKRouter renormalises always)
        norm_topk, routing = True, dict(sigmoid=True)
    if arch.llama4:  # (Llama4Router: the top-k logits' sigmoids, never renormalised)
        layers, shared, glu = _moe_layers(cfg, n_layers, meta_path), inter, "halves"
        norm_topk, routing = False, dict(sigmoid=True, weight_before=True)
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=inter, norm_topk=norm_topk, glu=glu, alpha=float(alpha),
                   limit=float(limit), layers=layers, names=MOE_NAMES[arch.moe], shared_inter=shared, **routing)


def decoder_spec(meta: dict[str, Any], meta_path: Path) -> DecoderSpec:
    """Everything the decoder needs from model.ie.json, or one clear error:
    UnsupportedError for a valid model the decoder does not implement,
    IEError for an invalid one."""
    m = meta.get("model") or {}
    cfg = meta.get("config") or {}
    name = m.get("architecture")
    if name not in ARCHS:
        raise UnsupportedError(f"{meta_path}: model.architecture: {name!r} is not supported by the decoder "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    arch = ARCHS[name]
    _check_config(cfg, arch, meta_path)
    # (GLM-4.5's per-head RMSNorm; MiniMax-M2 has its norms always; Llama 4's are weightless: _llama4)
    if cfg.get("use_qk_norm") and not arch.qk_norm and not arch.llama4:
        if arch.moe != "glm4_moe":
            raise UnsupportedError(f"{meta_path}: config.use_qk_norm: Cohere's per-head q/k LayerNorm (Command R+) is "
                                   "not supported by the decoder")
        arch = replace(arch, qk_norm=True)
    arch = _switched_biases(arch, cfg)
    act = m.get("hidden_act") or arch.default_act
    if arch.gemma == 1 and act == "gelu":  # (GemmaConfig reads the Hub's legacy "gelu" as the tanh approximation)
        act = "gelu_pytorch_tanh"
    # (relu2 has no gate: an MLP without one, whose experts (Nemotron-H's) have no other unit)
    # (Mamba-2's hidden_act is its convolution's, SiLU; it has no MLP; Falcon-H1's both its MLP's and its Mamba2's)
    acts = ("silu",) if arch.attends_nowhere or arch.falcon_h1 else ("relu2",) if arch.nemotron else \
        tuple(MLP_ACTS) if arch.ungated else ("silu",) if arch.moe else ("silu", "gelu_pytorch_tanh")
    if act not in acts:
        raise UnsupportedError(f"{meta_path}: model.hidden_act: {act!r} is not supported ({' and '.join(acts)} "
                               f"{'are' if len(acts) > 1 else 'is'})")
    hidden = _int(m, meta_path, "hidden_size")
    if arch.attends_nowhere:  # (no attention: one head of two dims stands in, which no layer reads)
        heads, head_dim, n_kv = 1, 2, 1
    else:
        heads = _int(m, meta_path, "num_attention_heads")
        head_dim = _int(m, meta_path, "head_dim", max(1, hidden // heads))
        n_kv = _int(m, meta_path, "num_key_value_heads", heads)
    theta = _positive(m, meta_path, "rope_theta", arch.default_theta)
    if heads % n_kv:
        raise IEError(f"{meta_path}: model.num_attention_heads: {heads} is not a multiple of "
                      f"num_key_value_heads ({n_kv}); grouped-query attention needs it")
    mla, rot = {}, head_dim
    if arch.mla:
        mla, head_dim, rot = _mla(cfg, heads, n_kv, meta_path)
        if cfg.get("rope_interleave") is False and arch.moe != "deepseek_v2":  # (DeepseekV3Config's option, and GLM-4.7-Flash's)
            arch = replace(arch, rope_interleaved=False)
    n_layers = _int(m, meta_path, "num_hidden_layers")
    windows = _windows(arch, cfg, n_layers, meta_path)
    moe = _moe(arch, cfg, n_layers, meta_path)
    eos = m.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if not all(type(e) is int for e in eos_list):
        raise IEError(f"{meta_path}: model.eos_token_id: expected an integer or a list of integers, got {eos!r}")
    # head_dim sizes the RoPE table built here: hold it to the stored q_proj
    # first, so a hostile value cannot allocate before any tensor is checked.
    if arch.attn_gate and cfg.get("attention_bias"):  # (its q_proj bias would hold the gates' too: not implemented)
        raise UnsupportedError(f"{meta_path}: config.attention_bias: biases on gated attention's projections are not "
                               "supported by the decoder")
    # (the layers that mix tokens otherwise than by attention: Qwen3.5's gated DeltaNet, LFM2's convolutions)
    if arch.linear_attn:
        mixers = _linear(cfg, n_layers, meta_path)
    elif arch.mamba2:
        mixers = _mamba2(cfg, n_layers, hidden, meta_path)
    elif arch.mamba1:
        mixers = _mamba1(cfg, n_layers, hidden, meta_path, arch.falcon_mamba)
    elif arch.falcon_h1:
        mixers = _falcon_h1(cfg, n_layers, hidden, meta_path)
    elif arch.nemotron:
        mixers = _nemotron_h(cfg, n_layers, meta_path)
    else:
        mixers = _lfm2(cfg, n_layers, meta_path, arch.moe is not None) if arch.short_conv else \
            _mamba(cfg, n_layers, hidden, meta_path) if arch.mamba else {}
    kinds = next((mixers[k] for k in ("linear", "short_conv", "ssm", "ssm1") if mixers.get(k)), (False,) * n_layers)
    mlp_only = mixers.get("mlp_only") or (False,) * n_layers
    attends = [not ((k and not arch.falcon_h1) or o) for k, o in zip(kinds, mlp_only)]
    first = attends.index(True) if True in attends else None  # (the first attention layer's q_proj)
    if first is not None:
        q_name = (f"model.layers.{first}.mixer.q_proj.weight" if arch.nemotron else
                  f"model.layers.{first}.{MLA_Q_B if mla.get('q_lora') else ATTN_MATRICES['q']}.weight")
        q = next((t for t in meta.get("tensors") or [] if isinstance(t, dict) and t.get("name") == q_name), None)
        if q is None:
            raise IEError(f"{meta_path}: tensors: {q_name!r} is missing ({name} needs it)")
        rows = heads * head_dim * (2 if arch.attn_gate else 1)
        if list(q.get("shape") or [])[:1] != [rows]:
            raise IEError(f"{meta_path}: model.head_dim: {head_dim} × num_attention_heads {heads}"
                          f"{' × 2 (query and gate)' if arch.attn_gate else ''} = {rows}, but {q_name} has shape "
                          f"{q.get('shape')}")
    local_theta = 0.0
    if arch.granite_swa:
        theta, local_theta = _granite_swa_thetas(cfg, windows, theta, m.get("rope_scaling"), meta_path)
    rope = _rope(arch, m, cfg, rot, theta, meta_path, head_dim if arch.mla else 0)
    if local_theta:
        rope.update(local_theta=local_theta,
                    inv_freq_swa=rope_tables(2 * len(rope["inv_freq"]), local_theta, None)[0])
    if arch.mla:
        mla["attn_scale"] = _mla_scale(m.get("rope_scaling"), head_dim, meta_path)
    if arch.local_rope:  # (Gemma 3's sliding base defaults to 10000, OLMo 3's to the model's)
        local = _local_theta(cfg, meta_path, 10000.0 if arch.gemma else theta)
        rope.update(local_theta=local, inv_freq_swa=rope_tables(2 * len(rope["inv_freq"]), local, None)[0])
    gemma = _gemma(arch, cfg, hidden, meta_path) if arch.gemma else {"norm_offset": 1.0} if arch.zero_centered else {}
    # A model whose every layer has experts has no dense MLP width to read.
    if moe is not None and all(moe.layers):
        dense_inter = moe.inter
    elif arch.llama4:  # (its intermediate_size is the experts')
        dense_inter = _int(cfg, meta_path, "intermediate_size_mlp", LLAMA4_MLP_INTER, section="config")
    elif arch.short_conv or arch.nemotron:  # (LFM2's by its rule; Nemotron-H's MLP blocks', where it has any)
        dense_inter = mixers["inter"]
    elif arch.mamba:  # (its MLP is the shared one)
        dense_inter = _int(cfg, meta_path, "shared_intermediate_size", 1024, section="config")
    else:
        dense_inter = _int(m, meta_path, "intermediate_size")
    mixers.pop("inter", None)
    nope = _nope(arch, cfg, windows, meta_path)
    spec = DecoderSpec(
        architecture=name, arch=arch, n_layers=n_layers, hidden=hidden, n_heads=heads, n_kv_heads=n_kv,
        head_dim=head_dim, inter=dense_inter, vocab=_int(m, meta_path, "vocab_size"),
        max_positions=_int(m, meta_path, "max_position_embeddings", INT32_MAX),
        eps=OLMO_EPS if arch.weightless_norms else _positive(m, meta_path, "norm_eps", 1e-6, allow_zero=True), **rope,
        tied=bool(cfg.get("tie_embedding") if m.get("tie_word_embeddings") is None  # (LFM2's Hub configs' key)
                   else m["tie_word_embeddings"]),
        eos_ids=frozenset(eos_list), windows=windows, moe=moe,
        mlp_act=MLP_ACTS[act], mlp_gated=not arch.ungated, nope=nope, **gemma,
        **(_llama4(cfg, nope, meta_path) if arch.llama4 else {}),
        **(_granite(cfg, meta_path) if arch.granite else {}),
        **({"embed_scale": float(np.float32(math.sqrt(hidden)))} if arch.mup and cfg.get("mup_enabled") else {}),
        **(_attn_temp(cfg, meta_path) if arch.attn_temp else {}),
        **({"clip_qkv": _positive(cfg, meta_path, "clip_qkv", 0.0, section="config")}
           if arch.clip_qkv and cfg.get("clip_qkv") is not None else {}),
        **({"logits_scaling": 1.0 / _positive(cfg, meta_path, "logit_scale", 0.0625, section="config")}
           if arch.cohere else {}),
        mtp_layers=_int(cfg, meta_path, "num_nextn_predict_layers", 0, section="config", allow_zero=True)
        if arch.moe in ("glm4_moe", "deepseek_v3", "glm4_moe_lite", "hy_v3") else _mtp_beside(meta)
        if "mtp." in arch.unread else 0,
        **mla, **mixers)
    _check_all_used(spec, meta.get("tensors") or [], meta_path)
    return spec


def _sparse_layers(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> tuple[bool, ...]:
    """Which layers have experts in a Qwen2-MoE-style config: every decoder_sparse_step-th but mlp_only_layers."""
    step = _int(cfg, meta_path, "decoder_sparse_step", 1, section="config")
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(i) is int for i in dense):
        raise IEError(f"{meta_path}: config.mlp_only_layers: expected a list of layer indices, got {dense!r}")
    return tuple(i not in dense and nth for i, nth in enumerate(every_nth(step, n_layers)))


def _qwen3_5_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path, qwen3_next: bool) -> MoeSpec:
    """Qwen3.5-MoE's experts (Qwen3_5MoeTextConfig's keys and defaults): num_experts_per_tok of num_experts in every
    layer, weighted by their softmax probabilities renormalised (Qwen3_5MoeTopKRouter always renormalises), beside
    a shared expert of shared_expert_intermediate_size channels and its sigmoid gate. Qwen3-Next's likewise
    (Qwen3NextConfig's defaults), but in the layers _sparse_layers names, renormalised as norm_topk_prob says."""
    def get(key: str, default: int) -> int:
        return _int(cfg, meta_path, key, default, section="config")

    n_experts = get("num_experts", 512 if qwen3_next else 256)
    top_k = get("num_experts_per_tok", 10 if qwen3_next else 8)
    _check_top_k(top_k, n_experts, "num_experts_per_tok", "num_experts", meta_path)
    layers, norm = (True,) * n_layers, True
    if qwen3_next:
        layers, norm = _sparse_layers(cfg, n_layers, meta_path), cfg.get("norm_topk_prob", True)
        if not isinstance(norm, bool):
            raise IEError(f"{meta_path}: config.norm_topk_prob: expected true or false, got {norm!r}")
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=get("moe_intermediate_size", 512), norm_topk=norm,
                   glu="silu", alpha=1.702, limit=7.0, layers=layers, names=MOE_NAMES["qwen3_5_moe"],
                   shared_inter=get("shared_expert_intermediate_size", 512))


def _mtp_beside(meta: dict[str, Any]) -> int:
    """Qwen3.5's and EXAONE MoE's multi-token prediction layers, as stored beside the model (mtp.layers.I;
    carried unread)."""
    names = (t.get("name") for t in meta.get("tensors") or [] if isinstance(t, dict))
    return len({n.split(".")[2] for n in names if isinstance(n, str) and n.startswith("mtp.layers.")})


def _linear(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> dict[str, Any]:
    """Qwen3.5's gated DeltaNet layers as DecoderSpec fields (Qwen3_5TextConfig's keys and defaults): layer_types,
    else every full_attention_interval-th layer attention and the others linear; the heads' counts and dims; and
    the value heads' order (config.linear_value_head_order: "tiled" where an import from llama.cpp keeps its
    order; absent: Hugging Face's "grouped")."""
    def get(key: str) -> int:
        return _int(cfg, meta_path, key, LINEAR_DEFAULTS[key], section="config")

    types = cfg.get("layer_types")
    if types is None:
        layers = [not full for full in every_nth(get("full_attention_interval"), n_layers)]
    else:
        layers = _per_layer(types, "layer_types", n_layers, LINEAR_LAYER_TYPES, meta_path)
    k_heads, v_heads = get("linear_num_key_heads"), get("linear_num_value_heads")
    if v_heads % k_heads:
        raise IEError(f"{meta_path}: config.linear_num_value_heads: {v_heads} is not a multiple of "
                      f"linear_num_key_heads ({k_heads})")
    order = cfg.get("linear_value_head_order", "grouped")
    if order not in ("grouped", "tiled"):
        raise IEError(f"{meta_path}: config.linear_value_head_order: expected 'grouped' or 'tiled', got {order!r:.40}")
    return {"linear": tuple(layers), "lin_k_heads": k_heads, "lin_v_heads": v_heads,
            "lin_k_dim": get("linear_key_head_dim"), "lin_v_dim": get("linear_value_head_dim"),
            "lin_conv": get("linear_conv_kernel_dim"), "lin_v_tiled": order == "tiled"}


def _granite_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path, hybrid: bool,
                 names: dict[str, str]) -> MoeSpec | None:
    """Granite's experts (GraniteMoeHybridConfig's, GraniteMoeConfig's and GraniteMoeSharedConfig's keys and
    defaults): num_experts_per_tok of num_local_experts in every layer, weighted by the softmax of their logits
    (GraniteMoeHybridTopKRouter, GraniteMoeTopKGating), beside the shared MLP of shared_intermediate_size channels
    (Granite 4's always, GraniteMoeShared's where it is not 0; GraniteMoe has none). Granite 4 (``hybrid``) may
    have no experts: None, its shared MLP the layer's MLP."""
    n_experts = _int(cfg, meta_path, "num_local_experts", 8, section="config", allow_zero=hybrid)
    if n_experts == 0:
        return None
    top_k = _int(cfg, meta_path, "num_experts_per_tok", 2, section="config")
    _check_top_k(top_k, n_experts, "num_experts_per_tok", "num_local_experts", meta_path)
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=_int(cfg, meta_path, "intermediate_size", 11008,
                                                                 section="config"),
                   norm_topk=True, glu="halves", alpha=1.702, limit=7.0, layers=(True,) * n_layers,
                   names=names,
                   shared_inter=_int(cfg, meta_path, "shared_intermediate_size", 1024 if hybrid else 0, section="config",
                                     allow_zero=not hybrid))


def _one_per_layer(cfg: dict[str, Any], meta_path: Path, key: str, default: int, n_layers: int) -> int:
    """A config key HunYuan's configs give as one integer or as a list of one per layer, all equal (both
    transformers' HunYuanMoEV1 and llama.cpp take one value for every layer)."""
    v = cfg.get(key)
    if isinstance(v, list):
        if len(v) != n_layers or len(set(map(repr, v))) != 1:
            raise UnsupportedError(f"{meta_path}: config.{key}: {repr(v)[:80]}; one value for every layer is "
                                   f"supported (a list of {n_layers} equal ones or a number)")
        return _int({key: v[0]}, meta_path, key, section="config")
    return _int(cfg, meta_path, key, default, section="config")


def _hunyuan_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> MoeSpec:
    """HunYuan-MoE's experts (HunYuanMoEV1Config's keys and defaults): in every layer moe_topk of num_experts
    experts, weighted by their softmax scores renormalised over the chosen (HunYuanMoEV1Gate), beside one shared
    MLP of intermediate_size channels. The experts' width is moe_intermediate_size where the Hub's configs state
    it (llama.cpp's reading), which transformers takes as intermediate_size: a checkpoint transformers loads has
    them equal. num_shared_expert other than 1 (a shared MLP as wide as that many) is refused: transformers runs one."""
    n_experts = _int(cfg, meta_path, "num_experts", 1, section="config")
    top_k = _one_per_layer(cfg, meta_path, "moe_topk", 1, n_layers)
    _check_top_k(top_k, n_experts, "moe_topk", "num_experts", meta_path)
    inter = _int(cfg, meta_path, "intermediate_size", 11008, section="config")
    shared = _one_per_layer(cfg, meta_path, "num_shared_expert", 1, n_layers)
    if shared != 1:
        raise UnsupportedError(f"{meta_path}: config.num_shared_expert: {shared}; transformers' HunYuanMoEV1 runs one "
                               "shared MLP of intermediate_size channels (1 is supported)")
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=_one_per_layer(cfg, meta_path, "moe_intermediate_size", inter,
                                                                      n_layers),
                   norm_topk=True, glu="silu", alpha=1.702, limit=7.0, layers=(True,) * n_layers,
                   names=MOE_NAMES["hunyuan_moe"], shared_inter=inter)


def _hy_v3_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> MoeSpec:
    """Hy3's experts (HYV3Config's keys and defaults; HYV3TopKRouter): in the layers mlp_layer_types calls "sparse"
    (all but the first without it), scaled by router_scaling_factor (_chosen_by_bias)."""
    return _chosen_by_bias(cfg, meta_path, "HYV3", {"num_experts": 192, "num_experts_per_tok": 8,
                                                    "moe_intermediate_size": 1536, "num_shared_experts": 1},
                           ("router_scaling_factor", 2.826),
                           _mlp_layer_types(cfg, n_layers, meta_path), MOE_NAMES["hy_v3"])


def _afmoe_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> MoeSpec:
    """AFMoE's experts (AfmoeConfig's keys and defaults; AfmoeTokenChoiceRouter): in every layer from
    num_dense_layers on, scaled by route_scale (_chosen_by_bias)."""
    dense = _int(cfg, meta_path, "num_dense_layers", 1, section="config", allow_zero=True)
    return _chosen_by_bias(cfg, meta_path, "AFMoE", {"num_experts": 64, "num_experts_per_tok": 6,
                                                     "moe_intermediate_size": 1408, "num_shared_experts": 2},
                           ("route_scale", 1.0),
                           tuple(i >= dense for i in range(n_layers)), MOE_NAMES["afmoe"])


def _chosen_by_bias(cfg: dict[str, Any], meta_path: Path, who: str, defaults: dict[str, int],
                    scale: tuple[str, float], layers: tuple[bool, ...], names: dict[str, str]) -> MoeSpec:
    """Hy3's and AFMoE's routing, under their config classes' keys (``defaults``; ``scale``: the scale's key and
    default): in
    ``layers``, num_experts_per_tok of num_experts chosen by sigmoid score plus the choice bias, their scores
    renormalised and times the scale, beside num_shared_experts shared ones (one MLP of as many times
    moe_intermediate_size). A Hub config's route_norm false (llama.cpp's converters read it; transformers
    renormalises always) is refused."""
    def get(key: str, allow_zero: bool = False) -> int:
        return _int(cfg, meta_path, key, defaults[key], section="config", allow_zero=allow_zero)

    n_experts, top_k = get("num_experts"), get("num_experts_per_tok")
    _check_top_k(top_k, n_experts, "num_experts_per_tok", "num_experts", meta_path)
    if cfg.get("route_norm", True) is not True:
        raise UnsupportedError(f"{meta_path}: config.route_norm: {cfg['route_norm']!r}; transformers' {who} "
                               "renormalises the chosen experts' scores always (true is supported)")
    inter = get("moe_intermediate_size")
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=inter, norm_topk=True, glu="silu", alpha=1.702, limit=7.0,
                   layers=layers, names=names, shared_inter=inter * get("num_shared_experts", allow_zero=True),
                   sigmoid=True, routed_scale=_positive(cfg, meta_path, *scale, section="config"))


def _sigmoid_scored(cfg: dict[str, Any], meta_path: Path) -> None:
    """Refuse a config whose scoring_func says other than the sigmoid its router always runs: transformers ignores
    the key, llama.cpp's converter writes it as the gating llama.cpp runs, so the two would differ. dots.llm1's
    first Hub configs said "noaux_tc" there (its converter then read that as sigmoid)."""
    func = cfg.get("scoring_func", "sigmoid")
    if func not in ("sigmoid", "noaux_tc"):
        raise UnsupportedError(f"{meta_path}: config.scoring_func: {func!r}; this router scores experts by sigmoid "
                               "(transformers runs no other), and llama.cpp would run what the key says")
    method = cfg.get("topk_method", "noaux_tc")
    if method != "noaux_tc":
        raise UnsupportedError(f"{meta_path}: config.topk_method: {method!r}; this router chooses by score plus its "
                               "choice bias within groups ('noaux_tc'), and has no other")


def _mamba(cfg: dict[str, Any], n_layers: int, hidden: int, meta_path: Path) -> dict[str, Any]:
    """Granite 4's Mamba2 layers as DecoderSpec fields (GraniteMoeHybridConfig's keys and defaults): layer_types
    (every layer Mamba2 without it); the heads, their dim (mamba_d_head, "auto": mamba_expand hidden / heads), the
    state's dim, the groups of B and C, the convolution's taps. What the decoder does not run is refused: no
    convolution bias, biases on the projections, a time-step clamp (the activation: decoder_spec's, SiLU only)."""
    def get(key: str) -> int:
        return _int(cfg, meta_path, key, MAMBA_DEFAULTS[key], section="config")

    types = cfg.get("layer_types")
    layers = (True,) * n_layers if types is None else tuple(
        _per_layer(types, "layer_types", n_layers, MAMBA_LAYER_TYPES, meta_path))
    heads, groups = get("mamba_n_heads"), get("mamba_n_groups")
    inner = get("mamba_expand") * hidden
    d_head = cfg.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head == "auto" else _int(cfg, meta_path, "mamba_d_head", section="config")
    if heads * d_head != inner or heads % groups:
        raise IEError(f"{meta_path}: config.mamba_n_heads: {heads} heads of mamba_d_head {d_head} are not "
                      f"mamba_expand × hidden_size = {inner} channels in mamba_n_groups {groups} groups")
    _refuse_unlike(cfg, meta_path, (("mamba_conv_bias", True), ("mamba_proj_bias", False)),
                   "it runs Granite 4's Mamba2 layers with a convolution bias and no projection biases")
    _no_time_step_clamp(cfg, meta_path, "time_step_limit")
    return {"ssm": layers, "ssm_heads": heads, "ssm_head_dim": d_head, "ssm_state": get("mamba_d_state"),
            "ssm_groups": groups, "ssm_conv": get("mamba_d_conv")}


def _refuse_unlike(cfg: dict[str, Any], meta_path: Path, wants: tuple[tuple[str, Any], ...], runs: str) -> None:
    """Refuse the first config key whose value (``want`` where absent) differs, in value or in type, from what the
    decoder runs (``runs``: the words saying what that is)."""
    for key, want in wants:
        if (v := cfg.get(key, want)) != want or type(v) is not type(want):
            raise UnsupportedError(f"{meta_path}: config.{key}: {v!r:.40} is not supported by the decoder ({runs})")


def _no_time_step_clamp(cfg: dict[str, Any], meta_path: Path, *keys: str) -> None:
    """Mamba2's time-step clamp (the first of ``keys`` set) must be none, [0, infinity]: transformers 5 writes
    infinity as {"__float__": "Infinity"}, the Hub's configs as "Infinity". Any other is refused."""
    limit = next((cfg[k] for k in keys if cfg.get(k) is not None), None)
    if limit is not None and limit not in ([0, {"__float__": "Infinity"}], [0, "Infinity"]):
        raise UnsupportedError(f"{meta_path}: config.{keys[0]}: {limit!r:.60}: clamping the time step is not "
                               "supported by the decoder (only [0.0, Infinity], none)")


def _nemotron_blocks(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> str:
    """Nemotron-H's blocks as hybrid_override_pattern spells them, one character per layer (NEMOTRON_BLOCKS): from
    config.layers_block_type (transformers 5's), else hybrid_override_pattern (the Hub's)."""
    if cfg.get("layers_block_type") is not None:
        key, values = "layers_block_type", cfg["layers_block_type"]
    else:
        key, values = "hybrid_override_pattern", cfg.get("hybrid_override_pattern")
        values = list(values) if isinstance(values, str) else values
    return "".join(_per_layer(values, key, n_layers, NEMOTRON_BLOCKS, meta_path,
                              "'linear_attention', 'full_attention', 'mlp' or 'moe' (M, *, - or E)"))


def _nemotron_h(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> dict[str, Any]:
    """Nemotron-H's blocks as DecoderSpec fields (NemotronHConfig's keys, their legacy spellings and defaults): which
    layers run Mamba2 (its heads, their dims, the state's, B and C's groups, the convolution's taps), which are an MLP
    or experts alone and which a mixer alone; the MLP blocks' width (the experts' where there are none). What the
    decoder does not run is refused: biases, no convolution bias, an activation but SiLU in Mamba2, a time-step clamp,
    experts on a latent projection (Nemotron 3 Super's), sliding windows, multi-token prediction layers."""
    def get(key: str, *legacy: str) -> int:
        key = next((k for k in (key, *legacy) if k in cfg), key)
        return _int(cfg, meta_path, key, NEMOTRON_DEFAULTS.get(key), section="config")

    blocks = _nemotron_blocks(cfg, n_layers, meta_path)
    heads, groups = get("mamba_num_heads"), get("n_groups", "mamba_n_groups")
    if heads % groups:
        raise IEError(f"{meta_path}: config.mamba_num_heads: {heads} heads do not split into n_groups {groups} groups")
    _refuse_unlike(cfg, meta_path, (("use_bias", False), ("mlp_bias", False), ("attention_bias", False),
                                    ("use_conv_bias", True), ("mamba_conv_bias", True), ("mamba_hidden_act", "silu"),
                                    ("moe_latent_size", None), ("sliding_window", None),
                                    ("num_nextn_predict_layers", 0)),
                   "it runs Nemotron-H without biases, with a convolution bias, SiLU in Mamba2, experts on the "
                   "hidden states, full attention and no multi-token prediction layers")
    _no_time_step_clamp(cfg, meta_path, "time_step_limit", "mamba_dt_limit")
    return {"ssm": tuple(b == "M" for b in blocks), "ssm_heads": heads, "ssm_head_dim": get("mamba_head_dim"),
            "ssm_state": get("ssm_state_size"), "ssm_groups": groups, "ssm_conv": get("conv_kernel", "mamba_d_conv"),
            "mlp_only": tuple(b in "-E" for b in blocks), "mixer_only": tuple(b in "M*" for b in blocks),
            "inter": get("intermediate_size") if "-" in blocks else get("moe_intermediate_size") if "E" in blocks
            else 1}


def _mamba2(cfg: dict[str, Any], n_layers: int, hidden: int, meta_path: Path) -> dict[str, Any]:
    """Mamba-2's layers as Nemotron-H's Mamba2 blocks, every one (Mamba2Config's keys and defaults): num_heads of
    head_dim, which must be expand x hidden_size channels (Mamba2Config's own check), state_size, n_groups,
    conv_kernel. What the decoder does not run is refused as for Nemotron-H: biases on the projections, no
    convolution bias, an activation but SiLU, a time-step clamp."""
    def get(key: str) -> int:
        return _int(cfg, meta_path, key, MAMBA2_DEFAULTS[key], section="config")

    heads, d_head, groups = get("num_heads"), get("head_dim"), get("n_groups")
    if heads * d_head != get("expand") * hidden or heads % groups:
        raise IEError(f"{meta_path}: config.num_heads: {heads} heads of head_dim {d_head} are not expand × "
                      f"hidden_size = {get('expand') * hidden} channels in n_groups {groups} groups")
    _refuse_unlike(cfg, meta_path, (("use_bias", False), ("use_conv_bias", True), ("hidden_act", "silu")),
                   "it runs Mamba-2 without biases on the projections, with a convolution bias, SiLU")
    _no_time_step_clamp(cfg, meta_path, "time_step_limit")
    return {"ssm": (True,) * n_layers, "ssm_heads": heads, "ssm_head_dim": d_head, "ssm_state": get("state_size"),
            "ssm_groups": groups, "ssm_conv": get("conv_kernel"), "mlp_only": (False,) * n_layers,
            "mixer_only": (True,) * n_layers, "inter": 1}


def _falcon_h1(cfg: dict[str, Any], n_layers: int, hidden: int, meta_path: Path) -> dict[str, Any]:
    """Falcon-H1's layers as DecoderSpec fields (FalconH1Config's keys and defaults): Mamba2 in every layer beside
    attention (mamba_n_heads of mamba_d_head, "auto": mamba_d_ssm / heads, which must be mamba_d_ssm channels, or
    mamba_expand x hidden_size without it; mamba_d_state, mamba_n_groups, mamba_d_conv), and the muP multipliers:
    embedding_multiplier on the embeddings, lm_head_multiplier on the logits (logits_scaling its inverse), the
    attention's input (attention_in_multiplier; key_multiplier on k besides) and output (attention_out_multiplier),
    Mamba2's input (ssm_in_multiplier times ssm_multipliers' five on z, x, B, C, dt) and output
    (ssm_out_multiplier), mlp_multipliers' two on the gate and down. transformers multiplies a projection's input;
    without biases (else refused) its output is the same. Refused besides: the gated norm (mamba_rms_norm, which
    the Hub's models leave off), a convolution without bias, a time-step clamp; a multiplier not positive."""
    def get(key: str) -> int:
        return _int(cfg, meta_path, key, FALCON_H1_DEFAULTS[key], section="config")

    def mult(key: str) -> float:
        return _positive(cfg, meta_path, key, 1.0, section="config")

    def mults(key: str) -> list[float]:
        n = FALCON_H1_MULTIPLIER_LISTS[key]
        v = cfg.get(key)
        if v is None:
            return [1.0] * n
        if not isinstance(v, list) or len(v) != n or not all(
                type(x) in (int, float) and math.isfinite(x) and x > 0 for x in v):
            raise IEError(f"{meta_path}: config.{key}: expected {n} positive numbers, got {v!r:.60}")
        return [float(x) for x in v]

    heads, groups = get("mamba_n_heads"), get("mamba_n_groups")
    inner = get("mamba_d_ssm") if cfg.get("mamba_d_ssm", 0) is not None else get("mamba_expand") * hidden
    d_head = cfg.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head == "auto" else _int(cfg, meta_path, "mamba_d_head", section="config")
    if heads * d_head != inner or heads % groups:
        raise IEError(f"{meta_path}: config.mamba_n_heads: {heads} heads of mamba_d_head {d_head} are not "
                      f"mamba_d_ssm = {inner} channels in mamba_n_groups {groups} groups")
    _refuse_unlike(cfg, meta_path, (("mamba_conv_bias", True), ("mamba_proj_bias", False), ("projectors_bias", False),
                                    ("attention_bias", False), ("mlp_bias", False), ("mamba_rms_norm", False)),
                   "it runs Falcon-H1 with a convolution bias, no biases on the projections and no gated norm in "
                   "Mamba2")
    _no_time_step_clamp(cfg, meta_path, "time_step_limit")
    a_in, ssm_in = mult("attention_in_multiplier"), mult("ssm_in_multiplier")
    gate, down = mults("mlp_multipliers")
    return {"ssm": (True,) * n_layers, "ssm_heads": heads, "ssm_head_dim": d_head, "ssm_state": get("mamba_d_state"),
            "ssm_groups": groups, "ssm_conv": get("mamba_d_conv"), "ssm_attends": True,
            "embed_scale": mult("embedding_multiplier"), "logits_scaling": 1.0 / mult("lm_head_multiplier"),
            "q_mult": a_in, "k_mult": a_in * mult("key_multiplier"), "v_mult": a_in,
            "o_mult": mult("attention_out_multiplier"), "ssm_out_mult": mult("ssm_out_multiplier"),
            "ssm_in_mults": tuple(ssm_in * m for m in mults("ssm_multipliers")), "gate_mult": gate,
            "down_mult": down}


def _mamba1(cfg: dict[str, Any], n_layers: int, hidden: int, meta_path: Path, norms: bool) -> dict[str, Any]:
    """Mamba 1's layers as DecoderSpec fields (MambaConfig's and FalconMambaConfig's keys and defaults): every layer
    its selective scan alone, intermediate_size channels (expand x hidden_size, as the config derives it), state_size,
    time_step_rank ("auto": ceil(hidden_size / 16)), conv_kernel; with ``norms`` (Falcon Mamba) dt's low rank, B and
    C RMS-normed by mixer_rms_eps. What the decoder does not run is refused: biases on the projections, no
    convolution bias (an activation but SiLU: decoder_spec)."""
    def get(key: str) -> int:
        return _int(cfg, meta_path, key, MAMBA1_DEFAULTS[key], section="config")

    rank = cfg.get("time_step_rank", "auto")
    rank = -(-hidden // 16) if rank == "auto" else _int(cfg, meta_path, "time_step_rank", section="config")
    _refuse_unlike(cfg, meta_path, (("use_bias", False), ("use_conv_bias", True)),
                   "it runs Mamba without biases on the projections, with a convolution bias")
    eps = _positive(cfg, meta_path, "mixer_rms_eps", 1e-6, section="config") if norms else 0.0
    inner = _int(cfg, meta_path, "intermediate_size", get("expand") * hidden, section="config")
    return {"ssm1": (True,) * n_layers, "ssm1_inner": inner, "ssm1_rank": rank,
            "ssm_state": get("state_size"), "ssm_conv": get("conv_kernel"), "ssm1_norms": norms, "ssm1_eps": eps,
            "mlp_only": (False,) * n_layers, "mixer_only": (True,) * n_layers, "inter": 1}


def _nemotron_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> MoeSpec | None:
    """Nemotron-H's experts in its E blocks (NemotronHConfig's keys and defaults; None without such blocks):
    num_experts_per_tok of n_routed_experts, chosen by sigmoid score plus the correction bias within the best
    topk_group of n_group groups (DeepSeek-V3's router), weighted by their scores (renormalised with norm_topk_prob)
    times routed_scaling_factor; ReLU-squared experts of moe_intermediate_size channels, and a shared one of
    moe_shared_expert_intermediate_size."""
    blocks = _nemotron_blocks(cfg, n_layers, meta_path)
    if "E" not in blocks:
        return None

    def get(key: str) -> int:
        return _int(cfg, meta_path, key, NEMOTRON_DEFAULTS[key], section="config")

    n_experts, top_k, groups, used = (get("n_routed_experts"), get("num_experts_per_tok"), get("n_group"),
                                      get("topk_group"))
    if n_experts % groups or used > groups or top_k > n_experts or (used < groups and (
            n_experts // groups < 2 or top_k > used * (n_experts // groups))):
        raise IEError(f"{meta_path}: config.topk_group: {used} of n_group {groups} groups of {n_experts} experts "
                      f"(n_routed_experts); expected at most n_group groups of 2 or more experts each, the kept ones "
                      f"holding num_experts_per_tok ({top_k})")
    norm = cfg.get("norm_topk_prob", True)
    if not isinstance(norm, bool):
        raise IEError(f"{meta_path}: config.norm_topk_prob: expected true or false, got {norm!r}")
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=get("moe_intermediate_size"), norm_topk=norm, glu="relu2",
                   alpha=1.702, limit=7.0, layers=tuple(b == "E" for b in blocks), names=MOE_NAMES["nemotron_h"],
                   shared_inter=get("moe_shared_expert_intermediate_size"), sigmoid=True, n_group=groups,
                   topk_group=used, routed_scale=_positive(cfg, meta_path, "routed_scaling_factor", 1.0,
                                                           section="config"))


def _lfm2_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> MoeSpec:
    """LFM2-MoE's experts (Lfm2MoeConfig's keys and defaults): num_experts_per_tok of num_experts in every layer
    from num_dense_layers on, chosen by sigmoid score plus expert_bias where use_expert_bias, weighted by their
    scores (renormalised with norm_topk_prob) times routed_scaling_factor."""
    n_experts = _int(cfg, meta_path, "num_experts", 32, section="config")
    top_k = _int(cfg, meta_path, "num_experts_per_tok", 4, section="config")
    _check_top_k(top_k, n_experts, "num_experts_per_tok", "num_experts", meta_path)
    dense = _int(cfg, meta_path, "num_dense_layers", 2, section="config", allow_zero=True)
    flags = {k: cfg.get(k, True) for k in ("norm_topk_prob", "use_expert_bias")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise IEError(f"{meta_path}: config.{k}: expected true or false, got {v!r:.40}")
    names = {k: v for k, v in MOE_NAMES["lfm2_moe"].items() if k != "expert_bias" or flags["use_expert_bias"]}
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=_int(cfg, meta_path, "moe_intermediate_size", 1792,
                                                                 section="config"),
                   norm_topk=flags["norm_topk_prob"], glu="silu", alpha=1.702, limit=7.0,
                   layers=tuple(i >= dense for i in range(n_layers)), names=names, sigmoid=True,
                   routed_scale=_positive(cfg, meta_path, "routed_scaling_factor", 1.0, section="config"))


def _lfm2(cfg: dict[str, Any], n_layers: int, meta_path: Path, moe: bool) -> dict[str, Any]:
    """LFM2's layers as DecoderSpec fields (Lfm2Config's keys and defaults): layer_types, else attention at
    full_attn_idxs (every layer without it); the convolution's taps; and the dense MLP's width (``inter``), which
    Lfm2MLP derives from intermediate_size (the Hub's block_ff_dim) where block_auto_adjust_ff_dim: two thirds of
    it, times block_ffn_dim_multiplier, up to a multiple of block_multiple_of (``moe``: LFM2-MoE's dense layers
    take intermediate_size as it is)."""
    types = cfg.get("layer_types")
    if types is None:
        full = cfg.get("full_attn_idxs")
        full = list(range(n_layers)) if full is None else full
        if not isinstance(full, list) or not all(type(i) is int for i in full):
            raise IEError(f"{meta_path}: config.full_attn_idxs: expected a list of layer indices, got {full!r:.60}")
        types = ["full_attention" if i in full else "conv" for i in range(n_layers)]
    layers = _per_layer(types, "layer_types", n_layers, SHORT_CONV_LAYER_TYPES, meta_path)
    if cfg.get("conv_bias", False) is not False:
        raise UnsupportedError(f"{meta_path}: config.conv_bias: {cfg['conv_bias']!r}: biases on the short "
                               "convolution are not supported by the decoder")
    inter = _int(cfg, meta_path, "intermediate_size" if "intermediate_size" in cfg else "block_ff_dim",
                 7168 if moe else 12288, section="config")
    adjust = cfg.get("block_auto_adjust_ff_dim", not moe)
    if type(adjust) is not bool:
        raise IEError(f"{meta_path}: config.block_auto_adjust_ff_dim: expected true or false, got {adjust!r:.40}")
    if adjust:
        inter = int(2 * inter / 3)
        mult = cfg.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            inter = int(_positive(cfg, meta_path, "block_ffn_dim_multiplier", 1.0, section="config") * inter)
            step = _int(cfg, meta_path, "block_multiple_of", 256, section="config")
            inter = step * ((inter + step - 1) // step)
    return {"short_conv": tuple(layers), "conv_taps": _int(cfg, meta_path, "conv_L_cache", 3, section="config"),
            "inter": inter}


def _ernie_moe(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> MoeSpec:
    """ERNIE 4.5's experts (Ernie4_5_MoeConfig's keys and defaults): at
    layers i with (i + 1) % moe_layer_interval == 0 from moe_layer_start_index
    to moe_layer_end_index (-1: the last); moe_k of moe_num_experts chosen by
    softmax probability plus the choice bias, weighted by their probabilities
    over their sum (its moe_norm_min only bounds that sum away from 0: both
    sides' arithmetic agree above it); moe_num_shared_experts shared ones."""
    def get(key: str, default: int, allow_zero: bool = False) -> int:
        return _int(cfg, meta_path, key, default, section="config", allow_zero=allow_zero)

    n_experts, top_k, inter = get("moe_num_experts", 64), get("moe_k", 6), get("moe_intermediate_size", 1536)
    _check_top_k(top_k, n_experts, "moe_k", "moe_num_experts", meta_path)
    start, step = get("moe_layer_start_index", 1, allow_zero=True), get("moe_layer_interval", 1)
    end = cfg.get("moe_layer_end_index", -1)
    if end == -1:
        end = n_layers - 1
    if type(end) is not int or not 0 <= end < n_layers:
        raise IEError(f"{meta_path}: config.moe_layer_end_index: expected -1 or a layer index below {n_layers}, "
                      f"got {end!r}")
    layers = tuple((i + 1) % step == 0 and start <= i <= end for i in range(n_layers))
    return MoeSpec(n_experts=n_experts, top_k=top_k, inter=inter, norm_topk=True, glu="silu", alpha=1.702, limit=7.0,
                   layers=layers, names=MOE_NAMES["ernie4_5_moe"],
                   shared_inter=inter * get("moe_num_shared_experts", 2, allow_zero=True), bias_row=True)


def _llama4(cfg: dict[str, Any], nope: tuple[bool, ...], meta_path: Path) -> dict[str, Any]:
    """Llama 4's attention as DecoderSpec fields (Llama4TextConfig's keys
    and defaults): per layer its chunk (layer_types' "chunked_attention",
    by default every layer RoPE turns), the q/k norm (use_qk_norm), and the
    temperature of the unrotated layers' queries, 1 + attn_scale ln(1 +
    floor((p + 1) / floor_scale)) (attn_temperature_tuning)."""
    n_layers = len(nope)
    types = cfg.get("layer_types")
    chunked = [not n for n in nope] if types is None else \
        _per_layer(types, "layer_types", n_layers, {"chunked_attention": True, "full_attention": False}, meta_path)
    chunk = _int(cfg, meta_path, "attention_chunk_size", 8192, section="config") if any(chunked) else 0
    norm = cfg.get("use_qk_norm", True)
    tuning = cfg.get("attn_temperature_tuning", True)
    for key, v in (("use_qk_norm", norm), ("attn_temperature_tuning", tuning)):
        if not isinstance(v, bool):
            raise IEError(f"{meta_path}: config.{key}: expected true or false, got {v!r}")
    return {"chunks": tuple(chunk if c else 0 for c in chunked), "qk_l2_norm": norm,
            "attn_temp_scale": _positive(cfg, meta_path, "attn_scale", 0.1, allow_zero=True, section="config")
            if tuning else 0.0,
            "attn_temp_floor": _int(cfg, meta_path, "floor_scale", 8192, section="config"),
            "attn_temp_offset": 1.0, "attn_temp_nope": True}


def _moe_layers(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> tuple[bool, ...]:
    """Llama4TextConfig's layers with experts: moe_layers, else every
    interleave_moe_layer_step-th (every one by default)."""
    at = cfg.get("moe_layers")
    if at is None:
        return tuple(every_nth(_int(cfg, meta_path, "interleave_moe_layer_step", 1, section="config"), n_layers))
    if not isinstance(at, list) or any(type(i) is not int or not 0 <= i < n_layers for i in at):
        raise IEError(f"{meta_path}: config.moe_layers: expected a list of layer indices below {n_layers}, "
                      f"got {at!r:.80}")
    return tuple(i in at for i in range(n_layers))


def _mlp_layer_types(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> tuple[bool, ...]:
    """Glm4MoeLiteConfig's (HYV3Config's) per-layer "dense" / "sparse" (experts), the first
    layer dense and the others sparse where the config has none."""
    types = cfg.get("mlp_layer_types")
    if types is None:
        return tuple(i > 0 for i in range(n_layers))
    return tuple(_per_layer(types, "mlp_layer_types", n_layers, {"dense": False, "sparse": True}, meta_path))


def _mla(cfg: dict[str, Any], heads: int, n_kv: int, meta_path: Path) -> tuple[dict[str, Any], int, int]:
    """Latent attention's DecoderSpec fields (DeepseekV2Config's and
    DeepseekV3Config's keys), the q/k head's dims and the rotary ones."""
    if cfg.get("attention_bias"):
        raise UnsupportedError(f"{meta_path}: config.attention_bias: biases on latent attention's projections are "
                               "not supported by the decoder")
    if n_kv != heads:  # (kv_b_proj decompresses a key and a value for every head)
        raise IEError(f"{meta_path}: config.num_key_value_heads: {n_kv}; latent attention has one key and value per "
                      f"head ({heads})")
    q_lora = 0 if cfg.get("q_lora_rank") is None else _int(cfg, meta_path, "q_lora_rank", section="config")
    kv_lora = _int(cfg, meta_path, "kv_lora_rank", section="config")
    nope, rot = (_int(cfg, meta_path, k, section="config") for k in ("qk_nope_head_dim", "qk_rope_head_dim"))
    if rot % 2:
        raise IEError(f"{meta_path}: config.qk_rope_head_dim: {rot}; RoPE turns an even number of dims")
    v = _int(cfg, meta_path, "v_head_dim", section="config")
    return {"q_lora": q_lora, "kv_lora": kv_lora, "v_head_dim": v}, nope + rot, rot


def _mla_scale(scaling: Any, head_dim: int, meta_path: Path) -> float:
    """Latent attention's score factor (transformers' yarn_apply_mscale):
    head_dim^-1/2, times m^2 under a scaled RoPE with mscale_all_dim, m being
    YaRN's attention factor of that mscale (llama.cpp's yarn_log_multiplier)."""
    scale = head_dim ** -0.5
    if rope_kind(scaling) != "default" and scaling.get("mscale_all_dim"):
        try:
            m = yarn_attention_factor(_scaling_number(scaling, "factor"), _scaling_number(scaling, "mscale_all_dim"))
        except IEError as e:
            raise IEError(f"{meta_path}: model.{e}") from None
        scale *= m * m
    return scale


def _layer_thetas(cfg: dict[str, Any], n_layers: int, meta_path: Path) -> list[float] | None:
    """Granite SWA's config.layer_rope_theta, one non-negative base per layer (0: no RoPE), or None."""
    thetas = cfg.get("layer_rope_theta")
    if thetas is None:
        return None
    if not isinstance(thetas, list) or len(thetas) != n_layers or not all(
            not isinstance(t, bool) and isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in thetas):
        raise IEError(f"{meta_path}: config.layer_rope_theta: expected {n_layers} non-negative numbers, one per layer "
                      f"(0: no RoPE); got {thetas!r:.80}")
    return [float(t) for t in thetas]


def _granite_swa_thetas(cfg: dict[str, Any], windows: tuple[int, ...], theta: float, scaling: Any,
                        meta_path: Path) -> tuple[float, float]:
    """Granite SWA's RoPE bases from config.layer_rope_theta (every layer the model's rope_theta without it): the
    full layers' (the model's table) and, where it differs, the sliding layers' (0: the same), each unscaled if it
    differs. More bases than one per kind of layer, or a second one beside a RoPE scaling, are refused."""
    thetas = _layer_thetas(cfg, len(windows), meta_path)
    if thetas is None:
        return theta, 0.0
    full = {t for t, w in zip(thetas, windows) if t and not w}
    sliding = {t for t, w in zip(thetas, windows) if t and w}
    if len(full) > 1 or len(sliding) > 1 or (full and sliding and full != sliding and scaling):
        raise UnsupportedError(f"{meta_path}: config.layer_rope_theta: bases {sorted(full | sliding)} over the full "
                               f"and sliding layers; the decoder turns the full layers by one base and the sliding "
                               f"ones by one more (unscaled)")
    main = next(iter(full or sliding), theta)
    local = next(iter(sliding), main)
    return main, (local if local != main else 0.0)


def _local_theta(cfg: dict[str, Any], meta_path: Path, default: float) -> float:
    """The sliding layers' RoPE base (Gemma 3, OLMo 3), where transformers
    reads it: rope_parameters.sliding_attention (transformers 5), else
    rope_local_base_freq (Gemma 3's configs on the Hub), else ``default``."""
    rp = cfg.get("rope_parameters")
    local = rp.get("sliding_attention") if isinstance(rp, dict) else None
    if isinstance(local, dict):
        if local.get("rope_type", "default") != "default":
            raise UnsupportedError(f"{meta_path}: config.rope_parameters.sliding_attention.rope_type: "
                                   f"{local.get('rope_type')!r} is not supported (default is)")
        theta = local.get("rope_theta", default)
    else:
        theta = cfg.get("rope_local_base_freq", default)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise IEError(f"{meta_path}: config.rope_local_base_freq: expected a positive number, got {theta!r}")
    return float(theta)


def _gemma(arch: Arch, cfg: dict[str, Any], hidden: int, meta_path: Path) -> dict[str, Any]:
    """What Gemma adds to a layer (Arch.gemma), as DecoderSpec fields, or
    an error naming the config key the decoder does not implement."""
    out: dict[str, Any] = {}
    for key, field in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "logit_softcap")):
        if arch.softcaps:
            out[field] = _positive(cfg, meta_path, key, 0.0, section="config")
        elif cfg.get(key) is not None:
            raise UnsupportedError(f"{meta_path}: config.{key}: soft-capping is not supported here (Gemma 2 has "
                                   "it; Gemma 3 has none)")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedError(f"{meta_path}: config.use_bidirectional_attention: bidirectional attention "
                               "(EmbeddingGemma) is not supported")
    if arch.gemma == 1:  # (GemmaAttention scales by 1/sqrt(head_dim) and reads no scalar)
        if cfg.get("query_pre_attn_scalar") is not None:
            raise UnsupportedError(f"{meta_path}: config.query_pre_attn_scalar: Gemma 1 scales its scores by "
                                   "1/sqrt(head_dim) (transformers' GemmaAttention reads no scalar)")
        scalar = 0.0  # (DecoderConfig's 1/sqrt(head_dim))
    else:
        scalar = _positive(cfg, meta_path, "query_pre_attn_scalar", 256.0, section="config") ** -0.5
    return {**out, "attn_scale": scalar, "embed_scale": float(np.float32(math.sqrt(hidden))),
            "norm_offset": 1.0}


def _switched_biases(arch: Arch, cfg: dict[str, Any]) -> Arch:
    """``arch`` with its biases as config[arch.bias_switch] makes transformers build them: StableLM's
    use_qkv_bias turns the q/k/v biases on; Qwen2-MoE's qkv_bias and StarCoder2's use_bias, false, turn every
    bias the architecture has off (a stored one is then unread: refused); Jais 2's attention_bias the
    attention's, its mlp_bias (mlp_bias_switch) the MLP's."""
    if arch.mlp_bias_switch:  # (the MLP's by their own key, apart from the attention's: Jais 2's mlp_bias)
        arch = replace(arch, mlp_biases=bool(cfg.get(arch.mlp_bias_switch, arch.mlp_biases)))
    default = bool(arch.biases) or (arch.mlp_biases and not arch.mlp_bias_switch)
    if not arch.bias_switch or bool(cfg.get(arch.bias_switch, default)) == default:
        return arch
    if default:  # (the MLP's go with the attention's unless their own key rules them)
        return replace(arch, biases=(), no_biases=(*arch.no_biases, *arch.biases),
                       mlp_biases=arch.mlp_biases if arch.mlp_bias_switch else False)
    qkv = ("q", "k", "v")
    return replace(arch, biases=qkv, no_biases=tuple(b for b in arch.no_biases if b not in qkv))


def _check_config(cfg: dict[str, Any], arch: Arch, meta_path: Path) -> None:
    """Config keys that change the computation in a way the decoder does not implement."""
    if cfg.get("mlp_bias") and arch.mlp_bias_switch != "mlp_bias":
        raise UnsupportedError(f"{meta_path}: config.mlp_bias: MLP biases are not supported by the decoder")
    if cfg.get("use_bias") and arch.bias_switch != "use_bias":  # (ERNIE 4.5's: every projection's, the MLP's too)
        raise UnsupportedError(f"{meta_path}: config.use_bias: biases on every projection (the MLP's too) are not "
                               "supported by the decoder")
    if cfg.get("qk_layernorm"):
        raise UnsupportedError(f"{meta_path}: config.qk_layernorm: LayerNorms of q and k (StableLM 2 12B's, Phi's) are "
                               "not supported by the decoder")
    if cfg.get("use_parallel_residual"):
        raise UnsupportedError(f"{meta_path}: config.use_parallel_residual: StableLM 2 12B's parallel layer is not "
                               "supported by the decoder")
    if cfg.get("use_cla"):
        raise UnsupportedError(f"{meta_path}: config.use_cla: true; cross-layer attention (layers sharing another's "
                               "keys and values: Hunyuan-Large's) is not supported by the decoder, nor by transformers "
                               "or llama.cpp")
    if cfg.get("clip_qkv") is not None and not arch.clip_qkv:
        raise UnsupportedError(f"{meta_path}: config.clip_qkv: {cfg['clip_qkv']!r}; clamping q, k and v (OLMo's "
                               "option) is not supported by the decoder")
    q = cfg.get("quantization_config")
    method = q.get("quant_method") if isinstance(q, dict) else q
    if q is not None and method != "mxfp4":  # mxfp4: gpt-oss's experts, converted to the mxfp4 type (NVFP4's: none)
        raise UnsupportedError(f"{meta_path}: config.quantization_config: quant_method {method!r} is not supported "
                               "(the decoder reads float weights, or the types ieconv and llama.cpp quantize to; "
                               "mxfp4 is); dequantize the checkpoint first")


# The kinds of weight a layer binds: a matrix [rows, cols]; a float vector;
# per expert a matrix (a tensor each, "{e}" in the name, or a stack
# [experts, rows, cols]) or a vector (a row of a stack [experts, n]).
MATRIX, VECTOR, EXPERT_MATRIX, EXPERT_VECTOR = "matrix", "vector", "expert_matrix", "expert_vector"
# The keys of the native decoder's two lists: the model's layers, and a
# layer's experts (each a dict of the expert kinds' keys).
LAYERS_KEY, EXPERTS_KEY = "layers", "experts"


@dataclass(frozen=True)
class Part:
    """One weight the decoder binds, as the config implies it: ``key`` is
    where the native decoder takes it (a field of csrc/decoder/decoder.h's
    LayerWeights, or of Expert for the per-expert kinds; the one other
    definition of these keys is the field table in csrc/decoder/bindings.cpp,
    which refuses any key it does not know); ``name`` the tensor;
    ``shape`` its shape (per expert for the expert kinds); ``required``
    False for a bias read where the artifact stores it."""

    key: str
    name: str
    shape: tuple[int, ...]
    kind: str = MATRIX
    required: bool = True


def model_parts(s: DecoderSpec) -> list[Part]:
    """The model-level weights: the embedding, the output head (the
    embedding again when tied or absent: not required), the final norm."""
    return _renamed(s, [Part("embed", "model.embed_tokens.weight", (s.vocab, s.hidden)),
                        Part("lm_head", "lm_head.weight", (s.vocab, s.hidden), required=False),
                        *([] if s.arch.weightless_norms else [Part("norm", "model.norm.weight", (s.hidden,), VECTOR)]),
                        *([Part("norm_b", "model.norm.bias", (s.hidden,), VECTOR)] if s.arch.norm_bias else []),
                        *([Part("lm_head_b", "lm_head.bias", (s.vocab,), VECTOR)] if s.arch.head_bias else [])])


def layer_parts(s: DecoderSpec, i: int) -> list[Part]:
    """Every weight of layer ``i`` the decoder binds, in binding order, under the model's names."""
    return _renamed(s, _layer_parts(s, i))


def _layer_parts(s: DecoderSpec, i: int) -> list[Part]:
    pre = f"model.layers.{i}."
    q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    shapes = {"q": (q_dim, s.hidden), "k": (kv_dim, s.hidden), "v": (kv_dim, s.hidden),
              "o": (s.hidden, s.n_heads * s.v_dim),
              "gate": (s.inter, s.hidden), "up": (s.inter, s.hidden), "down": (s.hidden, s.inter)}
    bias_len = {"q": q_dim, "k": kv_dim, "v": kv_dim, "o": s.hidden}
    if s.arch.nemotron:
        return _nemotron_parts(s, i, shapes)
    recurrent = s.recurrent
    linear = bool(recurrent) and recurrent[i]  # (no attention: no biases or q/k norms)
    if s.ssm and s.ssm[i]:
        parts = _mamba_parts(s, pre)
        if s.ssm_attends:  # (Falcon-H1: the attention beside it)
            parts = [Part(key, f"{pre}{hf}.weight", shapes[key]) for key, hf in ATTN_MATRICES.items()] + parts
    elif s.short_conv and s.short_conv[i]:
        parts = [Part(key, pre + hf, shape, VECTOR if key == "conv_w" else MATRIX) for (key, hf), shape in
                 zip(SHORT_CONV.items(), ((3 * s.hidden, s.hidden), (s.hidden, 1, s.conv_taps), (s.hidden, s.hidden)))]
    elif linear:
        parts = _linear_parts(s, pre)
    elif s.arch.mla:
        parts = _mla_parts(s, pre)
    elif s.arch.attn_gate:
        parts = [Part(key, f"{pre}{hf}.weight", (2 * q_dim, s.hidden) if key == "q" else shapes[key])
                 for key, hf in ATTN_MATRICES.items()]
    else:
        parts = [Part(key, f"{pre}{hf}.weight", shapes[key]) for key, hf in ATTN_MATRICES.items()]
    vectors = ({} if s.arch.weightless_norms  # (OLMo's: bound as ones, decoder_weights)
               else GEMMA_LAYER_VECTORS if s.arch.gemma >= 2 or s.arch.sandwich else GLM4_LAYER_VECTORS if s.arch.glm_norms
               else COHERE_LAYER_VECTORS if s.arch.parallel else LAYER_VECTORS if s.arch.pre_norms
               else OLMO2_LAYER_VECTORS)
    parts += [Part(key, pre + hf, (s.hidden,), VECTOR) for key, hf in vectors.items()]
    if s.arch.norm_bias:  # (LayerNorm's biases beside its weights: attn_norm_b, mlp_norm_b)
        parts += [Part(key + "_b", pre + vectors[key].replace(".weight", ".bias"), (s.hidden,), VECTOR)
                  for key in ("attn_norm", "mlp_norm") if key in vectors]
    parts += [Part("b" + key, pre + hf, (bias_len[key],), VECTOR, required=key in s.arch.biases)
              for key, hf in LAYER_BIASES.items() if key not in s.arch.no_biases and not s.arch.mla and not linear]
    if s.arch.qk_norm and not linear:
        q_len, k_len = (q_dim, kv_dim) if s.arch.qk_norm_full else (s.head_dim, s.head_dim)
        parts += [Part("q_norm", pre + "self_attn.q_norm.weight", (q_len,), VECTOR),
                  Part("k_norm", pre + "self_attn.k_norm.weight", (k_len,), VECTOR)]
    if s.arch.sinks:
        parts.append(Part("sinks", pre + "self_attn.sinks", (s.n_heads,), VECTOR))
    if s.arch.gate_proj:  # (AFMoE's attention gate)
        parts.append(Part("q_gate", pre + "self_attn.gate_proj.weight", (q_dim, s.hidden)))
    moe = s.moe
    if moe is None or not moe.layers[i]:
        mlp = f"{pre}{s.arch.mlp_module}."
        return parts + [Part(key, f"{mlp}{hf}.weight", shapes[key])
                        for key, hf in MLP_MATRICES.items() if key != "gate" or s.mlp_gated] + \
            [Part("b" + key, f"{mlp}{MLP_MATRICES[key]}.bias", (n,), VECTOR)
             for key, n in (("up", s.inter), ("down", s.hidden)) if s.arch.mlp_biases] + \
            [Part(key, mlp + hf, shape, VECTOR) for key, (hf, shape) in XIELU_VECTORS.items() if s.mlp_act == "xielu"]
    return parts + _expert_parts(s, pre)


def _expert_parts(s: DecoderSpec, pre: str) -> list[Part]:
    """A layer's router (and its biases), shared expert and experts."""
    moe = s.moe
    parts = []
    names = moe.names
    parts.append(Part("router", pre + names["router"], (moe.n_experts, s.hidden)))
    for key in ("router_bias", "expert_bias"):
        if key in names:
            shape = (1, moe.n_experts) if key == "expert_bias" and moe.bias_row else (moe.n_experts,)
            parts.append(Part(key, pre + names[key], shape, VECTOR))
    if moe.shared_inter:  # the shared expert, in the dense MLP's slots, and its gate (Qwen2-MoE's)
        w = moe.shared_inter
        parts += [Part(key, pre + names[f"shared_{key}"], (s.hidden, w) if key == "down" else (w, s.hidden))
                  for key in ("gate", "up", "down") if f"shared_{key}" in names]
        if "shared_router" in names:
            parts.append(Part("shared_gate", pre + names["shared_router"], (1, s.hidden)))
    gate_rows = moe.inter if moe.glu in ("silu", "relu2") else 2 * moe.inter  # gpt-oss: gate and up rows alternate; Llama 4: halves
    per_expert = {"gate": (gate_rows, s.hidden), "up": (moe.inter, s.hidden), "down": (s.hidden, moe.inter)}
    parts += [Part(key, pre + names[key], shape, EXPERT_MATRIX) for key, shape in per_expert.items() if key in names]
    parts += [Part(key, pre + names[key], (n,), EXPERT_VECTOR)
              for key, n in (("bgate", gate_rows), ("bdown", s.hidden)) if key in names]
    return parts


def _mamba_parts(s: DecoderSpec, pre: str, module: str = "mamba.") -> list[Part]:
    """A Mamba2 layer's weights (DecoderSpec.ssm_*) under ``module`` (Granite 4's mamba., Nemotron-H's mixer.), its
    out_proj bound as o (Falcon-H1's, beside an attention's o, as ssm_out; it has no gated norm)."""
    ch = s.ssm_heads * s.ssm_head_dim + 2 * s.ssm_groups * s.ssm_state
    inner, heads = s.ssm_heads * s.ssm_head_dim, (s.ssm_heads,)
    shapes = {"ssm_in": (inner + ch + s.ssm_heads, s.hidden), "ssm_conv_w": (ch, 1, s.ssm_conv), "ssm_conv_b": (ch,),
              "ssm_dt": heads, "ssm_a": heads, "ssm_d": heads, "ssm_norm": (inner,), "o": (s.hidden, inner)}
    out = "ssm_out" if s.ssm_attends else "o"
    return [Part(out if key == "o" else key, pre + module + hf.removeprefix("mamba."), shapes[key],
                 MATRIX if key in ("ssm_in", "o") else VECTOR) for key, hf in MAMBA.items()
            if key != "ssm_norm" or not s.ssm_attends]


def _nemotron_parts(s: DecoderSpec, i: int, shapes: dict[str, tuple[int, ...]]) -> list[Part]:
    """A Nemotron-H block's weights: its one norm (bound as the mixer's or the MLP's), then its Mamba2 or attention
    (under mixer.), or its ReLU-squared MLP (up and down under mixer.), or its experts."""
    pre = f"model.layers.{i}."
    if s.mlp_only[i]:
        norm = [Part("mlp_norm", pre + "norm.weight", (s.hidden,), VECTOR)]
        if s.moe is not None and s.moe.layers[i]:
            return norm + _expert_parts(s, pre)
        return norm + [Part(key, f"{pre}mixer.{key}_proj.weight", shapes[key]) for key in ("up", "down")]
    norm = [Part("attn_norm", pre + "norm.weight", (s.hidden,), VECTOR)]
    if s.ssm1:  # (Mamba 1's layer)
        d = s.ssm1_inner
        dims = {"ssm_in": (2 * d, s.hidden), "ssm_conv_w": (d, 1, s.ssm_conv), "ssm_x": (s.ssm1_rank + 2 * s.ssm_state, d),
                "ssm_dt_w": (d, s.ssm1_rank), "ssm_a": (d, s.ssm_state), "o": (s.hidden, d)}
        return norm + [Part(key, f"{pre}mixer.{hf}", dims.get(key, (d,)),
                            MATRIX if key in MAMBA1_MATRICES else VECTOR) for key, hf in MAMBA1.items()]
    if s.ssm[i]:
        return norm + _mamba_parts(s, pre, "mixer.")
    return norm + [Part(key, f"{pre}mixer.{key}_proj.weight", shapes[key]) for key in ("q", "k", "v", "o")]


def own_name(arch: Arch, name: str) -> str:
    """A tensor name (or part of one) in Llama's spelling under ``arch``'s own (Arch.renames); one already in the
    model's own (Granite 4's shared_mlp.gate_proj holds Llama's mlp.gate_proj) as it is."""
    return next((name.replace(a, b, 1) for a, b in arch.renames if a in name and b not in name), name)


def _renamed(s: DecoderSpec, parts: list[Part]) -> list[Part]:
    """``parts`` under the model's own names (Arch.renames)."""
    return [replace(p, name=own_name(s.arch, p.name)) for p in parts] if s.arch.renames else parts


def _linear_parts(s: DecoderSpec, pre: str) -> list[Part]:
    """Gated DeltaNet's weights (DecoderSpec.lin_*), its out_proj bound as o."""
    kd, vd = s.lin_k_heads * s.lin_k_dim, s.lin_v_heads * s.lin_v_dim
    rows = {"lin_qkv": 2 * kd + vd, "lin_z": vd, "lin_b": s.lin_v_heads, "lin_a": s.lin_v_heads}
    vectors = {"lin_conv": (2 * kd + vd, 1, s.lin_conv), "lin_dt": (s.lin_v_heads,), "lin_decay": (s.lin_v_heads,),
               "lin_norm": (s.lin_v_dim,)}
    return [*(Part(key, f"{pre}linear_attn.{hf}.weight", (rows[key], s.hidden)) for key, hf in LINEAR_MATRICES.items()),
            *(Part(key, f"{pre}linear_attn.{hf}", vectors[key], VECTOR) for key, hf in LINEAR_VECTORS.items()),
            Part("o", f"{pre}{LINEAR_OUT}.weight", (s.hidden, vd))]


def _mla_parts(s: DecoderSpec, pre: str) -> list[Part]:
    """Latent attention's weights (DecoderSpec.q_lora .. v_head_dim) and o_proj."""
    rot = s.rotary_dim
    q_dim = s.n_heads * s.head_dim
    if s.q_lora:
        parts = [Part("q_a", f"{pre}{MLA_MATRICES['q_a']}.weight", (s.q_lora, s.hidden)),
                 Part("q_a_norm", pre + MLA_VECTORS["q_a_norm"], (s.q_lora,), VECTOR),
                 Part("q", f"{pre}{MLA_Q_B}.weight", (q_dim, s.q_lora))]
    else:
        parts = [Part("q", f"{pre}{ATTN_MATRICES['q']}.weight", (q_dim, s.hidden))]
    return parts + [
        Part("kv_a", f"{pre}{MLA_MATRICES['kv_a']}.weight", (s.kv_lora + rot, s.hidden)),
        Part("kv_a_norm", pre + MLA_VECTORS["kv_a_norm"], (s.kv_lora,), VECTOR),
        Part("kv_b", f"{pre}{MLA_MATRICES['kv_b']}.weight", (s.n_heads * (s.head_dim - rot + s.v_dim), s.kv_lora)),
        Part("o", f"{pre}{ATTN_MATRICES['o']}.weight", (s.hidden, s.n_heads * s.v_dim))]


def decoder_tensors(s: DecoderSpec) -> set[str]:
    """Every tensor name the decoder reads for ``s`` (an attention bias of
    any architecture), and those it leaves unread as transformers does:
    lm_head.weight of a tied model (tied over whatever was saved) and
    IGNORED_BUFFERS."""
    names = {p.name for p in model_parts(s)}
    for i in range(s.n_layers):
        for p in layer_parts(s, i):
            names.update(part_tensors(s, p))
        names.update(f"model.layers.{i}.{hf}" for hf in IGNORED_BUFFERS)
    return names


def part_tensors(s: DecoderSpec, p: Part) -> dict[str, list[int]]:
    """The tensors a part is stored as, with their shapes: itself; an
    expert kind's a tensor per expert ("{e}" in the name) or one stack
    [experts, ...] of them all."""
    if p.kind not in (EXPERT_MATRIX, EXPERT_VECTOR):
        return {p.name: list(p.shape)}
    if "{e}" in p.name:
        return {p.name.format(e=e): list(p.shape) for e in range(s.moe.n_experts)}
    return {p.name: [s.moe.n_experts, *p.shape]}


def _check_all_used(s: DecoderSpec, tensors: list[Any], meta_path: Path) -> None:
    """A tensor the decoder would not read is refused: running without it
    computes another model (MLP biases were carried and ignored). The
    multi-token prediction layers (DecoderSpec.mtp_layers, Arch.unread)
    are carried unread, as transformers leaves them."""
    known = decoder_tensors(s)
    mtp = tuple(f"model.layers.{i}." for i in range(s.n_layers, s.n_layers + s.mtp_layers)) + s.arch.unread
    unused = [t.get("name") for t in tensors if isinstance(t, dict) and t.get("name") not in known
              and not (mtp and str(t.get("name")).startswith(mtp))]
    if unused:
        more = f" and {len(unused) - 1} more" if len(unused) > 1 else ""
        raise UnsupportedError(f"{meta_path}: tensors[{unused[0]!r}]{more}: the {s.architecture} decoder does not "
                               "use it, and running without it would compute another model")
