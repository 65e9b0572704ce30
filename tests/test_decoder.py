"""The decoder runtime against transformers' frozen outputs and a float64 reference.

golden/ref holds logits and greedy ids computed by transformers (see
golden/README.md); tests/decoder_ref.py is an independent numpy forward
pass used for quantized artifacts, where no transformers output exists.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from conftest import (GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, max_rel, reconfigure,
                      run_tool, st_write)
from decoder_ref import forward, kl_top1, load_weights
from iekit.formats.errors import IEError
from iekit.runtime import native
from iekit.runtime.decoder import Decoder
from iekit.formats.model_spec import rope_tables
from iekit.runtime.sampling import Sampler, generate

# tiny-mistral: sliding_window 4 over the 12 reference ids; tiny-llama3: rope_type llama3; tiny-qwen3:
# q/k norms; the rest mixtures of experts (tests/test_moe.py), gpt-oss with sinks, YaRN and MXFP4 experts;
# tiny-gemma3: (1 + w) and sandwich norms, GELU, scaled embeddings, a local RoPE base, linear RoPE scaling;
# tiny-gemma2: Gemma's layer with soft-capped scores and logits; tiny-gemma: Gemma 1's (Llama's layer with Gemma's
# norms, scale and GELU, one key head); tiny-arcee: Llama's layer with an ungated ReLU-squared MLP, YaRN;
# tiny-stablelm: LayerNorms with biases, a quarter of each head rotated, q/k/v biases; tiny-starcoder2: the same
# norms, every projection's bias, an MLP without a gate (GELU), a sliding window; tiny-nemotron: LayerNorm1P with
# biases, half of each head rotated, an MLP without a gate (ReLU squared); tiny-phi: Phi-2's parallel layer, biases on
# every projection and the head; tiny-phi3: fused matrices, partial RoPE,
# LongRoPE, a sliding window; tiny-smollm3: a layer without RoPE; tiny-granite: Granite's multipliers;
# tiny-olmo2: output norms alone, q/k norms over the whole projections; tiny-olmo3: with sliding layers;
# tiny-ministral3: YaRN and Llama 4's attention temperature; tiny-exaone4: 64 layers, OLMo 2's norms with
# per-head q/k norms, sliding layers and unrotated full ones; tiny-olmoe: experts with whole-projection q/k norms;
# tiny-qwen2-moe: routed experts beside a gated shared expert, q/k/v biases; tiny-glm4-moe: a dense layer, then
# sigmoid routing with a choice bias and a scale beside a shared expert, q/k norms, half-head RoPE, an unread MTP layer;
# tiny-minimax-m2: sigmoid routing with a choice bias in every layer, whole-projection q/k norms, half-head RoPE;
# tiny-deepseek-v3: latent attention (q_lora, values narrower than keys), YaRN's mscale on the scores, GLM-4.5's
# router in groups, an unread MTP layer; tiny-deepseek-v2: latent attention with q_proj over 27 layers, softmax
# routing never renormalised, two shared experts; tiny-glm4-moe-lite: GLM-4.7-Flash's (latent attention,
# GLM-4.5's router, mlp_layer_types, an unread MTP layer); tiny-mistral4: Mistral Small 4's (latent attention under
# YaRN and Llama 4's temperature, softmax routing renormalised and scaled, the experts in two stacks); tiny-llama4: chunked attention, q/k divided by their RMS
# after RoPE, an unrotated layer with the temperature, experts fed their sigmoid weight beside a shared one at
# alternate layers, gate_up_proj's halves, llama3 RoPE with equal factors; tiny-ernie4-5: GLM-4's interleaved RoPE
# over whole heads; tiny-ernie4-5-moe: a dense layer, then softmax routing with a choice bias beside 2 shared experts,
# its unread MTP tensors; tiny-qwen3-5: three gated DeltaNet layers (2 key heads for 4 value heads, a 4-tap
# convolution), then gated full attention with per-head q/k norms and a quarter of each head rotated, (1 + w) norms;
# tiny-qwen3-5-moe: the same layers with softmax-routed experts (renormalised) beside a gated shared expert;
# tiny-qwen3-next: tiny-qwen3-5-moe's layers with the DeltaNet's projections fused, blocked by key head;
# tiny-seed-oss: q/k/v biases; tiny-apertus: xIELU (each layer's own parameters) without a gate, per-head q/k
# norms, Llama-3 scaling; tiny-afmoe: sandwich norms, a gated attention output, three sliding layers and an
# unrotated full one, a dense layer then sigmoid routing with a choice bias beside a shared expert, normed together,
# embeddings times sqrt(hidden); tiny-dots1: per-head q/k norms, a dense layer, then DeepSeek-V3's router (sigmoid
# scores plus a choice bias, 2 groups of 2 experts, the better kept, renormalised, x 2.5) beside a shared expert;
# tiny-solar-open: Llama's attention, GLM-4.5's router and shared expert in every layer; tiny-youtu: DeepSeek-V3's
# latent attention with a dense MLP in every layer, tied; tiny-jais2: biases on every projection and LayerNorm, an
# MLP of ReLU squared without a gate; tiny-exaone-moe: EXAONE 4's attention (three sliding layers, an unrotated
# full one) in pre-norm layers, a dense layer then DeepSeek-V3's router beside a shared expert, an unread MTP layer
# beside the model; tiny-glm4: interleaved partial RoPE, norms around each block, fused gate_up;
# tiny-cohere2: LayerNorm, parallel blocks, sliding layers with interleaved RoPE, unrotated full ones; tiny-cohere:
# the same layer, every layer full and rotated; tiny-lfm2: short gated convolutions (3 taps) in three layers of
# four, attention with per-head q/k norms in the other, LFM2's names and MLP width rule; tiny-lfm2-moe: the same
# layers, a dense MLP in the first, then experts chosen by sigmoid score plus a choice bias, renormalised;
# tiny-granite4: Mamba2 in three layers of four (8 heads, B and C in 2 groups, a 4-tap convolution with bias),
# attention without RoPE in the other, Granite's multipliers, 4 softmax-routed experts (gate_up halves) beside a shared
# MLP fused as input_linear; tiny-granite4-dense: the same layers with one group and the shared MLP alone;
# tiny-granite-moe: Granite's attention with RoPE, those experts in every layer; tiny-granite-moe-shared: beside a
# shared MLP; tiny-nemotron-h: blocks of one mixer each (Mamba2 4 heads wide, narrower than twice the model; a
# ReLU-squared MLP without a gate; attention without RoPE), two Mamba2 blocks in a row; tiny-nemotron-h-moe: expert
# blocks (ReLU-squared, sigmoid scores plus a choice bias, renormalised and scaled) beside a shared expert;
# tiny-hunyuan-dense: per-head q/k norms after RoPE, the NTK-alpha base, tied; tiny-hunyuan-moe: those norms, a
# shared MLP beside 2 of 4 softmax-routed experts (renormalised) in every layer, its per-layer keys as lists;
# tiny-hy-v3: per-head q/k norms, a dense layer, then sigmoid routing with a choice bias, renormalised and scaled,
# beside a shared expert (the Hub's names: mlp.router.gate, mlp.expert_bias, mlp.shared_mlp); an unread MTP layer;
# tiny-mamba2: Mamba2 alone in every layer (4 heads of 32, B and C in 2 groups, a 4-tap convolution with bias);
# tiny-olmo: Llama's layer under LayerNorms without weights, q, k and v clamped (about a fifth of them), tied;
# tiny-granite-swa: Granite's multipliers, a learned sink per head, three sliding layers (one without RoPE);
# tiny-granite-moe-swa: that attention with 2 of 4 softmax-routed experts (gate_up stacks) beside a shared MLP;
# tiny-falcon-h1: Mamba2 (6 heads of 16, no gated norm) beside attention in every layer, the two summed, every muP
# multiplier away from 1; tiny-mamba: Mamba 1's selective scan alone in every layer (128 channels, states of 16, a
# time-step rank of 8), tied; tiny-falcon-mamba: the same with dt's low rank, B and C RMS-normed, untied.
MODELS = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-llama3", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral",
          "tiny-gpt-oss", "tiny-gpt-oss-mxfp4", "tiny-gemma3", "tiny-gemma2", "tiny-gemma", "tiny-arcee", "tiny-stablelm",
          "tiny-starcoder2", "tiny-nemotron", "tiny-phi", "tiny-phi3",
          "tiny-smollm3", "tiny-granite", "tiny-olmo2", "tiny-olmo3", "tiny-ministral3", "tiny-exaone4",
          "tiny-olmoe", "tiny-qwen2-moe", "tiny-glm4-moe", "tiny-minimax-m2", "tiny-deepseek-v3", "tiny-deepseek-v2",
          "tiny-glm4-moe-lite", "tiny-mistral4", "tiny-llama4", "tiny-ernie4-5", "tiny-ernie4-5-moe", "tiny-seed-oss", "tiny-apertus",
          "tiny-afmoe", "tiny-dots1", "tiny-solar-open", "tiny-youtu", "tiny-jais2",
          "tiny-exaone-moe", "tiny-glm4",
          "tiny-cohere2", "tiny-cohere", "tiny-qwen3-5", "tiny-qwen3-5-moe",
          "tiny-qwen3-next", "tiny-lfm2", "tiny-lfm2-moe", "tiny-granite4", "tiny-granite4-dense", "tiny-granite-moe",
          "tiny-granite-moe-shared", "tiny-nemotron-h", "tiny-nemotron-h-moe", "tiny-hunyuan-dense", "tiny-hunyuan-moe",
          "tiny-hy-v3", "tiny-mamba2", "tiny-olmo", "tiny-granite-swa", "tiny-granite-moe-swa", "tiny-falcon-h1",
          "tiny-mamba", "tiny-falcon-mamba"]
# The context a model's references ran in: tiny-phi3's stay within LongRoPE's original 32 positions, where
# transformers turns by the short factors; ierun chooses them by the context, as llama.cpp does.
CTX = {"tiny-phi3": ["--ctx", "32"]}


def _ref(model: str, name: str):
    p = GOLDEN_REF / model / name
    return np.load(p) if name.endswith(".npy") else json.loads(p.read_text())




@pytest.fixture(scope="module")
def q4_dirs(tmp_path_factory):
    """tiny-llama converted with the default int4w policy and with q8_0 everywhere."""
    root = tmp_path_factory.mktemp("quant")
    hf = GOLDEN_HF / "tiny-llama"
    out = {}
    for tag, scheme in (("int4w", "int4w"), ("q8_0", "q8_0")):
        man = root / f"{tag}.json"
        assert run_tool("ieconv", "q4-manifest", "--hf-dir", hf, "-o", man, "--scheme", scheme).returncode == 0
        out[tag] = root / tag
        res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", out[tag], "--q4-map", man)
        assert res.returncode == 0, res.stderr
    return out


# ------------------------------------------------------------ parity with transformers

@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("threads", [1, 2])
def test_logits_match_transformers(tmp_path, model, threads):
    out = tmp_path / "l.npy"
    ids = ",".join(map(str, _ref(model, "ids.json")))
    # --act f32: the reference ran in f32 (the default, auto, runs int8 activations into tiny-gpt-oss-mxfp4's experts)
    # and an f32 KV cache, as transformers keeps (the default, f16, is tested below).
    res = run_tool("ierun", "logits", "--model-dir", GOLDEN_IEBIN / model, "--ids", ids, "--out", out,
                   "--threads", str(threads), "--act", "f32", "-ctk", "f32", "--cache-type-v", "f32", *CTX.get(model, []))
    assert res.returncode == 0, res.stderr
    got, ref = np.load(out), _ref(model, "logits.npy")
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert max_rel(got, ref) <= 1e-4


def test_commands_default_to_an_f16_kv_cache(tmp_path):
    """As llama.cpp: `ierun logits` without -ctk/-ctv runs the f16 cache
    (the same floats as the library's Decoder with it), close to
    transformers' f32 logits but not equal to the f32 cache's."""
    ids = _ref("tiny-llama", "ids.json")
    res = run_tool("ierun", "logits", "-m", GOLDEN_IEBIN / "tiny-llama", "--ids", ",".join(map(str, ids)),
                   "--out", tmp_path / "l.npy", "--threads", "1", "--act", "f32")
    assert res.returncode == 0, res.stderr
    got = np.load(tmp_path / "l.npy")
    half = Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32", cache_type_k="f16", cache_type_v="f16").logits(ids)
    assert np.array_equal(got, half)
    assert not np.array_equal(got, Decoder(GOLDEN_IEBIN / "tiny-llama", act="f32").logits(ids))
    assert max_rel(got, _ref("tiny-llama", "logits.npy")) <= 5e-3
    bad = run_tool("ierun", "logits", "-m", GOLDEN_IEBIN / "tiny-llama", "--ids", "1", "--out", tmp_path / "m.npy",
                   "-ctv", "q4_0")
    assert bad.returncode == 2 and "'q4_0' is not one of 'f16', 'f32'" in bad.stderr


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", ["greedy.json", "greedy_text.json"])
def test_greedy_ids_match_transformers(model, case):
    ref = _ref(model, case)
    args = ["--prompt", ref["prompt_text"]] if "prompt_text" in ref else ["--ids", ",".join(map(str, ref["prompt_ids"]))]
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / model, *args,
                   "--max-new", str(ref["max_new_tokens"]), "--json", *CTX.get(model, []))
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["prompt_ids"] == ref["prompt_ids"]
    assert got["generated_ids"] == ref["generated_ids"]


def test_generate_streams_text():
    ref = _ref("tiny-llama", "greedy_text.json")
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--prompt", ref["prompt_text"],
                   "--max-new", "16")
    assert res.returncode == 0, res.stderr
    # Streamed piece by piece (partial UTF-8 held back), the output adds up to
    # the whole text, with control characters escaped (the golden text has \x0e).
    assert "\x0e" in ref["generated_text"]
    assert res.stdout == ref["generated_text"].replace("\x0e", "\\x0e") + "\n"


# ------------------------------------------------------------ runtime mechanics

def test_chunked_prefill_equals_token_by_token():
    """The prefill runs up to 8 tokens per weight read; the result must not
    depend on where chunks start (19 ids cross two chunk boundaries)."""
    rng = np.random.default_rng(3)
    ids = [int(i) for i in rng.integers(0, 320, 19)]
    d = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2)
    all_at_once = d.logits(ids)
    d.reset()
    one_by_one = np.stack([d.prefill(ids[:1])] + [d.step(t) for t in ids[1:]])
    assert max_rel(one_by_one, all_at_once.astype(np.float64)) <= 1e-5


def test_logits_into_a_callers_buffer():
    """`out=` (ierun eval's per-run buffer) receives exactly what a fresh array would,
    and is refused, with one message, when it is not exactly that array's shape and type."""
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    d = Decoder(GOLDEN_IEBIN / "tiny-llama")
    fresh = d.logits(ids, 4)
    buf = np.full((len(ids) - 4, d.spec.vocab), np.nan, np.float32)
    got = d.logits(ids, 4, out=buf)
    assert np.shares_memory(got, buf) and np.array_equal(buf, fresh)
    bad = [np.empty((len(ids) - 3, d.spec.vocab), np.float32), np.empty((len(ids) - 4, d.spec.vocab)),
           np.empty((d.spec.vocab, len(ids) - 4), np.float32).T, np.empty((len(ids) - 4) * d.spec.vocab, np.float32)]
    for out in bad:
        with pytest.raises(IEError, match=r"out must be a writeable C-contiguous float32 array of shape \[n, vocab\]"):
            d.logits(ids, 4, out=out)


def test_prefix_reuse_counts_hits_and_keeps_results():
    d = Decoder(GOLDEN_IEBIN / "tiny-qwen2")
    a = d.prefill([0, 5, 9, 200, 31])
    assert (d.kv_hits, d.kv_misses) == (0, 5)
    b = d.prefill([0, 5, 9, 200, 31])  # the last id is recomputed: its logits are the result
    assert (d.kv_hits, d.kv_misses) == (4, 6)
    c = d.prefill([0, 5, 7])
    assert (d.kv_hits, d.kv_misses) == (6, 7) and d.n_past == 3
    # a ran the last id inside a 5-token chunk, b alone: same math, other summation order.
    assert max_rel(b, a.astype(np.float64)) <= 1e-6
    assert max_rel(c, Decoder(GOLDEN_IEBIN / "tiny-qwen2").prefill([0, 5, 7]).astype(np.float64)) <= 1e-6


def test_sampling_is_seeded_and_top_p_tiny_is_greedy():
    d = Decoder(GOLDEN_IEBIN / "tiny-llama")
    prompt = [0, 145, 290]
    greedy = generate(d, prompt, 8, Sampler())
    assert generate(d, prompt, 8, Sampler(temp=0.7, top_p=1e-9, seed=1)) == greedy
    runs = [generate(d, prompt, 8, Sampler(temp=1.0, seed=s)) for s in (5, 5, 6)]
    assert runs[0] == runs[1] != runs[2]
    with pytest.raises(IEError, match="top-p"):
        Sampler(top_p=0)


def test_llama3_rope_scaling_keeps_high_and_divides_low_frequencies():
    base, one = rope_tables(128, 500000.0, None)
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    got, scale = rope_tables(128, 500000.0, sc)
    assert one == scale == 1.0
    wavelen = 2 * np.pi / base
    assert np.array_equal(got[wavelen < 8192 / 4], base[wavelen < 8192 / 4])
    assert np.allclose(got[wavelen > 8192], base[wavelen > 8192] / 8)
    mid = (wavelen >= 2048) & (wavelen <= 8192)
    assert mid.any() and np.all((got[mid] <= base[mid]) & (got[mid] >= base[mid] / 8))
    with pytest.raises(IEError, match="dynamic"):
        rope_tables(128, 1e4, {"rope_type": "dynamic", "factor": 2.0})


def test_yarn_matches_gpt_oss_published_tables():
    """gpt-oss-20b's YaRN (factor 32 over 4096 positions, beta 32/1, truncate
    false): frequencies above the beta_fast band kept, below beta_slow's
    divided by 32, a linear ramp between, and cos/sin scaled by 0.1 ln 32 + 1
    (transformers' _compute_yarn_parameters, recomputed here in float64)."""
    sc = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
          "original_max_position_embeddings": 4096, "truncate": False}
    d, theta = 64, 150000.0
    got, scale = rope_tables(d, theta, sc)
    assert scale == pytest.approx(0.1 * np.log(32) + 1)
    base = 1 / theta ** (np.arange(0, d, 2) / d)
    lo, hi = (d * np.log(4096 / (b * 2 * np.pi)) / (2 * np.log(theta)) for b in (32.0, 1.0))

    def ref(lo, hi):
        ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
        return base / 32 * ramp + base * (1 - ramp)

    assert np.allclose(got, ref(lo, hi), rtol=1e-6, atol=0)
    assert got[0] == pytest.approx(base[0], rel=1e-6) and got[-1] == pytest.approx(base[-1] / 32, rel=1e-6)
    # truncate (the default): the band's ends rounded outwards to whole dimensions (8.08, 17.4 -> 8, 18)
    truncated, same = rope_tables(d, theta, {**sc, "truncate": True})
    assert same == scale and not np.allclose(truncated, got, rtol=1e-4)
    assert np.allclose(truncated, ref(np.floor(lo), np.ceil(hi)), rtol=1e-6, atol=0)
    for bad, needle in (({"beta_fast": "x"}, "beta_fast"), ({"mscale": -1, "mscale_all_dim": 1}, "mscale")):
        with pytest.raises(IEError, match=needle):
            rope_tables(d, theta, {**sc, **bad})
    with pytest.raises(IEError, match="above 1"):
        rope_tables(d, 1.0, sc)


def test_llama_attention_bias_reaches_every_projection(tmp_path):
    """A Llama with attention_bias: true has q, k, v and o biases; every one
    present is read (o_proj's was once ignored), against the float64 reference."""
    from iekit.formats.safetensors_reader import SafetensorsFile

    hf = tmp_path / "hf"
    hf.mkdir()
    tensors, rng = {}, np.random.default_rng(9)
    for shard in sorted((GOLDEN_HF / "tiny-llama").glob("*.safetensors")):
        with SafetensorsFile(shard) as sf:
            for name, t in sf.tensors.items():
                tensors[name] = ("F32", list(t.shape), b"".join(sf.iter_chunks(t)))
                if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")):
                    bias = (0.3 * rng.standard_normal(t.shape[0])).astype(np.float32)
                    tensors[name.replace(".weight", ".bias")] = ("F32", [t.shape[0]], bias.tobytes())
    st_write(hf / "model.safetensors", tensors)
    config = json.loads((GOLDEN_HF / "tiny-llama" / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    ids = _ref("tiny-llama", "ids.json")
    model, w = load_weights(tmp_path / "m")
    got = Decoder(tmp_path / "m").logits(ids)
    assert max_rel(got, forward(model, w, ids)) <= 1e-5
    del w["model.layers.0.self_attn.o_proj.bias"], w["model.layers.1.self_attn.o_proj.bias"]
    assert max_rel(got, forward(model, w, ids)) > 1e-2  # the o biases matter here


def test_mistral_sliding_window_against_float64_reference(tmp_path):
    """tiny-llama's weights relabelled Mistral with sliding_window 4: the
    first 4 positions equal full attention, later ones follow the window,
    whether the ids run as one prefill or token by token."""
    d = _edited(tmp_path, lambda m: reconfigure(m, architecture="MistralForCausalLM", sliding_window=4))
    ids = _ref("tiny-llama", "ids.json")
    model, w = load_weights(d)
    ref = forward(model, w, ids, window=4)
    dec = Decoder(d, threads=2)
    got = dec.logits(ids)
    assert max_rel(got, ref) <= 1e-5
    assert max_rel(got, forward(model, w, ids)) > 1e-2  # the window matters for this sequence
    dec.reset()
    steps = np.stack([dec.prefill(ids[:1])] + [dec.step(t) for t in ids[1:]])
    assert max_rel(steps, ref) <= 1e-5


@pytest.mark.parametrize("window", [0, 300, 64])
def test_attention_over_several_key_blocks_at_any_thread_count(tmp_path, window):
    """Attention reads the KV cache a block of keys at a time (256 at head_dim
    16) for all the queries of a work item, and how queries are grouped into
    items depends on the chunk and the threads. Over 600 positions (f32
    prefill chunks of 256, then decode steps) a query spans up to three
    blocks, and with a 300-position window starts inside one; the decode
    steps past 512 positions run as two spans whose softmaxes are merged
    (with a 64-position window the first span is empty): the logits
    must follow the float64 reference and not change by one bit with the
    thread count."""
    d = _edited(tmp_path, lambda m: reconfigure(m, max_position_embeddings=640, **(
        dict(architecture="MistralForCausalLM", sliding_window=window) if window else {})))
    ids = [int(i) for i in np.random.default_rng(7).integers(0, 320, 600)]
    model, w = load_weights(d)
    ref = forward(model, w, ids, window=window)
    runs = []
    for threads in (1, 2, 3):
        dec = Decoder(d, threads=threads)
        got = np.concatenate([dec.logits(ids[:590])] + [dec.step(t)[None] for t in ids[590:]])
        assert max_rel(got, ref) <= 1e-5, threads
        runs.append(got)
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    if window:
        assert max_rel(runs[0], forward(model, w, ids)) > 1e-2  # the window matters here


@pytest.mark.parametrize("model,fields", [
    ("tiny-gpt-oss", {}),
    ("tiny-llama4", {"attention_chunk_size": 300, "floor_scale": 200}),
])
def test_decode_spans_merge_with_sinks_windows_and_chunks(tmp_path, model, fields):
    """Decoding at 600..699 positions, each step's attention in spans of 512
    merged afterwards: gpt-oss (attention sinks, joining at the merge; a
    4-position sliding layer and a full one), Llama 4 with chunks of 300
    (the steps' chunk starts at 600, inside the second span, the first span
    empty) and a temperature stepping every 200. Each must give the logits
    the one-pass prefill gives for the same positions, with any thread count
    bit for bit."""
    d = edited_artifact(GOLDEN_IEBIN / model, tmp_path / "m",
                        lambda m: reconfigure(m, max_position_embeddings=800, **fields))
    ids = [int(i) for i in np.random.default_rng(5).integers(0, 320, 700)]
    whole = Decoder(d, threads=2, act="f32").logits(ids)[600:]
    runs = []
    for threads in (1, 3):
        dec = Decoder(d, threads=threads, act="f32")
        dec.prefill(ids[:600])
        runs.append(np.stack([dec.step(t) for t in ids[600:]]))
    assert np.array_equal(runs[0], runs[1])
    assert max_rel(runs[0], whole) <= 1e-5  # row i: the logits after ids[:601 + i]


@pytest.mark.parametrize("window", [0, 300])
def test_f16_kv_cache_holds_keys_and_values_as_halves(tmp_path, window):
    """cache_type_k/v f16 (the commands' default): over 600 positions
    (several key blocks, prefill chunks and decode steps, a window that
    starts inside a block) the logits follow a float64 reference whose keys
    and values are rounded to float16, ten times closer than they follow the
    exact one (so the cache really holds halves, and nothing else changed),
    and do not change by one bit with the thread count."""
    d = _edited(tmp_path, lambda m: reconfigure(m, max_position_embeddings=640, **(
        dict(architecture="MistralForCausalLM", sliding_window=window) if window else {})))
    ids = [int(i) for i in np.random.default_rng(7).integers(0, 320, 600)]
    model, w = load_weights(d)
    ref16 = forward(model, w, ids, window=window, k_dtype=np.float16, v_dtype=np.float16)
    exact = forward(model, w, ids, window=window)
    runs = []
    for threads in (1, 3):
        dec = Decoder(d, threads=threads, cache_type_k="f16", cache_type_v="f16")
        assert dec.cache_types == ("f16", "f16")
        got = np.concatenate([dec.logits(ids[:590])] + [dec.step(t)[None] for t in ids[590:]])
        assert max_rel(got, ref16) <= 2e-4 and max_rel(got, exact) > 1e-3, threads
        runs.append(got)
    assert np.array_equal(runs[0], runs[1])
    # Each half of the cache on its own: keys in halves, values in floats follows the reference
    # that rounds the keys alone, and not the one that rounds both.
    k_only = Decoder(d, threads=2, cache_type_k="f16").logits(ids)
    ref_k16 = forward(model, w, ids, window=window, k_dtype=np.float16)
    assert max_rel(k_only, ref_k16) <= 2e-4 and max_rel(k_only, ref16) > 3 * max_rel(k_only, ref_k16)


def test_cache_type_is_checked_before_the_model_loads():
    with pytest.raises(IEError, match="--cache-type-v: 'q8_0' is not a KV cache type"):
        Decoder(GOLDEN_IEBIN / "tiny-llama", cache_type_v="q8_0")
    from iekit.runtime import kv_cache

    assert kv_cache.resolve("cpu", None, None) == ("f16", "f16")
    assert kv_cache.resolve("cuda", None, "f32") == ("f32", "f32")
    with pytest.raises(IEError, match="--cache-type-k f16: the CUDA decoder keeps an f32 KV cache"):
        kv_cache.resolve("cuda", "f16", None)


def test_work_touch_continues_after_the_last_byte_read():
    """touch(n, stride) reads one byte every stride from where the last call
    stopped: 1000 bytes at stride 256 read offsets 0, 256, 512, 768, so the
    next call starts at 1024."""
    raw = np.fromfile(GOLDEN_IEBIN / "tiny-llama" / "model.ie.bin", np.uint8)
    d = Decoder(GOLDEN_IEBIN / "tiny-llama")
    assert d.touch(1000, 256) == int(raw[[0, 256, 512, 768]].sum())
    assert d.touch(512, 256) == int(raw[[1024, 1280]].sum())
    assert d.touch(raw.size, raw.size) == int(raw[1536])  # wraps around the file


# ------------------------------------------------------------ quantized artifacts

@pytest.mark.parametrize("act,tol", [("f32", 1e-4), ("int8", 3e-2)])
def test_int4w_decoder_matches_float64_reference_over_dequantized_weights(q4_dirs, act, tol):
    rng = np.random.default_rng(7)
    ids = [int(i) for i in rng.integers(0, 320, 24)]
    for m in (q4_dirs["int4w"], GOLDEN_IEBIN / "tiny-llama-mixedq"):
        model, w = load_weights(m)
        d = Decoder(m, threads=2, act=act)
        assert "int4w" in d.precision
        assert max_rel(d.logits(ids), forward(model, w, ids)) <= tol


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512", "amx"])
def test_int8_decode_steps_match_float64_reference(q4_dirs, tmp_path, isa):
    """One token at a time: on AVX2, AVX-VNNI and AVX-512 the steps read the rows8
    copies (q/k/v in one call with Qwen2's biases, gate/up fused with
    SwiGLU); the scalar ISA reads the mapped file."""
    if isa not in native.cpu_features()["isas"]:
        pytest.skip(f"no {isa} here")
    rng = np.random.default_rng(11)
    ids = [int(i) for i in rng.integers(0, 320, 12)]
    qwen = tmp_path / "qwen2-int4w"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-qwen2", "-o", tmp_path / "m.json").returncode == 0
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-qwen2", "--out-dir", qwen,
                    "--q4-map", tmp_path / "m.json").returncode == 0
    # int8 activations' own error against the float64 reference (both ISAs alike): tiny-qwen2
    # measures 0.032, the Llamas under 0.03
    for m, tol in ((q4_dirs["int4w"], 3e-2), (GOLDEN_IEBIN / "tiny-llama-mixedq", 3e-2), (qwen, 5e-2)):
        model, w = load_weights(m)
        d = Decoder(m, threads=2, act="int8", isa=isa)
        assert (d.rows8_bytes > 0) == (isa != "scalar")
        got = np.stack([d.prefill(ids[:1])] + [d.step(t) for t in ids[1:-1]])
        assert max_rel(got, forward(model, w, ids[:-1])) <= tol, m


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512", "amx"])
def test_int8_prefill_chunks_give_the_logits_of_single_steps(q4_dirs, isa):
    """A 77-token int8 prefill runs in chunks (on AVX2, AVX-VNNI and AVX-512, where
    every matrix has a rows8 copy, of 64 tokens and then 13; else of 8):
    each token's logits must be those of feeding the tokens one decode step
    at a time. AVX-512 runs a chunk's tokens eight at a time over two tiles
    (rows8_pairs.h, gate/up with SwiGLU and q/k/v in one call), a step one
    tile at a time. A chunk
    sums each token's products as a step does, and the attention's order does not depend on the
    chunk, so they agree to float rounding (int4w's steps sum a group's
    blocks before scaling); a chunk that mixed tokens' rows or columns, or
    dropped a tail, would not."""
    if isa not in native.cpu_features()["isas"]:
        pytest.skip(f"no {isa} here")
    rng = np.random.default_rng(5)
    ids = [int(i) for i in rng.integers(0, 320, 77)]
    for m in (q4_dirs["q8_0"], q4_dirs["int4w"]):
        d = Decoder(m, threads=2, act="int8", isa=isa)
        whole = d.logits(ids)
        steps = np.stack([d.prefill(ids[:1])] + [d.step(t) for t in ids[1:]])
        model, w = load_weights(m)
        assert max_rel(whole, forward(model, w, ids)) <= 5e-2, m  # int8 activations' own error: 0.033 and 0.041
        assert max_rel(whole, steps) <= 1e-5, m  # measured 0 (scalar) and 3-4e-7 (avx2: the head's GEMM)


def test_act_auto_is_int8_for_4bit_layers_only(q4_dirs):
    assert Decoder(q4_dirs["int4w"]).act == "int8"
    assert Decoder(GOLDEN_IEBIN / "tiny-llama-mixedq").act == "int8"
    assert Decoder(q4_dirs["q8_0"]).act == "f32" and Decoder(GOLDEN_IEBIN / "tiny-llama").act == "f32"
    assert Decoder(q4_dirs["int4w"], act="f32").act == "f32" and Decoder(q4_dirs["int4w"]).rows8_bytes > 0


def test_quantized_logits_against_f32_top1_and_kl(q4_dirs):
    """Agreement with the f32 artifact. The tiny golden models have random
    weights and nearly flat logits, so 4-bit noise flips many top-1s
    (measured: 41% top-1, KL 0.12 nats over 100 random ids); a wrong nibble
    order or scale would give ~0.3% top-1 and KL > 1. q8_0 must be near lossless."""
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, 320, 100)]
    f32 = Decoder(GOLDEN_IEBIN / "tiny-llama").logits(ids)
    kl4, top4 = kl_top1(f32, Decoder(q4_dirs["int4w"]).logits(ids))
    kl8, top8 = kl_top1(f32, Decoder(q4_dirs["q8_0"]).logits(ids))
    print(f"int4w: KL {kl4:.4f} top-1 {top4:.2f}; q8_0: KL {kl8:.5f} top-1 {top8:.2f}")
    assert kl4 < 0.2 and top4 > 0.3
    assert kl8 < 0.002 and top8 > 0.9


