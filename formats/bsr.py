"""BSR: one block-sparse float32 matrix in one file (``*.bsr``).

The spec is docs/formats/bsr.md. This module is the reference for the format:
the writer ``ieconv block-sparse`` uses, the strict reader/validator behind
``ieconv validate``/``inspect`` and ``ierun verify bsr``, and the float64
products the native kernels are checked against. The C++ loader
(csrc/bsr/loader.cpp) enforces the same rules in the same order and reports
the same ``code`` and ``field`` for each, so the tests can hold the two to
each other input by input.

Everything that can be checked on the 96-byte header is checked before any
payload is read, so a hostile header can never make a reader allocate more
than the file holds. Python integers do not overflow, but the rules are
stated (and checked) exactly as the C++ loader must check them in 64 bits.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import write_file_atomic
from .fileio import check_regular
from .errors import FormatError

MAGIC = b"IEBSR\0\0\0"
VERSION = 1
HEADER_BYTES = 96
DTYPE_F32 = 0
SUFFIX = ".bsr"

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

# magic, version, header_bytes, rows, cols, block_rows, block_cols, n_block_rows,
# nnzb, row_ptr_bytes, col_idx_bytes, values_bytes, value_dtype, flags, crc32, reserved
_HEADER = struct.Struct("<8sIIQQIIQQQQQIIII")
assert _HEADER.size == HEADER_BYTES

# Error codes, shared with the C++ loader (ie::BsrStatus names). One per rule
# family; the field names the exact header field or array element.
CODES = (
    "bad_magic", "truncated", "bad_version", "bad_header_bytes", "bad_dtype", "bad_flags",
    "bad_reserved", "zero_dim", "size_field", "index_range", "file_size", "crc",
    "row_ptr", "col_idx", "col_order", "nonfinite", "padding",
)


class BsrFormatError(FormatError):
    """A FormatError that also carries the rule's code (the same as the C++ loader's)."""

    def __init__(self, file: str | os.PathLike, field: str, message: str, code: str):
        assert code in CODES, code
        self.code = code
        super().__init__(file, field, message)


def _ceil_div(a: int, b: int) -> int:
    return a // b + (a % b != 0)


def keep_count(density: float, total: int) -> int:
    """Blocks kept at density D of ``total`` (``ieconv block-sparse --keep-density``, the
    benchmark's random matrices): ceil(D × total), immune to float noise such as
    0.1 × 65536 = 6553.600000000001."""
    return min(total, math.ceil(round(density * total, 9)))


@dataclass(frozen=True, eq=False)
class BsrMatrix:
    """A validated block-row CSR matrix.

    ``values`` is ``[nnzb, block_rows, block_cols]`` float32; tail blocks are
    full-size with the part outside ``rows × cols`` zero.
    """

    rows: int
    cols: int
    block_rows: int
    block_cols: int
    row_ptr: np.ndarray  # uint32 [n_block_rows + 1]
    col_idx: np.ndarray  # uint32 [nnzb]
    values: np.ndarray  # float32 [nnzb, block_rows, block_cols]

    @property
    def n_block_rows(self) -> int:
        return _ceil_div(self.rows, self.block_rows)

    @property
    def n_block_cols(self) -> int:
        return _ceil_div(self.cols, self.block_cols)

    @property
    def nnzb(self) -> int:
        return int(self.col_idx.shape[0])

    @property
    def density(self) -> float:
        """Stored blocks / all blocks of the grid."""
        return self.nnzb / (self.n_block_rows * self.n_block_cols)

    @property
    def payload_bytes(self) -> int:
        return 4 * (self.n_block_rows + 1) + 4 * self.nnzb + 4 * self.nnzb * self.block_rows * self.block_cols

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.payload_bytes

    @property
    def dense_bytes(self) -> int:
        """The same matrix as dense float32."""
        return 4 * self.rows * self.cols

    def block_coords(self) -> tuple[np.ndarray, np.ndarray]:
        """(block row, block column) of every stored block, in storage order."""
        counts = np.diff(self.row_ptr.astype(np.int64))
        return np.repeat(np.arange(self.n_block_rows, dtype=np.int64), counts), self.col_idx.astype(np.int64)

    def to_dense(self, dtype=np.float32) -> np.ndarray:
        """The [rows, cols] matrix; blocks that are not stored are zero.

        Allocates the [rows, cols] result and nothing of the padded grid: a
        block may be far larger than the matrix (a valid 1×24 file can
        declare 2^31-row blocks), so whole blocks are written through a
        strided view of the result and only the stored tail blocks are
        clipped, one by one."""
        br, bc, rows, cols = self.block_rows, self.block_cols, self.rows, self.cols
        out = np.zeros((rows, cols), dtype=dtype)
        r, c = self.block_coords()
        full_r, full_c = rows // br, cols // bc  # block rows/columns that lie wholly inside
        inner = (r < full_r) & (c < full_c)
        if inner.any():
            s0, s1 = out.strides
            grid = np.lib.stride_tricks.as_strided(out, shape=(full_r, full_c, br, bc),
                                                   strides=(br * s0, bc * s1, s0, s1))
            grid[r[inner], c[inner]] = self.values[inner]
        for k in np.flatnonzero(~inner):
            r0, c0 = int(r[k]) * br, int(c[k]) * bc
            h, w = min(br, rows - r0), min(bc, cols - c0)
            out[r0:r0 + h, c0:c0 + w] = self.values[k, :h, :w]
        return out

    def matvec_f64(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """float64 ``A x (+ bias)`` for x [cols] or [b, cols]: the reference the kernels are held to."""
        y = np.asarray(x, np.float64) @ self.to_dense(np.float64).T
        return y if bias is None else y + np.asarray(bias, np.float64)


# --------------------------------------------------------------------------
# Validation: the rules, in the order the C++ loader applies them
# --------------------------------------------------------------------------


def _check_dims(file: str, rows: int, cols: int, br: int, bc: int) -> None:
    for field, v in (("rows", rows), ("cols", cols), ("block_rows", br), ("block_cols", bc)):
        if v == 0:
            raise BsrFormatError(file, field, "must be > 0", "zero_dim")
    nbc = _ceil_div(cols, bc)
    if nbc - 1 > U32_MAX:
        raise BsrFormatError(file, "cols", f"{nbc} block columns (ceil({cols} / {bc})) do not fit the u32 col_idx",
                             "index_range")


def _check_structure(file: str, m: BsrMatrix, allow_nonfinite: bool) -> None:
    """The payload rules: row_ptr, col_idx, values. ``m``'s arrays have the right lengths."""
    nbr, nbc, nnzb = m.n_block_rows, m.n_block_cols, m.nnzb
    rp = m.row_ptr.astype(np.int64)
    if rp[0] != 0:
        raise BsrFormatError(file, "row_ptr[0]", f"must be 0, got {rp[0]}", "row_ptr")
    dec = np.flatnonzero(rp[1:] < rp[:-1])
    if dec.size:
        i = int(dec[0]) + 1
        raise BsrFormatError(file, f"row_ptr[{i}]", f"{rp[i]} < row_ptr[{i - 1}] = {rp[i - 1]} (must not decrease)",
                             "row_ptr")
    if rp[-1] != nnzb:
        raise BsrFormatError(file, f"row_ptr[{nbr}]", f"must equal nnzb = {nnzb}, got {rp[-1]}", "row_ptr")
    ci = m.col_idx.astype(np.int64)
    bad = np.flatnonzero(ci >= nbc)
    if bad.size:
        k = int(bad[0])
        raise BsrFormatError(file, f"col_idx[{k}]", f"block column {ci[k]} is out of range (matrix has {nbc})",
                             "col_idx")
    if nnzb > 1:
        # Within a block row columns strictly ascend; a row's first block may be anything.
        starts = np.zeros(nnzb, bool)
        starts[rp[:-1][rp[:-1] < nnzb]] = True
        bad = np.flatnonzero((ci[1:] <= ci[:-1]) & ~starts[1:])
        if bad.size:
            k = int(bad[0]) + 1
            br = int(np.searchsorted(rp, k, side="right")) - 1
            raise BsrFormatError(file, f"col_idx[{k}]", f"block row {br}: block column {ci[k]} does not follow "
                                 f"{ci[k - 1]} (must strictly ascend)", "col_order")
    bs = m.block_rows * m.block_cols
    flat = m.values.reshape(-1)
    if not allow_nonfinite:
        bad = np.flatnonzero(~np.isfinite(flat))
        if bad.size:
            e = int(bad[0])
            raise BsrFormatError(file, f"values[{e}]", f"non-finite value {flat[e]} (block {e // bs}); "
                                 "pass --allow-nonfinite to accept", "nonfinite")
    tail_r = nbr * m.block_rows - m.rows
    tail_c = nbc * m.block_cols - m.cols
    if nnzb and (tail_r or tail_c):
        # Only blocks in the last block row or column have padding; look at those alone.
        r, c = m.block_coords()
        last_r, last_c = (r == nbr - 1) & bool(tail_r), (c == nbc - 1) & bool(tail_c)
        sel = np.flatnonzero(last_r | last_c)
        pad_rows = np.arange(m.block_rows) >= m.block_rows - tail_r
        pad_cols = np.arange(m.block_cols) >= m.block_cols - tail_c
        mask = ((last_r[sel, None, None] & pad_rows[None, :, None])
                | (last_c[sel, None, None] & pad_cols[None, None, :]))
        bad = np.argwhere((m.values[sel].view(np.uint32) != 0) & mask)
        if bad.size:
            s, i, j = (int(v) for v in bad[0])  # C order: the lowest flat index
            k = int(sel[s])
            e = k * bs + i * m.block_cols + j
            raise BsrFormatError(file, f"values[{e}]", f"block ({r[k]}, {c[k]}) element ({i}, {j}) lies outside the "
                                 f"{m.rows}×{m.cols} matrix and must be +0.0, got {flat[e]!r}", "padding")


def check_matrix(m: BsrMatrix, file: str | os.PathLike = "(memory)", allow_nonfinite: bool = False) -> None:
    """Every rule that applies to an in-memory matrix (what the writer checks)."""
    file = os.fspath(file)
    for name in ("rows", "cols", "block_rows", "block_cols"):
        v = getattr(m, name)
        if type(v) is not int or v < 0 or v > (U32_MAX if name.startswith("block") else U64_MAX):
            raise BsrFormatError(file, name, f"must be an integer in range, got {v!r}", "size_field")
    _check_dims(file, m.rows, m.cols, m.block_rows, m.block_cols)
    for name, dt, shape in (("row_ptr", np.uint32, (m.n_block_rows + 1,)), ("col_idx", np.uint32, None),
                            ("values", np.float32, None)):
        a = getattr(m, name)
        if not isinstance(a, np.ndarray) or a.dtype != dt:
            raise BsrFormatError(file, name, f"must be a {np.dtype(dt).name} array", "size_field")
        if shape is not None and a.shape != shape:
            raise BsrFormatError(file, name, f"must have shape {shape}, got {a.shape}", "size_field")
    if m.col_idx.ndim != 1 or m.nnzb > U32_MAX:
        raise BsrFormatError(file, "col_idx", "must be 1-D with at most 2^32 - 1 entries", "index_range")
    if m.values.shape != (m.nnzb, m.block_rows, m.block_cols):
        raise BsrFormatError(file, "values", f"must have shape {(m.nnzb, m.block_rows, m.block_cols)}, "
                             f"got {m.values.shape}", "size_field")
    _check_structure(file, m, allow_nonfinite)


def parse(data: bytes, file: str | os.PathLike = "(memory)", allow_nonfinite: bool = False) -> BsrMatrix:
    """Validate a whole .bsr file's bytes and return its matrix (its arrays are read-only views of ``data``)."""
    file = os.fspath(file)
    size = len(data)
    if size < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        raise BsrFormatError(file, "magic", f"not a BSR file (expected {MAGIC!r}, got {bytes(data[:8])!r})", "bad_magic")
    if size < HEADER_BYTES:
        raise BsrFormatError(file, "header", f"file is {size} bytes, shorter than the {HEADER_BYTES}-byte header",
                             "truncated")
    (_m, version, header_bytes, rows, cols, br, bc, nbr, nnzb, rp_bytes, ci_bytes, v_bytes,
     dtype, flags, crc, reserved) = _HEADER.unpack_from(data)
    if version != VERSION:
        raise BsrFormatError(file, "version", f"unsupported version {version} (this build reads {VERSION})",
                             "bad_version")
    if header_bytes != HEADER_BYTES:
        raise BsrFormatError(file, "header_bytes", f"must be {HEADER_BYTES}, got {header_bytes}", "bad_header_bytes")
    if dtype != DTYPE_F32:
        raise BsrFormatError(file, "value_dtype", f"unknown value dtype {dtype} (0 = f32 is the only one defined)",
                             "bad_dtype")
    if flags != 0:
        raise BsrFormatError(file, "flags", f"must be 0, got {flags:#x}", "bad_flags")
    if reserved != 0:
        raise BsrFormatError(file, "reserved", f"must be 0, got {reserved:#x}", "bad_reserved")
    _check_dims(file, rows, cols, br, bc)
    if nbr != _ceil_div(rows, br):
        raise BsrFormatError(file, "n_block_rows", f"{nbr} disagrees with ceil({rows} / {br}) = {_ceil_div(rows, br)}",
                             "size_field")
    if nnzb > U32_MAX:
        raise BsrFormatError(file, "nnzb", f"{nnzb} does not fit the u32 row_ptr", "index_range")
    nbc = _ceil_div(cols, bc)
    if nnzb > nbr * nbc:
        raise BsrFormatError(file, "nnzb", f"{nnzb} exceeds the {nbr}×{nbc} = {nbr * nbc} blocks of the grid",
                             "index_range")
    want = {"row_ptr_bytes": 4 * (nbr + 1), "col_idx_bytes": 4 * nnzb, "values_bytes": 4 * nnzb * br * bc}
    for field, got in (("row_ptr_bytes", rp_bytes), ("col_idx_bytes", ci_bytes), ("values_bytes", v_bytes)):
        if got != want[field]:
            raise BsrFormatError(file, field, f"{got} disagrees with the dimensions ({want[field]})", "size_field")
    expected = HEADER_BYTES + rp_bytes + ci_bytes + v_bytes
    if size != expected:
        raise BsrFormatError(file, "(size)", f"file is {size} bytes, header says {expected} "
                             f"({'truncated' if size < expected else 'trailing bytes'})", "file_size")
    payload = memoryview(data)[HEADER_BYTES:]
    actual = zlib.crc32(payload)
    if actual != crc:
        raise BsrFormatError(file, "crc32", f"payload checksum mismatch (stored {crc:08x}, actual {actual:08x})", "crc")
    o1, o2 = rp_bytes, rp_bytes + ci_bytes
    # Read-only views of `data` (no copy on a little-endian host).
    m = BsrMatrix(rows, cols, br, bc,
                  np.frombuffer(payload[:o1], "<u4").astype(np.uint32, copy=False),
                  np.frombuffer(payload[o1:o2], "<u4").astype(np.uint32, copy=False),
                  np.frombuffer(payload[o2:], "<f4").astype(np.float32, copy=False).reshape(nnzb, br, bc))
    _check_structure(file, m, allow_nonfinite)
    return m


def read(path: str | os.PathLike, allow_nonfinite: bool = False) -> BsrMatrix:
    """Load and fully validate a .bsr file (the checksum included)."""
    if os.path.exists(path):  # a FIFO or a device is an error, never a hang (a missing file: OSError as before)
        check_regular(path)
    return parse(Path(path).read_bytes(), path, allow_nonfinite)


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------


def encode(m: BsrMatrix, allow_nonfinite: bool = False) -> bytes:
    """The file's bytes. The matrix is validated first, so a writer can only emit valid files."""
    check_matrix(m, allow_nonfinite=allow_nonfinite)
    payload = b"".join((m.row_ptr.astype("<u4").tobytes(), m.col_idx.astype("<u4").tobytes(),
                        m.values.astype("<f4").tobytes()))
    nnzb, br, bc = m.nnzb, m.block_rows, m.block_cols
    header = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, m.rows, m.cols, br, bc, m.n_block_rows, nnzb,
                          4 * (m.n_block_rows + 1), 4 * nnzb, 4 * nnzb * br * bc, DTYPE_F32, 0,
                          zlib.crc32(payload), 0)
    return header + payload


def write(path: str | os.PathLike, m: BsrMatrix, allow_nonfinite: bool = False) -> None:
    """Write atomically (temp name, fsync, rename): a failed write leaves ``path`` as it was."""
    write_file_atomic(Path(path), encode(m, allow_nonfinite))


def is_bsr_path(path: str | os.PathLike) -> bool:
    """True for a name ending in .bsr, or a regular file that starts with the BSR magic."""
    p = Path(path)
    if p.suffix == SUFFIX:
        return True
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC
