"""StarCoder2's layer at speed beside llama.cpp's: StarCoder2 3B's shape cut to fit (4 layers 3072 wide, 24 heads of
128 over 2 KV heads, an MLP of 12288 without a gate, GELU-tanh; LayerNorms and every projection with a bias),
random weights, run by ``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv iebin-to-gguf``
writes of it (benchmarks/shape_bench.py). Its sliding window is left out: llama.cpp's starcoder2 has none.

    .venv/bin/python benchmarks/starcoder2_shape.py --work /tmp/starcoder2 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 3072, 24, 2, 128, 12288, 4


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as Starcoder2ForCausalLM's checkpoints name them."""
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        a = w.attention(p + "self_attn.", HIDDEN, HEADS, KV_HEADS, HEAD_DIM)
        t.update(a)
        t.update({k.replace(".weight", ".bias"): w.m(v.shape[0]) for k, v in a.items()})
        t.update({p + "mlp.c_fc.weight": w.m(INTER, HIDDEN), p + "mlp.c_fc.bias": w.m(INTER),
                  p + "mlp.c_proj.weight": w.m(HIDDEN, INTER), p + "mlp.c_proj.bias": w.m(HIDDEN)})
        for n in ("input_layernorm", "post_attention_layernorm"):
            t.update({p + n + ".weight": w.ones(HIDDEN), p + n + ".bias": w.m(HIDDEN)})
    t["model.norm.bias"] = w.m(HIDDEN)
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 16384, "norm_epsilon": 1e-5, "hidden_act": "gelu_pytorch_tanh",
        "use_bias": True, "sliding_window": None, "rope_theta": 999999.4420358813})


if __name__ == "__main__":
    main(__doc__, checkpoint)
