"""Quantized tensor schemes: the one reference implementation.

One small class per scheme (vectorised numpy quantize / dequantize / error
bound): the quantized weight types of ``weight_table.py``, registered there
by subclassing (their sizes come from its table); ``SCHEMES`` is the
quantized part of that registry. The converter quantizes with it, the tests
compare it with ``gguf.quants`` byte for byte, and ``ierun verify quant``
checks the C++ dequantizers and kernels against it. Layouts and the exact
arithmetic are specified in docs/formats/quant.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, NamedTuple

import numpy as np

from . import codebooks
from . import quant_search as qs
from . import weight_table
from .dtypes import DTYPES
from .errors import IEError
from .weight_table import BLOCK, WeightType
from .workers import ordered_map

F16_MAX = 65504.0
# Elements per quantization task on a worker thread (Scheme.measured_pieces).
# Measured on one core of the 2-core VM (M elements/s): q4_0 80 at 256K
# against 45 at 1M (the temporaries of the smaller pieces stay in cache);
# int4w g64, which reuses two buffers, 22-28 from 64K to 1M, within the
# noise. Two tasks per thread in flight keep a conversion's peak RSS small
# on 16 cores too.
PIECE_ELEMS = 1 << 18


class QuantDictError(ValueError):
    """A ``quant`` object breaks a rule; ``key`` names the offending key."""

    def __init__(self, key: str, message: str, allowed: tuple = ()):
        self.key = key
        self.allowed = allowed  # the values the key may take, when it is one of a few literals
        super().__init__(message)


@dataclass(frozen=True)
class QuantParams:
    """What a manifest rule or a ``quant`` object selects for one tensor."""

    scheme: str
    group_size: int | None = None  # int4w only; None = whole row
    symmetric: bool = True
    scale_dtype: str = "f16"
    tensor_scale: float = 1.0  # nvfp4 only: the matrix is its blocks' values times this float32 (NVFP4's scale_2)
    input_scale: float | None = None  # nvfp4 only: its activation's calibration scale, carried unread (as llama.cpp)


QUADRATIC_BLOCK = 512  # columns of h per step of quadratic_sum


def quadratic_sum(a: np.ndarray, h: np.ndarray) -> float:
    """Σ_r a_r h a_rᵀ over the rows of ``a`` [n, cols], ``h`` [cols, cols]
    symmetric. Block column by block column over h's upper triangle (a
    diagonal block once, the blocks above it twice), in float32 GEMMs summed
    in float64: a quarter of the float64 ``((a @ h) * a).sum()``'s time (a
    third of gptq's on [2048, 8192]), and no float32 copy of h larger than
    a block. Relative error about 1e-6: this is a reported loss. Never
    negative: h is a covariance, so each term is ≥ 0, but rows that
    compensation left nearly in h's null space (a covariance of fewer
    calibration rows than columns: a rarely routed expert) can sum to a
    rounding error below 0, which the artifact's schema rightly refuses."""
    a = np.asarray(a, dtype=np.float32)
    cols = a.shape[1]
    total = 0.0
    for j0 in range(0, cols, QUADRATIC_BLOCK):
        j1 = min(cols, j0 + QUADRATIC_BLOCK)
        hb = np.asarray(h[:j1, j0:j1], dtype=np.float32)
        aj = a[:, j0:j1]
        total += float(np.sum(aj * (aj @ hb[j0:]), dtype=np.float64))
        if j0:
            total += 2.0 * float(np.sum(aj * (a[:, :j0] @ hb[:j0]), dtype=np.float64))
    return max(total, 0.0)


@dataclass
class QuantError:
    """A matrix's predicted loss: Σ imp[c] × (w − ŵ)² over its elements, and
    Σ imp[c] × w² beside it (imp: the importance matrix's column means of x²
    for the matrix's input, or 1 without one). The first is the expected
    squared error quantization adds to the matrix's outputs per token
    (E[(ΔW x)²] = Σ ΔW² E[x²] for independent columns): what the
    bits-per-weight policy ranks candidates by, and what the converters
    record per tensor. Their ratio is scale-free (SQNR), comparable across
    matrices of one model."""

    weighted: bool = False
    sq_error: float = 0.0
    sq_norm: float = 0.0
    compensated: bool = False  # error-compensated (formats/gptq.py): codes are not the source's nearest

    def add_covariance(self, w: np.ndarray, w_hat: np.ndarray, h: np.ndarray) -> None:
        """The same sums under a full input covariance ``h`` = E[x xᵀ] [cols,
        cols]: Σ_r δ_r h δ_rᵀ, no independence of the columns assumed."""
        w = np.asarray(w, dtype=np.float32)  # quadratic_sum works in float32: no float64 copy of the rows
        self.weighted = True
        self.sq_error += quadratic_sum(w - np.asarray(w_hat, dtype=np.float32), h)
        self.sq_norm += quadratic_sum(w, h)

    def add(self, w: np.ndarray, w_hat: np.ndarray, importance: np.ndarray | None) -> None:
        """Accumulate rows ``w`` [n, cols] and their dequantized ``w_hat``."""
        self.merge(QuantError.between(w, w_hat, importance))

    @staticmethod
    def between(w: np.ndarray, w_hat: np.ndarray, importance: np.ndarray | None) -> "QuantError":
        """The sums of rows ``w`` and their dequantized ``w_hat`` alone: a
        worker computes them (formats/workers.py), the caller merges them in
        row order, so the totals do not depend on the threads."""
        w = np.asarray(w, dtype=np.float64)
        d = w - w_hat
        if importance is None:
            return QuantError(sq_error=float((d * d).sum()), sq_norm=float((w * w).sum()))
        imp = np.asarray(importance, dtype=np.float64).reshape(-1)
        return QuantError(weighted=True, sq_error=float(((d * d) @ imp).sum()), sq_norm=float(((w * w) @ imp).sum()))

    def merge(self, other: "QuantError") -> None:
        self.weighted = self.weighted or other.weighted
        self.sq_error += other.sq_error
        self.sq_norm += other.sq_norm

    @property
    def sqnr_db(self) -> float:
        """10 log10(Σ imp w² / Σ imp (w − ŵ)²); inf for an exact matrix."""
        if self.sq_error == 0:
            return float("inf")
        return 10 * np.log10(self.sq_norm / self.sq_error) if self.sq_norm > 0 else float("-inf")

    def record(self) -> dict[str, Any]:
        """The tensor entry's ``quant_error`` (docs/formats/iebin.md), at six
        significant digits: a summation-order ulp does not change the bytes."""
        out = {"weighted": self.weighted, "sq_error": float(f"{self.sq_error:.6g}"),
               "sq_norm": float(f"{self.sq_norm:.6g}")}
        return {**out, "compensated": True} if self.compensated else out


class NonFiniteError(IEError):
    """A NaN or ±inf among the rows to quantize, at (row, column) of those rows."""

    def __init__(self, name: str, value: float, at: tuple[int, ...]):
        self.name, self.value, self.at = name, value, at
        super().__init__(f"{name}: non-finite value {value} at {at}; cannot quantize")

    def moved(self, row0: int) -> "NonFiniteError":
        """The same error for rows that start at row ``row0`` of the matrix."""
        return NonFiniteError(self.name, self.value, (self.at[0] + row0, *self.at[1:]))


def _finite_or_raise(w: np.ndarray, name: str) -> None:
    if not np.isfinite(w).all():
        bad = np.argwhere(~np.isfinite(w))[0]
        raise NonFiniteError(name, w[tuple(bad)], tuple(int(i) for i in bad))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[..., 32k] codes 0..15 -> [..., 16k] bytes: element j low, j+16 high per 32-block."""
    b = q.reshape(*q.shape[:-1], -1, 2, BLOCK // 2).astype(np.uint8)
    return (b[..., 0, :] | (b[..., 1, :] << 4)).reshape(*q.shape[:-1], -1)


def _unpack_nibbles(p: np.ndarray) -> np.ndarray:
    """Inverse of _pack_nibbles: [..., 16k] bytes -> [..., 32k] codes."""
    b = p.reshape(*p.shape[:-1], -1, 1, BLOCK // 2)
    q = np.concatenate([b & 0x0F, b >> 4], axis=-2)
    return q.reshape(*p.shape[:-1], -1)


def _round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32) if dtype == "f16" else x.astype(np.float32)


def _recip(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 (llama.cpp's rule). For subnormal d the
    result overflows to inf; see _codes for what that yields."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _safe_recip(d: np.ndarray) -> np.ndarray:
    """1/d, and 0 where d == 0 or 1/d overflows (int4w: such a group's scale
    stores as zero anyway, so its codes are irrelevant but well defined)."""
    r = _recip(d)
    return np.where(np.isfinite(r), r, np.float32(0)).astype(np.float32)


def _codes(v: np.ndarray, lo: int, hi: int, dtype) -> np.ndarray:
    """clamp(v, lo, hi) as integers, with non-finite v -> 0.

    v is non-finite only in blocks whose scale is so small that 1/d overflows
    (its f16 copy is then ±0, so the codes do not change any value); mapping
    those to 0 is what gguf-py's float->int cast yields on x86, and spelling it
    out keeps the bytes identical on every platform."""
    with np.errstate(invalid="ignore"):
        v = np.where(np.isfinite(v), v, np.float32(0))
        return np.clip(v, lo, hi).astype(dtype)


def _check_f16_range(d: np.ndarray, name: str, what: str = "scale") -> None:
    if np.abs(d).max(initial=0) > F16_MAX:
        raise IEError(f"{name}: {what} {float(np.abs(d).max())} overflows f16; values this large need scale_dtype f32 (int4w) or no quantization")


def _checked_importance(importance: np.ndarray | None, cols: int, name: str) -> np.ndarray | None:
    """The importance vector as float32 [cols], or an IEError naming what is wrong."""
    if importance is None:
        return None
    imp = np.asarray(importance, dtype=np.float32).reshape(-1)
    if imp.size != cols:
        raise IEError(f"{name}: importance has {imp.size} columns, the matrix {cols}")
    bad = np.flatnonzero(~np.isfinite(imp) | (imp < 0))
    if bad.size:
        raise IEError(f"{name}: importance of column {int(bad[0])} is {float(imp[bad[0]])}; "
                      "importances must be finite and >= 0")
    return imp


def _row_weights(w: np.ndarray, imp: np.ndarray) -> np.ndarray:
    """llama.cpp's per-element weights for the 32-element schemes under an
    importance vector: imp[c] * sqrt(sigma2 + x²), sigma2 = the row's mean x²."""
    sigma2 = (qs.seqsum(w * w) / np.float32(w.shape[1])).astype(np.float32)
    return qs.importance_weights(w, imp[None, :], sigma2)


def _nearest(x: np.ndarray, scale: np.ndarray, lo: int, hi: int, offset: np.ndarray | float = 0) -> np.ndarray:
    """The code of the grid point scale * q + offset (q in lo..hi) nearest to x;
    lo's code where the scale is zero. Codes chosen so keep verify's bound."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((x - offset) / scale)
    return _codes(np.where(scale != 0, q, np.float32(lo)), lo, hi, np.int32)


def _grid_bound(x: np.ndarray, scale: np.ndarray, lo: int, hi: int, offset: np.ndarray | float,
                slack: np.ndarray | float) -> np.ndarray:
    """Per-element bound for codes that are the nearest grid point of the stored
    (scale, offset), up to ``slack`` for the f16 rounding of the values the
    codes were chosen with: the distance from x to the grid's range, plus
    half a step, plus slack."""
    a = scale * np.float32(lo) + offset
    b = scale * np.float32(hi) + offset
    outside = np.maximum(np.maximum(np.minimum(a, b) - x, x - np.maximum(a, b)), np.float32(0))
    return outside + np.float32(0.5) * np.abs(scale) * np.float32(1 + 2**-8) + slack + np.float32(2**-24)


def _f16_half_ulp(v: np.ndarray) -> np.ndarray:
    """A bound on |v32 - v16| for a value v16 that is v32 rounded to f16."""
    return np.float32(2**-11) * np.abs(v) + np.float32(2**-25)


def _value_ok(v: object, allowed: tuple) -> bool:
    """``allowed`` is either types (bool / int) or a set of literal values.
    bool is never accepted as an int (JSON true is not 1)."""
    if _is_types(allowed):
        return isinstance(v, allowed) and (type(v) is bool) == (allowed == (bool,))
    return type(v) is not bool and v in allowed


def _is_types(allowed: tuple) -> bool:
    return isinstance(allowed[0], type)


def matrix_dims(shape: list[int]) -> tuple[int, int, int]:
    """(matrices, rows, cols) of a quantized tensor's shape: [rows, cols], or
    a stack of equal matrices [experts, rows, cols] (a MoE layer's experts,
    stored one matrix after another; docs/formats/iebin.md)."""
    if len(shape) == 3:
        return shape[0], shape[1], shape[2]
    return 1, shape[0], shape[1]


class Scheme(WeightType):
    """Interface every scheme implements (matrix schemes: shape [rows, cols],
    or for the row-contiguous block schemes also [experts, rows, cols]).
    A concrete scheme is a registered weight type: ``class X(Scheme, weight_type="x")``."""

    STACKS = True  # whether a tensor may be a stack [experts, rows, cols] of matrices
    MANIFEST: ClassVar[bool] = True  # whether a q4_manifest may select it (weight_types.manifest_schemes)
    DECLARE = ("FALLBACK", "LADDER")
    # The selection a matrix gets when its rows are not whole blocks of this
    # scheme (q4-manifest, formats/q4_manifest.py), or None: nothing smaller fits.
    FALLBACK: ClassVar[dict[str, Any] | None]
    # The scheme's candidates for q4-manifest --target-bpw (convert/bpw_policy.py), or () for none.
    LADDER: ClassVar[tuple[dict[str, Any], ...]]

    def check(self, shape: list[int], p: QuantParams) -> str | None:
        """Why this tensor cannot use the scheme, or None."""
        if len(shape) != 2 and not (len(shape) == 3 and self.STACKS):
            dims = "a 2-D matrix or a 3-D stack [experts, rows, cols]" if self.STACKS else "a 2-D matrix"
            return f"{self.name} needs {dims}, tensor has shape {shape}"
        if shape[-1] % self.block_elems:
            return f"{self.name} needs cols to be a multiple of {self.block_elems}, got {shape[-1]}"
        return None

    def tensor_nbytes(self, shape: list[int], p: QuantParams) -> int:
        """Payload bytes of a tensor of this (checked) shape: its matrices one after another."""
        count, rows, cols = matrix_dims(shape)
        return count * self.nbytes(rows, cols, p)

    def quant_dict(self, cols: int, p: QuantParams) -> dict[str, Any]:
        raise NotImplementedError

    def params_from(self, quant: dict[str, Any], cols: int) -> QuantParams:
        """Parse a validated ``quant`` object."""
        raise NotImplementedError

    QUANT_KEYS: dict[str, tuple] = {}
    QUANT_OPTIONAL: dict[str, tuple] = {}  # keys a quant object may leave out

    def parse_quant(self, quant: object, shape: list[int]) -> QuantParams:
        """Validate a ``quant`` object from model.ie.json against this scheme
        and the tensor's shape; raises QuantDictError naming the key."""
        if not isinstance(quant, dict):
            raise QuantDictError("", f"must be an object, got {quant!r}")
        for key, allowed in self.QUANT_KEYS.items():
            if key not in quant:
                raise QuantDictError(key, f"missing key {key!r}")
            if not _value_ok(quant[key], allowed):
                raise QuantDictError(key, f"invalid value {quant[key]!r}", () if _is_types(allowed) else allowed)
        for key, allowed in self.QUANT_OPTIONAL.items():
            if key in quant and not _value_ok(quant[key], allowed):
                raise QuantDictError(key, f"invalid value {quant[key]!r}")
        extra = sorted(set(quant) - set(self.QUANT_KEYS) - set(self.QUANT_OPTIONAL))
        if extra:
            raise QuantDictError(extra[0], f"unknown key {extra[0]!r}")
        if quant["scheme"] != self.name:
            raise QuantDictError("scheme", f"{quant['scheme']!r} does not match dtype {self.name!r}")
        cols = shape[-1] if len(shape) in (2, 3) else 0
        p = self.params_from(quant, cols)
        why = self.check(shape, p)
        if why:
            raise QuantDictError("", why)
        return p

    def quantize_rows(self, w: np.ndarray, p: QuantParams, name: str = "tensor",
                      importance: np.ndarray | None = None) -> "QuantizedRows":
        """Rows [n, cols] -> payload. ``importance``: the column means of x²
        an importance matrix holds for this matrix's input ([cols], finite,
        >= 0); the scale/min search then minimises the error weighted by it."""
        raise NotImplementedError

    def dequantize(self, raw: np.ndarray, rows: int, cols: int, p: QuantParams) -> np.ndarray:
        raise NotImplementedError

    def error_bound(self, w: np.ndarray, raw: np.ndarray, p: QuantParams) -> np.ndarray:
        """Per-element bound on |w - dequantize(quantize(w))| (docs/formats/quant.md)."""
        raise NotImplementedError

    def quantize(self, w: np.ndarray, p: QuantParams, name: str = "tensor",
                 importance: np.ndarray | None = None) -> np.ndarray:
        """Whole tensor -> payload bytes (uint8)."""
        return np.concatenate(list(self.stream([w], p, w.shape[0], name, importance)))

    def dequantize_rows(self, qr: "QuantizedRows", cols: int, p: QuantParams) -> np.ndarray:
        """The float32 rows [n, cols] one quantize_rows result stands for."""
        return self.dequantize(qr.rows, qr.rows.shape[0], cols, p)

    def block_width(self, cols: int, p: QuantParams) -> int:
        """Columns one scale (set) covers: quantizing column blocks of this
        width one at a time gives a row's bytes block by block."""
        return self.block_elems

    def payload(self, qr: "QuantizedRows") -> list[np.ndarray]:
        """The tensor's bytes, in file order, from one quantize_rows result of all its rows."""
        return [qr.rows.reshape(-1)]

    def measured_rows(self, w: np.ndarray, p: QuantParams, name: str, importance: np.ndarray | None,
                      error: QuantError | None) -> "QuantizedRows":
        """quantize_rows, its predicted loss added to ``error`` (when given)."""
        qr, e = self._measured(w, p, name, importance, error is not None)
        if error is not None:
            error.merge(e)
        return qr

    def _measured(self, w: np.ndarray, p: QuantParams, name: str, importance: np.ndarray | None,
                  measure: bool) -> tuple["QuantizedRows", QuantError | None]:
        qr = self.quantize_rows(w, p, name, importance)
        return qr, QuantError.between(w, self.dequantize_rows(qr, w.shape[1], p), importance) if measure else None

    def measured_pieces(self, row_chunks, p: QuantParams, name: str, importance: np.ndarray | None,
                        error: QuantError | None) -> Iterator["QuantizedRows"]:
        """measured_rows of row pieces of the chunks (PIECE_ELEMS elements or
        one row), in row order, quantized on worker threads
        (formats/workers.py). Every scheme here is row-local, so the pieces'
        rows are the chunks' rows; their losses are merged in row order, and
        a non-finite value is reported at its row of the whole matrix."""
        for qr, e in map_row_pieces(lambda w: self._measured(w, p, name, importance, error is not None), row_chunks):
            if error is not None:
                error.merge(e)
            yield qr

    def stream(self, row_chunks, p: QuantParams, rows: int, name: str,
               importance: np.ndarray | None = None, error: QuantError | None = None) -> Iterator[np.ndarray]:
        """Quantize an iterable of row chunks, yielding payload pieces in file order
        (and adding each chunk's predicted loss to ``error``).
        Block schemes are row-contiguous, so each piece's payload goes straight out."""
        for qr in self.measured_pieces(row_chunks, p, name, importance, error):
            yield from self.payload(qr)


