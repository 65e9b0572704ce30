"""Quantized tensor schemes: the one reference implementation.

One small class per scheme (vectorised numpy quantize / dequantize / error
bound): the quantized weight types of ``weight_types.py``, registered there
by subclassing (their sizes come from its table); ``SCHEMES`` is the
quantized part of that registry. The converter quantizes with it, the tests
compare it with ``gguf.quants`` byte for byte, and ``ierun verify int4``
checks the C++ dequantizers and kernels against it. Layouts and the exact
arithmetic are specified in docs/formats/quant.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from . import weight_types
from .dtypes import DTYPES
from .errors import IEError
from .weight_types import BLOCK, WeightType

F16_MAX = 65504.0


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


def _finite_or_raise(w: np.ndarray, name: str) -> None:
    if not np.isfinite(w).all():
        bad = np.argwhere(~np.isfinite(w))[0]
        raise IEError(f"{name}: non-finite value {w[tuple(bad)]} at {tuple(int(i) for i in bad)}; cannot quantize")


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


def _value_ok(v: object, allowed: tuple) -> bool:
    """``allowed`` is either types (bool / int) or a set of literal values.
    bool is never accepted as an int (JSON true is not 1)."""
    if _is_types(allowed):
        return isinstance(v, allowed) and (type(v) is bool) == (allowed == (bool,))
    return type(v) is not bool and v in allowed


def _is_types(allowed: tuple) -> bool:
    return isinstance(allowed[0], type)


class Scheme(WeightType):
    """Interface every scheme implements (matrix schemes: shape [rows, cols]).
    A concrete scheme is a registered weight type: ``class X(Scheme, weight_type="x")``."""

    def check(self, shape: list[int], p: QuantParams) -> str | None:
        """Why this tensor cannot use the scheme, or None."""
        if len(shape) != 2:
            return f"{self.name} needs a 2-D matrix, tensor has shape {shape}"
        if shape[1] % BLOCK:
            return f"{self.name} needs cols to be a multiple of {BLOCK}, got {shape[1]}"
        return None

    def quant_dict(self, cols: int, p: QuantParams) -> dict[str, Any]:
        raise NotImplementedError

    def params_from(self, quant: dict[str, Any], cols: int) -> QuantParams:
        """Parse a validated ``quant`` object."""
        raise NotImplementedError

    QUANT_KEYS: dict[str, tuple] = {}

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
        extra = sorted(set(quant) - set(self.QUANT_KEYS))
        if extra:
            raise QuantDictError(extra[0], f"unknown key {extra[0]!r}")
        if quant["scheme"] != self.name:
            raise QuantDictError("scheme", f"{quant['scheme']!r} does not match dtype {self.name!r}")
        cols = shape[1] if len(shape) == 2 else 0
        p = self.params_from(quant, cols)
        why = self.check(shape, p)
        if why:
            raise QuantDictError("", why)
        return p

    def quantize_rows(self, w: np.ndarray, p: QuantParams, name: str = "tensor") -> "QuantizedRows":
        raise NotImplementedError

    def dequantize(self, raw: np.ndarray, rows: int, cols: int, p: QuantParams) -> np.ndarray:
        raise NotImplementedError

    def error_bound(self, w: np.ndarray, raw: np.ndarray, p: QuantParams) -> np.ndarray:
        """Per-element bound on |w - dequantize(quantize(w))| (docs/formats/quant.md)."""
        raise NotImplementedError

    def quantize(self, w: np.ndarray, p: QuantParams, name: str = "tensor") -> np.ndarray:
        """Whole tensor -> payload bytes (uint8)."""
        return np.concatenate(list(self.stream([w], p, w.shape[0], name)))

    def stream(self, row_chunks, p: QuantParams, rows: int, name: str) -> Iterator[np.ndarray]:
        """Quantize an iterable of row chunks, yielding payload pieces in file order.
        Block schemes are row-contiguous, so each chunk's bytes go straight out."""
        for w in row_chunks:
            yield self.quantize_rows(w, p, name).rows.reshape(-1)