@pytest.mark.parametrize("scheme", [None, "int4w"])
def test_dedup_served_weights_give_bit_identical_logits(request, monkeypatch, scheme):
    """Layer 1 is layer 0 with 1% of elements changed, kept f32 or quantized
    to int4w (dedup works on packed bytes alike): plan + extract find the
    copies, and with IE_DEDUP=1 the decoder reads the rebuilt tensors; its
    logits must equal the model.ie.bin ones bit for bit."""
    model = request.getfixturevalue(f"nearcopy_{scheme or 'f32'}")
    ids = [0, 145, 290, 87, 232, 29, 174]
    plain = Decoder(model).logits(ids)
    monkeypatch.setenv("IE_DEDUP", "1")
    monkeypatch.setenv("IE_DEDUP_STRICT", "1")
    d = Decoder(model)
    names = [t["name"] for t in d.model.tensors]
    served = [n for n in names if d.source.source_of(n) == "dedup"]
    # f32: both layers' seven projections. int4w: the plan keeps only groups
    # that save bytes; the small attention matrices' re-searched scales
    # differ too much, the MLP matrices still group.
    assert len(served) >= (14 if scheme is None else 6)
    assert {d.source.entry(n)["dtype"] for n in served} == {scheme or "f32"}
    assert d.dedup_stats["active"] and d.dedup_stats["misses"] == len(served)
    got = d.logits(ids)
    if scheme is None:
        assert np.array_equal(got, plain)
    else:
        # int8 activations: a member is multiplied by the stored-layout kernel, the plain
        # model by its rows8 copy; equal products per block, summed in another order.
        np.testing.assert_allclose(got, plain, rtol=0, atol=1e-5 * np.abs(plain).max())
        assert (got.argmax(-1) == plain.argmax(-1)).all()


