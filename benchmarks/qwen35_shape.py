"""Qwen3.5's layers at speed beside llama.cpp's: a Qwen3.5-9B-shaped model
cut to fit (8 layers 2048 wide; in three of four, gated DeltaNet with 16
key heads serving 32 value heads of 128 and a 4-tap convolution; in the
fourth, gated attention of 8 heads of 256 over 2 KV heads, a quarter of
each head rotated; an MLP of 6144), random weights, run by ``ierun bench``
and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv iebin-to-gguf``
writes of it (benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/qwen35_shape.py --work /tmp/q35 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 8, 2048, 8, 2, 256, 6144
K_HEADS, V_HEADS, K_DIM, V_DIM, CONV = 16, 32, 128, 128, 4


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as Qwen3_5ForCausalLM names them (norms 1 + w: zeros)."""
    t = {}
    channels = 2 * K_HEADS * K_DIM + V_HEADS * V_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": np.zeros(HIDDEN, np.float32), p + "post_attention_layernorm.weight":
                  np.zeros(HIDDEN, np.float32), p + "mlp.gate_proj.weight": w.m(INTER, HIDDEN),
                  p + "mlp.up_proj.weight": w.m(INTER, HIDDEN), p + "mlp.down_proj.weight": w.m(HIDDEN, INTER)})
        if (i + 1) % 4:
            a = p + "linear_attn."
            t.update({a + "in_proj_qkv.weight": w.m(channels, HIDDEN), a + "in_proj_z.weight": w.m(V_HEADS * V_DIM, HIDDEN),
                      a + "in_proj_b.weight": w.m(V_HEADS, HIDDEN), a + "in_proj_a.weight": w.m(V_HEADS, HIDDEN),
                      a + "conv1d.weight": w.m(channels, 1, CONV) * 10, a + "dt_bias": w.ones(V_HEADS),
                      a + "A_log": np.log(np.linspace(1, 16, V_HEADS, dtype=np.float32)), a + "norm.weight": w.ones(V_DIM),
                      a + "out_proj.weight": w.m(HIDDEN, V_HEADS * V_DIM)})
        else:
            a = p + "self_attn."
            t.update({a + "q_proj.weight": w.m(2 * HEADS * HEAD_DIM, HIDDEN),
                      a + "k_proj.weight": w.m(KV_HEADS * HEAD_DIM, HIDDEN),
                      a + "v_proj.weight": w.m(KV_HEADS * HEAD_DIM, HIDDEN),
                      a + "o_proj.weight": w.m(HIDDEN, HEADS * HEAD_DIM),
                      a + "q_norm.weight": np.zeros(HEAD_DIM, np.float32), a + "k_norm.weight": np.zeros(HEAD_DIM, np.float32)})
    t["model.norm.weight"] = np.zeros(HIDDEN, np.float32)
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "max_position_embeddings": 16384, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "linear_num_key_heads": K_HEADS, "linear_num_value_heads": V_HEADS, "linear_key_head_dim": K_DIM,
        "linear_value_head_dim": V_DIM, "linear_conv_kernel_dim": CONV,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}})


if __name__ == "__main__":
    main(__doc__, checkpoint)
