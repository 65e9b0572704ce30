"""Nemotron-H's blocks at speed beside llama.cpp's: Nemotron Nano 9B v2's block mix cut to fit (10 blocks 2048
wide, M-M-M*-M-: five Mamba2 blocks of 64 heads of 64 with states of 128 in 8 groups and 4 taps, four ReLU-squared
MLP blocks of 6144, one attention block without RoPE of 16 heads of 128 over 4 KV heads), random weights, run by
``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of it
(benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/nemotron_h_shape.py --work /tmp/nemotron [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 2048, 16, 4, 128, 6144
SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS = 64, 64, 128, 8, 4
PATTERN = "M-M-M*-M-"


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every block's tensors, as NemotronHForCausalLM's checkpoints name them."""
    t = {}
    for i, kind in enumerate(PATTERN):
        p = f"backbone.layers.{i}."
        m = p + "mixer."
        t[p + "norm.weight"] = w.ones(HIDDEN)
        if kind == "M":
            t.update(w.mamba2(m, HIDDEN, SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS))
        elif kind == "-":
            t.update({m + "up_proj.weight": w.m(INTER, HIDDEN), m + "down_proj.weight": w.m(HIDDEN, INTER)})
        else:
            t.update(w.attention(m, HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "intermediate_size": INTER,
        "num_hidden_layers": len(PATTERN), "hybrid_override_pattern": PATTERN, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "max_position_embeddings": 131072,
        "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2", "mamba_num_heads": SSM_HEADS,
        "mamba_head_dim": SSM_HEAD_DIM, "ssm_state_size": STATE, "n_groups": GROUPS, "conv_kernel": TAPS,
        "use_conv_bias": True, "use_bias": False, "mlp_bias": False, "attention_bias": False},
        embed="backbone.embeddings.weight", final_norm="backbone.norm_f.weight")


if __name__ == "__main__":
    main(__doc__, checkpoint)
