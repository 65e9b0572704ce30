"""A multimodal checkpoint's language model as a checkpoint of its own
(``ieconv text-model``).

Gemma 3 4B, 12B and 27B are published as ``Gemma3ForConditionalGeneration``:
a SigLIP vision tower and a projector beside a Gemma 3 text model, which is
all a text prompt runs through (llama.cpp's converter likewise writes the
text model as one GGUF and the vision part as another, ``mmproj``).
Mistral Small 3.1 / 3.2, Magistral Small, Ministral 3 and Devstral Small 2
are likewise ``Mistral3ForConditionalGeneration``: a Pixtral tower beside a
Mistral (``text_config.model_type`` mistral), Ministral 3 (ministral3) or,
for Mistral Small 4, Mistral 4 (mistral4) text model. Llama 4 Scout and Maverick are ``Llama4ForConditionalGeneration``:
a vision model beside a Llama 4 text model; Qwen3.5 is
``Qwen3_5ForConditionalGeneration`` (its mixtures of experts
``Qwen3_5MoeForConditionalGeneration``); Qwen3-VL 2B to 32B
``Qwen3VLForConditionalGeneration``, whose language model is Qwen3's under
interleaved MRoPE (text positions turn it as one RoPE, so the text model is a
``Qwen3ForCausalLM`` without the MRoPE keys), and Qwen3-VL-30B-A3B and
235B-A22B ``Qwen3VLMoeForConditionalGeneration``, a ``Qwen3MoeForCausalLM``
whose experts the Hub stores as [experts, in, out] stacks (``EXPERT_STACKS``;
transformers 5's save_pretrained writes its own [experts, out, in], read too:
written as the matrix per expert the text class holds, one expert read at a
time); GLM-4.1V and GLM-4.6V-Flash ``Glm4vForConditionalGeneration``, a
``Glm4ForCausalLM`` under MRoPE, told what its text model's code fixes
(``_glm4v_text``); GLM-4.5V and GLM-4.6V
``Glm4vMoeForConditionalGeneration``, a ``Glm4MoeForCausalLM`` without q/k
norms under MRoPE; Qwen2.5-VL and Qwen2-VL
``Qwen2_5_VLForConditionalGeneration`` and ``Qwen2VLForConditionalGeneration``, a ``Qwen2ForCausalLM`` under
MRoPE, stored under the Hub's names (``model.*`` beside ``visual.*``, as transformers 5 saves them too) with, on the
Hub, a flat config (the text model's keys at the top level, MRoPE as ``rope_scaling`` type ``mrope``); LFM2-VL ``Lfm2VlForConditionalGeneration``, an
``Lfm2ForCausalLM`` beside a SigLIP2 tower. This writes that text model as
the ``Gemma3ForCausalLM`` / ``MistralForCausalLM`` / ``Ministral3ForCausalLM``
/ ``Mistral4ForCausalLM`` / ``Llama4ForCausalLM`` / ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` /
``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` / ``Glm4ForCausalLM`` /
``Glm4MoeForCausalLM`` / ``Lfm2ForCausalLM`` checkpoint
transformers would build from it: its tensors renamed from either layout
(``language_model.model.*`` as the Hub's files hold them,
``model.language_model.*`` as transformers 5 saves them) and copied byte for
byte, the vision tower's and projector's left out because the user asked
for the text model, and ``text_config`` as a config of its own. The Hub's
``text_config`` holds only what differs from transformers' defaults, so
those defaults are filled in (``GEMMA3_TEXT_DEFAULTS``, transformers 5.23's
Gemma3TextConfig; golden/ref/gemma3-text-defaults.json is transformers'
own, and the tests hold the table to it; a Mistral 3's text_config missing
a key takes its text class's defaults likewise, as transformers does).
Every other tool then reads the result as any checkpoint of that class.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from iekit.formats.errors import IEError
from iekit.formats import hf_fp8
from iekit.formats.expert_stacks import RAW
from iekit.formats.hf_checkpoint import HFSource, SINGLE_NAME, collect_tensors, read_aux
from iekit.formats.hf_config import model_summary
from iekit.formats.safetensors_writer import SafetensorsWriter

from .artifact_out import CONFIG_FILES, TOKENIZER_FILES, ConvertResult, Progress, checkpoint_out, natural_key

# transformers 5.23's Gemma3TextConfig defaults that shape the computation, filled in where a
# multimodal config's text_config leaves them out (the RoPE and window keys in the Hub's spelling)
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1,
    "bos_token_id": 2, "tie_word_embeddings": True, "attention_bias": False, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}
# only where the config has no rope_parameters (transformers 5) / layer_types of its own
GEMMA3_ROPE_DEFAULTS = {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
GEMMA3_PATTERN_DEFAULT = {"sliding_window_pattern": 6}
# transformers 5.23's MistralConfig and Ministral3Config defaults (golden/ref/mistral3-text-defaults.json):
# what a Mistral3ForConditionalGeneration's text_config of that model_type takes where it leaves a key out
# (a text_config without model_type is a MistralConfig, as transformers reads it)
_MISTRAL_COMMON = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu"}
MISTRAL_TEXT_DEFAULTS: dict[str, Any] = {
    **_MISTRAL_COMMON, "vocab_size": 32000, "num_hidden_layers": 32, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "sliding_window": 4096}
MISTRAL_ROPE_DEFAULTS = {"rope_theta": 10000.0}
MINISTRAL3_TEXT_DEFAULTS: dict[str, Any] = {
    **_MISTRAL_COMMON, "vocab_size": 131072, "num_hidden_layers": 34, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5, "sliding_window": None}
MINISTRAL3_ROPE_DEFAULTS = {"rope_parameters": {
    "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}}
# transformers 5.23's Mistral4Config defaults that shape the computation (golden/ref/mistral4-text-defaults.json): what
# Mistral Small 4's text_config (model_type mistral4) takes where it leaves a key out; its RoPE's
# partial_rotary_factor is derived from the q/k dims, as Mistral4Config derives it
MISTRAL4_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
    "n_routed_experts": 128, "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 4, "first_k_dense_replace": 0, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "rope_interleave": True, "attention_bias": False}
MISTRAL4_ROPE_DEFAULTS = {"rope_parameters": {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}}
# transformers 5.23's Llama4TextConfig defaults that shape the computation (golden/ref/llama4-text-defaults.json;
# the per-layer lists it derives from them, no_rope_layers, moe_layers and layer_types, the decoder derives alike)
LLAMA4_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": False, "num_experts_per_tok": 1, "num_local_experts": 16, "interleave_moe_layer_step": 1,
    "use_qk_norm": True, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
    "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1}
LLAMA4_ROPE_DEFAULTS = {"rope_theta": 500000.0}
# transformers 5.23's Qwen3_5TextConfig defaults that shape the computation (golden/ref/qwen3-5-text-defaults.json;
# layer_types it derives from full_attention_interval, 4, as the decoder does)
QWEN3_5_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32}
QWEN3_5_ROPE_DEFAULTS = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25}}
# transformers 5.23's Qwen3_5MoeTextConfig defaults that shape the computation (golden/ref/qwen3-5-moe-text-defaults.json)
QWEN3_5_MOE_TEXT_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in QWEN3_5_TEXT_DEFAULTS.items() if k != "intermediate_size"}, "hidden_size": 2048,
    "num_hidden_layers": 40, "num_key_value_heads": 2, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}
# transformers 5.23's Qwen3VLTextConfig defaults that shape the computation (golden/ref/qwen3-vl-text-defaults.json)
QWEN3_VL_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "attention_bias": False}
QWEN3_VL_ROPE_DEFAULTS = {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}
# transformers 5.23's Qwen2_5_VLTextConfig defaults that shape the computation (golden/ref/qwen2-5-vl-text-defaults.json;
# Qwen2VLTextConfig's are the same)
QWEN2_5_VL_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 80}
QWEN2_5_VL_ROPE_DEFAULTS = {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}
# MRoPE's keys (Qwen3-VL's sections of the frequencies that turn by time, height and width): text positions are the
# same on all three, so they turn as one RoPE, and the text model has none of them
MROPE_KEYS = ("mrope_section", "mrope_interleaved")
# transformers 5.23's Qwen3VLMoeTextConfig defaults that shape the computation
# (golden/ref/qwen3-vl-moe-text-defaults.json; its head_dim: hidden_size / num_attention_heads)
QWEN3_VL_MOE_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "attention_bias": False, "num_local_experts": 60,
    "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "decoder_sparse_step": 1, "mlp_only_layers": []}
# Qwen3-VL-MoE's expert stacks (their suffixes in a layer) -> the per-expert matrices each holds, in its columns'
# order: gate_up_proj [experts, hidden, 2 inter] gate's columns then up's, down_proj [experts, inter, hidden]
EXPERT_STACKS = {"mlp.experts.gate_up_proj": ("gate_proj", "up_proj"), "mlp.experts.down_proj": ("down_proj",)}
# transformers 5.23's Glm4vTextConfig defaults that shape the computation (golden/ref/glm4-vl-text-defaults.json)
GLM4V_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5}
GLM4V_ROPE_DEFAULTS = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
# transformers 5.23's Glm4vMoeTextConfig defaults that shape the computation (golden/ref/glm4-vl-moe-text-defaults.json)
GLM4V_MOE_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151424, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5, "attention_bias": True, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "norm_topk_prob": True}
GLM4V_MOE_ROPE_DEFAULTS = {"rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                                               "rope_type": "default"}}


# transformers 5.23's Lfm2Config defaults that shape the computation (golden/ref/lfm2-vl-text-defaults.json)
LFM2_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000, "norm_eps": 1e-5,
    "conv_bias": False, "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True}
LFM2_ROPE_DEFAULTS = {"rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"}}


def _always_renormalised(_cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-VL-MoE's router renormalises its top k always; Qwen3MoeConfig's norm_topk_prob says so."""
    return {"norm_topk_prob": True}


