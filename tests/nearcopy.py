"""A decoder-shaped model with near-copy layers, dedup artifacts included.

The golden tiny Llama has independent random layers, so dedup-plan rightly
finds nothing to group in it; this builds one where layer 1 is layer 0 with
1% of its elements changed, the case dedup exists for (issue: "a test
model whose layers are near-copies").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from conftest import GOLDEN_HF, run_tool

AUX = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def nearcopy_llama(tmp_path: Path, scheme: str | None = None) -> Path:
    """Convert (quantizing with ``scheme``'s default policy if given), then
    dedup-plan, dedup-extract and dedup-link; returns the model directory."""
    from safetensors.numpy import load_file, save_file

    hf = tmp_path / "hf"
    hf.mkdir()
    for f in AUX:
        shutil.copy(GOLDEN_HF / "tiny-llama" / f, hf / f)
    w = {}
    for shard in sorted((GOLDEN_HF / "tiny-llama").glob("*.safetensors")):
        w.update(load_file(shard))
    rng = np.random.default_rng(0)
    for k in [k for k in w if k.startswith("model.layers.0.") and k.endswith("proj.weight")]:
        x = w[k].copy().reshape(-1)
        idx = rng.choice(x.size, x.size // 100, replace=False)
        x[idx] += np.float32(0.01)
        w[k.replace("layers.0.", "layers.1.")] = x.reshape(w[k].shape)
    save_file(w, str(hf / "model.safetensors"))
    model, out = tmp_path / "m", tmp_path / "m" / "dedup_out"
    quant = []
    if scheme:
        res = run_tool("ieconv", "q4-manifest", "--hf-dir", hf, "-o", tmp_path / "q.json", "--scheme", scheme)
        assert res.returncode == 0, res.stderr
        quant = ["--q4-map", tmp_path / "q.json"]
    for args in (("hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", model, *quant),
                 ("dedup-plan", "--model-dir", model, "--out-dir", out),
                 ("dedup-extract", "-q", "--model-dir", model, "--tensor-map", out / "tensor_map.json",
                  "--groups", out / "groups.indices.json", "--out-prefix", out / "model"),
                 ("dedup-link", model)):
        res = run_tool("ieconv", *args)
        assert res.returncode == 0, (args, res.stderr)
    return model
