"""AFMoE's layers at speed beside llama.cpp's: a Trinity-Mini-like shape cut to fit (4 layers 2048 wide, the 4th
full and unrotated, the others sliding over 2048 positions; 16 heads of 128 over 4 KV heads with per-head q/k norms
and the gated output; a dense first layer of 6144, then 8 of 32 experts of 1024 chosen by sigmoid score plus a
choice bias beside a shared one), random weights, run by ``ierun bench`` and by llama.cpp's ``llama-bench`` on the
GGUF ``ieconv iebin-to-gguf`` writes of it (benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/afmoe_shape.py --work /tmp/afmoe [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 2048, 16, 4, 128, 6144, 4
EXPERTS, TOP_K, EXPERT_INTER, WINDOW = 32, 8, 1024, 2048


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as AfmoeForCausalLM's checkpoints name them."""
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update(w.attention(p + "self_attn.", HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
        t.update({p + "self_attn.gate_proj.weight": w.m(HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.q_norm.weight": w.ones(HEAD_DIM), p + "self_attn.k_norm.weight": w.ones(HEAD_DIM)})
        t.update({p + n + ".weight": w.ones(HIDDEN) for n in ("input_layernorm", "post_attention_layernorm",
                                                               "pre_mlp_layernorm", "post_mlp_layernorm")})
        mlp = [(p + "mlp.", INTER)] if i == 0 else \
            [(f"{p}mlp.experts.{e}.", EXPERT_INTER) for e in range(EXPERTS)] + [(p + "mlp.shared_experts.", EXPERT_INTER)]
        for pre, width in mlp:
            t.update({pre + "gate_proj.weight": w.m(width, HIDDEN), pre + "up_proj.weight": w.m(width, HIDDEN),
                      pre + "down_proj.weight": w.m(HIDDEN, width)})
        if i > 0:
            t.update({p + "mlp.router.gate.weight": w.m(EXPERTS, HIDDEN) * 50, p + "mlp.expert_bias": w.m(EXPERTS)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["AfmoeForCausalLM"], "model_type": "afmoe", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "num_dense_layers": 1, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K, "num_shared_experts": 1,
        "moe_intermediate_size": EXPERT_INTER, "route_scale": 2.826, "route_norm": True, "mup_enabled": True,
        "global_attn_every_n_layers": 4, "sliding_window": WINDOW,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})


if __name__ == "__main__":
    main(__doc__, checkpoint)
