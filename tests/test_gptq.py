"""Error-compensating quantization (formats/gptq.py, ``ieconv gptq``): the
block update against the optimal-brain-surgeon step computed from explicit
inverses, the output error it saves, and the command end to end (the
covariances it uses: tests/test_hessians.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.formats import gptq, iebin
from iekit.formats.errors import IEError
from iekit.formats.q4_manifest import selection_params
from iekit.formats.quant import SCHEMES, fit_levels
from test_quantize_imatrix import wide  # noqa: F401  (the fixture: a Llama whose matrices are 256-multiples)

TEXT = GOLDEN / "text" / "eval-sample.txt"
SELECTIONS = [{"scheme": "q4_0"}, {"scheme": "iq4_nl"}, {"scheme": "q5_1"}, {"scheme": "q4_k"}, {"scheme": "mxfp4"},
              {"scheme": "iq4_xs"}, {"scheme": "q3_k"},
              {"scheme": "int4w", "group_size": 64, "symmetric": False, "scale_dtype": "f16"}]


def _problem(rows=16, cols=1024, tokens=3000, seed=0):
    """Weights and the covariance of correlated inputs (a few strong directions, as real activations have)."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((cols, cols)) * (rng.random(cols) ** 4)[None, :]
    x = rng.standard_normal((tokens, cols)) @ mix.T + 0.3 * rng.standard_normal((tokens, cols))
    return rng.standard_normal((rows, cols)).astype(np.float32), x.T @ x / tokens


def _obs_reference(w, h, scheme, p, step=gptq.STEP):
    """The same loop (steps of ``step`` columns inside a wider scale block, each
    step's columns then held at their quantized values) with the optimal update
    of the remaining columns R from an explicit inverse of the covariance
    restricted to the columns not yet quantized: W_R -= δ_S (H⁻¹_SS)⁻¹ H⁻¹_SR
    (no Cholesky factor)."""
    cols = w.shape[1]
    hd = h.copy()
    hd[np.diag_indices(cols)] += gptq.DAMP * np.mean(np.diagonal(h))
    cur = w.astype(np.float64).copy()
    bw = scheme.block_width(cols, p)
    step = bw if bw % step else step
    imp = np.diagonal(h).astype(np.float32)
    out = []
    for c0 in range(0, cols, bw):
        for s0 in range(c0, c0 + bw, step):
            q = scheme.dequantize_rows(scheme.quantize_rows(cur[:, c0:c0 + bw].astype(np.float32), p, "ref",
                                                            imp[c0:c0 + bw]), bw, p)
            if s0 + step < cols:
                hinv = np.linalg.inv(hd[s0:, s0:])
                delta = cur[:, s0:s0 + step] - q[:, s0 - c0:s0 - c0 + step]
                cur[:, s0 + step:] -= delta @ np.linalg.solve(hinv[:step, :step], hinv[:step, step:])
                cur[:, s0:s0 + step] = q[:, s0 - c0:s0 - c0 + step]
        out.append(q)
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize("sel", SELECTIONS, ids=lambda s: s["scheme"] + str(s.get("group_size", "")))
def test_block_update_is_the_optimal_brain_surgeon_step(sel):
    scheme, p = SCHEMES[sel["scheme"]], selection_params(sel)
    w, h = _problem()
    assert gptq.LAZY < w.shape[1]  # the update crosses a lazy group's end
    qr, _e = gptq.quantize(w, h, scheme, p, refit=False)  # the compensation alone (the refit: below)
    got = scheme.dequantize_rows(qr, w.shape[1], p)
    ref = _obs_reference(w, h, scheme, p)
    # the two routes to the update differ in float rounding only: every value
    # agreed when written; a code flipping on a near-tie is allowed once in 10^4
    assert np.mean(got != ref) < 1e-4


@pytest.mark.parametrize("sel", SELECTIONS, ids=lambda s: s["scheme"] + str(s.get("group_size", "")))
def test_compensation_lowers_the_output_error_and_reports_it(sel):
    """E[((W − Q) x)²] = Σ_r δ_r H δ_rᵀ: well below nearest rounding's (with the same
    importance, H's diagonal), and the QuantError record is that sum."""
    scheme, p = SCHEMES[sel["scheme"]], selection_params(sel)
    w, h = _problem(seed=1)
    qr, e = gptq.quantize(w, h, scheme, p)
    cols = w.shape[1]
    payload = np.concatenate(scheme.payload(qr))
    assert payload.size == scheme.nbytes(*w.shape, p)
    got = scheme.dequantize(payload, *w.shape, p)  # the bytes as a reader sees them
    assert np.array_equal(got, scheme.dequantize_rows(qr, cols, p))
    rtn = scheme.dequantize(scheme.quantize(w, p, importance=np.diagonal(h).astype(np.float32)), *w.shape, p)

    def loss(q):
        d = w.astype(np.float64) - q
        return float(np.einsum("rc,cd,rd->", d, h, d))

    assert loss(got) < 0.5 * loss(rtn)  # 0.15-0.28 of it here
    assert e.compensated and e.weighted
    # float32 GEMMs over h's upper block triangle (quant.quadratic_sum): rounding only
    assert e.sq_error == pytest.approx(loss(got), rel=1e-5)
    assert e.sq_norm == pytest.approx(float(np.einsum("rc,cd,rd->", w.astype(np.float64), h, w.astype(np.float64))),
                                      rel=1e-5)


