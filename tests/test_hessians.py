"""Input covariances (runtime/hessians.py) from the decoder's captured matrix
inputs (csrc/decoder collect_stats(capture=...)), against a float64 forward
pass; in the sanitizer run (Makefile SAN_PYTESTS) for the capture code."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GOLDEN_IEBIN
from decoder_ref import forward, load_weights
from iekit.formats import gptq


def _reference(model, w, chunks) -> dict[str, np.ndarray]:
    """Σ x xᵀ / tokens of every matrix input, by the float64 forward pass over ``chunks``."""
    ref: dict[str, np.ndarray] = {}
    for c in chunks:
        outer: dict[str, np.ndarray] = {}
        forward(model, w, c, outer=outer)
        for k, v in outer.items():
            ref[k] = ref.get(k, 0) + v
    return {k: v / sum(map(len, chunks)) for k, v in ref.items()}


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
    ref = _reference(model, w, chunks)
    names = sorted(ref)
    cov = Hessians(dec, chunks, names, budget=3 * 64 * 64 * 8)  # three slots at a time: several passes
    for n in names:
        h, u = cov.get(n)
        assert np.allclose(h, ref[n], rtol=1e-4, atol=1e-6 * np.abs(ref[n]).max()), n
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


def test_expert_capture_arguments_are_checked():
    from iekit.runtime.decoder import Decoder

    dense, moe = Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32"), Decoder(GOLDEN_IEBIN / "tiny-mixtral", act="f32")
    with pytest.raises(ValueError, match="capture_experts layer 0 is not a layer with experts"):
        dense._dec.collect_stats(True, capture_experts=[0])
    with pytest.raises(ValueError, match="capture_experts layer 2 is not a layer with experts"):
        moe._dec.collect_stats(True, capture_experts=[2])
    with pytest.raises(ValueError, match="capture needs on"):
        moe._dec.collect_stats(False, capture_experts=[0])
    moe._dec.collect_stats(True, capture_experts=[1])
    with pytest.raises(ValueError, match="layer 0's experts are not being captured"):
        moe._dec.take_expert_captured(0)
    moe.logits([5, 6, 7])
    got = moe._dec.take_expert_captured(1)
    assert len(got) == 4 and sum(len(x) for x, _m in got) == 3 * 2  # three rows, two experts each
    assert all(m.shape == (len(x), moe.spec.moe.inter) for x, m in got)
    assert sum(len(x) for x, _m in moe._dec.take_expert_captured(1)) == 0  # handed over
    moe._dec.collect_stats(False)


def test_sequential_covariances_see_the_quantized_earlier_layers():
    """Sequential mode (ieconv gptq --sequential): once layer 0's matrices are
    settled, layer 1's covariances are those of the float64 forward pass of the
    model with layer 0 replaced, not of the float model; layer 0's own are the
    float model's. The head (slot after the last layer) sees every layer settled."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    ids = [int(i) for i in np.random.default_rng(7).integers(3, 300, 32)]
    chunks = [ids[:16], ids[16:]]
    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2, ctx=16, act="f32")
    model, w = load_weights(GOLDEN_IEBIN / "tiny-llama")
    float_ref = _reference(model, w, chunks)
    cov = Hessians(dec, chunks, sorted(float_ref), sequential=True)
    order = cov.forward_order(sorted(w))
    mats = [n for n in order if cov.slot_of(n) is not None]
    assert mats[-1] == dec.head_name and mats.index("model.layers.0.mlp.down_proj.weight") < mats.index(
        "model.layers.1.self_attn.q_proj.weight")
    coarse, layer, ref = dict(w), None, {}
    for n in mats:
        if cov.slot_of(n) // 4 != layer:  # a layer's inputs come from the model as its pass began
            layer, ref = cov.slot_of(n) // 4, _reference(model, coarse, chunks)
        h, _u = cov.get(n)
        assert np.allclose(h, ref[n], rtol=1e-4, atol=1e-6 * np.abs(h).max()), n
        coarse[n] = np.round(w[n] * 4) / 4  # a crude "quantizer", so the change is large
        cov.settle(n, coarse[n].astype(np.float32))
    last = _reference(model, coarse, chunks)[dec.head_name]
    assert not np.allclose(last, float_ref[dec.head_name], rtol=0.05)  # the test would see a non-sequential pass
    assert cov.passes == model["num_hidden_layers"] + 1


