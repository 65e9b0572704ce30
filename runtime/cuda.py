"""The CUDA side of the runtime: whether this build and machine can run it,
and the device kernels with their errors as one line.

The kernels exist only in a build made with ``make build-cuda``
(docs/cuda.md); on any other build, or where no device is visible,
``require`` says which of the two it is, so ``--device cuda`` is one clear
error (exit 1), never an AttributeError. Each wrapper here uploads its
operands, runs and copies the result back: the verification and benchmark
paths. The decoder keeps its weights on the device (decoder.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from iekit.formats.errors import IEError

from .native import NativeArgumentError, _native

DEVICES = ("cpu", "cuda")


def unavailable() -> str | None:
    """Why ``--device cuda`` cannot run here, or None when it can."""
    if not _native.cpu_features()["cuda_build"]:
        return "this iekit was built without CUDA (build it with `make build-cuda`, which needs nvcc)"
    if not _native.cuda_devices():
        return "no CUDA device is visible to this process (driver, CUDA_VISIBLE_DEVICES)"
    return None


def require(what: str = "") -> None:
    """Raise IEError (naming ``what``, the command, when given) when CUDA cannot run here."""
    why = unavailable()
    if why:
        raise IEError(f"{what + ' ' if what else ''}--device cuda: {why}")


def _call(name: str, *args: Any, **kwargs: Any) -> Any:
    """_native.<name>, its argument errors as NativeArgumentError and CUDA's
    runtime errors (no device, a fault, out of device memory) as IEError.
    Only a CUDA build has the function; the binding itself checks for a device."""
    fn = getattr(_native, name, None)
    if fn is None:
        require(name)
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        raise NativeArgumentError(str(e)) from None
    except RuntimeError as e:
        raise IEError(str(e)) from None


def gemv(w: np.ndarray, p: dict[str, Any], x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y = W x (+ bias) on the device; ``p`` is kernels.native_weight_args's description of W."""
    return _call("cuda_gemv", w, p["dtype"], p["rows"], p["cols"], x, bias=bias, group_size=p["group_size"],
                 symmetric=p["symmetric"], scale_dtype=p["scale_dtype"], tensor_scale=p["tensor_scale"])


def dequantize(w: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """W as float32 [rows, cols] from the device's dequantizer (bit-exact with the CPU's)."""
    return _call("cuda_dequantize", w, p["dtype"], p["rows"], p["cols"], group_size=p["group_size"],
                 symmetric=p["symmetric"], scale_dtype=p["scale_dtype"], tensor_scale=p["tensor_scale"])


def dedup_reconstruct(store: Any, name: str) -> np.ndarray:
    """Member ``name`` of a native DedupStore, rebuilt on the device (uint8 [nbytes])."""
    return _call("cuda_dedup_reconstruct", store, name)


def copy_gbps(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, GB/s)."""
    return _call("cuda_copy_gbps", nbytes=nbytes, iters=iters)


def bench_gemv(**kwargs: Any) -> dict[str, Any]:
    """_native.cuda_bench_gemv: device GEMV timing over weight copies that defeat L2."""
    return _call("cuda_bench_gemv", **kwargs)


class DeviceBsr:
    """A native BsrMatrix whose ``gemv`` runs on the device (verify bsr --device cuda)."""

    def __init__(self, m: Any) -> None:
        self.m = m

    def gemv(self, x: np.ndarray, bias: np.ndarray | None = None, threads: int = 1, isa: str = "") -> np.ndarray:
        m = self.m
        return _call("cuda_bsr_gemv", m.rows, m.cols, m.block_rows, m.block_cols, m.row_ptr, m.col_idx, m.values,
                     x, bias=bias)