@pytest.mark.parametrize("rows, cols", [(3, 100), (40, 512), (17, 1300)])
def test_quadratic_sum_over_the_upper_block_triangle(rows, cols):
    """quant.quadratic_sum against float64 einsum: one block, exactly one, and
    blocks with a short last one (the off-diagonal blocks counted twice)."""
    from iekit.formats.quant import quadratic_sum

    rng = np.random.default_rng(cols)
    x = rng.standard_normal((cols + 7, cols))
    h = x.T @ x / len(x)
    a = rng.standard_normal((rows, cols)) * rng.uniform(0.01, 10, cols)
    want = float(np.einsum("rc,cd,rd->", a, h, a))
    assert quadratic_sum(a, h) == pytest.approx(want, rel=1e-5)
    assert quadratic_sum(a[:, ::-1], h[::-1, ::-1]) == pytest.approx(want, rel=1e-5)  # not tied to an order


def test_quadratic_sum_of_rows_in_the_null_space_is_not_negative():
    """A covariance of 3 calibration rows and 700 columns, rows projected out
    of its range: each sum is 0 up to float32 rounding, about half of them
    below it unclamped; never below 0 (the artifact's schema refuses that)."""
    from iekit.formats.quant import quadratic_sum

    rng = np.random.default_rng(0)
    sums = []
    for _ in range(20):
        x = rng.standard_normal((3, 700))
        q, _r = np.linalg.qr(x.T)
        a = rng.standard_normal((4, 700))
        sums.append(quadratic_sum(a - (a @ q) @ q.T, x.T @ x))
    assert min(sums) >= 0 and max(sums) < 1e-2 and sums.count(0.0) >= 3


@pytest.mark.parametrize("scheme_name", ["q3_k", "iq4_xs", "q2_k", "iq3_s", "iq4_xsh", "iq3_xxs", "iq2_xxs",
                                         "iq2_xs", "iq2_s", "iq1_s", "iq1_m"])
def test_steps_inside_a_super_block_lower_the_error(scheme_name):
    """Compensating STEP columns at a time inside a 256-element super-block (each
    step's columns held at their quantized values for the block's next
    quantization) leaves well under the output error of one step per block."""
    scheme, p = SCHEMES[scheme_name], selection_params({"scheme": scheme_name})
    w, h = _problem(rows=32, cols=768, seed=4)

    def loss(step):
        q = scheme.dequantize_rows(gptq.quantize(w, h, scheme, p, step=step)[0], w.shape[1], p)
        d = w.astype(np.float64) - q
        return float(np.einsum("rc,cd,rd->", d, h, d))

    assert loss(gptq.STEP) < 0.75 * loss(256)


def test_diagonal_covariance_changes_nothing_across_blocks():
    """With uncorrelated inputs no column can cancel another's error: every block
    is quantized as it stands (the scheme's importance-weighted rounding), and
    the refit, blocks uncoupled, only moves each block's d to the least
    weighted error of its codes."""
    scheme, p = SCHEMES["q4_0"], selection_params({"scheme": "q4_0"})
    w, _h = _problem()
    h = np.diag(np.linspace(0.5, 2.0, w.shape[1]))
    qr, _e = gptq.quantize(w, h, scheme, p, refit=False)
    imp = np.diagonal(h).astype(np.float32)
    blocks = [scheme.quantize_rows(w[:, c:c + 32], p, "t", imp[c:c + 32]).rows for c in range(0, w.shape[1], 32)]
    assert np.array_equal(qr.rows, np.concatenate(blocks, axis=1))
    refit = gptq.quantize(w, h, scheme, p)[0]
    assert _changed_bytes(qr.rows, refit.rows, 18) == {0, 1}
    codes = (qr.rows.reshape(-1, 18)[:, 2:] & 0x0F).astype(np.float64), (qr.rows.reshape(-1, 18)[:, 2:] >> 4)
    q = np.concatenate([codes[0], codes[1].astype(np.float64)], axis=1) - 8  # [blocks, 32]: each block's values / d
    x = w.astype(np.float64).reshape(-1, 32)
    hb = np.tile(np.diagonal(h).reshape(-1, 32), (w.shape[0], 1))
    best = (q * hb * x).sum(1) / np.maximum((q * hb * q).sum(1), 1e-30)  # each block's weighted least-squares d
    d = np.ascontiguousarray(refit.rows.reshape(-1, 18)[:, :2]).view(np.float16)[:, 0]
    assert np.allclose(d, best, rtol=1e-3, atol=1e-7)


