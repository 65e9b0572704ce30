"""Gemma 3, 2 and 1 (Gemma3ForCausalLM, Gemma2ForCausalLM, GemmaForCausalLM; llama.cpp's
gemma3, gemma2, gemma): the config spellings transformers reads as one model, what
the decoder refuses rather than runs as another, the GGUF bridge's choices a
toy from the golden generator does not reach (the converter's own file is
tests/test_llamacpp_converter.py; the frozen transformers logits are
tests/test_decoder.py's), and ieconv text-model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      reconfigure, run_tool)
from gguf_build import rewrite_gguf

GEMMA = GOLDEN_IEBIN / "tiny-gemma3"
IDS = json.loads((GOLDEN_REF / "tiny-gemma3" / "ids.json").read_text())


def _logits(model, tmp_path, name="l.npy") -> np.ndarray:
    return exact_logits(model, IDS, tmp_path / name)


def _spec(model):
    from iekit.formats.iebin import load_model
    from iekit.formats.model_spec import decoder_spec

    m = load_model(model)
    return decoder_spec(m.meta, m.meta_path)


def test_the_hubs_config_spelling_is_the_same_model(tmp_path):
    """Gemma 3's configs on the Hub predate transformers 5's: no layer_types
    (sliding_window_pattern: every pattern-th layer global), and rope_theta,
    rope_local_base_freq, rope_scaling at the top. transformers reads both as
    one model, and so must the decoder: the golden logits, from the other
    spelling."""
    def hub(meta):
        cfg = meta["config"]
        rp = cfg.pop("rope_parameters")
        cfg.pop("layer_types")
        full = rp["full_attention"]
        cfg.update(sliding_window_pattern=2, rope_theta=full["rope_theta"],
                   rope_local_base_freq=rp["sliding_attention"]["rope_theta"],
                   rope_scaling={"rope_type": "linear", "factor": full["factor"]})
        reconfigure(meta)

    d = edited_artifact(GEMMA, tmp_path / "m", hub)
    ref = np.load(GOLDEN_REF / "tiny-gemma3" / "logits.npy")
    got = _logits(d, tmp_path)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    assert np.array_equal(got, _logits(GEMMA, tmp_path, "g.npy"))


@pytest.mark.parametrize("key,value,needle", [
    ("attn_logit_softcapping", 50.0, "soft-capping"),
    ("final_logit_softcapping", 30.0, "soft-capping"),
    ("use_bidirectional_attention", True, "bidirectional"),
    ("query_pre_attn_scalar", 0, "positive number"),
    ("hidden_activation", "gelu", "not supported"),
    ("sliding_window_pattern", 0, "positive integer"),
])
def test_what_the_decoder_does_not_run_is_refused(tmp_path, key, value, needle):
    def edit(meta):
        if key == "sliding_window_pattern":
            meta["config"].pop("layer_types")
        reconfigure(meta, **{key: value})

    d = edited_artifact(GEMMA, tmp_path / "m", edit)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), needle)


def test_a_sliding_layers_rope_type_other_than_default_is_refused(tmp_path):
    def edit(meta):
        meta["config"]["rope_parameters"]["sliding_attention"]["rope_type"] = "linear"
        reconfigure(meta)

    d = edited_artifact(GEMMA, tmp_path / "m", edit)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "rope_parameters.sliding_attention.rope_type", "not supported")


@pytest.mark.parametrize("types,local", [
    (["full_attention", "sliding_attention"], 5000.0),  # not llama.cpp's default pattern, nor its default base
    (["full_attention", "full_attention"], 10000.0),    # no sliding layer: no window written at all
])
def test_gguf_round_trip_keeps_layer_types_and_the_local_base(tmp_path, types, local):
    """Layer types llama.cpp's default (every 6th layer global) does not
    give are written as sliding_window_pattern, the sliding layers' base as
    rope.freq_base_swa; the import reads both back: the same decoder and
    bit-identical logits."""
    import gguf

    def edit(meta):
        meta["config"]["layer_types"] = types
        meta["config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = local
        reconfigure(meta)

    d = edited_artifact(GEMMA, tmp_path / "m", edit)
    out = tmp_path / "m.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", out)
    assert res.returncode == 0, res.stderr
    kv = {k: f.contents() for k, f in gguf.GGUFReader(str(out)).fields.items()}
    assert kv["gemma3.rope.freq_base_swa"] == local
    swa = [t == "sliding_attention" for t in types]
    assert kv.get("gemma3.attention.sliding_window_pattern") == (swa if any(swa) else None)
    assert kv.get("gemma3.attention.sliding_window") == (4 if any(swa) else None)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", tmp_path / "back")
    assert res.returncode == 0, res.stderr
    a, b = _spec(d), _spec(tmp_path / "back")
    assert a.windows == b.windows == tuple(4 if s else 0 for s in swa)
    assert np.array_equal(a.inv_freq_swa, b.inv_freq_swa) and np.array_equal(a.inv_freq, b.inv_freq)
    assert (a.attn_scale, a.embed_scale, a.norm_offset, a.mlp_act) == (b.attn_scale, b.embed_scale,
                                                                       b.norm_offset, b.mlp_act)
    assert np.array_equal(_logits(d, tmp_path), _logits(tmp_path / "back", tmp_path, "b.npy"))


def test_export_refuses_an_attention_scale_llamacpp_would_not_apply(tmp_path):
    """llama.cpp's gemma3 derives its attention scale from the shapes
    (1/sqrt(head_dim), but for the 62-layer 27B); a model with another
    query_pre_attn_scalar would run differently there."""
    d = edited_artifact(GEMMA, tmp_path / "m", lambda m: reconfigure(m, query_pre_attn_scalar=48))
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf"),
                          "query_pre_attn_scalar", "1/sqrt(32)")
    assert not (tmp_path / "m.gguf").exists()


def test_norms_cross_as_one_plus_w_exactly(tmp_path):
    """llama.cpp stores Gemma's norms as 1 + w (float32, from the bf16 w:
    exact); the import takes 1 back off, exactly for any stored value of at
    least 0.5 (Sterbenz): the import's norms are the checkpoint's bits."""
    from iekit.formats.casting import decode_f32
    from iekit.formats.iebin import load_model

    out = tmp_path / "m.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", GEMMA, "--out", out).returncode == 0
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", tmp_path / "b").returncode == 0
    src, back = load_model(GEMMA), load_model(tmp_path / "b")

    def values(m, name):
        t = next(t for t in m.tensors if t["name"] == name)
        with open(m.path_of(t), "rb") as f:
            f.seek(t["file_data_offset"])
            return decode_f32(f.read(t["nbytes"]), t["dtype"])

    norms = [t["name"] for t in src.tensors if t["name"].endswith("norm.weight")]
    assert len(norms) == 2 * 6 + 1
    for n in norms:
        assert np.array_equal(values(src, n), values(back, n)), n


def test_gemmas_tokenizer_json_is_llamacpps_sentencepiece_without_a_space_prefix(tmp_path):
    """Gemma's tokenizer.json (transformers' GemmaConverter): spaces become
    ▁ in the normalizer, no ▁ is prepended, and a Split on " " that text
    without spaces never matches. A SentencePiece model trained as Gemma's
    (no dummy prefix), stored in a GGUF as llama.cpp stores it: its import
    gives sentencepiece's ids; given Gemma's pre-tokenizer, the same ids, and
    it exports as llama.cpp's SentencePiece vocabulary without the prefix."""
    from test_gguf_import import _strings, sentencepiece_gguf
    from tokenizers import Tokenizer

    from iekit.convert.gguf_tokenizer import gguf_tokenizer_fields
    from iekit.formats.errors import FormatError

    sp, src = sentencepiece_gguf(tmp_path, prefix=False)
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", tmp_path / "m").returncode == 0
    rebuilt = json.loads((tmp_path / "m/tokenizer.json").read_text())
    gemma = {**rebuilt, "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                                          "behavior": "MergedWithPrevious", "invert": False}}
    texts = [t for t in _strings(2000, seed=5) if "<" not in t]
    want = [[1] + sp.encode(t) for t in texts]
    for tok in (rebuilt, gemma):
        assert [e.ids for e in Tokenizer.from_str(json.dumps(tok)).encode_batch(texts)] == want
    fields = gguf_tokenizer_fields(json.dumps(gemma).encode(), {}, {}, tmp_path / "tokenizer.json")
    assert fields["tokenizer.ggml.model"] == "llama" and fields["tokenizer.ggml.add_space_prefix"] is False
    assert fields["tokenizer.ggml.tokens"] == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    # a Split that does split (on another string) is not SentencePiece's pipeline
    other = {**gemma, "pre_tokenizer": {**gemma["pre_tokenizer"], "pattern": {"String": "a"}}}
    with pytest.raises(FormatError, match="not SentencePiece's"):
        gguf_tokenizer_fields(json.dumps(other).encode(), {}, {}, tmp_path / "tokenizer.json")


@pytest.fixture(scope="module")
def gemma_int4w(tmp_path_factory):
    d = tmp_path_factory.mktemp("g")
    hf = GOLDEN_REF.parent / "hf" / "tiny-gemma3"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", hf, "-o", d / "m.json").returncode == 0
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", d / "q", "--q4-map", d / "m.json")
    assert res.returncode == 0, res.stderr
    return d / "q"


@pytest.mark.parametrize("isa", ["avx2", "avxvnni", "avx512", "amx"])
def test_int8_gelu_fused_over_the_row_copies_is_the_scalar_paths(gemma_int4w, isa):
    """With int8 activations, AVX2 and up run gate and up in one pass over
    their row-interleaved copies, GELU applied to the tile in registers
    (exp_avx2.h's gelu_tanh_body); the scalar ISA multiplies the mapped
    matrices and applies std::tanh's GELU after. Same int8 products, so
    the logits agree to float rounding, prefill and decode steps alike; the
    fused SiLU would be far off."""
    from iekit.runtime import native
    from iekit.runtime.decoder import Decoder

    if isa not in native.cpu_features()["isas"]:
        pytest.skip(f"no {isa} here")
    ref_d = Decoder(gemma_int4w, threads=2, act="int8", isa="scalar")
    d = Decoder(gemma_int4w, threads=2, act="int8", isa=isa)
    assert d.rows8_bytes > 0 and ref_d.rows8_bytes == 0
    ref, whole = ref_d.logits(IDS), d.logits(IDS)
    steps = np.stack([d.prefill(IDS[:1])] + [d.step(t) for t in IDS[1:]])
    scale = np.abs(ref).max()
    assert np.abs(whole - ref).max() <= 1e-4 * scale and np.abs(steps - ref).max() <= 1e-4 * scale
    f32 = Decoder(gemma_int4w, threads=2, act="f32").logits(IDS)
    assert np.abs(whole - f32).max() <= 5e-2 * np.abs(f32).max()  # int8 activations' own error


# ------------------------------------------------------------ ieconv text-model

VL = GOLDEN_REF.parent / "hf" / "tiny-gemma3-vl"


def _st(path) -> dict:
    import safetensors

    return {name: info for name, info in safetensors.deserialize(path.read_bytes())}


def test_the_text_model_of_a_multimodal_gemma3_is_tiny_gemma3(tmp_path):
    """golden/hf/tiny-gemma3-vl is tiny-gemma3's language model beside a
    vision tower (transformers gives the same text logits; the generator
    checks): its text model is tiny-gemma3, tensor for tensor and byte for
    byte, and converts to tiny-gemma3's artifact."""
    res = run_tool("ieconv", "text-model", "--hf-dir", VL, "--out-dir", tmp_path / "t", "-q")
    assert res.returncode == 0, res.stderr
    got, want = _st(tmp_path / "t/model.safetensors"), _st(GOLDEN_REF.parent / "hf/tiny-gemma3/model.safetensors")
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert (got[n]["dtype"], got[n]["shape"], bytes(got[n]["data"])) == (t["dtype"], t["shape"], bytes(t["data"])), n
    cfg = json.loads((tmp_path / "t/config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["model_type"] == "gemma3_text"
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "t" / name).read_bytes() == (VL / name).read_bytes()
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "ie/model.ie.bin").read_bytes() == (GEMMA / "model.ie.bin").read_bytes()
    assert np.array_equal(_logits(tmp_path / "ie", tmp_path), _logits(GEMMA, tmp_path, "g.npy"))


def test_the_hubs_layout_and_a_text_config_of_differences_give_the_same_model(tmp_path):
    """The Hub's Gemma 3 checkpoints hold language_model.model.* tensors and
    a text_config of what differs from transformers' defaults (its RoPE and
    window keys in the old spelling): the defaults filled in, the same
    model."""
    from gguf_build import hf_tensors
    from safetensors.numpy import save_file

    from iekit.convert.text_model import GEMMA3_TEXT_DEFAULTS

    src = tmp_path / "hub"
    src.mkdir()
    t = {k.replace("model.language_model.", "language_model.model."): v for k, v in hf_tensors(VL).items()}
    save_file(t, str(src / "model.safetensors"))
    cfg = json.loads((VL / "config.json").read_text())
    text = cfg["text_config"]
    rp = text.pop("rope_parameters")
    text.pop("layer_types")
    text.update(rope_scaling={"rope_type": "linear", "factor": rp["full_attention"]["factor"]},
                sliding_window_pattern=2)  # rope_theta, rope_local_base_freq: the defaults
    for k in [k for k, v in text.items() if GEMMA3_TEXT_DEFAULTS.get(k, object()) == v]:
        del text[k]
    (src / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (src / name).write_bytes((VL / name).read_bytes())
    assert run_tool("ieconv", "text-model", "-q", "--hf-dir", src, "--out-dir", tmp_path / "t").returncode == 0
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie").returncode == 0
    assert np.array_equal(_logits(tmp_path / "ie", tmp_path), _logits(GEMMA, tmp_path, "g.npy"))


def test_the_defaults_are_transformers(tmp_path):
    """GEMMA3_TEXT_DEFAULTS against transformers' own Gemma3TextConfig
    defaults, frozen by the golden generator."""
    from iekit.convert.text_model import GEMMA3_PATTERN_DEFAULT, GEMMA3_ROPE_DEFAULTS, GEMMA3_TEXT_DEFAULTS

    theirs = json.loads((GOLDEN_REF / "gemma3-text-defaults.json").read_text())
    assert {k: theirs[k] for k in GEMMA3_TEXT_DEFAULTS} == GEMMA3_TEXT_DEFAULTS
    rp = theirs["rope_parameters"]
    assert GEMMA3_ROPE_DEFAULTS == {"rope_theta": rp["full_attention"]["rope_theta"],
                                    "rope_local_base_freq": rp["sliding_attention"]["rope_theta"]}
    assert GEMMA3_PATTERN_DEFAULT == {"sliding_window_pattern": theirs["_sliding_window_pattern"]}


def test_text_model_refuses_what_it_cannot_place(tmp_path):
    from gguf_build import hf_tensors
    from safetensors.numpy import save_file

    res = run_tool("ieconv", "text-model", "--hf-dir", GOLDEN_REF.parent / "hf/tiny-gemma3", "--out-dir", tmp_path / "x")
    assert_one_line_error(res, "Gemma3ForCausalLM", "not a multimodal model")
    src = tmp_path / "odd"
    src.mkdir()
    t = hf_tensors(VL)
    t["model.audio_tower.proj.weight"] = np.ones((2, 2), np.float32)
    save_file(t, str(src / "model.safetensors"))
    (src / "config.json").write_bytes((VL / "config.json").read_bytes())
    res = run_tool("ieconv", "text-model", "--hf-dir", src, "--out-dir", tmp_path / "y")
    assert_one_line_error(res, "model.audio_tower.proj.weight", "refusing rather than dropping it")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_hf_to_iebin_of_the_multimodal_checkpoint_says_how_to_run_it(tmp_path):
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", VL, "--out-dir", tmp_path / "m")
    assert res.returncode == 0 and "ieconv text-model" in res.stderr, res.stderr


# ------------------------------------------------------------ Gemma 2

GEMMA2 = GOLDEN_IEBIN / "tiny-gemma2"


@pytest.mark.parametrize("key,value,needle", [
    ("attn_logit_softcapping", -1.0, "positive number"),
    ("final_logit_softcapping", "30", "positive number"),
    ("query_pre_attn_scalar", -2, "positive number"),
])
def test_gemma2_values_the_decoder_cannot_run_are_refused(tmp_path, key, value, needle):
    d = edited_artifact(GEMMA2, tmp_path / "m", lambda m: reconfigure(m, **{key: value}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), f"config.{key}", needle)


@pytest.mark.parametrize("edit,needle", [
    ({"attn_logit_softcapping": None}, "always soft-caps"),
    ({"final_logit_softcapping": None}, "always soft-caps"),
    ({"query_pre_attn_scalar": 48}, "1/sqrt(32)"),
])
def test_gemma2_export_refuses_what_llamacpp_would_run_differently(tmp_path, edit, needle):
    d = edited_artifact(GEMMA2, tmp_path / "m", lambda m: reconfigure(m, **edit))
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf"),
                          next(iter(edit)), needle)
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("types", [["full_attention", "sliding_attention"], ["full_attention", "full_attention"]])
def test_gemma2_round_trip_keeps_its_layer_types(tmp_path, types):
    """llama.cpp's gemma2 slides every other layer unless the file's
    pattern says otherwise, so the export writes one for any other layer
    types (no sliding layer at all included); the import reads it back."""
    import gguf

    d = edited_artifact(GEMMA2, tmp_path / "m", lambda m: reconfigure(m, layer_types=types))
    out = tmp_path / "m.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", d, "--out", out).returncode == 0
    kv = {k: f.contents() for k, f in gguf.GGUFReader(str(out)).fields.items()}
    assert kv["gemma2.attention.sliding_window_pattern"] == [t == "sliding_attention" for t in types]
    assert (kv["gemma2.attn_logit_softcapping"], kv["gemma2.final_logit_softcapping"]) == (2.0, 5.0)
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", tmp_path / "b").returncode == 0
    assert _spec(d).windows == _spec(tmp_path / "b").windows
    assert np.array_equal(_logits(d, tmp_path), _logits(tmp_path / "b", tmp_path, "b.npy"))


