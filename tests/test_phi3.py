"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (Phi3ForCausalLM; llama.cpp's phi3):
the fused matrices read as the ones they hold, partial RoPE, LongRoPE's
two tables chosen by the context, and what the decoder and the GGUF bridge
refuse rather than run as another model. The frozen transformers logits
within the original context are tests/test_decoder.py's, the converter's
own file tests/test_llamacpp_converter.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      max_rel, reconfigure, run_tool)
from gguf_build import hf_tensors, rewrite_gguf

PHI3 = GOLDEN_IEBIN / "tiny-phi3"
REF = GOLDEN_REF / "tiny-phi3"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-phi3.gguf"


def _logits(model, tmp_path, ids, ctx, name="l.npy") -> np.ndarray:
    return exact_logits(model, ids, tmp_path / name, "--ctx", str(ctx))




def test_the_fused_matrices_are_read_as_their_rows():
    """qkv_proj's rows are q_proj, k_proj, v_proj in the artifact, and
    gate_up_proj's gate_proj, up_proj: the same bytes, nothing fused left."""
    from iekit.formats.iebin import load_model

    src = hf_tensors(GOLDEN_HF / "tiny-phi3")
    m = load_model(PHI3)
    names = {t["name"] for t in m.tensors}
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in names)

    def values(name):
        t = next(t for t in m.tensors if t["name"] == name)
        with open(m.path_of(t), "rb") as f:
            f.seek(t["file_data_offset"])
            raw = np.frombuffer(f.read(t["nbytes"]), np.uint16).astype(np.uint32) << 16
        return raw.view(np.float32).reshape(t["shape"])

    for i in range(2):
        qkv, gu = src[f"model.layers.{i}.self_attn.qkv_proj.weight"], src[f"model.layers.{i}.mlp.gate_up_proj.weight"]
        pre = f"model.layers.{i}."
        got = np.concatenate([values(pre + f"self_attn.{k}_proj.weight") for k in "qkv"])
        assert got.shape == (4 * 16 + 2 * 2 * 16, 64) and np.array_equal(got, qkv)
        assert np.array_equal(np.concatenate([values(pre + "mlp.gate_proj.weight"), values(pre + "mlp.up_proj.weight")]),
                              gu)


def test_past_the_original_context_the_long_factors_turn(tmp_path):
    """transformers' logits for 40 tokens (past the original 32, so its long
    factors) are ierun's in a context past 32; the same 12 ids run in a
    context of 32 and of 128 differ, as they do in llama.cpp."""
    long_ids = json.loads((REF / "ids_long.json").read_text())
    assert max_rel(_logits(PHI3, tmp_path, long_ids, 128), np.load(REF / "logits_long.npy")) <= 1e-5
    ids = json.loads((REF / "ids.json").read_text())
    short, long = _logits(PHI3, tmp_path, ids, 32, "s.npy"), _logits(PHI3, tmp_path, ids, 33, "t.npy")
    assert max_rel(short, np.load(REF / "logits.npy")) <= 1e-5
    assert max_rel(long, short) > 1e-2
    assert np.array_equal(long, _logits(PHI3, tmp_path, ids, 128, "u.npy"))


@pytest.mark.parametrize("kind", ["longrope", "su"])
def test_the_hubs_config_spelling_is_the_same_model(tmp_path, kind):
    """Phi-3.5's and Phi-4-mini's configs on the Hub predate transformers 5's
    rope_parameters: rope_scaling {type, short_factor, long_factor} with
    rope_theta and partial_rotary_factor at the top (the first 128k Phi-3s
    said "su" for longrope). The same model as the golden spelling."""
    def hub(meta):
        cfg = meta["config"]
        rp = cfg.pop("rope_parameters")
        cfg.update(rope_theta=rp["rope_theta"], partial_rotary_factor=rp["partial_rotary_factor"],
                   rope_scaling={"type": kind, "short_factor": rp["short_factor"], "long_factor": rp["long_factor"]})
        reconfigure(meta)

    d = edited_artifact(PHI3, tmp_path / "m", hub)
    ids = json.loads((REF / "ids_long.json").read_text())
    assert np.array_equal(_logits(d, tmp_path, ids, 128, "a.npy"), _logits(PHI3, tmp_path, ids, 128, "b.npy"))


