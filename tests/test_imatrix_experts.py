"""Importance matrices of mixtures of experts: each expert's gate/up and
down inputs averaged over the rows routed to it (as llama-imatrix collects
them), checked against a float64 routing of the captured layer inputs; the
per-expert vectors weight each expert's quantization; --target-bpw measures
expert stacks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.formats import iebin
from iekit.formats.casting import decode_f32
from iekit.formats.quant import SCHEMES, QuantError, QuantParams
from iekit.runtime.decoder import Decoder
from test_imatrix import collect_ids

IDS = [int(i) for i in np.random.default_rng(8).integers(3, 300, 48)]


def _weights(model_dir) -> dict[str, np.ndarray]:
    m = iebin.load_model(model_dir)
    out = {}
    for t in m.tensors:
        if t["dtype"] in ("f32", "f16", "bf16"):
            raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
            out[t["name"]] = decode_f32(raw, t["dtype"]).astype(np.float64).reshape(t["shape"])
    return out


def _glu(name: str, w: dict, pre: str, e: int, x: np.ndarray, cfg: dict) -> np.ndarray:
    """Expert e's down-projection input for rows x, in float64 (transformers' definitions)."""
    if name == "tiny-gpt-oss":
        gu = x @ w[pre + "mlp.experts.gate_up_proj"][e].T + w[pre + "mlp.experts.gate_up_proj_bias"][e]
        limit, alpha = cfg["swiglu_limit"], 1.702
        gate, up = np.minimum(gu[:, ::2], limit), np.clip(gu[:, 1::2], -limit, limit)
        return (up + 1) * gate / (1 + np.exp(-alpha * gate))
    g = x @ w[pre + f"block_sparse_moe.experts.{e}.w1.weight"].T
    u = x @ w[pre + f"block_sparse_moe.experts.{e}.w3.weight"].T
    return g / (1 + np.exp(-g)) * u


def _router(name: str, w: dict, pre: str, x: np.ndarray) -> np.ndarray:
    if name == "tiny-gpt-oss":
        return x @ w[pre + "mlp.router.weight"].T + w[pre + "mlp.router.bias"]
    return x @ w[pre + "block_sparse_moe.gate.weight"].T


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-mixtral"])
def test_expert_means_match_a_float64_routing(tmp_path, name):
    im, _ = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS)
    # The MoE layers' inputs (slot 2: the MLP norm's output), captured row by row as the decoder saw them.
    dec = Decoder(GOLDEN_IEBIN / name, threads=1, act="f32")
    spec, cfg = dec.spec, iebin.load_model(GOLDEN_IEBIN / name).meta["config"]
    layers = range(spec.n_layers)
    dec._dec.collect_stats(True, [4 * layer + 2 for layer in layers])
    rows = {layer: [] for layer in layers}
    for c in range(3):
        dec.logits(IDS[16 * c:16 * (c + 1)], start=15)
        for layer in layers:
            rows[layer].append(dec._dec.take_captured(4 * layer + 2).astype(np.float64))
    dec._dec.collect_stats(False)
    w = _weights(GOLDEN_IEBIN / name)
    E, K = spec.moe.n_experts, spec.moe.top_k
    for layer in layers:
        pre = f"model.layers.{layer}."
        x = np.concatenate(rows[layer])
        top = np.argsort(-_router(name, w, pre, x), axis=1, kind="stable")[:, :K]
        in_ref, mid_ref = np.zeros((E, x.shape[1])), np.zeros((E, spec.moe.inter))
        for e in range(E):
            xe = x[(top == e).any(axis=1)]
            assert len(xe), f"expert {e} of layer {layer} got no row: pick other ids"
            in_ref[e] = (xe * xe).mean(axis=0)
            mid_ref[e] = (_glu(name, w, pre, e, xe, cfg) ** 2).mean(axis=0)
        if name == "tiny-gpt-oss":
            got_in, got_mid = im.entries[pre + "mlp.experts.gate_up_proj"], im.entries[pre + "mlp.experts.down_proj"]
            assert got_in.shape == (E, x.shape[1]) and got_mid.shape == (E, spec.moe.inter)
        else:
            got_in = np.stack([im.entries[pre + f"block_sparse_moe.experts.{e}.w1.weight"] for e in range(E)])
            assert all(np.array_equal(im.entries[pre + f"block_sparse_moe.experts.{e}.w3.weight"], got_in[e])
                       for e in range(E))
            got_mid = np.stack([im.entries[pre + f"block_sparse_moe.experts.{e}.w2.weight"] for e in range(E)])
        np.testing.assert_allclose(got_in, in_ref, rtol=2e-4, atol=1e-7)
        np.testing.assert_allclose(got_mid, mid_ref, rtol=2e-4, atol=1e-7)
        router = next(k for k in im.entries if k.startswith(pre) and ("router" in k or ".gate.weight" in k))
        np.testing.assert_allclose(im.entries[router], (x * x).mean(axis=0), rtol=2e-4, atol=1e-7)
        assert not any(k.startswith(pre + "mlp.gate_proj") or k.startswith(pre + "mlp.down_proj") for k in im.entries)


def test_stack_experts_are_quantized_with_their_own_importance(tmp_path):
    """hf-to-iebin with an imatrix whose stack entries are [experts, cols]:
    expert e's bytes are the quantizer's on its rows with importance[e]."""
    im, im_path = collect_ids(tmp_path, GOLDEN_IEBIN / "tiny-gpt-oss", IDS)
    man, out = tmp_path / "q.json", tmp_path / "m"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "-o", man, "--scheme", "q4_1",
                   "--imatrix", im_path)
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    imp = im.entries
    floats = _weights(GOLDEN_IEBIN / "tiny-gpt-oss")
    m = iebin.load_model(out)
    scheme, p = SCHEMES["q4_1"], QuantParams("q4_1")
    differs = 0
    for layer in (0, 1):
        name = f"model.layers.{layer}.mlp.experts.down_proj"
        t = m.tensor(name)
        assert t["dtype"] == "q4_1"
        E = t["shape"][0]
        stored = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        per = t["nbytes"] // E
        for e in range(E):
            w = floats[name][e].astype(np.float32)
            mine = b"".join(x.tobytes() for x in scheme.payload(scheme.measured_rows(w, p, name, imp[name][e], QuantError())))
            pooled = b"".join(x.tobytes() for x in scheme.payload(
                scheme.measured_rows(w, p, name, imp[name].mean(axis=0), QuantError())))
            assert stored[e * per:(e + 1) * per] == mine, (name, e)
            differs += mine != pooled
    assert differs  # the per-expert vectors change what is stored


def test_target_bpw_measures_expert_stacks(tmp_path):
    """--target-bpw on a MoE model: stacks measured as their matrices' rows
    (the bf16 [experts, in, out] parameters read as written, [experts, out, in]);
    the mix meets the budget and the model converts and runs."""
    man, out = tmp_path / "q.json", tmp_path / "m"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "-o", man, "--target-bpw", "5")
    assert res.returncode == 0, res.stderr
    manifest = json.loads(man.read_text())
    assert "model.layers.0.mlp.experts.gate_up_proj" in manifest["tensors"]
    assert abs(manifest["bits_per_weight"] - 5) < 0.25
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    assert np.isfinite(Decoder(out, threads=1).logits([3, 17, 250])).all()


# HF name -> llama.cpp's imatrix entry name, written out for the three MoE layouts (gguf-py's names):
# dense matrices one to one; an expert's matrix one row of its layer's ffn_*_exps entry; a stack kept
# whole (gpt-oss) the whole entry, gate_up_proj both ffn_gate_exps and ffn_up_exps (the same inputs).
_DENSE = [(r"model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.weight", "blk.{0}.attn_{1}.weight"),
          (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "blk.{0}.attn_output.weight"),
          (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", "blk.{0}.ffn_{1}.weight"),
          (r"model\.layers\.(\d+)\.(?:block_sparse_moe\.gate|mlp\.gate|mlp\.router)\.weight",
           "blk.{0}.ffn_gate_inp.weight"),
          (r"lm_head\.weight", "output.weight"), (r"model\.embed_tokens\.weight", "token_embd.weight")]
_EXPERT = [(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w1\.weight", "blk.{0}.ffn_gate_exps.weight"),
           (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w3\.weight", "blk.{0}.ffn_up_exps.weight"),
           (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w2\.weight", "blk.{0}.ffn_down_exps.weight"),
           (r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", "blk.{0}.ffn_{2}_exps.weight")]
_STACK = [(r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj", ("blk.{0}.ffn_gate_exps.weight",
                                                                  "blk.{0}.ffn_up_exps.weight")),
          (r"model\.layers\.(\d+)\.mlp\.experts\.down_proj", ("blk.{0}.ffn_down_exps.weight",))]


def _llamacpp_means(entries: dict) -> dict[str, np.ndarray]:
    """Our entries under llama-imatrix's names: an expert stack's [experts, cols]."""
    import re

    sums: dict[str, np.ndarray] = {}
    rows: dict[str, dict[int, np.ndarray]] = {}
    for name, v in entries.items():
        for pat, out in _DENSE:
            if m := re.fullmatch(pat, name):
                sums[out.format(*m.groups())] = v
        for pat, out in _EXPERT:
            if m := re.fullmatch(pat, name):
                rows.setdefault(out.format(*m.groups()), {})[int(m.group(2))] = v
        for pat, outs in _STACK:
            if m := re.fullmatch(pat, name):
                sums.update({o.format(*m.groups()): v for o in outs})
    sums.update({n: np.stack([r[e] for e in sorted(r)]) for n, r in rows.items()})
    return sums


def _as_llamacpp(entries: dict) -> dict[str, np.ndarray]:
    """Our entries as llama-imatrix's GGUF tensors: NAME.in_sum2 (means x counts) and NAME.counts, an
    expert stack's with a row per expert and counts of 2^e rows (exact, so the means read back exact)."""
    tensors = {}
    for n, v in _llamacpp_means(entries).items():
        counts = (2.0 ** np.arange(v.shape[0], dtype=np.float32))[:, None] if v.ndim == 2 else np.float32([4.0])
        tensors[n + ".in_sum2"] = (v * (counts if v.ndim == 2 else counts[0])).astype(np.float32)
        tensors[n + ".counts"] = counts.astype(np.float32)
    return tensors


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-qwen3-moe", "tiny-gpt-oss"])
def test_llamacpp_per_expert_imatrix_weights_each_expert(tmp_path, name):
    """llama-imatrix's GGUF with per-expert entries (blk.N.ffn_*_exps: a row
    and a count per expert): each expert's row weights that expert's matrix,
    as the same means in our own imatrix do: the same bytes, and not those of
    an unweighted conversion."""
    from test_imatrix import _gguf_imatrix

    im, npz = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS)
    gguf_im = tmp_path / "imatrix.gguf"
    _gguf_imatrix(gguf_im, _as_llamacpp(im.entries))
    man = tmp_path / "q.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q4_1")
    assert res.returncode == 0, res.stderr
    bins = {}
    for label, extra in (("ours", ["--imatrix", npz]), ("llama.cpp", ["--imatrix", gguf_im]), ("none", [])):
        out = tmp_path / label
        res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / name, "--out-dir", out, "--q4-map", man,
                       *extra)
        assert res.returncode == 0, res.stderr
        assert "no entry" not in res.stderr, res.stderr
        bins[label] = (out / iebin.BIN_NAME).read_bytes()
    assert bins["llama.cpp"] == bins["ours"]
    assert bins["none"] != bins["ours"]


