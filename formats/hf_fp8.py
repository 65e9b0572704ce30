"""Hugging Face's FP8 checkpoints read as the float weights they stand for.

Many models are published only, or first, in FP8 (Qwen3-*-FP8, GLM-4.5-FP8,
DeepSeek-V3, MiniMax-M2, Ministral 3, Devstral Small 2): config.json says
``quantization_config.quant_method = "fp8"`` (transformers'
FineGrainedFP8Config), and each quantized Linear ``X`` stores

- ``X.weight``: float8 e4m3fn codes [rows, cols] (F8_E4M3: sign, 4 exponent
  bits of bias 7, 3 mantissa bits; no infinities, 0x7F and 0xFF NaN);
- ``X.weight_scale_inv``: float32 scales, one per block of
  ``weight_block_size`` [bn, bk] elements ([ceil(rows / bn), ceil(cols / bk)],
  the last row and column of blocks cut short), or one for the whole
  matrix where ``weight_block_size`` is null;
- ``X.activation_scale`` (``activation_scheme`` "static" only): the scalar
  an FP8 kernel quantizes the layer's input with.

Every weight is code x its block's scale: transformers' dequantization
(``dequantize: true``), and llama.cpp's convert_hf_to_gguf.py, which both
multiply in float. ``read_as_floats`` lists each such weight as an f32
tensor under ``X.weight`` whose bytes are made as they are read, a row
block at a time (memory stays bounded), and drops its scales; so every tool
here (hf-to-iebin, q4-manifest, gptq, rotate) sees the float checkpoint.
The activation scale is dropped with them: the dequantized model, as
transformers computes it with ``dequantize``, multiplies float activations
(an FP8 kernel's rounding of them is a property of that kernel, not of the
weights). Where nothing asks for another type, hf-to-iebin writes these
weights in the checkpoint's own dtype (``default_dtype``), not f32. A fused
matrix's parts (Qwen3-Next-FP8's DeltaNet projections, blocked by head:
formats/fused_tensors.py) are the same matrix read at their own rows
(``Fp8Matrix.rows``), each with its block's scale.

Refused, one line naming the tensor or key: an F8_E4M3 tensor in a
checkpoint that is not FP8 or without its scales, scales without a weight,
scales of the wrong shape or not float32 (UE8M0 scale formats included),
a NaN code, a non-finite scale or a product past float32, a weight other
than a matrix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .casting import cast_bytes
from .dtypes import DTYPES, F8_E4M3
from . import hf_nvfp4
from .errors import IEError
from .safetensors_reader import CHUNK_BYTES, SafetensorsFile, SafetensorsTensor

SCALE, ACTIVATION = ".weight_scale_inv", ".activation_scale"
CHECKPOINT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def _e4m3_table() -> np.ndarray:
    """The float32 value of each e4m3fn byte (NaN for 0x7F and 0xFF)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(b & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


E4M3 = _e4m3_table()


def is_fp8(config: Any) -> bool:
    q = config.get("quantization_config") if isinstance(config, dict) else None
    return isinstance(q, dict) and q.get("quant_method") == "fp8"


def default_dtype(config: dict) -> str:
    """The dtype hf-to-iebin writes dequantized weights in: the checkpoint's
    own (config ``dtype`` / ``torch_dtype``: bfloat16 for every FP8 release
    above), else bf16."""
    name = config.get("dtype") or config.get("torch_dtype")
    return CHECKPOINT_DTYPES.get(name, "bf16") if isinstance(name, str) else "bf16"


def fp8_count(tensors: dict[str, tuple[Any, SafetensorsTensor]]) -> int:
    """How many of a checkpoint's tensors (read_as_floats') are FP8 weights read as floats."""
    return sum(isinstance(f, Fp8Matrix) for f, _t in tensors.values())


def float_config(config: dict, tensors: dict[str, tuple[Any, SafetensorsTensor]]) -> dict:
    """The config of the float checkpoint ``tensors`` stand for: without the
    quantization_config where they hold FP8 weights read as floats. (An fp8
    config over float weights is not such a checkpoint: transformers would
    quantize those on load, so it keeps its config, which ierun refuses.)"""
    if not fp8_count(tensors):
        return config
    return {k: v for k, v in config.items() if k != "quantization_config"}


@dataclass(frozen=True)
class Fp8Matrix:
    """One FP8 weight and its scales, read as the f32 matrix they stand
    for: the file interface (iter_chunks, read_rows, copy_to, path) a
    checkpoint tensor is read through, for the f32 ``tensor``."""

    sf: SafetensorsFile        # the codes' shard
    codes: SafetensorsTensor
    scale_sf: SafetensorsFile  # the scales' (another shard, where the index puts them there)
    scales: SafetensorsTensor
    block: tuple[int, int] | None  # [bn, bk], or None: one scale for the whole matrix
    tensor: SafetensorsTensor      # the f32 matrix as listed (name, shape, nbytes)
    # the codes' rows it holds, in order (a part of a fused matrix: formats/fused_tensors.py); None: all
    rows: tuple[int, ...] | None = None

    def _runs(self, per: int) -> Iterator[tuple[int, int]]:
        """[r0, r1) ranges of the codes' rows, in the matrix's order, at most ``per`` rows each."""
        rows = range(self.codes.shape[0]) if self.rows is None else self.rows
        i = 0
        while i < len(rows):
            j = i + 1
            while j < len(rows) and j - i < per and rows[j] == rows[j - 1] + 1:
                j += 1
            yield rows[i], rows[j - 1] + 1
            i = j

    @property
    def path(self):
        return self.sf.path

    def _scale_rows(self) -> np.ndarray:
        raw = b"".join(self.scale_sf.iter_chunks(self.scales))
        s = np.frombuffer(raw, np.float32).reshape(-1, self.scales.shape[-1] if self.scales.shape else 1)
        if not np.isfinite(s).all():
            i = tuple(int(x) for x in np.argwhere(~np.isfinite(s))[0])
            raise IEError(f"{self.scale_sf.path}: {self.scales.name}{list(i)}: scale {s[i]} is not finite")
        return s

    def _rows(self, r0: int, r1: int, scales: np.ndarray) -> np.ndarray:
        """Rows r0..r1 as float32 (codes and scales are float32: so is their product)."""
        cols = self.codes.shape[1]
        raw = self.sf.read_rows(self.codes, range(r0, r1))
        x = E4M3[np.frombuffer(raw, np.uint8)].reshape(r1 - r0, cols)
        if np.isnan(x).any():
            r, c = (int(v) for v in np.argwhere(np.isnan(x))[0])
            raise IEError(f"{self.sf.path}: {self.codes.name}[{r0 + r}, {c}]: the e4m3 NaN code (0x7F/0xFF) "
                          "stands for no weight")
        with np.errstate(over="ignore"):  # (an overflow is the error below, not a warning)
            if self.block is None:
                y = x * scales[0, 0]
            else:
                per_row = scales[np.arange(r0, r1) // self.block[0]]  # [r1 - r0, col blocks]
                y = x * np.repeat(per_row, self.block[1], axis=1)[:, :cols]
        if not np.isfinite(y).all():
            r, c = (int(v) for v in np.argwhere(~np.isfinite(y))[0])
            raise IEError(f"{self.sf.path}: {self.codes.name}[{r0 + r}, {c}]: code x scale overflows float32")
        return y

    def iter_chunks(self, t: SafetensorsTensor, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The f32 matrix's bytes, whole rows per chunk."""
        rows, cols = self.codes.shape
        per = max(1, chunk_bytes // (4 * cols)) if cols else rows or 1
        scales = self._scale_rows()
        for r0, r1 in self._runs(per):
            yield self._rows(r0, r1, scales).tobytes()

    def read_rows(self, t: SafetensorsTensor, rows: Iterable[int]) -> bytes:
        scales = self._scale_rows()
        held = range(self.codes.shape[0]) if self.rows is None else self.rows
        return b"".join(self._rows(held[r], held[r] + 1, scales).tobytes() for r in rows)

    def copy_to(self, t: SafetensorsTensor, dst_fd: int, dst_offset: int,
                advance: Callable[[int], None] | None = None) -> None:
        self.write_as("f32", dst_fd, dst_offset, advance)

    def write_as(self, dtype: str, dst_fd: int, dst_offset: int, advance: Callable[[int], None] | None = None) -> None:
        """The matrix in ``dtype`` (f32, bf16, f16: rounded to nearest even) into ``dst_fd`` at ``dst_offset``;
        ``advance`` gets the f32 bytes made."""
        for buf in self.iter_chunks(self.tensor):
            out = cast_bytes(buf, "f32", dtype)
            os.pwrite(dst_fd, out, dst_offset)
            dst_offset += len(out)
            if advance is not None:
                advance(len(buf))


def read_as_floats(config: Any, found: dict[str, tuple[Any, SafetensorsTensor]],
                   where: str) -> dict[str, tuple[Any, SafetensorsTensor]]:
    """The checkpoint's tensors (name -> (file, tensor)) with every FP8
    weight listed as the f32 matrix it stands for (module docstring) and its
    scales left out; a checkpoint without FP8 tensors as it is. ``where``
    names the checkpoint in messages."""
    fp8 = sorted(n for n, (_sf, t) in found.items() if t.dtype is F8_E4M3)
    if not is_fp8(config):
        if fp8 and not hf_nvfp4.is_nvfp4(config):  # (an NVFP4 checkpoint's scales are F8_E4M3: hf_nvfp4.split)
            raise IEError(f"{where}: {fp8[0]} is FP8 (F8_E4M3) but config.json has no quantization_config "
                          "with quant_method 'fp8' to say how its scales apply")
        return found
    q = config["quantization_config"]
    block = q.get("weight_block_size")
    if block is not None and not (isinstance(block, list) and len(block) == 2
                                  and all(type(b) is int and b > 0 for b in block)):
        raise IEError(f"{where}/config.json: quantization_config.weight_block_size: expected null or two positive "
                      f"integers, got {block!r}")
    if q.get("scale_fmt", "float") != "float":
        raise IEError(f"{where}/config.json: quantization_config.scale_fmt: {q.get('scale_fmt')!r}; float32 scales "
                      "are read ('float'), not UE8M0 ones")
    out = dict(found)
    for name in fp8:
        sf, t = found[name]
        base = name.removesuffix(".weight")
        scale = found.get(base + SCALE)
        if not name.endswith(".weight") or scale is None:
            raise IEError(f"{where}: {name} is FP8 without its scales ({base + SCALE})")
        if len(t.shape) != 2:
            raise IEError(f"{where}: {name}: FP8 weights are read as matrices [rows, cols], got shape {list(t.shape)}")
        rows, cols = t.shape
        s = scale[1]
        want = [[], [1]] if block is None else [[-(-rows // block[0]), -(-cols // block[1])]]
        if s.dtype.name != "f32" or list(s.shape) not in want:
            raise IEError(f"{where}: {base + SCALE}: {s.dtype.name} {list(s.shape)}; {name} [{rows}, {cols}] with "
                          f"weight_block_size {block} has f32 scales of shape {want[0]}")
        f32 = SafetensorsTensor(name, DTYPES["f32"], (rows, cols), 0, rows * cols * 4)
        out[name] = (Fp8Matrix(sf, t, scale[0], s, tuple(block) if block else None, f32), f32)
        del out[base + SCALE]
        act = out.pop(base + ACTIVATION, None)
        if act is not None and (act[1].dtype.name not in ("f32", "bf16") or act[1].shape not in ((), (1,))):
            raise IEError(f"{where}: {base + ACTIVATION}: expected a scalar, got {act[1].dtype.name} "
                          f"{list(act[1].shape)}")
    stray = sorted(n for n in out if n.endswith((SCALE, ACTIVATION)))
    if stray:
        raise IEError(f"{where}: {stray[0]} has no FP8 weight to scale")
    return out
