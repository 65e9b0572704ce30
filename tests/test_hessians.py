"""Input covariances (runtime/hessians.py) from the decoder's captured matrix
inputs (csrc/decoder collect_stats(capture=...)), against a float64 forward
pass; in the sanitizer run (Makefile SAN_PYTESTS) for the capture code."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GOLDEN_IEBIN
from decoder_ref import forward, load_weights
from iekit.formats import gptq


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_covariances_match_the_float64_reference(name):
    """runtime/hessians.py over the native decoder's captured inputs against Σ x xᵀ of the
    float64 forward pass, chunk by chunk (each chunk a fresh sequence), for every slot."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    ids = [int(i) for i in np.random.default_rng(5).integers(3, 300, 48)]
    chunks = [ids[16 * c:16 * (c + 1)] for c in range(3)]
    dec = Decoder(GOLDEN_IEBIN / name, threads=2, ctx=16, act="f32")
    model, w = load_weights(GOLDEN_IEBIN / name)
    ref: dict[str, np.ndarray] = {}
    for c in chunks:
        outer: dict[str, np.ndarray] = {}
        forward(model, w, c, outer=outer)
        for k, v in outer.items():
            ref[k] = ref.get(k, 0) + v
    names = sorted(ref)
    cov = Hessians(dec, chunks, names, budget=3 * 64 * 64 * 8)  # three slots at a time: several passes
    for n in names:
        h, u = cov.get(n)
        assert np.allclose(h, ref[n] / 48, rtol=1e-4, atol=1e-6 * np.abs(ref[n]).max() / 48), n
        assert np.allclose(u.T @ u @ gptq.damped(h), np.eye(len(h)),
                           atol=1e-6)
    assert cov.passes >= 3
    assert cov.get("model.norm.weight") is None


def test_capture_slots_are_checked():
    from iekit.runtime.decoder import Decoder

    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32")
    with pytest.raises(Exception, match="capture slot 9 is outside 0..8"):
        dec._dec.collect_stats(True, capture=[9])
    with pytest.raises(Exception, match="capture needs on"):
        dec._dec.collect_stats(False, capture=[0])
    dec._dec.collect_stats(True, capture=[1])
    with pytest.raises(Exception, match="slot 0 is not being captured"):
        dec._dec.take_captured(0)
    dec.logits([5, 6, 7])
    assert dec._dec.take_captured(1).shape == (3, 64)
    assert dec._dec.take_captured(1).shape == (0, 64)  # handed over
    dec._dec.collect_stats(False)
