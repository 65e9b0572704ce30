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


@pytest.mark.parametrize("book", ["IQ3S", "IQ2XXS"])
def test_native_grid_search_is_the_numpy_one(book):
    """csrc/search/grid_nearest.cpp against the same search in numpy: each
    tuple's rounded levels (four of eight odd levels; eight of IQ2's three),
    its 16 neighbours' sum w g (g - 2u), the first smallest; tuples off the
    grid's range (negative, past the top) and zero weights."""
    from iekit.formats import codebooks

    cb = getattr(codebooks, book)
    k = cb.dims
    rng = np.random.default_rng(3)
    u = rng.uniform(-2, 19 if k == 4 else 7, (5000, k)).astype(np.float32)
    w = rng.uniform(0, 2, (5000, k)).astype(np.float32)
    w[::7, 1] = 0
    # Errors that are NaN (2u overflows, times a zero weight; a NaN u) or -inf: the scan's answer.
    u[1, 2], w[1, 2] = 3e38, 0
    u[2, 0] = np.nan
    u[3, 3] = -3e38
    u[4, :2], w[4, 0] = 3e38, 0
    idx, values = cb.neighbours
    with np.errstate(all="ignore"):
        if k == 4:
            levels = np.clip(np.rint((u - 1) * np.float32(0.5)), 0, 7)
            levels = np.where(np.isnan(levels), 0, levels)
        else:  # the edges midway between 1, 3.125 and 5.375 (NaN compares false: level 0)
            levels = (u > np.float32(2.0625)).astype(np.int32) + (u > np.float32(4.25))
        t = levels.astype(np.int32) @ (len(codebooks.LEVELS[k]) ** np.arange(k))
        g = values[t].transpose(0, 2, 1)  # [m, K, k]
        term = g * (g - 2 * u[:, None, :]) * w[:, None, :]
    err = term[..., 0]
    for j in range(1, k):
        err = err + term[..., j]
    best = np.zeros(len(u), np.int64)  # the first smaller one, left to right: NaN never replaces nor is replaced
    for c in range(1, err.shape[1]):
        best = np.where(err[:, c] < err[np.arange(len(u)), best], c, best)
    assert np.isnan(err[1:5]).any(axis=1)[[0, 1, 3]].all() and np.isinf(err[3]).all()
    assert np.array_equal(cb.nearest(u, w), idx[t, best])


def _grid_scales(book, a, w):
    """formats/codebooks.py's scales() as it was in numpy before
    csrc/search/grid_nearest.cpp took it over: every row at once, each
    operation a float32 array operation, the sums numpy's."""
    amax = a.max(axis=1, keepdims=True)
    unit = a / np.where(amax > 0, amax, 1)
    best, gain, place = (np.zeros(len(a), np.float32) for _ in range(3))
    k = book.dims

    def fit(at):
        nonlocal best, gain, place
        q = book.grid[book.nearest((unit * at[:, None]).reshape(-1, k), w.reshape(-1, k))].reshape(a.shape)
        wq = w * q
        sumqx, sumq2 = (wq * a).sum(axis=1), (wq * q).sum(axis=1)
        scale = (sumqx / np.where(sumq2 > 0, sumq2, np.inf)).astype(np.float32)
        better = scale * sumqx > gain
        best, gain, place = (np.where(better, v, old) for v, old in ((scale, best), (scale * sumqx, gain), (at, place)))

    for start in book.starts:
        fit(np.full(len(a), start, np.float32))
    for move in book.moves:
        around = place.copy()
        for d in (-move, move):
            fit(around + np.float32(d))
    return best