def _glm4v_text(cfg: dict[str, Any]) -> dict[str, Any]:
    """What Glm4vTextModel's code fixes that Glm4ForCausalLM reads from its config: heads hidden_size /
    num_attention_heads wide, q/k/v biases, RoPE over the whole head where rope_parameters gives no
    partial_rotary_factor (Glm4's own default is half)."""
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    out = {"attention_bias": True, "rope_parameters": {"partial_rotary_factor": 1.0, **rope}}
    if type(hidden) is int and type(heads) is int and heads > 0:
        out["head_dim"] = hidden // heads
    return out


def _no_qk_norm(_cfg: dict[str, Any]) -> dict[str, Any]:
    """Glm4vMoeTextAttention has no q/k norms, where Glm4MoeConfig's use_qk_norm may ask for them (GLM-4.5's)."""
    return {"use_qk_norm": False}


# the keys that state a model's RoPE, one spelling or the other: defaults fill in none beside them
_ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")


@dataclass(frozen=True)
class TextPart:
    """Where a multimodal architecture keeps its language model."""

    text_class: str
    model_type: str
    renames: tuple[tuple[str, str], ...]  # source prefix -> the text model's, first match wins
    left_out: tuple[str, ...]             # prefixes of the other modalities' tensors
    defaults: dict[str, Any]
    # defaults filled in only where text_config has none of the keys that would say otherwise
    defaults_unless: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = ()
    # where the text model's tie_word_embeddings comes from: "text", text_config's; "head", tied where the
    # checkpoint stores no head (Mistral 3: transformers ties the composite model by its top-level key, tied unless
    # it says otherwise, and leaves a stored head with other values untied); "top", the top-level key, untied
    # unless it says otherwise (Qwen3-VL, GLM-4V). Where the top level says untied, a head must be stored.
    tie: str = "text"
    # the text model turns text positions by one RoPE where the multimodal one has MRoPE (MROPE_KEYS left out)
    plain_rope: bool = False
    source_type: str = ""  # text_config.model_type where it is not the text model's (Qwen3-VL's qwen3_vl_text)
    # the experts of each layer stored as two [experts, in, out] stacks (EXPERT_STACKS: Qwen3-VL-MoE's), written as
    # the text model holds them, a matrix [out, in] per expert under Qwen3-MoE's names
    expert_stacks: bool = False
    # what the text class must be told that the multimodal text model's code fixes, from the merged config
    derived: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # the Hub's configs hold the text model's keys at the top level beside vision_config (Qwen2-VL's, Qwen2.5-VL's:
    # transformers builds text_config from them), their MRoPE as rope_scaling type "mrope"
    flat: bool = False

    @property
    def read_as(self) -> str:
        return self.source_type or self.model_type


