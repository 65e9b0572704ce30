"""GLM-4.1V and GLM-4.6V-Flash (Glm4vForConditionalGeneration): GLM-4's
language model under MRoPE beside a vision model. Text positions turn it as
GLM-4's one RoPE, so the text model is a Glm4ForCausalLM; llama.cpp's
converter writes it as glm4 with rope.dimension_sections and each head's
rotated q/k rows in NeoX's order. golden/hf/tiny-glm4-vl holds tiny-glm4's
language model (its generator checks transformers' text logits are
tiny-glm4's)."""

from __future__ import annotations

import json

import numpy as np
from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool, text_model_converted
from gguf_build import rewrite_gguf

from iekit.convert import text_model
from iekit.runtime.decoder import Decoder

LLAMACPP = GOLDEN_HF.parent / "gguf" / "llamacpp"


def test_the_text_model_of_glm4v_is_glm4(tmp_path):
    """A Glm4ForCausalLM told what Glm4vTextModel's code fixes (heads hidden / heads wide, q/k/v biases), MRoPE's
    keys left out, its defaults transformers' own (frozen by the generator); converted, tiny-glm4's artifact,
    byte for byte."""
    cfg, ie = text_model_converted("tiny-glm4-vl", tmp_path, ("glm4-vl-text-defaults.json",
                                                              text_model.GLM4V_TEXT_DEFAULTS,
                                                              text_model.GLM4V_ROPE_DEFAULTS))
    assert cfg["architectures"] == ["Glm4ForCausalLM"] and cfg["model_type"] == "glm4"
    assert (cfg["head_dim"], cfg["attention_bias"]) == (16, True)
    assert cfg["rope_parameters"] == {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}
    assert (ie / "model.ie.bin").read_bytes() == (GOLDEN_IEBIN / "tiny-glm4" / "model.ie.bin").read_bytes()


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


def _moe_ref_error(model_dir) -> float:
    """The largest error of the decoder's logits against transformers' of the multimodal model on text, relative to
    the largest logit."""
    ref_dir = GOLDEN_HF.parent / "ref" / "tiny-glm4-vl-moe"
    ref = np.load(ref_dir / "logits.npy").astype(np.float64)
    got = Decoder(model_dir, act="f32").logits(json.loads((ref_dir / "ids.json").read_text()))
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def test_the_text_model_of_glm4v_moe_is_glm4_moe(tmp_path):
    """A Glm4MoeForCausalLM without q/k norms, MRoPE's keys left out, its defaults transformers' Glm4vMoeTextConfig's
    (frozen by the generator), untied as the multimodal config says; converted, it runs as transformers runs the
    multimodal model on text."""
    cfg, ie = text_model_converted("tiny-glm4-vl-moe", tmp_path, ("glm4-vl-moe-text-defaults.json",
                                                                  text_model.GLM4V_MOE_TEXT_DEFAULTS,
                                                                  text_model.GLM4V_MOE_ROPE_DEFAULTS))
    assert cfg["architectures"] == ["Glm4MoeForCausalLM"] and cfg["model_type"] == "glm4_moe"
    assert (cfg["use_qk_norm"], cfg["tie_word_embeddings"], cfg["routed_scaling_factor"]) == (False, False, 2.5)
    assert cfg["rope_parameters"] == {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}
    assert _moe_ref_error(ie) < 1e-5


def test_glm4v_moe_never_norms_q_and_k():
    """Glm4vMoeTextAttention has no q/k norms: a text_config asking for them (Glm4MoeConfig's key) is told no."""
    part = text_model.MULTIMODAL["Glm4vMoeForConditionalGeneration"][0]
    asked = {"text_config": {"model_type": "glm4v_moe_text", "use_qk_norm": True}}
    assert text_model.text_config(asked, part, "c")["use_qk_norm"] is False


def test_llamacpps_glm4v_moe_file_imports_as_the_model_and_exports_back(tmp_path):
    """llama.cpp's glm4moe file of the language model (rope.dimension_sections, rows as they are) imports as a
    Glm4MoeForCausalLM that runs as transformers runs the multimodal model on text; iebin-to-gguf of the text
    model writes the converter's tensors byte for byte and its keys but the sections (text turns by one RoPE,
    which llama.cpp's glm4moe runs without them)."""
    import gguf

    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", LLAMACPP / "tiny-glm4-vl-moe.gguf", "--out-dir",
                   tmp_path / "m")
    assert res.returncode == 0, res.stderr
    assert _moe_ref_error(tmp_path / "m") < 1e-5
    for args in (("text-model", "--hf-dir", GOLDEN_HF / "tiny-glm4-vl-moe", "--out-dir", tmp_path / "t"),
                 ("hf-to-iebin", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie"),
                 ("iebin-to-gguf", "--model-dir", tmp_path / "ie", "--out", tmp_path / "ours.gguf")):
        res = run_tool("ieconv", *args, "-q")
        assert res.returncode == 0, res.stderr
    theirs, ours = (gguf.GGUFReader(str(p)) for p in (LLAMACPP / "tiny-glm4-vl-moe.gguf", tmp_path / "ours.gguf"))
    tt, to = {t.name: t for t in theirs.tensors}, {t.name: t for t in ours.tensors}
    assert sorted(tt) == sorted(to)
    for n, t in tt.items():
        assert (t.tensor_type, list(t.shape), t.data.tobytes()) == (to[n].tensor_type, list(to[n].shape),
                                                                      to[n].data.tobytes()), n
    kv_ours = {k: f.contents() for k, f in ours.fields.items()}
    missing = {k for k, f in theirs.fields.items() if not k.startswith(("GGUF.", "general.")) and
               kv_ours.get(k) != f.contents()}
    assert missing == {"glm4moe.rope.dimension_sections"}


def test_glm4moe_sections_text_would_not_turn_as_one_rope_are_one_line(tmp_path):
    """A fourth MRoPE section turns by a position text tokens do not share: refused in one line naming the key."""
    bad = rewrite_gguf(LLAMACPP / "tiny-glm4-vl-moe.gguf", tmp_path / "bad.gguf",
                       drop={"glm4moe.rope.dimension_sections"}, kv={"glm4moe.rope.dimension_sections": [2, 1, 0, 1]})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"),
                          "glm4moe.rope.dimension_sections")
    assert not (tmp_path / "m").exists()
