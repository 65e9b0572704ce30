"""DeepSeek-V3 and V2 (DeepseekV3ForCausalLM, DeepseekV2ForCausalLM;
llama.cpp's deepseek2): multi-head latent attention, decompressed per head
from one latent, values narrower than keys. The frozen transformers logits
are tests/test_decoder.py's, the converter's own files
tests/test_llamacpp_converter.py's; here, what the attention's options do,
what the import records from a deepseek2 file, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, gptq_q8_0, max_rel, reconfigure,
                      run_tool)
from gguf_build import rewrite_gguf
from iekit.runtime.decoder import Decoder

V3, V2 = GOLDEN_IEBIN / "tiny-deepseek-v3", GOLDEN_IEBIN / "tiny-deepseek-v2"
CONVERTED = {m: GOLDEN / "gguf" / "llamacpp" / f"tiny-deepseek-{m}.gguf" for m in ("v3", "v2")}
REF = GOLDEN / "ref" / "tiny-deepseek-v3"
IDS = json.loads((REF / "ids.json").read_text())


def _logits(model_dir, **kw) -> np.ndarray:
    return np.asarray(Decoder(model_dir, act="f32", **kw).logits(IDS, start=0), np.float64)




def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm in float64 (the restatements below)."""
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w


def test_without_mscale_all_dim_the_model_differs(tmp_path):
    """transformers' yarn_apply_mscale: without mscale_all_dim the scores lose YaRN's factor squared (the
    golden has it: tests/test_decoder.py holds the logits to transformers')."""
    meta = json.loads((V3 / "model.ie.json").read_text())
    rp = {**meta["config"]["rope_parameters"], "mscale_all_dim": 0}
    d = edited_artifact(V3, tmp_path / "m", lambda m: reconfigure(m, rope_parameters=rp))
    assert max_rel(_logits(d), _logits(V3)) > 1e-2


def test_rope_interleave_false_turns_halves(tmp_path):
    """DeepseekV3Config.rope_interleave false: rotate_half over the rope dims, another model."""
    d = edited_artifact(V3, tmp_path / "m", lambda m: reconfigure(m, rope_interleave=False))
    assert max_rel(_logits(d), _logits(V3)) > 1e-3
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.rope_interleave")


def test_the_cache_holds_the_latent_alone():
    """Absorbed, as llama.cpp runs it: one key per position and layer, [k_pe |
    latent] (8 + 32 here, where decompressed heads would take 4 x (24 + 12)),
    its latent part every head's value; in f16 as in f32."""
    from iekit.runtime.decoder import kv_elements

    assert kv_elements(Decoder(V3).spec) == (40, 0)
    f32, f16 = _logits(V3), _logits(V3, cache_type_k="f16", cache_type_v="f16")
    assert 0 < max_rel(f16, f32) < 1e-2


def test_cache_types_that_differ_are_one_error(tmp_path):
    res = run_tool("ierun", "generate", "--model-dir", V3, "--ids", "1", "--cache-type-k", "f16", "--cache-type-v", "f32")
    assert_one_line_error(res, "K and V cache types must match")


def test_decode_steps_match_the_prefill():
    dec = Decoder(V2, act="f32")
    whole = np.asarray(dec.logits(IDS, start=0))
    step = Decoder(V2, act="f32")
    rows = [np.asarray(step.logits(IDS[: i + 1], start=i))[0] for i in range(len(IDS))]
    assert max_rel(np.stack(rows), whole) < 1e-5


@pytest.mark.parametrize("key,value", [("num_key_value_heads", 2), ("attention_bias", True), ("qk_rope_head_dim", 7)])
def test_a_config_latent_attention_cannot_run_is_one_error(tmp_path, key, value):
    d = edited_artifact(V3, tmp_path / "m", lambda m: reconfigure(m, **{key: value}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), key)


def test_a_v2_config_that_renormalises_is_refused(tmp_path):
    """transformers' DeepseekV2 never renormalises; llama.cpp would: two models."""
    d = edited_artifact(V2, tmp_path / "m", lambda m: reconfigure(m, norm_topk_prob=True))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "config.norm_topk_prob")