def test_rope_tables_are_transformers_longrope():
    """The two tables and the attention factor, restated from
    _compute_longrope_parameters: base^(-2i/d) / factor_i over the rotated
    dims d = head_dim x partial_rotary_factor, sqrt(1 + ln(128/32) / ln 32)."""
    from iekit.formats.iebin import load_model
    from iekit.formats.model_spec import decoder_spec, rope_for_context

    m = load_model(PHI3)
    s = decoder_spec(m.meta, m.meta_path)
    rp = m.meta["config"]["rope_parameters"]
    base = 1.0 / (10000.0 ** (np.arange(0, 8, 2) / 8.0))
    np.testing.assert_allclose(s.inv_freq, base / np.array(rp["short_factor"]), rtol=1e-6)
    np.testing.assert_allclose(s.inv_freq_long, base / np.array(rp["long_factor"]), rtol=1e-6)
    assert s.rope_scale == pytest.approx(np.sqrt(1 + np.log(4) / np.log(32)), rel=1e-12)
    assert rope_for_context(s, 32) is s.inv_freq and rope_for_context(s, 33) is s.inv_freq_long


@pytest.mark.parametrize("edit,needle", [
    ({"partial_rotary_factor": 1.5}, "number in (0, 1]"),
    ({"partial_rotary_factor": 0.1}, "RoPE turns an even number"),
    ({"long_factor": [1.0, 2.0]}, "expected 4 positive numbers"),
    ({"short_factor": [1.0, 0.0, 1.0, 1.0]}, "expected 4 positive numbers"),
    ({"short_factor": None}, "short_factor"),
    ({"original_max_position_embeddings": 1}, "at least 2 positions"),
])
def test_what_the_decoder_cannot_run_is_refused(tmp_path, edit, needle):
    def change(meta):
        rp = dict(meta["config"]["rope_parameters"])
        rp.update(edit)
        old_ctx = rp["original_max_position_embeddings"]  # (Phi-3's own key beside it, which transformers prefers)
        reconfigure(meta, rope_parameters=rp, original_max_position_embeddings=old_ctx)

    d = edited_artifact(PHI3, tmp_path / "m", change)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "rope_scaling", needle)


def test_partial_rope_is_refused_where_the_architecture_has_none(tmp_path):
    d = edited_artifact(GOLDEN_IEBIN / "tiny-llama", tmp_path / "m",
                        lambda meta: reconfigure(meta, partial_rotary_factor=0.5))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "partial_rotary_factor",
                          "Phi-3's and GLM-4's are")


@pytest.mark.parametrize("fix,needle", [
    (lambda cfg: cfg.update(num_key_value_heads=4), "64 (q_proj) + 64 (k_proj) + 64 (v_proj)"),
    (lambda cfg: cfg.update(intermediate_size=64), "64 (gate_proj) + 64 (up_proj)"),
])
def test_a_fused_matrix_the_config_does_not_split_is_refused(tmp_path, fix, needle):
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-phi3", hf)
    cfg = json.loads((hf / "config.json").read_text())
    fix(cfg)
    (hf / "config.json").write_text(json.dumps(cfg))
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "model.layers.0.", needle)
    assert not (tmp_path / "o").exists()


def _q8_0_but(tmp_path, kept: str):
    """tiny-phi3 with every layer matrix Q8_0 but those named ``kept`` (left bf16)."""
    man = tmp_path / "m.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-phi3", "-o", man, "--scheme",
                    "q8_0").returncode == 0
    rules = json.loads(man.read_text())
    rules["rules"] = [r for r in rules["rules"] if kept not in r["match"]]
    man.write_text(json.dumps(rules))
    q = tmp_path / "q"
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-phi3", "--q4-map", man,
                    "--out-dir", q).returncode == 0
    return q


def test_export_refuses_what_llamacpp_would_run_differently(tmp_path):
    """llama.cpp's phi3 applies no sliding window (iebin-to-gguf asks for
    --allow-full-attention), and a gate/up pair in two types cannot be its
    one ffn_up; LongRoPE on another architecture has no llama.cpp key."""
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", PHI3, "--out", tmp_path / "a.gguf")
    assert_one_line_error(res, "sliding_window", "--allow-full-attention")
    q = _q8_0_but(tmp_path, "up_proj")
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", q, "--out", tmp_path / "b.gguf",
                   "--allow-full-attention")
    assert_one_line_error(res, "ffn_up", "different types")
    rp = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
          "original_max_position_embeddings": 32}
    llama = edited_artifact(GOLDEN_IEBIN / "tiny-llama", tmp_path / "l",
                            lambda meta: reconfigure(meta, rope_parameters=rp))
    assert_one_line_error(run_tool("ieconv", "iebin-to-gguf", "--model-dir", llama, "--out", tmp_path / "c.gguf"),
                          "longrope", "phi3 only")


