"""Qwen3-VL 2B to 32B (Qwen3VLForConditionalGeneration; llama.cpp's qwen3vl):
Qwen3's language model under interleaved MRoPE beside a vision model. Text
positions are the same on MRoPE's three axes, so they turn as one RoPE: the
text model is a Qwen3ForCausalLM. golden/hf/tiny-qwen3-vl holds tiny-qwen3's
language model (its generator checks transformers' text logits are
tiny-qwen3's); golden/gguf/llamacpp/tiny-qwen3-vl.gguf is what llama.cpp's
converter writes of it. Qwen3-VL-30B-A3B and 235B-A22B
(Qwen3VLMoeForConditionalGeneration; qwen3vlmoe) likewise hold a
Qwen3MoeForCausalLM, its experts stored as [experts, in, out] stacks:
golden/hf/tiny-qwen3-vl-moe, with transformers' own logits on text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, max_rel, run_tool, text_model_converted
from gguf_build import hf_tensors, rewrite_gguf

from iekit.runtime.decoder import Decoder

LLAMACPP = GOLDEN_HF.parent / "gguf" / "llamacpp"


def test_the_text_model_of_qwen3_vl_is_qwen3(tmp_path):
    """ieconv text-model writes a Qwen3ForCausalLM without MRoPE's keys, its defaults transformers' own (frozen by
    the generator); converted, it is tiny-qwen3's artifact, byte for byte."""
    from iekit.convert import text_model

    src = json.loads((GOLDEN_HF / "tiny-qwen3-vl" / "config.json").read_text())
    assert src["text_config"]["rope_parameters"]["mrope_section"] == [6, 5, 5]
    cfg, ie = text_model_converted("tiny-qwen3-vl", tmp_path, ("qwen3-vl-text-defaults.json",
                                                               text_model.QWEN3_VL_TEXT_DEFAULTS,
                                                               text_model.QWEN3_VL_ROPE_DEFAULTS))
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert cfg["tie_word_embeddings"] is False
    assert (ie / "model.ie.bin").read_bytes() == (GOLDEN_IEBIN / "tiny-qwen3" / "model.ie.bin").read_bytes()


def test_llamacpps_qwen3vl_file_imports_as_its_qwen3_file(tmp_path):
    """The converter's qwen3vl file of the language model (its rope.dimension_sections and n_deepstack_layers
    beside Qwen3's keys) imports to the artifact its qwen3 file of the same weights does, byte for byte; the
    export writes it as llama.cpp's qwen3, which runs it as qwen3vl runs text."""
    for name in ("tiny-qwen3-vl", "tiny-qwen3"):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", LLAMACPP / f"{name}.gguf", "--out-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "tiny-qwen3-vl/model.ie.bin").read_bytes() == (tmp_path / "tiny-qwen3/model.ie.bin").read_bytes()
    assert json.loads((tmp_path / "tiny-qwen3-vl/config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


@pytest.mark.parametrize("name,arch", [("tiny-qwen3-vl", "qwen3vl"), ("tiny-qwen2-vl", "qwen2vl")])
@pytest.mark.parametrize("sections", [[6, 5, 4, 1], "6,5,5"])
def test_mrope_sections_text_would_not_turn_as_one_rope_are_one_line(tmp_path, name, arch, sections):
    """A fourth section (positions 0 in llama.cpp's text batches) or sections that are no list of integers
    (Qwen3-VL's interleaved MRoPE, Qwen2.5-VL's: tests/test_qwen2_vl.py)."""
    key = f"{arch}.rope.dimension_sections"
    bad = rewrite_gguf(LLAMACPP / f"{name}.gguf", tmp_path / "bad.gguf", drop={key}, kv={key: sections})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), key)
    assert not (tmp_path / "m").exists()




