"""``ieconv rotate`` (convert/rotate.py): the rotated checkpoint computes the
same logits as the original on every architecture it supports, its file is
one safetensors' own reader accepts, its bytes follow from the seed, and
what it cannot rotate is refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import GOLDEN, assert_one_line_error, run_tool
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from iekit.convert.rotate import LLAMA_NORMS, NORM_NAMES
from iekit.runtime.decoder import Decoder

IDS = [3, 17, 42, 99, 5, 250, 7, 8, 1, 64, 12, 200]
MODELS = ["tiny-llama", "tiny-llama3", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-mixtral", "tiny-qwen3-moe",
          "tiny-smollm3", "tiny-granite", "tiny-ministral3", "tiny-seed-oss", "tiny-olmoe",
          "tiny-qwen2-moe", "tiny-deepseek-v2", "tiny-ernie4-5", "tiny-hunyuan-dense", "tiny-hunyuan-moe", "tiny-apertus",
          "tiny-dots1", "tiny-solar-open", "tiny-youtu", "tiny-granite-swa"]


def _rotate(src, out, *extra):
    return run_tool("ieconv", "rotate", "-q", "--hf-dir", src, "--out-dir", out, *extra)


def _ie(hf, out):
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return out


def _logits(hf, out):
    return Decoder(_ie(hf, out)).logits(IDS)


def _weights(d):
    """The rotated checkpoint's weights, as safetensors itself reads them."""
    return {k: v.astype(np.float64) for k, v in load_file(d / "model.safetensors").items()}


def _source_weights(d):
    """A golden checkpoint's weights (some are bf16, which safetensors' numpy reader lacks)."""
    from contextlib import ExitStack

    from iekit.formats.casting import decode_f32
    from iekit.formats.hf_checkpoint import collect_tensors, from_dir

    with ExitStack() as stack:
        return {n: decode_f32(b"".join(sf.iter_chunks(t)), t.dtype.name).reshape(t.shape).astype(np.float64)
                for n, (sf, t) in collect_tensors(from_dir(d), stack).items()}