@pytest.mark.parametrize("book, n", [("IQ3S", 32), ("IQ2XXS", 32), ("IQ2S", 16)])
def test_native_grid_scales_are_the_numpy_ones(book, n):
    """csrc/search/grid_nearest.cpp's scale search against the numpy it
    replaced, bit for bit, for both tuple shapes and both row lengths
    (iq2_xs's and iq2_s's sub-blocks are 16 long): magnitudes over six
    decades, rows of zeros, of one weight, subnormal, with zero, infinite or
    NaN weights, a NaN magnitude."""
    from iekit.formats import codebooks

    cb = getattr(codebooks, book)
    rng = np.random.default_rng(5)
    a = np.abs(rng.standard_normal((6001, n)) * np.exp(rng.uniform(-7, 7, (6001, 1)))).astype(np.float32)
    w = rng.uniform(0, 3, a.shape).astype(np.float32)
    a[1] = 0
    a[2, 1:] = 0
    a[3] = np.float32(1e-41) * (1 + np.arange(n) % 3)
    w[4] = 0
    w[5, ::2] = 0
    w[6] = np.float32(1e-30)
    w[7, 3], w[8, :], a[9, 5], w[10, 0] = np.inf, np.inf, np.nan, np.nan  # an overflowed importance, a NaN
    got = cb.scales(a, w)
    with np.errstate(all="ignore"):
        want = _grid_scales(cb, a, w)
    assert got.tobytes() == want.tobytes(), np.flatnonzero(got != want)[:10]
    assert got[1] == 0 and got[4] == 0 and got[8] == 0 and (got[11:] > 0).all()


@pytest.mark.parametrize("args, needle", [
    (((5, 32), (5, 31), (4096, 4, 16), (2,), (2,)), "one shape"),
    (((5, 16), (5, 16), (4096, 4, 16), (2,), (2,)), "k must be 32 \\(or 16 for tuples of 8\\), got 16"),
    (((5, 24), (5, 24), (6561, 8, 16), (2,), (2,)), "k must be 32 .*got 24"),
    (((5, 32), (5, 32), (4096, 16, 4), (2,), (2,)), "cand_val"),
    (((5, 32), (5, 32), (4096, 4, 12), (2,), (2,)), "cand_val"),
    (((5, 32), (5, 32), (4096, 4, 16), (0,), (2,)), "starts"),
])
def test_native_grid_scales_check_their_arguments(args, needle):
    from iekit.formats import _search

    with pytest.raises(ValueError, match=needle):
        _search.grid_scales(*(np.ones(s, np.float32) for s in args))


