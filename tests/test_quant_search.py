"""The quantizers' searches in C++ (csrc/search, iekit.formats._search)
against the C loops of ggml-quants.c transcribed in float32 scalars; in the
sanitizer run (Makefile SAN_PYTESTS). tests/test_kquant.py holds them to
libggml's own bytes through the schemes."""

from __future__ import annotations

import numpy as np
import pytest

from iekit.formats import quant_search as qs


def _make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, mad):
    """ggml-quants.c's make_qkx2_quants for one block, transcribed line by line
    in numpy float32 scalars (each operation rounded as the C code's)."""
    f = np.float32
    k = len(x)
    mn, mx, sum_w, sum_x = x[0], x[0], w[0], w[0] * x[0]
    for i in range(1, k):
        mn, mx = (x[i] if x[i] < mn else mn), (x[i] if x[i] > mx else mx)
        sum_w, sum_x = sum_w + w[i], sum_x + w[i] * x[i]
    if mn > 0:
        mn = f(0)
    if mx == mn:
        return f(0), -mn, np.zeros(k, np.uint8)

    def codes(iscale, m):
        return np.array([min(max(int(qs.nearest_int(iscale * (x[i] - m))), 0), nmax) for i in range(k)], np.uint8)

    def err(sc, m, l):
        e = None
        for i in range(k):
            d = sc * f(l[i]) + m - x[i]
            t = w[i] * (abs(d) if mad else d * d)
            e = t if e is None else e + t
        return e

    iscale = f(nmax) / (mx - mn)
    scale = f(1) / iscale
    best_l = codes(iscale, mn)
    best = err(scale, mn, best_l)
    for step in range(nstep + 1):
        iscale = (f(rmin) + f(rdelta) * f(step) + f(nmax)) / (mx - mn)
        l = codes(iscale, mn)
        sl = sl2 = sxl = None
        for i in range(k):
            wl = w[i] * f(l[i])
            sl, sl2, sxl = ((wl, wl * f(l[i]), wl * x[i]) if i == 0 else
                            (sl + wl, sl2 + wl * f(l[i]), sxl + wl * x[i]))
        d = sum_w * sl2 - sl * sl
        if d > 0:
            this_scale, this_min = (sum_w * sxl - sum_x * sl) / d, (sl2 * sum_x - sl * sxl) / d
            if this_min > 0:
                this_scale, this_min = sxl / sl2, f(0)
            cur = err(this_scale, this_min, l)
            if cur < best:
                best, best_l, scale, mn = cur, l, this_scale, this_min
    return scale, -mn, best_l


@pytest.mark.parametrize("nmax, search, mad", [(15, (-1.0, 0.1, 20), False), (15, (-0.9, 0.05, 36), False),
                                               (3, (-0.5, 0.1, 15), True), (31, (-0.5, 0.1, 15), False)])
def test_native_affine_search_is_the_c_loop(nmax, search, mad):
    """csrc/search/qkx.cpp (four blocks per vector) against the C loop transcribed
    in float32 scalars: blocks all positive, all negative, flat, with zero weights,
    subnormal, and a short last group of lanes."""
    rng = np.random.default_rng(nmax)
    x = rng.standard_normal((11, 16)).astype(np.float32)
    x[1] = np.abs(x[1]) + 0.5
    x[2] = -np.abs(x[2]) - 0.5
    x[3] = 1.25
    x[4] = np.float32(1e-40) * np.sign(x[4])
    x[5, :5] = 0
    w = (np.abs(x) if mad else rng.uniform(0, 2, x.shape)).astype(np.float32)
    w[6, ::3] = 0
    scale, the_min, codes = qs.qkx(x, w, nmax, *search, mad=mad)
    for b in range(len(x)):
        with np.errstate(all="ignore"):  # the subnormal block's scales overflow, as in C
            s, m, l = _make_qkx2_quants(x[b], w[b], nmax, *search, mad)
        assert (scale[b].tobytes(), the_min[b].tobytes()) == (np.float32(s).tobytes(), np.float32(m).tobytes()), b
        assert np.array_equal(codes[b], l), b


@pytest.mark.parametrize("args, needle", [
    ((np.ones((2, 8), np.float32), np.ones((2, 7), np.float32), 15), "one shape"),
    ((np.ones(8, np.float32), np.ones(8, np.float32), 15), "one shape"),
    ((np.ones((2, 8), np.float32), np.ones((2, 8), np.float32), 0), "nmax"),
    ((np.ones((2, 8), np.float32), np.ones((2, 8), np.float32), 256), "nmax"),
])
def test_native_affine_search_checks_its_arguments(args, needle):
    from iekit.formats import _search

    with pytest.raises(ValueError, match=needle):
        _search.qkx(*args, -0.5, 0.1, 15)
    with pytest.raises(ValueError, match="nstep"):
        _search.qkx(np.ones((2, 8), np.float32), np.ones((2, 8), np.float32), 15, -0.5, 0.1, -1)


