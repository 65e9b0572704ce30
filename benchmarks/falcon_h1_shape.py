"""Falcon-H1 at speed beside llama.cpp's: Falcon-H1-7B's layer cut to fit (4 layers 3072 wide, each Mamba2 of 24
heads of 128 with states of 256 in 1 group and 4 taps beside attention of 12 heads of 128 over 2 KV heads, their
outputs summed, then a SwiGLU MLP 12288 wide), its muP multipliers as Falcon-H1-0.5B's config states them, random
weights, run by ``ierun bench`` (which runs the multipliers) and by llama.cpp's ``llama-bench`` on the GGUF
``ieconv iebin-to-gguf`` writes of it (the multipliers in its matrices, as llama.cpp's converter stores them;
benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/falcon_h1_shape.py --work /tmp/falcon-h1 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, LAYERS, INTER = 3072, 4, 12288
HEADS, KV_HEADS, HEAD_DIM = 12, 2, 128
SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS = 24, 128, 256, 1, 4
# Falcon-H1-0.5B's multipliers (its config.json)
MULTIPLIERS = {"embedding_multiplier": 5.656854249492381, "lm_head_multiplier": 0.0390625,
               "key_multiplier": 0.390625, "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375,
               "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.23570226039551587,
               "mlp_multipliers": [0.8838834764831844, 0.5859375],
               "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738]}


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as FalconH1ForCausalLM's checkpoints name them (no gated norm in Mamba2)."""
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = w.ones(HIDDEN)
        t[p + "pre_ff_layernorm.weight"] = w.ones(HIDDEN)
        t.update(w.attention(p + "self_attn.", HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
        mamba = w.mamba2(p + "mamba.", HIDDEN, SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS)
        del mamba[p + "mamba.norm.weight"]
        t.update(mamba)
        t.update({p + "feed_forward.gate_proj.weight": w.m(INTER, HIDDEN),
                  p + "feed_forward.up_proj.weight": w.m(INTER, HIDDEN),
                  p + "feed_forward.down_proj.weight": w.m(HIDDEN, INTER)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER,
        "mamba_d_ssm": SSM_HEADS * SSM_HEAD_DIM, "mamba_n_heads": SSM_HEADS, "mamba_d_head": SSM_HEAD_DIM,
        "mamba_d_state": STATE, "mamba_n_groups": GROUPS, "mamba_d_conv": TAPS, "mamba_expand": 2,
        "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_rms_norm": False, "mamba_norm_before_gate": False,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e11, "max_position_embeddings": 16384,
        **MULTIPLIERS}, final_norm="model.final_layernorm.weight")


if __name__ == "__main__":
    main(__doc__, checkpoint)
