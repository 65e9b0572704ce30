"""Latent attention's speed beside llama.cpp's: a DeepSeek-V2-Lite-shaped
attention (16 heads, a latent of 512, 64 rotary + 128 unrotated key dims,
128 value dims; q through a rank-768 pair, as GLM-4.7-Flash's, since
llama.cpp reads q_proj only at V2-Lite's depth) over 4 dense layers 2048
wide, random weights, run by ``ierun bench`` and by llama.cpp's
``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of it
(benchmarks/shape_bench.py).

    .venv/bin/python benchmarks/mla_shape.py --work /tmp/mla [--threads 2] [--scheme q4_0]

Both run the attention absorbed (queries taken into the latent's space, a
cache of 576 elements per position and layer); docs/benchmarks.md keeps
the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

LAYERS, HIDDEN, HEADS, Q_RANK, LATENT, ROPE, NOPE, VALUE, INTER = 4, 2048, 16, 768, 512, 64, 128, 128, 2048


def layers(w: Weights) -> dict[str, np.ndarray]:
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": w.ones(HIDDEN), p + "post_attention_layernorm.weight": w.ones(HIDDEN),
                  p + "self_attn.q_a_proj.weight": w.m(Q_RANK, HIDDEN),
                  p + "self_attn.q_a_layernorm.weight": w.ones(Q_RANK),
                  p + "self_attn.q_b_proj.weight": w.m(HEADS * (NOPE + ROPE), Q_RANK),
                  p + "self_attn.kv_a_proj_with_mqa.weight": w.m(LATENT + ROPE, HIDDEN),
                  p + "self_attn.kv_a_layernorm.weight": w.ones(LATENT),
                  p + "self_attn.kv_b_proj.weight": w.m(HEADS * (NOPE + VALUE), LATENT),
                  p + "self_attn.o_proj.weight": w.m(HIDDEN, HEADS * VALUE),
                  p + "mlp.gate_proj.weight": w.m(INTER, HIDDEN), p + "mlp.up_proj.weight": w.m(INTER, HIDDEN),
                  p + "mlp.down_proj.weight": w.m(HIDDEN, INTER)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "q_lora_rank": Q_RANK, "kv_lora_rank": LATENT, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE,
        "v_head_dim": VALUE, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
        "n_shared_experts": 1, "first_k_dense_replace": LAYERS, "norm_topk_prob": False, "topk_method": "greedy",
        "scoring_func": "softmax"})


if __name__ == "__main__":
    main(__doc__, checkpoint)
