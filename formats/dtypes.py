"""The element dtypes of plain (unquantized) tensors, in one table.

IEBIN names dtypes in lowercase (``f32``); safetensors in uppercase
(``F32``). bf16 has no numpy dtype, so code that needs element values goes
through ``casting`` which handles it on uint16 bit patterns. The subset a
matrix can be stored in and run through GEMV is ``weight_types``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # IEBIN name, lowercase
    itemsize: int
    numpy: str | None  # numpy dtype string; None for bf16
    is_float: bool
    safetensors: str  # safetensors header name


_TABLE = [
    DType("f64", 8, "<f8", True, "F64"),
    DType("f32", 4, "<f4", True, "F32"),
    DType("f16", 2, "<f2", True, "F16"),
    DType("bf16", 2, None, True, "BF16"),
    DType("i64", 8, "<i8", False, "I64"),
    DType("i32", 4, "<i4", False, "I32"),
    DType("i16", 2, "<i2", False, "I16"),
    DType("i8", 1, "i1", False, "I8"),
    DType("u8", 1, "u1", False, "U8"),
    DType("bool", 1, "?", False, "BOOL"),
]

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}
# An element type a checkpoint may hold and no IEBIN tensor does: FP8 (e4m3fn) weights, which
# formats/hf_fp8.py reads as the floats they stand for (is_float False: never cast or copied as floats).
F8_E4M3 = DType("f8_e4m3", 1, None, False, "F8_E4M3")
FROM_SAFETENSORS: dict[str, DType] = {**{d.safetensors: d for d in _TABLE}, F8_E4M3.safetensors: F8_E4M3}

# Spellings found in legacy (pre-schema2) metadata, mapped to schema2 names.
LEGACY_ALIASES: dict[str, str] = {
    **{d.name.upper(): d.name for d in _TABLE},
    **{d.safetensors: d.name for d in _TABLE},
    "FLOAT32": "f32", "FP32": "f32", "FLOAT16": "f16", "FP16": "f16", "HALF": "f16",
    "BFLOAT16": "bf16", "FLOAT64": "f64", "FP64": "f64", "DOUBLE": "f64",
    "INT64": "i64", "INT32": "i32", "INT16": "i16", "INT8": "i8", "UINT8": "u8",
}

INT64_MAX = (1 << 63) - 1


def shape_elements(shape: list[int]) -> int:
    """Number of elements (1 for a scalar). Callers check the int64 limit."""
    n = 1
    for d in shape:
        n *= d
    return n


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a plain dtype; bf16 is viewed as its uint16 bits."""
    d = DTYPES[name]
    return np.dtype("<u2") if d.numpy is None else np.dtype(d.numpy)
