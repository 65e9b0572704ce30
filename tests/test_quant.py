"""Quantization reference (formats/quant.py): byte equality with gguf's
reference quantizers, int4w bounds, and the quant rules of IEBIN entries."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from hypothesis import given, settings
from hypothesis import strategies as st

from iekit.formats.errors import IEError
from iekit.formats.quant import SCHEMES, QuantDictError, QuantParams

GGUF = {"q4_0": GT.Q4_0, "q4_1": GT.Q4_1, "q5_0": GT.Q5_0, "q5_1": GT.Q5_1, "q8_0": GT.Q8_0, "mxfp4": GT.MXFP4}


def gguf_quantize(w: np.ndarray, scheme: str) -> np.ndarray:
    """gguf.quants' bytes, with the one deliberate difference: an mxfp4 block
    whose largest magnitude is below 2^-125 stores e = 0, where gguf's uint8
    cast of a negative exponent wraps (to a huge scale; the codes are all 0
    either way, so the weights are the same)."""
    ref = gguf.quants.quantize(w, GGUF[scheme])
    if scheme == "mxfp4":
        blocks = ref.reshape(-1, 17)
        assert (blocks[np.abs(w.reshape(-1, 32)).max(axis=1) < 2.0**-125, 1:] == 0).all()
        blocks[np.abs(w.reshape(-1, 32)).max(axis=1) < 2.0**-125, 0] = 0
    return ref


def adversarial_rows(rng: np.random.Generator, cols: int = 96) -> np.ndarray:
    rows = [
        np.zeros(cols),                                   # all zeros
        rng.standard_normal(cols),                        # plain
        np.r_[rng.standard_normal(cols - 1) * 1e-3, 50.0],  # one huge outlier
        -np.abs(rng.standard_normal(cols)),               # negative max
        np.r_[-7.0, rng.uniform(-1, 7, cols - 1)],        # largest magnitude negative
        np.full(cols, 1e-41),                             # subnormals
        np.r_[np.zeros(cols - 1), -1e-39],                # one subnormal
        rng.standard_normal(cols) * 1e-6,
        np.full(cols, 3.25),                              # constant block
        np.tile([0.5, -0.5], cols // 2),                  # exact ties
    ]
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("scheme", sorted(GGUF))
def test_block_schemes_byte_identical_to_gguf(scheme):
    rng = np.random.default_rng(1)
    w = np.concatenate([adversarial_rows(rng), rng.standard_normal((23, 96)).astype(np.float32) * 3])
    ours = SCHEMES[scheme].quantize(w, QuantParams(scheme))
    ref = gguf_quantize(w, scheme)
    assert ours.tobytes() == ref.tobytes()
    deq = SCHEMES[scheme].dequantize(ours, *w.shape, QuantParams(scheme))
    ref_deq = gguf.quants.dequantize(ref, GGUF[scheme]).astype(np.float32)
    assert np.array_equal(deq.view(np.uint32), ref_deq.view(np.uint32))
    assert (np.abs(w - deq) <= SCHEMES[scheme].error_bound(w, ours, QuantParams(scheme))).all()


@settings(max_examples=60, deadline=None)
@given(scheme=st.sampled_from(sorted(GGUF)), rows=st.integers(1, 5), blocks=st.integers(1, 4),
       log_scale=st.floats(-12, 3), seed=st.integers(0, 2**31))
def test_block_schemes_match_gguf_on_random_scales(scheme, rows, blocks, log_scale, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, 32 * blocks)) * 10.0 ** log_scale).astype(np.float32)
    ours = SCHEMES[scheme].quantize(w, QuantParams(scheme))
    assert ours.tobytes() == gguf_quantize(w, scheme).tobytes()


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_rejected(scheme, bad):
    w = np.ones((2, 64), np.float32)
    w[1, 7] = bad
    p = QuantParams(scheme, 64) if scheme == "int4w" else QuantParams(scheme)
    with pytest.raises(IEError, match=r"layer\.w: non-finite value .* at \(1, 7\)"):
        SCHEMES[scheme].quantize(w, p, name="layer.w")


def test_f16_scale_overflow_is_a_clear_error():
    w = np.full((1, 32), 1e9, np.float32)
    with pytest.raises(IEError, match="overflows f16"):
        SCHEMES["q8_0"].quantize(w, QuantParams("q8_0"), name="x")
    # int4w with f32 scales takes it
    raw = SCHEMES["int4w"].quantize(w, QuantParams("int4w", 32, True, "f32"))
    assert np.allclose(SCHEMES["int4w"].dequantize(raw, 1, 32, QuantParams("int4w", 32, True, "f32")), w, rtol=0.1)


INT4W_VARIANTS = [QuantParams("int4w", g, sym, sd) for g in (32, 64, 128, None)
                  for sym in (True, False) for sd in ("f16", "f32")]


@pytest.mark.parametrize("p", INT4W_VARIANTS, ids=lambda p: f"g{p.group_size}-{'sym' if p.symmetric else 'aff'}-{p.scale_dtype}")
def test_int4w_round_trip_within_half_a_step(p):
    rng = np.random.default_rng(7)
    w = np.concatenate([adversarial_rows(rng, 256), rng.standard_normal((13, 256)).astype(np.float32)])
    s = SCHEMES["int4w"]
    raw = s.quantize(w, p)
    assert raw.size == s.nbytes(*w.shape, p)
    deq = s.dequantize(raw, *w.shape, p)
    bound = s.error_bound(w, raw, p)
    assert (np.abs(w - deq) <= bound).all()
    # the bound is tight enough to mean something: half of the largest step
    # the scheme may pick (symmetric: up to 1.5 x amax/7; affine: span/15)
    g = p.group_size or 256
    x = w.reshape(w.shape[0], -1, g).astype(np.float64)
    step = 1.5 * np.abs(x).max(2) / 7 if p.symmetric else np.ptp(x, axis=2) / 15
    # f16 scales: relative rounding, plus absolute spacing 2^-24 in the subnormal range
    slack = 2**-10 * np.abs(x).max(2) + 16 * 2**-25 if p.scale_dtype == "f16" else 1e-6 * np.abs(x).max(2)
    assert (bound.reshape(x.shape)[..., 0] <= 0.5 * step * 1.01 + slack + 2**-22).all()


def test_int4w_scale_search_never_loses_to_the_plain_scale():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 128)).astype(np.float32) ** 3  # heavy tails
    s = SCHEMES["int4w"]
    p = QuantParams("int4w", 64, True, "f32")
    deq = s.dequantize(s.quantize(w, p), 64, 128, p)
    # plain scale: s0 only (k = 0), computed independently here
    x = w.reshape(64, 2, 64)
    mx, mn = x.max(2, keepdims=True), x.min(2, keepdims=True)
    s0 = np.where(-mn >= mx, np.maximum(-mn / 8, mx / 7), -np.maximum(mx / 8, -mn / 7))
    q = np.clip(np.rint(x / s0) + 8, 0, 15)
    plain = (s0 * (q - 8)).reshape(64, 128)
    sse_search = ((w - deq) ** 2).reshape(64, 2, 64).sum(2)
    sse_plain = ((w - plain) ** 2).reshape(64, 2, 64).sum(2)
    assert (sse_search <= sse_plain * (1 + 1e-6) + 1e-12).all()
    assert sse_search.sum() < sse_plain.sum()  # and it does help somewhere


@pytest.mark.parametrize("scale_dtype", ["f16", "f32"])
def test_int4w_symmetric_scale_is_the_best_of_the_nine_candidates(scale_dtype):
    """Each group's stored scale is the candidate s0 x (1 + k/16), k = 0..8, as
    stored, with the least squared error (float64 here), and its codes the
    nearest: the search keeps the winner, not the last or the first tried."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    w[0, :64] = 0  # a zero group
    p = QuantParams("int4w", 64, True, scale_dtype)
    s = SCHEMES["int4w"]
    raw = s.quantize(w, p)
    _qs, got_s, _ = s.planes(raw, 48, 256, p)
    deq = s.dequantize(raw, 48, 256, p).reshape(48, 4, 64).astype(np.float64)
    x = w.reshape(48, 4, 64).astype(np.float64)
    mx, mn = x.max(2), x.min(2)
    s0 = np.where(-mn >= mx, np.maximum(-mn / 8, mx / 7), -np.maximum(mx / 8, -mn / 7)).astype(np.float32)
    errs = []
    for k in range(9):
        c = (s0 * np.float32(1 + k / 16)).astype(np.float16 if scale_dtype == "f16" else np.float32).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(c[..., None] != 0, np.clip(np.rint(x / c[..., None]), -8, 7), 0)
        errs.append(((x - c[..., None] * q) ** 2).sum(2))
    errs = np.stack(errs)
    got = ((x - deq) ** 2).sum(2)
    assert (got <= errs.min(0) * (1 + 1e-5) + 1e-30).all()
    picked = errs.argmin(0)[1:]
    assert len(set(picked.ravel())) >= 3  # winners other than the first: keeping it would fail above
    assert got_s[0, 0] == 0