def test_native_grid_search_is_the_numpy_one():
    """csrc/search/grid_nearest.cpp against the same search in numpy: each
    tuple's rounded levels, its 16 neighbours' sum w g (g - 2u), the first
    smallest; tuples off the grid's range (negative, past 15) and zero weights."""
    from iekit.formats import iq3s_grid

    rng = np.random.default_rng(3)
    u = rng.uniform(-2, 19, (5000, 4)).astype(np.float32)
    w = rng.uniform(0, 2, (5000, 4)).astype(np.float32)
    w[::7, 1] = 0
    idx, values = iq3s_grid._neighbours()
    levels = np.clip(np.rint((u - 1) * np.float32(0.5)), 0, 7).astype(np.int32)
    t = levels @ np.array([1, 8, 64, 512])
    g = values[t].transpose(0, 2, 1)  # [m, K, 4]
    err = (g * (g - 2 * u[:, None, :]) * w[:, None, :]).sum(-1)
    want = idx[t, err.argmin(axis=1)]
    assert np.array_equal(iq3s_grid.nearest(u, w), want)


@pytest.mark.parametrize("shapes, needle", [
    (((5, 4), (5, 3), (4096, 16), (4096, 4, 16)), "u and w"),
    (((5, 4), (5, 4), (4095, 16), (4096, 4, 16)), "cand_idx"),
    (((5, 4), (5, 4), (4096, 16), (4096, 16, 4)), "cand_val"),
])
def test_native_grid_search_checks_its_arguments(shapes, needle):
    from iekit.formats import _search

    u, w, idx, val = (np.zeros(s, np.int16 if i == 2 else np.float32) for i, s in enumerate(shapes))
    with pytest.raises(ValueError, match=needle):
        _search.grid_nearest(u, w, idx, val)


def _iq4_nl_scale(x, w, ntry):
    """The scale search of ggml-quants.c's quantize_row_iq4_nl_impl for one
    32-element block, transcribed in numpy float32 scalars, best_index_int8 included."""
    f, values = np.float32, qs.IQ4_VALUES

    def best_index(a):
        if a <= values[0]:
            return 0
        if a >= values[15]:
            return 15
        lo, hi = 0, 15
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if a < values[mid] else (mid, hi)
        return hi - 1 if a - values[hi - 1] < values[hi] - a else hi

    def fit(iscale):
        sqx = sq2 = f(0)
        for j in range(32):
            q = values[best_index(iscale * x[j])]
            sqx, sq2 = sqx + w[j] * q * x[j], sq2 + w[j] * q * q
        return sqx, sq2

    amax, mx = f(0), f(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < f(1e-15):
        return f(0)
    d = -mx / values[0]
    sqx, sq2 = fit(f(1) / d)
    d = sqx / sq2 if sq2 > 0 else f(0)
    best = d * sqx
    for itry in range(-ntry, ntry + 1):
        sqx, sq2 = fit((f(itry) + values[0]) / mx)
        if sq2 > 0 and sqx * sqx > best * sq2:
            d = sqx / sq2
            best = d * sqx
    return d


def test_native_iq4_scale_search_is_the_c_loop():
    """csrc/search/iq4_scales.cpp against ggml's loop in float32 scalars: mixed,
    one-signed, tiny (under 1e-15: scale 0), subnormal blocks, ties of the
    largest magnitude, zero weights, and a short last group of lanes."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((13, 32)).astype(np.float32)
    x[1] = np.abs(x[1])
    x[2] = -np.abs(x[2]) * 1e3
    x[3] = np.float32(1e-16)
    x[4] = np.float32(1e-39) * np.sign(x[4])
    x[5, 3], x[5, 9] = 4.0, -4.0  # a tie of magnitudes: the first
    x[6] = np.round(x[6] * 8)
    w = rng.uniform(0, 2, x.shape).astype(np.float32)
    w[7, ::2] = 0
    got = qs.iq4_scales(x, w)
    with np.errstate(all="ignore"):
        want = np.array([_iq4_nl_scale(x[b], w[b], 7) for b in range(len(x))], np.float32)
    assert got.tobytes() == want.tobytes()


def test_native_iq4_scale_search_checks_its_arguments():
    from iekit.formats import _search

    with pytest.raises(ValueError, match=r"\[n, 32\]"):
        _search.iq4_scales(np.ones((3, 16), np.float32), np.ones((3, 16), np.float32))
    with pytest.raises(ValueError, match="ntry"):
        _search.iq4_scales(np.ones((3, 32), np.float32), np.ones((3, 32), np.float32), -1)
