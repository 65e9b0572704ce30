"""Float element decoding and casts, bit-compatible with torch.

The converter casts with them (``ieconv hf-to-iebin --dtype``); the
converter, the runtime and the tests decode float payloads to float32 with
``decode_f32``.

Every cast goes through float32, as torch's ``Tensor.to`` does for
half/bfloat16 targets: f32 -> bf16 rounds to nearest even and maps every NaN
to 0xFFFF (what torch's vectorised CPU cast emits; checked against torch in
golden/ref/cast_edge.safetensors); f32 -> f16 is IEEE round-to-nearest-even
except NaNs, which keep sign and the top payload bits and are made quiet
(sign | 0x7E00 | mantissa >> 13), as torch emits; numpy differs there.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DTYPES, numpy_dtype


# Casts run this many elements at a time: each step's temporaries (a few
# numpy passes per rule) stay in L2 instead of streaming through memory.
# An 8 MiB f32 -> bf16 chunk: 8.0-9.4 ms as whole-array numpy, 4.3-4.6 ms
# so; the f16 casts, numpy's own scalar loop, gain less (0-40%).
PIECE = 1 << 16

F32_INF_BITS = 0x7F800000  # float32 +inf; |bits| above it are NaNs


def _decode_piece(a: np.ndarray, dtype: str, f32: np.ndarray) -> np.ndarray:
    """One piece as float32: ``a`` itself for f32, else written into the
    scratch ``f32``."""
    if dtype == "f32":
        return a
    if dtype == "bf16":
        bits = f32.view(np.uint32)
        bits[...] = a
        np.left_shift(bits, 16, out=bits)
    else:
        f32[...] = a  # f16 exactly, f64 rounded to nearest
    return f32


def _encode_piece(x: np.ndarray, out: np.ndarray, dtype: str, u32: np.ndarray) -> None:
    """float32 ``x`` into ``out`` (``dtype``), by the rules in the module docstring."""
    if dtype == "bf16":
        u = x.view(np.uint32)
        np.right_shift(u, 16, out=u32)
        np.bitwise_and(u32, 1, out=u32)
        np.add(u32, 0x7FFF, out=u32)  # round to nearest even: no uint32 overflow below the NaNs
        np.add(u32, u, out=u32)
        np.right_shift(u32, 16, out=u32)
        out[...] = u32
        np.bitwise_and(u, 0x7FFFFFFF, out=u32)
        out[u32 > F32_INF_BITS] = 0xFFFF
        return
    out[...] = x
    if dtype == "f16":
        nan = np.isnan(x)
        if nan.any():
            u = x[nan].view(np.uint32)
            out.view(np.uint16)[nan] = ((u >> 16) & 0x8000) | 0x7E00 | ((u & 0x7FFFFF) >> 13)


def _cast(a: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Elements of ``a`` (dtype ``src``) as ``dst``, through float32, a piece at a time."""
    out = np.empty(a.size, numpy_dtype(dst))
    n = min(a.size, PIECE)
    f32, u32 = np.empty(n, np.float32), np.empty(n, np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, a.size, PIECE):
            k = min(PIECE, a.size - s)
            x = _decode_piece(a[s:s + k], src, f32[:k])
            if dst == "f32":
                out[s:s + k] = x
            else:
                _encode_piece(x, out[s:s + k], dst, u32[:k])
    return out


def decode_f32(raw: bytes, dtype: str) -> np.ndarray:
    """Elements of a floating dtype as float32 (exact except f64 -> f32)."""
    a = np.frombuffer(raw, dtype=numpy_dtype(dtype))
    return a.copy() if dtype == "f32" else _cast(a, dtype, "f32")


def encode_f32(x: np.ndarray, dtype: str) -> bytes:
    return _cast(np.ascontiguousarray(x, dtype=np.float32).reshape(-1), "f32", dtype).tobytes()


def cast_bytes(raw: bytes, src: str, dst: str) -> bytes:
    """Cast a whole number of elements from ``src`` to ``dst``."""
    if src == dst:
        return raw
    if not (DTYPES[src].is_float and DTYPES[dst].is_float):
        raise ValueError(f"cast {src} -> {dst}: only floating dtypes are cast")
    return _cast(np.frombuffer(raw, dtype=numpy_dtype(src)), src, dst).tobytes()