def test_run_layers_stops_after_the_layers_asked_for():
    """A calibration pass through the first layers only (Decoder.run_layers)
    captures what the full forward captures for those layers' inputs, runs
    none of the later ones, and leaves a cache forward refuses to continue
    until it is truncated; layer counts outside 1..n_layers are refused."""
    from iekit.formats.errors import IEError
    from iekit.runtime.decoder import Decoder

    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32")
    ids = [5, 6, 7, 8, 9]
    dec._dec.collect_stats(True, capture=[0, 3, 4])
    dec.logits(ids)
    full = [dec._dec.take_captured(s) for s in (0, 3, 4)]
    dec._dec.collect_stats(True, capture=[0, 3, 4])
    dec.run_layers(ids, 1)
    assert np.array_equal(dec._dec.take_captured(0), full[0]) and np.array_equal(dec._dec.take_captured(3), full[1])
    assert dec._dec.take_captured(4).shape == (0, 64)  # layer 1 never ran
    assert dec._dec.stats()[1] == 5
    with pytest.raises(ValueError, match=r"positions 0..4 were run through the first layers only"):
        dec._dec.forward(np.array([3], np.int32))
    dec._dec.collect_stats(False)
    assert np.allclose(dec.logits(ids), Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32").logits(ids))
    for bad in (0, 3):
        with pytest.raises(IEError, match=rf"run_layers: layers 0..{bad - 1} are not within 0..1"):
            dec.run_layers(ids, bad)
    with pytest.raises(IEError, match="starting at layer 1 needs its input"):
        dec.run_layers(ids, 2, first=1)
    with pytest.raises(IEError, match=r"the residual stream must be \[5, 64\] float32"):
        dec.run_layers(ids, 2, first=1, stream=np.zeros((4, 64), np.float32))


def test_run_layers_resumes_from_the_residual_stream():
    """Layer 0 run alone, then layer 1 from the stream it returned, gives the
    stream and the captured inputs of both layers run at once."""
    from iekit.runtime.decoder import Decoder

    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32")
    ids = [5, 6, 7, 8, 9, 10, 11]
    dec._dec.collect_stats(True, capture=[0, 4, 7])
    whole = dec.run_layers(ids, 2)
    want = [dec._dec.take_captured(s) for s in (0, 4, 7)]
    x = dec.run_layers(ids, 1)
    assert dec._dec.take_captured(4).shape == (0, 64)
    assert np.array_equal(dec.run_layers(ids, 2, first=1, stream=x), whole)
    got = [dec._dec.take_captured(s) for s in (0, 4, 7)]
    assert all(np.array_equal(g, v) for g, v in zip(got, want))
    dec._dec.collect_stats(False)


def test_covariance_windows_run_each_layer_about_once():
    """One slot per window (a budget of one covariance) still runs the layers
    about once in all: each window resumes from the stream the last one kept
    (the input of its last layer), instead of starting from the embedding."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    ids = [int(i) for i in np.random.default_rng(3).integers(3, 300, 32)]
    chunks = [ids[:16], ids[16:]]
    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2, ctx=16, act="f32")
    model, w = load_weights(GOLDEN_IEBIN / "tiny-llama")
    ref = _reference(model, w, chunks)
    runs = []
    run_layers = dec.run_layers

    def counted(c, layers, first=0, stream=None):
        runs.append(layers - first)
        return run_layers(c, layers, first, stream)

    dec.run_layers = counted
    cov = Hessians(dec, chunks, sorted(ref), budget=1)
    for n in cov.forward_order(sorted(ref)):
        h, _u = cov.get(n)
        assert np.allclose(h, ref[n], rtol=1e-4, atol=1e-6 * np.abs(ref[n]).max()), n
    n_layers, windows = model["num_hidden_layers"], cov.passes
    assert windows == 4 * n_layers + 1  # every slot (the head's too) a window of its own
    # from the embedding, each window would have run (i // 4 + 1) layers: 2 + 2 + ... for 9 windows
    from_embedding = sum(min(s // 4 + 1, n_layers) for s in range(windows)) * len(chunks)
    assert sum(runs) <= (n_layers + windows) * len(chunks) < from_embedding


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_replace_matrices_runs_on_with_the_new_values(name):
    """Decoder.replace_matrices (what a sequential pass swaps quantized layers in
    with) against the float64 forward pass of the weights so changed; a tied
    head is the embedding too. Unknown names and wrong shapes are refused."""
    from iekit.formats.errors import IEError
    from iekit.runtime.decoder import Decoder

    dec = Decoder(GOLDEN_IEBIN / name, act="f32")
    model, w = load_weights(GOLDEN_IEBIN / name)
    rng = np.random.default_rng(3)
    new = {n: (w[n] * rng.uniform(0.5, 1.5, w[n].shape)).astype(np.float32)
           for n in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight", dec.head_name)}
    dec.replace_matrices(new)
    ids = [7, 100, 42, 3, 250, 9]
    ref = forward(model, {**w, **{n: v.astype(np.float64) for n, v in new.items()}}, ids)
    assert np.allclose(dec.logits(ids), ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())
    with pytest.raises(IEError, match="'model.norm.weight' is not a layer matrix or the head"):
        dec.replace_matrices({"model.norm.weight": np.zeros((64, 64), np.float32)})
    with pytest.raises(IEError, match=r"\[64, 32\] where the model has \[64, 64\]"):
        dec.replace_matrices({"model.layers.0.self_attn.q_proj.weight": np.zeros((64, 32), np.float32)})
