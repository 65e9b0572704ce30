"""Mamba 1 at speed beside llama.cpp's: Falcon Mamba 7B's layer cut to fit (4 layers 4096 wide, its selective scan of
8192 channels with states of 16, a time-step rank of 256, 4 taps with a bias; dt's low rank, B and C RMS-normed),
random weights, run by ``ierun bench`` and by llama.cpp's ``llama-bench`` on the GGUF ``ieconv iebin-to-gguf``
writes of it (benchmarks/shape_bench.py). Nothing attends, so the depth changes nothing but the context's positions.

    .venv/bin/python benchmarks/mamba_shape.py --work /tmp/mamba [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shape_bench import Weights, main, write_checkpoint

HIDDEN, LAYERS, INNER, STATE, RANK, TAPS = 4096, 4, 8192, 16, 256, 4


def layers(w: Weights) -> dict[str, np.ndarray]:
    """Every layer's tensors, as FalconMambaForCausalLM's checkpoints name them; A_log and D as transformers'
    mixers initialise them (log 1..state for every channel, ones), dt's bias near softplus' inverse of 0.01, the taps
    ten times the others' scale."""
    t = {}
    for i in range(LAYERS):
        p = f"backbone.layers.{i}."
        t[p + "norm.weight"] = w.ones(HIDDEN)
        t.update({p + "mixer.in_proj.weight": w.m(2 * INNER, HIDDEN),
                  p + "mixer.conv1d.weight": w.m(INNER, 1, TAPS) * 10, p + "mixer.conv1d.bias": w.m(INNER),
                  p + "mixer.x_proj.weight": w.m(RANK + 2 * STATE, INNER), p + "mixer.dt_proj.weight": w.m(INNER, RANK),
                  p + "mixer.dt_proj.bias": np.full(INNER, -4.6, np.float32),
                  p + "mixer.A_log": np.log(np.tile(np.arange(1, STATE + 1, dtype=np.float32), (INNER, 1))),
                  p + "mixer.D": w.ones(INNER), p + "mixer.out_proj.weight": w.m(HIDDEN, INNER)})
    return t


def checkpoint(out: Path) -> None:
    write_checkpoint(out, HIDDEN, layers, {
        "architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba", "num_hidden_layers": LAYERS,
        "intermediate_size": INNER, "expand": 2, "state_size": STATE, "time_step_rank": RANK, "conv_kernel": TAPS,
        "use_conv_bias": True, "use_bias": False, "hidden_act": "silu", "layer_norm_epsilon": 1e-5,
        "mixer_rms_eps": 1e-5, "tie_word_embeddings": False},
        embed="backbone.embeddings.weight", final_norm="backbone.norm_f.weight")


if __name__ == "__main__":
    main(__doc__, checkpoint)