def test_llama_imatrix_per_expert_entries_agree_with_ours(tmp_path):
    """llama-imatrix's own per-expert file (golden/imatrix/tiny-mixtral.llamacpp.gguf:
    the Mixtral toy's GGUF export over eval-sample.txt, 6 chunks of 64) against
    `ieconv imatrix` on the same GGUF and chunks: each ffn_*_exps row, mapped
    to its expert, agrees to 5% of the entry's largest value (llama.cpp's
    matmuls take rounded activations, and a near tie can route a token to
    another expert; measured: at most 3.4%), while another expert's row is at
    least 10% off (measured: 12%), so experts mapped in the wrong order fail."""
    import os

    from iekit.convert.gguf_names import importance_to_hf
    from iekit.formats import imatrix

    gguf = tmp_path / "tiny-mixtral.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", GOLDEN_IEBIN / "tiny-mixtral", "--out", gguf)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "ours.npz"
    res = run_tool("ieconv", "imatrix", "-q", "-m", gguf, "-f", GOLDEN / "text" / "eval-sample.txt", "--ctx", "64",
                   "--chunks", "6", "-o", out, env={**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr
    ours, theirs = imatrix.read(out), imatrix.read_any(GOLDEN / "imatrix" / "tiny-mixtral.llamacpp.gguf")
    assert theirs.tokens == ours.tokens == 384
    assert theirs.entries["blk.0.ffn_gate_exps.weight"].shape == (4, 64)
    mapped = importance_to_hf(theirs.entries, set(ours.entries), "imatrix.gguf")
    assert set(mapped) == set(ours.entries) - {"lm_head.weight"}  # llama.cpp leaves the output out by default

    def rel(a, b):
        return float(np.abs(a - b).max() / a.max())

    for name, v in mapped.items():
        assert rel(ours.entries[name], v) < 0.05, name
    for layer in (0, 1):
        for w in ("w1", "w2"):
            expert = [f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight" for e in range(4)]
            for a in range(4):
                for b in range(4):
                    if a != b:
                        assert rel(ours.entries[expert[a]], mapped[expert[b]]) > 0.10, (expert[a], b)
    # written as llama.cpp's GGUF, each expert's count is the rows routed to it, as llama-imatrix counted
    # them (within the one row a near tie moves), in the same order
    res = run_tool("ieconv", "imatrix", "-q", "-m", gguf, "-f", GOLDEN / "text" / "eval-sample.txt", "--ctx", "64",
                   "--chunks", "6", "-o", tmp_path / "ours.gguf", env={**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr
    from gguf import GGUFReader

    counts = [{t.name: np.asarray(t.data).reshape(-1) for t in GGUFReader(f).tensors if t.name.endswith("_exps.weight.counts")}
              for f in (tmp_path / "ours.gguf", GOLDEN / "imatrix" / "tiny-mixtral.llamacpp.gguf")]
    assert counts[0].keys() == counts[1].keys() and len(counts[0]) == 6
    for n, c in counts[1].items():
        assert c.sum() == counts[0][n].sum() == 384 * 2 and np.abs(counts[0][n] - c).max() <= 1, (n, counts[0][n], c)


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-qwen2"])
def test_gguf_imatrix_holds_each_entry_under_llama_cpps_name(tmp_path, name):
    """`ieconv imatrix -o x.gguf` on each layout: gguf's own reader finds every
    entry under its llama.cpp name (the tables above, from gguf-py's names; a
    tied head under token_embd's), in_sum2 = means x counts, counts the tokens
    for a matrix and, for an expert stack, [experts, 1] rows routed to each
    (top-k per token in all); read back, the means are the .npz's."""
    from gguf import GGUFReader

    from iekit.convert.gguf_names import importance_to_hf

    im, _ = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS)
    back, out = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS, out_name="im.gguf")
    spec = Decoder(GOLDEN_IEBIN / name, threads=1).spec
    expected = _llamacpp_means(im.entries)
    assert ("token_embd.weight" in expected) == spec.tied
    got = {t.name: np.asarray(t.data, np.float32).reshape(list(reversed([int(d) for d in t.shape])))
           for t in GGUFReader(out).tensors}
    assert set(got) == {n + s for n in expected for s in (".in_sum2", ".counts")}
    for n, means in expected.items():
        counts, sums = got[n + ".counts"], got[n + ".in_sum2"]
        if means.ndim == 2:
            assert counts.shape == (spec.moe.n_experts, 1) and counts.sum() == 48 * spec.moe.top_k, n
        else:
            assert counts.tolist() == [48.0], n
        np.testing.assert_allclose(sums, means * (counts if means.ndim == 2 else counts[0]), rtol=1e-6, err_msg=n)
    mapped = importance_to_hf(back.entries, set(im.entries), str(out))
    assert mapped.keys() == im.entries.keys()
    for k, v in im.entries.items():
        np.testing.assert_allclose(mapped[k], v, rtol=1e-6, err_msg=k)
    # llama-imatrix on a file the converter wrote with --fuse-qkv and --fuse-gate-up-exps names one entry for q, k
    # and v (attn_qkv) and one for each layer's gate and up stacks (ffn_gate_up_exps): their inputs are the same
    fused = {}
    for n, v in back.entries.items():
        for parts, whole in (((".attn_q.", ".attn_k.", ".attn_v."), ".attn_qkv."),
                             ((".ffn_gate_exps.", ".ffn_up_exps."), ".ffn_gate_up_exps.")):
            hit = next((p for p in parts if p in n), None)
            if hit is not None:
                n = n.replace(hit, whole)
                assert n not in fused or np.array_equal(fused[n], v), n
        fused[n] = v
    assert len(fused) < len(back.entries)
    again = importance_to_hf(fused, set(im.entries), str(out))
    assert sorted(again) == sorted(mapped), sorted(set(again) ^ set(mapped))[:4]
    assert all(np.array_equal(again[k], mapped[k]) for k in mapped)


def test_llamacpp_expert_rows_of_another_model_are_one_error(tmp_path):
    """A per-expert entry with a row for each of 3 experts, for a Mixtral
    whose layers have 4: one line naming the file and the entry, nothing
    written (the gpt-oss stacks take select_for's check of [experts, cols])."""
    from test_imatrix import _gguf_imatrix

    p = tmp_path / "imatrix.gguf"
    _gguf_imatrix(p, {"blk.0.ffn_gate_exps.weight.in_sum2": np.ones((3, 64), np.float32),
                      "blk.0.ffn_gate_exps.weight.counts": np.ones((3, 1), np.float32)})
    man = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-mixtral", "-o", man, "--scheme",
                    "q4_1").returncode == 0
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-mixtral", "--out-dir", tmp_path / "m",
                   "--q4-map", man, "--imatrix", p)
    assert_one_line_error(res, str(p), "blk.0.ffn_gate_exps.weight", "3 experts' rows", "has 4 experts")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-gpt-oss"])
def test_gguf_imatrix_leaves_an_unrouted_expert_as_llama_imatrix_does(tmp_path, name):
    """One token repeated routes to few experts: the others get count 0
    and sums 0 in the GGUF (what llama-imatrix writes; llama-quantize then
    weights them evenly, and so does our reader), where the .npz keeps the
    layer's means for them; the routed ones keep their means."""
    from gguf import GGUFReader

    im, _ = collect_ids(tmp_path, GOLDEN_IEBIN / name, [7, 7, 7, 7], ctx=4)
    back, out = collect_ids(tmp_path, GOLDEN_IEBIN / name, [7, 7, 7, 7], ctx=4, out_name="im.gguf")
    got = {t.name: np.asarray(t.data, np.float32).reshape(list(reversed([int(d) for d in t.shape])))
           for t in GGUFReader(out).tensors}
    spec = Decoder(GOLDEN_IEBIN / name, threads=1).spec
    stacks = [n[:-len(".counts")] for n in got if n.endswith("_exps.weight.counts")]
    assert len(stacks) == 3 * spec.n_layers
    for n in stacks:
        counts, sums = got[n + ".counts"][:, 0], got[n + ".in_sum2"]
        assert counts.sum() == 4 * spec.moe.top_k and (counts == 0).any() and (counts == np.round(counts)).all(), n
        assert not sums[counts == 0].any() and (sums[counts > 0] > 0).all(), n
        assert (back.entries[n][counts == 0] == 1).all(), n
        mine = _llamacpp_means(im.entries)[n]
        np.testing.assert_allclose(back.entries[n][counts > 0], mine[counts > 0], rtol=1e-6, err_msg=n)
        assert not (mine[counts == 0] == 1).all(), n
    # inspect shows how the rows reached each stack's experts, and how many got none
    listed = {r["name"]: r for r in json.loads(run_tool("ieconv", "inspect", "--json", out).stdout)["matrices"]}
    zeros = 0
    for n in stacks:
        assert listed[n]["routed"] == got[n + ".counts"][:, 0].astype(int).tolist(), n
        zeros += listed[n]["routed"].count(0)
    text = run_tool("ieconv", "inspect", out).stdout
    assert f"{zeros} expert entries got no calibration row" in text and "rows per expert" in text


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mixtral", "tiny-gpt-oss"])
def test_in_file_writes_a_collected_npz_as_llama_cpps_gguf(tmp_path, name):
    """`--in-file im.npz -o im.gguf` collects nothing: for a dense model it is the
    file the collection writes with -o im.gguf, byte for byte; for experts the
    means are kept and every count is the tokens (the .npz keeps no per-expert
    rows). What is not ours to convert, or not this model's, is one line."""
    from gguf import GGUFReader

    im, npz = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS)
    _, direct = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS, out_name="direct.gguf")
    out = tmp_path / "converted.gguf"
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", GOLDEN_IEBIN / name, "--in-file", npz, "-o", out)
    assert res.returncode == 0, res.stderr
    if name == "tiny-llama":
        assert out.read_bytes() == direct.read_bytes()
    else:
        counts = {t.name[:-len(".counts")]: np.asarray(t.data).reshape(-1) for t in GGUFReader(out).tensors
                  if t.name.endswith(".counts")}
        means = _llamacpp_means(im.entries)
        assert counts.keys() == means.keys()
        assert all(c.tolist() == [48] * (len(means[n]) if means[n].ndim == 2 else 1) for n, c in counts.items())
        from iekit.convert.gguf_names import importance_to_hf
        from iekit.formats import imatrix

        back = importance_to_hf(imatrix.read_any(out).entries, set(im.entries), str(out))
        assert back.keys() == im.entries.keys()
        for k, v in im.entries.items():
            np.testing.assert_allclose(back[k], v, rtol=1e-6, err_msg=k)
    other = {"tiny-llama": "tiny-qwen3", "tiny-mixtral": "tiny-qwen3-moe", "tiny-gpt-oss": "tiny-mixtral"}[name]
    assert_one_line_error(run_tool("ieconv", "imatrix", "--model-dir", GOLDEN_IEBIN / other, "--in-file", npz,
                                   "-o", tmp_path / "x.gguf"), str(npz))
    assert_one_line_error(run_tool("ieconv", "imatrix", "--model-dir", GOLDEN_IEBIN / name, "--in-file", out,
                                   "-o", tmp_path / "y.gguf"), "already llama.cpp's imatrix")
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()
    res = run_tool("ieconv", "imatrix", "--model-dir", GOLDEN_IEBIN / name, "--in-file", npz, "-o", tmp_path / "z.npz")
    assert res.returncode == 2 and "--in-file writes llama.cpp's GGUF imatrix" in res.stderr


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-gpt-oss"])
def test_legacy_dat_expert_stacks_weight_each_expert(tmp_path, name):
    """llama.cpp's legacy .dat keeps an expert stack's rows one after another
    ([experts x cols] values): split per expert, they weight each expert as
    the GGUF's rows do. The Mixtral toy's .dat is llama-imatrix's own (golden,
    the run of tiny-mixtral.llamacpp.gguf); gpt-oss's is written from our
    entries (ncall 4: the means come back exact). Same bytes as the GGUF / .npz, no matrix left out."""
    from test_imatrix import _legacy

    if name == "tiny-mixtral":
        pair = (GOLDEN / "imatrix" / "tiny-mixtral.llamacpp.gguf", GOLDEN / "imatrix" / "tiny-mixtral.llamacpp.dat")
    else:
        im, npz = collect_ids(tmp_path, GOLDEN_IEBIN / name, IDS)
        dat = tmp_path / "im.dat"
        dat.write_bytes(_legacy({n: (4, (4 * v.astype(np.float64)).reshape(-1).tolist())
                                 for n, v in _llamacpp_means(im.entries).items()}))
        pair = (npz, dat)
    man = tmp_path / "q.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q4_1")
    assert res.returncode == 0, res.stderr
    bins = []
    for i, im_path in enumerate(pair):
        out = tmp_path / f"o{i}"
        res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / name, "--out-dir", out, "--q4-map", man,
                       "--imatrix", im_path)
        assert res.returncode == 0, res.stderr
        assert "no entry" not in res.stderr, res.stderr
        bins.append((out / iebin.BIN_NAME).read_bytes())
    assert bins[0] == bins[1]