def test_columns_that_never_saw_an_input_are_still_quantized_well():
    """A zero variance (a column the calibration never fed) must not zero its
    weights' importance: other text may feed it."""
    scheme, p = SCHEMES["q4_0"], selection_params({"scheme": "q4_0"})
    w, h = _problem(rows=8, cols=256)
    h[:40, :] = 0
    h[:, :40] = 0
    qr, _e = gptq.quantize(w, h, scheme, p)
    got = scheme.dequantize_rows(qr, 256, p)
    plain = scheme.dequantize(scheme.quantize(w[:, :32], p), 8, 32, p)
    assert np.abs(got[:, :32] - w[:, :32]).max() <= 1.01 * np.abs(plain - w[:, :32]).max() + 1e-6


@pytest.mark.parametrize("n, block", [(64, 7), (200, 64), (200, 512), (257, 128)])
def test_inverse_factor_is_the_cholesky_factor_of_the_inverse(n, block):
    """The in-place factorization (H = V Vᵀ, U = V⁻¹, by blocks) against numpy's
    float64 inv + cholesky of the damped H, with a dead column and a block
    width that does not divide n."""
    x = np.random.default_rng(n).standard_normal((n + 40, n)) * np.random.default_rng(1).uniform(0.1, 3.0, n)
    h = x.T @ x / len(x)
    h[:, 5] = h[5, :] = 0.0
    u = gptq.inverse_factor(h, block)
    want = np.linalg.cholesky(np.linalg.inv(gptq.damped(h))).T
    assert np.array_equal(u, np.triu(u))
    assert np.abs(u - want).max() <= 1e-10 * np.abs(want).max()


def test_inverse_factor_of_a_singular_covariance_is_one_clear_error():
    h = np.ones((64, 64))  # rank 1; the 1% damping still leaves it positive definite
    gptq.inverse_factor(h, 16)
    h[0, 1] = h[1, 0] = -1e6  # indefinite whatever the damping
    with pytest.raises(IEError, match="not positive definite"):
        gptq.inverse_factor(h, 16)


