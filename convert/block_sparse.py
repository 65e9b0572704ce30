"""Dense float matrix -> BSR (``ieconv block-sparse``).

Sparsification is an explicit offline step: the runtime never drops weights.
Three policies decide which ``block_rows × block_cols`` tiles are stored:

- exact (default): every block holding a non-zero value; lossless;
- threshold T: blocks whose max |value| ≤ T are dropped;
- keep-density D: the ceil(D × blocks) blocks of largest L2 norm, ties broken
  by block index (row-major over the block grid), so the choice never
  depends on sort stability or thread timing.

Under every policy a block that is entirely zero is never stored, and a block
holding a NaN or infinity always is (it is "non-zero" and its norm is
infinite). The output is a pure function of the input values, the block shape
and the policy; the writer is formats/bsr.py, the input readers are
formats/dense_matrix.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iekit.formats import bsr
from iekit.formats.atomic import check_new_file, write_file_atomic
from iekit.formats.dense_matrix import load_dense
from iekit.formats.errors import IEError

NORM_CHUNK_ELEMS = 1 << 22  # bounds the float64 temporaries of the block norms


# --------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------


@dataclass
class Conversion:
    matrix: bsr.BsrMatrix
    policy: str
    total_blocks: int
    kept_blocks: int
    dropped_rel_frobenius: float  # ||dropped||_F / ||A||_F (0 for an all-zero A)

    @property
    def density(self) -> float:
        return self.kept_blocks / self.total_blocks


def block_grid(a: np.ndarray, br: int, bc: int) -> np.ndarray:
    """[n_block_rows, n_block_cols, br, bc] view of ``a`` (zero-padded copy when the shape does not divide)."""
    rows, cols = a.shape
    nbr, nbc = -(-rows // br), -(-cols // bc)
    if (nbr * br, nbc * bc) != (rows, cols):
        p = np.zeros((nbr * br, nbc * bc), np.float32)
        p[:rows, :cols] = a
        a = p
    return a.reshape(nbr, br, nbc, bc).transpose(0, 2, 1, 3)


def _per_block(grid: np.ndarray, fn) -> np.ndarray:
    """fn over each block row's blocks, a bounded number of block rows at a time."""
    nbr, nbc, br, bc = grid.shape
    step = max(1, NORM_CHUNK_ELEMS // max(1, nbc * br * bc))
    return np.concatenate([fn(grid[i:i + step]) for i in range(0, nbr, step)])


def to_bsr(a: np.ndarray, block_rows: int, block_cols: int, threshold: float | None = None,
           keep_density: float | None = None) -> Conversion:
    """Choose the blocks of a float32 [rows, cols] matrix by one policy and build the BSR matrix."""
    if threshold is not None and keep_density is not None:
        raise IEError("--threshold and --keep-density are alternatives; give at most one")
    if threshold is not None and not (threshold >= 0 and math.isfinite(threshold)):
        raise IEError(f"--threshold must be a finite number >= 0, got {threshold}")
    if keep_density is not None and not 0 <= keep_density <= 1:
        raise IEError(f"--keep-density must be in [0, 1], got {keep_density}")
    if block_rows < 1 or block_cols < 1 or block_rows > bsr.U32_MAX or block_cols > bsr.U32_MAX:
        raise IEError(f"block shape {block_rows}×{block_cols}: both must be in 1 … 2^32 − 1")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim != 2 or 0 in a.shape:
        raise IEError(f"the dense matrix must be 2-D and non-empty, got shape {list(a.shape)}")
    grid = block_grid(a, block_rows, block_cols)
    nbr, nbc = grid.shape[:2]
    total = nbr * nbc

    nonzero = _per_block(grid, lambda g: (g != 0).any(axis=(2, 3)))
    with np.errstate(over="ignore", invalid="ignore"):
        sq = _per_block(grid, lambda g: np.square(g, dtype=np.float64).sum(axis=(2, 3)))
    if threshold is not None:
        with np.errstate(invalid="ignore"):
            maxabs = _per_block(grid, lambda g: np.abs(g).max(axis=(2, 3)))
        keep = nonzero & ~(maxabs <= threshold)  # NaN compares false: kept
        policy = f"threshold {threshold:g}"
    elif keep_density is not None:
        k = bsr.keep_count(keep_density, total)
        norm = np.where(np.isnan(sq), np.inf, sq).reshape(-1)
        idx = np.arange(total)
        cand = idx[nonzero.reshape(-1)]
        order = cand[np.lexsort((cand, -norm[cand]))]  # largest norm first, then lowest block index
        keep = np.zeros(total, bool)
        keep[order[:k]] = True
        keep = keep.reshape(nbr, nbc)
        policy = f"keep-density {keep_density:g}"
    else:
        keep = nonzero
        policy = "exact"

    counts = keep.sum(axis=1)
    row_ptr = np.zeros(nbr + 1, np.uint32)
    row_ptr[1:] = np.cumsum(counts)
    r, c = np.nonzero(keep)  # row-major: block columns ascend within a block row
    values = np.ascontiguousarray(grid[r, c], dtype=np.float32)
    m = bsr.BsrMatrix(int(a.shape[0]), int(a.shape[1]), int(block_rows), int(block_cols), row_ptr,
                      c.astype(np.uint32), values.reshape(-1, block_rows, block_cols))
    total_sq = float(sq.sum())
    dropped_sq = float(sq[~keep].sum())
    rel = math.sqrt(dropped_sq / total_sq) if total_sq > 0 and math.isfinite(total_sq) else 0.0
    return Conversion(m, policy, total, int(keep.sum()), rel)


def convert_file(out: Path, block_rows: int, block_cols: int, *, dense: Path | None = None, rows: int | None = None,
                 cols: int | None = None, model_dir: Path | None = None, tensor: str | None = None,
                 threshold: float | None = None, keep_density: float | None = None, overwrite: bool = False,
                 allow_nonfinite: bool = False) -> tuple[Conversion, str]:
    """Load, sparsify and write atomically. Returns the conversion and the source label."""
    out = Path(out)
    check_new_file(out, overwrite)
    a, label = load_dense(dense, rows, cols, model_dir, tensor)
    conv = to_bsr(a, block_rows, block_cols, threshold, keep_density)
    try:
        data = bsr.encode(conv.matrix, allow_nonfinite=allow_nonfinite)
    except bsr.BsrFormatError as e:
        if e.code != "nonfinite":
            raise
        raise IEError(f"{label}: the input holds non-finite values (first kept at {e.field}); "
                      "pass --allow-nonfinite to store them") from None
    write_file_atomic(out, data, replace=overwrite)  # no replacing a file that appeared meanwhile either
    return conv, label
