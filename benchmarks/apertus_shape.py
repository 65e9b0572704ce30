"""Apertus's layer at speed beside llama.cpp's: Apertus 8B's shape cut to fit (3 layers 4096 wide, 32 heads of 128
over 8 KV heads with per-head q/k norms, an MLP of 21504 without a gate, xIELU with each layer's own parameters,
Llama-3 scaling), random weights, run by ``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv
iebin-to-gguf`` writes of it (benchmarks/shape_bench.py). At q4_0 its three layers read 360 MB per token, 11 times
a 32 MiB last-level cache.

    .venv/bin/python benchmarks/apertus_shape.py --work /tmp/apertus [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 4096, 32, 8, 128, 21504, 3
# Apertus 8B's trained xIELU parameters are of this size (raw, before softplus; beta 0.5, eps -1e-6 as the Hub's)
XIELU = {"alpha_p": 0.8, "alpha_n": 0.2, "beta": 0.5, "eps": -1e-6}


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as ApertusForCausalLM's checkpoints name them."""
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update(w.attention(p + "self_attn.", HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
        t.update({p + "self_attn.q_norm.weight": w.ones(HEAD_DIM), p + "self_attn.k_norm.weight": w.ones(HEAD_DIM),
                  p + "mlp.up_proj.weight": w.m(INTER, HIDDEN), p + "mlp.down_proj.weight": w.m(HIDDEN, INTER),
                  p + "attention_layernorm.weight": w.ones(HIDDEN), p + "feedforward_layernorm.weight": w.ones(HIDDEN)})
        t.update({f"{p}mlp.act_fn.{k}": np.full((1,) if k.startswith("alpha") else (), v, np.float32)
                  for k, v in XIELU.items()})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["ApertusForCausalLM"], "model_type": "apertus", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "hidden_act": "xielu",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})


if __name__ == "__main__":
    main(__doc__, checkpoint)