def test_int4w_layout_matches_the_spec_written_independently():
    """Pack codes/scales by hand from docs/formats/quant.md and dequantize them."""
    rng = np.random.default_rng(5)
    rows, cols, g = 3, 64, 32
    q = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    sc = rng.uniform(-1, 1, (rows, cols // g)).astype(np.float16)
    mn = rng.uniform(-1, 1, (rows, cols // g)).astype(np.float16)
    packed = bytearray()
    for r in range(rows):
        for b in range(cols // 32):
            blk = q[r, 32 * b: 32 * b + 32]
            packed += bytes(int(blk[j]) | (int(blk[j + 16]) << 4) for j in range(16))
    raw = np.frombuffer(bytes(packed) + sc.tobytes() + mn.tobytes(), np.uint8)
    p = QuantParams("int4w", g, False, "f16")
    deq = SCHEMES["int4w"].dequantize(raw, rows, cols, p)
    expect = np.repeat(sc.astype(np.float32), g, 1) * q.astype(np.float32) + np.repeat(mn.astype(np.float32), g, 1)
    assert np.array_equal(deq, expect)
    raw_sym = np.frombuffer(bytes(packed) + sc.tobytes(), np.uint8)
    deq = SCHEMES["int4w"].dequantize(raw_sym, rows, cols, QuantParams("int4w", g, True, "f16"))
    assert np.array_equal(deq, np.repeat(sc.astype(np.float32), g, 1) * (q.astype(np.float32) - 8))


@pytest.mark.parametrize("p", INT4W_VARIANTS[:4] + [QuantParams("q4_0"), QuantParams("q8_0")], ids=str)
def test_streaming_in_row_chunks_equals_whole_tensor(p):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((37, 128)).astype(np.float32)
    s = SCHEMES[p.scheme]
    whole = s.quantize(w, p)
    chunks = np.concatenate(list(s.stream([w[:5], w[5:6], w[6:]], p, 37, "t")))
    assert chunks.tobytes() == whole.tobytes()


@pytest.mark.parametrize("quant,shape,key", [
    ({"scheme": "int4w", "group_size": 48, "symmetric": True, "scale_dtype": "f16", "layout": "planar-v1"}, [4, 96], ""),
    ({"scheme": "int4w", "group_size": 64, "symmetric": True, "scale_dtype": "f16", "layout": "planar-v1"}, [4, 96], ""),
    ({"scheme": "int4w", "group_size": 32, "symmetric": 1, "scale_dtype": "f16", "layout": "planar-v1"}, [4, 64], "symmetric"),
    ({"scheme": "int4w", "group_size": True, "symmetric": True, "scale_dtype": "f16", "layout": "planar-v1"}, [4, 64], "group_size"),
    ({"scheme": "int4w", "group_size": 32, "symmetric": True, "scale_dtype": "bf16", "layout": "planar-v1"}, [4, 64], "scale_dtype"),
    ({"scheme": "int4w", "group_size": 32, "symmetric": True, "scale_dtype": "f16", "layout": "blocked"}, [4, 64], "layout"),
    ({"scheme": "int4w", "group_size": 32, "symmetric": True, "scale_dtype": "f16"}, [4, 64], "layout"),
    ({"scheme": "int4w", "group_size": 32, "symmetric": True, "scale_dtype": "f16", "layout": "planar-v1", "x": 1}, [4, 64], "x"),
    ({"scheme": "q4_0", "block_size": 32}, [4, 48], ""),
    ({"scheme": "q4_0", "block_size": 32}, [64], ""),
    ({"scheme": "q4_0", "block_size": 16}, [4, 64], "block_size"),
])
def test_quant_dict_rules(quant, shape, key):
    with pytest.raises(QuantDictError) as ei:
        SCHEMES[quant["scheme"]].parse_quant(quant, shape)
    assert ei.value.key == key


# ------------------------------------------------- quantizing on worker threads

@pytest.mark.parametrize("scheme,params,weighted", [
    ("int4w", QuantParams("int4w", 64, True, "f16"), False),
    ("int4w", QuantParams("int4w", 32, False, "f32"), False),
    ("q4_0", QuantParams("q4_0"), False),
    ("q4_k", QuantParams("q4_k"), True),
])
def test_threads_give_the_bytes_and_loss_of_one(monkeypatch, scheme, params, weighted):
    """A matrix of many pieces (PIECE_ELEMS) quantized on 4 workers is the
    same payload, piece for piece, and the same predicted loss, to the last
    bit, as on one: pieces come back in row order and losses merge in it."""
    from iekit.formats import quant, workers
    from iekit.formats.quant import QuantError

    rng = np.random.default_rng(7)
    cols = 1024
    w = (rng.standard_normal((3 * quant.PIECE_ELEMS // cols + 5, cols)) * rng.uniform(0.01, 3, (1, cols))).astype(np.float32)
    imp = rng.uniform(0.1, 2.0, cols).astype(np.float32) if weighted else None
    s = SCHEMES[scheme]

    def run(n):
        monkeypatch.setattr(workers, "worker_count", lambda: n)
        err = QuantError()
        chunks = [w[:100], w[100:]]  # chunk edges that are not piece edges
        return [bytes(piece) for piece in s.stream(chunks, params, len(w), "m", imp, err)], err

    one, err1 = run(1)
    four, err4 = run(4)
    assert len(one) > 3 and four == one
    assert (err4.sq_error, err4.sq_norm, err4.weighted) == (err1.sq_error, err1.sq_norm, weighted)
    assert b"".join(one) == bytes(s.quantize(w, params, "m", imp))  # and as one whole-matrix call


def test_ordered_map_keeps_order_raises_in_place_and_nests_inline():
    import threading
    import time

    from iekit.formats.workers import ordered_map

    def slow_first(i):
        time.sleep(0.02 if i % 3 == 0 else 0)
        return i * i, threading.current_thread().name

    out = list(ordered_map(slow_first, range(20), workers=4))
    assert [r for r, _ in out] == [i * i for i in range(20)]
    assert all(name.startswith("iekit-work") for _, name in out)

    def bad(i):
        if i == 5:
            raise IEError("piece 5")
        return i

    got = []
    with pytest.raises(IEError, match="piece 5"):
        for r in ordered_map(bad, range(50), workers=3):
            got.append(r)
    assert got == [0, 1, 2, 3, 4]  # everything before the failing item, nothing after

    def nested(i):  # a map inside a worker runs on that worker
        return [name for name in ordered_map(lambda _: threading.current_thread().name, range(3), workers=4)]

    for names in ordered_map(nested, range(4), workers=2):
        assert len(set(names)) == 1 and names[0].startswith("iekit-work")


def test_ordered_map_runs_blas_on_one_thread_per_worker_while_it_runs():
    """A map's workers each get one BLAS thread (OpenBLAS's pool per worker
    oversubscribed the CPUs); the caller's limit is back after the map, also
    when it ends early, and a one-worker map (inline) leaves BLAS alone."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from iekit.formats.workers import ordered_map

    def blas_threads(_=None):
        return sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})

    with threadpool_limits(2, user_api="blas"):
        if blas_threads() != [2]:
            pytest.skip(f"this numpy's BLAS will not run 2 threads: {threadpool_info()}")
        assert list(ordered_map(blas_threads, range(4), workers=2)) == [[1]] * 4
        assert blas_threads() == [2]
        assert list(ordered_map(blas_threads, range(2), workers=1)) == [[2]] * 2
        it = ordered_map(blas_threads, range(10), workers=2)
        assert next(it) == [1] and blas_threads() == [1]  # the caller's products share the CPUs with the workers
        it.close()
        assert blas_threads() == [2]


@pytest.mark.parametrize("scheme", ["int4w", "q4_0"])
def test_non_finite_value_is_reported_at_its_row_of_the_matrix(scheme):
    """Rows are quantized in pieces and chunks; the error names the row of
    the whole matrix, not of the piece that held it."""
    from iekit.formats import quant

    cols = 1024
    w = np.ones((3 * quant.PIECE_ELEMS // cols, cols), np.float32)
    w[700, 9] = np.nan
    p = QuantParams(scheme, 64) if scheme == "int4w" else QuantParams(scheme)
    chunks = [w[:300], w[300:]]
    with pytest.raises(IEError, match=r"layer\.w: non-finite value nan at \(700, 9\)"):
        list(SCHEMES[scheme].stream(chunks, p, len(w), "layer.w"))
