"""GLM-4.1V and GLM-4.6V-Flash (Glm4vForConditionalGeneration): GLM-4's
language model under MRoPE beside a vision model. Text positions turn it as
GLM-4's one RoPE, so the text model is a Glm4ForCausalLM; llama.cpp's
converter writes it as glm4 with rope.dimension_sections and each head's
rotated q/k rows in NeoX's order. golden/hf/tiny-glm4-vl holds tiny-glm4's
language model (its generator checks transformers' text logits are
tiny-glm4's)."""

from __future__ import annotations

import json

from conftest import GOLDEN_HF, GOLDEN_IEBIN, run_tool

from iekit.convert import text_model

LLAMACPP = GOLDEN_HF.parent / "gguf" / "llamacpp"


def test_the_text_model_of_glm4v_is_glm4(tmp_path):
    """A Glm4ForCausalLM told what Glm4vTextModel's code fixes (heads hidden / heads wide, q/k/v biases), MRoPE's
    keys left out, its defaults transformers' own (frozen by the generator); converted, tiny-glm4's artifact,
    byte for byte."""
    theirs = json.loads((GOLDEN_HF.parent / "ref" / "glm4-vl-text-defaults.json").read_text())
    assert {k: theirs[k] for k in text_model.GLM4V_TEXT_DEFAULTS} == text_model.GLM4V_TEXT_DEFAULTS
    assert text_model.GLM4V_ROPE_DEFAULTS == {"rope_parameters": theirs["rope_parameters"]}
    res = run_tool("ieconv", "text-model", "-q", "--hf-dir", GOLDEN_HF / "tiny-glm4-vl", "--out-dir", tmp_path / "t")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "t/config.json").read_text())
    assert cfg["architectures"] == ["Glm4ForCausalLM"] and cfg["model_type"] == "glm4"
    assert (cfg["head_dim"], cfg["attention_bias"]) == (16, True)
    assert cfg["rope_parameters"] == {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ie/model.ie.bin").read_bytes() == (GOLDEN_IEBIN / "tiny-glm4" / "model.ie.bin").read_bytes()


def test_glm4v_turns_the_whole_head_where_its_config_says_no_factor():
    """Glm4vTextRotaryEmbedding's partial_rotary_factor defaults to 1.0, Glm4Config's to 0.5: the text model is
    told the former; a stated factor is kept."""
    part = text_model.MULTIMODAL["Glm4vForConditionalGeneration"][0]
    bare = {"text_config": {"model_type": "glm4v_text", "hidden_size": 64, "num_attention_heads": 4}}
    assert text_model.text_config(bare, part, "c")["rope_parameters"]["partial_rotary_factor"] == 1.0
    stated = {"text_config": {**bare["text_config"], "rope_parameters": {"rope_type": "default", "rope_theta": 5.0,
                                                                         "partial_rotary_factor": 0.5,
                                                                         "mrope_section": [8, 12, 12]}}}
    assert text_model.text_config(stated, part, "c")["rope_parameters"] == {
        "rope_type": "default", "rope_theta": 5.0, "partial_rotary_factor": 0.5}


def test_llamacpps_glm4v_file_imports_as_its_glm4_file(tmp_path):
    """The converter's file of GLM-4V's language model (glm4 with rope.dimension_sections, the rotated q/k rows and
    biases in NeoX's order) imports to the artifact its glm4 file of the same weights does, byte for byte."""
    for name in ("tiny-glm4-vl", "tiny-glm4"):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", LLAMACPP / f"{name}.gguf", "--out-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "tiny-glm4-vl/model.ie.bin").read_bytes() == (tmp_path / "tiny-glm4/model.ie.bin").read_bytes()
