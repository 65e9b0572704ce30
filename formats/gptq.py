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
types with sub-block scales (the k-quants, iq4_xs, iq4_xsh and the codebook types) have
their integer sub-scales refitted too (refit_sub_scales): solved as real
numbers, then coded back into the type's integers and super-scales. The
bytes stay the type's; only scale bytes change. mxfp4's power-of-two
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
SUB_WINDOW = 256  # refit_sub_scales: the most unknowns per row solved together (whole super-blocks of sub-scales)
SUB_SWEEPS = 1  # refit_sub_scales: passes over a row of more windows (2: q2_k's error ~2% less at windows of 2 super-blocks, twice the time)
RIDGE = 1e-9  # refit_scales: times the mean diagonal, pulling each system toward the scales as quantized
# Whether quantize refits the scales by default (ieconv gptq's default), and the refit it runs: what the
# policy's measurements (q4-manifest --target-bpw --ref-dir, which measure as quantize does) record as
# their refit_scales input, so that a file measured with another refit (true: the f16 scales alone,
# before sub-scales were refitted) is measured again.
REFIT_SCALES = True
REFIT_METHOD = "sub-scales"


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
        out = refit_to_codes(w, h, out, scheme, p)
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

    def f16_field(f: int) -> _Field:
        def get():
            return scheme.f16_field(qr.rows.reshape(rows * nb, bb), f).reshape(rows, nb).astype(np.float64)

        def put(q, v):
            b = q.rows.reshape(rows * nb, bb).copy()
            scheme.set_f16_field(b, f, cast(v).reshape(-1))
            return QuantizedRows(b.reshape(rows, -1), q.scales, q.mins)
        return _Field(get, lambda v: cast(v).astype(np.float64), put)
    return scheme.block_elems, [f16_field(f) for f in range(len(getattr(scheme, "F16_FIELDS", ())))]