# ------------------------------------------------------------ errors

def _edited(tmp_path, edit):
    return edited_artifact(GOLDEN_IEBIN / "tiny-llama", tmp_path / "m", edit)


def test_error_unknown_architecture(tmp_path):
    d = _edited(tmp_path, lambda m: reconfigure(m, architecture="GPT2LMHeadModel"))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "model.architecture", "GPT2LMHeadModel", "not supported")


@pytest.mark.parametrize("key,value,needle", [
    ("head_dim", 0, "positive integer"), ("num_key_value_heads", 0, "positive integer"),
    ("max_position_embeddings", 0, "positive integer"), ("rope_theta", -1.0, "positive number"),
    ("norm_eps", -1e-5, "non-negative number"), ("hidden_act", "gelu", "not supported"),
    ("num_attention_heads", 3, "multiple of num_key_value_heads"),
])
def test_error_config_values_the_decoder_cannot_run(tmp_path, key, value, needle):
    d = _edited(tmp_path, lambda m: reconfigure(m, **{key: value}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), needle)


def test_error_missing_tensor(tmp_path):
    d = _edited(tmp_path, lambda m: m.update(tensors=[t for t in m["tensors"] if "layers.1.mlp.up" not in t["name"]]))
    assert_one_line_error(run_tool("ierun", "logits", "--model-dir", d, "--ids", "1", "--out", tmp_path / "x.npy"),
                          "model.layers.1.mlp.up_proj.weight", "missing")
    assert not (tmp_path / "x.npy").exists()