def test_the_import_says_what_llamacpp_runs(tmp_path):
    for m, cls, scoring in (("v3", "DeepseekV3ForCausalLM", "sigmoid"), ("v2", "DeepseekV2ForCausalLM", "softmax")):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED[m], "--out-dir", tmp_path / m)
        assert res.returncode == 0, res.stderr
        cfg = json.loads((tmp_path / m / "config.json").read_text())
        assert (cfg["architectures"], cfg["scoring_func"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"],
                cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == ([cls], scoring, 32, 16, 8, 12)
        assert cfg["num_key_value_heads"] == cfg["num_attention_heads"] == 4
    assert json.loads((tmp_path / "v3/config.json").read_text())["rope_scaling"]["mscale_all_dim"] == pytest.approx(1.0)
    assert json.loads((tmp_path / "v2/config.json").read_text())["q_lora_rank"] is None


@pytest.mark.parametrize("drop,key", [("deepseek2.attention.key_length_mla", "deepseek2.attention.key_length_mla"),
                                      ("deepseek2.rope.scaling.yarn_log_multiplier",
                                       "deepseek2.rope.scaling.yarn_log_multiplier"),
                                      ("deepseek2.attention.q_lora_rank", "deepseek2.attention.q_lora_rank")])
def test_a_deepseek2_file_missing_a_key_is_refused(tmp_path, drop, key):
    g = rewrite_gguf(CONVERTED["v3"], tmp_path / "g.gguf", drop={drop})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, key)
    assert not (tmp_path / "m").exists()


def test_a_softmax_file_that_renormalises_is_refused(tmp_path):
    g = rewrite_gguf(CONVERTED["v2"], tmp_path / "g.gguf", kv={"deepseek2.expert_weights_norm": True})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, "deepseek2.expert_weights_norm")


def test_imatrix_has_latent_attentions_own_inputs(tmp_path):
    """q_b reads q_a's normed output (q_lora wide), kv_b the normed latent
    (kv_lora wide): entries of their own, not the attention norm's. Layer 0's
    are functions of each token alone (no attention before them): restated in
    float64 from the checkpoint, the mean squares over the calibration ids."""
    from gguf_build import hf_tensors

    ids = list(range(3, 67))
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    out = tmp_path / "im.npz"
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", V3, "--ids-file", tmp_path / "ids.txt", "--ctx", "32",
                   "-o", out)
    assert res.returncode == 0, res.stderr
    with np.load(out) as z:
        e = {k: z[k] for k in z.files}
    pre = "model.layers.0.self_attn."
    t = {k: v.astype(np.float64) for k, v in hf_tensors(GOLDEN / "hf" / "tiny-deepseek-v3").items()}
    eps = json.loads((GOLDEN / "hf/tiny-deepseek-v3/config.json").read_text())["rms_norm_eps"]
    x = _rms(t["model.embed_tokens.weight"][ids], t["model.layers.0.input_layernorm.weight"], eps)
    q = _rms(x @ t[pre + "q_a_proj.weight"].T, t[pre + "q_a_layernorm.weight"], eps)
    lat = _rms((x @ t[pre + "kv_a_proj_with_mqa.weight"].T)[:, :32], t[pre + "kv_a_layernorm.weight"], eps)
    for name, ref in (("q_b_proj", q), ("kv_b_proj", lat), ("q_a_proj", x), ("kv_a_proj_with_mqa", x)):
        np.testing.assert_allclose(e[pre + name + ".weight"], (ref * ref).mean(axis=0), rtol=2e-5, err_msg=name)
    assert e[pre + "o_proj.weight"].shape == (48,)  # 4 heads of 12 value dims


def test_q4_manifest_keeps_kv_b_float_and_the_export_takes_it(tmp_path):
    man = tmp_path / "q4_manifest.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN / "hf" / "tiny-deepseek-v3", "-o", man, "--scheme", "q8_0")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN / "hf" / "tiny-deepseek-v3", "--out-dir",
                   tmp_path / "q", "--q4-map", man)
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "q" / "model.ie.json").read_text())
    dtypes = {t["name"]: t["dtype"] for t in meta["tensors"]}
    assert dtypes["model.layers.0.self_attn.kv_b_proj.weight"] == "bf16"
    assert dtypes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == "q8_0"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "q", "--out", tmp_path / "q.gguf")
    assert res.returncode == 0, res.stderr


