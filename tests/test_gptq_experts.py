"""Error compensation for mixtures of experts: each expert's covariances
from the rows routed to it (runtime/hessians.py over csrc/decoder's
collect_stats(capture_experts=...)), checked against a float64 routing of
the captured layer inputs; ieconv gptq compensating every expert (a tensor
each, and gpt-oss's stacks one expert at a time) with less output error
under those covariances than nearest rounding; the sequential mode swapping
quantized experts in."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, run_tool
from iekit.convert.bpw_policy import selection_key
from iekit.formats import gptq, iebin
from iekit.formats.quant import SCHEMES, matrix_dims
from test_imatrix_experts import _glu, _router, _weights

TEXT = GOLDEN / "text" / "eval-sample.txt"
IDS = [int(i) for i in np.random.default_rng(8).integers(3, 300, 48)]
CHUNKS = [IDS[16 * c:16 * (c + 1)] for c in range(3)]


def _expert_names(name: str, layer: int, e: int) -> tuple[list[str], str]:
    """(expert e's gate/up matrices, its down matrix) of ``layer``: stack names for gpt-oss."""
    pre = f"model.layers.{layer}."
    if name == "tiny-gpt-oss":
        return [pre + "mlp.experts.gate_up_proj"], pre + "mlp.experts.down_proj"
    ex = pre + f"block_sparse_moe.experts.{e}."
    return [ex + "w1.weight", ex + "w3.weight"], ex + "w2.weight"


def _routed_reference(name: str, chunks) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Per (layer, expert): Σ x xᵀ / tokens of its routed inputs and of its down inputs, routed in float64
    from the MLP inputs the decoder captured (slot 4 l + 2)."""
    from iekit.runtime.decoder import Decoder

    dec = Decoder(GOLDEN_IEBIN / name, threads=1, act="f32")
    spec, cfg = dec.spec, iebin.load_model(GOLDEN_IEBIN / name).meta["config"]
    dec._dec.collect_stats(True, [4 * layer + 2 for layer in range(spec.n_layers)])
    rows = {layer: [] for layer in range(spec.n_layers)}
    for c in chunks:
        dec.logits(c)
        for layer in rows:
            rows[layer].append(dec._dec.take_captured(4 * layer + 2).astype(np.float64))
    dec._dec.collect_stats(False)
    w, tokens, out = _weights(GOLDEN_IEBIN / name), sum(map(len, chunks)), {}
    for layer in rows:
        pre, x = f"model.layers.{layer}.", np.concatenate(rows[layer])
        top = np.argsort(-_router(name, w, pre, x), axis=1, kind="stable")[:, :spec.moe.top_k]
        for e in range(spec.moe.n_experts):
            xe = x[(top == e).any(axis=1)]
            mid = _glu(name, w, pre, e, xe, cfg)
            out[layer, e] = (xe.T @ xe / tokens, mid.T @ mid / tokens)
    return out


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-mixtral"])
def test_expert_covariances_match_a_float64_routing(name):
    """Every expert's two covariances (a stack's through get(name, e)), in
    windows of two covariances (several passes), against the float64
    routing of the captured MLP inputs; the router's is the MLP input's."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    ref = _routed_reference(name, CHUNKS)
    dec = Decoder(GOLDEN_IEBIN / name, threads=2, act="f32")
    names = [t["name"] for t in iebin.load_model(GOLDEN_IEBIN / name).tensors]
    cov = Hessians(dec, CHUNKS, names, budget=2 * dec.spec.hidden ** 2 * 8)
    checked = 0
    for n in cov.forward_order(names):
        for slot, e in cov.units_of(n):
            if e < 0:
                continue
            h, u = cov.get(n, e) if cov.is_stack(n) else cov.get(n)
            want = ref[slot // 4, e][0 if slot % 4 == 2 else 1]
            np.testing.assert_allclose(h, want, rtol=2e-4, atol=1e-6 * np.abs(want).max(), err_msg=f"{n} {e}")
            assert np.allclose(u.T @ u @ gptq.damped(h), np.eye(len(h)), atol=1e-6)
            checked += 1
    spec = dec.spec
    assert checked == spec.n_layers * spec.moe.n_experts * (2 if name == "tiny-gpt-oss" else 3)
    assert cov.passes > 2 * spec.n_layers and not cov.unrouted  # windows of two: many passes; every expert routed
    if name == "tiny-gpt-oss":
        stack = "model.layers.0.mlp.experts.gate_up_proj"
        assert cov.is_stack(stack) and cov.get(stack) is None  # a stack's covariances are per expert


def _stored(model_dir) -> dict[str, np.ndarray]:
    """Each quantized tensor of an artifact, dequantized (float64, its shape)."""
    m, out = iebin.load_model(model_dir), {}
    for t in m.tensors:
        if t["dtype"] in SCHEMES:
            raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
            count, rows, cols = matrix_dims(t["shape"])
            s = SCHEMES[t["dtype"]]
            out[t["name"]] = s.dequantize(np.frombuffer(raw, np.uint8), count * rows, cols,
                                          s.params_from(t["quant"], cols)).reshape(t["shape"]).astype(np.float64)
    return out


def _expert_errors(name: str, model_dir, ref, w) -> np.ndarray:
    """Per (layer, expert, matrix): Σ δ H δᵀ of the artifact's expert matrices under their routed covariances."""
    q = _stored(model_dir)
    out = []
    for (layer, e), (h_in, h_mid) in sorted(ref.items()):
        ins, down = _expert_names(name, layer, e)
        for n, h in [*((n, h_in) for n in ins), (down, h_mid)]:
            d = (w[n][e] - q[n][e]) if w[n].ndim == 3 else w[n] - q[n]
            out.append(np.einsum("ij,jk,ik->", d, h, d))
    return np.array(out)


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-mixtral"])
def test_gptq_compensates_every_expert_under_its_own_covariance(tmp_path, name):
    """ieconv gptq on a mixture: every quantized matrix compensated (no
    warning), and each expert matrix leaves less output error under its
    routed covariance (the float64 reference over the same calibration
    chunks) than nearest rounding does in the same scheme."""
    from iekit.runtime.calibration import calibration_chunks, float_decoder

    man = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q4_0").returncode == 0
    res = run_tool("ieconv", "gptq", "--hf-dir", GOLDEN_HF / name, "--ref-dir", GOLDEN_IEBIN / name, "--q4-map", man,
                   "--text-file", TEXT, "--out-dir", tmp_path / "gptq", "--ctx", "32", "-q")
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    n_quant = len(_stored(tmp_path / "gptq"))
    assert f"{n_quant} quantized, {n_quant} error-compensated" in res.stderr
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / name, "--out-dir", tmp_path / "plain",
                    "--q4-map", man).returncode == 0
    parts, _ = calibration_chunks(float_decoder(GOLDEN_IEBIN / name, threads=1, ctx=32), TEXT, None, 32)
    ref, w = _routed_reference(name, parts), _weights(GOLDEN_IEBIN / name)
    compensated, nearest = _expert_errors(name, tmp_path / "gptq", ref, w), _expert_errors(name, tmp_path / "plain",
                                                                                           ref, w)
    assert (compensated < nearest).all(), (compensated / nearest).round(3)
    assert compensated.sum() < 0.9 * nearest.sum(), compensated.sum() / nearest.sum()