def test_error_shape_mismatch(tmp_path):
    d = _edited(tmp_path, lambda m: reconfigure(m, intermediate_size=96))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "model.layers.0.mlp.gate_proj.weight", "shape", "[96, 64]")


def test_error_ids_out_of_vocab():
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1,320"),
                          "token id 320", "0..319")
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1,x"),
                          "--ids")


def test_error_prompt_longer_than_context():
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama",
                                   "--ids", "1,2,3,4,5", "--ctx", "4"), "exceeds the context", "4")
    # Generation that runs into the end of the context stops there, cleanly (tests/test_hostile_files.py).
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1,2", "--ctx", "6",
                   "--max-new", "10", "--ignore-eos")
    assert res.returncode == 0 and "context of 6 positions is full" in res.stderr, res.stderr


def test_error_prompt_text_without_tokenizer(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(GOLDEN_IEBIN / "tiny-llama", d)
    meta = json.loads((d / "model.ie.json").read_text())
    meta["aux_files"] = [a for a in meta["aux_files"] if a["name"] != "tokenizer.json"]
    meta["tokenizer"]["files"] = [f for f in meta["tokenizer"]["files"] if f != "tokenizer.json"]
    (d / "model.ie.json").write_text(json.dumps(meta))
    (d / "tokenizer.json").unlink()
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--prompt", "hi"),
                          "no tokenizer.json", "token ids")
    assert run_tool("ierun", "generate", "--model-dir", d, "--ids", "0,5", "--max-new", "2").returncode == 0


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_kv_cache_pages_are_resident_only_once_written(tmp_path):
    """The KV cache is sized for the whole window but costs memory only for
    the positions used: a 2^19-position window (256 MiB of K and V) adds a
    few MiB of RSS, and decodes exactly as the default window does."""
    d = tmp_path / "m"
    shutil.copytree(GOLDEN_IEBIN / "tiny-llama", d)
    meta = json.loads((d / "model.ie.json").read_text())
    for key in ("config", "model"):
        meta[key]["max_position_embeddings"] = 1 << 19
    (d / "model.ie.json").write_text(json.dumps(meta))
    before = _rss_kib()
    big = Decoder(d, ctx=1 << 19)
    grown = (_rss_kib() - before) / 1024
    kv_mib = 2 * big.spec.n_layers * big.spec.n_kv_heads * big.spec.head_dim * 4 * (1 << 19) / (1 << 20)
    assert kv_mib == 256 and grown < 32, f"{grown:.1f} MiB resident after allocating a {kv_mib:.0f} MiB KV cache"
    ref = Decoder(GOLDEN_IEBIN / "tiny-llama")
    np.testing.assert_array_equal(big.prefill([1, 2, 3]), ref.prefill([1, 2, 3]))
    np.testing.assert_array_equal(big.step(4), ref.step(4))


