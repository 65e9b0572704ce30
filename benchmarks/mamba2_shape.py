"""Mamba-2 at speed beside llama.cpp's: Mamba-Codestral-7B's layer cut to fit (4 layers 4096 wide, Mamba2 alone in
each: 128 heads of 64 with states of 128 in 8 groups and 4 taps, a convolution bias), random weights, run by
``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of it
(benchmarks/shape_bench.py). Nothing attends, so the depth changes nothing but the context's positions.

    .venv/bin/python benchmarks/mamba2_shape.py --work /tmp/mamba2 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, LAYERS = 4096, 4
SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS = 128, 64, 128, 8, 4


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as Mamba2ForCausalLM's checkpoints name them."""
    t = {}
    for i in range(LAYERS):
        p = f"backbone.layers.{i}."
        t[p + "norm.weight"] = w.ones(HIDDEN)
        t.update(w.mamba2(p + "mixer.", HIDDEN, SSM_HEADS, SSM_HEAD_DIM, STATE, GROUPS, TAPS))
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "num_hidden_layers": LAYERS,
        "num_heads": SSM_HEADS, "head_dim": SSM_HEAD_DIM, "expand": 2, "state_size": STATE, "n_groups": GROUPS,
        "conv_kernel": TAPS, "use_conv_bias": True, "use_bias": False, "hidden_act": "silu",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False},
        embed="backbone.embeddings.weight", final_norm="backbone.norm_f.weight")


if __name__ == "__main__":
    main(__doc__, checkpoint)