def test_a_stacks_experts_are_each_compensated_under_their_own(tmp_path):
    """The bytes of each expert of a gpt-oss stack in ieconv gptq's artifact
    are gptq.quantize of that expert's rows under that expert's covariance
    (Hessians.get(name, e), the same calibration): not another expert's,
    not the layer's."""
    from iekit.formats.gptq import quantize
    from iekit.formats.quant import QuantParams
    from iekit.formats.workers import one_blas_thread
    from iekit.runtime.calibration import calibration_chunks, float_decoder
    from iekit.runtime.hessians import Hessians

    name, stack = "tiny-gpt-oss", "model.layers.1.mlp.experts.down_proj"
    man = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q4_0").returncode == 0
    res = run_tool("ieconv", "gptq", "--hf-dir", GOLDEN_HF / name, "--ref-dir", GOLDEN_IEBIN / name, "--q4-map", man,
                   "--text-file", TEXT, "--out-dir", tmp_path / "gptq", "--ctx", "32", "--no-refit-scales", "-q")
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(tmp_path / "gptq")
    t = next(t for t in m.tensors if t["name"] == stack)
    got = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
    dec = float_decoder(GOLDEN_IEBIN / name, threads=1, ctx=32)
    parts, _ = calibration_chunks(dec, TEXT, None, 32)
    w = _weights(GOLDEN_IEBIN / name)[stack]
    scheme, p = SCHEMES["q4_0"], QuantParams("q4_0")
    per_expert = len(got) // len(w)
    with one_blas_thread():
        cov = Hessians(dec, parts, [stack])
        for e in range(len(w)):
            h, u = cov.get(stack, e)
            qr, _err = quantize(w[e].astype(np.float32), h, scheme, p, stack, u, refit=False)
            want = b"".join(x.tobytes() for x in scheme.payload(qr))
            assert got[e * per_expert:(e + 1) * per_expert] == want, e
            assert want != got[((e + 1) % len(w)) * per_expert:((e + 1) % len(w) + 1) * per_expert]