@pytest.mark.parametrize("n, block", [(64, 7), (200, 512), (130, 64)])
def test_gram_by_upper_blocks_is_the_whole_product(n, block):
    """runtime/hessians.py's add_gram + mirror_upper: Σ XᵀX over chunks in float64, exactly symmetric."""
    from iekit.runtime.hessians import add_gram, mirror_upper

    rng = np.random.default_rng(n)
    xs = [rng.standard_normal((33, n)).astype(np.float32) for _ in range(3)]
    acc = np.zeros((n, n))
    for x in xs:
        add_gram(acc, x, block)
    mirror_upper(acc, block)
    want = sum(x.astype(np.float64).T @ x.astype(np.float64) for x in xs)
    assert np.array_equal(acc, acc.T)
    assert np.allclose(acc, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("h, needle", [
    (np.full((64, 64), np.nan), "non-finite"),
    (np.eye(64) + np.where(np.arange(64)[:, None] > np.arange(64), np.inf, 0.0), "non-finite"),  # off its diagonal
    (-np.eye(64), "negative variance"),
    (np.eye(32), "input covariance is [32, 32]"),
])
def test_bad_covariance_is_one_clear_error(h, needle):
    scheme, p = SCHEMES["q4_0"], selection_params({"scheme": "q4_0"})
    with pytest.raises(IEError, match=needle.replace("[", r"\[")):
        gptq.quantize(np.ones((4, 64), np.float32), h, scheme, p, "m")



def _kl(ref_logits, got):
    lp = ref_logits - ref_logits.max(1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
    lq = got - got.max(1, keepdims=True)
    lq = lq - np.log(np.exp(lq).sum(1, keepdims=True))
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())


@pytest.mark.parametrize("mode", ["--no-sequential", "--sequential"])
def test_gptq_artifact_is_closer_to_the_float_model(wide, tmp_path, mode):
    """ieconv gptq as a user runs it: the same schemes and size as hf-to-iebin with
    the manifest and an imatrix of the same text, closer to the float model,
    every quantized entry saying it was compensated, verify quant passing;
    --sequential takes a calibration pass per layer (and one for the head)."""
    from iekit.runtime.decoder import Decoder

    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q4_0", "--quantize-head",
                    "--imatrix", wide["imatrix"]).returncode == 0
    plain, g = tmp_path / "plain", tmp_path / "gptq"
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", wide["hf"], "--q4-map", m, "--out-dir", plain).returncode == 0
    res = run_tool("ieconv", "gptq", "--hf-dir", wide["hf"], "--ref-dir", wide["f32"], "--q4-map", m,
                   "--text-file", TEXT, "--ctx", "64", "--chunks", "6", "--out-dir", g, mode)
    assert res.returncode == 0, res.stderr
    passes = "3 passes" if mode == "--sequential" else "1 pass)"
    assert f"15 quantized, 15 error-compensated; covariances of 384 tokens (--text-file {TEXT}), {passes}" in res.stderr
    assert "under the input covariance" in res.stderr
    assert (g / iebin.BIN_NAME).stat().st_size == (plain / iebin.BIN_NAME).stat().st_size
    entries = [t for t in iebin.load_model(g).tensors if "quant" in t]
    assert len(entries) == 15 and all(t["quant_error"]["compensated"] is True for t in entries)
    ref = Decoder(wide["f32"])
    ids = ref.encode(TEXT.read_text())[:64]
    f32 = ref.logits(ids)
    kl_plain = _kl(f32, Decoder(plain, act="f32").logits(ids))
    kl_g = _kl(f32, Decoder(g, act="f32").logits(ids))
    assert kl_g < 0.5 * kl_plain, (kl_g, kl_plain)  # 0.0095 against 0.034 when written
    res = run_tool("ierun", "verify", "quant", "--model-dir", g, "--hf-dir", wide["hf"], "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert all("bound" not in r["checks"] for r in json.loads(res.stdout)["results"])


def test_gptq_bad_input_is_one_line(wide, tmp_path):
    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q4_0").returncode == 0
    args = ("ieconv", "gptq", "--hf-dir", wide["hf"], "--q4-map", m, "--text-file", TEXT, "--out-dir", tmp_path / "o")
    # another model's float artifact
    assert_one_line_error(run_tool(*args, "--ref-dir", GOLDEN_IEBIN / "tiny-llama"), "--ref-dir must be this checkpoint")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = run_tool(*args[:-4], "--text-file", empty, "--out-dir", tmp_path / "o", "--ref-dir", wide["f32"])
    assert_one_line_error(res, "empty.txt")
    assert not (tmp_path / "o").exists()


def test_a_chunk_of_rows_at_a_time_gives_the_same_bytes(wide, tmp_path, monkeypatch):
    """The converter compensates a matrix a chunk of rows at a time, on worker
    threads (memory bounded by the chunk, not the matrix: an 8B model's head
    is 0.5 G weights); rows are independent under one covariance, so the
    artifact is byte for byte the one made from whole matrices."""
    from iekit.convert import hf_to_iebin
    from iekit.formats import expert_stacks, hf_checkpoint
    from iekit.formats.q4_manifest import load_manifest, plan
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q3_k", "--quantize-head",
                    "--imatrix", wide["imatrix"]).returncode == 0
    manifest, src = load_manifest(m), hf_checkpoint.from_dir(wide["hf"])
    dec = Decoder(wide["f32"], act="f32", ctx=64)
    ids = dec.encode(TEXT.read_text())[:256]
    parts = [ids[i:i + 64] for i in range(0, 256, 64)]
    out = {}
    for chunk in (1 << 30, 40):  # whole matrices; 40 rows (ragged last chunks)
        monkeypatch.setattr(gptq, "chunk_rows", lambda rows, _cols, _workers, n=chunk: min(rows, n))
        names = list(plan(manifest, expert_stacks.shapes_as_written(src)).quantize)
        res = hf_to_iebin.convert(src, tmp_path / str(chunk), manifest=manifest,
                                  covariances=Hessians(dec, parts, names))
        assert res.quantized_tensors == len(names) == 15
        assert sum(e.compensated for e in res.errors.values()) == res.quantized_tensors
        out[chunk] = (tmp_path / str(chunk) / iebin.BIN_NAME).read_bytes()
    assert out[1 << 30] == out[40]


@pytest.mark.parametrize("rows, cols, workers, want", [
    (4096, 14336, 2, 585),     # an 8B down_proj: capped by CHUNK_ELEMS (8M elements), 7 chunks
    (14336, 4096, 2, 2048),    # its gate_proj: capped, 7 chunks
    (1024, 4096, 2, 256),      # its k_proj: under the cap, two chunks a worker
    (1024, 4096, 16, 32),
    (3, 576, 2, 1),
    (1, 1 << 30, 1, 1)])       # wider than the cap: still a row
