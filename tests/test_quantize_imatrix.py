"""Quantizing with an importance matrix, as users do it, and q4_k / q5_k /
q6_k / q3_k / q2_k / iq4_xs / iq4_nl models end to end.

A Llama whose matrices are whole 256-element super-blocks (hidden 256, MLP
512) goes through the documented commands: ``ieconv imatrix`` on the f32
artifact, ``ieconv q4-manifest --scheme S --imatrix``, ``ieconv
hf-to-iebin --q4-map``; the native decoder then runs each artifact and
is checked against the float64 numpy forward pass (tests/decoder_ref.py)
over the same dequantized weights, and ``ierun verify quant`` passes.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_HF, assert_one_line_error, run_tool
from decoder_ref import forward, load_weights
from iekit.formats import imatrix, iebin, weight_types
from iekit.runtime.decoder import Decoder

TEXT = GOLDEN / "text" / "eval-sample.txt"
AUX = ("generation_config.json", "tokenizer.json", "tokenizer_config.json")


def int8_bound(scheme: str) -> float:
    """The int8-activation error bound on the ``wide`` model (max |logit error| over the largest logit):
    its outlier columns (x8 every 37th) cost ~0.035 under a scale per 32 elements with any weight type
    (q4_0 0.038, q8_0 0.052), more under one per 256, the super-block types' act_block (llama.cpp's
    q8_K): its 256-wide rows then have one scale per token, 0.068 (q4_k) to 0.12 (iq2_xs, llama.cpp's
    own file). The kernels themselves are held to each other tightly in tests/test_gemv.py and tests/cpp."""
    return 6e-2 if weight_types.get(scheme).act_block == 32 else 1.5e-1


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """{hf, f32, imatrix}: a 2-layer Llama with every matrix a multiple of 256 wide."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("wide")
    hf = root / "hf"
    hf.mkdir()
    for f in AUX:
        shutil.copy(GOLDEN_HF / "tiny-llama" / f, hf / f)
    cfg = json.loads((GOLDEN_HF / "tiny-llama" / "config.json").read_text())
    cfg.update(hidden_size=256, intermediate_size=512, head_dim=64)
    (hf / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(11)
    H, F, V, kv = 256, 512, cfg["vocab_size"], cfg["num_key_value_heads"] * 64
    w = {"model.embed_tokens.weight": rng.standard_normal((V, H)), "lm_head.weight": rng.standard_normal((V, H)) / 16,
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        # a few input columns carry large activations, as in real models: the importance matrix sees them
        scale = np.where(np.arange(H) % 37 == 0, 8.0, 1.0)
        w |= {p + "input_layernorm.weight": scale * (1 + 0.1 * rng.standard_normal(H)),
              p + "post_attention_layernorm.weight": scale * (1 + 0.1 * rng.standard_normal(H)),
              p + "self_attn.q_proj.weight": rng.standard_normal((H, H)) / 16,
              p + "self_attn.k_proj.weight": rng.standard_normal((kv, H)) / 16,
              p + "self_attn.v_proj.weight": rng.standard_normal((kv, H)) / 16,
              p + "self_attn.o_proj.weight": rng.standard_normal((H, H)) / 16,
              p + "mlp.gate_proj.weight": rng.standard_normal((F, H)) / 16,
              p + "mlp.up_proj.weight": rng.standard_normal((F, H)) / 16,
              p + "mlp.down_proj.weight": rng.standard_normal((H, F)) / 23}
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in w.items()}, str(hf / "model.safetensors"))
    f32, im = root / "f32", root / "im.npz"
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", f32).returncode == 0
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", f32, "--text-file", TEXT, "-o", im, "--ctx", "64",
                   "--chunks", "4")
    assert res.returncode == 0, res.stderr
    return {"root": root, "hf": hf, "f32": f32, "imatrix": im}


def _quantize(wide, name, *manifest_args, convert_args=()):
    m, out = wide["root"] / f"{name}.json", wide["root"] / name
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--overwrite", *manifest_args)
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", wide["hf"], "--q4-map", m, "--out-dir", out,
                   "--overwrite", *convert_args)
    assert res.returncode == 0, res.stderr
    return out, m, res