def test_what_has_no_llama_cpp_tensor_is_not_written():
    """importance_to_gguf refuses, naming the entry, a matrix llama.cpp's
    architecture has no tensor for, and experts that are not 0..E-1 once each."""
    from iekit.convert.gguf_names import ARCHS, importance_to_gguf
    from iekit.formats.errors import FormatError

    v = np.ones(8, np.float32)
    with pytest.raises(FormatError, match=r"x.npz: model.layers.0.mlp.extra_proj.weight: has no tensor"):
        importance_to_gguf({"model.layers.0.mlp.extra_proj.weight": v}, {}, 4, ARCHS["LlamaForCausalLM"], "x.npz")
    pattern = "model.layers.0.block_sparse_moe.experts.{e}.w1.weight"
    with pytest.raises(FormatError, match=r"blk.0.ffn_gate_exps.weight: experts \[0, 2\]"):
        importance_to_gguf({pattern.format(e=0): v, pattern.format(e=2): v}, {}, 4, ARCHS["MixtralForCausalLM"], "x")
    out = importance_to_gguf({pattern.format(e=1): v, pattern.format(e=0): 2 * v}, {pattern.format(e=0): 3}, 4,
                             ARCHS["MixtralForCausalLM"], "x")
    means, counts = out["blk.0.ffn_gate_exps.weight"]
    assert means.tolist() == [[2.0] * 8, [1.0] * 8] and counts.tolist() == [3, 4]
