"""dots.llm1's layers at speed beside llama.cpp's: its shape cut to fit (3 layers 4608 wide; 32 heads of 128 with as
many KV heads, per-head q/k norms; a dense first layer of 10944, then 6 of 16 experts of 1408, chosen within 1 group
by sigmoid score plus a choice bias, renormalised x 2.5, beside 2 shared ones: dots.llm1 has 128 experts, so its
expert reads per token are these, its memory 8 times), random weights, run by ``ierun bench`` and by llama.cpp's
``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of it (benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/dots1_shape.py --work /tmp/dots1 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, HEAD_DIM, INTER, LAYERS = 4608, 32, 128, 10944, 3
EXPERTS, TOP_K, EXPERT_INTER, SHARED = 16, 6, 1408, 2


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as Dots1ForCausalLM's checkpoints name them."""
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update(w.attention(p + "self_attn.", HIDDEN, HEADS, HEADS, HEAD_DIM))
        t.update({p + "self_attn.q_norm.weight": w.ones(HEAD_DIM), p + "self_attn.k_norm.weight": w.ones(HEAD_DIM),
                  p + "input_layernorm.weight": w.ones(HIDDEN), p + "post_attention_layernorm.weight": w.ones(HIDDEN)})
        mlp = [(p + "mlp.", INTER)] if i == 0 else \
            [(f"{p}mlp.experts.{e}.", EXPERT_INTER) for e in range(EXPERTS)] + \
            [(p + "mlp.shared_experts.", SHARED * EXPERT_INTER)]
        for pre, width in mlp:
            t.update({pre + "gate_proj.weight": w.m(width, HIDDEN), pre + "up_proj.weight": w.m(width, HIDDEN),
                      pre + "down_proj.weight": w.m(HIDDEN, width)})
        if i > 0:
            t.update({p + "mlp.gate.weight": w.m(EXPERTS, HIDDEN) * 50,
                      p + "mlp.gate.e_score_correction_bias": w.m(EXPERTS)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "first_k_dense_replace": 1, "n_routed_experts": EXPERTS, "num_experts_per_tok": TOP_K,
        "n_shared_experts": SHARED, "moe_intermediate_size": EXPERT_INTER, "routed_scaling_factor": 2.5,
        "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0}})


if __name__ == "__main__":
    main(__doc__, checkpoint)