@pytest.mark.parametrize("scheme", ["q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs", "iq4_nl", "q5_0", "q5_1", "mxfp4", "iq3_s", "iq3_xxs", "iq2_xxs",
                                    "iq4_xsh", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"])
def test_model_runs_and_matches_the_float64_reference(wide, scheme):
    """Prefill (logits) with both activations on both ISAs, and, with int8
    on AVX2, decode steps: those read the rows8 copies one token at a time
    (q/k/v in one call, gate/up fused with SwiGLU) where prefill went
    through them up to eight tokens at a time."""
    out, _m, _res = _quantize(wide, scheme, "--scheme", scheme)
    dtypes = {t["name"]: t["dtype"] for t in iebin.load_model(out).tensors}
    assert dtypes["model.layers.0.mlp.down_proj.weight"] == scheme and dtypes["model.layers.1.self_attn.q_proj.weight"] == scheme
    model, w = load_weights(out)
    ids = [int(i) for i in np.random.default_rng(2).integers(0, 320, 20)]
    ref = forward(model, w, ids)
    for act, tol in (("f32", 1e-4), ("int8", int8_bound(scheme))):
        for isa in ("scalar", "avx2"):
            d = Decoder(out, threads=2, act=act, isa=isa)
            got = d.logits(ids)
            assert np.abs(got - ref).max() / np.abs(ref).max() <= tol, (act, isa)
            if act == "int8" and isa == "avx2":
                assert d.rows8_bytes > 0
                steps = np.stack([d.prefill(ids[:1])] + [d.step(t) for t in ids[1:]])
                assert np.abs(steps - ref).max() / np.abs(ref).max() <= tol
    assert scheme in Decoder(out).precision
    res = run_tool("ierun", "verify", "quant", "--model-dir", out, "--hf-dir", wide["hf"])
    assert res.returncode == 0, res.stdout + res.stderr


def test_imatrix_weighted_artifact_is_closer_to_the_float_model(wide):
    """The importance matrix was collected on the f32 model over the golden text;
    weighted q4_k / int4w artifacts must then be closer to it on that text
    (KL of the logits) than unweighted ones, and say what they did."""
    ref = Decoder(wide["f32"])
    ids = ref.encode(TEXT.read_text())[:64]
    f32 = ref.logits(ids)

    def kl(out_dir):
        got = Decoder(out_dir, act="f32").logits(ids)
        p = np.exp(f32 - f32.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        lq = got - got.max(1, keepdims=True)
        lq = lq - np.log(np.exp(lq).sum(1, keepdims=True))
        lp = np.log(p)
        return float((p * (lp - lq)).sum(1).mean())

    for scheme, extra in (("q4_k", ()), ("iq4_xs", ()), ("int4w", ("--affine",))):
        plain, _m, _r = _quantize(wide, f"{scheme}-plain", "--scheme", scheme, *extra)
        weighted, m, res = _quantize(wide, f"{scheme}-im", "--scheme", scheme, *extra, "--imatrix", wide["imatrix"])
        assert json.loads(m.read_text())["imatrix"] == "im.npz"  # relative to the manifest
        assert "14 importance-weighted" in res.stderr
        assert kl(weighted) < kl(plain), scheme
        res = run_tool("ierun", "verify", "quant", "--model-dir", weighted, "--hf-dir", wide["hf"])
        assert res.returncode == 0, res.stdout + res.stderr  # every code the nearest for its stored scale
    # --imatrix on the command line does the same as the manifest's
    _out, _m, res = _quantize(wide, "q4k-cli", "--scheme", "q4_k", convert_args=("--imatrix", wide["imatrix"]))
    assert "importance-weighted" in res.stderr
    assert (wide["root"] / "q4k-cli" / "model.ie.bin").read_bytes() == (wide["root"] / "q4_k-im" / "model.ie.bin").read_bytes()


def test_imatrix_of_another_model_is_one_clear_line(wide, tmp_path):
    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q4_k").returncode == 0
    other = tmp_path / "other.npz"
    im = imatrix.read(wide["imatrix"])
    entries = dict(im.entries)
    entries["model.layers.0.mlp.down_proj.weight"] = np.ones(256, np.float32)  # 512 in the model
    imatrix.write(other, imatrix.Imatrix(entries, im.meta))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", wide["hf"], "--q4-map", m, "--out-dir", tmp_path / "o",
                   "--imatrix", other)
    assert_one_line_error(res, str(other), "model.layers.0.mlp.down_proj.weight", "256 columns, the matrix has 512")
    assert not (tmp_path / "o").exists()
    foreign = tmp_path / "foreign.npz"
    imatrix.write(foreign, imatrix.Imatrix({"x.weight": np.ones(4, np.float32)}, im.meta))
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "q2.json", "--scheme", "q4_k",
                   "--imatrix", foreign)
    assert_one_line_error(res, str(foreign), "no entry for any of the 14 matrices")
    assert not (tmp_path / "q2.json").exists()
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", wide["hf"], "--out-dir", tmp_path / "o2",
                   "--imatrix", wide["imatrix"])
    assert res.returncode == 2 and "--imatrix only applies with --q4-map" in res.stderr


