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
``tests/test_kquant.py`` (golden bytes from llama.cpp) says so. The
searches themselves (``qkx``, ``qx``, ``qp``, ``q3``, ``iq4_scales``) run in
C++ (csrc/search) with the same arithmetic, block by block in parallel.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import numpy as np

from . import _search
from .workers import ordered_map, worker_count

F32 = np.float32
R = TypeVar("R")


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even by adding 1.5 * 2^23 (exact for
    |v| < 2^22; outside that range it returns what the C code returns)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (np.asarray(v, F32) + F32(12582912.0)).astype(F32).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis, left to right in float32 (the C loops' order)."""
    return np.cumsum(a, axis=-1, dtype=F32)[..., -1]


CHUNK = 8192  # blocks per pass: numpy's per-call cost fades, and a 576 x 1536 matrix still gives each core work


def over_chunks(n: int, work: Callable[[int, int], R]) -> list[R]:
    """work(a, b) over [0, n) in CHUNK pieces, on up to one thread per core
    (formats/workers.py; inline inside a worker): what each piece returned,
    in order."""
    spans = [(a, min(n, a + CHUNK)) for a in range(0, n, CHUNK)]
    return list(ordered_map(lambda span: work(*span), spans, workers=min(len(spans), worker_count())))


def per_block(search: Callable, x: np.ndarray, w: np.ndarray | None, *params):
    """One of the C++ searches, search(x[a:b], w[a:b] (where w is given),
    *params), over every block (row) of x in float32, chunk by chunk on the
    thread pool: its outputs (an array, or a tuple of them, one row per
    block) joined in block order."""
    arrays = [np.ascontiguousarray(v, F32) for v in (x, w) if v is not None]
    parts = over_chunks(arrays[0].shape[0], lambda a, b: search(*(v[a:b] for v in arrays), *params))
    if len(parts) <= 1:  # one piece as it came; no blocks: the search's own empty outputs
        return parts[0] if parts else search(*arrays, *params)
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(p) for p in zip(*parts))
    return np.concatenate(parts)


def qkx(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool = False
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Affine codes for each row of x with weights w: (scale [n], the_min [n] >= 0,
    codes [n, k] uint8) with x ~ scale * code - the_min. ggml's make_qkx2_quants
    (= make_qkx3_quants with weights); ``mad``: its use_mad, the weighted
    absolute error compared instead of the squared one (q2_k). In C++
    (csrc/search/qkx.cpp, the same float32 arithmetic as the C loops): its
    37 fits per block were three quarters of q4_k's quantizer in numpy."""
    return per_block(_search.qkx, x, w, nmax, rmin, rdelta, nstep, mad)


def qp(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..nmax for non-negative x (a super-block's sub-scales or mins)
    under weights w, and the scale: ggml's make_qp_quants (nine starting
    scales, then up to five sweeps that move one code at a time where that
    raises the weighted fit; csrc/search/move_codes.h). Returns (scale [n],
    codes [n, k] uint8)."""
    return per_block(_search.qp, x, w, nmax)


def qx(x: np.ndarray, w: np.ndarray, nmax: int, with_codes: bool = False):
    """The scale [n] of symmetric codes -nmax..nmax-1 for each row of x under
    weights w (x ~ scale * code): ggml's make_qx_quants with rmse_type 1 and
    weights. With ``with_codes`` also its codes L = code + nmax [n, k] (0 in
    an all-zero row), which q6_k keeps where a sub-scale stores as zero;
    every other caller picks the nearest codes for the scale as stored."""
    scale, iscale = per_block(_search.qx, x, w, nmax)
    if not with_codes:
        return scale
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore"):
        l = np.clip(np.rint(iscale[:, None] * x), F32(-nmax), F32(nmax - 1)) + F32(nmax)
    return scale, np.where(iscale[:, None] != 0, l, F32(0)).astype(np.uint8)


def q3(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_q3_quants with do_rmse (q3_k without an importance
    matrix): codes -nmax..nmax-1 for the scale -nmax / (the element of
    largest magnitude), then up to five sweeps that move one code at a time
    wherever that raises the x²-weighted fit (sumlx² / suml2;
    csrc/search/move_codes.h). Returns (scale [n], L = code + nmax [n, k]
    uint8; an all-zero row: scale 0, L 0)."""
    return per_block(_search.q3, x, None, nmax)


def signed_max(x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Along ``axis`` of x: the element of largest magnitude, sign kept (the
    first of equals, as the C loops' strict '>'), and whether it is below
    ggml's 1e-15 (GROUP_MAX_EPS: a block that stores as zero)."""
    at = np.expand_dims(np.abs(x).argmax(axis=axis), axis)
    mx = np.take_along_axis(x, at, axis=axis).squeeze(axis)
    return mx, np.abs(mx) < F32(1e-15)


def importance_weights(x: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """llama.cpp's per-element weights under an importance matrix:
    qw * sqrt(sigma2 + x^2), sigma2 broadcast over the block's elements."""
    x = np.asarray(x, F32)
    return (np.asarray(qw, F32) * np.sqrt(np.asarray(sigma2, F32)[..., None] + x * x)).astype(F32)


# The non-linear 4-bit grid of iq4_nl / iq4_xs (ggml's kvalues_iq4nl): denser
# near zero, where most weights of a block lie, than a uniform grid.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)
# iq4_xsh's second grid is the first moved up by this much (csrc's kIq4ShiftStep): about a
# third of the step near zero, so a sub-block whose weights fall between the first grid's
# points has a grid of its own (ik_llama.cpp's IQ4_KS idea).
IQ4_SHIFT = 4


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


def iq4_shifted_scales(x: np.ndarray, w: np.ndarray, ntry: int = 7) -> np.ndarray:
    """iq4_xsh's search: per 32-element row of x under weights w, the scale
    [n] of least weighted squared error on either grid (IQ4_VALUES, or it +
    IQ4_SHIFT), over scales that put the row's largest element near either
    end of either grid, each refit by weighted least squares
    (csrc/search/iq4_scales.cpp). The quantizer picks the grid again for the
    scale as stored."""
    return per_block(_search.iq4_shifted_scales, x, w, ntry)


def iq4_scales(x: np.ndarray, w: np.ndarray, ntry: int = 7) -> np.ndarray:
    """The scale [n] of each 32-element row of x on the iq4 grid (x ~ scale *
    IQ4_VALUES[code]) under weights w: the scale search of ggml's
    quantize_row_iq4_nl_impl (its first fit, then 2 * ntry + 1 more starts,
    each refit by weighted least squares). The scale may be negative: the grid
    is not symmetric, and mirroring it can fit a block better. In C++
    (csrc/search/iq4_scales.cpp, the same arithmetic and code table)."""
    return per_block(_search.iq4_scales, x, w, ntry)
