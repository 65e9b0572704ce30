"""Weighted scale/min searches of llama.cpp's quantizers, vectorised over blocks.

The k-quants (and every scheme given an importance matrix) do not take the
range of a block as its scale: they try a fan of scales, refit scale and
min by weighted least squares for each candidate's codes, and keep the one
with the smallest weighted squared error. These are those searches, over
many blocks at once ([n, k] arrays, one block per row).

They reproduce ggml-quants.c (``make_qkx2_quants``/``make_qkx3_quants``,
``make_qp_quants``, ``make_qx_quants``, ``make_q3_quants``, and the scale search of
``quantize_row_iq4_nl_impl``) *bit for bit* in float32, so that our q4_k bytes equal
llama.cpp's: every sum is accumulated left to right (``seqsum``, as the C
loops do, never numpy's pairwise sum), every product is formed in the C
source's order, and ``nearest_int`` is the same magic-number rounding. That
is why the code below is written out operation by operation; change one and
``tests/test_kquant.py`` (golden bytes from llama.cpp) says so. The two
hottest, the affine search (``qkx``) and the iq4 scale search
(``iq4_scales``), run in C++ (csrc/search) with the same arithmetic.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import _search
from .workers import ordered_map, worker_count

F32 = np.float32


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even by adding 1.5 * 2^23 (exact for
    |v| < 2^22; outside that range it returns what the C code returns)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (np.asarray(v, F32) + F32(12582912.0)).astype(F32).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis, left to right in float32 (the C loops' order)."""
    return np.cumsum(a, axis=-1, dtype=F32)[..., -1]


def _colsum(a: np.ndarray) -> np.ndarray:
    """Sum over axis 0 of [k, n], left to right in float32: one vector add per
    element of the block, so the blocks (columns) go at SIMD speed."""
    acc = a[0].copy()
    for row in a[1:]:
        acc += row
    return acc


CHUNK = 8192  # blocks per pass: numpy's per-call cost fades, and a 576 x 1536 matrix still gives each core work


def over_chunks(n: int, work: Callable[[int, int], None]) -> None:
    """work(a, b) over [0, n) in CHUNK pieces, on up to one thread per core
    (formats/workers.py; inline inside a worker). Each piece writes only its
    own rows."""
    spans = [(a, min(n, a + CHUNK)) for a in range(0, n, CHUNK)]
    for _ in ordered_map(lambda span: work(*span), spans, workers=min(len(spans), worker_count())):
        pass


