"""Tencent's models. HunYuan (Hunyuan 0.5B to 7B and Hunyuan-MT: HunYuanDenseV1ForCausalLM, llama.cpp's
hunyuan-dense; Hunyuan-A13B: HunYuanMoEV1ForCausalLM, hunyuan-moe): Llama's layer whose per-head q/k RMSNorms run
after RoPE, an NTK-alpha RoPE base, and in the mixture one shared MLP beside softmax-routed experts (renormalised).
Hy3 (HYV3ForCausalLM, hy_v3): Qwen3's attention, dense layers beside expert ones chosen by sigmoid score plus a
choice bias (renormalised and scaled) beside shared experts, an MTP layer after the last. The frozen transformers
logits are tests/test_decoder.py's and the converter's files tests/test_llamacpp_converter.py's; here, that each of
those features acts, the NTK-alpha base read back from llama.cpp's file, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      max_rel, reconfigure, run_tool)
from gguf_build import hf_tensors, rewrite_gguf
from llamacpp_models import _hf_variant

DENSE, MOE, HY3 = GOLDEN_IEBIN / "tiny-hunyuan-dense", GOLDEN_IEBIN / "tiny-hunyuan-moe", GOLDEN_IEBIN / "tiny-hy-v3"
CONVERTED = GOLDEN / "gguf" / "llamacpp"
IDS = json.loads((GOLDEN_REF / "tiny-hunyuan-dense" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-hunyuan-dense" / "logits.npy").astype(np.float64)
ROPE = json.loads((DENSE / "config.json").read_text())["rope_parameters"]




def _run(*args) -> None:
    res = run_tool("ieconv", *args, "-q")
    assert res.returncode == 0, res.stderr


def test_the_norms_after_rope_and_the_alpha_act(tmp_path):
    """The same weights as Qwen3 (q/k norms before RoPE) or without the alpha are other models: each moves the
    logits, so the golden holds both features."""
    stretched = ROPE["rope_theta"] * ROPE["alpha"] ** (16 / 14)  # (Qwen3 has no alpha: its base stretched instead)

    def as_qwen3(m: dict) -> None:  # (Qwen3's names for the same norms)
        for t in m["tensors"]:
            t["name"] = t["name"].replace("query_layernorm", "q_norm").replace("key_layernorm", "k_norm")
        reconfigure(m, architecture="Qwen3ForCausalLM", rope_parameters={"rope_type": "default",
                                                                         "rope_theta": stretched})

    before = edited_artifact(DENSE, tmp_path / "before", as_qwen3)
    plain = edited_artifact(DENSE, tmp_path / "plain", lambda m: reconfigure(
        m, rope_parameters={"rope_type": "default", "rope_theta": ROPE["rope_theta"]}))
    for other in (before, plain):
        assert max_rel(exact_logits(other, IDS, tmp_path / f"{other.name}.npy"), REF) > 1e-2


def test_llamacpps_file_states_the_alpha_as_the_hubs_config(tmp_path):
    """The converter writes the stretched base (10000 x 1000^(16/14), float32) with rope.scaling.type "none" and
    256k positions; the import reads it back as a "dynamic" rope_scaling with the alpha that gives that base, so
    the frequencies are the checkpoint's bit for bit and gguf-to-hf's config is the Hub's kind."""
    import gguf

    f = CONVERTED / "tiny-hunyuan-dense.gguf"
    kv = {k: v.contents() for k, v in gguf.GGUFReader(str(f)).fields.items()}
    assert kv["hunyuan-dense.rope.freq_base"] == np.float32(10000.0 * 1000.0 ** (16 / 14))
    _run("gguf-to-iebin", "--gguf", f, "--out-dir", tmp_path / "m")
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert cfg["rope_theta"] == 10000.0 and cfg["rope_scaling"]["rope_type"] == "dynamic"
    assert cfg["rope_scaling"]["alpha"] == pytest.approx(1000.0, rel=1e-6)
    assert max_rel(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy"), REF) < 1e-5
    _run("gguf-to-hf", "--gguf", f, "--out-dir", tmp_path / "hf")
    hf = json.loads((tmp_path / "hf/config.json").read_text())
    assert hf["architectures"] == ["HunYuanDenseV1ForCausalLM"] and hf["rope_scaling"] == cfg["rope_scaling"]


def _edited_checkpoint(tmp_path, name: str, zeroed: tuple[str, ...], **config):
    """The golden checkpoint ``name`` with the tensors ``zeroed`` zero and ``config`` changed, converted: its logits."""
    t = hf_tensors(GOLDEN_HF / name)
    for k in zeroed:
        t[k] = np.zeros_like(t[k])
    out = tmp_path / f"{name}-edited"
    _run("hf-to-iebin", "--hf-dir", _hf_variant(tmp_path, name, {"dtype": "float32", **config}, t), "--out-dir", out)
    return exact_logits(out, IDS, tmp_path / f"{name}-edited.npy")


def test_hunyuan_moes_shared_mlp_acts(tmp_path):
    """tiny-hunyuan-moe's shared MLP runs beside the routed experts (transformers' logits: tests/test_decoder.py):
    without it (its down_proj zero in both layers) the model is another."""
    ref = exact_logits(MOE, IDS, tmp_path / "ref.npy")
    shared = tuple(f"model.layers.{i}.mlp.shared_mlp.down_proj.weight" for i in range(2))
    assert max_rel(_edited_checkpoint(tmp_path, "tiny-hunyuan-moe", shared), ref) > 1e-2


def test_hy3s_choice_bias_and_scale_act(tmp_path):
    """tiny-hy-v3 (transformers' logits: tests/test_decoder.py) without its router's choice bias (zeroed) or its
    scale (1) is another model."""
    ref = exact_logits(HY3, IDS, tmp_path / "ref.npy")
    unscaled = edited_artifact(HY3, tmp_path / "unscaled", lambda m: reconfigure(m, router_scaling_factor=1.0))
    assert max_rel(exact_logits(unscaled, IDS, tmp_path / "u.npy"), ref) > 1e-2
    assert max_rel(_edited_checkpoint(tmp_path, "tiny-hy-v3", ("model.layers.1.mlp.expert_bias",)), ref) > 1e-2


@pytest.mark.parametrize("model,edit,needles", [
    (MOE, {"moe_topk": [2, 1]}, ("config.moe_topk", "one value for every layer")),
    (MOE, {"moe_topk": [2]}, ("config.moe_topk",)),
    (MOE, {"moe_topk": [8, 8]}, ("config.moe_topk", "more than the 4 experts")),
    (MOE, {"num_shared_expert": [2, 2]}, ("config.num_shared_expert", "1 is supported")),
    (DENSE, {"use_cla": True}, ("config.use_cla", "cross-layer attention")),
    (DENSE, {"rope_parameters": {**ROPE, "alpha": None}}, ("rope scaling 'dynamic'", "not supported")),
    (DENSE, {"rope_parameters": {**ROPE, "alpha": -1.0}}, ("rope_scaling.alpha", "positive")),
    (DENSE, {"rope_parameters": {**ROPE, "alpha": 1e300}}, ("rope_scaling.alpha", "float32")),
    (HY3, {"route_norm": False}, ("config.route_norm", "renormalises")),
    (HY3, {"num_experts_per_tok": 5}, ("config.num_experts_per_tok", "more than the 4 experts")),
    (HY3, {"mlp_layer_types": ["dense"]}, ("mlp_layer_types",)),
])
def test_what_the_decoder_cannot_run_is_one_line(tmp_path, model, edit, needles):
    d = edited_artifact(model, tmp_path / "m", lambda m: reconfigure(m, **edit))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), *needles)