def test_covariances_of_latent_attentions_own_inputs_match_float64():
    """Hessians of q_b and kv_b: layer 0's q_a output and latent, RMS-normed,
    restated in float64 from the checkpoint (Σ x xᵀ / tokens); the window
    order puts them between q_a/kv_a and o (slot_rank), one budget-bound
    window each here."""
    from gguf_build import hf_tensors
    from iekit.runtime.hessians import Hessians

    t = {k: v.astype(np.float64) for k, v in hf_tensors(GOLDEN / "hf" / "tiny-deepseek-v3").items()}
    eps = json.loads((GOLDEN / "hf/tiny-deepseek-v3/config.json").read_text())["rms_norm_eps"]
    ids = list(range(3, 67))
    pre = "model.layers.0.self_attn."
    x = _rms(t["model.embed_tokens.weight"][ids], t["model.layers.0.input_layernorm.weight"], eps)
    q = _rms(x @ t[pre + "q_a_proj.weight"].T, t[pre + "q_a_layernorm.weight"], eps)
    lat = _rms((x @ t[pre + "kv_a_proj_with_mqa.weight"].T)[:, :32], t[pre + "kv_a_layernorm.weight"], eps)
    names = [pre + n + ".weight" for n in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")]
    cov = Hessians(Decoder(V3, act="f32", ctx=64), [ids], names, budget=32 * 32 * 8)
    order = cov.forward_order(list(reversed(names)))  # q_a, kv_a read the norm's output; q_b, kv_b theirs; o last
    assert set(order[:2]) == set(names[:2]) and order[2:] == names[2:]
    for name, ref in ((pre + "q_b_proj.weight", q), (pre + "kv_b_proj.weight", lat)):
        got, _ = cov.get(name)
        want = ref.T @ ref / len(ids)
        assert np.abs(got - want).max() < 2e-5 * np.abs(want).max(), name
    assert cov.get(pre + "o_proj.weight")[0].shape == (48, 48)


@pytest.mark.parametrize("sequential", [False, True])
def test_gptq_quantizes_latent_attention_and_the_export_takes_it(tmp_path, sequential):
    g = gptq_q8_0("tiny-deepseek-v3", tmp_path, sequential)
    ref = np.load(REF / "logits.npy").astype(np.float64)
    assert max_rel(_logits(g), ref) < 0.05
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", g, "--out", tmp_path / "g.gguf")
    assert res.returncode == 0, res.stderr


LITE = GOLDEN_IEBIN / "tiny-glm4-moe-lite"


def test_glm_4_7_flash_imports_with_its_mtp_layer(tmp_path):
    """A deepseek2 file that keeps an MTP layer (nextn_predict_layers) is GLM-4.7-Flash's:
    Glm4MoeLiteForCausalLM, its dense layers as mlp_layer_types, the MTP layer carried unread."""
    g = GOLDEN / "gguf" / "llamacpp" / "tiny-glm4-moe-lite.gguf"
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert (cfg["architectures"], cfg["mlp_layer_types"], cfg["num_nextn_predict_layers"], cfg["num_hidden_layers"]) \
        == (["Glm4MoeLiteForCausalLM"], ["dense", "sparse"], 1, 2)
    meta = json.loads((tmp_path / "m/model.ie.json").read_text())
    assert any(t["name"] == "model.layers.2.eh_proj.weight" for t in meta["tensors"])
    ref = np.load(GOLDEN / "ref/tiny-glm4-moe-lite/logits.npy").astype(np.float64)
    assert max_rel(np.asarray(Decoder(tmp_path / "m", act="f32").logits(IDS, start=0), np.float64), ref) < 5e-5


@pytest.mark.parametrize("types", [["dense"], ["dense", "moe"], "dense"])
def test_mlp_layer_types_of_the_wrong_shape_are_one_error(tmp_path, types):
    d = edited_artifact(LITE, tmp_path / "m", lambda m: reconfigure(m, mlp_layer_types=types))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "config.mlp_layer_types")


def test_export_refuses_dense_layers_after_routed_ones(tmp_path):
    """llama.cpp's deepseek2 has dense layers only before the first with experts."""
    import shutil

    from safetensors.numpy import save_file

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN / "hf" / "tiny-glm4-moe-lite", hf)
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(mlp_layer_types=["sparse", "dense"])
    (hf / "config.json").write_text(json.dumps(cfg))
    from gguf_build import hf_tensors

    t = hf_tensors(GOLDEN / "hf" / "tiny-glm4-moe-lite")
    swap = {k.replace("layers.0.", "layers.9."): v for k, v in t.items() if k.startswith("model.layers.0.mlp.")}
    t = {k: v for k, v in t.items() if not k.startswith("model.layers.0.mlp.")}
    t.update({k.replace("layers.1.", "layers.0."): v for k, v in t.items() if k.startswith("model.layers.1.mlp.")})
    t = {k: v for k, v in t.items() if not k.startswith("model.layers.1.mlp.")}
    t.update({k.replace("layers.9.", "layers.1."): v for k, v in swap.items()})
    (hf / "model.safetensors").unlink()
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, str(hf / "model.safetensors"))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "m", "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.mlp_layer_types")
