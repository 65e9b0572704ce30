"""Apertus (8B, 70B: ApertusForCausalLM, llama.cpp's apertus): Llama's layer under its own norm names, per-head q/k
norms, an MLP of up, xIELU and down without a gate whose four parameters each layer learns (and llama.cpp's
converter stores as keys, xielu.*, not tensors), Llama-3 RoPE scaling by default. The frozen transformers logits
are tests/test_decoder.py's and the converter's file tests/test_llamacpp_converter.py's; here, that the
per-layer parameters act and come back from the keys, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      max_rel, reconfigure, run_tool)
from gguf_build import hf_tensors, rewrite_gguf
from llamacpp_models import _hf_variant

from iekit.formats.hf_config import model_summary

APERTUS = GOLDEN_IEBIN / "tiny-apertus"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-apertus.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-apertus" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-apertus" / "logits.npy").astype(np.float64)
XIELU = ("alpha_p", "alpha_n", "beta", "eps")




def _converted(tmp_path, tensors: dict[str, np.ndarray], name: str = "edited"):
    """The golden checkpoint with ``tensors`` replaced (as f32), converted: its artifact."""
    t = hf_tensors(GOLDEN_HF / "tiny-apertus")
    t.update(tensors)
    out = tmp_path / name
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir",
                   _hf_variant(tmp_path, "tiny-apertus", {"dtype": "float32"}, t), "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.parametrize("param", XIELU)
def test_each_layers_own_xielu_parameter_is_read(tmp_path, param):
    """The second layer given the first's value of one parameter is another model: each of the four is read per
    layer (eps too: the golden's second layer cuts expm1's argument at -0.5)."""
    t = hf_tensors(GOLDEN_HF / "tiny-apertus")
    key = f"model.layers.{{}}.mlp.act_fn.{param}"
    same = _converted(tmp_path, {key.format(1): t[key.format(0)].astype(np.float32)})
    assert max_rel(exact_logits(same, IDS, tmp_path / "l.npy"), REF) > 1e-3


def test_llamacpps_keys_come_back_as_the_checkpoints_tensors(tmp_path):
    """The converter keeps the parameters as float32 arrays over the layers (raw, before softplus); the import makes
    each layer's tensors of them again (alpha_p, alpha_n [1]; beta, eps of no dimension), transformers' values; a
    key holding one number (llama.cpp's get_key_or_arr reads it for every layer) is that value in each layer."""
    import gguf

    kv = {k: v.contents() for k, v in gguf.GGUFReader(str(CONVERTED)).fields.items()}
    t = hf_tensors(GOLDEN_HF / "tiny-apertus")
    for p in XIELU:
        assert kv[f"xielu.{p}"] == [float(np.float32(t[f"model.layers.{i}.mlp.act_fn.{p}"]).reshape(-1)[0])
                                    for i in range(2)]
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "m/model.ie.json").read_text())
    shapes = {e["name"]: e["shape"] for e in meta["tensors"] if ".act_fn." in e["name"]}
    assert shapes == {f"model.layers.{i}.mlp.act_fn.{p}": [1] if p.startswith("alpha") else []
                      for i in range(2) for p in XIELU}
    one = rewrite_gguf(CONVERTED, tmp_path / "one.gguf", drop={"xielu.beta"}, kv={"xielu.beta": 0.25})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", one, "--out-dir", tmp_path / "one")
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "one/model.ie.json").read_text())
    raw = (tmp_path / "one/model.ie.bin").read_bytes()
    beta = [e for e in meta["tensors"] if e["name"].endswith("act_fn.beta")]
    assert [np.frombuffer(raw[e["file_data_offset"]:e["file_data_offset"] + 4], np.float32)[0] for e in beta] == \
        [0.25, 0.25] and all(e["dtype"] == "f32" for e in beta)


@pytest.mark.parametrize("kv, drop, needles", [
    ({}, {"xielu.eps"}, ("xielu.eps", "is missing", "apertus")),
    ({"xielu.alpha_p": [0.5, 0.5, 0.5]}, {"xielu.alpha_p"}, ("xielu.alpha_p", "array of 2 numbers")),
    ({"xielu.beta": [0.5, float("nan")]}, {"xielu.beta"}, ("xielu.beta", "nan", "layer 1")),
    ({"xielu.alpha_n": "0.5"}, {"xielu.alpha_n"}, ("xielu.alpha_n", "array of 2 numbers")),
])
def test_a_bad_xielu_key_is_one_line(tmp_path, kv, drop, needles):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=drop, kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, str(bad), *needles)
    assert not (tmp_path / "m").exists()


def test_xielu_keys_beside_another_architecture_are_refused(tmp_path):
    """A llama file with xielu.* keys would run another unit than the one they describe: refused, naming the key."""
    src = GOLDEN / "gguf" / "llamacpp" / "tiny-qwen3.gguf"
    bad = rewrite_gguf(src, tmp_path / "bad.gguf", kv={"xielu.beta": [0.5, 0.5]})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m"),
                          "xielu.beta", "Qwen3ForCausalLM")


def test_a_missing_xielu_tensor_is_one_line(tmp_path):
    d = edited_artifact(APERTUS, tmp_path / "m", lambda m: m.update(
        tensors=[t for t in m["tensors"] if t["name"] != "model.layers.1.mlp.act_fn.eps"]))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1", "--max-new", "1"),
                          "model.layers.1.mlp.act_fn.eps", "missing")


def test_xielu_in_a_gated_mlp_is_refused(tmp_path):
    """xIELU is Apertus's unit without a gate; a Llama (gated MLP) configured with it is no model the decoder runs."""
    d = edited_artifact(GOLDEN_IEBIN / "tiny-llama", tmp_path / "m", lambda m: reconfigure(m, hidden_act="xielu"))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1", "--max-new", "1"),
                          "hidden_act", "xielu")


def test_a_config_without_rope_settings_takes_apertus_llama3_default():
    """ApertusConfig scales RoPE as Llama 3.1 (factor 8 over 8192 positions, base 12e6) unless the config says
    otherwise: a config.json stating neither rope_scaling nor rope_parameters means that, not plain RoPE."""
    cfg = json.loads((GOLDEN_HF / "tiny-apertus" / "config.json").read_text())
    del cfg["rope_parameters"]
    s = model_summary(cfg)
    assert s["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    assert model_summary(cfg)["rope_scaling"] is None


def test_an_untied_head_is_exported_and_a_tied_one_refused(tmp_path):
    """llama.cpp's apertus loads output.weight and nothing else: a tied Apertus cannot be written for it."""
    d = edited_artifact(APERTUS, tmp_path / "m", lambda m: (
        m.update(tensors=[t for t in m["tensors"] if t["name"] != "lm_head.weight"]),
        reconfigure(m, tie_word_embeddings=True)))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "apertus")
