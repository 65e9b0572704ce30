"""Llama 4's layer at speed beside llama.cpp's: a Scout-shaped model cut to
fit (8 layers 2048 wide, 16 heads of 128 over 4 KV heads, every 4th layer
unrotated and the others in chunks, q/k norms; 16 experts of 1024 channels,
the top one fed its router weight, beside a shared expert of 1024, in every
layer), random weights, run by ``ierun bench`` and by llama.cpp's
``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of it
(benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/llama4_shape.py --work /tmp/l4 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, INTER = 8, 2048, 16, 4, 128, 16, 1024


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors; the expert stacks as transformers stores them, [experts, in, out]."""
    t = {}
    for i in range(LAYERS):
        p, f = f"model.layers.{i}.", f"model.layers.{i}.feed_forward."
        t.update({p + "input_layernorm.weight": w.ones(HIDDEN), p + "post_attention_layernorm.weight": w.ones(HIDDEN),
                  p + "self_attn.q_proj.weight": w.m(HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.k_proj.weight": w.m(KV_HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.v_proj.weight": w.m(KV_HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.o_proj.weight": w.m(HIDDEN, HEADS * HEAD_DIM),
                  f + "router.weight": w.m(EXPERTS, HIDDEN), f + "experts.gate_up_proj": w.m(EXPERTS, HIDDEN, 2 * INTER),
                  f + "experts.down_proj": w.m(EXPERTS, INTER, HIDDEN),
                  f + "shared_expert.gate_proj.weight": w.m(INTER, HIDDEN),
                  f + "shared_expert.up_proj.weight": w.m(INTER, HIDDEN),
                  f + "shared_expert.down_proj.weight": w.m(HIDDEN, INTER)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "intermediate_size": INTER,
        "intermediate_size_mlp": 2 * INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "max_position_embeddings": 16384, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "num_local_experts": EXPERTS, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "use_qk_norm": True,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}})


if __name__ == "__main__":
    main(__doc__, checkpoint)
