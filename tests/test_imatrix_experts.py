"""Importance matrices of mixtures of experts: each expert's gate/up and
down inputs averaged over the rows routed to it (as llama-imatrix collects
them), checked against a float64 routing of the captured layer inputs; the
per-expert vectors weight each expert's quantization; --target-bpw measures
expert stacks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN_HF, GOLDEN_IEBIN, run_tool
from iekit.formats import iebin
from iekit.formats.casting import decode_f32
from iekit.formats.quant import SCHEMES, QuantError, QuantParams
from iekit.runtime.decoder import Decoder
from test_imatrix import collect_ids

IDS = [int(i) for i in np.random.default_rng(8).integers(3, 300, 48)]


def _weights(model_dir) -> dict[str, np.ndarray]:
    m = iebin.load_model(model_dir)
    out = {}
    for t in m.tensors:
        if t["dtype"] in ("f32", "f16", "bf16"):
            raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
            out[t["name"]] = decode_f32(raw, t["dtype"]).astype(np.float64).reshape(t["shape"])
    return out


def _glu(name: str, w: dict, pre: str, e: int, x: np.ndarray, cfg: dict) -> np.ndarray:
    """Expert e's down-projection input for rows x, in float64 (transformers' definitions)."""
    if name == "tiny-gpt-oss":
        gu = x @ w[pre + "mlp.experts.gate_up_proj"][e].T + w[pre + "mlp.experts.gate_up_proj_bias"][e]
        limit, alpha = cfg["swiglu_limit"], 1.702
        gate, up = np.minimum(gu[:, ::2], limit), np.clip(gu[:, 1::2], -limit, limit)
        return (up + 1) * gate / (1 + np.exp(-alpha * gate))
    g = x @ w[pre + f"block_sparse_moe.experts.{e}.w1.weight"].T
    u = x @ w[pre + f"block_sparse_moe.experts.{e}.w3.weight"].T
    return g / (1 + np.exp(-g)) * u


def _router(name: str, w: dict, pre: str, x: np.ndarray) -> np.ndarray:
    if name == "tiny-gpt-oss":
        return x @ w[pre + "mlp.router.weight"].T + w[pre + "mlp.router.bias"]
    return x @ w[pre + "block_sparse_moe.gate.weight"].T


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-mixtral"])
def test_expert_means_match_a_float64_routing(tmp_path, name):
    im, _ = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS)
    # The MoE layers' inputs (slot 2: the MLP norm's output), captured row by row as the decoder saw them.
    dec = Decoder(GOLDEN_IEBIN / name, threads=1, act="f32")
    spec, cfg = dec.spec, iebin.load_model(GOLDEN_IEBIN / name).meta["config"]
    layers = range(spec.n_layers)
    dec._dec.collect_stats(True, [4 * layer + 2 for layer in layers])
    rows = {layer: [] for layer in layers}
    for c in range(3):
        dec.logits(IDS[16 * c:16 * (c + 1)], start=15)
        for layer in layers:
            rows[layer].append(dec._dec.take_captured(4 * layer + 2).astype(np.float64))
    dec._dec.collect_stats(False)
    w = _weights(GOLDEN_IEBIN / name)
    E, K = spec.moe.n_experts, spec.moe.top_k
    for layer in layers:
        pre = f"model.layers.{layer}."
        x = np.concatenate(rows[layer])
        top = np.argsort(-_router(name, w, pre, x), axis=1, kind="stable")[:, :K]
        in_ref, mid_ref = np.zeros((E, x.shape[1])), np.zeros((E, spec.moe.inter))
        for e in range(E):
            xe = x[(top == e).any(axis=1)]
            assert len(xe), f"expert {e} of layer {layer} got no row: pick other ids"
            in_ref[e] = (xe * xe).mean(axis=0)
            mid_ref[e] = (_glu(name, w, pre, e, xe, cfg) ** 2).mean(axis=0)
        if name == "tiny-gpt-oss":
            got_in, got_mid = im.entries[pre + "mlp.experts.gate_up_proj"], im.entries[pre + "mlp.experts.down_proj"]
            assert got_in.shape == (E, x.shape[1]) and got_mid.shape == (E, spec.moe.inter)
        else:
            got_in = np.stack([im.entries[pre + f"block_sparse_moe.experts.{e}.w1.weight"] for e in range(E)])
            assert all(np.array_equal(im.entries[pre + f"block_sparse_moe.experts.{e}.w3.weight"], got_in[e])
                       for e in range(E))
            got_mid = np.stack([im.entries[pre + f"block_sparse_moe.experts.{e}.w2.weight"] for e in range(E)])
        np.testing.assert_allclose(got_in, in_ref, rtol=2e-4, atol=1e-7)
        np.testing.assert_allclose(got_mid, mid_ref, rtol=2e-4, atol=1e-7)
        router = next(k for k in im.entries if k.startswith(pre) and ("router" in k or ".gate.weight" in k))
        np.testing.assert_allclose(im.entries[router], (x * x).mean(axis=0), rtol=2e-4, atol=1e-7)
        assert not any(k.startswith(pre + "mlp.gate_proj") or k.startswith(pre + "mlp.down_proj") for k in im.entries)


def test_stack_experts_are_quantized_with_their_own_importance(tmp_path):
    """hf-to-iebin with an imatrix whose stack entries are [experts, cols]:
    expert e's bytes are the quantizer's on its rows with importance[e]."""
    im, im_path = collect_ids(tmp_path, GOLDEN_IEBIN / "tiny-gpt-oss", IDS)
    man, out = tmp_path / "q.json", tmp_path / "m"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "-o", man, "--scheme", "q4_1",
                   "--imatrix", im_path)
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    imp = im.entries
    floats = _weights(GOLDEN_IEBIN / "tiny-gpt-oss")
    m = iebin.load_model(out)
    scheme, p = SCHEMES["q4_1"], QuantParams("q4_1")
    differs = 0
    for layer in (0, 1):
        name = f"model.layers.{layer}.mlp.experts.down_proj"
        t = m.tensor(name)
        assert t["dtype"] == "q4_1"
        E = t["shape"][0]
        stored = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        per = t["nbytes"] // E
        for e in range(E):
            w = floats[name][e].astype(np.float32)
            mine = b"".join(x.tobytes() for x in scheme.payload(scheme.measured_rows(w, p, name, imp[name][e], QuantError())))
            pooled = b"".join(x.tobytes() for x in scheme.payload(
                scheme.measured_rows(w, p, name, imp[name].mean(axis=0), QuantError())))
            assert stored[e * per:(e + 1) * per] == mine, (name, e)
            differs += mine != pooled
    assert differs  # the per-expert vectors change what is stored


def test_target_bpw_measures_expert_stacks(tmp_path):
    """--target-bpw on a MoE model: stacks measured as their matrices' rows
    (the bf16 [experts, in, out] parameters read as written, [experts, out, in]);
    the mix meets the budget and the model converts and runs."""
    man, out = tmp_path / "q.json", tmp_path / "m"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "-o", man, "--target-bpw", "5")
    assert res.returncode == 0, res.stderr
    manifest = json.loads(man.read_text())
    assert "model.layers.0.mlp.experts.gate_up_proj" in manifest["tensors"]
    assert abs(manifest["bits_per_weight"] - 5) < 0.25
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    assert np.isfinite(Decoder(out, threads=1).logits([3, 17, 250])).all()