def refit_to_codes(w: np.ndarray, h: np.ndarray, qr: QuantizedRows, scheme: Scheme, p: QuantParams) -> QuantizedRows:
    """``qr``'s scales refitted to its codes: refit_sub_scales where the type
    has sub-block scales (they and the super-scales together), else
    refit_scales (its f16 or int4w scale fields)."""
    if qr.scales is None and qr.rows.size and scheme.sub_scale_fields(qr.rows[:1, :scheme.block_bytes]) is not None:
        return refit_sub_scales(w, h, qr, scheme, p)
    return refit_scales(w, h, qr, scheme, p)


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
    hb = h.reshape(nb, bw, nb, bw)
    rstep = max(1, min(rows, REFIT_BYTES // (8 * max(n * n, nf * cols))))
    s = np.stack([f.get() for f in fields], 1).reshape(rows, n)  # the fields as quantized, replaced row by row
    for r0 in range(0, rows, rstep):
        r1 = min(rows, r0 + rstep)
        g = _window_gram(basis[r0:r1].reshape(r1 - r0, nf, nb, bw), hb)
        s0, c = s[r0:r1].copy(), rhs[r0:r1]
        x = s0 + _ridge_solve(g, c - np.einsum("rij,rj->ri", g, s0))  # the ridge pulls toward the fields as quantized
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


def refit_sub_scales(w: np.ndarray, h: np.ndarray, qr: QuantizedRows, scheme: Scheme, p: QuantParams) -> QuantizedRows:
    """``qr`` with its sub-block scales (and mins) and its f16 super-scales
    refitted, codes held, to less (w − ŵ) H (w − ŵ)ᵀ per row: refit_scales
    for the types with sub-scales (the k-quants, iq4_xs, iq4_xsh and the codebook types).

    refit_scales moves a super-block's f16 d (and dmin) only, its integer
    sub-scales as quantized: on the widened SmolLM2 that leaves iq4_xs's
    q_proj at 0.80x gptq's error, where refitting the sub-scales too gives
    0.70x (docs/quality.md). Each sub-block's values are linear in its scale
    (and min) with the codes held (SubScales), so per row and window of
    SUB_WINDOW unknowns (whole super-blocks), against the row's current
    residual r:
      1. the fields as real numbers: (G + λ) Δ = c, c = B H rᵀ (G = B H Bᵀ);
      2. the type's integers and super-scales fitted to them (fit_levels);
      3. each super-scale times the factor that fits best with the integers
         held (the same G, projected), rounded to f16;
      4. the window's bytes kept only if their change δ of the fields lowers
         the error, δ G δᵀ − 2 δ c < 0: exact, so no row ends worse.
    Windows run left to right (Gauss-Seidel; SUB_SWEEPS passes where a row
    has more than one), H rᵀ kept up to date between them. The work is one
    product of the rows by H plus G's upper half per window: about
    refit_scales' own."""
    rows, cols = w.shape
    if qr.scales is not None or cols % scheme.block_elems:
        return qr
    nblk = cols // scheme.block_elems
    out = qr.rows.reshape(rows, nblk, -1).copy()
    bb = out.shape[2]
    sub = scheme.sub_scale_fields(out.reshape(rows * nblk, bb))
    if sub is None:
        return qr
    bw = sub.width
    nf, ns = sub.values.shape[1:]
    if len(scheme.F16_FIELDS) != nf:
        raise IEError(f"{scheme.name}: {nf} sub-scale fields but {len(scheme.F16_FIELDS)} f16 super-scales")
    nb = nblk * ns  # sub-blocks per row

    def by_row(a: np.ndarray, r: int) -> np.ndarray:  # [r × blocks, nf, ns, ...] -> [r, nf, blocks × ns, ...]
        a = a.reshape(r, -1, nf, ns, *a.shape[3:]).swapaxes(1, 2)
        return a.reshape(r, nf, -1, *a.shape[4:])

    basis = by_row(sub.basis, rows).astype(np.float64)
    s = by_row(sub.values, rows).astype(np.float64)
    h = np.asarray(h, np.float64)
    hr = (np.asarray(w, np.float64) - np.einsum("rfbk,rfb->rbk", basis, s).reshape(rows, cols)) @ h  # H rᵀ per row
    per = max(1, SUB_WINDOW // (nf * ns)) * ns  # sub-blocks per window
    windows = [(a, min(nb, a + per)) for a in range(0, nb, per)]
    order = windows if len(windows) == 1 else windows * SUB_SWEEPS
    for i, (a0, a1) in enumerate(order):
        k, c0, c1, b0, b1 = a1 - a0, a0 * bw, a1 * bw, a0 // ns, a1 // ns
        n, m = nf * k, nf * (b1 - b0)  # unknowns: sub-block fields, super-scales
        rstep = max(1, min(rows, REFIT_BYTES // (8 * max(n * n, nf * (c1 - c0)))))
        hw = h[c0:c1, c0:c1].astype(np.float32).reshape(k, bw, k, bw)
        for r0 in range(0, rows, rstep):
            r1 = min(rows, r0 + rstep)
            nr = r1 - r0
            v = basis[r0:r1, :, a0:a1]  # [r, nf, k, bw]
            g = _window_gram(v, hw)
            c = np.einsum("rfbk,rbk->rfb", v, hr[r0:r1, c0:c1].reshape(nr, k, bw)).reshape(nr, n)
            cur = s[r0:r1, :, a0:a1].reshape(nr, n).copy()  # s changes below

            def fields(by):  # the window's fields as bytes ``by`` [r × super-blocks, bb] store them
                return by_row(scheme.sub_scale_fields(by).values, nr).astype(np.float64).reshape(nr, n)

            def rescaled(by, vals):  # ``by`` with each f16 super-scale times the factor that fits best, integers
                # held, and its fields
                lift = np.zeros((nr, nf, k, nf, k // ns))
                for f in range(nf):
                    lift[:, f, :, f] = vals.reshape(nr, nf, k)[:, f, :, None] * np.repeat(np.eye(k // ns), ns, axis=0)
                lift = lift.reshape(nr, n, m)
                lg = lift.transpose(0, 2, 1) @ g  # [r, m, n]
                alpha = 1 + _ridge_solve(lg @ lift, np.einsum("rmi,ri->rm", lift.transpose(0, 2, 1), c)
                                         + np.einsum("rmj,rj->rm", lg, cur - vals))
                by = by.reshape(-1, bb).copy()
                for f in range(nf):
                    d16 = scheme.f16_field(by, f).astype(np.float64).reshape(nr, b1 - b0)
                    new = d16 * alpha.reshape(nr, nf, b1 - b0)[:, f]
                    scheme.set_f16_field(by, f, _as(np.float16)(np.where(np.isfinite(new), new, d16)).reshape(-1))
                return by, fields(by)

            blocks = out[r0:r1, b0:b1].reshape(-1, bb).copy()
            x = cur + _ridge_solve(g, c)  # the fields as real numbers
            enc = scheme.with_sub_scales(blocks, x.reshape(nr, nf, k // ns, ns).swapaxes(1, 2).reshape(-1, nf, ns))
            # candidates: the new integers as fitted, and with their super-scales refitted; the old integers with theirs
            best = np.zeros(nr)  # keeping the window as it is: no change
            fit = fields(enc)
            for by, vals in ((enc, fit), rescaled(enc, fit), rescaled(blocks, cur)):
                d = vals - cur
                e = np.einsum("ri,ri->r", (g @ d[..., None])[..., 0] - 2 * c, d)  # the error's change, δ G δᵀ − 2 δ c
                take = np.isfinite(e) & np.isfinite(vals).all(axis=1) & (e < best)
                best = np.where(take, e, best)
                out[r0:r1, b0:b1][take] = by.reshape(nr, b1 - b0, bb)[take]
                s[r0:r1, :, a0:a1][take] = vals[take].reshape(-1, nf, k)
            step = s[r0:r1, :, a0:a1] - cur.reshape(nr, nf, k)
            if i + 1 < len(order):  # H rᵀ after the step, for the windows still to come
                hr[r0:r1] -= np.einsum("rfbk,rfb->rbk", v, step).reshape(nr, c1 - c0) @ h[c0:c1]
    return QuantizedRows(out.reshape(rows, -1))


def _window_gram(v: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """G [r, nf·k, nf·k] of a window of k blocks: G[r, (f, a), (g, b)] =
    v[r, f, a] H_ab v[r, g, b]ᵀ for bases v [r, nf, k, width] and the
    window's H as hw [k, width, k, width], one GEMM per block a for the
    blocks b ≥ a (G is symmetric). The products run in hw's dtype:
    refit_sub_scales passes float32 (its sub-blocks' GEMMs are only 16 or 32
    deep, so memory-bound in float64: half the time, the refit's errors the
    same to three digits on the widened SmolLM2)."""
    nr, nf, k, bw = v.shape
    v = v.astype(hw.dtype)
    g = np.empty((nr, nf, k, nf, k))
    for a in range(k):
        u = (v[:, :, a].reshape(-1, bw) @ hw[a, :, a:].reshape(bw, -1)).reshape(nr, nf, k - a, bw)
        t = np.einsum("rfbj,rgbj->rfgb", u, v[:, :, a:])
        g[:, :, a, :, a:] = t
        g[:, :, a + 1:, :, a] = t[..., 1:].transpose(0, 2, 3, 1)
    return g.reshape(nr, nf * k, nf * k)


def _ridge_solve(g: np.ndarray, c: np.ndarray) -> np.ndarray:
    """x with (g + λ) x = c per row (g [r, n, n] symmetric, λ RIDGE times its
    mean diagonal); zero for a row whose system is singular even so."""
    n = g.shape[1]
    lam = RIDGE * np.maximum(np.trace(g, axis1=1, axis2=2) / n, 1e-30)
    gr = g + lam[:, None, None] * np.eye(n)
    try:
        x = np.linalg.solve(gr, c[..., None])[..., 0]
    except np.linalg.LinAlgError:  # some row singular: each on its own
        x = np.zeros_like(c)
        for r in range(len(g)):
            try:
                x[r] = np.linalg.solve(gr[r], c[r])
            except np.linalg.LinAlgError:
                pass
    return np.where(np.isfinite(x).all(axis=1, keepdims=True), x, 0.0)
