"""A model the decoder would compute differently from its source is refused,
never run (issue 45, items 2 and 3).

transformers applies every tensor a checkpoint has and every value its
config states; the decoder reads ``model.ie.json``'s ``model`` summary and
the tensors it knows. So: a tensor it would not read (MLP biases) is a
refusal naming it, from HF and GGUF sources alike, and a ``model`` value
that is not what the stored config says (an edited rope_theta) is invalid
IEBIN, refused by ``validate`` and by the runtime.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from gguf_build import gguf_from_hf, hf_tensors
from llamacpp_models import _hf_variant

LLAMA = GOLDEN_IEBIN / "tiny-llama"


def _with_mlp_biases(tmp_path, config_says: bool, model: str = "tiny-llama"):
    t = hf_tensors(GOLDEN_HF / model)
    rng = np.random.default_rng(3)
    for name in [n for n in t if ".mlp." in n]:
        t[name.replace(".weight", ".bias")] = rng.normal(0, 0.5, t[name].shape[0]).astype(np.float32)
    return _hf_variant(tmp_path, model, {"mlp_bias": True} if config_says else {}, t)


@pytest.mark.parametrize("config_says", [True, False])
def test_mlp_biases_are_refused_not_ignored(tmp_path, config_says):
    """The old decoder ran these with logits equal to the bias-free model's."""
    hf = _with_mlp_biases(tmp_path, config_says)
    out = tmp_path / "m"
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", out, "-q")
    assert res.returncode == 0, res.stderr  # every tensor is carried: the artifact is the checkpoint
    assert "ierun cannot run this model" in res.stderr
    needle = "config.mlp_bias" if config_says else "mlp.down_proj.bias"
    assert needle in res.stderr
    run = run_tool("ierun", "logits", "--model-dir", out, "--ids", "1,2", "--out", tmp_path / "l.npy")
    assert_one_line_error(run, str(out / "model.ie.json"), needle)
    assert not (tmp_path / "l.npy").exists()


@pytest.mark.parametrize("qc", [{"quant_method": "fp8", "weight_block_size": [128, 128]}, {"quant_method": "awq"},
                                "gptq"])
def test_a_quantization_config_the_decoder_does_not_apply_is_refused(tmp_path, qc):
    """transformers quantizes float weights on load per quantization_config
    (fp8 with pre_quantized false, bitsandbytes); the decoder would have run
    them as floats. Converted as tensors, refused by ierun and rotate."""
    hf = _hf_variant(tmp_path, "tiny-llama", {"quantization_config": qc}, hf_tensors(GOLDEN_HF / "tiny-llama"))
    out = tmp_path / "m"
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", out, "-q")
    assert res.returncode == 0 and "ierun cannot run this model" in res.stderr, res.stderr
    run = run_tool("ierun", "generate", "--model-dir", out, "--ids", "1", "--max-new", "1")
    method = qc["quant_method"] if isinstance(qc, dict) else qc
    assert_one_line_error(run, str(out / "model.ie.json"), "config.quantization_config", repr(method))
    res = run_tool("ieconv", "rotate", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "rot")
    assert_one_line_error(res, "config.json", "quantization_config", "cannot be rotated")
    assert not (tmp_path / "rot").exists()


def test_gguf_biases_the_decoder_has_no_use_for_are_refused(tmp_path):
    """ffn_*.bias has no place in the import (refused there); output.bias
    imports as lm_head.bias, which the old decoder carried and ignored."""
    g = gguf_from_hf(_with_mlp_biases(tmp_path, False), tmp_path / "b.gguf")
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", g, "--out-dir", tmp_path / "b", "-q")
    assert_one_line_error(res, "blk.0.ffn_down.bias", "cannot be carried over")
    t = hf_tensors(GOLDEN_HF / "tiny-llama")
    t["lm_head.bias"] = np.full(t["lm_head.weight"].shape[0], 0.25, np.float32)
    g = gguf_from_hf(_hf_variant(tmp_path / "o", "tiny-llama", {}, t), tmp_path / "o.gguf")
    out = tmp_path / "m"
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", g, "--out-dir", out, "-q")
    assert res.returncode == 0 and "ierun cannot run this model" in res.stderr, res.stderr
    run = run_tool("ierun", "generate", "--model-dir", out, "--ids", "1", "--max-new", "1")
    assert_one_line_error(run, "lm_head.bias", "does not use it")


def test_an_unknown_tensor_is_refused(tmp_path):
    t = hf_tensors(GOLDEN_HF / "tiny-llama")
    t["model.final_logit_softcap"] = np.ones(4, np.float32)
    d = tmp_path / "m"
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", _hf_variant(tmp_path, "tiny-llama", {}, t), "--out-dir", d, "-q")
    assert res.returncode == 0 and "model.final_logit_softcap" in res.stderr, res.stderr
    assert run_tool("ieconv", "validate", d).returncode == 0
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "model.final_logit_softcap", "does not use it")


@pytest.mark.parametrize("key,value", [("rope_theta", 20000.0), ("norm_eps", 1e-3), ("vocab_size", 300),
                                       ("eos_token_id", 5)])
def test_a_model_value_that_disagrees_with_the_config_is_invalid(tmp_path, key, value):
    """Edited in ``model`` alone, each of these changed the logits and passed `validate --deep`."""
    d = edited_artifact(LLAMA, tmp_path / "m", lambda m: m["model"].update({key: value}))
    for args in (["validate", d], ["validate", "--deep", d], ["inspect", d]):
        assert_one_line_error(run_tool("ieconv", *args), str(d / "model.ie.json"), f"model.{key}", "disagrees")
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), f"model.{key}")


def test_the_same_change_made_in_both_is_another_model_and_runs(tmp_path):
    d = edited_artifact(LLAMA, tmp_path / "m", lambda m: reconfigure(m, rope_theta=20000.0))
    assert run_tool("ieconv", "validate", d).returncode == 0
    a = run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2,3", "--out", tmp_path / "a.npy")
    b = run_tool("ierun", "logits", "--model-dir", LLAMA, "--ids", "1,2,3", "--out", tmp_path / "b.npy")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert not np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_a_tensor_whose_shape_the_config_contradicts_is_refused(tmp_path, source):
    """transformers refuses such a checkpoint ("size mismatch") and llama.cpp
    such a file; the conversion wrote the artifact, which failed only when
    run. Now: one line naming the tensor and the shape the config implies,
    nothing written."""
    t = hf_tensors(GOLDEN_HF / "tiny-llama")
    name = "model.layers.1.mlp.up_proj.weight"
    t[name] = t[name][:64].copy()  # 64 of its 128 rows
    hf = _hf_variant(tmp_path, "tiny-llama", {}, t)
    out = tmp_path / "m"
    if source == "hf":
        res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", out, "-q")
    else:
        res = run_tool("ieconv", "gguf-to-iebin", "--gguf", gguf_from_hf(hf, tmp_path / "m.gguf"), "--out-dir", out,
                       "-q")
    assert_one_line_error(res, name, "[64, 64]", "the config implies [128, 64]")
    assert not out.exists()
