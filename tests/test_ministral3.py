"""Ministral 3 (Ministral3ForCausalLM; llama.cpp's mistral3): Llama's layer
with YaRN and Llama 4's attention temperature, the queries of position p
times 1 + beta ln(1 + floor(p / original context)). The frozen
transformers logits are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, where the temperature applies,
Mistral Small 3.x's mistral3 files (no temperature), and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      reconfigure, run_tool)
from gguf_build import rewrite_gguf

MINISTRAL3 = GOLDEN_IEBIN / "tiny-ministral3"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-ministral3.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-ministral3" / "ids.json").read_text())
ROPE = json.loads((MINISTRAL3 / "config.json").read_text())["rope_parameters"]


def _rope(meta: dict, **change) -> None:
    reconfigure(meta, rope_parameters={**ROPE, **change})


def _import(src, out) -> dict:
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "config.json").read_text())


def test_the_temperature_starts_at_the_original_context(tmp_path):
    """The toy's original context is 4 positions: without the temperature
    the first four positions' logits are the same bits, every later one
    differs (each layer's queries there are 1 + 0.5 ln 2, then ln 3, sharper)."""
    ref = exact_logits(MINISTRAL3, IDS, tmp_path / "ref.npy")
    d = edited_artifact(MINISTRAL3, tmp_path / "m", lambda meta: _rope(meta, llama_4_scaling_beta=0.0))
    off = exact_logits(d, IDS, tmp_path / "off.npy")
    assert np.array_equal(off[:4], ref[:4])
    assert all(np.abs(off[p] - ref[p]).max() > 1e-3 * np.abs(ref).max() for p in range(4, len(IDS)))


def test_a_mistral3_file_without_the_temperature_is_mistral_small(tmp_path):
    """Mistral Small 3.x converts to mistral3 without attention.temperature_scale
    or YaRN: the import is a Ministral 3 with beta 0, which runs as the
    same weights under MistralForCausalLM, and exports back to those keys."""
    a = "mistral3"
    bare = rewrite_gguf(CONVERTED, tmp_path / "small.gguf",
                        drop={f"{a}.attention.temperature_scale", f"{a}.rope.scaling.yarn_log_multiplier",
                              f"{a}.rope.scaling.type", f"{a}.rope.scaling.factor",
                              f"{a}.rope.scaling.original_context_length", f"{a}.rope.scaling.yarn_beta_fast",
                              f"{a}.rope.scaling.yarn_beta_slow"})
    cfg = _import(bare, tmp_path / "s")
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0,
                                      "original_max_position_embeddings": 128, "llama_4_scaling_beta": 0.0}
    mistral = edited_artifact(tmp_path / "s", tmp_path / "as-mistral", lambda meta: reconfigure(
        meta, architecture="MistralForCausalLM", model_type="mistral", rope_parameters=None, rope_theta=10000.0,
        sliding_window=None))
    np.testing.assert_array_equal(exact_logits(tmp_path / "s", IDS, tmp_path / "a.npy"),
                                  exact_logits(mistral, IDS, tmp_path / "b.npy"))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", tmp_path / "s", "--out", tmp_path / "back.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    keys = set(gguf.GGUFReader(str(tmp_path / "back.gguf")).fields)
    assert not {k for k in keys if ".rope.scaling." in k or "temperature" in k}


def test_a_temperature_without_yarn_exports_its_own_floor(tmp_path):
    """Without YaRN, llama.cpp steps the temperature over
    rope.scaling.original_context_length where the file has one, else the
    whole context: an export writes the model's, and it comes back."""
    d = edited_artifact(MINISTRAL3, tmp_path / "m", lambda meta: reconfigure(
        meta, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "original_max_position_embeddings": 4,
                               "llama_4_scaling_beta": 0.5}))
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    kv = {k: f.contents() for k, f in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields.items()}
    assert (kv["mistral3.rope.scaling.original_context_length"], kv["mistral3.attention.temperature_scale"]) == (4, 0.5)
    assert "mistral3.rope.scaling.type" not in kv
    back = _import(tmp_path / "m.gguf", tmp_path / "back")
    assert (back["rope_parameters"]["original_max_position_embeddings"],
            back["rope_parameters"]["llama_4_scaling_beta"]) == (4, 0.5)
    np.testing.assert_array_equal(exact_logits(d, IDS, tmp_path / "a.npy"),
                                  exact_logits(tmp_path / "back", IDS, tmp_path / "b.npy"))