def test_a_gemma2_file_without_its_keys_takes_llamacpps_defaults(tmp_path):
    """A gemma2 file without a window or soft-cap keys runs in llama.cpp
    with a 4096-position window on every other layer and caps 50 and 30;
    the import records those. A sliding base other than the model's is
    refused: Gemma 2 has one."""
    out = tmp_path / "m.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", GEMMA2, "--out", out).returncode == 0
    drop = {"gemma2.attention.sliding_window", "gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"}

    def rewrite(dst, extra=None):
        return rewrite_gguf(out, dst, drop=drop, kv=extra)

    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", rewrite(tmp_path / "bare.gguf"), "--out-dir",
                   tmp_path / "b")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "b/config.json").read_text())
    assert (cfg["sliding_window"], cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"]) == (4096, 50.0, 30.0)
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    bad = rewrite(tmp_path / "swa.gguf", {"gemma2.rope.freq_base_swa": 5000.0})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "c"),
                          "gemma2.rope.freq_base_swa", "one base")


# ------------------------------------------------------------ Gemma 1

GEMMA1 = GOLDEN_IEBIN / "tiny-gemma"


def test_gemma1_reads_the_hubs_gelu_as_the_tanh_approximation():
    """Gemma 2B's and 7B's configs say hidden_act "gelu", which GemmaConfig
    reads as gelu_pytorch_tanh (the golden toy's config says it too, and its
    logits are tests/test_decoder.py's); the exact GELU would be another model."""
    assert json.loads((GOLDEN_IEBIN / "tiny-gemma" / "config.json").read_text())["hidden_act"] == "gelu"
    spec = _spec(GEMMA1)
    assert (spec.mlp_act, spec.attn_scale, spec.norm_offset, spec.windows) == ("gelu_tanh", 0.0, 1.0, (0, 0))
    assert spec.embed_scale == 8.0 and spec.n_kv_heads == 1 and spec.tied


@pytest.mark.parametrize("key,value,needle", [
    ("query_pre_attn_scalar", 32, "1/sqrt(head_dim)"),
    ("attn_logit_softcapping", 50.0, "soft-capping is not supported"),
])
def test_gemma1_keys_of_the_later_gemmas_are_refused(tmp_path, key, value, needle):
    """transformers' GemmaForCausalLM reads neither: a config with one was
    meant for another Gemma, refused rather than run as Gemma 1."""
    d = edited_artifact(GEMMA1, tmp_path / "m", lambda m: reconfigure(m, **{key: value}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), f"config.{key}", needle)


def test_gemma1_export_needs_the_embedding_as_its_head(tmp_path):
    """llama.cpp's gemma graph reads the embedding as the output head: an
    untied Gemma would run there with another head, so it is refused."""
    d = edited_artifact(GEMMA1, tmp_path / "m", lambda m: reconfigure(m, tie_word_embeddings=False))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "tie_word_embeddings", "reads the embedding as its output head")
    assert not (tmp_path / "m.gguf").exists()