def test_compensated_chunks_amortize_the_factor_and_feed_every_worker(rows, cols, workers, want):
    assert gptq.chunk_rows(rows, cols, workers) == want


def _realized(choices, w, covs):
    """Σ over matrices of the output error Σ δ H δᵀ that ieconv gptq leaves with each matrix's chosen selection."""
    total = 0.0
    for c in choices:
        sel = c.selection
        total += gptq.quantize(w[c.name], covs[c.name][0], SCHEMES[sel["scheme"]], selection_params(sel), c.name,
                               covs[c.name][1])[1].sq_error
    return total


def test_a_policy_measured_with_compensation_spends_bits_where_gptq_still_needs_them():
    """q4-manifest --target-bpw --ref-dir (bpw_policy.choose(covariance=...)):
    two matrices with the same rows and the same input variances, one whose
    inputs are correlated (compensation cancels much of its rounding error)
    and one whose inputs are independent (compensation can do nothing).
    Nearest rounding cannot tell them apart; measured as gptq quantizes, the
    bits go to the second, and the artifact gptq then makes has less output
    error than with the policy ranked by nearest rounding."""
    from iekit.convert import bpw_policy

    w0, h = _problem(rows=32, cols=1024)
    hd = np.diag(np.diagonal(h))
    w = {"corr": w0, "indep": w0.copy()}
    covs = {"corr": (h, gptq.inverse_factor(h)), "indep": (hd, gptq.inverse_factor(hd))}
    ladder = tuple(s for s in bpw_policy.GGUF_LADDER if s["scheme"] in ("q2_k", "q3_k", "q4_k", "q6_k"))
    shapes = {n: [32, 1024] for n in w}
    imp = {n: np.diagonal(h).astype(np.float32) for n in w}
    rows_of = lambda name, rows: w[name][rows]  # noqa: E731
    nearest = bpw_policy.choose(shapes, rows_of, imp, 4.0, ladder=ladder)
    comp = bpw_policy.choose(shapes, rows_of, imp, 4.0, ladder=ladder, covariance=covs.get)
    bits = {c.name: c.bits for c in comp}
    assert bits["indep"] > bits["corr"], [(c.name, c.selection) for c in comp]
    assert sum(c.bits for c in comp) <= 4.0 * 2 * 32 * 1024
    assert _realized(comp, w, covs) < 0.9 * _realized(nearest, w, covs)


@pytest.mark.parametrize("types, margin", [
    (("--exclude-types", "iq3_s"), 0.95),  # q3_k the one 3-bit type: 19.4 against 21.3 when written
    ((), 0.97),  # with iq3_s (18.0 against 18.9): gptq cancels part of its edge over q3_k, so nearest misleads less
])
def test_q4_manifest_ref_dir_measures_as_gptq_converts(wide, tmp_path, types, margin):
    """The command as a user runs it before ieconv gptq: the policy meets the
    budget, gptq converts it, and its artifact's total output error (each
    entry's quant_error under the calibration covariances) is below
    that of the policy ranked by nearest rounding, converted the same way."""
    calib = ("--text-file", TEXT, "--ctx", "64", "--chunks", "6")
    base = ("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "--target-bpw", "4.0", "--gguf-types",
            "--imatrix", wide["imatrix"], *types)
    totals, picked = {}, {}
    for mode, extra in (("nearest", ()), ("compensated", ("--ref-dir", wide["f32"], *calib))):
        m, out = tmp_path / f"{mode}.json", tmp_path / mode
        res = run_tool(*base, "-o", m, *extra)
        assert res.returncode == 0, res.stderr
        man = json.loads(m.read_text())
        assert man["bits_per_weight"] <= 4.0
        picked[mode] = man["tensors"]
        res = run_tool("ieconv", "gptq", "-q", "--hf-dir", wide["hf"], "--ref-dir", wide["f32"], "--q4-map", m,
                       "--out-dir", out, *calib)
        assert res.returncode == 0, res.stderr
        totals[mode] = sum(t["quant_error"]["sq_error"] for t in iebin.load_model(out).tensors if "quant" in t)
    assert picked["compensated"] != picked["nearest"]  # the measure moved bits (8 of 14 matrices when written)
    assert totals["compensated"] < margin * totals["nearest"], totals