# Both architectures' layouts: the Hub's (language_model.model.*) and transformers 5's in memory
_RENAMES = (("language_model.model.", "model."), ("model.language_model.", "model."),
            ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))
_TOWERS = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "model.multi_modal_projector.")
# multimodal architecture -> its text models, by text_config.model_type (the first where it has none)
MULTIMODAL = {
    "Gemma3ForConditionalGeneration": (TextPart(
        "Gemma3ForCausalLM", "gemma3_text", renames=_RENAMES, left_out=_TOWERS, defaults=GEMMA3_TEXT_DEFAULTS,
        defaults_unless=((("rope_parameters",), GEMMA3_ROPE_DEFAULTS), (("layer_types",), GEMMA3_PATTERN_DEFAULT))),),
    "Mistral3ForConditionalGeneration": (
        TextPart("MistralForCausalLM", "mistral", renames=_RENAMES, left_out=_TOWERS, defaults=MISTRAL_TEXT_DEFAULTS,
                 defaults_unless=((_ROPE_KEYS, MISTRAL_ROPE_DEFAULTS),), tie="head"),
        TextPart("Ministral3ForCausalLM", "ministral3", renames=_RENAMES, left_out=_TOWERS,
                 defaults=MINISTRAL3_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, MINISTRAL3_ROPE_DEFAULTS),),
                 tie="head"),
        # (Mistral Small 4: its experts' stacks kept as stacks, the text class's own layout)
        TextPart("Mistral4ForCausalLM", "mistral4", renames=_RENAMES, left_out=_TOWERS,
                 defaults=MISTRAL4_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, MISTRAL4_ROPE_DEFAULTS),),
                 tie="head")),
    # (its language model a Llama4ForCausalLM of its own, head included: language_model.lm_head)
    "Llama4ForConditionalGeneration": (TextPart(
        "Llama4ForCausalLM", "llama4_text", renames=_RENAMES,
        left_out=("vision_model.", "model.vision_model.", "multi_modal_projector.", "model.multi_modal_projector."),
        defaults=LLAMA4_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, LLAMA4_ROPE_DEFAULTS),)),),
    # (its multi-token prediction tensors, mtp.*, kept beside the text model: Qwen3_5ForCausalLM leaves them unread)
    "Qwen3_5ForConditionalGeneration": (TextPart(
        "Qwen3_5ForCausalLM", "qwen3_5_text", renames=(*_RENAMES, ("mtp.", "mtp.")), left_out=("model.visual.",),
        defaults=QWEN3_5_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, QWEN3_5_ROPE_DEFAULTS),)),),
    # (Qwen3-VL 2B to 32B: Qwen3's layers under MRoPE, its deepstack only adding image features)
    "Qwen3VLForConditionalGeneration": (TextPart(
        "Qwen3ForCausalLM", "qwen3", renames=_RENAMES, left_out=("model.visual.",), defaults=QWEN3_VL_TEXT_DEFAULTS,
        defaults_unless=((_ROPE_KEYS, QWEN3_VL_ROPE_DEFAULTS),), plain_rope=True, source_type="qwen3_vl_text",
        tie="top"),),
    # (Qwen3-VL-30B-A3B, 235B-A22B: Qwen3-MoE's layers, its router always renormalising the top k)
    "Qwen3VLMoeForConditionalGeneration": (TextPart(
        "Qwen3MoeForCausalLM", "qwen3_moe", renames=_RENAMES, left_out=("model.visual.",),
        defaults=QWEN3_VL_MOE_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, QWEN3_VL_ROPE_DEFAULTS),), plain_rope=True,
        source_type="qwen3_vl_moe_text", expert_stacks=True, derived=_always_renormalised, tie="top"),),
    # (GLM-4.1V, GLM-4.6V-Flash: GLM-4's layers under MRoPE over GLM's interleaved pairs)
    "Glm4vForConditionalGeneration": (TextPart(
        "Glm4ForCausalLM", "glm4", renames=_RENAMES, left_out=("model.visual.",), defaults=GLM4V_TEXT_DEFAULTS,
        defaults_unless=((_ROPE_KEYS, GLM4V_ROPE_DEFAULTS),), plain_rope=True, source_type="glm4v_text",
        derived=_glm4v_text, tie="top"),),
    # (GLM-4.5V, GLM-4.6V: GLM-4.5-Air's layers without q/k norms under MRoPE over rotate-half pairs, so the
    # text model's rows are as they are)
    "Glm4vMoeForConditionalGeneration": (TextPart(
        "Glm4MoeForCausalLM", "glm4_moe", renames=_RENAMES, left_out=("model.visual.",),
        defaults=GLM4V_MOE_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, GLM4V_MOE_ROPE_DEFAULTS),), plain_rope=True,
        source_type="glm4v_moe_text", derived=_no_qk_norm, tie="top"),),
    # (LFM2-VL 450M, 1.6B, 3B: LFM2's layers beside a SigLIP2 tower; tied, as transformers ties the composite model
    # where the checkpoint stores no head)
    "Lfm2VlForConditionalGeneration": (TextPart(
        "Lfm2ForCausalLM", "lfm2", renames=_RENAMES, left_out=("model.vision_tower.", "model.multi_modal_projector.",
                                                              "vision_tower.", "multi_modal_projector."),
        defaults=LFM2_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, LFM2_ROPE_DEFAULTS),), tie="head"),),
    # (Qwen2-VL, Qwen2.5-VL: Qwen2's layers under MRoPE over rotate-half pairs; the Hub's layout, model.* beside
    # visual.*, which transformers 5 saves too, or model.language_model.* beside model.visual.*)
    "Qwen2_5_VLForConditionalGeneration": (TextPart(
        "Qwen2ForCausalLM", "qwen2", renames=(*_RENAMES, ("model.", "model.")), left_out=("visual.", "model.visual."),
        defaults=QWEN2_5_VL_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, QWEN2_5_VL_ROPE_DEFAULTS),), plain_rope=True,
        source_type="qwen2_5_vl_text", tie="top", flat=True),),
    "Qwen2VLForConditionalGeneration": (TextPart(
        "Qwen2ForCausalLM", "qwen2", renames=(*_RENAMES, ("model.", "model.")), left_out=("visual.", "model.visual."),
        defaults=QWEN2_5_VL_TEXT_DEFAULTS, defaults_unless=((_ROPE_KEYS, QWEN2_5_VL_ROPE_DEFAULTS),), plain_rope=True,
        source_type="qwen2_vl_text", tie="top", flat=True),),
    "Qwen3_5MoeForConditionalGeneration": (TextPart(
        "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", renames=(*_RENAMES, ("mtp.", "mtp.")),
        left_out=("model.visual.",), defaults=QWEN3_5_MOE_TEXT_DEFAULTS,
        defaults_unless=((_ROPE_KEYS, QWEN3_5_ROPE_DEFAULTS),)),),
}