@dataclass
class QuantizedRows:
    rows: np.ndarray  # per-row payload, uint8 [n, row_bytes] (block schemes), or qs plane (int4w)
    scales: np.ndarray | None = None  # int4w scales [n, G] (already in scale dtype)
    mins: np.ndarray | None = None


class _Block(Scheme):
    """llama.cpp block formats: 32 elements per block, rows of whole blocks."""

    @property
    def QUANT_KEYS(self):  # noqa: N802 - same role as the class attribute
        return {"scheme": (self.name,), "block_size": (BLOCK,)}

    def quant_dict(self, cols: int, p: QuantParams) -> dict[str, Any]:
        return {"scheme": self.name, "block_size": BLOCK}

    def params_from(self, quant: dict[str, Any], cols: int) -> QuantParams:
        return QuantParams(self.name)

    def _blocks(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w, dtype=np.float32).reshape(-1, BLOCK)

    def _raw_blocks(self, raw: np.ndarray) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.block_bytes)

    def quantize_rows(self, w, p, name="tensor"):
        _finite_or_raise(w, name)
        rows = w.shape[0]
        return QuantizedRows(self._quantize_blocks(self._blocks(w), name).reshape(rows, -1))

    def dequantize(self, raw, rows, cols, p):
        return self._dequantize_blocks(self._raw_blocks(raw)).reshape(rows, cols)

    def error_bound(self, w, raw, p):
        blocks = self._blocks(w)
        d_exact = self._exact_d(blocks)
        d_stored = self._raw_blocks(raw)[:, 0:2].copy().view(np.float16).astype(np.float32)
        bound = self._bound(blocks, d_exact, d_stored, self._raw_blocks(raw))
        return np.broadcast_to(bound, blocks.shape).reshape(w.shape)


class Q4_0(_Block, weight_type="q4_0"):
    """llama.cpp's Q4_0: per block d (f16) and 32 nibbles, w = d × (q − 8)."""

    @staticmethod
    def _exact_d(b):
        m = np.take_along_axis(b, np.abs(b).argmax(axis=1, keepdims=True), axis=1)
        return (m / np.float32(-8)).astype(np.float32)

    def _quantize_blocks(self, b, name):
        d = self._exact_d(b)
        _check_f16_range(d, name)
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.trunc(b * _recip(d) + np.float32(8.5))
        q = _codes(v, 0, 15, np.uint8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), _pack_nibbles(q)], axis=1)

    def _dequantize_blocks(self, raw):
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = _unpack_nibbles(raw[:, 2:]).astype(np.float32) - np.float32(8)
        return d * q

    def _bound(self, b, d, d16, raw):
        # The side opposite the largest magnitude can clamp by up to one step.
        return np.abs(d) * np.float32(1 + 2**-8) + 8 * np.abs(d - d16) + np.float32(2**-24)


class Q4_1(_Block, weight_type="q4_1"):
    """llama.cpp's Q4_1: per block d, m (f16) and 32 nibbles, w = d × q + m."""

    @staticmethod
    def _exact_d(b):
        return ((b.max(axis=1, keepdims=True) - b.min(axis=1, keepdims=True)) / np.float32(15)).astype(np.float32)

    def _quantize_blocks(self, b, name):
        mn = b.min(axis=1, keepdims=True)
        d = self._exact_d(b)
        _check_f16_range(d, name)
        _check_f16_range(mn, name, "block minimum")
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.trunc((b - mn) * _recip(d) + np.float32(0.5))
        q = _codes(v, 0, 15, np.uint8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), mn.astype(np.float16).view(np.uint8),
                               _pack_nibbles(q)], axis=1)

    def _dequantize_blocks(self, raw):
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
        return d * _unpack_nibbles(raw[:, 4:]).astype(np.float32) + m

    def _bound(self, b, d, d16, raw):
        m16 = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
        mn = b.min(axis=1, keepdims=True)
        return (np.float32(0.5) * d * np.float32(1 + 2**-8) + np.abs(mn - m16)
                + 15 * np.abs(d - d16) + np.float32(2**-24))