def qkx(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool = False
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Affine codes for each row of x with weights w: (scale [n], the_min [n] >= 0,
    codes [n, k] uint8) with x ~ scale * code - the_min. ggml's make_qkx2_quants
    (= make_qkx3_quants with weights); ``mad``: its use_mad, the weighted
    absolute error compared instead of the squared one (q2_k). In C++
    (csrc/search/qkx.cpp, the same float32 arithmetic as the C loops): its
    37 fits per block were three quarters of q4_k's quantizer in numpy."""
    x = np.ascontiguousarray(x, F32)
    w = np.ascontiguousarray(w, F32)
    n = x.shape[0]
    scale = np.empty(n, F32)
    the_min = np.empty(n, F32)
    codes = np.empty(x.shape, np.uint8)

    def work(a: int, b: int) -> None:
        scale[a:b], the_min[a:b], codes[a:b] = _search.qkx(x[a:b], w[a:b], nmax, rmin, rdelta, nstep, mad)

    over_chunks(n, work)
    return scale, the_min, codes


def _move_codes(x: np.ndarray, w: np.ndarray, codes: np.ndarray, lo: int | None, hi: int, active: np.ndarray,
                removed_sl2: bool) -> tuple[np.ndarray, np.ndarray]:
    """The passes make_qp_quants and make_q3_quants end with: up to five
    sweeps over the elements, each moving one code to the one its
    neighbours' least-squares scale asks for (clamped to lo..hi; lo None:
    only above) when that raises the fit sumlx² / suml2, the sums updated in
    place as the C loops do. A row's search ends after a sweep without a
    change (the C loop breaks; another sweep would change nothing). The
    two differ in one test: make_qp_quants needs the sums without the
    element positive (removed_sl2), make_q3_quants the sums with the new code.
    Updates ``codes`` [n, k] in place; returns (sumlx, suml2) [n]."""
    n, k = x.shape
    lf = codes.astype(F32)
    sumlx = seqsum(w * x * lf)
    suml2 = seqsum(w * lf * lf)
    for _ in range(5):
        changed = np.zeros(n, bool)
        for i in range(k):
            wi, xi, li = w[:, i], x[:, i], codes[:, i].astype(F32)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = nearest_int(xi * sl2 / slx)
            new = np.minimum(new, hi) if lo is None else np.clip(new, lo, hi)
            nf = new.astype(F32)
            ok = active & (slx > 0) & (new != codes[:, i])
            if removed_sl2:
                ok &= sl2 > 0
            slx = slx + wi * xi * nf
            sl2 = sl2 + wi * nf * nf
            if not removed_sl2:
                ok &= sl2 > 0
            ok &= slx * slx * suml2 > sumlx * sumlx * sl2
            codes[:, i] = np.where(ok, new, codes[:, i])
            sumlx = np.where(ok, slx, sumlx)
            suml2 = np.where(ok, sl2, suml2)
            changed |= ok
        active = active & changed
        if not active.any():
            break
    return sumlx, suml2


def qp(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..nmax for non-negative x (a super-block's sub-scales or mins)
    under weights w, and the scale: ggml's make_qp_quants. Returns (scale [n],
    codes [n, k] uint8)."""
    x = np.asarray(x, F32)
    w = np.asarray(w, F32)
    n = x.shape[0]
    with np.errstate(all="ignore"):
        mx = np.maximum(x.max(axis=1), F32(0))
        zero = mx < F32(1e-15)
        iscale = (F32(nmax) / mx).astype(F32)
        codes = nearest_int(iscale[:, None] * x)
        scale = (F32(1) / iscale).astype(F32)
        diff = x - scale[:, None] * codes.astype(F32)
        best = seqsum(w * diff * diff)
        for s in (-4, -3, -2, -1, 1, 2, 3, 4):
            isc = ((F32(0.1) * F32(s) + F32(nmax)) / mx).astype(F32)
            sc = (F32(1) / isc).astype(F32)
            lf = np.minimum(nearest_int(isc[:, None] * x), nmax).astype(F32)
            diff = x - sc[:, None] * lf
            mse = seqsum(w * diff * diff)
            better = mse < best
            best = np.where(better, mse, best)
            iscale = np.where(better, isc, iscale)
        codes = np.minimum(nearest_int(iscale[:, None] * x), nmax)
        sumlx, suml2 = _move_codes(x, w, codes, None, nmax, np.ones(n, bool), removed_sl2=True)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    scale = np.where(zero, F32(0), scale).astype(F32)
    codes = np.where(zero[:, None], 0, codes)
    return scale, codes.astype(np.uint8)


def qx(x: np.ndarray, w: np.ndarray, nmax: int, with_codes: bool = False):
    """The scale [n] of symmetric codes -nmax..nmax-1 for each row of x under
    weights w (x ~ scale * code): ggml's make_qx_quants with rmse_type 1 and
    weights. With ``with_codes`` also its codes L = code + nmax [n, k] (0 in
    an all-zero row), which q6_k keeps where a sub-scale stores as zero;
    every other caller picks the nearest codes for the scale as stored."""
    scale, iscale = _scale_per_row(_qx_t, x, w, nmax, outs=2)
    if not with_codes:
        return scale
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore"):
        l = np.clip(np.rint(iscale[:, None] * x), F32(-nmax), F32(nmax - 1)) + F32(nmax)
    return scale, np.where(iscale[:, None] != 0, l, F32(0)).astype(np.uint8)


def q3(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_q3_quants with do_rmse (q3_k without an importance
    matrix): codes -nmax..nmax-1 for the scale -nmax / (the element of
    largest magnitude), then up to five passes that move one code at a time
    wherever that raises the x²-weighted fit (sumlx² / suml2), every sum
    updated in place as the C loop does (_move_codes). Returns (scale [n], L =
    code + nmax [n, k] uint8; an all-zero row: scale 0, L 0)."""
    x = np.asarray(x, F32)
    mx, zero = signed_max(x)
    w = x * x
    with np.errstate(all="ignore"):
        iscale = (F32(-nmax) / mx).astype(F32)
        codes = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        sumlx, suml2 = _move_codes(x, w, codes, -nmax, nmax - 1, ~zero, removed_sl2=False)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, codes + nmax).astype(np.uint8)


def _scale_per_row(search_t: Callable, x: np.ndarray, w: np.ndarray, *args, outs: int = 1):
    """search_t (one transposed chunk x, w [k, n] -> scales [n], or ``outs``
    such arrays) over every row of x, w, chunk by chunk on the thread pool."""
    x = np.asarray(x, F32)
    w = np.asarray(w, F32)
    res = [np.empty(x.shape[0], F32) for _ in range(outs)]

    def work(a: int, b: int) -> None:
        got = search_t(np.ascontiguousarray(x[a:b].T), np.ascontiguousarray(w[a:b].T), *args)
        for r, g in zip(res, got if outs > 1 else (got,)):
            r[a:b] = g

    over_chunks(x.shape[0], work)
    return tuple(res) if outs > 1 else res[0]


def signed_max(x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Along ``axis`` of x: the element of largest magnitude, sign kept (the
    first of equals, as the C loops' strict '>'), and whether it is below
    ggml's 1e-15 (GROUP_MAX_EPS: a block that stores as zero)."""
    at = np.expand_dims(np.abs(x).argmax(axis=axis), axis)
    mx = np.take_along_axis(x, at, axis=axis).squeeze(axis)
    return mx, np.abs(mx) < F32(1e-15)


def _qx_t(x, w, nmax):
    """qx on one chunk, transposed: x, w [k, n] -> (scale, the iscale whose
    codes it fitted; 0 in an all-zero column)."""
    with np.errstate(all="ignore"):
        mx, zero = signed_max(x, axis=0)
        wx = w * x
        lf, t = np.empty_like(x), np.empty_like(x)  # reused by every fit: fresh temporaries cost page faults

        def fit(iscale):
            # iscale * x is at most nmax + 1 in magnitude: rint is nearest_int there
            np.clip(np.rint(np.multiply(iscale, x, out=lf), out=lf), F32(-nmax), F32(nmax - 1), out=lf)
            sumlx = _colsum(np.multiply(wx, lf, out=t))
            return sumlx, _colsum(np.multiply(np.multiply(w, lf, out=t), lf, out=t))

        iscale = (F32(-nmax) / mx).astype(F32)
        sumlx, suml2 = fit(iscale)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = (scale * sumlx).astype(F32)
        for s in (-9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9):
            cand = (-(F32(nmax) + F32(0.1) * F32(s)) / mx).astype(F32)
            sumlx, suml2 = fit(cand)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            scale = np.where(better, sumlx / suml2, scale).astype(F32)
            best = np.where(better, scale * sumlx, best).astype(F32)
            iscale = np.where(better, cand, iscale).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero, F32(0), iscale).astype(F32)


def importance_weights(x: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """llama.cpp's per-element weights under an importance matrix:
    qw * sqrt(sigma2 + x^2), sigma2 broadcast over the block's elements."""
    x = np.asarray(x, F32)
    return (np.asarray(qw, F32) * np.sqrt(np.asarray(sigma2, F32)[..., None] + x * x)).astype(F32)


# The non-linear 4-bit grid of iq4_nl / iq4_xs (ggml's kvalues_iq4nl): denser
# near zero, where most weights of a block lie, than a uniform grid.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)


# ggml picks the upper of two neighbours v_k, v_k+1 unless x - v_k < v_k+1 - x in
# float32; near their midpoint both differences are exact (x is at most a few
# times either), so that is x < (v_k + v_k+1) / 2 exactly, and far from it no
# rounding can flip it. The midpoints are half-integers: x >= m iff
# floor(2x) >= 2m, so the code is a table lookup on floor(2x).
_IQ4_LO, _IQ4_HI = -256, 228  # floor(2x) beyond these gives code 0 / 15 (2 x 113 = 226)
_IQ4_LUT = np.searchsorted(IQ4_VALUES[:-1] + IQ4_VALUES[1:], np.arange(_IQ4_LO, _IQ4_HI + 1), side="right").astype(np.uint8)


def _iq4_slot(a: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """floor(2a) - _IQ4_LO clamped to the tables' range, as intp (a NaN gets
    some slot); ``scratch`` (float32, a's shape; may be ``a``) is overwritten."""
    with np.errstate(invalid="ignore", over="ignore"):
        np.multiply(a, F32(2), out=scratch, dtype=F32)
        np.clip(scratch, F32(_IQ4_LO), F32(_IQ4_HI), out=scratch)
        t = np.floor(scratch, out=scratch).astype(np.intp)
    np.clip(t, _IQ4_LO, _IQ4_HI, out=t)  # NaN
    t -= _IQ4_LO
    return t


def iq4_index(a: np.ndarray) -> np.ndarray:
    """The code of the IQ4_VALUES entry nearest to each a (ggml's best_index_int8:
    a tie goes to the upper entry; outside the grid the end one), uint8.
    A NaN (a zero block's 0 * inf) gets some code; its caller discards it."""
    return _IQ4_LUT[_iq4_slot(a, np.empty(np.shape(a), F32))]


def iq4_scales(x: np.ndarray, w: np.ndarray, ntry: int = 7) -> np.ndarray:
    """The scale [n] of each 32-element row of x on the iq4 grid (x ~ scale *
    IQ4_VALUES[code]) under weights w: the scale search of ggml's
    quantize_row_iq4_nl_impl (its first fit, then 2 * ntry + 1 more starts,
    each refit by weighted least squares). The scale may be negative: the grid
    is not symmetric, and mirroring it can fit a block better. In C++
    (csrc/search/iq4_scales.cpp, the same arithmetic and code table)."""
    x = np.ascontiguousarray(x, F32)
    w = np.ascontiguousarray(w, F32)
    out = np.empty(x.shape[0], F32)

    def work(a: int, b: int) -> None:
        out[a:b] = _search.iq4_scales(x[a:b], w[a:b], ntry)

    over_chunks(x.shape[0], work)
    return out
