"""Falcon-H1 (FalconH1ForCausalLM; llama.cpp's falcon-h1): Mamba2 beside attention in every layer, their outputs
summed, then a SwiGLU MLP, under muP multipliers. The frozen transformers logits and greedy ids are
tests/test_decoder.py's, the converter's own file (its matrices times the multipliers)
tests/test_llamacpp_converter.py's,
the round trips through GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's, llama.cpp running the export
tests/test_llamacpp_runs.py's; here, what a layer that attends beside its states changes, the multipliers on the way
out when the matrices are quantized or the head tied, the calibration tools on it, and what a config or file may not
say."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, assert_states_carry, edited_artifact, gptq_q8_0,
                      imatrix_of, max_rel, reconfigure, reconfigured_logits, run_tool)
from gguf_build import rewrite_gguf

from iekit.convert.gguf_names import falcon_h1_factors
from iekit.formats.iebin import load_model
from iekit.formats.quant import SCHEMES
from iekit.runtime.decoder import Decoder, cached_layers

MODEL = GOLDEN_IEBIN / "tiny-falcon-h1"
REF = GOLDEN_IEBIN.parent / "ref" / "tiny-falcon-h1"
IDS = json.loads((REF / "ids.json").read_text())
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-falcon-h1.gguf"
CFG = json.loads((GOLDEN_HF / "tiny-falcon-h1" / "config.json").read_text())


def test_every_layer_attends_beside_its_states():
    """Three layers, each Mamba2 and attention: the states carry from step to step and a prompt run in pieces is
    the prompt run whole (conftest.assert_states_carry), and every layer keeps a KV cache too; int8 activations as
    float ones, near enough."""
    assert_states_carry(MODEL, IDS)
    s = Decoder(MODEL).spec
    assert s.ssm == (True,) * 3 and s.ssm_attends and s.attends == (True,) * 3 and cached_layers(s) == 3
    assert (s.ssm_heads, s.ssm_head_dim, s.ssm_state, s.ssm_groups, s.ssm_conv) == (6, 16, 16, 2, 4)
    assert (s.n_heads, s.n_kv_heads, s.head_dim) == (4, 2, 24)
    assert (s.q_mult, s.k_mult, s.o_mult, s.ssm_out_mult, s.gate_mult, s.down_mult) == pytest.approx(
        (0.8, 0.4, 0.9, 4.0, 0.9, 0.6))
    assert s.ssm_in_mults == pytest.approx((0.875, 0.625, 1.25, 1.75, 1.5)) and s.logits_scaling == 2.0
    assert max_rel(Decoder(MODEL, act="int8").logits(IDS), Decoder(MODEL).logits(IDS)) < 2e-2


@pytest.mark.parametrize("edit,key", [
    ({"mamba_rms_norm": True}, "config.mamba_rms_norm"),
    ({"mamba_proj_bias": True}, "config.mamba_proj_bias"),
    ({"projectors_bias": True}, "config.projectors_bias"),
    ({"attention_bias": True}, "config.attention_bias"),
    ({"mlp_bias": True}, "config.mlp_bias"),
    ({"mamba_conv_bias": False}, "config.mamba_conv_bias"),
    ({"time_step_limit": [0.0, 5.0]}, "config.time_step_limit"),
    ({"hidden_act": "gelu"}, "model.hidden_act"),
    ({"mamba_n_heads": 5}, "config.mamba_n_heads"),
    ({"mamba_d_ssm": 80}, "config.mamba_n_heads"),
    ({"mamba_n_groups": 4}, "config.mamba_n_heads"),
    ({"key_multiplier": 0.0}, "config.key_multiplier"),
    ({"ssm_out_multiplier": -1.0}, "config.ssm_out_multiplier"),
    ({"ssm_multipliers": [1.0, 1.0]}, "config.ssm_multipliers"),
    ({"mlp_multipliers": [1.0, "x"]}, "config.mlp_multipliers"),
])
def test_a_config_the_decoder_cannot_read_is_one_line(tmp_path, edit, key):
    """What FalconH1ForCausalLM's config may say that the decoder does not run (the gated norm, biases, a time-step
    clamp), that is no Falcon-H1 (heads that are not mamba_d_ssm channels, groups that do not divide them), or
    multipliers that are not positive numbers: one line naming the key."""
    assert_one_line_error(reconfigured_logits(MODEL, tmp_path, **edit), key)


def test_the_native_decoder_checks_the_hybrid_layer():
    """The native decoder's own checks, beneath the config reader: a Falcon-H1 layer needs its Mamba2 layers, five
    in_proj factors, multipliers that are numbers; its out_proj is ssm_out beside o, and nowhere else."""
    from iekit.formats.model_spec import decoder_spec
    from iekit.runtime import decoder_weights, native
    from iekit.runtime.decoder import native_config
    from iekit.runtime.tensor_source import TensorSource

    src = TensorSource(MODEL)
    s = decoder_spec(src.model.meta, src.model.meta_path)
    bound = decoder_weights.bind(src, s)
    native._native.Decoder(native_config(s, 16, ("f32", "f32")), bound.weights)  # as bound: accepted
    for edit, message in [({"ssm_in_mults": (1.0,) * 4}, "ssm_in_mults must be"),
                          ({"k_mult": float("nan")}, "muP multipliers must be finite"),
                          ({"ssm_attends": False}, "ssm_out_mult Falcon-H1.s layer"),
                          ({"ssm_attends": False, "ssm_out_mult": 1.0},
                           "mamba.out_proj: a Mamba2 layer.s out_proj is o")]:
        with pytest.raises(ValueError, match=message):
            native._native.Decoder(native_config(dataclasses.replace(s, **edit), 16, ("f32", "f32")), bound.weights)


@pytest.mark.parametrize("kv,key", [
    ({"falcon-h1.ssm.time_step_rank": 5}, "falcon-h1.ssm.inner_size"),
    ({"falcon-h1.ssm.state_size": None}, "falcon-h1.ssm.state_size"),
    ({"falcon-h1.ssm.inner_size": None}, "falcon-h1.ssm.inner_size"),
    ({"falcon-h1.attention.sliding_window": 8}, "falcon-h1.attention.sliding_window"),
])
def test_a_gguf_that_is_no_falcon_h1_is_one_line(tmp_path, kv, key):
    """llama.cpp's falcon-h1 takes its Mamba2 dims from ssm.*, and attends to every position: a file whose inner
    width is no whole number of heads, that lacks a dimension or states a window is refused in one line, and
    nothing is written."""
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", drop=set(kv),
                       kv={k: v for k, v in kv.items() if v is not None})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"), key)
    assert not (tmp_path / "m").exists()


def test_a_gated_norm_in_the_file_is_refused_not_dropped(tmp_path):
    """llama.cpp's falcon-h1 norms Mamba2's gated output where the file stores ssm_norm; the decoder runs Falcon-H1
    without it, so such a file is refused naming the tensor, not imported without it."""
    norm = np.ones((2, 48), np.float32)
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", tensors={"blk.0.ssm_norm.weight": norm})
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m"),
                          "blk.0.ssm_norm.weight")


def _dequantized(path, name):
    import gguf

    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.shape[::-1].tolist())


def _quantized(tmp_path, scheme: str):
    """hf/tiny-falcon-h1 converted with every matrix q4-manifest names as ``scheme`` (each command must succeed)."""
    man, q = tmp_path / "m.json", tmp_path / "q"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-falcon-h1", "-o", man, "--scheme",
                    scheme).returncode == 0
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-falcon-h1", "--out-dir", q,
                   "--q4-map", man)
    assert res.returncode == 0, res.stderr
    return q


@pytest.mark.parametrize("scheme", ["q8_0", "q4_k", "int4w"])
def test_a_quantized_export_carries_the_multipliers_in_its_scales(tmp_path, scheme):
    """llama.cpp stores Falcon-H1's matrices times the muP multipliers. Quantized, the export multiplies each
    block's f16 scales instead (the codes stay): gguf-py's dequantization of every matrix is ours times its
    multipliers (in_proj's by row group) to f16's rounding; the imported file is that model, multipliers 1."""
    q, out = _quantized(tmp_path, scheme), tmp_path / "q.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", q, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "times the model's muP multipliers" in res.stderr
    m = load_model(q)
    for name, g in [("model.layers.1.mamba.in_proj.weight", "blk.1.ssm_in.weight"),
                    ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight"),
                    ("model.layers.2.feed_forward.gate_proj.weight", "blk.2.ffn_gate.weight")]:
        t = next(t for t in m.tensors if t["name"] == name)
        with open(m.path_of(t), "rb") as f:
            f.seek(t["file_data_offset"])
            raw = np.frombuffer(f.read(t["nbytes"]), np.uint8)
        rows, cols = t["shape"]
        sch = SCHEMES[t["dtype"]]
        want = sch.dequantize(raw, rows, cols, sch.params_from(t["quant"], cols)).astype(np.float64)
        for f in falcon_h1_factors(CFG, name, rows):
            want = want * (np.asarray(f, np.float64)[:, None] if np.ndim(f) else f)
        got = _dequantized(out, g)
        assert np.abs(got - want).max() <= 2 ** -10 * np.abs(want).max(), name
    back = tmp_path / "back"
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", back).returncode == 0
    # (float activations: the models' own difference, bfloat16's rounding of the products in the float matrices)
    assert max_rel(Decoder(back, act="f32").logits(IDS), Decoder(q, act="f32").logits(IDS)) < 1e-2


def test_scales_the_multipliers_carry_beyond_float16_are_one_line(tmp_path):
    """A q8_0 block's f16 scale times a multiplier f16 cannot hold: one line naming the tensor, and nothing written."""
    q = _quantized(tmp_path, "q8_0")
    big = edited_artifact(q, tmp_path / "big", lambda m: reconfigure(m, ssm_out_multiplier=1e9))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", big, "--out", tmp_path / "q.gguf")
    assert_one_line_error(res, "mamba.out_proj.weight")
    assert "beyond float16" in res.stderr and not (tmp_path / "q.gguf").exists()


def test_mxfp4_matrices_cannot_carry_the_multipliers(tmp_path):
    """MXFP4's scales are powers of two: the export refuses them in one line naming the tensor and what to do,
    and writes nothing."""
    q = _quantized(tmp_path, "mxfp4")
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", q, "--out", tmp_path / "q.gguf")
    assert_one_line_error(res, "muP multiplier")
    assert "--requantize" in res.stderr and not (tmp_path / "q.gguf").exists()


def test_a_tied_head_is_written_as_its_own_output(tmp_path):
    """A tied Falcon-H1 multiplies one matrix by embedding_multiplier on the way in and lm_head_multiplier on the
    way out; llama.cpp would read token_embd (times the first) as its head, so the export writes output.weight:
    the embedding times the second."""
    from gguf_build import hf_tensors
    from safetensors.numpy import save_file

    hf = tmp_path / "hf"
    hf.mkdir()
    for f in (GOLDEN_HF / "tiny-falcon-h1").iterdir():
        (hf / f.name).write_bytes(f.read_bytes())
    (hf / "config.json").write_text(json.dumps({**CFG, "tie_word_embeddings": True, "dtype": "float32"}))
    weights = hf_tensors(GOLDEN_HF / "tiny-falcon-h1")  # (float32: numpy has no bfloat16 to write)
    del weights["lm_head.weight"]
    save_file(weights, hf / "model.safetensors", metadata={"format": "pt"})
    ie, out = tmp_path / "ie", tmp_path / "t.gguf"
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", ie).returncode == 0
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", ie, "--out", out)
    assert res.returncode == 0, res.stderr
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    embed = weights["model.embed_tokens.weight"]
    for g, mult in (("token_embd.weight", CFG["embedding_multiplier"]), ("output.weight", CFG["lm_head_multiplier"])):
        assert np.array_equal(np.asarray(tensors[g].data).reshape(embed.shape), embed * np.float32(mult)), g
    back = tmp_path / "back"
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--out-dir", back).returncode == 0
    assert max_rel(Decoder(back, act="f32").logits(IDS), Decoder(ie, act="f32").logits(IDS)) < 1e-5


def test_the_imatrix_has_both_output_projections(tmp_path):
    """An imatrix of Falcon-H1 has each layer's eight matrices, its Mamba2 out_proj under the gated scan's own
    statistics (not the attention's o_proj inputs, which are as wide in the toy), beside the head's."""
    z = imatrix_of(MODEL, IDS, tmp_path)
    layer = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mamba.in_proj",
             "mamba.out_proj", "feed_forward.gate_proj", "feed_forward.up_proj", "feed_forward.down_proj")
    assert sorted(k for k in z.files if k != "__meta__.json") == sorted(
        ["lm_head.weight", *(f"model.layers.{i}.{p}.weight" for i in range(3) for p in layer)])
    for i in range(3):
        o, out = z[f"model.layers.{i}.self_attn.o_proj.weight"], z[f"model.layers.{i}.mamba.out_proj.weight"]
        assert o.shape == out.shape == (96,) and (out > 0).all() and not np.allclose(o, out)
        pre = f"model.layers.{i}."
        assert np.array_equal(z[pre + "mamba.in_proj.weight"], z[pre + "self_attn.q_proj.weight"])


def test_gptq_quantizes_every_layer_and_the_export_takes_it(tmp_path):
    """gptq's covariances reach every matrix, Mamba2's out_proj under its own; the quantized model stays near the
    float one, and it exports (its q8_0 scales times the multipliers)."""
    g = gptq_q8_0("tiny-falcon-h1", tmp_path, True)
    q = load_model(g).meta["tensors"]
    assert {t["dtype"] for t in q if len(t["shape"]) == 2 and "embed" not in t["name"]} >= {"q8_0"}
    ref = np.load(REF / "logits.npy").astype(np.float64)
    assert max_rel(Decoder(g, act="f32").logits(IDS), ref) < 0.05
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", g, "--out", tmp_path / "g.gguf")
    assert res.returncode == 0, res.stderr