def test_the_text_model_of_qwen3_vl_moe_is_qwen3_moe(tmp_path):
    """A Qwen3MoeForCausalLM whose router renormalises (Qwen3-VL-MoE's always does), tied as the multimodal config
    says, each expert's gate, up and down matrix the [out, in] transpose of its slice of the stacks (numpy's);
    converted, it runs as transformers runs the multimodal model on text."""
    from iekit.convert import text_model

    theirs = json.loads((GOLDEN_HF.parent / "ref" / "qwen3-vl-moe-text-defaults.json").read_text())
    table = text_model.QWEN3_VL_MOE_TEXT_DEFAULTS
    assert {k: theirs[k] for k in table} == table
    res = run_tool("ieconv", "text-model", "-q", "--hf-dir", GOLDEN_HF / "tiny-qwen3-vl-moe", "--out-dir", tmp_path / "t")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "t/config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["norm_topk_prob"] is True and cfg["tie_word_embeddings"] is True
    assert "mrope_section" not in cfg["rope_parameters"]
    src, got = hf_tensors(GOLDEN_HF / "tiny-qwen3-vl-moe"), hf_tensors(tmp_path / "t")
    inter = cfg["moe_intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        stack = src[f"model.language_model.layers.{i}.mlp.experts.gate_up_proj"]  # [experts, hidden, 2 inter]
        down = src[f"model.language_model.layers.{i}.mlp.experts.down_proj"]  # [experts, inter, hidden]
        assert stack.shape == (4, 64, 2 * inter) and down.shape == (4, inter, 64)
        for e in range(4):
            pre = f"model.layers.{i}.mlp.experts.{e}."
            assert np.array_equal(got[pre + "gate_proj.weight"], stack[e, :, :inter].T)
            assert np.array_equal(got[pre + "up_proj.weight"], stack[e, :, inter:].T)
            assert np.array_equal(got[pre + "down_proj.weight"], down[e].T)
    assert not any(".experts.gate_up_proj" in n or ".experts.down_proj" in n for n in got)
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr
    ref_dir = GOLDEN_HF.parent / "ref" / "tiny-qwen3-vl-moe"
    ids = json.loads((ref_dir / "ids.json").read_text())
    assert max_rel(Decoder(tmp_path / "ie", act="f32").logits(ids), np.load(ref_dir / "logits.npy")) < 1e-5


def test_llamacpps_qwen3vlmoe_file_imports_as_the_model(tmp_path):
    """llama.cpp's qwen3vlmoe file of the language model imports as a Qwen3MoeForCausalLM that runs as
    transformers runs the multimodal model on text; its export is llama.cpp's qwen3moe."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", LLAMACPP / "tiny-qwen3-vl-moe.gguf", "--out-dir",
                   tmp_path / "m")
    assert res.returncode == 0, res.stderr
    ref_dir = GOLDEN_HF.parent / "ref" / "tiny-qwen3-vl-moe"
    ids = json.loads((ref_dir / "ids.json").read_text())
    assert max_rel(Decoder(tmp_path / "m", act="f32").logits(ids), np.load(ref_dir / "logits.npy")) < 1e-5
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "m", "--out", tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    assert gguf.GGUFReader(tmp_path / "m.gguf").fields["general.architecture"].contents() == "qwen3moe"


def test_an_expert_stack_of_the_wrong_shape_is_one_line(tmp_path):
    """A gate_up_proj whose columns are no gate and up of one width: one line naming it, nothing written."""
    import shutil

    from test_hf_fp8 import _tensors, _write

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-qwen3-vl-moe", hf)
    t = _tensors(hf / "model.safetensors")
    t["model.language_model.layers.0.mlp.experts.gate_up_proj"] = ("F32", [4, 64, 47], bytes(4 * 64 * 47 * 4))
    _write(hf / "model.safetensors", t)
    assert_one_line_error(run_tool("ieconv", "text-model", "--hf-dir", hf, "--out-dir", tmp_path / "t"),
                          "layers.0.mlp.experts.gate_up_proj")
    assert not (tmp_path / "t").exists()


def test_transformers_own_stack_layout_reads_as_the_hubs(tmp_path):
    """transformers 5.23's save_pretrained writes the stacks as it holds them, [experts, out, in] (a fine-tune
    saved with it): the text model is the Hub layout's, byte for byte."""
    import shutil

    from test_hf_fp8 import _tensors, _write

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-qwen3-vl-moe", hf)
    t = _tensors(hf / "model.safetensors")
    for k in [k for k in t if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        dtype, shape, raw = t[k]
        t[k] = (dtype, [shape[0], shape[2], shape[1]],
                np.frombuffer(raw, np.uint16).reshape(shape).transpose(0, 2, 1).tobytes())
    _write(hf / "model.safetensors", t)
    for src, out in ((GOLDEN_HF / "tiny-qwen3-vl-moe", tmp_path / "hub"), (hf, tmp_path / "own")):
        res = run_tool("ieconv", "text-model", "-q", "--hf-dir", src, "--out-dir", out)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "own/model.safetensors").read_bytes() == (tmp_path / "hub/model.safetensors").read_bytes()


def test_an_untied_qwen3_vl_without_its_head_is_one_line(tmp_path):
    """The top level's tie_word_embeddings ties Qwen3-VL's head (transformers ties the composite model): one that
    says untied, of a checkpoint that stores no head, would run an untrained one. Refused, naming the key."""
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-qwen3-vl-moe", hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    assert_one_line_error(run_tool("ieconv", "text-model", "--hf-dir", hf, "--out-dir", tmp_path / "t"),
                          "tie_word_embeddings")
    assert not (tmp_path / "t").exists()