# A flat config's keys that are the composite model's, not its text model's (TextPart.flat; vision_* besides)
FLAT_NOT_TEXT = ("architectures", "model_type", "image_token_id", "video_token_id", "transformers_version",
                 "_name_or_path")


def text_part(config: dict[str, Any], arch: str, where: str) -> TextPart:
    """The text model of ``arch`` this config's text_config describes (by its model_type)."""
    parts = MULTIMODAL[arch]
    text = config.get("text_config")
    kind = text.get("model_type", parts[0].read_as) if isinstance(text, dict) else parts[0].read_as
    part = next((p for p in parts if p.read_as == kind), None)
    if part is None:
        raise IEError(f"{where}: text_config.model_type: {kind!r} is not a text model of {arch} this extracts "
                      f"({', '.join(p.read_as for p in parts)})")
    return part


def text_config(config: dict[str, Any], part: TextPart, where: str) -> dict[str, Any]:
    """The text model's config.json: ``text_config`` over the defaults, the
    top level's ids where it states them (its eos_token_id list is where
    generation stops: Gemma 3's <end_of_turn> besides <eos>)."""
    text = config.get("text_config")
    if text is None and part.flat:  # (the top level's keys, but the vision model's and the composite's own)
        text = {k: v for k, v in config.items() if k not in FLAT_NOT_TEXT and not k.startswith("vision_")}
    if not isinstance(text, dict):
        raise IEError(f"{where}: text_config: expected an object, got {text!r}")
    out = {**part.defaults, **text}
    for keys, defaults in part.defaults_unless:
        if not any(k in text for k in keys):
            out = {**defaults, **out}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"):
        if config.get(key) is not None:
            out[key] = config[key]
    if part.plain_rope:
        if isinstance(out.get("rope_parameters"), dict):
            out["rope_parameters"] = {k: v for k, v in out["rope_parameters"].items() if k not in MROPE_KEYS}
        scaling = out.get("rope_scaling")  # (the Hub's Qwen2-VL and Qwen2.5-VL configs: {"type": "mrope", ...})
        if isinstance(scaling, dict) and "mrope" in (scaling.get("type"), scaling.get("rope_type")):
            del out["rope_scaling"]
    if part.derived is not None:
        out.update(part.derived(out))
    out.update(architectures=[part.text_class], model_type=part.model_type)
    return out