@pytest.mark.parametrize("model", MODELS)
def test_rotated_checkpoint_computes_the_same_logits(tmp_path, model):
    src = GOLDEN / "hf" / model
    res = _rotate(src, tmp_path / "rot")
    assert res.returncode == 0, res.stderr
    assert "untied head" in res.stderr
    ref, got = _logits(src, tmp_path / "ref"), _logits(tmp_path / "rot", tmp_path / "rot-ie")
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()

    # Read back by safetensors itself; checked without knowing Q: a rotation keeps
    # each reader's Gram matrix W g (W g)ᵀ, each writer's Wᵀ W, the embedding's row norms.
    w, r = _source_weights(src), _weights(tmp_path / "rot")
    cfg = json.loads((tmp_path / "rot" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and "lm_head.weight" in r
    # (the stream's norms folded into their readers; latent attention's q_a/kv_a_layernorm norm the latents and
    # HunYuan's query/key_layernorm its heads: kept)
    assert all(np.all(v == 1) for k, v in r.items()
               if k.endswith("layernorm.weight") and not k.endswith(("_a_layernorm.weight", "query_layernorm.weight",
                                                                      "key_layernorm.weight"))
               or k == "model.norm.weight")
    g1 = w["model.layers.0." + NORM_NAMES.get(cfg["model_type"], LLAMA_NORMS)[0]]  # (Apertus's: its own names)
    reader = next(f"model.layers.0.self_attn.{n}.weight" for n in ("q_proj", "q_a_proj")  # (q_lora's: q_a_proj)
                  if f"model.layers.0.self_attn.{n}.weight" in w)
    q, rq = w[reader] * g1, r[reader]
    assert np.allclose(rq @ rq.T, q @ q.T, rtol=1e-5, atol=1e-6 * np.abs(q @ q.T).max())
    assert not np.allclose(rq, q, atol=1e-3 * np.abs(q).max())  # rotated, not copied
    o, ro = w["model.layers.0.self_attn.o_proj.weight"], r["model.layers.0.self_attn.o_proj.weight"]
    assert np.allclose(ro.T @ ro, o.T @ o, rtol=1e-5, atol=1e-6 * np.abs(o.T @ o).max())
    e, re = w["model.embed_tokens.weight"], r["model.embed_tokens.weight"]
    assert np.allclose(np.linalg.norm(re, axis=1), np.linalg.norm(e, axis=1), rtol=1e-5)
    with safe_open(tmp_path / "rot" / "model.safetensors", "np") as f:
        assert json.loads(f.metadata()["iekit.rotation"])["seed"] == 0


def test_the_seed_names_the_bytes_and_bf16_stays_close(tmp_path):
    src = GOLDEN / "hf" / "tiny-qwen3-moe"
    for d, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert _rotate(src, tmp_path / d, "--seed", seed).returncode == 0
    same = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert same == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert same != (tmp_path / "c" / "model.safetensors").read_bytes()
    ref = _logits(src, tmp_path / "ref")
    res = _rotate(src, tmp_path / "h", "--dtype", "bf16")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "h" / "model.safetensors").stat().st_size < 0.55 * len(same)
    got = _logits(tmp_path / "h", tmp_path / "h-ie")
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 1e-5 < err < 2e-2  # bf16's rounding, no more


def test_output_directory_rules(tmp_path):
    src = GOLDEN / "hf" / "tiny-llama"
    out = tmp_path / "rot"
    assert _rotate(src, out).returncode == 0
    before = (out / "model.safetensors").read_bytes()
    assert_one_line_error(_rotate(src, out), "model.safetensors", "exists; pass --overwrite")
    assert _rotate(src, out, "--overwrite", "--seed", 3).returncode == 0
    assert (out / "model.safetensors").read_bytes() != before
    assert_one_line_error(_rotate(src, src), "is the source directory")
    # a previous checkpoint's file the new one does not write: removed with --overwrite, and said
    (out / "vocab.txt").write_text("old")
    res = _rotate(src, out, "--overwrite")
    assert res.returncode == 0 and "removed the previous checkpoint's vocab.txt" in res.stderr, res.stderr
    assert not (out / "vocab.txt").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert_one_line_error(_rotate(src, other, "--overwrite"), "another checkpoint's weights")
    assert sorted(p.name for p in other.iterdir()) == ["model-00001-of-00002.safetensors"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staged file left


def _edited(tmp_path, src_name, edit_weights=None, edit_config=None):
    """A golden checkpoint as one f32 model.safetensors, its weights and config edited."""
    d = tmp_path / "src"
    shutil.copytree(GOLDEN / "hf" / src_name, d, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    w = {k: v.astype(np.float32) for k, v in _source_weights(GOLDEN / "hf" / src_name).items()}
    if edit_weights:
        edit_weights(w)
    save_file(w, str(d / "model.safetensors"))
    if edit_config:
        cfg = json.loads((d / "config.json").read_text())
        edit_config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("case, needles", [
    ("gpt-oss", ("model_type 'gpt_oss'", "rotation is implemented for")),
    ("unknown tensor", ("model.layers.0.mlp.extra.weight", "no rotation rule")),
    ("integer tensor", ("model.layers.0.self_attn.q_proj.weight", "only float tensors")),
    ("norm shape", ("model.layers.1.input_layernorm.weight", "a norm must be [64]")),
    ("no head", ("tie_word_embeddings is false", "lm_head.weight")),
    ("hidden_size", ("config.json", "hidden_size must be a positive integer")),
    ("mtp layer", ("model.layers.2.eh_proj.weight", "no rotation rule")),
    ("ernie mtp", ("model.mtp_", "no rotation rule")),
])
def test_refusals_name_the_tensor_and_write_nothing(tmp_path, case, needles):
    if case == "gpt-oss":
        src = GOLDEN / "hf" / "tiny-gpt-oss"
    elif case == "unknown tensor":
        src = _edited(tmp_path, "tiny-qwen3", lambda w: w.update({"model.layers.0.mlp.extra.weight": np.ones((4, 64), np.float32)}))
    elif case == "integer tensor":
        def to_int(w):
            w["model.layers.0.self_attn.q_proj.weight"] = w["model.layers.0.self_attn.q_proj.weight"].astype(np.int32)
        src = _edited(tmp_path, "tiny-qwen3", to_int)
    elif case == "norm shape":
        src = _edited(tmp_path, "tiny-qwen3", lambda w: w.update({"model.layers.1.input_layernorm.weight": np.ones(32, np.float32)}))
    elif case == "mtp layer":  # DeepSeek-V3's, whose eh_proj reads the embedding beside the stream
        src = GOLDEN / "hf" / "tiny-deepseek-v3"
    elif case == "ernie mtp":  # ERNIE 4.5's, beside the model: its linear_proj reads the embedding and the stream too
        src = GOLDEN / "hf" / "tiny-ernie4-5-moe"
    elif case == "no head":
        src = _edited(tmp_path, "tiny-qwen3", lambda w: w.pop("lm_head.weight"))
    else:
        src = _edited(tmp_path, "tiny-qwen3", edit_config=lambda c: c.update(hidden_size="64"))
    out = tmp_path / "out"
    assert_one_line_error(_rotate(src, out), *needles)
    assert not out.exists()


def test_a_phi3_checkpoint_rotates_into_its_own_layout(tmp_path):
    """Phi-3's qkv_proj and gate_up_proj are rotated as the q/k/v and
    gate/up they hold and written fused again (so transformers loads the
    result as a Phi3ForCausalLM): the same logits, within its window and
    past the original LongRoPE context alike."""
    src = GOLDEN / "hf" / "tiny-phi3"
    res = _rotate(src, tmp_path / "rot")
    assert res.returncode == 0, res.stderr
    names = set(_weights(tmp_path / "rot"))
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.1.mlp.gate_up_proj.weight" in names
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in names)
    ref_ie, rot_ie = _ie(src, tmp_path / "ref"), _ie(tmp_path / "rot", tmp_path / "rot-ie")
    for ctx in (32, 128):
        ref, got = Decoder(ref_ie, ctx=ctx).logits(IDS), Decoder(rot_ie, ctx=ctx).logits(IDS)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("model, mtp, config, kept, reader, norm", [
    # latent attention (q_a, kv_a read the stream; q_b, kv_b and their norms act on the latents), grouped sigmoid
    # routing with a choice bias
    ("tiny-deepseek-v3", "model.layers.2.", {"num_nextn_predict_layers": 0}, "self_attn.kv_b_proj.weight",
     "self_attn.q_a_proj.weight", "input_layernorm.weight"),
    # softmax routing with moe_statics' choice bias (the router's logits do not change) beside shared experts
    ("tiny-ernie4-5-moe", "model.mtp_", {}, "mlp.moe_statics.e_score_correction_bias", "mlp.gate.weight",
     "post_attention_layernorm.weight"),
    # Hy3's: sigmoid routing with its choice bias (mlp.expert_bias) beside a shared MLP, under the Hub's names
    ("tiny-hy-v3", "model.layers.2.", {"num_nextn_predict_layers": 0}, "mlp.expert_bias", "mlp.router.gate.weight",
     "post_attention_layernorm.weight"),
])
def test_a_model_without_its_mtp_tensors_rotates(tmp_path, model, mtp, config, kept, reader, norm):
    """Its MTP tensors dropped (rotate refuses them: they read the embedding
    beside the stream), the same logits rotated; a tensor off the stream kept
    as it is, a reader of the stream rotated with its norm folded in."""
    def drop_mtp(w):
        for k in [k for k in w if k.startswith(mtp)]:
            del w[k]

    src = _edited(tmp_path, model, drop_mtp, lambda c: c.update(config))
    res = _rotate(src, tmp_path / "rot")
    assert res.returncode == 0, res.stderr
    ref, got = _logits(src, tmp_path / "ref"), _logits(tmp_path / "rot", tmp_path / "rot-ie")
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    w, r = _source_weights(src), _weights(tmp_path / "rot")
    pre = "model.layers.1."
    assert np.array_equal(r[pre + kept], w[pre + kept])
    x, rx = w[pre + reader] * w[pre + norm], r[pre + reader]
    assert np.allclose(rx @ rx.T, x @ x.T, rtol=1e-5, atol=1e-6 * np.abs(x @ x.T).max())
    assert not np.allclose(rx, x, atol=1e-3 * np.abs(x).max())
