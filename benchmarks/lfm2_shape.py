"""LFM2's layers at speed beside llama.cpp's: an LFM2-1.2B-shaped model cut
to fit (8 layers 2048 wide, its pattern's first eight: short gated
convolutions of 3 taps in five, attention of 32 heads of 64 over 8 KV heads
with per-head q/k norms in three; an MLP of 8192), random weights, run by
``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv
iebin-to-gguf`` writes of it (benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/lfm2_shape.py --work /tmp/lfm2 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, INTER, TAPS = 2048, 32, 8, 8192, 3
# LFM2-1.2B's first eight layers (its full_attn_idxs: 2, 5, 8, 10, 12, 14 of 16)
TYPES = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv"]


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as Lfm2ForCausalLM names them."""
    t = {}
    head_dim = HIDDEN // HEADS
    for i, kind in enumerate(TYPES):
        p = f"model.layers.{i}."
        t.update({p + "operator_norm.weight": w.ones(HIDDEN), p + "ffn_norm.weight": w.ones(HIDDEN),
                  p + "feed_forward.w1.weight": w.m(INTER, HIDDEN), p + "feed_forward.w3.weight": w.m(INTER, HIDDEN),
                  p + "feed_forward.w2.weight": w.m(HIDDEN, INTER)})
        if kind == "conv":
            t.update({p + "conv.in_proj.weight": w.m(3 * HIDDEN, HIDDEN), p + "conv.conv.weight": w.m(HIDDEN, 1, TAPS) * 10,
                      p + "conv.out_proj.weight": w.m(HIDDEN, HIDDEN)})
        else:
            a = p + "self_attn."
            t.update({a + "q_proj.weight": w.m(HEADS * head_dim, HIDDEN),
                      a + "k_proj.weight": w.m(KV_HEADS * head_dim, HIDDEN),
                      a + "v_proj.weight": w.m(KV_HEADS * head_dim, HIDDEN),
                      a + "out_proj.weight": w.m(HIDDEN, HEADS * head_dim),
                      a + "q_layernorm.weight": w.ones(head_dim), a + "k_layernorm.weight": w.ones(head_dim)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "intermediate_size": INTER,
        "block_auto_adjust_ff_dim": False, "num_hidden_layers": len(TYPES), "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "max_position_embeddings": 128000, "norm_eps": 1e-5, "conv_L_cache": TAPS,
        "conv_bias": False, "layer_types": TYPES, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        final_norm="model.embedding_norm.weight")


if __name__ == "__main__":
    main(__doc__, checkpoint)