def _renamed(name: str, part: TextPart) -> str | None:
    if name.startswith(part.left_out):
        return None
    for src, dst in part.renames:
        if name.startswith(src):
            return dst + name[len(src):]
    return ""  # neither the text model's nor a known other modality's


def extract_text_model(src: HFSource, out_dir: str | os.PathLike, *, overwrite: bool = False,
                       progress: Progress | None = None) -> ConvertResult:
    """Write ``src``'s language model into ``out_dir`` (module docstring):
    model.safetensors, config.json and the source's generation and
    tokenizer files, staged and renamed together. A tensor that is neither
    the text model's nor a known other modality's is refused, naming it."""
    progress = progress or Progress()
    where = str(src.dir / "config.json")
    arch = model_summary(src.config)["architecture"]
    if arch not in MULTIMODAL:
        raise IEError(f"{where}: architectures: {arch!r} is not a multimodal model this extracts the text model "
                      f"of ({', '.join(MULTIMODAL)})")
    part = text_part(src.config, arch, where)
    config = text_config(src.config, part, where)
    aux = {n: d for n in CONFIG_FILES + TOKENIZER_FILES if n != "config.json" and (d := read_aux(src, n)) is not None}
    out = checkpoint_out(out_dir, overwrite, ["config.json", *aux], src.dir)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        tensors = collect_tensors(src, stack)
        kept: dict[str, str] = {}  # text model's name -> source name
        for name in tensors:
            new = _renamed(name, part)
            if new == "":
                raise IEError(f"{tensors[name][0].path}: {name}: neither {arch}'s language model nor its vision "
                              "tower or projector; refusing rather than dropping it")
            if new is not None:
                if new in kept:
                    raise IEError(f"{tensors[name][0].path}: {name}: a second tensor for {new} ({kept[new]})")
                kept[new] = name
        experts = _split_stacks(part, kept, tensors, config, where)  # per-expert name -> its slice of a stack
        if part.tie != "text":
            said = src.config.get("tie_word_embeddings", part.tie == "head")
            if said is False and "lm_head.weight" not in kept:
                raise IEError(f"{where}: tie_word_embeddings: false, and the checkpoint stores no lm_head.weight "
                              "(transformers would run an untrained head)")
            config["tie_word_embeddings"] = "lm_head.weight" not in kept if part.tie == "head" else said
        sources = {*kept.values(), *(x.stack for x in experts.values())}
        bytes_in = sum(tensors[n][1].nbytes for n in sources)
        progress.start("extracting", bytes_in)
        meta = {"format": "pt", "iekit.source": json.dumps({"text_model_of": arch})}
        with out.writing() as staged:
            # (an FP8 checkpoint's weights, dequantized: in its own dtype, as hf-to-iebin writes them)
            fp8 = hf_fp8.default_dtype(src.config)
            specs = {n: (fp8 if isinstance(tensors[s][0], hf_fp8.Fp8Matrix) else tensors[s][1].dtype.name,
                         list(tensors[s][1].shape)) for n, s in kept.items()}
            specs.update({n: (tensors[x.stack][1].dtype.name, x.shape) for n, x in experts.items()})
            order = sorted(specs, key=natural_key)
            writer = SafetensorsWriter(staged.open(SINGLE_NAME), [(n, *specs[n]) for n in order], meta)
            for n in order:
                progress.describe(n)
                if n in experts:
                    writer.write(n, [_expert_matrix(tensors, experts[n])])
                    continue
                sf, t = tensors[kept[n]]
                if isinstance(sf, hf_fp8.Fp8Matrix):
                    writer.copy(n, lambda fd, off, sf=sf, n=n: sf.write_as(specs[n][0], fd, off, progress.advance))
                else:
                    writer.copy(n, lambda fd, off, sf=sf, t=t: sf.copy_to(t, fd, off, progress.advance))
            progress.advance(sum(tensors[n][1].nbytes for n in {x.stack for x in experts.values()}))
            writer.finish()
            staged.write_bytes("config.json", (json.dumps(config, indent=2) + "\n").encode())
            for n, d in aux.items():
                staged.write_bytes(n, d)
    return ConvertResult(out.dir, len(order), bytes_in, (out.dir / SINGLE_NAME).stat().st_size,
                         time.perf_counter() - t0, 0, removed=out.stale)


