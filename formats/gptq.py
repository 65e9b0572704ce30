"""Error-compensating quantization: GPTQ's idea, one scale block at a time.

Rounding each weight to its nearest grid point ignores that a matrix's
inputs are correlated: the error of one column can be largely cancelled by
nudging the columns not yet quantized. With H = E[x xᵀ] of the matrix's
input (runtime/hessians.py), quantizing the columns of block B (one scale
block of the scheme: 32 for q4_0/q5_0/iq4_nl, 256 for the k-quants, the
group for int4w) as they stand and then moving the remaining columns R by

    W_R -= (W_B − Q_B) U_BB⁻¹ U_BR,   U upper triangular, UᵀU = H⁻¹,

is the optimal (least E[((W − Q) x)²]) update of R given the block's error
(the optimal brain surgeon step, taken for a set of columns; the Cholesky
factor of H⁻¹ gives it for every remaining set at once, as in GPTQ). The
scheme's own quantizer picks each block's scales and codes (importance: H's
diagonal, the imatrix statistic), so the bytes are the scheme's, blocks
quantized one after another; only the values they were fitted to moved.

Inside a scale block wider than STEP columns (the k-quants' and iq4_xs's
256-element super-blocks, int4w's wider groups) the step is STEP columns:
the whole block is quantized, its next STEP columns' error is spread over
the columns after them (in the block and beyond), and those columns are
set to the values they were quantized to, so that quantizing the block
again for the next step keeps them where they are (its scales barely
move). The last step's quantization is the block's bytes. With one step
per super-block, as before, 256 columns were rounded with no feedback
among them: on the widened SmolLM2 this leaves 2–3x the output error for
q/k/v/gate/up at q2_k..q4_k and iq4_xs (docs/quality.md).
The columns after a block move by every block's error; applied block by
block, that is a rank-32 update of the rest of the matrix per scale block,
one pass over memory each. They are applied LAZY columns at a time instead
(GPTQ's lazy batch): the blocks of a group update only the group's own
columns, and the rest take the whole group's errors in one product, which
runs at the GEMM's speed. The arithmetic is the same, in another order.
Where columns never see an input (H's diagonal 0) they get the others'
mean variance, and H is damped by a fraction of its mean diagonal so the
inverse exists (damped).

Then the scales. Each block's scales were picked by the scheme's quantizer
from the values its columns had when it was quantized, before the blocks
after it moved. With every code final, a row's dequantized values are
linear in its scale fields (each block's d, and its min or dmin where the
type has one; int4w's group scales and mins), so the fields that minimize
(w − ŵ) H (w − ŵ)ᵀ with the codes held are one small least-squares problem
per row (refit_scales): blocks × fields unknowns, coupled through H. The
bytes stay the type's; only scale fields change. mxfp4's power-of-two
scales are left as they are.

On the rotated SmolLM2 at 4.5 bits per weight this takes the KL against
the float model from 0.19 to 0.08, and the refit from 0.081 to 0.074
(docs/quality.md).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .errors import IEError
from .quant import QuantError, QuantizedRows, QuantParams, Scheme

DAMP = 0.01  # added to H's diagonal, times its mean
FACTOR_BLOCK = 512  # columns per block of inverse_factor's in-place factorizations
STEP = 32  # columns per step inside a wider block (16: 5-13% less error, q4_k 20% more, 1.5x the time)
# Columns per lazy group: the columns after a group take its blocks' errors in one product of this
# rank, not one per block. A rank-32 update of float64 columns is memory-bound (one pass over the
# rest of the matrix per scale block); at rank 512 it runs at the GEMM's speed.
LAZY = 512
CHUNK_ELEMS = 1 << 23  # the most elements chunk_rows gives one call
REFIT_BYTES = 64 << 20  # refit_scales: rows at a time so that their systems (or one block's products) fit this
RIDGE = 1e-9  # refit_scales: times the mean diagonal, pulling each system toward the scales as quantized
# Whether quantize refits the scales by default: ieconv gptq's default, and what the policy's measurements
# (q4-manifest --target-bpw --ref-dir, which measure as quantize does) record as their refit_scales input.
REFIT_SCALES = True


def chunk_rows(rows: int, cols: int, workers: int) -> int:
    """Rows to compensate at a time. Every call reads all of ``u`` (cols² × 8
    bytes: 1.6 GB for a 14336-wide down_proj input) once per lazy group, so
    a chunk must have enough rows to amortize it: the converters' 1M-element
    chunks (73 rows of that down_proj) read it 56 times over, and took 2.4x
    the time of 585-row chunks (docs/quality.md). Up to CHUNK_ELEMS
    elements (the chunk's float64 copy: 64 MB), but at least two chunks a
    worker where the matrix has the rows, so every worker has work."""
    cap = max(1, CHUNK_ELEMS // max(cols, 1))
    return max(1, min(cap, -(-rows // (2 * workers))))


def importance(h: np.ndarray) -> np.ndarray:
    """H's diagonal (the imatrix statistic), a column that never saw an input
    (0) taking the mean of the others: its weights still matter for other
    text, so its importance is not 0. Only the diagonal is read: the whole
    of H is checked where the factor is made from it (damped), once per
    matrix input, not once per chunk of rows (1.6 GB at an 8B down_proj)."""
    diag = np.array(np.diagonal(h), dtype=np.float64)
    if not np.isfinite(diag).all() or (diag < 0).any():
        raise IEError("input covariance: non-finite values or a negative variance")
    live = diag > 0
    return np.where(live, diag, diag[live].mean() if live.any() else 1.0)


def damped(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """H as the update uses it: the importance on the diagonal, then damp ×
    its mean added there, so H⁻¹ exists."""
    imp = importance(h)
    h = np.array(h, dtype=np.float64)
    if not np.isfinite(h).all():
        raise IEError("input covariance: non-finite values or a negative variance")
    h[np.diag_indices(len(h))] = imp + damp * float(imp.mean())
    return h


def inverse_factor(h: np.ndarray, block: int = FACTOR_BLOCK) -> np.ndarray:
    """U, upper triangular, with UᵀU = damped(H)⁻¹.

    Taken without forming H⁻¹: H = V Vᵀ with V upper triangular (a Cholesky
    factorization run from the last column back), then U = V⁻¹, both in
    place in one array, ``block`` columns at a time. So the memory is H and
    one more matrix, and the work a third of inv + cholesky's: those held
    five n × n arrays at once, 8 GB beside the 1.6 GB covariance of a
    14336-wide down_proj input at Llama-3-8B's shapes (docs/quality.md).
    UᵀU = V⁻ᵀV⁻¹ = (V Vᵀ)⁻¹, and U is the one upper factor with a positive
    diagonal, so it is cholesky(H⁻¹)ᵀ up to rounding (tests/test_gptq.py)."""
    a = damped(h)
    n = len(a)
    blocks = [slice(i, min(i + block, n)) for i in range(0, n, block)]
    try:
        for k in reversed(range(len(blocks))):  # V, from the last block back, over a's upper part
            kb = blocks[k]
            c = a[kb, kb]
            v = np.linalg.cholesky(c[::-1, ::-1])[::-1, ::-1]  # upper, c = v vᵀ
            a[kb, kb] = v
            if kb.start:
                p = a[:kb.start, kb] = a[:kb.start, kb] @ np.linalg.inv(v).T  # V's rows above: B v⁻ᵀ
                for jb in blocks[:k]:  # what is left above: A − P Pᵀ, its upper part by column blocks
                    a[:jb.stop, jb] -= p[:jb.stop] @ p[jb].T
    except np.linalg.LinAlgError:
        raise IEError("input covariance: not positive definite even with damping") from None
    for kb in blocks:
        a[kb.stop:, kb] = 0.0  # below the diagonal blocks: what V has there
    for i in reversed(range(len(blocks))):  # U = V⁻¹, from the last block row up
        ib = blocks[i]
        d = np.linalg.inv(a[ib, ib])
        if ib.stop < n:  # U's row block i right of its diagonal: −d V[i, rest] U[rest, rest]
            t = np.empty((ib.stop - ib.start, n - ib.stop))
            for jb in blocks[i + 1:]:  # U[rest, rest] is upper triangular: column block j ends at row j
                t[:, jb.start - ib.stop:jb.stop - ib.stop] = a[ib, ib.stop:jb.stop] @ a[ib.stop:jb.stop, jb]
            a[ib, ib.stop:] = -(d @ t)
        a[ib, ib] = d
    return a


def quantize(w: np.ndarray, h: np.ndarray, scheme: Scheme, p: QuantParams, name: str = "tensor",
             u: np.ndarray | None = None, step: int = STEP, refit: bool = REFIT_SCALES) -> tuple[QuantizedRows, QuantError]:
    """Rows ``w`` [rows, cols] under input covariance ``h`` [cols, cols]:
    the quantized rows (scheme's layout) and their predicted loss under
    ``h`` (QuantError.add_covariance, against ``w`` as given). ``u``: the
    inverse_factor of ``h``, when the caller shares it (q/k/v read one input).
    ``step``: columns per compensation step in a wider block; ``refit``:
    the scales refitted to the final codes (refit_scales; module docstring)."""
    rows, cols = w.shape
    if h.shape != (cols, cols):
        raise IEError(f"{name}: input covariance is {list(h.shape)}, the matrix has {cols} columns")
    u = inverse_factor(h) if u is None else u  # the caller's was made from h: checked there
    imp = importance(h).astype(np.float32)
    bw = scheme.block_width(cols, p)
    step = bw if bw % step else step
    cur = np.array(w, dtype=np.float64)
    lazy = max(bw, LAZY // bw * bw)
    errs = np.empty((rows, lazy))
    parts = []
    for g0 in range(0, cols, lazy):
        gend = min(g0 + lazy, cols)
        for c0 in range(g0, gend, bw):
            blk, end = slice(c0, c0 + bw), c0 + bw
            for s0 in range(c0, end, step):
                qr = scheme.quantize_rows(cur[:, blk].astype(np.float32), p, name, imp[blk])
                if s0 + step == cols:
                    break
                b = slice(s0, s0 + step)
                got = scheme.dequantize_rows(qr, bw, p)[:, s0 - c0:s0 - c0 + step]
                delta = cur[:, b] - got
                err = errs[:, s0 - g0:s0 - g0 + step] = np.linalg.solve(u[b, b].T, delta.T).T  # delta @ inv(U_BB)
                cur[:, s0 + step:end] -= err @ u[b, s0 + step:end]
                cur[:, b] = got  # stays put when the block is quantized again
            if end < gend:  # the group's columns after the block: every step's share at once
                cur[:, end:gend] -= errs[:, c0 - g0:end - g0] @ u[blk, end:gend]
            parts.append(qr)
        if gend < cols:  # the columns after the group: the whole group's share in one product (GPTQ's lazy batch)
            cur[:, gend:] -= errs[:, :gend - g0] @ u[g0:gend, gend:]
    out = QuantizedRows.hstack(parts)
    if refit:
        out = refit_scales(w, h, out, scheme, p)
    e = QuantError(compensated=True)
    e.add_covariance(w, scheme.dequantize_rows(out, cols, p), h)
    return out, e


class _Field(NamedTuple):
    """One scale field of a quantized matrix: ``get()`` its values [rows,
    blocks] as float64, ``stored(v)`` what storing v keeps of it (rounded to
    the field's type), ``put(q, v)`` q with the field set to v."""

    get: Callable[[], np.ndarray]
    stored: Callable[[np.ndarray], np.ndarray]
    put: Callable[[QuantizedRows, np.ndarray], QuantizedRows]


def _as(dtype) -> Callable[[np.ndarray], np.ndarray]:
    """Values as a field of ``dtype`` holds them (f16: clipped to its range, not inf)."""
    if np.dtype(dtype) == np.float16:
        return lambda v: np.clip(v, -65504, 65504).astype(np.float16)
    return lambda v: np.asarray(v).astype(dtype)


def _fields(scheme: Scheme, qr: QuantizedRows, cols: int, p: QuantParams) -> tuple[int, list[_Field]]:
    """The scale fields dequantization is linear in, and the columns each
    covers. Block types: their F16_FIELDS (a k-quant's d and dmin cover its
    256-element super-block); int4w: its scale and min planes. A type with
    none (mxfp4's E8M0 exponents) has no fields."""
    rows = qr.rows.shape[0]
    if qr.scales is not None:  # int4w: the scale (and min) planes
        def plane(name: str) -> _Field:
            cast = _as(getattr(qr, name).dtype)

            def put(q, v):
                new = cast(v)
                return QuantizedRows(q.rows, new if name == "scales" else q.scales, new if name == "mins" else q.mins)
            return _Field(lambda: getattr(qr, name).astype(np.float64), lambda v: cast(v).astype(np.float64), put)
        return scheme.block_width(cols, p), [plane(n) for n in ("scales", "mins") if getattr(qr, n) is not None]
    nb = cols // scheme.block_elems
    bb = qr.rows.shape[1] // nb
    cast = _as(np.float16)

    def f16_field(off: int) -> _Field:
        def get():
            return np.ascontiguousarray(qr.rows.reshape(rows, nb, bb)[:, :, off:off + 2]).view(np.float16)[..., 0] \
                .astype(np.float64)

        def put(q, v):
            b = q.rows.reshape(rows, nb, bb).copy()
            b[:, :, off:off + 2] = cast(v)[..., None].view(np.uint8)
            return QuantizedRows(b.reshape(rows, -1), q.scales, q.mins)
        return _Field(get, lambda v: cast(v).astype(np.float64), put)
    return scheme.block_elems, [f16_field(o) for _n, o in getattr(scheme, "F16_FIELDS", ())]


def refit_scales(w: np.ndarray, h: np.ndarray, qr: QuantizedRows, scheme: Scheme, p: QuantParams) -> QuantizedRows:
    """``qr`` (the quantized rows of ``w``) with its scale fields refitted,
    codes held, to the least (w − ŵ) H (w − ŵ)ᵀ of each row.

    With every field set to 1 in turn and the others to 0, dequantization
    gives the basis B_f [rows, cols], and ŵ = Σ_f s_f ⊙ B_f with s_f one
    value per block. The normal equations of a row couple every block with
    every other through H: G[(f, a), (g, b)] = B_f[a] H[a, b] B_g[b]ᵀ and
    c[(f, a)] = B_f[a] (H w)[a], G's upper blocks made one block's products
    at a time (rows × cols² × (fields / 2 + 1) multiply-adds in all, with
    H w: gptq's own order of work). A small ridge toward
    the fields as quantized keeps blocks whose codes are all zero where
    they were. Rows that rounding the fields to their storage type would
    make worse keep their old fields, so no row's error grows."""
    rows, cols = w.shape
    bw, fields = _fields(scheme, qr, cols, p)
    if not fields or cols % bw:
        return qr
    nb, nf = cols // bw, len(fields)
    n = nb * nf
    h = np.asarray(h, np.float64)
    basis = np.empty((rows, nf, cols))
    for k in range(nf):  # dequantized with field k = 1, the others 0: ŵ = Σ_k field_k ⊙ basis_k
        q = qr
        for j, f in enumerate(fields):
            q = f.put(q, np.full((rows, nb), 1.0 if j == k else 0.0))
        basis[:, k] = scheme.dequantize_rows(q, cols, p)
    rhs = np.einsum("rfbk,rbk->rfb", basis.reshape(rows, nf, nb, bw),
                    (np.asarray(w, np.float64) @ h).reshape(rows, nb, bw)).reshape(rows, n)
    hb = h.reshape(nb, bw, cols)
    rstep = max(1, min(rows, REFIT_BYTES // (8 * max(n * n, nf * cols))))
    s = np.stack([f.get() for f in fields], 1).reshape(rows, n)  # the fields as quantized, replaced row by row
    for r0 in range(0, rows, rstep):
        r1 = min(rows, r0 + rstep)
        v = basis[r0:r1].reshape(r1 - r0, nf, nb, bw)
        g = np.empty((r1 - r0, nf, nb, nf, nb))
        for a in range(nb):  # G[r, f, a, f', b] = basis_f[r, a] H[a, b] basis_f'[r, b]ᵀ, b ≥ a by one GEMM; G symmetric
            u = (v[:, :, a].reshape(-1, bw) @ hb[a, :, a * bw:]).reshape(r1 - r0, nf, nb - a, bw)
            t = np.einsum("rfbk,rgbk->rfgb", u, v[:, :, a:])
            g[:, :, a, :, a:] = t
            g[:, :, a + 1:, :, a] = t[..., 1:].transpose(0, 2, 3, 1)
        g = g.reshape(r1 - r0, n, n)
        s0, c = s[r0:r1].copy(), rhs[r0:r1]
        lam = RIDGE * np.maximum(np.trace(g, axis1=1, axis2=2) / n, 1e-30)[:, None]
        gr = g.copy()
        gr[:, np.arange(n), np.arange(n)] += lam
        try:
            x = np.linalg.solve(gr, (c + lam * s0)[..., None])[..., 0]
        except np.linalg.LinAlgError:  # not positive definite even with the ridge: the scales as quantized
            continue
        x = np.stack([f.stored(y) for f, y in zip(fields, x.reshape(r1 - r0, nf, nb).transpose(1, 0, 2))], 1)
        x = x.reshape(r1 - r0, n)  # what the file will hold

        def loss(y):  # the row's error less wᵀHw: ŵ is linear in the fields
            return np.einsum("ri,rij,rj->r", y, g, y) - 2 * np.einsum("ri,ri->r", y, c)

        better = np.isfinite(x).all(axis=1) & (loss(x) <= loss(s0))
        s[r0:r1][better] = x[better]
    new = qr
    s = s.reshape(rows, nf, nb)
    for k, f in enumerate(fields):
        new = f.put(new, s[:, k])
    return new