def test_q4_k_falls_back_where_rows_are_not_whole_super_blocks(tmp_path):
    """The golden tiny Llama is 64 wide: q4_k cannot store any of its
    matrices, so the policy gives them int4w with a scale and a min per 64
    (the same 4.5 bits per weight) instead of keeping them f32."""
    m = tmp_path / "q.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", m, "--scheme", "q4_k")
    assert res.returncode == 0, res.stderr
    man = json.loads(m.read_text())
    sels = [r for r in man["rules"]] + list(man["tensors"].values())
    assert sels and all(s["scheme"] == "int4w" and s["group_size"] == 64 and s["symmetric"] is False for s in sels)
    assert "quantizes 14 of" in res.stdout
    # iq4_xs falls back to iq4_nl, its grid per 32 elements (llama.cpp's fallback)
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", m, "--scheme", "iq4_xs",
                   "--overwrite")
    assert res.returncode == 0, res.stderr
    man = json.loads(m.read_text())
    sels = [r for r in man["rules"]] + list(man["tensors"].values())
    assert sels and all(s == {"scheme": "iq4_nl"} for s in sels)


@pytest.mark.parametrize("scheme", ["q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs", "iq4_nl", "iq3_s", "iq3_xxs",
                                    "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"])
def test_gguf_blocks_are_imported_byte_for_byte(wide, tmp_path, scheme):
    """A llama.cpp GGUF with Q4_K (Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) matrices: gguf-to-iebin keeps
    the blocks (only q/k rows move back from llama.cpp's interleaving), so the
    import equals hf-to-iebin's artifact of the same checkpoint tensor for tensor;
    exported again, the blocks are the GGUF's, under the same type."""
    from gguf_build import gguf_from_hf

    g = gguf_from_hf(wide["hf"], tmp_path / "m.gguf", quant={r"self_attn|mlp": scheme.upper()})
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "imp")
    assert res.returncode == 0, res.stderr
    assert "14 with their blocks kept" in res.stderr
    hf_q, _m, _r = _quantize(wide, f"{scheme}-for-gguf", "--scheme", scheme)
    a, b = iebin.load_model(tmp_path / "imp"), iebin.load_model(hf_q)
    for t in (t for t in b.tensors if t["dtype"] == scheme):
        u = next(x for x in a.tensors if x["name"] == t["name"])
        assert u["dtype"] == scheme and u["quant"] == t["quant"]
        assert a.path_of(u).read_bytes()[u["file_data_offset"]:u["file_data_offset"] + u["nbytes"]] == \
            b.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]], t["name"]
    # and back out: iebin-to-gguf writes the same blocks under llama.cpp's type, which gguf-py reads
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", hf_q, "--out", tmp_path / "out.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    out = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "out.gguf")).tensors}
    down = next(t for t in b.tensors if t["name"] == "model.layers.0.mlp.down_proj.weight")
    g = out["blk.0.ffn_down.weight"]
    assert g.tensor_type.name == scheme.upper()
    raw = b.path_of(down).read_bytes()[down["file_data_offset"]:down["file_data_offset"] + down["nbytes"]]
    assert np.asarray(g.data).tobytes() == raw


