"""GEMV and dequantization of one IEBIN tensor, straight from its stored bytes.

Thin wrappers over the native kernels (``iekit.runtime._native``): they read
the weight description from a tensor entry of ``model.ie.json`` (``dtype``,
``shape`` = [rows, cols], and for quantized dtypes the ``quant`` object of
docs/formats/quant.md) and pass the payload through without copying it, so a
slice of an ``np.memmap`` of ``model.ie.bin`` works directly::

    mm = np.memmap(bin_path, dtype=np.uint8, mode="r")
    raw = mm[e["file_data_offset"] : e["file_data_offset"] + e["nbytes"]]
    y = kernels.gemv(raw, e, x, threads=2)

Bad arguments (wrong byte count, unsupported dtype, shapes) raise
``NativeArgumentError``, which is both an ``IEError`` and a ``ValueError``.
Which dtypes have kernels, and how a ``quant`` object reads, is
formats/weight_types.py's and formats/quant.py's.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from iekit.formats import weight_types
from iekit.formats.quant import Int4W, QuantDictError, QuantParams, matrix_dims
from iekit.formats.weight_types import WeightType

from . import cuda, native
from .native import NativeArgumentError

GEMV_DTYPES = weight_types.names(gemv=True)


def native_weight_args(wt: WeightType, rows: int, cols: int, params: QuantParams | None = None) -> dict[str, Any]:
    """The keyword arguments that describe a [rows, cols] matrix of weight
    type ``wt`` to the native kernels (gemv, dequantize, expected_nbytes,
    bench_gemv, the decoder's matrices): dtype, rows, cols, group_size,
    symmetric, scale_dtype, tensor_scale. The one place they are built.
    Only int4w has layout parameters (group_size 0 = none, for every other
    type); its ``params.group_size`` None means the whole row. nvfp4's
    tensor_scale (1 for every other type) the kernels multiply by."""
    args = {"dtype": wt.name, "rows": rows, "cols": cols, "group_size": 0, "symmetric": True, "scale_dtype": "f16",
            "tensor_scale": params.tensor_scale if params is not None else 1.0}
    if isinstance(wt, Int4W):
        args.update(group_size=params.group_size or cols, symmetric=params.symmetric, scale_dtype=params.scale_dtype)
    return args


def weight_params(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The native kernels' weight description of a tensor entry
    (``native_weight_args``); its ``quant`` object is parsed by the scheme,
    as the IEBIN validator does."""
    dtype = entry.get("dtype")
    shape = list(entry.get("shape", []))
    name = entry.get("name", "tensor")
    wt = weight_types.find(dtype)
    if wt is None or not wt.gemv:
        raise NativeArgumentError(f"{name}: dtype {dtype!r} has no GEMV kernel (supported: {', '.join(GEMV_DTYPES)})")
    # A block scheme's expert stack [experts, rows, cols] is its matrices'
    # rows one after another: one [experts * rows, cols] matrix.
    if len(shape) != 2 and not (len(shape) == 3 and wt.quantized and wt.STACKS):
        raise NativeArgumentError(f"{name}: GEMV needs a 2-D [rows, cols] tensor"
                                  f"{' (or a block-scheme stack [experts, rows, cols])' if wt.quantized else ''}, "
                                  f"got shape {shape}")
    count, rows, cols = matrix_dims([int(d) for d in shape])
    rows *= count
    q = entry.get("quant")
    params = None
    if wt.quantized:
        if not isinstance(q, Mapping):
            raise NativeArgumentError(f"{name}: quantized dtype {dtype!r} needs a 'quant' object")
        try:
            params = wt.parse_quant(dict(q), shape)
        except QuantDictError as e:
            where = f"{dtype} quant.{e.key}: " if e.key else ""
            only = f" ({' or '.join(map(str, e.allowed))} only)" if e.allowed else ""
            raise NativeArgumentError(f"{name}: {where}{e}{only}") from None
    elif q is not None:
        raise NativeArgumentError(f"{name}: float dtype {dtype!r} must not have a 'quant' object")
    return native_weight_args(wt, rows, cols, params)


def as_bytes(raw: Any) -> np.ndarray:
    """A zero-copy 1-D uint8 view of a tensor payload (bytes, memoryview,
    numpy array or memmap slice). Non-contiguous arrays are refused rather
    than copied."""
    if isinstance(raw, np.ndarray):
        if raw.dtype == np.uint8 and raw.ndim == 1:
            return raw
        if not raw.flags.c_contiguous:
            raise NativeArgumentError("weights must be a contiguous array")
        return raw.reshape(-1).view(np.uint8)
    return np.frombuffer(raw, dtype=np.uint8)


def expected_nbytes(entry: Mapping[str, Any]) -> int:
    return native.expected_nbytes(**weight_params(entry))


def gemv(raw: Any, entry: Mapping[str, Any], x: np.ndarray, bias: np.ndarray | None = None, threads: int = 1,
         act: str = "f32", isa: str = "", layout: str = "stored", device: str = "cpu") -> np.ndarray:
    """y = W x (+ bias) for x [cols] -> y [rows], or x [b, cols] (b <= 8) -> y [b, rows], float32.

    act="f32" (default) uses x as given; act="int8" first quantizes x to
    int8 with a scale per 32 elements (per 256 for the super-block types,
    whose act_block is 256) (faster; quantized weights only; error up to
    ~ |W| @ |x - x_int8|). layout="rows8" runs the decoder's batch-1 int8
    kernel over a row-interleaved copy (csrc/gemv/rows8.h) made for this call.
    device="cuda" runs the CUDA kernel instead (act f32, the stored layout)."""
    p = weight_params(entry)
    if device == "cuda":
        if act != "f32" or layout != "stored":
            raise NativeArgumentError("the CUDA GEMV takes act='f32' and layout='stored' only")
        return cuda.gemv(as_bytes(raw), p, x, bias)
    return native.gemv(as_bytes(raw), p["dtype"], p["rows"], p["cols"], x, bias=bias, group_size=p["group_size"],
                       symmetric=p["symmetric"], scale_dtype=p["scale_dtype"], tensor_scale=p["tensor_scale"], act=act,
                       threads=threads, isa=isa, layout=layout)


def max_rel_error(y: np.ndarray, x: np.ndarray, w64: np.ndarray, bias: np.ndarray | None = None,
                  allow_nonfinite: bool = False) -> float:
    """How far a kernel's y = W x (+ bias) is from float64, as every GEMV
    check in ierun measures it: max |y - ref| / (|x| @ |W|^T + |bias|), the
    error relative to the magnitude of the products summed (a plain
    relative error is meaningless where terms cancel). x is [b, cols], y
    [b, rows]. A non-finite output or reference is an infinite error (a
    failure), unless ``allow_nonfinite`` (weights the user declared may hold
    NaN/Inf, ``verify bsr --allow-nonfinite``): then outputs whose reference
    is not finite must be non-finite too, and are not measured."""
    x64 = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = x64 @ w64.T
        scale = np.abs(x64) @ np.abs(w64).T + 1e-30
        if bias is not None:
            want = want + bias
            scale = scale + np.abs(bias)
    fin = np.isfinite(want)
    if not np.array_equal(np.isfinite(y), fin) or (not allow_nonfinite and not fin.all()):
        return float("inf")
    return float((np.abs(y[fin] - want[fin]) / scale[fin]).max()) if fin.any() else 0.0


def dequantize(raw: Any, entry: Mapping[str, Any], device: str = "cpu") -> np.ndarray:
    """The tensor as float32 [rows, cols], bit-exact with docs/formats/quant.md
    (on either device)."""
    p = weight_params(entry)
    if device == "cuda":
        return cuda.dequantize(as_bytes(raw), p)
    return native.dequantize(as_bytes(raw), p["dtype"], p["rows"], p["cols"], group_size=p["group_size"],
                             symmetric=p["symmetric"], scale_dtype=p["scale_dtype"], tensor_scale=p["tensor_scale"])