def map_row_pieces(fn: Any, row_chunks: Any, piece_elems: int | None = PIECE_ELEMS) -> Iterator[Any]:
    """fn(rows) of each piece of the row chunks (``piece_elems`` elements or
    one row; None: the chunks as they come), in row order, on worker threads
    (formats/workers.py); a non-finite value is reported at its row of the
    whole matrix. Every scheme here is row-local, so the pieces' results
    stack into the matrix's."""
    def pieces() -> Iterator[tuple[int, np.ndarray]]:
        row0 = 0
        for w in row_chunks:
            step = w.shape[0] if piece_elems is None else max(1, piece_elems // max(w.shape[1], 1))
            for a in range(0, w.shape[0], step):
                yield row0 + a, w[a:a + step]
            row0 += w.shape[0]

    def call(piece: tuple[int, np.ndarray]) -> Any:
        row0, w = piece
        try:
            return fn(w)
        except NonFiniteError as e:
            raise e.moved(row0) from None

    return ordered_map(call, pieces())


@dataclass
class QuantizedRows:
    rows: np.ndarray  # per-row payload, uint8 [n, row_bytes] (block schemes), or qs plane (int4w)
    scales: np.ndarray | None = None  # int4w scales [n, G] (already in scale dtype)
    mins: np.ndarray | None = None

    @staticmethod
    def _joined(parts: list["QuantizedRows"], axis: int) -> "QuantizedRows":
        def cat(xs):
            return None if xs[0] is None else np.concatenate(xs, axis=axis)
        return QuantizedRows(cat([q.rows for q in parts]), cat([q.scales for q in parts]), cat([q.mins for q in parts]))

    @staticmethod
    def hstack(parts: list["QuantizedRows"]) -> "QuantizedRows":
        """Column blocks of the same rows, quantized one at a time (every
        layout here is row-local: a row's bytes are its blocks' in order)."""
        return QuantizedRows._joined(parts, 1)

    @staticmethod
    def vstack(parts: list["QuantizedRows"]) -> "QuantizedRows":
        """Row blocks of the same columns, quantized one after another."""
        return QuantizedRows._joined(parts, 0)


class _Block(Scheme):
    """llama.cpp block formats: rows of whole blocks (block_elems each)."""

    F16_FIELDS: tuple[tuple[str, int], ...] = (("d", 0),)  # (name, byte offset) of each block's f16 scales
    E8M0_FIELDS: tuple[tuple[str, int], ...] = ()  # (name, byte offset) of each block's E8M0 scale bytes
    UE4M3_FIELDS: tuple[tuple[str, int], ...] = ()  # (name, byte offset) of each block's UE4M3 scale bytes

    @property
    def QUANT_KEYS(self):  # noqa: N802 - same role as the class attribute
        return {"scheme": (self.name,), "block_size": (self.block_elems,)}

    def quant_dict(self, cols: int, p: QuantParams) -> dict[str, Any]:
        return {"scheme": self.name, "block_size": self.block_elems}

    def params_from(self, quant: dict[str, Any], cols: int) -> QuantParams:
        return QuantParams(self.name)

    def _blocks(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w, dtype=np.float32).reshape(-1, self.block_elems)

    def _raw_blocks(self, raw: np.ndarray) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.block_bytes)

    def quantize_rows(self, w, p, name="tensor", importance=None):
        _finite_or_raise(w, name)
        rows = w.shape[0]
        imp = _checked_importance(importance, w.shape[1], name)
        wts = None if imp is None else self._weights(np.asarray(w, np.float32), imp)
        if wts is None:
            return QuantizedRows(self._quantize_blocks(self._blocks(w), name).reshape(rows, -1))
        return QuantizedRows(self._quantize_weighted(self._blocks(w), self._blocks(wts), name).reshape(rows, -1))

    def _weights(self, w: np.ndarray, imp: np.ndarray) -> np.ndarray | None:
        """Per-element weights [rows, cols] the weighted search minimises under
        an importance vector (None: the scheme quantizes as without one)."""
        return _row_weights(w, imp)

    def _quantize_weighted(self, b, wts, name):
        """Blocks under per-element weights (llama.cpp's search for the scale,
        then every code the nearest one for the scale as stored)."""
        raise NotImplementedError

    def dequantize(self, raw, rows, cols, p):
        return self._dequantize_blocks(self._raw_blocks(raw)).reshape(rows, cols)

    @staticmethod
    def _f16(raw: np.ndarray, at: int) -> np.ndarray:
        return raw[:, at:at + 2].copy().view(np.float16).astype(np.float32)

    def f16_field(self, raw: np.ndarray, f: int) -> np.ndarray:
        """F16_FIELDS[f] of blocks raw [n, block_bytes] as float16 [n] (a
        type whose field is not two whole bytes, IQ1_M's d, reads it its own way)."""
        off = self.F16_FIELDS[f][1]
        return raw[:, off:off + 2].copy().view(np.float16)[:, 0]

    def set_f16_field(self, out: np.ndarray, f: int, v: np.ndarray) -> None:
        """Stores float16 values v [n] as F16_FIELDS[f] of blocks out."""
        off = self.F16_FIELDS[f][1]
        out[:, off:off + 2] = np.asarray(v, np.float16)[:, None].view(np.uint8)

    def error_bound(self, w, raw, p):
        blocks = self._blocks(w)
        return self._bound(blocks, self._raw_blocks(raw)).reshape(w.shape)

    def sub_scale_fields(self, raw: np.ndarray) -> SubScales | None:
        """The sub-block scales of blocks ``raw`` [n, block_bytes] (None: the
        type has none; its f16 fields are gptq.refit_scales' alone)."""
        return None

    # The types with sub-scales: per field of SubScales, the range of its integers (lo, hi, odd: fit_levels),
    # each field's super-scale the f16 at its F16_FIELDS entry, the integers stored by _put_sub_levels.
    SUB_LEVELS: tuple[tuple[int, int, bool], ...] = ()

    def with_sub_scales(self, raw: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``raw`` with its sub-scale fields set to ``values`` [n, fields,
        sub-blocks] as nearly as the type stores them (per field, fit_levels'
        super-scale and integers), the codes as they are."""
        if not self.SUB_LEVELS:
            raise NotImplementedError(f"{self.name} has no sub-scales")
        out = raw.copy()
        fits = [fit_levels(values[:, f], lo, hi, odd) for f, (lo, hi, odd) in enumerate(self.SUB_LEVELS)]
        for f, (_field, (d, _l)) in enumerate(zip(self.F16_FIELDS, fits, strict=True)):
            self.set_f16_field(out, f, d.astype(np.float16))
        self._put_sub_levels(out, *(levels for _d, levels in fits))
        return out

    def _put_sub_levels(self, out: np.ndarray, *levels: np.ndarray) -> None:
        """Stores each field's integers [n, sub-blocks] in blocks ``out``."""
        raise NotImplementedError


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    """[n, 32] codes 0..31 -> [n, 20]: qh (u32 LE, bit j = bit 4 of element j),
    then the low nibbles as _pack_nibbles stores them (q5_0 / q5_1)."""
    qh = np.zeros(q.shape[0], np.uint32)
    for j in range(BLOCK):
        qh |= ((q[:, j] >> 4) & 1).astype(np.uint32) << np.uint32(j)
    return np.concatenate([qh.astype("<u4")[:, None].view(np.uint8), _pack_nibbles(q & 0xF)], axis=1)


def _unpack_fifth_bits(p: np.ndarray) -> np.ndarray:
    """Inverse of _pack_fifth_bits."""
    qh = p[:, :4].copy().view("<u4")
    hi = ((qh >> np.arange(BLOCK, dtype=np.uint32)) & 1).astype(np.uint8)
    return _unpack_nibbles(p[:, 4:]) | (hi << 4)


def _pack_pairs(q: np.ndarray) -> np.ndarray:
    """Bit pairs [n, 256] (0..3) -> [n, 64], ggml's layout for q2_k's codes,
    q3_k's low code bits and q6_k's high ones: byte 32 h + l holds elements
    128 h + l, + 32, + 64, + 96 at bits 0, 2, 4, 6."""
    p = q.reshape(-1, 2, 4, 32)  # [half, quarter, l]
    return (p[:, :, 0] | (p[:, :, 1] << 2) | (p[:, :, 2] << 4) | (p[:, :, 3] << 6)).reshape(-1, 64)


def _unpack_pairs(p: np.ndarray) -> np.ndarray:
    """Inverse of _pack_pairs: [n, 64] -> [n, 256]."""
    q = p.reshape(-1, 2, 1, 32)  # [half, l]
    return ((q >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3).reshape(-1, 256)


class Q4_0(_Block, weight_type="q4_0"):
    """llama.cpp's Q4_0: per block d (f16) and 32 nibbles, w = d × (q − 8).
    Q5_0 is the same scheme with 5-bit codes, so it subclasses this one."""

    GGUF, GGUF_FILE_TYPE = "Q4_0", "MOSTLY_Q4_0"
    FALLBACK, LADDER = None, ({"scheme": "q4_0"},)

    ZERO = 8  # codes 0 .. 2 ZERO - 1, w = d × (q − ZERO)
    _pack = staticmethod(_pack_nibbles)  # codes [n, 32] -> the bytes after the header, and back
    _unpack = staticmethod(_unpack_nibbles)

    def _exact_d(self, b):
        m = np.take_along_axis(b, np.abs(b).argmax(axis=1, keepdims=True), axis=1)
        return (m / np.float32(-self.ZERO)).astype(np.float32)

    def _quantize_blocks(self, b, name):
        d = self._exact_d(b)
        _check_f16_range(d, name)
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.trunc(b * _recip(d) + np.float32(self.ZERO + 0.5))
        q = _codes(v, 0, 2 * self.ZERO - 1, np.uint8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), self._pack(q)], axis=1)

    def _quantize_weighted(self, b, wts, name):
        d = qs.qx(b, wts, self.ZERO)  # make_qx_quants, as llama.cpp's q4_0 / q5_0 with an imatrix
        _check_f16_range(d, name)
        d16 = d.astype(np.float16)
        q = _nearest(b, d16.astype(np.float32)[:, None], -self.ZERO, self.ZERO - 1) + self.ZERO
        return np.concatenate([d16[:, None].view(np.uint8), self._pack(q.astype(np.uint8))], axis=1)

    def _dequantize_blocks(self, raw):
        q = self._unpack(raw[:, 2:]).astype(np.float32) - np.float32(self.ZERO)
        return self._f16(raw, 0) * q

    def _bound(self, b, raw):
        # Without weights the codes are chosen against the unrounded d (the side
        # opposite the largest magnitude can clamp by one step: outside the grid).
        d16 = self._f16(raw, 0)
        return _grid_bound(b, d16, -self.ZERO, self.ZERO - 1, np.float32(0), self.ZERO * _f16_half_ulp(d16))


class Q5_0(Q4_0, weight_type="q5_0"):
    """llama.cpp's Q5_0: per block d (f16), the codes' fifth bits (u32) and
    their low nibbles; w = d × (q − 16)."""

    GGUF, GGUF_FILE_TYPE = "Q5_0", "MOSTLY_Q5_0"
    FALLBACK, LADDER = None, ({"scheme": "q5_0"},)

    ZERO = 16
    _pack = staticmethod(_pack_fifth_bits)
    _unpack = staticmethod(_unpack_fifth_bits)


class Q4_1(_Block, weight_type="q4_1"):
    """llama.cpp's Q4_1: per block d, m (f16) and 32 nibbles, w = d × q + m.
    Q5_1 is the same scheme with 5-bit codes, so it subclasses this one."""

    GGUF, GGUF_FILE_TYPE = "Q4_1", "MOSTLY_Q4_1"
    FALLBACK, LADDER = None, ({"scheme": "q4_1"},)

    F16_FIELDS = (("d", 0), ("m", 2))
    NMAX = 15

    _pack = staticmethod(_pack_nibbles)
    _unpack = staticmethod(_unpack_nibbles)

    def _exact_d(self, b):
        return ((b.max(axis=1, keepdims=True) - b.min(axis=1, keepdims=True)) / np.float32(self.NMAX)).astype(np.float32)

    def _quantize_blocks(self, b, name):
        mn = b.min(axis=1, keepdims=True)
        d = self._exact_d(b)
        _check_f16_range(d, name)
        _check_f16_range(mn, name, "block minimum")
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.trunc((b - mn) * _recip(d) + np.float32(0.5))
        q = _codes(v, 0, self.NMAX, np.uint8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), mn.astype(np.float16).view(np.uint8),
                               self._pack(q)], axis=1)

    def _quantize_weighted(self, b, wts, name):
        d, the_min, _ = qs.qkx(b, wts, self.NMAX, -0.9, 0.05, 36)  # make_qkx3_quants, as llama.cpp's q4_1 / q5_1
        _check_f16_range(d, name)
        _check_f16_range(the_min, name, "block minimum")
        d16, m16 = d.astype(np.float16), (-the_min).astype(np.float16)
        q = _nearest(b, d16.astype(np.float32)[:, None], 0, self.NMAX, m16.astype(np.float32)[:, None])
        return np.concatenate([d16[:, None].view(np.uint8), m16[:, None].view(np.uint8),
                               self._pack(q.astype(np.uint8))], axis=1)

    def _dequantize_blocks(self, raw):
        return self._f16(raw, 0) * self._unpack(raw[:, 4:]).astype(np.float32) + self._f16(raw, 2)

    def _bound(self, b, raw):
        d16, m16 = self._f16(raw, 0), self._f16(raw, 2)
        return _grid_bound(b, d16, 0, self.NMAX, m16, self.NMAX * _f16_half_ulp(d16) + _f16_half_ulp(m16))