# ------------------------------------------------------------ the weight keys, defined twice and held together

def test_the_weight_keys_are_the_native_decoders():
    """formats/model_spec.py names the keys the weights bind under, and the
    native binding's field tables take them: over the golden models (every
    layout: biases, q/k norms, sinks, each MoE naming) the two are one set."""
    from iekit.formats import iebin
    from iekit.formats.model_spec import (EXPERT_MATRIX, EXPERT_VECTOR, EXPERTS_KEY, LAYERS_KEY, MATRIX, VECTOR,
                                          decoder_spec, layer_parts, model_parts)

    got: dict[str, set[str]] = {MATRIX: set(), VECTOR: set(), EXPERT_MATRIX: set(), EXPERT_VECTOR: set()}
    top = {LAYERS_KEY}
    for model in MODELS:
        m = iebin.load_model(GOLDEN_IEBIN / model)
        s = decoder_spec(m.meta, m.meta_path)
        top |= {p.key for p in model_parts(s)}
        for i in range(s.n_layers):
            for p in layer_parts(s, i):
                got[p.kind].add(p.key)
    keys = native._native.decoder_weight_keys()
    assert got[MATRIX] == set(keys["layer_matrices"])
    assert got[VECTOR] == set(keys["layer_vectors"])
    assert got[EXPERT_MATRIX] == set(keys["expert_matrices"])
    assert got[EXPERT_VECTOR] == set(keys["expert_vectors"])
    assert tuple(keys["layer_lists"]) == (EXPERTS_KEY,)
    assert set(keys["model"]) == top


