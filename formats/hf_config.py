"""The model description in a Hugging Face ``config.json``, under one spelling.

HF configs name the same quantity differently per architecture
(``hidden_size``/``n_embd``/``d_model``, ...); ``model_summary`` maps them to
the fields of IEBIN's ``model`` object (formats/iebin.py MODEL_FIELDS), which
is what the runtime reads.
"""

from __future__ import annotations

from typing import Any

from .errors import FormatError


def _is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass and must not pass


# Normalised name -> config.json spellings, first present wins. Encoders and
# GPT-2 style configs use other names; absent fields are recorded as null.
SUMMARY_ALIASES: dict[str, tuple[str, ...]] = {
    "model_type": ("model_type",),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "rope_theta": ("rope_theta",),
    "rope_scaling": ("rope_scaling",),
    "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon"),
    "hidden_act": ("hidden_act", "activation_function", "hidden_activation", "mlp_hidden_act"),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "torch_dtype": ("torch_dtype", "dtype"),
    "bos_token_id": ("bos_token_id",),
    "eos_token_id": ("eos_token_id",),
}


# The config classes whose head_dim defaults to a constant, not hidden_size / num_attention_heads (transformers
# 5.23's), by architecture: what a config.json that states none means.
HEAD_DIM_DEFAULTS = {"Qwen3ForCausalLM": 128, "MiniMaxM2ForCausalLM": 128, "GptOssForCausalLM": 64,
                     "GemmaForCausalLM": 256, "Gemma2ForCausalLM": 256, "Gemma3ForCausalLM": 256,
                     "Ministral3ForCausalLM": 128,
                     "SeedOssForCausalLM": 128, "Glm4ForCausalLM": 128, "Ernie4_5ForCausalLM": 128,
                     "Llama4ForCausalLM": 128, "NemotronHForCausalLM": 128}

# The config classes that scale RoPE where a config.json states neither rope_scaling nor rope_parameters
# (transformers 5.23's __post_init__ defaults), by architecture.
ROPE_SCALING_DEFAULTS = {"ApertusForCausalLM": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


def model_summary(config: dict[str, Any]) -> dict[str, Any]:
    """The fields a runtime needs, under one spelling, from an HF config."""
    out: dict[str, Any] = {}
    archs = config.get("architectures")
    out["architecture"] = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    for key, names in SUMMARY_ALIASES.items():
        out[key] = next((config[n] for n in names if n in config), None)
    # transformers 5 moved rope_theta and the scaling into rope_parameters.
    rp = config.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("full_attention"), dict):
        rp = rp["full_attention"]  # per layer type (Gemma 3): the full layers' is the model's
    if isinstance(rp, dict):
        if out["rope_theta"] is None:
            out["rope_theta"] = rp.get("rope_theta")
        if out["rope_scaling"] is None and rp.get("rope_type", "default") != "default":
            out["rope_scaling"] = rp
    if (config.get("rope_scaling") is None and config.get("rope_parameters") is None
            and out["architecture"] in ROPE_SCALING_DEFAULTS):
        out["rope_scaling"] = dict(ROPE_SCALING_DEFAULTS[out["architecture"]])
    if out["num_hidden_layers"] is None:  # (NemotronHConfig counts its blocks: transformers 5 saves no count)
        blocks = next((config[k] for k in ("layers_block_type", "hybrid_override_pattern")
                       if isinstance(config.get(k), (list, str))), None)
        out["num_hidden_layers"] = None if blocks is None else len(blocks)
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    if out["num_key_value_heads"] is None and _is_int(heads):
        out["num_key_value_heads"] = heads
    if out["head_dim"] is None and out["architecture"] in HEAD_DIM_DEFAULTS:
        out["head_dim"] = HEAD_DIM_DEFAULTS[out["architecture"]]
    elif out["head_dim"] is None and _is_int(heads) and _is_int(hidden) and heads > 0:
        out["head_dim"] = hidden // heads
    return out


def check_summary(meta: dict[str, Any], meta_file: str) -> None:
    """An IEBIN ``model`` object must be ``model_summary(config)``: the
    runtime reads the first, the second is the model, so a value that
    differs was edited in one place and is refused, not run as another
    model (an edited rope_theta or norm_eps changes every logit)."""
    m, cfg = meta.get("model"), meta.get("config")
    if not isinstance(m, dict) or not isinstance(cfg, dict):
        return  # the schema names the missing or mistyped object
    for key, v in model_summary(cfg).items():
        if key in m and m[key] != v:
            raise FormatError(meta_file, f"model.{key}", f"{m[key]!r} disagrees with the stored config ({v!r}); "
                              "one of them was edited (convert the model again)")