class Q5_1(Q4_1, weight_type="q5_1"):
    """llama.cpp's Q5_1: per block d, m (f16), the codes' fifth bits (u32)
    and their low nibbles; w = d × q + m, q 0..31."""

    GGUF, GGUF_FILE_TYPE = "Q5_1", "MOSTLY_Q5_1"
    FALLBACK, LADDER = None, ({"scheme": "q5_1"},)

    NMAX = 31
    _pack = staticmethod(_pack_fifth_bits)
    _unpack = staticmethod(_unpack_fifth_bits)


class Q8_0(_Block, weight_type="q8_0"):
    """llama.cpp's Q8_0: per block d (f16) and 32 int8, w = d × q."""

    GGUF, GGUF_FILE_TYPE = "Q8_0", "MOSTLY_Q8_0"
    FALLBACK, LADDER = None, ({"scheme": "q8_0"},)

    @staticmethod
    def _exact_d(b):
        return (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)

    def _quantize_blocks(self, b, name):
        d = self._exact_d(b)
        _check_f16_range(d, name)
        with np.errstate(invalid="ignore", over="ignore"):
            v = b * _recip(d)
            v = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))  # half away from zero
        q = _codes(v, -128, 127, np.int8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)

    def _dequantize_blocks(self, raw):
        return self._f16(raw, 0) * raw[:, 2:].copy().view(np.int8).astype(np.float32)

    def _weights(self, w, imp):
        return None  # as llama.cpp: at 8 bits the weights would not change the grid's choice

    def _bound(self, b, raw):
        d16 = self._f16(raw, 0)
        return _grid_bound(b, d16, -128, 127, np.float32(0), 127 * _f16_half_ulp(d16))


class Q1_0(_Block, weight_type="q1_0"):
    """llama.cpp's Q1_0 (the layout of PrismML's 1-bit Bonsai models): per
    128 weights d (f16) and 128 sign bits, bit j of byte k holding element
    8k + j; w = +d where the bit is set, −d where it is clear.

    Without an importance matrix the bytes are ggml's quantize_row_q1_0_ref:
    d the block's mean |x| summed in float32 in element order (for the
    signs, the least-squares scale), a bit set where x ≥ 0. With one, d is
    the importance-weighted mean |x|, the scale for the same signs that
    minimises the loss the importance matrix predicts (Σ imp (w − ŵ)²; not
    llama.cpp's imp × sqrt(σ² + x²) weights, which gave a 4% larger predicted
    loss here). One bit per weight keeps nothing but its sign: the type
    is for models trained for it (Bonsai's); a manifest may select it, the
    --target-bpw ladder never does, and a row that is not whole blocks has no
    smaller block to fall back to (llama.cpp has none either)."""

    GGUF, GGUF_FILE_TYPE = "Q1_0", "MOSTLY_Q1_0"
    FALLBACK, LADDER = None, ()

    @staticmethod
    def _mean_abs(b: np.ndarray) -> np.ndarray:
        """ggml's d: the blocks' mean |x|, summed in float32 element by element (which cumsum keeps and a pairwise
        sum would not)."""
        return np.cumsum(np.abs(b), axis=1, dtype=np.float32)[:, -1] / np.float32(b.shape[1])

    @staticmethod
    def _signs_under(b: np.ndarray, d: np.ndarray, name: str) -> np.ndarray:
        """Blocks [n, 128] under float32 d [n] -> [n, 18]: d as f16, then the signs (set where x ≥ 0)."""
        _check_f16_range(d[:, None], name)
        bits = np.packbits(b >= 0, axis=1, bitorder="little")
        return np.concatenate([d.astype(np.float16)[:, None].view(np.uint8), bits], axis=1)

    def _quantize_blocks(self, b, name):
        return self._signs_under(b, self._mean_abs(b), name)

    def _weights(self, w, imp):
        return np.broadcast_to(imp[None, :], w.shape)

    def _quantize_weighted(self, b, wts, name):
        w = wts.astype(np.float64)
        total = w.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            dw = (w * np.abs(b)).sum(axis=1) / total
        # (a block the importance matrix gives no weight: ggml's d)
        return self._signs_under(b, np.where(total > 0, dw, self._mean_abs(b)).astype(np.float32), name)

    def _dequantize_blocks(self, raw):
        signs = np.unpackbits(raw[:, 2:], axis=1, bitorder="little").astype(np.float32) * 2 - 1
        return self._f16(raw, 0) * signs

    def _bound(self, b, raw):
        # the sign is kept, so the error is ||x| − d| exactly (d where x is 0)
        return np.abs(np.abs(b) - self._f16(raw, 0)) * np.float32(1 + 2**-20)