def test_the_native_binding_refuses_a_key_it_does_not_know_and_names_a_missing_one():
    from iekit.runtime import decoder_weights
    from iekit.runtime.decoder import native_config
    from iekit.runtime.tensor_source import TensorSource
    from iekit.formats.model_spec import EXPERTS_KEY, LAYERS_KEY, decoder_spec

    src = TensorSource(GOLDEN_IEBIN / "tiny-qwen3-moe")
    s = decoder_spec(src.model.meta, src.model.meta_path)
    cfg = native_config(s, 16, ("f32", "f32"))
    bound = decoder_weights.bind(src, s)
    native._native.Decoder(cfg, bound.weights)  # as bound: accepted
    i = next(i for i, layer in enumerate(bound.weights[LAYERS_KEY]) if EXPERTS_KEY in layer)
    layer = bound.weights[LAYERS_KEY][i]
    for edit, message in [(lambda: layer.update(q_bias=layer["q_norm"]), rf"layers\[{i}\]\.q_bias: not a weight"),
                          (lambda: layer[EXPERTS_KEY][0].update(wo=layer["q"]), rf"layers\[{i}\]\.experts\[0\]\.wo: not a weight"),
                          (lambda: (layer.pop("q_bias"), layer[EXPERTS_KEY][0].pop("wo"), layer.pop("k")),
                           f"layer {i} k_proj: no data")]:
        edit()
        with pytest.raises(ValueError, match=message):
            native._native.Decoder(cfg, bound.weights)


def test_decoder_is_freed_with_its_last_reference():
    """A Decoder holds a model's weights and KV cache: it must go when its
    last name does, not when Python's cycle collector next runs. It sat in
    a reference cycle (its native-decoder factory closed over self), and
    kl-probes, which makes one decoder per group of matrices, held several
    models at once (RSS 0.9 -> 4.8 GiB on an 8B-shaped layer)."""
    import gc
    import weakref

    gc.disable()
    try:
        d = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2)
        d.logits([1, 2, 3])
        gone = weakref.ref(d)
        del d
        assert gone() is None, "the Decoder outlived its last reference (a reference cycle)"
    finally:
        gc.enable()