@pytest.mark.parametrize("change,needle", [
    (dict(kv={"mistral3.attention.temperature_scale": -0.5}), "non-negative number"),
    (dict(drop={"mistral3.rope.scaling.type"}), "a YaRN factor of no YaRN"),
])
def test_hostile_mistral3_files_are_refused(tmp_path, change, needle):
    if "kv" in change:
        change = dict(change, drop=set(change["kv"]))
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", **change)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", needle)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("change,needles", [
    (dict(llama_4_scaling_beta=None), ("rope_parameters.llama_4_scaling_beta: is missing",)),
    (dict(llama_4_scaling_beta=-1), ("rope_parameters.llama_4_scaling_beta", "non-negative number")),
    (dict(rope_type="default", original_max_position_embeddings=0),
     ("rope_parameters.original_max_position_embeddings", "positive integer")),
])
def test_a_temperature_the_decoder_cannot_read_is_refused(tmp_path, change, needles):
    d = edited_artifact(MINISTRAL3, tmp_path / "m", lambda meta: _rope(meta, **change))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), *needles)


def test_export_refuses_an_mscale_llamacpp_does_not_read(tmp_path):
    """llama.cpp's mistral3 takes YaRN's mscale to be 1 beside the
    yarn_log_multiplier it reads: another is refused, not exported as
    another attention factor."""
    d = edited_artifact(MINISTRAL3, tmp_path / "m", lambda meta: _rope(meta, mscale=2.0))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "rope_scaling", "attention factor")
    assert not (tmp_path / "m.gguf").exists()


# ------------------------------------------------------------ ieconv text-model of Mistral3ForConditionalGeneration

VL = GOLDEN / "hf" / "tiny-ministral3-vl"


def _st(path) -> dict:
    import safetensors

    return {name: info for name, info in safetensors.deserialize(path.read_bytes())}


def _text_model(src, out):
    res = run_tool("ieconv", "text-model", "-q", "--hf-dir", src, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "config.json").read_text())


def test_the_text_model_of_a_multimodal_ministral3_is_tiny_ministral3(tmp_path):
    """golden/hf/tiny-ministral3-vl is tiny-ministral3's language model beside
    a Pixtral tower (transformers gives the same text logits; the generator
    checks): its text model is tiny-ministral3 byte for byte, tied as the
    multimodal model is (no head stored), and converts to its artifact."""
    cfg = _text_model(VL, tmp_path / "t")
    got, want = _st(tmp_path / "t/model.safetensors"), _st(GOLDEN / "hf/tiny-ministral3/model.safetensors")
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert (got[n]["dtype"], got[n]["shape"], bytes(got[n]["data"])) == (t["dtype"], t["shape"], bytes(t["data"])), n
    assert (cfg["architectures"], cfg["model_type"], cfg["tie_word_embeddings"]) == (
        ["Ministral3ForCausalLM"], "ministral3", True)
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ie/model.ie.bin").read_bytes() == (MINISTRAL3 / "model.ie.bin").read_bytes()