def test_q4_manifest_ref_dir_of_another_model_is_one_line(wide, tmp_path):
    """The covariances must be this checkpoint's: another model's float
    artifact is refused before any measuring, and nothing is written."""
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "m.json", "--target-bpw", "4.0",
                   "--ref-dir", GOLDEN_IEBIN / "tiny-llama", "--text-file", TEXT)
    assert_one_line_error(res, "--ref-dir must be this checkpoint")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("extra, needle", [
    (("--ref-dir", "R", "--text-file", "T"), "give --target-bpw and --hf-dir"),
    (("--target-bpw", "4", "--ref-dir", "R"), "give --text-file or --ids-file"),
    (("--target-bpw", "4", "--text-file", "T"), "give --ref-dir too"),
])
def test_q4_manifest_ref_dir_usage_errors(wide, tmp_path, extra, needle):
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "m.json", *extra)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert not (tmp_path / "m.json").exists()


def _changed_bytes(a: np.ndarray, b: np.ndarray, block_bytes: int) -> set[int]:
    """The offsets inside a block at which any block of rows ``a`` and ``b`` differ."""
    diff = (a.reshape(-1, block_bytes) != b.reshape(-1, block_bytes)).any(axis=0)
    return set(np.flatnonzero(diff).tolist())


def _f16_bytes(scheme) -> set[int]:
    """The bytes of a block that its f16 fields occupy, as the scheme writes
    them (iq1_m's d: the top nibbles of its four scale words)."""
    raw = np.zeros((1, scheme.block_bytes), np.uint8)
    for f in range(len(scheme.F16_FIELDS)):
        scheme.set_f16_field(raw, f, np.array([0xFFFF], np.uint16).view(np.float16))
    return set(np.flatnonzero(raw[0]).tolist())


@pytest.mark.parametrize("sel", SELECTIONS + [{"scheme": "q6_k"}, {"scheme": "q2_k"}, {"scheme": "iq3_s"}, {"scheme": "iq3_xxs"},
                                              {"scheme": "iq2_xxs"}, {"scheme": "iq2_xs"}, {"scheme": "iq2_s"},
                                              {"scheme": "iq1_s"}, {"scheme": "iq1_m"},
                                              {"scheme": "q8_0"}, {"scheme": "int4w", "group_size": 128}],
                         ids=lambda s: "-".join(str(v) for v in s.values()))
