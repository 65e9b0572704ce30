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


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # No uint32 overflow: the largest non-NaN pattern plus the bias stays < 2^32.
    out = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    out[np.isnan(x)] = 0xFFFF
    return out


def decode_f32(raw: bytes, dtype: str) -> np.ndarray:
    """Elements of a floating dtype as float32 (exact except f64 -> f32)."""
    a = np.frombuffer(raw, dtype=numpy_dtype(dtype))
    if dtype == "bf16":
        return bf16_bits_to_f32(a)
    return a.astype(np.float32)


def encode_f32(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "bf16":
        return f32_to_bf16_bits(x).tobytes()
    out = x.astype(numpy_dtype(dtype))
    if dtype == "f16":
        nan = np.isnan(x)
        if nan.any():
            u = np.ascontiguousarray(x[nan], dtype=np.float32).view(np.uint32)
            out.view(np.uint16)[nan] = ((u >> 16) & 0x8000) | 0x7E00 | ((u & 0x7FFFFF) >> 13)
    return out.tobytes()


def cast_bytes(raw: bytes, src: str, dst: str) -> bytes:
    """Cast a whole number of elements from ``src`` to ``dst``."""
    if src == dst:
        return raw
    if not (DTYPES[src].is_float and DTYPES[dst].is_float):
        raise ValueError(f"cast {src} -> {dst}: only floating dtypes are cast")
    with np.errstate(over="ignore", invalid="ignore"):
        return encode_f32(decode_f32(raw, src), dst)