def _mistral_small(tmp_path, text_edit: dict, head: bool = True, top: dict | None = None):
    """tiny-ministral3-vl laid out as Mistral Small 3.1 is on the Hub: a
    text_config of model_type mistral (old RoPE spelling), an untied head
    (language_model.lm_head.weight) and the top level's tie_word_embeddings false."""
    from gguf_build import hf_tensors
    from safetensors.numpy import save_file

    src = tmp_path / "small"
    src.mkdir()
    t = hf_tensors(VL)
    if head:
        emb = t["language_model.model.embed_tokens.weight"]
        t["language_model.lm_head.weight"] = np.ascontiguousarray(emb[::-1] * np.float32(0.5))
    save_file(t, str(src / "model.safetensors"))
    cfg = json.loads((VL / "config.json").read_text())
    text = cfg["text_config"]
    for k in ("rope_parameters", "architectures"):
        text.pop(k)
    text.update(model_type="mistral", rope_theta=10000.0)
    for k, v in text_edit.items():  # (None: left out)
        text.pop(k) if v is None else text.update({k: v})
    cfg.update(tie_word_embeddings=False, **(top or {}))
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer.json").write_bytes((VL / "tokenizer.json").read_bytes())
    return src, t


def test_a_mistral_small_layout_gives_an_untied_mistral(tmp_path):
    """text_config.model_type mistral is a MistralForCausalLM; what its
    text_config leaves out takes MistralConfig's defaults (rms_norm_eps
    1e-6, a 4096 window), not Ministral 3's; the stored head is its own
    (the top level says untied)."""
    src, t = _mistral_small(tmp_path, {"rms_norm_eps": None})
    out = _text_model(src, tmp_path / "t")
    assert (out["architectures"], out["model_type"], out["tie_word_embeddings"]) == (
        ["MistralForCausalLM"], "mistral", False)
    assert (out["rms_norm_eps"], out["rope_theta"], out["sliding_window"]) == (1e-6, 10000.0, None)
    assert "rope_parameters" not in out
    from gguf_build import hf_tensors

    got = hf_tensors(tmp_path / "t")
    assert np.array_equal(got["lm_head.weight"], t["language_model.lm_head.weight"])
    assert sorted(got) == sorted(k.removeprefix("language_model.") for k in t if k.startswith("language_model."))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr


def test_the_mistral3_defaults_are_transformers():
    """The default tables against transformers' own MistralConfig and
    Ministral3Config, frozen by the golden generator."""
    from iekit.convert.text_model import (MINISTRAL3_ROPE_DEFAULTS, MINISTRAL3_TEXT_DEFAULTS, MISTRAL_ROPE_DEFAULTS,
                                          MISTRAL_TEXT_DEFAULTS)

    theirs = json.loads((GOLDEN_REF / "mistral3-text-defaults.json").read_text())
    for kind, table, rope in (("mistral", MISTRAL_TEXT_DEFAULTS, MISTRAL_ROPE_DEFAULTS),
                              ("ministral3", MINISTRAL3_TEXT_DEFAULTS, MINISTRAL3_ROPE_DEFAULTS)):
        assert {k: theirs[kind][k] for k in table} == table, kind
        rp = {k: v for k, v in theirs[kind]["rope_parameters"].items() if k not in ("type", "max_position_embeddings")}
        assert (rope if "rope_parameters" in rope else {"rope_parameters": {"rope_type": "default", **rope}}) == {
            "rope_parameters": rp}, kind


@pytest.mark.parametrize("text_edit,head,top,needles", [
    ({"model_type": "pixtral"}, True, None, ("text_config.model_type", "'pixtral'")),
    ({}, False, None, ("tie_word_embeddings: false", "no lm_head.weight")),
])
def test_text_model_refuses_a_mistral3_it_cannot_place(tmp_path, text_edit, head, top, needles):
    src, _ = _mistral_small(tmp_path, text_edit, head, top)
    res = run_tool("ieconv", "text-model", "--hf-dir", src, "--out-dir", tmp_path / "x")
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "x").exists()


def test_hf_to_iebin_of_the_multimodal_checkpoint_says_how_to_run_it(tmp_path):
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", VL, "--out-dir", tmp_path / "m")
    assert res.returncode == 0 and "ieconv text-model" in res.stderr, res.stderr