def test_refit_scales_lowers_every_rows_error_and_changes_only_scale_fields(sel):
    """Codes held, only the scale fields move (a block type's F16_FIELDS
    bytes; int4w's scale and min planes, its codes not), and no row's
    error under H grows; the whole matrix's falls. mxfp4's power-of-two
    scales have no field to refit: its rows come back as they were."""
    w, h = _problem(rows=24, cols=512, seed=5)
    scheme, p = SCHEMES[sel["scheme"]], selection_params(sel)
    qr = gptq.quantize(w, h, scheme, p, refit=False)[0]
    new = gptq.refit_scales(w, h, qr, scheme, p)

    def row_errors(q):
        d = scheme.dequantize_rows(q, 512, p).astype(np.float64) - w
        return np.einsum("ij,jk,ik->i", d, h, d)

    before, after = row_errors(qr), row_errors(new)
    assert np.all(after <= before * (1 + 1e-12)), (after / before).max()
    if sel["scheme"] == "mxfp4":
        assert np.array_equal(new.rows, qr.rows)
        return
    assert after.sum() < 0.995 * before.sum(), after.sum() / before.sum()
    if qr.scales is not None:
        assert np.array_equal(new.rows, qr.rows) and not np.array_equal(new.scales, qr.scales)
        return
    fields = _f16_bytes(scheme)
    changed = _changed_bytes(qr.rows, new.rows, qr.rows.shape[1] // (512 // scheme.block_elems))
    assert changed and changed <= fields, (changed, fields)


def test_refit_scales_is_the_least_squares_fit_of_an_explicit_system():
    """q4_1 (two fields, d and m, per 32-element block) against the normal
    equations built from an explicit design matrix per row and solved in
    float64 by numpy's lstsq: the same fields, to their f16 rounding."""
    w, h = _problem(rows=6, cols=256, seed=9)
    scheme, p = SCHEMES["q4_1"], selection_params({"scheme": "q4_1"})
    qr = gptq.quantize(w, h, scheme, p, refit=False)[0]
    new = gptq.refit_scales(w, h, qr, scheme, p)
    blocks = qr.rows.reshape(6, 8, 20)
    codes = np.concatenate([blocks[:, :, 4:] & 0x0F, blocks[:, :, 4:] >> 4], axis=2).astype(np.float64)  # 6, 8, 32
    got = new.rows.reshape(6, 8, 20)
    for r in range(6):
        v = np.zeros((256, 16))
        for b in range(8):
            v[32 * b:32 * b + 32, b] = codes[r, b]  # d's column: the codes
            v[32 * b:32 * b + 32, 8 + b] = 1.0  # m's column
        want = np.linalg.lstsq(v.T @ h @ v, v.T @ h @ w[r].astype(np.float64), rcond=None)[0]
        d = np.ascontiguousarray(got[r, :, 0:2]).view(np.float16)[:, 0].astype(np.float64)
        m = np.ascontiguousarray(got[r, :, 2:4]).view(np.float16)[:, 0].astype(np.float64)
        assert np.allclose(d, want[:8], rtol=2e-3, atol=1e-6), (d, want[:8])
        assert np.allclose(m, want[8:], rtol=2e-3, atol=1e-6), (m, want[8:])


# The bytes of each sub-scale type's block that hold scales (its f16 super-scales and sub-scales):
# refit_sub_scales may change these and nothing else.
SCALE_BYTES = {"q4_k": range(0, 16), "q5_k": range(0, 16), "q6_k": range(192, 210), "q3_k": range(96, 110),
               "q2_k": [*range(0, 16), *range(80, 84)], "iq4_xs": range(0, 8), "iq4_xsh": range(0, 8),
               "iq3_s": [0, 1, *range(106, 110)], "iq3_xxs": [0, 1, *range(69, 98, 4)],
               "iq2_xxs": [0, 1, *range(9, 66, 8)], "iq2_xs": [0, 1, *range(66, 74)], "iq2_s": [0, 1, *range(74, 82)],
               "iq1_s": [0, 1, *range(35, 50, 2)], "iq1_m": range(48, 56)}


def _row_errors(w, h, scheme, p, q):
    d = scheme.dequantize_rows(q, w.shape[1], p).astype(np.float64) - w
    return np.einsum("ij,jk,ik->i", d, h, d)


@pytest.mark.parametrize("name", sorted(SCALE_BYTES))
def test_sub_scale_fields_are_what_dequantization_multiplies(name):
    """Each type's SubScales, as refit_sub_scales reads them: the dequantized
    values are the fields times their bases, exactly (float32); and
    with_sub_scales of the fields as they are keeps the codes' bytes and
    stores fields that read back as exactly fit_levels' super-scale times
    its integers (an integer packed off by one, or into the wrong bytes,
    reads back as another value)."""
    w, _h = _problem(rows=8, cols=512, seed=3)
    scheme, p = SCHEMES[name], selection_params({"scheme": name})
    raw = scheme.quantize_rows(w, p, "t").rows.reshape(-1, scheme.block_bytes)
    sub = scheme.sub_scale_fields(raw)
    nf = sub.values.shape[1]
    got = sub.values[:, 0, :, None] * sub.basis[:, 0]
    if nf == 2:  # a min: its basis is −1
        assert np.all(sub.basis[:, 1] == -1)
        got = got + sub.values[:, 1, :, None] * sub.basis[:, 1]
    assert np.array_equal(got.reshape(raw.shape[0], -1), scheme.dequantize(raw, 8, 512, p).reshape(raw.shape[0], -1))
    again = scheme.with_sub_scales(raw, sub.values)
    codes = np.setdiff1d(np.arange(scheme.block_bytes), SCALE_BYTES[name])
    assert np.array_equal(again[:, codes], raw[:, codes])
    back = scheme.sub_scale_fields(again).values
    assert len(scheme.SUB_LEVELS) == nf
    for f, (lo, hi, odd) in enumerate(scheme.SUB_LEVELS):
        d, levels = fit_levels(sub.values[:, f], lo, hi, odd)
        assert np.array_equal(back[:, f], d[:, None] * levels.astype(np.float32)), (name, f)


@pytest.mark.parametrize("lo, hi, odd", [(0, 63, False), (-32, 31, False), (-128, 127, False), (0, 15, False),
                                         (1, 31, True)])
def test_fit_levels_codes_sub_scales_within_their_range(lo, hi, odd):
    """fit_levels: integers in lo..hi (odd ones only for iq3_s's 1 + 2 s),
    d exact in f16, and an error no larger than coding against the largest
    value alone (d = its value / the range's end), which its search includes."""
    rng = np.random.default_rng(abs(lo) + hi)
    x = (rng.standard_normal((500, 8)) * np.exp(rng.standard_normal((500, 1)))).astype(np.float32)
    if lo >= 0:
        x = np.abs(x)
    d, l = fit_levels(x, lo, hi, odd)
    assert l.min() >= lo and l.max() <= hi
    if odd:
        assert np.all(l % 2 == 1)
    assert np.array_equal(d, d.astype(np.float16).astype(np.float32))
    top = x[np.arange(500), np.abs(x).argmax(axis=1)]
    plain = np.inf
    for end in {lo, hi} - {0}:
        d0 = (top / np.float32(end)).astype(np.float16).astype(np.float32)
        r = x / d0[:, None]
        l0 = np.clip(2 * np.rint((r - 1) / 2) + 1 if odd else np.rint(r), lo, hi)
        plain = np.minimum(plain, np.square(x - d0[:, None] * l0).sum(axis=1))
    assert np.all(np.square(x - d[:, None] * l).sum(axis=1) <= plain * (1 + 1e-6) + 1e-30)


@pytest.mark.parametrize("window, sweeps", [(gptq.SUB_WINDOW, gptq.SUB_SWEEPS), (16, 2)])
@pytest.mark.parametrize("name", sorted(SCALE_BYTES))
def test_refit_sub_scales_beats_refit_scales_and_no_row_grows(name, window, sweeps, monkeypatch):
    """With the sub-scales refitted too, no row's error under H grows (each
    window's change is kept only where its exact effect lowers the error:
    with windows of one super-block or less and two sweeps, the H rᵀ kept
    between windows is tested too), the matrix's error is at most
    refit_scales' (the d-only refit, which one window includes) and well
    below gptq's own, and only scale bytes change."""
    monkeypatch.setattr(gptq, "SUB_WINDOW", window)
    monkeypatch.setattr(gptq, "SUB_SWEEPS", sweeps)
    w, h = _problem(rows=24, cols=1024, seed=5)
    scheme, p = SCHEMES[name], selection_params({"scheme": name})
    qr = gptq.quantize(w, h, scheme, p, refit=False)[0]
    new = gptq.refit_to_codes(w, h, qr, scheme, p)
    before, after = _row_errors(w, h, scheme, p, qr), _row_errors(w, h, scheme, p, new)
    assert np.all(after <= before * (1 + 1e-9)), (after / before).max()
    assert after.sum() < 0.97 * before.sum(), after.sum() / before.sum()
    if window == gptq.SUB_WINDOW:
        d_only = _row_errors(w, h, scheme, p, gptq.refit_scales(w, h, qr, scheme, p))
        assert after.sum() <= d_only.sum() * (1 + 1e-9), (after.sum(), d_only.sum())
    changed = _changed_bytes(qr.rows, new.rows, scheme.block_bytes)
    assert changed and changed <= set(SCALE_BYTES[name]), changed


def test_refit_is_refit_scales_for_types_without_sub_scales():
    """q4_0 and int4w have no sub-scales: gptq.refit_to_codes is refit_scales, byte for byte."""
    w, h = _problem(rows=8, cols=256, seed=2)
    for sel in ({"scheme": "q4_0"}, {"scheme": "int4w", "group_size": 64}):
        scheme, p = SCHEMES[sel["scheme"]], selection_params(sel)
        qr = gptq.quantize(w, h, scheme, p, refit=False)[0]
        a, b = gptq.refit_to_codes(w, h, qr, scheme, p), gptq.refit_scales(w, h, qr, scheme, p)
        assert np.array_equal(a.rows, b.rows)
        assert (a.scales is None and b.scales is None) or np.array_equal(a.scales, b.scales)


def test_gptq_refit_scales_option(wide, tmp_path):
    """ieconv gptq refits by default: against --no-refit-scales the same
    size, the q4_0 codes byte for byte (only each block's d moved), and
    less recorded output error, matrix by matrix."""
    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q4_0", "--quantize-head",
                    "--imatrix", wide["imatrix"]).returncode == 0
    args = ("ieconv", "gptq", "-q", "--hf-dir", wide["hf"], "--ref-dir", wide["f32"], "--q4-map", m, "--text-file",
            TEXT, "--ctx", "64", "--chunks", "6")
    for name, extra in (("plain", ["--no-refit-scales"]), ("refit", [])):
        res = run_tool(*args, "--out-dir", tmp_path / name, *extra)
        assert res.returncode == 0, res.stderr
    models = {n: iebin.load_model(tmp_path / n) for n in ("plain", "refit")}
    errors = {n: {t["name"]: t["quant_error"]["sq_error"] for t in mdl.tensors if "quant" in t}
              for n, mdl in models.items()}
    assert errors["plain"].keys() == errors["refit"].keys() and len(errors["plain"]) == 15
    assert all(errors["refit"][k] <= errors["plain"][k] for k in errors["plain"]), errors
    assert sum(errors["refit"].values()) < 0.99 * sum(errors["plain"].values())
    a, b = ((tmp_path / n / iebin.BIN_NAME).read_bytes() for n in ("plain", "refit"))
    assert len(a) == len(b)
    for t in models["plain"].tensors:
        if "quant" in t:
            off, n = t["file_data_offset"], t["nbytes"]
            ta, tb = (np.frombuffer(x[off:off + n], np.uint8) for x in (a, b))
            assert _changed_bytes(ta, tb, 18) <= {0, 1}, t["name"]