@pytest.mark.parametrize("name,kv,needles", [
    ("tiny-hunyuan-moe", {"hunyuan-moe.expert_gating_func": 2}, ("hunyuan-moe.expert_gating_func",)),
    ("tiny-hunyuan-moe", {"hunyuan-moe.expert_weights_scale": 2.5}, ("hunyuan-moe.expert_weights_scale",)),
    ("tiny-hunyuan-dense", {"hunyuan-dense.rope.freq_base": float("nan"), "hunyuan-dense.rope.scaling.type": "none"},
     ("hunyuan-dense.rope.freq_base",)),
    ("tiny-hy-v3", {"hy_v3.expert_weights_norm": False}, ("hy_v3.expert_weights_norm", "unnormalised")),
    ("tiny-hy-v3", {"hy_v3.expert_gating_func": 1}, ("hy_v3.expert_gating_func", "sigmoid")),
    ("tiny-hy-v3", {"hy_v3.nextn_predict_layers": 3}, ("hy_v3.nextn_predict_layers", "no layer")),
    ("tiny-hy-v3", {"hy_v3.expert_shared_feed_forward_length": 48}, ("hy_v3.expert_shared_feed_forward_length",
                                                                     "whole number")),
])
def test_a_file_the_import_cannot_read_as_hunyuan_is_one_line(tmp_path, name, kv, needles):
    bad = rewrite_gguf(CONVERTED / f"{name}.gguf", tmp_path / "bad.gguf", kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "m").exists()