def test_q_k_v_in_different_types_export_as_three_tensors(tmp_path):
    """llama.cpp's phi3 reads attn_q, attn_k, attn_v where there is no
    attn_qkv: a v_proj quantized apart (Q4_K_M's habit) is written so, and
    the file imports to the same model (but for the window llama.cpp's phi3
    does not apply)."""
    q = _q8_0_but(tmp_path, "v_proj")
    out = tmp_path / "q.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", q, "--out", out, "--allow-full-attention")
    assert res.returncode == 0, res.stderr
    import gguf

    names = {t.name for t in gguf.GGUFReader(str(out)).tensors}
    assert {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_up.weight"} <= names
    assert "blk.0.attn_qkv.weight" not in names and "blk.0.ffn_gate.weight" not in names
    back = tmp_path / "back"
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", back).returncode == 0
    ids = json.loads((REF / "ids.json").read_text())[:6]  # within the window the export leaves out
    assert np.array_equal(_logits(back, tmp_path, ids, 32, "b.npy"), _logits(q, tmp_path, ids, 32, "q.npy"))


@pytest.mark.parametrize("change,needle", [
    (dict(tensors={"rope_factors_short.weight": None}), "without its long/short partner"),
    (dict(tensors={"rope_factors_long.weight": np.ones(3, np.float32)}), "expected F32 [4]"),
    (dict(tensors={"rope_factors_long.weight": np.array([1, 2, np.nan, 4], np.float32)}), "positive number"),
    (dict(tensors={"rope_factors_long.weight": None, "rope_factors_short.weight": None}), "attention factor of no"),
    (dict(drop={"phi3.rope.dimension_count"}, kv={"phi3.rope.dimension_count": 7}), "rotates 7 of 16"),
    (dict(drop={"phi3.rope.scaling.original_context_length"}, kv={"phi3.rope.scaling.original_context_length": 1}),
     "at least 2"),
])
def test_hostile_phi3_files_are_refused(tmp_path, change, needle):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", **change)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", needle)
    assert not (tmp_path / "o").exists()


def test_an_attention_factor_of_its_own_is_kept(tmp_path):
    """A file whose rope.scaling.attn_factor is not the one transformers
    derives imports with it as attention_factor, and llama.cpp's value
    reaches the decoder's cos/sin."""
    from iekit.formats.iebin import load_model
    from iekit.formats.model_spec import decoder_spec

    f = rewrite_gguf(CONVERTED, tmp_path / "f.gguf", drop={"phi3.rope.scaling.attn_factor"},
                     kv={"phi3.rope.scaling.attn_factor": 1.5})
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", f, "--out-dir", tmp_path / "o").returncode == 0
    m = load_model(tmp_path / "o")
    assert m.meta["config"]["rope_scaling"]["attention_factor"] == 1.5
    assert decoder_spec(m.meta, m.meta_path).rope_scale == 1.5
    plain = load_model(GOLDEN_IEBIN / "tiny-phi3")
    assert "attention_factor" not in plain.meta["config"]["rope_parameters"]
    assert decoder_spec(plain.meta, plain.meta_path).rope_scale == pytest.approx(1.1832160, rel=1e-6)


def test_a_policy_for_gguf_gives_gate_and_up_one_type(tmp_path):
    """llama.cpp's phi3 holds gate and up in one ffn_up: q4-manifest
    --target-bpw --gguf-types allocates each layer's pair as one matrix (the
    budget measured on both), so the export goes through; q, k, v may still
    differ (written apart)."""
    man = tmp_path / "m.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-phi3", "-o", man, "--target-bpw", "5.0",
                   "--gguf-types")
    assert res.returncode == 0, res.stderr
    chosen = json.loads(man.read_text())["tensors"]
    for i in range(2):
        assert chosen[f"model.layers.{i}.mlp.gate_proj.weight"] == chosen[f"model.layers.{i}.mlp.up_proj.weight"]
    assert len({json.dumps(v, sort_keys=True) for v in chosen.values()}) > 1  # a mix, not one type
    q = tmp_path / "q"
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-phi3", "--q4-map", man,
                    "--out-dir", q).returncode == 0
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", q, "--out", tmp_path / "q.gguf",
                   "--allow-full-attention")
    assert res.returncode == 0, res.stderr