def _stack_suffix(name: str) -> str:
    """The EXPERT_STACKS key a stack's source name ends with."""
    return next(k for k in EXPERT_STACKS if name.endswith("." + k))


@dataclass(frozen=True)
class _Expert:
    """One expert's matrix of a stack (TextPart.expert_stacks): its ``k``-th of the stack's EXPERT_STACKS parts."""

    stack: str          # the stack's source name
    e: int
    k: int
    shape: list[int]    # [out, in]
    transposed: bool    # stored [experts, in, parts x out] (the Hub's), else [experts, parts x out, in]


def _split_stacks(part: TextPart, kept: dict[str, str], tensors: dict, config: dict[str, Any],
                  where: str) -> dict[str, _Expert]:
    """Take a TextPart.expert_stacks model's stacks out of ``kept`` (text name -> source name): each expert's
    matrices under Qwen3-MoE's names (model.layers.N.mlp.experts.E.gate_proj.weight ...). A stack is either the
    Hub's [experts, in, parts x out] (gate_up_proj [experts, hidden, 2 inter], down_proj [experts, inter, hidden])
    or transformers 5's own [experts, parts x out, in], which its save_pretrained writes; where both shapes are
    one (hidden = 2 inter), transformers' reading wins, its own. Any other shape is refused, naming the stack."""
    out: dict[str, _Expert] = {}
    if not part.expert_stacks:
        return out
    hidden, inter = config.get("hidden_size"), config.get("moe_intermediate_size")
    if type(hidden) is not int or type(inter) is not int or hidden < 1 or inter < 1:
        raise IEError(f"{where}: text_config.hidden_size, moe_intermediate_size: {hidden!r}, {inter!r}; expected "
                      "positive integers to read the expert stacks by")
    for name in [n for n in kept if n.endswith(tuple("." + k for k in EXPERT_STACKS))]:
        stack = kept.pop(name)
        sf, t = tensors[stack]
        parts = EXPERT_STACKS[_stack_suffix(name)]
        n_out, n_in = (inter, hidden) if len(parts) == 2 else (hidden, inter)
        shape = list(t.shape)
        own, hub = [shape[0], len(parts) * n_out, n_in], [shape[0], n_in, len(parts) * n_out]
        if isinstance(sf, hf_fp8.Fp8Matrix) or not t.dtype.is_float or shape not in (own, hub):
            raise IEError(f"{sf.path}: {stack}: {t.dtype.name} {shape}; expected a float stack {hub[1:]} or {own[1:]} "
                          "per expert (hidden_size, moe_intermediate_size)")
        pre = name[:-len(_stack_suffix(name))] + "mlp.experts."
        for e in range(shape[0]):
            for k, p in enumerate(parts):
                out[f"{pre}{e}.{p}.weight"] = _Expert(stack, e, k, [n_out, n_in], shape != own)
    return out


def _expert_matrix(tensors: dict, x: _Expert) -> bytes:
    """Expert ``x.e``'s ``x.k``-th matrix as [out, in]: its rows of the stack read (one expert's, bounded), the
    Hub's columns of it transposed."""
    sf, t = tensors[x.stack]
    n_out, n_in = x.shape
    if not x.transposed:
        first = (x.e * t.shape[1] + x.k * n_out)
        return sf.read_rows(t, range(first, first + n_out))
    cols = t.shape[2]
    raw = np.frombuffer(sf.read_rows(t, range(x.e * n_in, (x.e + 1) * n_in)), RAW[t.dtype.itemsize]).reshape(n_in, cols)
    return np.ascontiguousarray(raw[:, x.k * n_out:(x.k + 1) * n_out].T).tobytes()
