"""The function-preserving transforms make bench-quality scores on
(benchmarks/quality_bench.py): folding the norms and rotating the residual
stream, then widening it so rows are whole 256-element super-blocks. Each
must leave the model's logits as they were: checked here on a golden toy
with non-trivial norm weights against the untransformed model, in float32."""

from __future__ import annotations

import json

import numpy as np
import quality_bench
from conftest import GOLDEN, run_tool

from iekit.runtime.decoder import Decoder

IDS = [3, 17, 42, 99, 5, 250, 7, 8, 1, 64]


def _convert(hf, out):
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return Decoder(out).logits(IDS)


def test_rotation_then_widening_keeps_the_logits(tmp_path):
    src = GOLDEN / "hf" / "tiny-llama"
    ref = _convert(src, tmp_path / "ref")
    quality_bench.rotate(src, tmp_path / "rot")
    quality_bench.widen(tmp_path / "rot", tmp_path / "wide", 96)
    cfg = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert cfg["hidden_size"] == 96 and cfg["head_dim"] == 16
    assert cfg["rms_norm_eps"] == json.loads((src / "config.json").read_text())["rms_norm_eps"] * 64 / 96
    for d in ("rot", "wide"):
        got = _convert(tmp_path / d, tmp_path / f"{d}-iebin")
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), d
    # the widened artifact really is 96 wide
    meta = json.loads((tmp_path / "wide-iebin" / "model.ie.json").read_text())
    shapes = {t["name"]: t["shape"] for t in meta["tensors"]}
    assert shapes["model.embed_tokens.weight"][1] == 96 and shapes["model.layers.0.self_attn.o_proj.weight"] == [96, 64]


def test_widening_refuses_unfolded_norms_and_narrower_widths(tmp_path):
    import pytest

    src = GOLDEN / "hf" / "tiny-llama"
    with pytest.raises(SystemExit, match="fold the norm weights first"):
        quality_bench.widen(src, tmp_path / "w", 96)
    quality_bench.rotate(src, tmp_path / "rot")
    with pytest.raises(SystemExit, match="already 64 wide"):
        quality_bench.widen(tmp_path / "rot", tmp_path / "w", 64)
