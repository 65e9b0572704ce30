"""Qwen2-MoE (Qwen2MoeForCausalLM; llama.cpp's qwen2moe): Qwen2's layer
with routed experts beside a shared expert that every token runs, its
output times the sigmoid of shared_expert_gate. The frozen transformers
logits are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, the shared expert's statistics
(importance matrix, covariances) against a float64 reference, what the
import records, and what is refused rather than run or exported as another
model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from iekit.runtime.decoder import Decoder
from test_imatrix import collect_ids
from test_imatrix_experts import _weights

MODEL = GOLDEN_IEBIN / "tiny-qwen2-moe"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-qwen2-moe.gguf"
IDS = [int(i) for i in np.random.default_rng(8).integers(3, 300, 48)]
CHUNKS = [IDS[16 * c:16 * (c + 1)] for c in range(3)]
SHARED = "mlp.shared_expert."


def _mlp_inputs() -> dict[int, np.ndarray]:
    """Per layer, the MLP norm's output rows (slot 4 l + 2) of CHUNKS, as the decoder saw them (float64)."""
    dec = Decoder(MODEL, threads=1, act="f32")
    layers = range(dec.spec.n_layers)
    dec._dec.collect_stats(True, [4 * layer + 2 for layer in layers])
    rows = {layer: [] for layer in layers}
    for c in CHUNKS:
        dec.logits(c)
        for layer in layers:
            rows[layer].append(dec._dec.take_captured(4 * layer + 2).astype(np.float64))
    dec._dec.collect_stats(False)
    return {layer: np.concatenate(r) for layer, r in rows.items()}


def _shared_mid(w: dict, pre: str, x: np.ndarray) -> np.ndarray:
    """The shared expert's down-projection input for rows x: SiLU(x Wgᵀ) * x Wuᵀ, in float64."""
    g, u = x @ w[pre + SHARED + "gate_proj.weight"].T, x @ w[pre + SHARED + "up_proj.weight"].T
    return g / (1 + np.exp(-g)) * u


def test_shared_expert_means_match_a_float64_reference(tmp_path):
    """The shared expert sees every row, as a dense MLP: its gate, up and
    gate row get the MLP input's means, its down its own GLU outputs'."""
    im, _ = collect_ids(tmp_path, MODEL, IDS)
    x_all, w = _mlp_inputs(), _weights(MODEL)
    for layer, x in x_all.items():
        pre = f"model.layers.{layer}."
        for n in (SHARED + "gate_proj.weight", SHARED + "up_proj.weight", "mlp.shared_expert_gate.weight",
                  "mlp.gate.weight"):
            np.testing.assert_allclose(im.entries[pre + n], (x * x).mean(axis=0), rtol=2e-4, atol=1e-7, err_msg=n)
        mid = _shared_mid(w, pre, x)
        assert mid.shape[1] == 48  # the shared expert's width, not a routed expert's 32
        np.testing.assert_allclose(im.entries[pre + SHARED + "down_proj.weight"], (mid * mid).mean(axis=0),
                                   rtol=2e-4, atol=1e-7)


def test_shared_expert_covariances_match_a_float64_reference():
    from iekit.formats import iebin
    from iekit.runtime.hessians import Hessians

    x_all, w = _mlp_inputs(), _weights(MODEL)
    dec = Decoder(MODEL, threads=2, act="f32")
    names = [t["name"] for t in iebin.load_model(MODEL).tensors]
    cov = Hessians(dec, CHUNKS, names, budget=2 * dec.spec.hidden ** 2 * 8)
    tokens = sum(map(len, CHUNKS))
    for layer, x in x_all.items():
        pre = f"model.layers.{layer}."
        mid = _shared_mid(w, pre, x)
        for n, want in ((SHARED + "up_proj.weight", x.T @ x / tokens), (SHARED + "down_proj.weight", mid.T @ mid / tokens)):
            h, _u = cov.get(pre + n)
            np.testing.assert_allclose(h, want, rtol=2e-4, atol=1e-6 * np.abs(want).max(), err_msg=n)


