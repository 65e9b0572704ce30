"""Granite 4's layers at speed beside llama.cpp's: a Granite-4.0-H-1B-shaped
model cut to fit (8 layers 1536 wide: Mamba2 in seven, 48 heads of 64 with
states of 128 in one group and 4 taps; attention without RoPE of 12 heads of
128 over 4 KV heads in the sixth; a shared MLP of 4096), random weights, run
by ``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv
iebin-to-gguf`` writes of it (benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/granite4_shape.py --work /tmp/granite4 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 1536, 12, 4, 128, 4096
SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS = 48, 64, 128, 1, 4
TYPES = ["mamba"] * 5 + ["attention"] + ["mamba"] * 2


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as GraniteMoeHybridForCausalLM's checkpoints name them."""
    t = {}
    for i, kind in enumerate(TYPES):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": w.ones(HIDDEN), p + "post_attention_layernorm.weight": w.ones(HIDDEN),
                  p + "shared_mlp.input_linear.weight": w.m(2 * INTER, HIDDEN),
                  p + "shared_mlp.output_linear.weight": w.m(HIDDEN, INTER)})
        if kind == "mamba":
            t.update(w.mamba2(p + "mamba.", HIDDEN, SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS))
        else:
            t.update(w.attention(p + "self_attn.", HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "intermediate_size": INTER, "shared_intermediate_size": INTER, "num_local_experts": 0,
        "num_hidden_layers": len(TYPES), "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "layer_types": TYPES,
        "position_embedding_type": "nope", "mamba_n_heads": SSM_HEADS, "mamba_d_head": SSM_HEAD_DIM,
        "mamba_d_state": STATE, "mamba_n_groups": GROUPS, "mamba_d_conv": TAPS, "mamba_expand": 2,
        "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
        "logits_scaling": 6.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})


if __name__ == "__main__":
    main(__doc__, checkpoint)