def test_gguf_export_refuses_iq4_xsh_unless_requantized(wide, tmp_path):
    """llama.cpp has no iq4_xsh: iebin-to-gguf names the tensor and what to
    do, and writes nothing; with --requantize iq4_xs it exports, reporting
    the added error per tensor, and gguf-py reads IQ4_XS blocks that are
    iq4_xs's quantization of our values, within that type's error of them."""
    import gguf

    from iekit.formats.quant import SCHEMES, QuantParams

    out, _m, _res = _quantize(wide, "iq4_xsh-export", "--scheme", "iq4_xsh")
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", out, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "dtype 'iq4_xsh' has no GGUF type", "--requantize iq4_xs")
    assert not (tmp_path / "m.gguf").exists()
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", out, "--out", tmp_path / "m.gguf", "--requantize", "iq4_xs")
    assert res.returncode == 0, res.stderr
    assert "requantized blk.0.ffn_down.weight to iq4_xs: added error SQNR" in res.stderr
    model = iebin.load_model(out)
    down = next(t for t in model.tensors if t["name"] == "model.layers.0.mlp.down_proj.weight")
    raw = model.path_of(down).read_bytes()[down["file_data_offset"]:down["file_data_offset"] + down["nbytes"]]
    ours = SCHEMES["iq4_xsh"].dequantize(np.frombuffer(raw, np.uint8), *down["shape"], QuantParams("iq4_xsh"))
    g = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}["blk.0.ffn_down.weight"]
    assert g.tensor_type.name == "IQ4_XS"
    assert np.asarray(g.data).tobytes() == SCHEMES["iq4_xs"].quantize(ours, QuantParams("iq4_xs")).tobytes()
    theirs = gguf.quants.dequantize(np.asarray(g.data), gguf.GGMLQuantizationType.IQ4_XS)
    assert 0 < np.linalg.norm(theirs - ours) / np.linalg.norm(ours) < 0.08


def _kl(ref_dir, out_dir, ids):
    f32 = Decoder(ref_dir).logits(ids).astype(np.float64)
    got = Decoder(out_dir, act="f32").logits(ids).astype(np.float64)
    lp = f32 - f32.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    lq = got - got.max(1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(1, keepdims=True))
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())


def test_target_bpw_meets_the_budget_and_more_bits_buy_less_error(wide, tmp_path):
    ids = Decoder(wide["f32"]).encode(TEXT.read_text())[:64]
    kls = {}
    for target in (4.3, 5.5):
        out, m, _res = _quantize(wide, f"bpw{target}", "--target-bpw", str(target), "--imatrix", wide["imatrix"])
        man = json.loads(m.read_text())
        assert man["rules"] == [] and len(man["tensors"]) == 14 and man["imatrix"] == "im.npz"
        info = json.loads(run_tool("ieconv", "inspect", out, "--json").stdout)
        bpw = info["quantized_bits_per_weight"]
        assert bpw <= target and bpw == pytest.approx(man["bits_per_weight"], abs=1e-4)
        assert bpw > target - 0.5  # the budget is spent, not left over
        kls[target] = _kl(wide["f32"], out, ids)
    assert kls[5.5] < kls[4.3]
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "q.json", "--target-bpw", "2")
    assert_one_line_error(res, "--target-bpw 2.0", "cheapest candidates already average 2.625")
    assert not (tmp_path / "q.json").exists()
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "q.json", "--gguf-types")
    assert res.returncode == 2 and "--gguf-types restricts --target-bpw" in res.stderr


