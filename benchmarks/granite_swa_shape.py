"""Granite SWA's layers at speed beside llama.cpp's: a Granite SWASH 2B-like shape cut to fit (4 layers 2560 wide,
20 heads of 128 over 4 KV heads with a learned sink each, the first layer full and the others sliding over 128
positions, a SwiGLU MLP of 8192, Granite's multipliers), random weights, run by ``ierun bench`` and by llama.cpp's
``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of it (benchmarks/shape_bench.py): at depth 4096 the
sliding layers read 128 positions of the cache, the full one all of them.

    .venv/bin/python benchmarks/granite_swa_shape.py --work /tmp/granite-swa [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, WINDOW = 2560, 20, 4, 128, 8192, 4, 128


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as GraniteSWAForCausalLM's checkpoints name them."""
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update(w.attention(p + "self_attn.", HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
        t.update({p + "self_attn.sinks": w.m(HEADS), p + "input_layernorm.weight": w.ones(HIDDEN),
                  p + "post_attention_layernorm.weight": w.ones(HIDDEN),
                  p + "mlp.gate_proj.weight": w.m(INTER, HIDDEN), p + "mlp.up_proj.weight": w.m(INTER, HIDDEN),
                  p + "mlp.down_proj.weight": w.m(HIDDEN, INTER)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["GraniteSWAForCausalLM"], "model_type": "granite_swa", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
        "logits_scaling": 10.0, "sliding_window": WINDOW,
        "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(LAYERS)],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0}, "tie_word_embeddings": False})


if __name__ == "__main__":
    main(__doc__, checkpoint)
