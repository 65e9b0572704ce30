"""A dense float matrix from a file: .npy, raw float32, or one tensor of an IEBIN artifact.

``ieconv block-sparse`` sparsifies such a matrix and ``ierun verify bsr``
checks a .bsr file against it; both read it through ``load_dense``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import checksums, iebin, weight_types
from .casting import decode_f32
from .errors import FormatError, IEError
from .fileio import check_regular, iter_range

IEBIN_FLOAT_DTYPES = weight_types.names(quantized=False)


def load_npy(path: Path) -> np.ndarray:
    """A 2-D float32/float16/bfloat16 .npy as float32 (both widen exactly).

    numpy has no bfloat16 of its own: ml_dtypes' bfloat16 is saved as a
    2-byte void ('|V2'), which is read as bfloat16 bits."""
    if os.path.exists(path):  # a FIFO or a device is an error, never a hang (a missing file: OSError as before)
        check_regular(path)
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
    """One 2-D f32/f16/bf16 tensor of an IEBIN artifact as float32, or one
    expert ``STACK[e]`` of a 3-D stack (tensor_entries.expert_slice); checksum
    verified (an expert's: its whole stack's, streamed)."""
    m = iebin.load_model(model_dir)
    t = m.entry(name)
    stack = m.tensor(t["stack"]) if "stack" in t else t
    where = f"tensors[{m.tensors.index(stack)}]"
    if t["dtype"] not in IEBIN_FLOAT_DTYPES:
        raise FormatError(m.meta_path, f"{where}.dtype", f"tensor {name!r}: {t['dtype']} cannot be made block-sparse "
                          f"(one of {', '.join(IEBIN_FLOAT_DTYPES)})")
    if len(t["shape"]) == 3:
        raise FormatError(m.meta_path, f"{where}.shape", f"tensor {name!r} is an expert stack {t['shape']}; "
                          f"name one expert, {name}[e] with e < {t['shape'][0]}")
    if len(t["shape"]) != 2 or 0 in t["shape"]:
        raise FormatError(m.meta_path, f"{where}.shape", f"tensor {name!r}: must be 2-D and non-empty, got {t['shape']}")
    with open(m.path_of(t), "rb") as f:
        f.seek(t["file_data_offset"])
        raw = f.read(t["nbytes"])
        if len(raw) != t["nbytes"] or _digest(f, stack, t, raw, m.checksum) != stack[m.checksum]:
            raise FormatError(m.meta_path, f"{where}.{m.checksum}", f"tensor {name!r}: checksum mismatch")
    return decode_f32(raw, t["dtype"]).reshape(t["shape"])


def _digest(f, stack: dict, t: dict, raw: bytes, alg: str) -> str:
    """The digest of ``stack``'s bytes: ``raw`` itself when ``t`` is the
    stack, else the stack read from ``f`` with ``raw`` in its expert's place."""
    if t is stack:
        return checksums.digest(alg, raw)
    h = checksums.ALGORITHMS[alg].new()
    for e in range(stack["shape"][0]):
        if e == t["expert"]:
            h.update(raw)
            continue
        for buf in iter_range(f, stack["file_data_offset"] + e * t["nbytes"], t["nbytes"]):
            h.update(buf)
    return h.hexdigest()


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