def _coded_by_max(v: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """The k-quants' _ref coding of a super-block's sub-scales (or sub-mins),
    v [n, k] >= 0: each against the largest, codes min(nearest(nmax / max ×
    v) as a byte, nmax) under the super-scale max / nmax (all zero where the
    largest is not positive), as quantize_row_q{2,4,5}_K_ref do."""
    top = np.maximum(v.max(axis=1), np.float32(0))
    with np.errstate(all="ignore"):  # subnormal maxima: nmax / max overflows, as in C
        inv = np.where(top > 0, np.float32(nmax) / top, np.float32(0)).astype(np.float32)
        codes = np.minimum(qs.nearest_int(inv[:, None] * v) & 0xFF, nmax).astype(np.uint8)
    return (top / np.float32(nmax)).astype(np.float32), codes


class SubScales(NamedTuple):
    """A super-block type's sub-block scales (and mins), as
    gptq.refit_sub_scales refits them: each sub-block's dequantized values
    are Σ_f values[f] × basis[f], with the codes held."""

    width: int  # elements per sub-block
    basis: np.ndarray  # [n, fields, sub-blocks, width]: what each field multiplies (the codes' values; −1 for a min)
    values: np.ndarray  # [n, fields, sub-blocks]: the fields as stored (float32 products of the super-scale and an integer)


FIT_FACTORS = np.linspace(0.8, 1.25, 19, dtype=np.float32)  # fit_levels: super-scales tried around the largest's


def fit_levels(x: np.ndarray, lo: int, hi: int, odd: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sub-scales x [n, k] (any floats) as a super-scale d [n] (f16-exact
    float32) times integers l [n, k] in lo..hi (odd: the odd ones only, as
    iq3_s's 1 + 2 s), of least Σ (x − d l)² among d = the largest |x| over
    lo or hi (those of its sign) times FIT_FACTORS. Codes that a type keeps
    fixed make the scales' best values no longer the quantizer's, so the
    re-coding searches a little around the extreme rather than pinning it."""
    x = np.asarray(x, np.float32)
    top = x[np.arange(len(x)), np.abs(x).argmax(axis=1)] if x.size else np.zeros(len(x), np.float32)
    best = (np.full(len(x), np.inf, np.float32), np.zeros(len(x), np.float32), np.zeros(x.shape, np.int32))
    for end in {e for e in (lo, hi) if e != 0}:
        for f in FIT_FACTORS:
            with np.errstate(all="ignore"):
                d = np.clip(top / np.float32(end) * f, -65504, 65504).astype(np.float16).astype(np.float32)
                r = np.where(d[:, None] != 0, x / d[:, None], np.float32(0))
            r = np.nan_to_num(r, nan=0.0, posinf=hi, neginf=lo)
            l = 2 * np.rint((r - 1) / 2) + 1 if odd else np.rint(r)
            l = np.clip(l, lo, hi).astype(np.int32)
            e = np.square(x - d[:, None] * l).sum(axis=1)
            take = e < best[0]
            best = (np.where(take, e, best[0]), np.where(take, d, best[1]), np.where(take[:, None], l, best[2]))
    return best[1], best[2]


class _ScaledValues:
    """A mixin for the types whose element is its sub-block's scale times a
    value its code names (q6_k, q3_k: the code less an offset; iq4_xs,
    iq4_xsh: a grid value; iq3_s: a signed codebook value): given
    ``sub_scales`` and ``_values`` [n, sub-blocks, SUB], dequantization and
    the SubScales gptq refits follow from the two."""

    def _dequantize_blocks(self, raw):
        return (self.sub_scales(raw)[..., None] * self._values(raw)).reshape(raw.shape[0], -1)

    def sub_scale_fields(self, raw):
        return SubScales(self.SUB, self._values(raw)[:, None], self.sub_scales(raw)[:, None])


class _KQuant(_Block):
    """The k-quants whose one super-block quantizer takes the importance
    matrix's column means as they are (None without one) and adds its own
    σ² per super-block (q4_k, q5_k, q3_k, q2_k): ``_quantize_super``."""

    def _weights(self, w, imp):
        return np.broadcast_to(imp, w.shape)

    def _quantize_blocks(self, b, name):
        return self._quantize_super(b, None, name)

    def _quantize_weighted(self, b, wts, name):
        return self._quantize_super(b, wts, name)

    def _quantize_super(self, b, qw, name):
        raise NotImplementedError


class Q4_K(_KQuant, weight_type="q4_k"):
    """llama.cpp's Q4_K: 256-element super-blocks of eight 32-element
    sub-blocks, w = d × sc_j × q − dmin × m_j with 6-bit sub-scales sc_j and
    sub-mins m_j (packed in 12 bytes) under f16 super-scales d and dmin.

    Without importance weights this is ggml's quantize_row_q4_K_ref, byte for
    byte; with them (an importance matrix's column means of x², per element)
    it is quantize_row_q4_K_impl, which refits the sub-scales and mins for the
    weighted error too (formats/quant_search.py). Q5_K is the same scheme
    with one more bit per code, so it subclasses this one."""

    GGUF, GGUF_FILE_TYPE = "Q4_K", "MOSTLY_Q4_K_M"
    # Rows that are not whole 256-element super-blocks (SmolLM2's 576
    # columns): int4w with a scale and a minimum per 64 elements, its 4.5
    # bits per weight and its affine grid (llama.cpp falls back to q5_0).
    FALLBACK = {"scheme": "int4w", "group_size": 64, "symmetric": False, "scale_dtype": "f16"}
    LADDER = ({"scheme": "q4_k"},)

    SUB = 32  # elements per sub-block
    NMAX = 15  # codes 0..NMAX
    REF_SEARCH = (-1.0, 0.1, 20)  # make_qkx2_quants' rmin, rdelta, nstep without importance weights
    F16_FIELDS = (("d", 0), ("dmin", 2))

    def _quantize_super(self, b, qw, name):
        """quantize_row_q{4,5}_K_ref (qw None) or quantize_row_q{4,5}_K_impl
        (qw: the importance of every element) over super-blocks b [n, 256]."""
        n = b.shape[0]
        sub = b.reshape(n * 8, self.SUB)
        if qw is None:  # quantize_row_q4_K_ref
            av = np.sqrt(qs.seqsum(sub * sub) / np.float32(32)).astype(np.float32)
            wts = (av[:, None] + np.abs(sub)).astype(np.float32)
            scales, mins, codes = qs.qkx(sub, wts, self.NMAX, *self.REF_SEARCH)
            d, ls = _coded_by_max(scales.reshape(n, 8), 63)
            dmin, lm = _coded_by_max(mins.reshape(n, 8), 63)
        else:  # quantize_row_q4_K_impl
            sigma2 = (np.float32(2) * qs.seqsum(b * b) / np.float32(256)).astype(np.float32)
            wts = qs.importance_weights(b, qw, sigma2).reshape(n * 8, self.SUB)
            sw = qs.seqsum(wts).reshape(n, 8)
            scales, mins, codes = qs.qkx(sub, wts, self.NMAX, -0.9, 0.05, 36)
            d, ls = qs.qp(scales.reshape(n, 8), sw, 63)
            dmin, lm = qs.qp(mins.reshape(n, 8), sw, 63)
        _check_f16_range(d, name)
        _check_f16_range(dmin, name, "super-block minimum scale")
        d16 = d.astype(np.float16)
        m16 = dmin.astype(np.float16)
        # The codes again, against the sub-scales as stored; a sub-block
        # whose scale stores as zero keeps the search's codes (as ggml does).
        sd = (d16.astype(np.float32)[:, None] * ls.astype(np.float32)).reshape(-1, 1)
        sm = (m16.astype(np.float32)[:, None] * lm.astype(np.float32)).reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            again = np.clip(qs.nearest_int((sub + sm) / sd), 0, self.NMAX).astype(np.uint8)
        codes = np.where(sd != 0, again, codes).reshape(n, 8, self.SUB)
        return np.concatenate([d16.reshape(n, 1).view(np.uint8), m16.reshape(n, 1).view(np.uint8),
                               self._pack_sub(ls, lm), self._pack_codes(codes)], axis=1)

    @staticmethod
    def _pack_sub(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
        """6-bit sub-scales and sub-mins [n, 8] (0..63) -> their 12 bytes."""
        ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
        packed = np.empty((ls.shape[0], 12), np.uint8)
        packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
        packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
        packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
        return packed

    @staticmethod
    def _pack_codes(codes: np.ndarray) -> np.ndarray:
        """Codes [n, 8, 32] -> the code bytes [n, 128]: chunk c's low nibbles
        are sub-block 2c, its high nibbles 2c + 1."""
        c = codes.reshape(-1, 4, 2, 32)
        return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128)

    @staticmethod
    def sub_params(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per sub-block (scale, min) as float32 [n, 8]: w = scale × q − min,
        each the f32 product of the f16 super-scale and the 6-bit code, as
        ggml's dequantize_row_q4_K forms them (and q5_K's, the same bytes)."""
        d, dmin = _Block._f16(raw, 0), _Block._f16(raw, 2)
        sc = raw[:, 4:16]
        ls = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
        lm = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
        return (d * ls.astype(np.float32)).astype(np.float32), (dmin * lm.astype(np.float32)).astype(np.float32)

    @staticmethod
    def _sub_codes(raw: np.ndarray) -> np.ndarray:
        """The codes as [n, 8 sub-blocks, 32] (the inverse of _pack_codes)."""
        q = raw[:, 16:].reshape(-1, 4, 1, 32)
        return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(-1, 8, 32)

    def _dequantize_blocks(self, raw):
        s, m = self.sub_params(raw)
        return (s[..., None] * self._sub_codes(raw).astype(np.float32) - m[..., None]).reshape(-1, 256)

    def sub_scale_fields(self, raw):
        codes = self._sub_codes(raw).astype(np.float32)
        return SubScales(self.SUB, np.stack([codes, np.full_like(codes, -1)], axis=1), np.stack(self.sub_params(raw), 1))

    SUB_LEVELS = ((0, 63, False), (0, 63, False))  # the 6-bit sub-scales, the 6-bit sub-mins

    def _put_sub_levels(self, out, ls, lm):
        out[:, 4:16] = self._pack_sub(ls, lm)

    def _bound(self, b, raw):
        # The codes are chosen for the sub-scale and sub-min as stored; a 6-bit
        # sub-scale rounded down can leave values outside the grid.
        s, m = self.sub_params(raw)
        x = b.reshape(-1, 8, 32)
        ulp = np.float32(2**-21) * (np.abs(x) + m[..., None] + np.float32(self.NMAX) * s[..., None])  # (x + dm) / d in f32
        return _grid_bound(x, s[..., None], 0, self.NMAX, -m[..., None], ulp)


class Q5_K(Q4_K, weight_type="q5_k"):
    """llama.cpp's Q5_K: Q4_K's super-block (f16 d and dmin, the same 12
    bytes of 6-bit sub-scales and sub-mins) with 5-bit codes 0..31: their
    low nibbles as Q4_K stores its codes, their fifth bits in 32 bytes
    before them (bit j of byte e: element e of sub-block j). ggml's
    quantize_row_q5_K_ref searches with make_qkx2_quants(-0.5, 0.1, 15)."""

    GGUF, GGUF_FILE_TYPE = "Q5_K", "MOSTLY_Q5_K_M"
    FALLBACK = {"scheme": "q8_0"}  # more bits rather than fewer (llama.cpp: q5_1)
    LADDER = ({"scheme": "q5_k"},)

    NMAX = 31
    REF_SEARCH = (-0.5, 0.1, 15)

    @staticmethod
    def _pack_codes(codes):
        """Codes [n, 8, 32] -> qh [n, 32] then the low nibbles [n, 128]."""
        hi = (codes >> 4).astype(np.uint8)
        qh = np.zeros((codes.shape[0], 32), np.uint8)
        for j in range(8):
            qh |= hi[:, j] << j
        return np.concatenate([qh, Q4_K._pack_codes(codes & 0xF)], axis=1)

    @staticmethod
    def _sub_codes(raw):
        qh = raw[:, 16:48]
        hi = np.stack([(qh >> j) & 1 for j in range(8)], axis=1)  # [n, 8, 32]
        q = raw[:, 48:].reshape(-1, 4, 1, 32)
        return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(-1, 8, 32) | (hi << 4)


class Q6_K(_ScaledValues, _Block, weight_type="q6_k"):
    """llama.cpp's Q6_K: 256-element super-blocks of sixteen 16-element
    sub-blocks, w = (d × sc_j) × (q − 32) with 6-bit codes q, int8 sub-scales
    sc_j and one f16 d (stored last). A 128-element half keeps its codes'
    low nibbles in 64 bytes (byte l: elements l and l + 64 of the half; byte
    32 + l: l + 32 and l + 96) and their high bit pairs in 32 (byte l: the
    pairs of l, l + 32, l + 64, l + 96 at bits 0, 2, 4, 6).

    ggml's quantize_row_q6_K_ref / _impl, byte for byte: make_qx_quants per
    sub-block (weights x² without an importance matrix, the importances
    themselves with one), the sub-scales coded against the largest as
    round(-128 × s_j / s_max), then every code the nearest one for
    d × sc_j as stored (a sub-block whose scale stores as zero keeps the
    search's codes)."""

    GGUF, GGUF_FILE_TYPE = "Q6_K", "MOSTLY_Q6_K"
    FALLBACK = {"scheme": "q8_0"}  # as llama.cpp
    LADDER = ({"scheme": "q6_k"},)

    SUB = 16
    F16_FIELDS = (("d", 208),)

    def _weights(self, w, imp):
        return np.broadcast_to(imp, w.shape)  # make_qx_quants takes the importances as they are

    def _quantize_blocks(self, b, name):
        return self._quantize_super(b, (b * b).astype(np.float32), name)

    def _quantize_weighted(self, b, wts, name):
        return self._quantize_super(b, wts, name)

    def _quantize_super(self, b, wts, name):
        n = b.shape[0]
        sub = b.reshape(n * 16, self.SUB)
        scales, codes = qs.qx(sub, wts.reshape(n * 16, self.SUB), 32, with_codes=True)
        scales = scales.reshape(n, 16)
        top, zero = qs.signed_max(scales)  # zero: the super-block stores as all zero bytes
        with np.errstate(all="ignore"):
            iscale = np.where(zero, np.float32(0), np.float32(-128) / top).astype(np.float32)
            d = np.where(zero, np.float32(0), np.float32(1) / iscale).astype(np.float32)
        _check_f16_range(d, name)
        d16 = d.astype(np.float16)
        sc = np.minimum(qs.nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
        step = (d16.astype(np.float32)[:, None] * sc.astype(np.float32)).reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            again = np.clip(qs.nearest_int(sub / step), -32, 31) + 32
        codes = np.where(step != 0, again, codes).reshape(n, 16 * self.SUB).astype(np.uint8)
        codes[zero] = 0  # ggml zeroes such a block (its sub-scales are 0 already: iscale is)
        lo = (codes & 0xF).reshape(n, 2, 4, 32)  # [half, quarter, l]
        ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
        return np.concatenate([ql.reshape(n, 128), _pack_pairs(codes >> 4), sc.view(np.uint8),
                               d16[:, None].view(np.uint8)], axis=1)

    @staticmethod
    def sub_scales(raw: np.ndarray) -> np.ndarray:
        """Per sub-block scale as float32 [n, 16]: the f32 product d × sc_j
        that ggml's dequantize_row_q6_K forms first."""
        return (_Block._f16(raw, 208) * raw[:, 192:208].view(np.int8).astype(np.float32)).astype(np.float32)

    @staticmethod
    def codes(raw: np.ndarray) -> np.ndarray:
        """The codes 0..63 of every element, [n, 256]."""
        ql = raw[:, :128].reshape(-1, 2, 2, 32)  # [half, byte group, l]
        lo = np.concatenate([ql & 0xF, ql >> 4], axis=2).reshape(-1, 256)  # quarters 0, 1, 2, 3
        return lo | (_unpack_pairs(raw[:, 128:192]) << 4)

    def _values(self, raw: np.ndarray) -> np.ndarray:
        return self.codes(raw).reshape(-1, 16, self.SUB).astype(np.float32) - np.float32(32)

    SUB_LEVELS = ((-128, 127, False),)  # int8 sub-scales

    def _put_sub_levels(self, out, sc):
        out[:, 192:208] = sc.astype(np.int8).view(np.uint8)

    def _bound(self, b, raw):
        # codes chosen for d × sc_j as stored: the nearest of the clamped grid, up to x / step's f32 rounding
        s = self.sub_scales(raw)[..., None]
        x = b.reshape(-1, 16, self.SUB)
        return _grid_bound(x, s, -32, 31, np.float32(0), np.float32(2**-21) * np.abs(x))


class Q3_K(_ScaledValues, _KQuant, weight_type="q3_k"):
    """llama.cpp's Q3_K: 256-element super-blocks of sixteen 16-element
    sub-blocks, w = (d × (l_j − 32)) × (q − 4) with 3-bit codes q, 6-bit
    sub-scales l_j and one f16 d: 3.4375 bits per weight. Byte layout: hmask
    (32 bytes; bit h of byte m: bit 2 of element 32 h + m's code), qs (64
    bytes; byte 32 h + l of half h: the low bit pairs of elements 128 h + l,
    + 32, + 64, + 96 at bits 0, 2, 4, 6), the 12 scale bytes (l_j's low
    nibble in byte j (j < 8) or the high nibble of byte j − 8; its high bit
    pair at bit 2 (j / 4) of byte 8 + j % 4), then d.

    ggml's quantize_row_q3_K_ref / _impl, byte for byte: per sub-block
    make_q3_quants (without an importance matrix) or make_qx_quants under
    imp × sqrt(σ² + x²) (with one); the sub-scales coded against the largest
    as round(−32 × s_j / s_max) (make_qx_quants over them, weighted by each
    sub-block's weight sum, with one); then every code the nearest one for
    d × (l_j − 32) as stored (a sub-block whose scale stores as zero keeps
    the search's codes)."""

    GGUF, GGUF_FILE_TYPE = "Q3_K", "MOSTLY_Q3_K_M"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp: the 4-bit grid per 32 elements
    LADDER = ({"scheme": "q3_k"},)

    SUB = 16
    F16_FIELDS = (("d", 108),)

    def _quantize_super(self, b, qw, name):
        n = b.shape[0]
        sub = b.reshape(n * 16, self.SUB)
        if qw is None:  # quantize_row_q3_K_ref
            scales, codes = qs.q3(sub, 4)
            scales = scales.reshape(n, 16)
            top, _ = qs.signed_max(scales)
            with np.errstate(all="ignore"):
                iscale = np.where(top != 0, np.float32(-32) / top, np.float32(0)).astype(np.float32)
                d = np.where(top != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
                ls = np.where(top[:, None] != 0, np.clip(qs.nearest_int(iscale[:, None] * scales), -32, 31) + 32, 0)
        else:  # quantize_row_q3_K_impl
            sigma2 = (np.float32(2) * qs.seqsum(b * b) / np.float32(256)).astype(np.float32)
            wts = qs.importance_weights(b, qw, sigma2).reshape(n * 16, self.SUB)
            scales, codes = qs.qx(sub, wts, 4, with_codes=True)
            d, ls = qs.qx(scales.reshape(n, 16), qs.seqsum(wts).reshape(n, 16), 32, with_codes=True)
        _check_f16_range(d, name)
        d16 = d.astype(np.float16)
        ls = ls.astype(np.uint8)
        step = (d16.astype(np.float32)[:, None] * (ls.astype(np.float32) - np.float32(32))).reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            again = np.clip(qs.nearest_int(sub / step), -4, 3) + 4
        codes = np.where(step != 0, again, codes).reshape(n, 256).astype(np.uint8)
        hmask = np.zeros((n, 32), np.uint8)
        for h in range(8):
            hmask |= ((codes[:, 32 * h:32 * h + 32] >> 2) & 1) << h
        return np.concatenate([hmask, _pack_pairs(codes & 3), self._pack_sub(ls), d16[:, None].view(np.uint8)], axis=1)

    @staticmethod
    def _pack_sub(ls: np.ndarray) -> np.ndarray:
        """Sub-scales l_j [n, 16] (0..63, l_j − 32 the multiplier) -> their 12 bytes."""
        ls = ls.astype(np.uint8)
        packed = np.zeros((ls.shape[0], 12), np.uint8)
        packed[:, :8] = (ls[:, :8] & 0xF) | ((ls[:, 8:] & 0xF) << 4)
        for j in range(16):
            packed[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
        return packed

    @staticmethod
    def sub_scales(raw: np.ndarray) -> np.ndarray:
        """Per sub-block scale as float32 [n, 16]: the f32 product d × (l_j −
        32) that ggml's dequantize_row_q3_K forms first."""
        sc = raw[:, 96:108].astype(np.int32)
        j = np.arange(16)
        low = (sc[:, j % 8] >> (4 * (j // 8))) & 0xF
        high = (sc[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        return (_Block._f16(raw, 108) * ((low | (high << 4)) - 32).astype(np.float32)).astype(np.float32)

    @staticmethod
    def codes(raw: np.ndarray) -> np.ndarray:
        """The codes 0..7 of every element, [n, 256] (the value is code − 4)."""
        high = (raw[:, None, :32] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [n, 8 (32-element runs), 32]
        return _unpack_pairs(raw[:, 32:96]) | (high.reshape(-1, 256) << 2)

    def _values(self, raw: np.ndarray) -> np.ndarray:
        return self.codes(raw).reshape(-1, 16, self.SUB).astype(np.float32) - np.float32(4)

    SUB_LEVELS = ((-32, 31, False),)  # the multipliers l_j - 32

    def _put_sub_levels(self, out, ls):
        out[:, 96:108] = self._pack_sub(ls + 32)

    def _bound(self, b, raw):
        # codes chosen for d × (l_j − 32) as stored: the nearest of the clamped grid, up to x / step's f32 rounding
        s = self.sub_scales(raw)[..., None]
        x = b.reshape(-1, 16, self.SUB)
        return _grid_bound(x, s, -4, 3, np.float32(0), np.float32(2**-21) * np.abs(x))


class Q2_K(_KQuant, weight_type="q2_k"):
    """llama.cpp's Q2_K: 256-element super-blocks of sixteen 16-element
    sub-blocks, w = (d × sc_j) × q − (dmin × m_j) with 2-bit codes q, 4-bit
    sub-scales sc_j and sub-mins m_j (one byte per sub-block: sc_j low, m_j
    high) under f16 super-scales d and dmin: 2.625 bits per weight. Byte
    layout: the 16 scale bytes, then qs (64 bytes; byte 32 h + l of half h:
    the codes of elements 128 h + l, + 32, + 64, + 96 at bits 0, 2, 4, 6),
    then d and dmin.

    ggml's quantize_row_q2_K_ref / _impl, byte for byte: per sub-block
    make_qkx2_quants under |x| comparing absolute errors (without an
    importance matrix) or make_qkx3_quants under imp × sqrt(σ² + x²) (with
    one); the sub-scales and sub-mins coded against their largest as
    round(15 × s_j / s_max) (make_qp_quants, weighted by each sub-block's
    weight sum, with one); then every code the nearest one for d × sc_j and
    dmin × m_j as stored (a sub-block whose scale stores as zero keeps the
    search's codes)."""

    GGUF, GGUF_FILE_TYPE = "Q2_K", "MOSTLY_Q2_K"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp
    LADDER = ({"scheme": "q2_k"},)

    SUB = 16
    F16_FIELDS = (("d", 80), ("dmin", 82))

    def _quantize_super(self, b, qw, name):
        n = b.shape[0]
        sub = b.reshape(n * 16, self.SUB)
        if qw is None:  # quantize_row_q2_K_ref
            scales, mins, codes = qs.qkx(sub, np.abs(sub), 3, -0.5, 0.1, 15, mad=True)
            d, ls = _coded_by_max(scales.reshape(n, 16), 15)
            dmin, lm = _coded_by_max(mins.reshape(n, 16), 15)
        else:  # quantize_row_q2_K_impl
            sigma2 = (qs.seqsum(b * b) / np.float32(256)).astype(np.float32)
            wts = qs.importance_weights(b, qw, sigma2).reshape(n * 16, self.SUB)
            scales, mins, codes = qs.qkx(sub, wts, 3, -0.9, 0.05, 36)
            sw = qs.seqsum(wts).reshape(n, 16)
            d, ls = qs.qp(scales.reshape(n, 16), sw, 15)
            dmin, lm = qs.qp(mins.reshape(n, 16), sw, 15)
        _check_f16_range(d, name)
        _check_f16_range(dmin, name, "super-block minimum scale")
        d16, m16 = d.astype(np.float16), dmin.astype(np.float16)
        step = (d16.astype(np.float32)[:, None] * ls.astype(np.float32)).reshape(-1, 1)
        low = (m16.astype(np.float32)[:, None] * lm.astype(np.float32)).reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            again = np.clip(qs.nearest_int((sub + low) / step), 0, 3)
        codes = np.where(step != 0, again, codes).reshape(n, 256).astype(np.uint8)
        return np.concatenate([ls | (lm << 4), _pack_pairs(codes), d16[:, None].view(np.uint8),
                               m16[:, None].view(np.uint8)], axis=1)

    @staticmethod
    def sub_params(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per sub-block (scale, min) as float32 [n, 16]: w = scale × q − min,
        the f32 products d × sc_j and dmin × m_j ggml's dequantize_row_q2_K forms."""
        sc = raw[:, :16]
        return ((_Block._f16(raw, 80) * (sc & 0xF).astype(np.float32)).astype(np.float32),
                (_Block._f16(raw, 82) * (sc >> 4).astype(np.float32)).astype(np.float32))

    @staticmethod
    def codes(raw: np.ndarray) -> np.ndarray:
        """The codes 0..3 of every element, [n, 256]."""
        return _unpack_pairs(raw[:, 16:80])

    def _dequantize_blocks(self, raw):
        s, m = self.sub_params(raw)
        q = self.codes(raw).reshape(-1, 16, self.SUB).astype(np.float32)
        return (s[..., None] * q - m[..., None]).reshape(-1, 256)

    def sub_scale_fields(self, raw):
        q = self.codes(raw).reshape(-1, 16, self.SUB).astype(np.float32)
        return SubScales(self.SUB, np.stack([q, np.full_like(q, -1)], axis=1), np.stack(self.sub_params(raw), 1))

    SUB_LEVELS = ((0, 15, False), (0, 15, False))  # the 4-bit sub-scales, the 4-bit sub-mins

    def _put_sub_levels(self, out, ls, lm):
        out[:, :16] = (ls | (lm << 4)).astype(np.uint8)

    def _bound(self, b, raw):
        # codes chosen for the sub-scale and sub-min as stored, up to (x + min) / scale's f32 rounding
        s, m = self.sub_params(raw)
        x = b.reshape(-1, 16, self.SUB)
        ulp = np.float32(2**-21) * (np.abs(x) + m[..., None] + np.float32(3) * s[..., None])
        return _grid_bound(x, s[..., None], 0, 3, -m[..., None], ulp)


def _table_bound(x: np.ndarray, scale: np.ndarray, slack: np.ndarray | float,
                 values: np.ndarray = qs.IQ4_VALUES) -> np.ndarray:
    """Per-element bound for codes indexing a table of values (iq4, mxfp4):
    the distance from x to the nearest point of the stored scale's grid
    (scale * values), plus ``slack`` for codes chosen against the scale
    before its rounding, plus the f32 rounding of scale⁻¹ * x near a tie."""
    near = np.full(np.broadcast_shapes(x.shape, scale.shape), np.inf, np.float32)
    for v in values:
        np.minimum(near, np.abs(x - scale * v), out=near)
    return near + slack + np.float32(2**-20) * np.abs(x) + np.float32(2**-24)


class _SigmaWeighted(_Block):
    """Schemes whose search weighs each element as ggml's iq quantizers do:
    x² without an importance matrix, imp × sqrt(σ² + x²) with one, σ² from
    the whole super-block (SUPER elements); ``_search`` gets the weights."""

    SUPER: int  # elements that share one σ² (and one f16 scale, where the type has super-blocks)

    def _weights(self, w, imp):
        return np.broadcast_to(imp, w.shape)  # the search adds its own σ² per super-block

    def _quantize_blocks(self, b, name):
        return self._search(b, (b * b).astype(np.float32), name)

    def _quantize_weighted(self, b, wts, name):
        sigma2 = (qs.seqsum(b * b) * np.float32(2 / self.SUPER)).astype(np.float32)
        return self._search(b, qs.importance_weights(b, wts, sigma2), name)

    def _search(self, b: np.ndarray, wts: np.ndarray, name: str) -> np.ndarray:
        raise NotImplementedError


class _IQ4(_SigmaWeighted):
    """The iq4 schemes' one quantizer, ggml's quantize_row_iq4_nl_impl: per
    32-element sub-block a scale search over the non-linear grid under the
    per-element weights; the codes are then the nearest grid points for the
    scale before f16 rounding, as ggml picks them."""

    @staticmethod
    def _codes_for(sub: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """Nearest grid codes of sub [n, 32] for scales [n] (code 8, the grid's
        1, where the scale is zero: ggml multiplies by a zero inverse)."""
        return qs.iq4_index(_recip(scale)[:, None] * sub)


class IQ4_NL(_IQ4, weight_type="iq4_nl"):
    """llama.cpp's IQ4_NL: per 32-element block d (f16) and 32 nibbles,
    w = d × IQ4_VALUES[q] (the non-linear grid of quant_search.py)."""

    GGUF, GGUF_FILE_TYPE = "IQ4_NL", "MOSTLY_IQ4_NL"
    FALLBACK, LADDER = None, ({"scheme": "iq4_nl"},)

    SUPER = 32

    def _search(self, b, wts, name):
        d = qs.iq4_scales(b, wts)
        _check_f16_range(d, name)
        q = self._codes_for(b, d)
        return np.concatenate([d.astype(np.float16)[:, None].view(np.uint8), _pack_nibbles(q)], axis=1)

    def _dequantize_blocks(self, raw):
        return self._f16(raw, 0) * qs.IQ4_VALUES[_unpack_nibbles(raw[:, 2:])]

    def _bound(self, b, raw):
        d16 = self._f16(raw, 0)
        return _table_bound(b, d16, np.float32(254) * _f16_half_ulp(d16))


class IQ4_XS(_ScaledValues, _IQ4, weight_type="iq4_xs"):
    """llama.cpp's IQ4_XS: 256-element super-blocks of eight 32-element
    sub-blocks, w = d × (l_j − 32) × IQ4_VALUES[q] with a 6-bit sub-scale l_j
    (low nibbles in 4 bytes, high bit pairs in a u16) under one f16 d: the
    iq4_nl grid at 4.25 bits per weight."""

    GGUF, GGUF_FILE_TYPE = "IQ4_XS", "MOSTLY_IQ4_XS"
    FALLBACK = {"scheme": "iq4_nl"}  # its grid per 32 elements (llama.cpp's choice)
    LADDER = ({"scheme": "iq4_xs"},)

    SUPER = 256
    SUB = 32

    def _search(self, b, wts, name):
        n = b.shape[0]
        sub = b.reshape(n * 8, self.SUB)
        scales = qs.iq4_scales(sub, wts.reshape(n * 8, self.SUB)).reshape(n, 8)
        top, _ = qs.signed_max(scales)
        top = np.where(top != 0, top, np.float32(0))  # ggml starts its search for the largest at +0
        d = (-top / np.float32(32)).astype(np.float32)
        _check_f16_range(d, name)
        ls = np.clip(qs.nearest_int(_recip(d)[:, None] * scales), -32, 31)
        q = self._codes_for(sub, (d[:, None] * ls.astype(np.float32)).reshape(-1)).reshape(n, 256)
        return np.concatenate([d.astype(np.float16)[:, None].view(np.uint8), self.pack_sub_scales(ls), _pack_nibbles(q)],
                              axis=1)

    @staticmethod
    def pack_sub_scales(ls: np.ndarray) -> np.ndarray:
        """Sub-scales l_j − 32 [n, 8] (−32..31) as their 6 bytes [n, 6]:
        scales_h (u16, the high bit pairs), then scales_l (the low nibbles)."""
        lu = (ls + 32).astype(np.uint16)
        scales_h = np.zeros(ls.shape[0], np.uint16)
        for j in range(8):
            scales_h |= (lu[:, j] >> 4) << (2 * j)
        scales_l = ((lu[:, 0::2] & 0xF) | ((lu[:, 1::2] & 0xF) << 4)).astype(np.uint8)
        return np.concatenate([scales_h.astype("<u2")[:, None].view(np.uint8), scales_l], axis=1)

    @staticmethod
    def sub_scales(raw: np.ndarray) -> np.ndarray:
        """Per sub-block scale as float32 [n, 8]: the f32 product of the f16
        d and l_j − 32, as ggml's dequantize_row_iq4_xs forms it."""
        h = raw[:, 2:4].copy().view("<u2")[:, 0].astype(np.int32)
        lo = raw[:, 4:8].astype(np.int32)
        j = np.arange(8)
        ls = ((lo[:, j // 2] >> (4 * (j % 2))) & 0xF) | (((h[:, None] >> (2 * j)) & 3) << 4)
        return (_Block._f16(raw, 0) * (ls - 32).astype(np.float32)).astype(np.float32)

    def _values(self, raw: np.ndarray) -> np.ndarray:
        """Each element's grid value [n, 8, 32], before its sub-block's scale."""
        return qs.IQ4_VALUES[_unpack_nibbles(raw[:, 8:136]).reshape(-1, 8, self.SUB)]

    SUB_LEVELS = ((-32, 31, False),)  # the multipliers l_j - 32

    def _put_sub_levels(self, out, ls):
        out[:, 2:8] = IQ4_XS.pack_sub_scales(ls)

    def _bound(self, b, raw):
        # codes chosen for d × l_j with d before f16 rounding: |l_j| ≤ 32 of its half ulp per grid step
        s = self.sub_scales(raw)[..., None]
        slack = np.float32(254 * 32) * _f16_half_ulp(self._f16(raw, 0))[..., None]
        return _table_bound(b.reshape(-1, 8, self.SUB), s, slack)


class IQ4_XSH(_ScaledValues, _IQ4, weight_type="iq4_xsh"):
    """iq4_xs with a second grid: its 136 bytes, then one byte whose bit j
    moves sub-block j onto IQ4_VALUES + IQ4_SHIFT, w = d × (l_j − 32) ×
    (IQ4_VALUES[q] + 4 shift_j): 4.28125 bits per weight. Not a llama.cpp
    type (ik_llama.cpp's IQ4_KS has the same idea in other bytes), so it has
    no GGUF export; q4-manifest --gguf-types leaves it out.

    Why: with the grid choice a sub-block's weights that fall between the
    iq4 grid's points near zero have a grid that fits them; on the widened
    SmolLM2 its importance-weighted error is 0.87x iq4_xs's (docs/quality.md),
    for 1/32 of a bit more.

    The search (csrc/search/iq4_scales.cpp): per sub-block the best scale on
    either grid, from either end of it; d = the largest of them / −32 or /
    31 (of the two, the one of less weighted error per super-block), l_j the
    nearest for the stored d, then per sub-block codes and grid the nearest
    on each grid for its stored scale and the grid of less weighted error."""

    GGUF = GGUF_FILE_TYPE = None  # no llama.cpp type: iebin-to-gguf refuses it
    FALLBACK = {"scheme": "iq4_nl"}  # its grid per 32 elements, as iq4_xs's
    LADDER = ({"scheme": "iq4_xsh"},)

    SUPER = 256
    SUB = 32
    SHIFTS = 136  # byte offset of the grid-shift bits

    def _quantize_blocks(self, b, name):
        # Unit weights, not ggml's x² (iq4_xs's): x² spends the grid choice on the few large
        # weights, and the plain squared error is 0.95x iq4_xs's where unit weights reach 0.87x.
        return self._search(b, np.ones_like(b, dtype=np.float32), name)

    def _search(self, b, wts, name):
        n = b.shape[0]
        sub = b.reshape(n * 8, self.SUB)
        w = np.ascontiguousarray(wts, dtype=np.float32).reshape(n * 8, self.SUB)
        scales = qs.iq4_shifted_scales(sub, w).reshape(n, 8)
        top, _ = qs.signed_max(scales)
        low, high = (self._try_d(sub, w, scales, top / div, name) for div in (np.float32(-32), np.float32(31)))
        take = high.err < low.err  # per super-block: the largest scale at l = -32, or at l = 31
        per_sub = np.repeat(take, 8)
        d16 = np.where(take, high.d16, low.d16)
        ls = np.where(take[:, None], high.ls, low.ls)
        q = np.where(per_sub[:, None], high.q, low.q)
        shift = np.where(per_sub, high.shift, low.shift)
        bits = (shift.reshape(n, 8).astype(np.uint8) << np.arange(8, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)
        return np.concatenate([d16[:, None].view(np.uint8), IQ4_XS.pack_sub_scales(ls), _pack_nibbles(q.reshape(n, 256)),
                               bits[:, None]], axis=1)

    class _Try(NamedTuple):
        d16: np.ndarray    # [n] f16
        ls: np.ndarray     # [n, 8] l_j − 32
        q: np.ndarray      # [8n, 32] codes
        shift: np.ndarray  # [8n] bool
        err: np.ndarray    # [n] weighted squared error per super-block

    def _try_d(self, sub, w, scales, d, name) -> "IQ4_XSH._Try":
        """One choice of d [n], every sub-block's l_j, codes and grid for it."""
        d = np.asarray(d, np.float32)
        _check_f16_range(d, name)
        d16 = d.astype(np.float16)
        ls = np.clip(qs.nearest_int(_recip(d16.astype(np.float32))[:, None] * scales), -32, 31)
        s = (d16.astype(np.float32)[:, None] * ls.astype(np.float32)).astype(np.float32).reshape(-1)
        q, shift, err = self._codes_and_grids(sub, w, s)
        return self._Try(d16, ls, q, shift, err.reshape(-1, 8).sum(axis=1))

    @staticmethod
    def _codes_and_grids(sub: np.ndarray, w: np.ndarray, s: np.ndarray):
        """Per sub-block [m, 32] under weights w and stored scale s [m]: the
        nearest codes on each grid, and the grid of less weighted squared
        error. Returns (codes [m, 32], shift [m] bool, error [m])."""
        a = _recip(s)[:, None] * sub
        q0 = qs.iq4_index(a)
        q1 = qs.iq4_index(a - np.float32(qs.IQ4_SHIFT))
        e0 = np.einsum("ij,ij->i", w, np.square(sub - s[:, None] * qs.IQ4_VALUES[q0]))
        e1 = np.einsum("ij,ij->i", w, np.square(sub - s[:, None] * (qs.IQ4_VALUES[q1] + np.float32(qs.IQ4_SHIFT))))
        shift = e1 < e0
        return np.where(shift[:, None], q1, q0), shift, np.where(shift, e1, e0)

    def shifts(self, raw: np.ndarray) -> np.ndarray:
        """Each sub-block's grid shift as float32 [n, 8] (0 or IQ4_SHIFT)."""
        bits = (raw[:, self.SHIFTS, None] >> np.arange(8, dtype=np.uint8)) & 1
        return bits.astype(np.float32) * np.float32(qs.IQ4_SHIFT)

    sub_scales = staticmethod(IQ4_XS.sub_scales)  # iq4_xs's bytes for d and the sub-scales

    def _values(self, raw: np.ndarray) -> np.ndarray:
        """Each element's value on its sub-block's grid [n, 8, 32], before the sub-block's scale."""
        q = _unpack_nibbles(raw[:, 8:self.SHIFTS]).reshape(-1, 8, self.SUB)
        return qs.IQ4_VALUES[q] + self.shifts(raw)[..., None]

    SUB_LEVELS, _put_sub_levels = IQ4_XS.SUB_LEVELS, IQ4_XS._put_sub_levels

    def _bound(self, b, raw):
        # codes the nearest on the sub-block's grid for the scale as stored: |x − s (v + sh)| = |(x − s sh) − s v|
        s = self.sub_scales(raw)[..., None]
        moved = s * self.shifts(raw)[..., None]
        x = b.reshape(-1, 8, self.SUB) - moved
        return _table_bound(x, s, np.float32(2**-20) * np.abs(moved)).reshape(-1, 256)


def _odd_multipliers(sub: np.ndarray, smax: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The codebook types' sub-block scales sub [n, k] as stored: d (f16
    [n]) = the largest / (1 + 2 smax), each s (uint8 [n, k], 0..smax) the
    nearest for the stored d, and the scales d × (1 + 2 s) they stand for
    (float32 [n, k], ggml's product)."""
    d = (sub.max(axis=1) / np.float32(1 + 2 * smax)).astype(np.float32)
    _check_f16_range(d, name)
    d16 = d.astype(np.float16)
    dq = d16.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.clip(np.rint((sub * _recip(dq)[:, None] - 1) / 2), 0, smax).astype(np.uint8)
    return d16, s, IQ3_S._times_sub(dq, s)


class IQ3_S(_ScaledValues, _SigmaWeighted, weight_type="iq3_s"):
    """llama.cpp's IQ3_S: 256-element super-blocks of eight 32-element
    sub-blocks; each four weights share a 9-bit index into the 512-entry
    codebook of odd magnitudes 1..15 (formats/codebooks.py), each weight a
    sign bit; w = d × (1 + 2 s_j) × ±g with a 4-bit sub-scale s_j under one
    f16 d: 3.4375 bits per weight, q3_k's size. Byte layout: d, qs (64
    bytes: the low 8 bits of each four-tuple's index, in element order), qh
    (8 bytes: bit m of byte j is bit 8 of sub-block j's tuple m), signs (32
    bytes: bit e % 8 of byte e / 8 set where element e is negative), scales
    (4 bytes: s_j in the low nibble of byte j / 2 for even j, the high one
    for odd j).

    Our own search, not ggml's (the bytes differ; llama.cpp and gguf-py read
    ours, tests/test_iq3s.py): per sub-block a search over scales, each giving
    every four-tuple its nearest entry under the weights (unit weights
    without an importance matrix, imp × sqrt(σ² + x²) with one) and the weighted
    least-squares scale for those entries, the best kept
    (Codebook.scales); d = the largest / 31, each s_j the nearest for the
    stored d, then every four-tuple the nearest entry for its scale as
    stored."""

    GGUF, GGUF_FILE_TYPE = "IQ3_S", "MOSTLY_IQ3_S"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ({"scheme": "iq3_s"},)

    SUPER = 256
    SUB, NSUB = 32, 8  # elements per sub-block (one sub-scale), sub-blocks per super-block
    QS, QH, SIGNS, SCALES = 2, 66, 74, 106  # byte offsets of the fields after d

    def _quantize_blocks(self, b, name):
        # Unit weights, not ggml's x²: x² lets the many small weights of a
        # four-tuple drift to favour its largest, twice the plain squared
        # error of unit weights on Student-t rows (0.041 against 0.021; q3_k: 0.031).
        return self._search(b, np.ones_like(b, dtype=np.float32), name)

    BOOK = codebooks.IQ3S
    TOP = 15.0  # the largest magnitude of the codebook, in its units

    def _search(self, b, wts, name):
        d16, s, idx = self._fit(np.abs(b), wts, name)
        return self._pack(d16, s, idx, b < 0)

    def _fit(self, a, wts, name):
        """The codebook search over magnitudes a [n, 256] under weights wts:
        d (f16), the sub-scales s [n, NSUB] and the entries idx [n, NSUB, SUB / dims]."""
        n, ns = a.shape[0], self.NSUB
        a = a.reshape(n * ns, self.SUB)
        w = np.ascontiguousarray(wts, dtype=np.float32).reshape(n * ns, self.SUB)
        d16, s, db = _odd_multipliers(self.BOOK.scales(a, w).reshape(n, ns), 15, name)
        k = self.BOOK.dims
        u = (a.reshape(n, ns, self.SUB) * _recip(db)[..., None]).reshape(-1, k)
        return d16, s, self.BOOK.nearest(u, w.reshape(-1, k)).reshape(n, ns, self.SUB // k)

    def _pack(self, d16, s, idx, neg):
        """The blocks of d16, s, idx (_fit) and each element's sign neg [n, 256]."""
        n = len(d16)
        bits = np.arange(8, dtype=np.uint8)
        qh = ((idx >> 8).astype(np.uint8) << bits).sum(axis=2, dtype=np.uint8)
        signs = (neg.reshape(n, 32, 8).astype(np.uint8) << bits).sum(axis=2, dtype=np.uint8)
        return np.concatenate([d16[:, None].view(np.uint8), (idx & 0xFF).astype(np.uint8).reshape(n, 64), qh, signs,
                               self._pack_sub(s)], axis=1)

    @staticmethod
    def _pack_sub(s: np.ndarray) -> np.ndarray:
        """4-bit sub-scales s_j [n, k] -> their k / 2 bytes."""
        s = s.astype(np.uint8)
        return s[:, 0::2] | (s[:, 1::2] << 4)

    @staticmethod
    def _times_sub(d: np.ndarray, s: np.ndarray) -> np.ndarray:
        """d × (1 + 2 s_j) as float32 [n, NSUB], the product ggml forms."""
        return (d[:, None] * (1 + 2 * s.astype(np.int32)).astype(np.float32)).astype(np.float32)

    def sub_scales(self, raw: np.ndarray) -> np.ndarray:
        """Per sub-block scale as float32 [n, NSUB]."""
        sc = raw[:, self.SCALES:self.SCALES + self.NSUB // 2]
        return self._times_sub(self._f16(raw, 0)[:, 0], np.stack([sc & 0xF, sc >> 4], axis=2).reshape(-1, self.NSUB))

    def _values(self, raw: np.ndarray) -> np.ndarray:
        """Each element's signed codebook value [n, 8, 32], before its sub-block's scale."""
        bits = np.arange(8, dtype=np.uint8)
        high = (raw[:, self.QH:self.QH + 8, None] >> bits) & 1  # [n, 8 sub-blocks, 8 tuples]
        idx = raw[:, self.QS:self.QS + 64].astype(np.int32) | (high.reshape(-1, 64).astype(np.int32) << 8)
        return self._signed(idx, raw[:, self.SIGNS:self.SIGNS + 32])

    def _signed(self, idx: np.ndarray, signs: np.ndarray) -> np.ndarray:
        """The signed values [n, NSUB, SUB] of the entries idx under the 32
        sign bytes per block signs (bit k of byte g: element 8 g + k negative)."""
        neg = (signs.reshape(-1, 32)[..., None] >> np.arange(8, dtype=signs.dtype)) & 1
        return self.BOOK.grid[idx].reshape(-1, self.NSUB, self.SUB) * np.where(
            neg.reshape(-1, self.NSUB, self.SUB) != 0, np.float32(-1), np.float32(1))

    SUB_LEVELS = ((1, 31, True),)  # the multipliers 1 + 2 s_j

    def _put_sub_levels(self, out, m):
        out[:, self.SCALES:self.SCALES + self.NSUB // 2] = self._pack_sub((m - 1) // 2)

    def _bound(self, b, raw):
        # a codebook entry is a compromise among its weights: any magnitude 1..TOP of the scale may be chosen
        db = self.sub_scales(raw)[..., None]
        a = np.abs(b.reshape(-1, self.NSUB, self.SUB))
        far = np.maximum(np.abs(a - db), np.abs(a - np.float32(self.TOP) * db))
        return (self._sign_slack(b, a, db, far) * np.float32(1 + 2**-20) + np.float32(2**-24)).reshape(-1, 256)

    def _sign_slack(self, b, a, db, far):
        """far, where a type may store an element with the other sign (IQ3_XXS)."""
        return far


class _EvenSigns:
    """A mixin for the codebook types that store seven sign bits per eight
    weights, the eighth their parity (IQ3_XXS, IQ2_XXS, IQ2_XS): a group of
    eight with an odd number of negative weights first gives up the sign of
    its least (weighted) one, which the search then fits as -|x|, as ggml's
    quantizers do; the bound allows that one flip."""

    def _search(self, b, wts, name):
        n = b.shape[0]
        neg = (b < 0).reshape(n, 32, 8)
        a = np.abs(b).astype(np.float32).reshape(n, 32, 8)
        w = np.broadcast_to(np.asarray(wts, np.float32), b.shape).reshape(n, 32, 8)
        g, r = np.nonzero(neg.sum(axis=2) % 2 == 1)
        k = (w * a * a)[g, r].argmin(axis=1)  # the group's least weighted x² (the first of equals)
        neg[g, r, k] ^= True
        a[g, r, k] = -a[g, r, k]
        d16, s, idx = self._fit(a.reshape(n, 256), wts, name)
        return self._pack(d16, s, idx, neg.reshape(n, 256))

    @staticmethod
    def _parity_signs(seven: np.ndarray) -> np.ndarray:
        """Each group's eight sign bits (bit k: element k negative) from its seven stored ones."""
        parity = np.zeros_like(seven)
        for k in range(7):
            parity ^= (seven >> k) & 1
        return seven | parity << 7

    def _sign_slack(self, b, a, db, far):
        # a group of eight with an odd number of negative weights stores one of them with the other sign
        odd = ((b < 0).reshape(-1, self.NSUB, self.SUB // 8, 8).sum(axis=3) % 2 == 1).repeat(8, axis=2)
        return np.where(odd, np.maximum(far, a + np.float32(self.TOP) * db), far)


class IQ3_XXS(_EvenSigns, IQ3_S, weight_type="iq3_xxs"):
    """llama.cpp's IQ3_XXS: IQ3_S's super-blocks with a smaller codebook and
    no high index bits: each four weights an 8-bit index into 256
    four-tuples of 4, 12, .., 52, 62 (formats/codebooks.py, held as 4 x (1,
    3, .., 13, 15.5)), each eight weights 7 sign bits whose parity is the
    eighth's (an even number of them negative), w = d × (0.5 + s_j) × 0.5 ×
    ±g: 3.0625 bits per weight, the smallest type llama.cpp's IQ3_XS and
    IQ2 mixes, and Unsloth's low-bit quants, hold most of their matrices in.
    Byte layout: d, qs (64 bytes: each four-tuple's index, in element
    order), then per sub-block j a u32 (little-endian): bits 7 g .. 7 g + 6
    the signs of its elements 8 g .. 8 g + 6 (bit k: element 8 g + k
    negative), bits 28..31 s_j.

    The search is IQ3_S's over this codebook, the signs _EvenSigns's (as
    ggml's quantize_row_iq3_xxs_impl gives them up)."""

    GGUF, GGUF_FILE_TYPE = "IQ3_XXS", "MOSTLY_IQ3_XXS"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ()

    BOOK = codebooks.IQ3XXS
    TOP = 15.5
    QS, AUX = 2, 66  # byte offsets of the indices and of the sub-blocks' sign/scale words

    def _pack(self, d16, s, idx, neg):
        n = len(d16)
        seven = (neg.reshape(n, 8, 4, 8)[..., :7].astype(np.uint32) << np.arange(7, dtype=np.uint32)).sum(
            axis=3, dtype=np.uint32)
        aux = (seven << (7 * np.arange(4, dtype=np.uint32))).sum(axis=2, dtype=np.uint32) | (s.astype(np.uint32) << 28)
        return np.concatenate([d16[:, None].view(np.uint8), self._codes(idx.astype(np.uint8), aux.astype("<u4"))],
                              axis=1)

    def _codes(self, idx: np.ndarray, aux: np.ndarray) -> np.ndarray:
        """The bytes after d of the entries idx [n, 8, 8] (uint8) and the sign/scale words aux [n, 8]."""
        n = len(idx)
        return np.concatenate([idx.reshape(n, 64), aux.view(np.uint8).reshape(n, 32)], axis=1)

    def _aux(self, raw: np.ndarray) -> np.ndarray:
        """The sign/scale words [n, 8] of blocks raw."""
        return raw[:, self.AUX:self.AUX + 32].copy().view("<u4")

    def _set_aux(self, out: np.ndarray, aux: np.ndarray) -> None:
        out[:, self.AUX:self.AUX + 32] = aux.astype("<u4").view(np.uint8)

    def _entries(self, raw: np.ndarray) -> np.ndarray:
        """The entries [n, 8, 32 / dims] of blocks raw."""
        return raw[:, self.QS:self.QS + 64].astype(np.int32).reshape(-1, 8, 8)

    def sub_scales(self, raw):
        """Per sub-block scale d × (1 + 2 s_j) as float32 [n, 8], in the codebook's
        units (the unit, 4 or 8, times ggml's d × (0.5 + s_j) × 0.5 or × 0.25: the
        same products with the values)."""
        return self._times_sub(self._f16(raw, 0)[:, 0], (self._aux(raw) >> 28).astype(np.uint8))

    def _values(self, raw):
        seven = (self._aux(raw)[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 0x7F  # [n, 8, 4]
        return self._signed(self._entries(raw), self._parity_signs(seven))

    def _put_sub_levels(self, out, m):
        aux = self._aux(out) & np.uint32(0x0FFFFFFF)
        self._set_aux(out, aux | ((m - 1) // 2).astype(np.uint32) << 28)


class IQ2_XXS(IQ3_XXS, weight_type="iq2_xxs"):
    """llama.cpp's IQ2_XXS: IQ3_XXS's signs and scales over eight-tuples:
    each eight weights an 8-bit index into 256 eight-tuples of 8, 25, 43
    (formats/codebooks.py, held as 8 x (1, 3.125, 5.375)), w = d × (0.5 +
    s_j) × 0.25 × ±g: 2.0625 bits per weight, what llama.cpp's IQ2_XXS mix
    and the 2-bit quants of large models hold most matrices in. Byte layout:
    d, then per sub-block j eight bytes at 2 + 8 j: its four indices (tuple
    m: elements 32 j + 8 m .. + 7), then IQ3_XXS's u32 of signs and s_j.

    The search is IQ3_XXS's over this codebook, the places it tries scaled
    to its top level."""

    GGUF, GGUF_FILE_TYPE = "IQ2_XXS", "MOSTLY_IQ2_XXS"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ()

    BOOK = codebooks.IQ2XXS
    TOP = 5.375

    def _codes(self, idx, aux):
        n = len(idx)
        return np.concatenate([idx.reshape(n, 8, 4), aux.view(np.uint8).reshape(n, 8, 4)], axis=2).reshape(n, 64)

    def _aux(self, raw):
        return raw[:, 2:66].reshape(-1, 8, 8)[:, :, 4:].copy().view("<u4").reshape(-1, 8)

    def _set_aux(self, out, aux):
        out[:, 2:66].reshape(-1, 8, 8)[:, :, 4:] = aux.astype("<u4").reshape(-1, 8, 1).view(np.uint8)

    def _entries(self, raw):
        return raw[:, 2:66].reshape(-1, 8, 8)[:, :, :4].astype(np.int32)



class _HalfScaled:
    """A mixin for IQ2_XS and IQ2_S: IQ2_XXS's magnitudes (top level 5.375)
    under a 4-bit scale per 16 weights, sixteen per super-block."""

    TOP = 5.375
    SUB, NSUB = 16, 16


class IQ2_XS(_HalfScaled, _EvenSigns, IQ3_S, weight_type="iq2_xs"):
    """llama.cpp's IQ2_XS: IQ2_XXS's eight-tuples from a codebook twice as
    large (512 entries, a 9-bit index) and a 4-bit scale per 16 weights, not
    per 32: w = d × (0.5 + s_h) × 0.25 × ±g, 2.3125 bits per weight, what
    llama.cpp's IQ2_XS and IQ2_S mixes hold most matrices in. Byte layout:
    d, then per eight weights g a u16 at 2 + 2 g (bits 0..8 its index, bits
    9..15 the signs of its first seven elements, the eighth's their parity,
    as IQ2_XXS's), then the sixteen s_h as nibbles of bytes 66..73 (s_h in
    the low nibble of byte 66 + h / 2 for even h, the high one for odd h:
    elements 16 h .. 16 h + 15).

    The search is IQ2_XXS's over this codebook, a scale fit per 16 weights."""

    GGUF, GGUF_FILE_TYPE = "IQ2_XS", "MOSTLY_IQ2_XS"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ()

    BOOK = codebooks.IQ2XS
    QS, SCALES = 2, 66

    def _pack(self, d16, s, idx, neg):
        n = len(d16)
        seven = (neg.reshape(n, 32, 8)[..., :7].astype(np.uint16) << np.arange(7, dtype=np.uint16)).sum(
            axis=2, dtype=np.uint16)
        qs = idx.reshape(n, 32).astype(np.uint16) | (seven << 9)
        return np.concatenate([d16[:, None].view(np.uint8), qs.astype("<u2").view(np.uint8), self._pack_sub(s)], axis=1)

    def _values(self, raw):
        q = raw[:, self.QS:self.QS + 64].copy().view("<u2").astype(np.uint32)  # per eight weights: index, signs
        return self._signed(q & 511, self._parity_signs(q >> 9))


class IQ2_S(_HalfScaled, IQ3_S, weight_type="iq2_s"):
    """llama.cpp's IQ2_S: IQ2_XS's scales over a codebook of 1024
    eight-tuples (a 10-bit index) and every sign stored: w = d × (0.5 + s_h)
    × 0.25 × ±g, 2.5625 bits per weight, what llama.cpp's IQ2_M mix holds
    most matrices in. Byte layout: d, the low 8 index bits of each eight
    weights g at 2 + g, their sign bytes at 34 + g (bit k: element 8 g + k
    negative), the high index bits at 66 + g / 4 (bits 2 (g % 4) .. + 1),
    then IQ2_XS's sixteen 4-bit s_h at 74..81.

    The search is IQ3_S's (no sign given up) over this codebook, a scale
    fit per 16 weights."""

    GGUF, GGUF_FILE_TYPE = "IQ2_S", "MOSTLY_IQ2_S"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ()

    BOOK = codebooks.IQ2S
    QS, SIGNS, QH, SCALES = 2, 34, 66, 74

    def _pack(self, d16, s, idx, neg):
        n = len(d16)
        idx = idx.reshape(n, 32)
        bits = np.arange(8, dtype=np.uint8)
        qh = ((idx >> 8).astype(np.uint8).reshape(n, 8, 4) << (2 * np.arange(4, dtype=np.uint8))).sum(
            axis=2, dtype=np.uint8)
        signs = (neg.reshape(n, 32, 8).astype(np.uint8) << bits).sum(axis=2, dtype=np.uint8)
        return np.concatenate([d16[:, None].view(np.uint8), (idx & 0xFF).astype(np.uint8), signs, qh,
                               self._pack_sub(s)], axis=1)

    def _entries(self, raw: np.ndarray) -> np.ndarray:
        """The 10-bit index [n, 32] of each eight weights of blocks raw."""
        high = (raw[:, self.QH:self.QH + 8, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3
        return raw[:, self.QS:self.QS + 32].astype(np.int32) | (high.reshape(-1, 32).astype(np.int32) << 8)

    def _values(self, raw):
        return self._signed(self._entries(raw), raw[:, self.SIGNS:self.SIGNS + 32])

class _IQ1(_ScaledValues, _SigmaWeighted):
    """A base for IQ1_S and IQ1_M: each eight weights an 11-bit index into
    2048 eight-tuples of -1, 0, 1 (ggml's iq1s_grid, formats/codebooks.py),
    each SHIFT weights a shift of +-1/8 (its sign a bit), each SUB weights a
    3-bit s: w = d × (1 + 2 s) × (g ± 1/8), the f32 product ggml forms
    (exact: the values are multiples of 1/8 below 2).

    Our own search, not ggml's (the bytes differ; llama.cpp and gguf-py read
    ours, tests/test_iq1.py): per SUB weights a search over scales, each
    giving every group of SHIFT weights the shift whose nearest entries fit
    it better and the weighted least-squares scale for them, the best kept
    (TernaryCodebook.scales); d = the largest / 15, each s the nearest for
    the stored d, then every eight weights the nearest entry for their scale
    as stored under each shift, each group the shift of less error."""

    SUPER = 256
    BOOK = codebooks.IQ1S
    SUB: int  # elements per 3-bit sub-scale
    SHIFT: int  # elements per shift sign
    SUB_LEVELS = ((1, 15, True),)  # the multipliers 1 + 2 s

    @property
    def NSUB(self) -> int:  # noqa: N802 - the sub-blocks per super-block, as IQ3_S's class attribute
        return 256 // self.SUB

    def _quantize_blocks(self, b, name):
        # unit weights, as IQ3_S's (ggml's iq1 quantizers require an importance matrix)
        return self._search(b, np.ones_like(b, dtype=np.float32), name)

    def _search(self, b, wts, name):
        n, k = b.shape[0], self.SUB
        x = b.reshape(n * self.NSUB, k)
        w = np.ascontiguousarray(np.broadcast_to(wts, b.shape), dtype=np.float32)
        d16, s, db = _odd_multipliers(self.BOOK.scales(x, w.reshape(-1, k)).reshape(n, self.NSUB), 7, name)
        u = (b.reshape(n, self.NSUB, k) * _recip(db)[..., None]).reshape(-1, 8)
        delta = np.float32(self.BOOK.DELTA)
        w8 = w.reshape(-1, 8)
        fits = []
        for shift in (delta, -delta):
            idx = self.BOOK.nearest(u - shift, w8)
            err = (w8 * np.square(u - shift - self.BOOK.grid[idx])).sum(axis=1, dtype=np.float32)
            fits.append((idx, err.reshape(n, 256 // self.SHIFT, self.SHIFT // 8).sum(axis=2)))
        neg = fits[1][1] < fits[0][1]  # [n, groups]: the shift -1/8 (+1/8 of equals)
        idx = np.where(np.repeat(neg, self.SHIFT // 8, axis=1), fits[1][0].reshape(n, 32), fits[0][0].reshape(n, 32))
        return self._pack(d16, s, idx, neg)

    def _pack(self, d16, s, idx, neg):
        """The blocks of d16 [n], the sub-scales s [n, NSUB], the entries idx [n, 32] and the shift signs neg."""
        raise NotImplementedError

    def _entries(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The 11-bit index [n, 32] of each eight weights of blocks raw, and each group's shift sign [n, 256 / SHIFT]."""
        raise NotImplementedError

    def _values(self, raw):
        idx, neg = self._entries(raw)
        shift = np.where(neg, np.float32(-self.BOOK.DELTA), np.float32(self.BOOK.DELTA)).repeat(self.SHIFT)
        return (self.BOOK.grid[idx].reshape(-1, 256) + shift.reshape(-1, 256)).reshape(-1, self.NSUB, self.SUB)

    def _bound(self, b, raw):
        # any value of the codebook may be a compromise among its tuple: within |x| + 9/8 of the scale
        db = self.sub_scales(raw)[..., None]
        a = np.abs(b.reshape(-1, self.NSUB, self.SUB))
        return ((a + np.float32(1.125) * db) * np.float32(1 + 2**-20) + np.float32(2**-24)).reshape(-1, 256)


class IQ1_S(_IQ1, weight_type="iq1_s"):
    """llama.cpp's IQ1_S: per 32 weights one s and one shift, 1.5625 bits
    per weight, what llama.cpp's IQ1_S mix and Unsloth's 1.58-bit quants of
    DeepSeek-R1 and Kimi K2 hold most expert matrices in. Byte layout: d,
    the low 8 index bits of each eight weights g at 2 + g, then per 32-block
    j a u16 at 34 + 2 j: bits 3 m .. 3 m + 2 the high index bits of its
    eight weights m, bits 12..14 s_j, bit 15 set where its shift is -1/8."""

    GGUF, GGUF_FILE_TYPE = "IQ1_S", "MOSTLY_IQ1_S"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ()

    SUB, SHIFT = 32, 32
    QS, QH = 2, 34

    def _pack(self, d16, s, idx, neg):
        n = len(d16)
        high = ((idx >> 8).astype(np.uint16).reshape(n, 8, 4) << (3 * np.arange(4, dtype=np.uint16))).sum(
            axis=2, dtype=np.uint16)
        qh = high | (s.astype(np.uint16) << 12) | (neg.astype(np.uint16) << 15)
        return np.concatenate([d16[:, None].view(np.uint8), (idx & 0xFF).astype(np.uint8),
                               qh.astype("<u2").view(np.uint8)], axis=1)

    def _qh(self, raw: np.ndarray) -> np.ndarray:
        return raw[:, self.QH:self.QH + 16].copy().view("<u2").astype(np.int32)  # [n, 8]

    def _entries(self, raw):
        high = (self._qh(raw)[..., None] >> (3 * np.arange(4))) & 7  # [n, 8 sub-blocks, 4 groups]
        return raw[:, self.QS:self.QS + 32].astype(np.int32) | (high.reshape(-1, 32) << 8), self._qh(raw) >> 15 != 0

    def sub_scales(self, raw):
        """Per 32-block scale d × (1 + 2 s_j) as float32 [n, 8]."""
        return IQ3_S._times_sub(self._f16(raw, 0)[:, 0], ((self._qh(raw) >> 12) & 7).astype(np.uint8))

    def _put_sub_levels(self, out, m):
        qh = self._qh(out) & 0x8FFF
        out[:, self.QH:self.QH + 16] = (qh | ((m - 1) // 2) << 12).astype("<u2").view(np.uint8)


class IQ1_M(_IQ1, weight_type="iq1_m"):
    """llama.cpp's IQ1_M: per 16 weights one s, per eight one shift, and
    no byte of its own for d: 1.75 bits per weight, what llama.cpp's IQ1_M
    mix and Unsloth's UD-IQ1_M quants hold most expert matrices in. Byte
    layout: the low 8 index bits of each eight weights g at g, their high
    bits and shift at 32 + g / 2 (nibble g % 2: bits 0..2 the index's high
    bits, bit 3 set where the shift is -1/8), then four u16 at 48 + 2 k:
    bits 3 m .. 3 m + 2 the s_h of the sixteen weights h = 4 k + m, bits
    12..15 bits 4 k .. 4 k + 3 of d (f16)."""

    GGUF, GGUF_FILE_TYPE = "IQ1_M", "MOSTLY_IQ1_M"
    FALLBACK = {"scheme": "iq4_nl"}  # as llama.cpp (a row that is no whole super-blocks)
    LADDER = ()

    SUB, SHIFT = 16, 8
    QS, QH, SCALES = 0, 32, 48
    F16_FIELDS = (("d", None),)  # spread over the top nibbles of the scale words: f16_field reads it

    def _words(self, raw: np.ndarray) -> np.ndarray:
        return raw[:, self.SCALES:self.SCALES + 8].copy().view("<u2").astype(np.uint32)  # [n, 4]

    def f16_field(self, raw, f):
        top = (self._words(raw) >> 12) << (4 * np.arange(4, dtype=np.uint32))
        return top.sum(axis=1, dtype=np.uint32).astype(np.uint16).view(np.float16)

    def set_f16_field(self, out, f, v):
        bits = np.asarray(v, np.float16).view(np.uint16).astype(np.uint32)[:, None] >> (4 * np.arange(4, dtype=np.uint32))
        words = (self._words(out) & 0x0FFF) | ((bits & 0xF) << 12)
        out[:, self.SCALES:self.SCALES + 8] = words.astype("<u2").view(np.uint8)

    def _pack(self, d16, s, idx, neg):
        n = len(d16)
        nib = ((idx >> 8) & 7).astype(np.uint8) | (neg.astype(np.uint8) << 3)  # [n, 32]
        qh = nib[:, 0::2] | (nib[:, 1::2] << 4)
        words = (s.astype(np.uint32).reshape(n, 4, 4) << (3 * np.arange(4, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
        out = np.concatenate([(idx & 0xFF).astype(np.uint8), qh, words.astype("<u2").view(np.uint8)], axis=1)
        self.set_f16_field(out, 0, d16)
        return out

    def _entries(self, raw):
        nib = np.stack([raw[:, self.QH:self.QH + 16] & 0xF, raw[:, self.QH:self.QH + 16] >> 4], axis=2).reshape(-1, 32)
        return raw[:, self.QS:self.QS + 32].astype(np.int32) | ((nib & 7).astype(np.int32) << 8), nib >> 3 != 0

    def _s(self, raw: np.ndarray) -> np.ndarray:
        return ((self._words(raw)[..., None] >> (3 * np.arange(4, dtype=np.uint32))) & 7).reshape(-1, 16)

    def sub_scales(self, raw):
        """Per 16 weights scale d × (1 + 2 s_h) as float32 [n, 16]."""
        return IQ3_S._times_sub(self.f16_field(raw, 0).astype(np.float32), self._s(raw).astype(np.uint8))

    def _put_sub_levels(self, out, m):
        d = self.f16_field(out, 0)
        words = ((((m - 1) // 2).astype(np.uint32).reshape(-1, 4, 4)) << (3 * np.arange(4, dtype=np.uint32))).sum(
            axis=2, dtype=np.uint32)
        out[:, self.SCALES:self.SCALES + 8] = words.astype("<u2").view(np.uint8)
        self.set_f16_field(out, 0, d)


# e2m1 (FP4 E2M1) values doubled, so they are integers: ggml's kvalues_mxfp4.
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
# The largest E8M0 code a block may store: 2^(252 − 127) × 6 is below
# float32's largest, 2^126 × 6 is not (and 255 is OCP MX's NaN).
E8M0_MAX = 252


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e − 128) as float32 for E8M0 codes e (half the block scale 2^(e − 127),
    as ggml's ggml_e8m0_to_fp32_half: the doubled values times it are the
    weights). Codes 0 and 1 give the subnormals 2^-128 and 2^-127."""
    u = np.asarray(e).astype(np.uint32)
    return np.where(u < 2, np.uint32(0x00200000) << u, (u - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(np.float32)


class MXFP4(_Block, weight_type="mxfp4"):
    """OCP microscaling FP4 (MX v1.0) in ggml's block_mxfp4 layout: per
    32-element block one E8M0 scale byte e, then 16 bytes of e2m1 codes in
    q4_0's order (byte j: element j low nibble, element j + 16 high); w =
    2^(e − 127) × e2m1[q] = e8m0_half(e) × MXFP4_VALUES[q]. gpt-oss ships its
    expert weights this way (in two planes, repacked by the converter).

    Without an importance matrix the bytes are gguf.quants' (and ggml's
    quantize_row_mxfp4_ref): e = ⌊log2 max|x|⌋ + 125, every code the nearest
    grid value for that scale (first of equals), the errors compared in
    float32 as ggml does. Blocks whose largest magnitude is below 2^-125
    get e = 0 where ggml's uint8 cast wraps (their codes are 0 either way).
    With one, the exponents e − 1, e and e + 1 are tried and the one with the
    smallest weighted squared error kept."""

    GGUF, GGUF_FILE_TYPE = "MXFP4", "MOSTLY_MXFP4_MOE"
    # Not a candidate: at the same 4.25 bits iq4_xs has about half its error
    # (relative squared error 0.0059 against 0.0134 on Gaussian rows, 0.011
    # against 0.019 on Student-t(3) ones: its scales are powers of two), so
    # measuring it would only cost time. gpt-oss's own mxfp4 is kept as it is.
    FALLBACK, LADDER = None, ()

    F16_FIELDS = ()
    E8M0_FIELDS = (("e", 0),)

    @staticmethod
    def _exponent(b: np.ndarray) -> np.ndarray:
        amax = np.abs(b).max(axis=1)
        with np.errstate(divide="ignore"):
            e = np.where(amax > 0, np.floor(np.log2(amax)) + np.float32(125), 0)
        return np.clip(e, 0, 254).astype(np.int32)

    @staticmethod
    def _codes(b: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest codes of blocks b for half-scales d [n] (the first of
        equal float32 errors, as argmin takes them), and their values."""
        best = np.full(b.shape, np.inf, np.float32)
        q = np.zeros(b.shape, np.uint8)
        for k, v in enumerate(MXFP4_VALUES):
            err = np.abs(d[:, None] * v - b)
            closer = err < best
            best = np.where(closer, err, best)
            q[closer] = k
        return q, MXFP4_VALUES[q] * d[:, None]

    @staticmethod
    def pack_blocks(e: np.ndarray, q: np.ndarray) -> np.ndarray:
        """E8M0 bytes [n] and codes [n, 32] (element order) -> blocks [n, 17]."""
        return np.concatenate([e.astype(np.uint8)[:, None], _pack_nibbles(q)], axis=1)

    def _quantize_blocks(self, b, name):
        e = self._exponent(b)
        return self.pack_blocks(e, self._codes(b, e8m0_half(e))[0])

    def _quantize_weighted(self, b, wts, name):
        e0 = self._exponent(b)
        best_err = np.full(b.shape[0], np.inf)
        best_e, best_q = e0.copy(), np.zeros(b.shape, np.uint8)
        for de in (0, -1, 1):
            e = np.clip(e0 + de, 0, 254)
            q, v = self._codes(b, e8m0_half(e))
            err = (wts.astype(np.float64) * (b.astype(np.float64) - v) ** 2).sum(axis=1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_e = np.where(better, e, best_e)
            best_q[better] = q[better]
        return self.pack_blocks(best_e, best_q)

    def _weights(self, w, imp):
        # Scaled by a power of two per row first: E8M0 reaches 2^127, where
        # x² overflows float32; the search only compares errors within a row.
        amax = np.abs(w).max(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            k = np.where(amax > 0, np.floor(np.log2(amax)), 0)
        return _row_weights((w * np.exp2(-k.astype(np.float64))).astype(np.float32), imp)

    def _dequantize_blocks(self, raw):
        return e8m0_half(raw[:, 0])[:, None] * MXFP4_VALUES[_unpack_nibbles(raw[:, 1:])]

    def _bound(self, b, raw):
        return _table_bound(b, e8m0_half(raw[:, 0])[:, None], np.float32(0), MXFP4_VALUES)


def ue4m3_half(x: np.ndarray) -> np.ndarray:
    """Half the value of UE4M3 bytes x (unsigned E4M3: exponent bits 3..6
    biased 7, mantissa bits 0..2), as float32: (8 + m) 2^(e − 11), the
    subnormals m 2^-10; ggml's ggml_ue4m3_to_fp32 (and gguf-py's), whose
    halving matches the doubled e2m1 values. Bit 7 is not read and 0x7F,
    E4M3's NaN, is 0, as there; the payload scan refuses both."""
    x = np.asarray(x).astype(np.int32)
    e, m = (x >> 3) & 0xF, x & 7
    v = np.where(e == 0, m * np.float32(2**-10), (8 + m) * np.exp2(e - 11.0).astype(np.float32)).astype(np.float32)
    return np.where((x == 0) | (x == 0x7F), np.float32(0), v)


def ue4m3_of(x: np.ndarray) -> np.ndarray:
    """The UE4M3 byte ggml's ggml_fp32_to_ue4m3 gives float32 x ≥ 0: values
    at or above 2^8 clip to 0x7E (448), the mantissa rounds half up on its
    fourth bit, subnormals round(512 x) (0 below half the least)."""
    x = np.clip(np.asarray(x, np.float32), 0, 448).astype(np.float32)
    bits = x.view(np.uint32)
    e0 = ((bits >> 23) & 0xFF).astype(np.int32) - 120  # the exponent biased 7, before rounding
    man = ((bits >> 20) & 7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
    exp, man = np.where(man > 7, e0 + 1, e0), np.where(man > 7, 0, man)
    normal = np.where(exp >= 15, 0x7E, (exp << 3) | man)
    sub = np.clip((x * np.float32(512) + np.float32(0.5)).astype(np.int32), 0, 7)
    out = np.where(e0 <= 0, sub, np.where(e0 >= 15, 0x7E, normal))
    return np.where(x > 0, out, 0).astype(np.uint8)


class NVFP4(_Block, weight_type="nvfp4"):
    """NVIDIA's FP4 in ggml's block_nvfp4 layout: per 64 weights four UE4M3
    scale bytes (one per 16), then 32 bytes of e2m1 codes, sub-block s's
    eight at 4 + 8 s, byte j holding element 16 s + j (low nibble) and
    16 s + j + 8 (high); w = ue4m3_half(d_s) × MXFP4_VALUES[q] × the
    tensor's ``tensor_scale``. ModelOpt's and compressed-tensors' NVFP4
    checkpoints are this (llama.cpp's converter repacks them bit for bit),
    with a float32 second-level scale per matrix (their ``weight_scale_2``),
    which llama.cpp keeps as a ``.scale`` tensor beside the weight and
    multiplies the product by; here it is the ``quant`` object's
    ``tensor_scale`` (1 where absent). ``input_scale``, the activation's
    calibration scale of a W4A4 checkpoint (llama.cpp's ``.input_scale``,
    which its graph loads and never reads, nor does ours), is carried so
    that an export writes it back.

    Without an importance matrix the bytes are ggml's quantize_row_nvfp4_ref
    of the blocks divided by ``tensor_scale``: each scale ue4m3_of(max|x| / 6),
    every code the nearest value for it (first of equals). With one, the
    scale codes one below and above are tried too, the one with the smallest
    weighted squared error kept. Not offered to the manifest: llama.cpp
    quantizes to it only through its converter (NVFP4 checkpoints), and a
    good tensor scale needs a pass over the whole matrix before it streams."""

    GGUF, GGUF_FILE_TYPE = "NVFP4", "MOSTLY_NVFP4"
    FALLBACK, LADDER = None, ()
    MANIFEST = False

    F16_FIELDS = ()
    UE4M3_FIELDS = (("d0", 0), ("d1", 1), ("d2", 2), ("d3", 3))
    QUANT_OPTIONAL = {"tensor_scale": (float,), "input_scale": (float,)}
    SUB = 16  # weights per scale

    def quant_dict(self, cols, p):
        q = super().quant_dict(cols, p)
        if p.tensor_scale != 1.0:
            q["tensor_scale"] = p.tensor_scale
        if p.input_scale is not None:
            q["input_scale"] = p.input_scale
        return q

    def params_from(self, quant, cols):
        def scale(key: str) -> float | None:
            v = quant.get(key)
            with np.errstate(over="ignore"):
                exact = v is not None and float(np.float32(v)) == v
            if v is not None and not (np.isfinite(v) and v > 0 and exact):
                raise QuantDictError(key, f"must be a positive finite float32 value, got {v!r}")
            return v
        return QuantParams(self.name, tensor_scale=scale("tensor_scale") or 1.0, input_scale=scale("input_scale"))

    @staticmethod
    def pack_blocks(d: np.ndarray, q: np.ndarray) -> np.ndarray:
        """UE4M3 bytes [n, 4] and codes [n, 64] (element order) -> blocks [n, 36]."""
        c = q.astype(np.uint8).reshape(-1, 4, 2, 8)
        return np.concatenate([d.astype(np.uint8), (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 32)], axis=1)

    @staticmethod
    def codes(raw: np.ndarray) -> np.ndarray:
        """Blocks [n, 36] -> codes [n, 64] in element order."""
        b = raw[:, 4:].reshape(-1, 4, 1, 8)
        return np.concatenate([b & 0x0F, b >> 4], axis=2).reshape(-1, 64)

    def _quantize_blocks(self, b, name):
        sub = b.reshape(-1, self.SUB)
        d = ue4m3_of(np.abs(sub).max(axis=1) / np.float32(6))
        q, _v = MXFP4._codes(sub, ue4m3_half(d))
        return self.pack_blocks(d.reshape(-1, 4), q.reshape(-1, 64))

    def _quantize_weighted(self, b, wts, name):
        sub, w = b.reshape(-1, self.SUB), wts.reshape(-1, self.SUB).astype(np.float64)
        d0 = ue4m3_of(np.abs(sub).max(axis=1) / np.float32(6)).astype(np.int32)
        best_err = np.full(sub.shape[0], np.inf)
        best_d, best_q = d0.copy(), np.zeros(sub.shape, np.uint8)
        for dd in (0, -1, 1):
            d = np.clip(d0 + dd, 0, 0x7E)
            q, v = MXFP4._codes(sub, ue4m3_half(d))
            err = (w * (sub.astype(np.float64) - v) ** 2).sum(axis=1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_d = np.where(better, d, best_d)
            best_q[better] = q[better]
        return self.pack_blocks(best_d.reshape(-1, 4), best_q.reshape(-1, 64))

    def quantize_rows(self, w, p, name="tensor", importance=None):
        return super().quantize_rows(np.asarray(w, np.float32) / np.float32(p.tensor_scale), p, name, importance)

    def _dequantize_blocks(self, raw):
        return (ue4m3_half(raw[:, :4])[:, :, None] * MXFP4_VALUES[self.codes(raw)].reshape(-1, 4, 16)).reshape(-1, 64)

    def dequantize(self, raw, rows, cols, p):
        return (self._dequantize_blocks(self._raw_blocks(raw)) * np.float32(p.tensor_scale)).reshape(rows, cols)

    def error_bound(self, w, raw, p):
        s = np.float32(p.tensor_scale)
        b = (np.asarray(w, np.float32) / s).reshape(-1, self.SUB)
        d = ue4m3_half(self._raw_blocks(raw)[:, :4]).reshape(-1, 1)
        return (_table_bound(b, d, np.float32(0), MXFP4_VALUES) * s * np.float32(1 + 2**-20)).reshape(w.shape)


class Int4W(Scheme, weight_type="int4w"):
    """iekit's weight-only INT4, planar-v1 layout (qs | scales | mins)."""

    GGUF = GGUF_FILE_TYPE = None  # iebin-to-gguf repacks it into Q4_0 / Q4_1 (f16 scales) instead
    FALLBACK = None  # a whole-row group where the group size does not divide the columns
    LADDER = (
        {"scheme": "int4w", "group_size": 128, "symmetric": True, "scale_dtype": "f16"},   # 4.125
        {"scheme": "int4w", "group_size": 64, "symmetric": True, "scale_dtype": "f16"},    # 4.25
        {"scheme": "int4w", "group_size": 64, "symmetric": False, "scale_dtype": "f16"},   # 4.5
        {"scheme": "int4w", "group_size": 32, "symmetric": False, "scale_dtype": "f16"},   # 5.0
    )
    # What an expert stack gets from int4w (and from q4_k through it), whose
    # planes span one whole matrix: the block scheme with its grid, 4-bit
    # symmetric or affine in blocks of 32 with f16 scales (q4_0 4.5, q4_1 5.0
    # bits per weight against int4w g64's 4.25 and 4.5), by ``symmetric``.
    STACK_FALLBACK = {True: {"scheme": "q4_0"}, False: {"scheme": "q4_1"}}

    STACKS = False  # its planes span the whole matrix; expert stacks take a block scheme

    QUANT_KEYS = {"scheme": ("int4w",), "group_size": (int,), "symmetric": (bool,),
                  "scale_dtype": ("f16", "f32"), "layout": ("planar-v1",)}
    CANDIDATES = np.float32(1) + np.arange(9, dtype=np.float32) / np.float32(16)

    def check(self, shape, p):
        why = super().check(shape, p)
        if why:
            return why
        cols = shape[1]
        g = p.group_size or cols
        if g < 0 or g % BLOCK or cols % g:  # (a negative one divides as well as its magnitude)
            return f"int4w group_size {g} must be a positive multiple of {BLOCK} that divides cols ({cols})"
        if p.scale_dtype not in ("f16", "f32"):
            return f"int4w scale_dtype must be f16 or f32, got {p.scale_dtype!r}"
        return None

    def quant_dict(self, cols, p):
        return {"scheme": "int4w", "group_size": p.group_size or cols, "symmetric": p.symmetric,
                "scale_dtype": p.scale_dtype, "layout": "planar-v1"}

    def params_from(self, quant, cols):
        return QuantParams("int4w", quant["group_size"], quant["symmetric"], quant["scale_dtype"])

    def nbytes(self, rows, cols, p):
        """The qs plane (the table's block bytes) + one or two planes of a scale per group."""
        g = p.group_size or cols
        planes = 1 if p.symmetric else 2
        return super().nbytes(rows, cols, p) + rows * (cols // g) * DTYPES[p.scale_dtype].itemsize * planes

    def _groups(self, w, p):
        g = p.group_size or w.shape[1]
        return np.ascontiguousarray(w, dtype=np.float32).reshape(w.shape[0], -1, g)

    def _symmetric(self, x, p, name):
        """The scale of the nine candidates (s0 times 1 .. 1.5, as stored) with
        the least squared error, the first on ties; then its codes.

        Why it is written so: the candidates' scales and reciprocals are made
        for all nine at once (per group, small; any of them beyond f16 is an
        error), each candidate's error is found in two reused buffers, and
        only the index and error of the best so far are kept; the codes are
        made once, for the winner (the same function of x and its scale, so
        the same bytes). Keeping every candidate's codes ran at 11.7 M
        elements/s on one core of the 2-core VM, this at 26-30."""
        mx = x.max(axis=2, keepdims=True)
        mn = x.min(axis=2, keepdims=True)
        neg = -mn >= mx
        s0 = np.where(neg, np.maximum(-mn / np.float32(8), mx / np.float32(7)),
                      -np.maximum(mx / np.float32(8), -mn / np.float32(7))).astype(np.float32)
        cands = s0 * self.CANDIDATES  # [rows, groups, 9]
        if p.scale_dtype == "f16":
            _check_f16_range(cands, name)
        scales = _round_to(cands, p.scale_dtype)
        recips = _safe_recip(scales)
        q, t = np.empty_like(x), np.empty_like(x)
        best_err = np.full(s0.shape, np.inf, np.float32)
        best = np.zeros(s0.shape, np.intp)
        for k in range(len(self.CANDIDATES)):
            np.clip(np.rint(np.multiply(x, recips[..., k:k + 1], out=q), out=q), -8, 7, out=q)
            np.multiply(scales[..., k:k + 1], q, out=t)
            err = np.square(np.subtract(x, t, out=t), out=t).sum(axis=2, keepdims=True)
            better = err < best_err
            np.copyto(best_err, err, where=better)
            np.copyto(best, k, where=better)
        np.clip(np.rint(np.multiply(x, np.take_along_axis(recips, best, axis=2), out=q), out=q), -8, 7, out=q)
        return np.take_along_axis(scales, best, axis=2)[..., 0], None, (q + np.float32(8)).astype(np.uint8)

    def _affine(self, x, p, name):
        mn = x.min(axis=2, keepdims=True)
        span = (x.max(axis=2, keepdims=True) - mn) / np.float32(15)
        if p.scale_dtype == "f16":
            _check_f16_range(span, name)
            _check_f16_range(mn, name, "group minimum")
        s = _round_to(span, p.scale_dtype)
        m = _round_to(mn, p.scale_dtype)
        q = np.clip(np.rint((x - m) * _safe_recip(s)), 0, 15).astype(np.uint8)
        return s[..., 0], m[..., 0], q

    def _weighted(self, x, wts, p, name):
        """Under per-element weights: llama.cpp's searches (make_qx_quants for
        the symmetric grid, make_qkx3_quants for the affine one) pick the scale
        (and min), which are rounded to scale_dtype; every code is then the
        nearest one for the values as stored."""
        rows, groups, g = x.shape
        flat, fw = x.reshape(-1, g), wts.reshape(-1, g)
        if p.symmetric:
            s = qs.qx(flat, fw, 8)
            m = None
        else:
            s, the_min, _ = qs.qkx(flat, fw, 15, -0.9, 0.05, 36)
            m = (-the_min).reshape(rows, groups, 1)
        s = s.reshape(rows, groups, 1)
        if p.scale_dtype == "f16":
            _check_f16_range(s, name)
            if m is not None:
                _check_f16_range(m, name, "group minimum")
        s = _round_to(s, p.scale_dtype)
        if m is None:
            q = _nearest(x, s, -8, 7) + 8
        else:
            m = _round_to(m, p.scale_dtype)
            q = _nearest(x, s, 0, 15, m)
        return s[..., 0], None if m is None else m[..., 0], q.astype(np.uint8)

    def quantize_rows(self, w, p, name="tensor", importance=None):
        _finite_or_raise(w, name)
        x = self._groups(w, p)
        imp = _checked_importance(importance, w.shape[1], name)
        if imp is not None:
            s, m, q = self._weighted(x, self._groups(_row_weights(np.asarray(w, np.float32), imp), p), p, name)
        else:
            s, m, q = (self._symmetric if p.symmetric else self._affine)(x, p, name)
        sd = np.float16 if p.scale_dtype == "f16" else np.float32
        return QuantizedRows(_pack_nibbles(q.reshape(w.shape[0], -1)), s.astype(sd),
                             None if m is None else m.astype(sd))

    def dequantize_rows(self, qr, cols, p):
        g = p.group_size or cols
        q = _unpack_nibbles(qr.rows).astype(np.float32).reshape(qr.rows.shape[0], -1, g)
        s = qr.scales.astype(np.float32)[..., None]
        out = s * (q - np.float32(8)) if qr.mins is None else s * q + qr.mins.astype(np.float32)[..., None]
        return out.reshape(-1, cols)

    def block_width(self, cols, p):
        return p.group_size or cols

    def payload(self, qr):
        return [qr.rows.reshape(-1), qr.scales.view(np.uint8).reshape(-1)] + (
            [] if qr.mins is None else [qr.mins.view(np.uint8).reshape(-1)])

    def stream(self, row_chunks, p, rows, name, importance=None, error=None):
        """qs rows go out as they are made; the small scale/min planes follow."""
        scales, mins = [], []
        for qr in self.measured_pieces(row_chunks, p, name, importance, error):
            scales.append(qr.scales)
            if qr.mins is not None:
                mins.append(qr.mins)
            yield qr.rows.reshape(-1)
        yield np.concatenate(scales).view(np.uint8).reshape(-1)
        if mins:
            yield np.concatenate(mins).view(np.uint8).reshape(-1)

    def planes(self, raw, rows, cols, p):
        g = p.group_size or cols
        sd = np.dtype("<f2") if p.scale_dtype == "f16" else np.dtype("<f4")
        raw = np.frombuffer(raw, dtype=np.uint8)
        nq = rows * cols // 2
        ns = rows * (cols // g) * sd.itemsize
        qs = raw[:nq].reshape(rows, cols // 2)
        s = raw[nq:nq + ns].view(sd).astype(np.float32).reshape(rows, -1)
        m = None if p.symmetric else raw[nq + ns:nq + 2 * ns].view(sd).astype(np.float32).reshape(rows, -1)
        return qs, s, m

    def dequantize(self, raw, rows, cols, p):
        return self.dequantize_rows(QuantizedRows(*self.planes(raw, rows, cols, p)), cols, p)

    def error_bound(self, w, raw, p):
        """Every code is the nearest grid point of the scale (and min) as stored."""
        rows, cols = w.shape
        _qs, s, m = self.planes(raw, rows, cols, p)
        x = self._groups(w, p)
        tiny = np.float32(2**-22 if p.scale_dtype == "f16" else 2**-60)
        if p.symmetric:
            b = _grid_bound(x, s[..., None], -8, 7, np.float32(0), tiny)
        else:
            b = _grid_bound(x, s[..., None], 0, 15, m[..., None], tiny)
        return b.reshape(rows, cols)


# The quantized weight types, in registry order.
SCHEMES: dict[str, Scheme] = {n: weight_table.registered(n) for n in weight_table.names(quantized=True)}


def scheme_of(dtype: str) -> Scheme | None:
    return SCHEMES.get(dtype)