def _layer_matrices(names, layer: int) -> list[str]:
    return [n for n in names if n.startswith(f"model.layers.{layer}.") and not n.endswith("norm.weight")
            and "bias" not in n and "sinks" not in n]


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-mixtral"])
def test_replaced_experts_compute_what_a_quantized_artifact_does(tmp_path, name):
    """Decoder.replace_matrices with every matrix's dequantized values (a
    stack's as [experts x rows, cols]) gives the logits of the decoder on the
    quantized artifact itself; a stack of the wrong height is refused."""
    from iekit.formats.errors import IEError
    from iekit.runtime.decoder import Decoder

    man = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q4_0").returncode == 0
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / name, "--out-dir", tmp_path / "q",
                    "--q4-map", man).returncode == 0
    q = _stored(tmp_path / "q")
    dec = Decoder(GOLDEN_IEBIN / name, act="f32")
    before = dec.logits(IDS[:12])
    dec.replace_matrices({n: v.reshape(-1, v.shape[-1]).astype(np.float32) for n, v in q.items()})
    want = Decoder(tmp_path / "q", act="f32").logits(IDS[:12])
    assert np.allclose(dec.logits(IDS[:12]), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert not np.allclose(before, want, rtol=1e-3)
    if name == "tiny-gpt-oss":
        with pytest.raises(IEError, match="down_proj: 255 rows are not 4 experts'"):
            dec.replace_matrices({"model.layers.0.mlp.experts.down_proj": np.zeros((255, 64), np.float32)})


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-mixtral"])
def test_sequential_expert_covariances_see_the_quantized_earlier_layer(name):
    """With --sequential, layer 1's covariances (its experts' included) are
    those of the model whose layer 0 (its experts' matrices included) is
    replaced by what was settled: the same as a plain collection on a
    decoder with those values swapped in, and not the float model's."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    names = [t["name"] for t in iebin.load_model(GOLDEN_IEBIN / name).tensors]
    w = _weights(GOLDEN_IEBIN / name)
    coarse = {n: (np.round(w[n] * 4) / 4).reshape(-1, w[n].shape[-1]).astype(np.float32)
              for n in _layer_matrices(names, 0)}
    seq = Hessians(Decoder(GOLDEN_IEBIN / name, act="f32"), CHUNKS, names, sequential=True)
    swapped = Decoder(GOLDEN_IEBIN / name, act="f32")
    swapped.replace_matrices(coarse)
    plain, floats = Hessians(swapped, CHUNKS, names), Hessians(Decoder(GOLDEN_IEBIN / name, act="f32"), CHUNKS, names)
    later = 0
    for n in seq.forward_order(names):
        for slot, e in seq.units_of(n):
            get = (lambda c: c.get(n, e)) if seq.is_stack(n) else (lambda c: c.get(n))
            h = get(seq)[0]
            if slot // 4 == 1:
                want = get(plain)[0]
                assert np.allclose(h, want, rtol=1e-4, atol=1e-6 * np.abs(want).max()), (n, e)
                later += not np.allclose(h, get(floats)[0], rtol=1e-2)
        if n in coarse:
            seq.settle(n, coarse[n])
    assert later > 10  # the coarse layer 0 moved layer 1's inputs


def test_experts_no_row_reached_take_their_layers_routed_mean(tmp_path):
    """Four copies of one token give four identical rows, routed to the same
    two of four experts in each layer: the other two take the mean of the
    routed experts' covariances of the same input, and ieconv gptq says how
    many experts in which layers got no row."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    name, chunks = "tiny-mixtral", [[7, 7, 7, 7]]
    names = [t["name"] for t in iebin.load_model(GOLDEN_IEBIN / name).tensors]
    cov = Hessians(Decoder(GOLDEN_IEBIN / name, act="f32"), chunks, names)
    ref = _routed_reference(name, chunks)
    for n in cov.forward_order(names):
        cov.get(n)  # every unit collected (one window)
    unrouted = {(layer, e) for (layer, e), (h_in, _h) in ref.items() if not h_in.any()}
    assert {(s // 4, e) for s, e in cov.unrouted} == unrouted and len(unrouted) == 4
    for layer, e in unrouted:
        ins, down = _expert_names(name, layer, e)
        routed = [r for (lay, r) in ref if lay == layer and (lay, r) not in unrouted]
        for n, k in ((ins[0], 0), (ins[1], 0), (down, 1)):
            want = np.mean([ref[layer, r][k] for r in routed], axis=0)
            np.testing.assert_allclose(cov.get(n)[0], want, rtol=2e-4, atol=1e-6 * np.abs(want).max())
    ids = tmp_path / "ids.txt"
    ids.write_text("7 7 7 7\n")
    man = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q4_0").returncode == 0
    res = run_tool("ieconv", "gptq", "--hf-dir", GOLDEN_HF / name, "--ref-dir", GOLDEN_IEBIN / name, "--q4-map", man,
                   "--ids-file", ids, "--ctx", "4", "--out-dir", tmp_path / "o", "-q")
    assert res.returncode == 0, res.stderr
    assert "warning: 4 experts (layers 0, 1) got no calibration row" in res.stderr


def test_policy_measures_each_stack_expert_as_gptq_quantizes_it(tmp_path):
    """q4-manifest --target-bpw --ref-dir on gpt-oss's float stacks: each
    stack's sampled rows are measured an expert at a time under that
    expert's covariance, as gptq compensates them (rows are independent
    under one covariance), so the error it records for the selection it
    chose is what ieconv gptq's artifact has on those rows: Σ δ H_e δᵀ
    of the artifact's sampled rows, each under its expert's covariance,
    scaled to the stack."""
    from iekit.convert.bpw_policy import sample_rows
    from iekit.runtime.calibration import calibration_chunks, float_decoder
    from iekit.runtime.hessians import Hessians

    name, calib = "tiny-gpt-oss", ("--text-file", TEXT, "--ctx", "32")
    man, meas, out = tmp_path / "q.json", tmp_path / "m.json", tmp_path / "o"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--target-bpw", "4.5",
                   "--ref-dir", GOLDEN_IEBIN / name, *calib, "--measurements", meas)
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "gptq", "--hf-dir", GOLDEN_HF / name, "--ref-dir", GOLDEN_IEBIN / name, "--q4-map", man,
                   *calib, "--out-dir", out, "-q")
    assert res.returncode == 0, res.stderr
    chosen, measured = json.loads(man.read_text())["tensors"], json.loads(meas.read_text())["matrices"]
    stacks = [n for n in chosen if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    dec = float_decoder(GOLDEN_IEBIN / name, threads=1, ctx=32)
    cov = Hessians(dec, calibration_chunks(dec, TEXT, None, 32)[0], stacks)
    w, q = _weights(GOLDEN_IEBIN / name), _stored(out)
    assert len(stacks) == 4
    for n in stacks:
        E, rows, _cols = w[n].shape
        ids = np.array(sample_rows(E * rows))
        d = (w[n] - q[n]).reshape(E * rows, -1)[ids]
        want = sum(np.einsum("ij,jk,ik->", d[ids // rows == e], cov.get(n, e)[0], d[ids // rows == e])
                   for e in range(E)) * E * rows / len(ids)
        assert measured[n]["placed"][selection_key(chosen[n])][1] == pytest.approx(want, rel=1e-4), n
