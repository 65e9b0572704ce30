"""Qwen2.5-VL and Qwen2-VL (Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration; llama.cpp's
qwen2vl): Qwen2's language model under MRoPE over rotate-half pairs beside a vision model. Text positions are the
same on MRoPE's three axes, so they turn as one RoPE: the text model is a Qwen2ForCausalLM. golden/hf/tiny-qwen2-vl
holds tiny-qwen2's language model (its generator checks transformers' text logits are tiny-qwen2's) as
transformers 5 saves it: the Hub's tensor names (model.*, visual.*) under a text_config; the Hub's own configs are
flat. golden/gguf/llamacpp/tiny-qwen2-vl.gguf is what llama.cpp's converter writes of it (its MRoPE sections checked as
Qwen3-VL's: tests/test_qwen3_vl.py)."""

from __future__ import annotations

import json
import shutil

from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool, text_model_converted

LLAMACPP = GOLDEN_HF.parent / "gguf" / "llamacpp"
SRC = GOLDEN_HF / "tiny-qwen2-vl"


def _text_model_bytes(src, tmp_path) -> bytes:
    for args in (("text-model", "--hf-dir", src, "--out-dir", tmp_path / "t"),
                 ("hf-to-iebin", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")):
        res = run_tool("ieconv", *args, "-q")
        assert res.returncode == 0, res.stderr
    return (tmp_path / "ie" / "model.ie.bin").read_bytes()


def test_the_text_model_of_qwen2_5_vl_is_qwen2(tmp_path):
    """ieconv text-model writes a Qwen2ForCausalLM without MRoPE's keys, tied as the composite config says, its
    defaults transformers' own (frozen by the generator); converted, it is tiny-qwen2's artifact, byte for byte."""
    from iekit.convert import text_model

    src = json.loads((SRC / "config.json").read_text())
    assert src["text_config"]["rope_parameters"]["mrope_section"] == [2, 3, 3]
    cfg, ie = text_model_converted("tiny-qwen2-vl", tmp_path, ("qwen2-5-vl-text-defaults.json",
                                                               text_model.QWEN2_5_VL_TEXT_DEFAULTS,
                                                               text_model.QWEN2_5_VL_ROPE_DEFAULTS))
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert cfg["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert cfg["tie_word_embeddings"] is True and cfg["use_sliding_window"] is False
    assert (ie / "model.ie.bin").read_bytes() == (GOLDEN_IEBIN / "tiny-qwen2" / "model.ie.bin").read_bytes()


def _flat(tmp_path):
    """tiny-qwen2-vl with its config as the Hub's Qwen2.5-VL configs say it: the text keys at the top level beside
    vision_config, MRoPE as rope_scaling {"type": "mrope"}, rope_theta beside it."""
    d = tmp_path / "flat"
    shutil.copytree(SRC, d)
    cfg = json.loads((d / "config.json").read_text())
    text = cfg.pop("text_config")
    rope = text.pop("rope_parameters")
    cfg.update({k: v for k, v in text.items() if k not in ("model_type", "bos_token_id", "eos_token_id")},
               rope_theta=rope["rope_theta"], rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_the_hubs_flat_config_gives_the_same_text_model(tmp_path):
    """The Hub's Qwen2-VL and Qwen2.5-VL configs are flat (transformers builds text_config from the top level):
    the same text model, byte for byte; as a Qwen2VLForConditionalGeneration too (the same language model)."""
    d = _flat(tmp_path)
    want = (GOLDEN_IEBIN / "tiny-qwen2" / "model.ie.bin").read_bytes()
    assert _text_model_bytes(d, tmp_path / "a") == want
    cfg = json.loads((tmp_path / "a/t/config.json").read_text())
    assert "rope_scaling" not in cfg and cfg["rope_theta"] == 10000.0 and "vision_config" not in cfg
    v2 = json.loads((d / "config.json").read_text())
    v2.update(architectures=["Qwen2VLForConditionalGeneration"], model_type="qwen2_vl")
    (d / "config.json").write_text(json.dumps(v2))
    assert _text_model_bytes(d, tmp_path / "b") == want


def test_a_tensor_of_neither_part_is_one_line(tmp_path):
    """A tensor outside the language model and the vision tower is refused, not dropped."""
    import numpy as np
    from safetensors.numpy import save_file

    from iekit.formats.safetensors_reader import SafetensorsFile

    d = tmp_path / "extra"
    shutil.copytree(SRC, d)
    save_file({"audio.proj.weight": np.zeros((2, 2), "float32")}, str(d / "extra.safetensors"))
    with SafetensorsFile(d / "model.safetensors") as sf:
        index = {"metadata": {}, "weight_map": {n: "model.safetensors" for n in sf.tensors}}
    index["weight_map"]["audio.proj.weight"] = "extra.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_one_line_error(run_tool("ieconv", "text-model", "--hf-dir", d, "--out-dir", tmp_path / "t"),
                          "audio.proj.weight")


def test_llamacpps_qwen2vl_file_imports_as_its_qwen2_file(tmp_path):
    """The converter's qwen2vl file of the language model (rope.dimension_sections beside Qwen2's keys) imports to
    the artifact its qwen2 file of the same weights does, byte for byte; the export writes it as llama.cpp's qwen2."""
    for name in ("tiny-qwen2-vl", "tiny-qwen2"):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", LLAMACPP / f"{name}.gguf", "--out-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "tiny-qwen2-vl/model.ie.bin").read_bytes() == (tmp_path / "tiny-qwen2/model.ie.bin").read_bytes()
    assert json.loads((tmp_path / "tiny-qwen2-vl/config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "tiny-qwen2-vl", "--out", tmp_path / "o.gguf")
    assert res.returncode == 0, res.stderr
    from iekit.formats.gguf_file import open_gguf

    assert open_gguf(tmp_path / "o.gguf").fields["general.architecture"] == "qwen2"