def test_exclude_types_leaves_a_type_out_of_the_mix(wide, tmp_path):
    """At 3.5 bits the mix takes iq3_s (it beats q3_k at the same size); a
    user deploying to llama.cpp's CPU backend, where IQ3_S decodes slower,
    leaves it out and gets a mix without it, still on budget."""
    def mix(*extra):
        m = tmp_path / "q.json"
        res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--overwrite", "--target-bpw", "3.5",
                       "--gguf-types", "--imatrix", wide["imatrix"], *extra)
        assert res.returncode == 0, res.stderr
        man = json.loads(m.read_text())
        return {t["scheme"] for t in man["tensors"].values()}, man["bits_per_weight"]

    with_all, _ = mix()
    assert "iq3_s" in with_all
    without, bpw = mix("--exclude-types", "iq3_s")
    assert "iq3_s" not in without and bpw <= 3.5
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "x.json", "--target-bpw", "3.5",
                   "--exclude-types", "iq3_s,q7_k")
    assert res.returncode == 2 and "q7_k is not a --target-bpw candidate" in res.stderr
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "x.json", "--exclude-types", "iq3_s")
    assert res.returncode == 2 and "give --target-bpw too" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_candidates_are_the_lower_convex_hull_of_error_against_size():
    """The greedy allocation takes a matrix's next step by error saved per bit:
    a size that saves less per bit than the step past it must not stand in
    its way (it is off the hull), nor one that saves nothing."""
    from iekit.convert.bpw_policy import lower_hull

    opts = [({"s": "a"}, 100, 10.0), ({"s": "b"}, 110, 9.5), ({"s": "c"}, 120, 4.0),
            ({"s": "d"}, 130, 4.0), ({"s": "e"}, 200, 1.0)]
    assert [o[0]["s"] for o in lower_hull(opts)] == ["a", "c", "e"]
    hull = lower_hull(opts)
    per_bit = [(hull[i][2] - hull[i + 1][2]) / (hull[i + 1][1] - hull[i][1]) for i in range(len(hull) - 1)]
    assert per_bit == sorted(per_bit, reverse=True)
    assert lower_hull([]) == [] and lower_hull(opts[:1]) == opts[:1]


def test_recorded_predicted_loss_is_the_weighted_error_of_the_bytes(wide):
    """Each quantized entry's quant_error is Σ imp[c] (w − ŵ)² and Σ imp[c] w²,
    recomputed here in float64 from the source weights, gguf.quants'
    dequantization of the artifact's bytes and the imatrix's values; the
    importance-weighted search lowers that error against the plain one, and
    the converter and inspect report it."""
    from gguf.quants import GGMLQuantizationType, dequantize
    from safetensors.numpy import load_file

    src = load_file(str(wide["hf"] / "model.safetensors"))
    imp = imatrix.read(wide["imatrix"]).entries

    def recomputed(out, weighted):
        m = iebin.load_model(out)
        blob = (out / iebin.BIN_NAME).read_bytes()
        total = 0.0
        for t in m.tensors:
            if t["dtype"] != "q4_k":
                continue
            raw = np.frombuffer(blob, np.uint8, t["nbytes"], t["file_data_offset"]).reshape(t["shape"][0], -1)
            w = src[t["name"]].astype(np.float64)
            d2 = (w - dequantize(raw, GGMLQuantizationType.Q4_K).astype(np.float64)) ** 2
            col = imp[t["name"]].astype(np.float64)
            rec = t["quant_error"]
            assert rec["weighted"] is weighted
            if weighted:
                assert rec["sq_error"] == pytest.approx((d2 @ col).sum(), rel=1e-5)
                assert rec["sq_norm"] == pytest.approx(((w * w) @ col).sum(), rel=1e-5)
            else:
                assert rec["sq_error"] == pytest.approx(d2.sum(), rel=1e-5)
                assert rec["sq_norm"] == pytest.approx((w * w).sum(), rel=1e-5)
            total += float((d2 @ col).sum())
        return total

    plain, _m, res_plain = _quantize(wide, "q4k-loss-plain", "--scheme", "q4_k")
    weighted, _m, res = _quantize(wide, "q4k-loss-im", "--scheme", "q4_k", "--imatrix", wide["imatrix"])
    assert recomputed(weighted, True) < 0.95 * recomputed(plain, False)
    assert "predicted loss (squared error added to the outputs, importance-weighted)" in res.stderr
    assert "predicted loss (squared error added to the outputs, unweighted)" in res_plain.stderr
    res = run_tool("ieconv", "inspect", "--json", weighted)
    got = json.loads(res.stdout)["quant_error"]
    assert len(got) == 14 and got == {t["name"]: t["quant_error"] for t in iebin.load_model(weighted).tensors
                                      if "quant_error" in t}
    assert "SQNR dB" in run_tool("ieconv", "inspect", weighted).stdout
