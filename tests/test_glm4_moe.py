"""GLM-4.5 (Glm4MoeForCausalLM; llama.cpp's glm4moe): a leading dense
layer, then experts chosen by sigmoid score plus a correction bias (the
DeepSeek-V3 router), weighted by their renormalised scores times
routed_scaling_factor, beside a shared expert; and the multi-token
prediction layer stored after the last, which transformers and the decoder
leave unread and the converters carry. The frozen transformers logits are
tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, grouped routing against
transformers' frozen logits, what the import records, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from gguf_build import rewrite_gguf
from iekit.runtime.decoder import Decoder

MODEL = GOLDEN_IEBIN / "tiny-glm4-moe"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-glm4-moe.gguf"
REF = GOLDEN / "ref" / "tiny-glm4-moe"
IDS = json.loads((REF / "ids.json").read_text())
MTP = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")


def _rel(model_dir, ref: np.ndarray) -> float:
    got = np.asarray(Decoder(model_dir, act="f32").logits(IDS, start=0))
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def test_grouped_routing_matches_transformers(tmp_path):
    """n_group 2, topk_group 1: each token's experts from the group whose
    two best choices sum highest (transformers' logits of the same weights,
    frozen by golden/make_golden.py; ungrouped they differ by > 1%)."""
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, n_group=2, topk_group=1))
    grouped = np.load(REF / "logits_grouped.npy")
    assert _rel(d, grouped) < 2e-6
    assert _rel(MODEL, grouped) > 1e-2


def test_the_import_says_what_llamacpp_runs(tmp_path):
    """Glm4MoeConfig's keys from llama.cpp's: the trunk's layers (block_count
    less nextn_predict_layers), the router's settings, the q/k norms and
    biases as the file has them; the MTP layer carried under the Hub's names."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    want = dict(architectures=["Glm4MoeForCausalLM"], num_hidden_layers=2, num_nextn_predict_layers=1,
                n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, n_group=1, topk_group=1,
                use_qk_norm=True, attention_bias=True, partial_rotary_factor=0.5)
    assert {k: cfg.get(k) for k in want} == want
    names = {t["name"] for t in json.loads((tmp_path / "m/model.ie.json").read_text())["tensors"]}
    assert {f"model.layers.2.{n}" for n in MTP} <= names and "model.layers.2.mlp.experts.3.down_proj.weight" in names
    assert _rel(tmp_path / "m", np.load(REF / "logits.npy")) < 2e-6


def test_a_file_without_its_mtp_layer_is_the_same_model(tmp_path):
    """llama.cpp's converter can leave the MTP layer out (--no-mtp): the
    trunk alone imports as the same model, and exports without one."""
    from gguf import GGUFReader

    r = GGUFReader(CONVERTED)
    drop = {t.name: None for t in r.tensors if t.name.startswith("blk.2.")}
    g = rewrite_gguf(CONVERTED, tmp_path / "t.gguf", drop={"glm4moe.nextn_predict_layers", "glm4moe.block_count"},
                     kv={"glm4moe.block_count": 2}, tensors=drop)
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m").returncode == 0
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]) == (2, 0)
    assert _rel(tmp_path / "m", np.load(REF / "logits.npy")) < 2e-6
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "m", "--out", tmp_path / "o.gguf"
                    ).returncode == 0
    kv = {k: f.contents() for k, f in GGUFReader(tmp_path / "o.gguf").fields.items()}
    assert kv["glm4moe.block_count"] == 2 and "glm4moe.nextn_predict_layers" not in kv


def test_mtp_tensors_the_config_does_not_declare_are_refused(tmp_path):
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, num_nextn_predict_layers=None))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "model.layers.2.",
                          "does not use it")


def test_a_softmax_gated_file_is_refused(tmp_path):
    g = rewrite_gguf(CONVERTED, tmp_path / "s.gguf", drop={"glm4moe.expert_gating_func"},
                     kv={"glm4moe.expert_gating_func": 1})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, "glm4moe.expert_gating_func", "sigmoid")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("edit", [{"n_group": 3}, {"n_group": 2, "topk_group": 3}, {"n_group": 4, "topk_group": 1},
                                  {"n_group": 2, "topk_group": 1, "num_experts_per_tok": 3},
                                  {"routed_scaling_factor": 0}])
def test_an_impossible_router_is_one_error(tmp_path, edit):
    d = edited_artifact(MODEL, tmp_path / "m", lambda meta: reconfigure(meta, **edit))
    key = "config.routed_scaling_factor" if "routed_scaling_factor" in edit else "config.topk_group"
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), key)
