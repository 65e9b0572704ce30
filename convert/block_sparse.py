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
and the policy; the writer is formats/bsr.py.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iekit.formats import bsr, iebin
from iekit.formats.atomic import write_file_atomic
from iekit.formats.errors import FormatError, IEError

from .casting import decode_f32

IEBIN_FLOAT_DTYPES = ("f32", "f16", "bf16")
NORM_CHUNK_ELEMS = 1 << 22  # bounds the float64 temporaries of the block norms


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


def load_npy(path: Path) -> np.ndarray:
    """A 2-D float32/float16/bfloat16 .npy as float32 (both widen exactly).

    numpy has no bfloat16 of its own: ml_dtypes' bfloat16 is saved as a
    2-byte void ('|V2'), which is read as bfloat16 bits."""
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise FormatError(path, "(header)", f"not a readable .npy file ({e})") from None
    if not isinstance(a, np.ndarray):
        raise FormatError(path, "(header)", "not a single-array .npy file")
    bf16 = a.dtype.name == "bfloat16" or (a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.fields is None)
    if not bf16 and (a.dtype.kind != "f" or a.dtype.itemsize not in (2, 4)):
        raise FormatError(path, "dtype", f"{a.dtype} is not supported: float32, float16 or bfloat16")
    if a.ndim != 2:
        raise FormatError(path, "shape", f"must be 2-D, got shape {list(a.shape)}")
    if bf16:
        bits = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    return np.ascontiguousarray(a, dtype=np.float32)


def load_raw_f32(path: Path, rows: int, cols: int) -> np.ndarray:
    """Raw little-endian float32, row-major, exactly rows × cols × 4 bytes."""
    if rows < 1 or cols < 1:
        raise IEError(f"{path}: --rows and --cols must be >= 1")
    size = path.stat().st_size
    if size != 4 * rows * cols:
        raise FormatError(path, "(size)", f"file is {size} bytes, but {rows}×{cols} float32 needs {4 * rows * cols}")
    return np.fromfile(path, dtype="<f4").astype(np.float32, copy=False).reshape(rows, cols)


def load_iebin_tensor(model_dir: Path, name: str) -> np.ndarray:
    """One 2-D f32/f16/bf16 tensor of an IEBIN artifact as float32 (checksum verified)."""
    m = iebin.load_model(model_dir)
    t = m.tensor(name)
    where = f"tensors[{m.tensors.index(t)}]"
    if t["dtype"] not in IEBIN_FLOAT_DTYPES:
        raise FormatError(m.meta_path, f"{where}.dtype", f"tensor {name!r}: {t['dtype']} cannot be made block-sparse "
                          f"(one of {', '.join(IEBIN_FLOAT_DTYPES)})")
    if len(t["shape"]) != 2 or 0 in t["shape"]:
        raise FormatError(m.meta_path, f"{where}.shape", f"tensor {name!r}: must be 2-D and non-empty, got {t['shape']}")
    with open(m.path_of(t), "rb") as f:
        f.seek(t["file_data_offset"])
        raw = f.read(t["nbytes"])
    if len(raw) != t["nbytes"] or hashlib.sha256(raw).hexdigest() != t["sha256"]:
        raise FormatError(m.meta_path, f"{where}.sha256", f"tensor {name!r}: checksum mismatch")
    return decode_f32(raw, t["dtype"]).reshape(t["shape"])


def load_dense(path: Path | None = None, rows: int | None = None, cols: int | None = None,
               model_dir: Path | None = None, tensor: str | None = None) -> tuple[np.ndarray, str]:
    """(values as float32 [rows, cols], a label of the source) from exactly one kind of input."""
    if (path is None) == (model_dir is None):
        raise IEError("give either a dense .npy/.bin file or --model-dir with --tensor")
    if model_dir is not None:
        if not tensor:
            raise IEError("--model-dir needs --tensor NAME")
        if rows is not None or cols is not None:
            raise IEError("--rows/--cols apply to raw .bin input only")
        return load_iebin_tensor(Path(model_dir), tensor), f"{model_dir}:{tensor}"
    if tensor:
        raise IEError("--tensor needs --model-dir")
    path = Path(path)
    if path.suffix == ".npy":
        if rows is not None or cols is not None:
            raise IEError("--rows/--cols apply to raw .bin input only (a .npy file records its shape)")
        return load_npy(path), os.fspath(path)
    if rows is None or cols is None:
        raise IEError(f"{path}: raw float32 input needs --rows and --cols (or use a .npy file)")
    return load_raw_f32(path, rows, cols), os.fspath(path)


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


def keep_count(density: float, total: int) -> int:
    """ceil(D × total), immune to float noise such as 0.1 × 65536 = 6553.600000000001."""
    return min(total, math.ceil(round(density * total, 9)))


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
        k = keep_count(keep_density, total)
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
    if out.exists() and not overwrite:
        raise IEError(f"{out}: exists; pass --overwrite to replace")
    a, label = load_dense(dense, rows, cols, model_dir, tensor)
    conv = to_bsr(a, block_rows, block_cols, threshold, keep_density)
    try:
        data = bsr.encode(conv.matrix, allow_nonfinite=allow_nonfinite)
    except bsr.BsrFormatError as e:
        if e.code != "nonfinite":
            raise
        raise IEError(f"{label}: the input holds non-finite values (first kept at {e.field}); "
                      "pass --allow-nonfinite to store them") from None
    write_file_atomic(out, data)
    return conv, label