def test_the_import_says_what_llamacpp_runs(tmp_path):
    """Qwen2MoeConfig's keys: num_experts, both widths, q/k/v biases as the
    file has them, and no renormalisation (llama.cpp's qwen2moe has none)."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["architectures"], cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
            cfg["shared_expert_intermediate_size"], cfg["qkv_bias"], cfg["norm_topk_prob"],
            cfg["mlp_only_layers"]) == (["Qwen2MoeForCausalLM"], 4, 2, 32, 48, True, False, [])
    assert "num_local_experts" not in cfg


@pytest.mark.parametrize("edit,key,says", [({"norm_topk_prob": True}, "config.norm_topk_prob", "never renormalises"),
                                           ({"tie_word_embeddings": True}, "config.tie_word_embeddings",
                                            "output head of its own")])
def test_export_refuses_what_llamacpp_would_run_otherwise(tmp_path, edit, key, says):
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, **edit))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, key, says)
    assert not (tmp_path / "m.gguf").exists()


def test_a_shared_expert_without_its_width_is_one_error(tmp_path):
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, shared_expert_intermediate_size=None))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "config.shared_expert_intermediate_size", "positive integer")


def test_a_wrong_shared_width_names_the_tensor(tmp_path):
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, shared_expert_intermediate_size=32))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "mlp.shared_expert.gate_proj.weight", "shape")


def test_without_q_k_v_biases_the_stored_ones_are_unread_tensors(tmp_path):
    """qkv_bias: false is a layer without them (transformers builds none and
    leaves stored ones unread): the decoder does not read them either, so
    stored here they are refused as any tensor it would not use."""
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, qkv_bias=False))
    res = run_tool("ierun", "generate", "--model-dir", d, "--ids", "1")
    assert_one_line_error(res, "model.layers.0.self_attn.", "_proj.bias", "does not use it")


def test_a_quantized_model_keeps_the_gates_float_and_exports(tmp_path):
    """q4_0 everywhere it may go: the shared expert's matrices are
    quantized, its gate row stays float with the router (llama.cpp's
    ffn_gate_inp_shexp is F32), and the export carries both as llama.cpp
    reads them."""
    from gguf import GGUFReader

    from conftest import GOLDEN_HF

    man, out, g = tmp_path / "m.json", tmp_path / "q", tmp_path / "q.gguf"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-qwen2-moe", "-o", man, "--scheme", "q4_0")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-qwen2-moe", "--out-dir", out,
                   "--q4-map", man)
    assert res.returncode == 0, res.stderr
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", out, "--out", g).returncode == 0
    types = {t.name: t.tensor_type.name for t in GGUFReader(g).tensors}
    # (down's 48 columns are no whole number of 32-element blocks: kept)
    assert [types[f"blk.0.ffn_{k}_shexp.weight"] for k in ("gate", "up", "down")] == ["Q4_0", "Q4_0", "BF16"]
    assert types["blk.0.ffn_gate_inp_shexp.weight"] == types["blk.0.ffn_gate_inp.weight"] == "F32"
    # imported back, the same model bit for bit
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "back").returncode == 0
    ids = json.loads((GOLDEN / "ref" / "tiny-qwen2-moe" / "ids.json").read_text())
    got, back = (np.asarray(Decoder(d, act="f32").logits(ids, start=0)) for d in (out, tmp_path / "back"))
    assert np.array_equal(got, back)


@pytest.mark.parametrize("drop,ff", [("qwen2moe.expert_shared_feed_forward_length", 48),
                                     ("qwen2moe.expert_feed_forward_length", 64)])
def test_a_width_the_file_leaves_out_is_llamacpps(tmp_path, drop, ff):
    """llama.cpp's qwen2moe without a width key: the shared expert's is
    feed_forward_length, a routed expert's that over the experts used."""
    from gguf_build import rewrite_gguf

    g = rewrite_gguf(CONVERTED, tmp_path / "m.gguf", drop={drop, "qwen2moe.feed_forward_length"},
                     kv={"qwen2moe.feed_forward_length": ff})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]) == (32, 48)
    ids = json.loads((GOLDEN / "ref" / "tiny-qwen2-moe" / "ids.json").read_text())
    ref = np.load(GOLDEN / "ref" / "tiny-qwen2-moe" / "logits.npy")
    got = np.asarray(Decoder(tmp_path / "m", act="f32").logits(ids, start=0))
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


def test_a_file_without_the_shared_gate_is_refused_where_it_runs(tmp_path):
    from gguf_build import rewrite_gguf

    g = rewrite_gguf(CONVERTED, tmp_path / "m.gguf", tensors={"blk.1.ffn_gate_inp_shexp.weight": None})
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m").returncode == 0
    res = run_tool("ierun", "generate", "--model-dir", tmp_path / "m", "--ids", "1")
    assert_one_line_error(res, "model.layers.1.mlp.shared_expert_gate.weight", "missing")