@pytest.mark.parametrize("shapes, needle", [
    (((5, 4), (5, 3), (4096, 16), (4096, 4, 16)), "u and w"),
    (((5, 4), (5, 4), (4095, 16), (4096, 4, 16)), "cand_idx"),
    (((5, 4), (5, 4), (4096, 8), (4096, 4, 16)), "cand_idx"),
    (((5, 4), (5, 4), (4096, 16), (4096, 16, 4)), "cand_val"),
    (((5, 8), (5, 8), (6561, 16), (4096, 4, 16)), "u and w"),  # the table is for four
    (((5, 8), (5, 8), (4096, 16), (6561, 8, 16)), "cand_idx"),
    (((5, 8), (5, 8), (6561, 16), (4096, 8, 16)), "cand_val"),
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

    with pytest.raises(ValueError, match="k must be 32, got 16"):
        _search.iq4_scales(np.ones((3, 16), np.float32), np.ones((3, 16), np.float32))
    with pytest.raises(ValueError, match="ntry"):
        _search.iq4_scales(np.ones((3, 32), np.float32), np.ones((3, 32), np.float32), -1)


def _nearest(v):
    return int(qs.nearest_int(np.float32(v)))


def _signed_max(x):
    """The C loops' max of magnitude, sign kept: the first of equals."""
    amax = mx = np.float32(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    return amax, mx


def _make_qx_quants(x, w, nmax):
    """ggml-quants.c's make_qx_quants with rmse_type 1 and weights, in float32
    scalars: (scale, iscale whose codes it fitted)."""
    f = np.float32
    amax, mx = _signed_max(x)
    if amax < f(1e-15):
        return f(0), f(0)

    def fit(iscale):
        sumlx = suml2 = f(0)
        for i in range(len(x)):
            l = f(max(-nmax, min(nmax - 1, _nearest(iscale * x[i]))))
            sumlx, suml2 = sumlx + w[i] * x[i] * l, suml2 + w[i] * l * l
        return sumlx, suml2

    iscale = f(-nmax) / mx
    sumlx, suml2 = fit(iscale)
    scale = sumlx / suml2 if suml2 else f(0)
    best = scale * sumlx
    for s in range(-9, 10):
        if s == 0:
            continue
        cand = -(f(nmax) + f(0.1) * f(s)) / mx
        sumlx, suml2 = fit(cand)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            scale, iscale = sumlx / suml2, cand
            best = scale * sumlx
    return scale, iscale


def _sweeps(x, w, L, lo, hi, sumlx, suml2, removed_sl2):
    """The five sweeps make_q3_quants (removed_sl2 False) and make_qp_quants
    end with, moving codes L in place; returns the sums."""
    f = np.float32
    for _ in range(5):
        changed = 0
        for i in range(len(x)):
            slx = sumlx - w[i] * x[i] * f(L[i])
            sl2 = suml2 - w[i] * f(L[i]) * f(L[i])
            if not slx > 0 or (removed_sl2 and not sl2 > 0):
                continue
            new = min(hi, _nearest(x[i] * sl2 / slx))
            new = new if lo is None else max(lo, new)
            if new == L[i]:
                continue
            slx, sl2 = slx + w[i] * x[i] * f(new), sl2 + w[i] * f(new) * f(new)
            if (removed_sl2 or sl2 > 0) and slx * slx * suml2 > sumlx * sumlx * sl2:
                L[i], sumlx, suml2 = new, slx, sl2
                changed += 1
        if not changed:
            break
    return sumlx, suml2


def _make_q3_quants(x, nmax):
    """make_q3_quants with do_rmse in float32 scalars: (scale, codes + nmax)."""
    f = np.float32
    amax, mx = _signed_max(x)
    if amax < f(1e-15):
        return f(0), np.zeros(len(x), np.uint8)
    iscale = f(-nmax) / mx
    w = x * x
    L = [max(-nmax, min(nmax - 1, _nearest(iscale * v))) for v in x]
    sumlx = suml2 = f(0)
    for i in range(len(x)):
        sumlx, suml2 = sumlx + w[i] * x[i] * f(L[i]), suml2 + w[i] * f(L[i]) * f(L[i])
    sumlx, suml2 = _sweeps(x, w, L, -nmax, nmax - 1, sumlx, suml2, False)
    return sumlx / suml2, np.array(L, np.int32).astype(np.uint8) + np.uint8(nmax)


def _make_qp_quants(x, w, nmax):
    """make_qp_quants in float32 scalars: (scale, codes)."""
    f = np.float32
    mx = max(f(0), max(x))
    if mx < f(1e-15):
        return f(0), np.zeros(len(x), np.uint8)

    def mse(iscale, clamp):
        sc, e = f(1) / iscale, f(0)
        for i in range(len(x)):
            l = _nearest(iscale * x[i])
            diff = x[i] - sc * f(min(nmax, l) if clamp else l)
            e = e + w[i] * diff * diff
        return e

    iscale = f(nmax) / mx
    best = mse(iscale, False)
    for s in range(-4, 5):
        if s == 0:
            continue
        cand = (f(0.1) * f(s) + f(nmax)) / mx
        e = mse(cand, True)
        if e < best:
            best, iscale = e, cand
    L = [min(nmax, _nearest(iscale * v)) for v in x]
    sumlx = suml2 = f(0)
    for i in range(len(x)):
        sumlx, suml2 = sumlx + w[i] * x[i] * f(L[i]), suml2 + w[i] * f(L[i]) * f(L[i])
    sumlx, suml2 = _sweeps(x, w, L, None, nmax, sumlx, suml2, True)
    return (sumlx / suml2 if suml2 > 0 else f(0)), np.array(L, np.uint8)


def _hostile_blocks(rng, n, k):
    """Mixed, one-signed, tiny (under 1e-15), subnormal, tied-magnitude,
    integer-valued (codes on a tie of nearest_int) and all-zero blocks, n not
    a multiple of the four lanes; and weights for them, every other one of
    block 8's zero."""
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[1] = np.abs(x[1])
    x[2] = -np.abs(x[2]) * 1e3
    x[3] = np.float32(1e-16)
    x[4] = np.float32(1e-39) * np.sign(x[4])
    x[5, 3], x[5, 9 % k] = 4.0, -4.0
    x[6] = np.round(x[6] * 8) / 2
    x[7] = 0
    w = rng.uniform(0, 2, x.shape).astype(np.float32)
    w[8, ::2] = 0
    return x, w


@pytest.mark.parametrize("nmax, k", [(32, 16), (4, 16), (8, 32), (16, 16)])
def test_native_symmetric_search_is_the_c_loop(nmax, k):
    """csrc/search/qx.cpp against make_qx_quants in float32 scalars, scale and
    the inverse scale whose codes it fitted, bit for bit."""
    x, w = _hostile_blocks(np.random.default_rng(nmax + k), 13, k)
    from iekit.formats import _search

    scale, iscale = _search.qx(x, w, nmax)
    for b in range(len(x)):
        with np.errstate(all="ignore"):
            s, i = _make_qx_quants(x[b], w[b], nmax)
        assert (scale[b].tobytes(), iscale[b].tobytes()) == (np.float32(s).tobytes(), np.float32(i).tobytes()), b


def _assert_blocks_equal(scale, codes, want):
    """(scale, codes) of each block bit for bit those of want(b)."""
    for b in range(len(scale)):
        with np.errstate(all="ignore"):
            s, l = want(b)
        assert scale[b].tobytes() == np.float32(s).tobytes(), b
        assert np.array_equal(codes[b], l), b


@pytest.mark.parametrize("nmax", [4, 2])
def test_native_q3_search_is_the_c_loop(nmax):
    """csrc/search/move_codes.cpp's make_q3_quants against the C loop in float32
    scalars (the sweeps included), on 16-element blocks as q3_k has."""
    x, _w = _hostile_blocks(np.random.default_rng(nmax), 13, 16)
    _assert_blocks_equal(*qs.q3(x, nmax), lambda b: _make_q3_quants(x[b], nmax))


@pytest.mark.parametrize("nmax, k", [(63, 8), (15, 16)])
def test_native_qp_search_is_the_c_loop(nmax, k):
    """make_qp_quants (q4_k's and q2_k's super-block scales and mins under an
    importance matrix) against the C loop in float32 scalars."""
    x, w = _hostile_blocks(np.random.default_rng(nmax), 13, k)
    x = np.abs(x)
    _assert_blocks_equal(*qs.qp(x, w, nmax), lambda b: _make_qp_quants(x[b], w[b], nmax))


@pytest.mark.parametrize("call, needle", [
    (lambda s: s.qx(np.ones((2, 8), np.float32), np.ones((2, 7), np.float32), 4), "one shape"),
    (lambda s: s.qx(np.ones((2, 8), np.float32), np.ones((2, 8), np.float32), 0), "nmax"),
    (lambda s: s.q3(np.ones(8, np.float32), 4), r"\[blocks, k\]"),
    (lambda s: s.q3(np.ones((2, 8), np.float32), 128), "nmax"),
    (lambda s: s.qp(np.ones((2, 8), np.float32), np.ones((3, 8), np.float32), 15), "one shape"),
    (lambda s: s.qp(np.ones((2, 0), np.float32), np.ones((2, 0), np.float32), 15), "k must be"),
])
def test_native_code_searches_check_their_arguments(call, needle):
    from iekit.formats import _search

    with pytest.raises(ValueError, match=needle):
        call(_search)