class Q8_0(_Block, weight_type="q8_0"):
    """llama.cpp's Q8_0: per block d (f16) and 32 int8, w = d × q."""

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
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        return d * raw[:, 2:].copy().view(np.int8).astype(np.float32)

    def _bound(self, b, d, d16, raw):
        return np.float32(0.5) * d * np.float32(1 + 2**-8) + 127 * np.abs(d - d16) + np.float32(2**-24)


class Int4W(Scheme, weight_type="int4w"):
    """iekit's weight-only INT4, planar-v1 layout (qs | scales | mins)."""

    QUANT_KEYS = {"scheme": ("int4w",), "group_size": (int,), "symmetric": (bool,),
                  "scale_dtype": ("f16", "f32"), "layout": ("planar-v1",)}
    CANDIDATES = np.float32(1) + np.arange(9, dtype=np.float32) / np.float32(16)

    def check(self, shape, p):
        why = super().check(shape, p)
        if why:
            return why
        cols = shape[1]
        g = p.group_size or cols
        if g % BLOCK or cols % g:
            return f"int4w group_size {g} must be a multiple of {BLOCK} that divides cols ({cols})"
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
        mx = x.max(axis=2, keepdims=True)
        mn = x.min(axis=2, keepdims=True)
        neg = -mn >= mx
        s0 = np.where(neg, np.maximum(-mn / np.float32(8), mx / np.float32(7)),
                      -np.maximum(mx / np.float32(8), -mn / np.float32(7))).astype(np.float32)
        best_s = best_q = best_err = None
        for c in self.CANDIDATES:
            s = _round_to(s0 * c, p.scale_dtype)
            if p.scale_dtype == "f16":
                _check_f16_range(s0 * c, name)
            q = np.clip(np.rint(x * _safe_recip(s)) + np.float32(8), 0, 15)
            err = ((x - s * (q - np.float32(8))) ** 2).sum(axis=2, keepdims=True)
            if best_err is None:
                best_s, best_q, best_err = s, q, err
            else:
                better = err < best_err
                best_s = np.where(better, s, best_s)
                best_q = np.where(better, q, best_q)
                best_err = np.where(better, err, best_err)
        return best_s[..., 0], None, best_q.astype(np.uint8)

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

    def quantize_rows(self, w, p, name="tensor"):
        _finite_or_raise(w, name)
        x = self._groups(w, p)
        s, m, q = (self._symmetric if p.symmetric else self._affine)(x, p, name)
        sd = np.float16 if p.scale_dtype == "f16" else np.float32
        return QuantizedRows(_pack_nibbles(q.reshape(w.shape[0], -1)), s.astype(sd),
                             None if m is None else m.astype(sd))

    def stream(self, row_chunks, p, rows, name):
        """qs rows go out as they are made; the small scale/min planes follow."""
        scales, mins = [], []
        for w in row_chunks:
            qr = self.quantize_rows(w, p, name)
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
        g = p.group_size or cols
        qs, s, m = self.planes(raw, rows, cols, p)
        q = _unpack_nibbles(qs).astype(np.float32).reshape(rows, -1, g)
        if p.symmetric:
            out = s[..., None] * (q - np.float32(8))
        else:
            out = s[..., None] * q + m[..., None]
        return out.reshape(rows, cols).astype(np.float32)

    def error_bound(self, w, raw, p):
        rows, cols = w.shape
        _qs, s, m = self.planes(raw, rows, cols, p)
        x = self._groups(w, p)
        tiny = np.float32(2**-22 if p.scale_dtype == "f16" else 2**-60)
        if p.symmetric:
            b = np.float32(0.5) * np.abs(s) * np.float32(1 + 2**-8) + tiny
        else:
            mn = x.min(axis=2)
            span = (x.max(axis=2) - mn) / np.float32(15)
            b = (np.float32(0.5) * s * np.float32(1 + 2**-8) + np.abs(m - mn)
                 + 15 * np.abs(s - span) + tiny)
        return np.broadcast_to(b[..., None], x.shape).reshape(rows, cols)


# The quantized weight types, in registry order.
SCHEMES: dict[str, Scheme] = {n: weight_types.get(n) for n in weight_types.names(quantized=True)}


def scheme_of(dtype: str) -> Scheme | None:
    return SCHEMES.get(dtype)
