"""NVIDIA's NVFP4 checkpoints -> IEBIN ``nvfp4`` tensors, without dequantizing.

Two writers make them. TensorRT Model Optimizer (config.json
``quantization_config`` ``quant_method`` "modelopt", ``quant_algo`` "NVFP4":
nvidia/*-FP4 and *-NVFP4 on the Hub) stores each quantized Linear ``X`` as

- ``X.weight``: e2m1 codes, two per byte, [rows, cols/2] uint8 (byte k:
  element 2k in the low nibble, 2k + 1 in the high);
- ``X.weight_scale``: float8 e4m3fn [rows, cols/16], one per 16 weights;
- ``X.weight_scale_2``: one float32 for the matrix;
- ``X.input_scale``: one float32, the activation's calibration (W4A4).

llm-compressor (``quant_method`` "compressed-tensors", ``format``
"nvfp4-pack-quantized": RedHatAI/*-NVFP4) stores the same codes as
``X.weight_packed`` and the per-matrix scales as their reciprocals,
``X.weight_global_scale`` and ``X.input_global_scale``; llama.cpp's
converter takes 1 / each in float32, and so does this import.

A weight is e2m1 × weight_scale × weight_scale_2. IEBIN's ``nvfp4`` is
ggml's block_nvfp4 (docs/formats/quant.md): the same codes and scale bytes
moved into 64-weight blocks (four scale bytes, then each 16 weights' codes
as element j low and j + 8 high), ``weight_scale_2`` the quant's
``tensor_scale`` and ``input_scale`` its ``input_scale``: the bytes
llama.cpp's converter writes for the same checkpoint, so this import and
gguf-to-iebin of that converter's file are the same artifact
(tests/test_nvfp4.py). Nothing is dequantized; the repack only moves bits.

``k_scale`` / ``v_scale`` (an FP8 KV cache's calibration, which
``kv_cache_quant_algo`` FP8 checkpoints carry) are left out, as llama.cpp's
converter leaves them: ierun's cache is f16, f32 or q8_0 and calibrates its
own. Refused, one line naming the tensor: NVFP4 parts in a checkpoint whose
config does not say NVFP4, a weight without its scales or scales without a
weight, shapes that disagree, columns not a multiple of 64 (ggml's block),
a scale byte with its sign bit set or E4M3's NaN, a second-level scale that
is not one positive finite float32 (its reciprocal too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from . import finite
from .errors import IEError
from .quant import SCHEMES, QuantParams
from .safetensors_reader import SafetensorsFile, SafetensorsTensor

NVFP4 = SCHEMES["nvfp4"]
KV_SCALES = (".k_scale", ".v_scale")


@dataclass(frozen=True)
class Layout:
    """Where a writer keeps a Linear X's parts (suffixes of X), and whether
    its per-matrix scales are stored as reciprocals."""

    codes: str
    scale: str
    scale_2: str
    input: str
    reciprocal: bool


MODELOPT = Layout(".weight", ".weight_scale", ".weight_scale_2", ".input_scale", False)
COMPRESSED = Layout(".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale", True)
CHUNK_BYTES = 8 * 1024 * 1024  # code bytes repacked per step

Tensors = dict[str, tuple[SafetensorsFile, SafetensorsTensor]]


@dataclass(frozen=True)
class Nvfp4Matrix:
    """One NVFP4 Linear: the IEBIN tensor ``name`` (its ``X.weight``)."""

    name: str
    codes: tuple[SafetensorsFile, SafetensorsTensor]
    scales: tuple[SafetensorsFile, SafetensorsTensor]
    params: QuantParams

    @property
    def shape(self) -> list[int]:
        rows, half = self.codes[1].shape
        return [rows, 2 * half]

    @property
    def nbytes(self) -> int:
        return NVFP4.tensor_nbytes(self.shape, self.params)

    @property
    def source_nbytes(self) -> int:
        return self.codes[1].nbytes + self.scales[1].nbytes


def layout(config: Any) -> Layout | None:
    """The NVFP4 layout config.json's quantization_config says, or None."""
    q = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(q, dict):
        return None
    if q.get("quant_method") == "modelopt" and q.get("quant_algo") == "NVFP4":
        return MODELOPT
    groups = q.get("config_groups")
    if q.get("quant_method") == "compressed-tensors" and (q.get("format") == "nvfp4-pack-quantized" or (
            q.get("format") == "mixed-precision" and isinstance(groups, dict) and groups
            and all(isinstance(g, dict) and g.get("format") == "nvfp4-pack-quantized" for g in groups.values()))):
        return COMPRESSED
    return None


def is_nvfp4(config: Any) -> bool:
    return layout(config) is not None


def float_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as the artifact keeps it: without quantization_config
    (each tensor's quant object says what it is)."""
    return {k: v for k, v in config.items() if k != "quantization_config"} if is_nvfp4(config) else config


def _scalar(sf_t: tuple[SafetensorsFile, SafetensorsTensor], where: str, reciprocal: bool) -> float:
    sf, t = sf_t
    if t.dtype.name != "f32" or int(np.prod(t.shape)) != 1:
        raise IEError(f"{where}: {t.name}: {t.dtype.name} {list(t.shape)}; expected one float32")
    v = np.frombuffer(b"".join(sf.iter_chunks(t)), "<f4")[0]
    with np.errstate(divide="ignore", over="ignore"):
        v = float(np.float32(1) / v if reciprocal else v)
    if not (np.isfinite(v) and v > 0):
        raise IEError(f"{where}: {t.name}: a scale of {v}; it must be positive and finite")
    return v


def split(tensors: Tensors, config: Any, where: str) -> tuple[Tensors, list[Nvfp4Matrix]]:
    """The checkpoint's tensors without its NVFP4 parts (and KV-cache scales),
    and those parts as matrices, in name order; raises IEError naming the
    tensor for every broken rule."""
    lay = layout(config)
    if lay is None:
        parts = sorted(n for n in tensors if n.endswith((MODELOPT.scale_2, COMPRESSED.scale_2)))
        if parts:
            raise IEError(f"{where}: {parts[0]}: an NVFP4 scale, but config.json quantization_config is neither "
                          "Model Optimizer's NVFP4 (quant_method 'modelopt', quant_algo 'NVFP4') nor "
                          "compressed-tensors' nvfp4-pack-quantized")
        return tensors, []
    rest = {n: v for n, v in tensors.items() if not n.endswith(KV_SCALES)}
    out = []
    for base in sorted(n.removesuffix(lay.scale) for n in tensors if n.endswith(lay.scale)):
        w, scale_name, s2_name = base + lay.codes, base + lay.scale, base + lay.scale_2
        if w not in tensors:
            raise IEError(f"{where}: {scale_name} has no {w} (NVFP4 scales need their codes)")
        if s2_name not in tensors:
            raise IEError(f"{where}: {w} has no {s2_name} (its NVFP4 scale per matrix)")
        codes, scales = tensors[w], tensors[scale_name]
        c, s = codes[1], scales[1]
        if c.dtype.name != "u8" or len(c.shape) != 2 or 0 in c.shape:
            raise IEError(f"{where}: {w}: {c.dtype.name} {list(c.shape)}; NVFP4 codes are uint8 [rows, cols/2]")
        rows, cols = c.shape[0], 2 * c.shape[1]
        if cols % 64:
            raise IEError(f"{where}: {w}: {cols} columns; nvfp4's blocks are 64 weights (ggml's), which they do not "
                          "divide")
        if s.dtype.name != "f8_e4m3" or list(s.shape) != [rows, cols // 16]:
            raise IEError(f"{where}: {s.name}: {s.dtype.name} {list(s.shape)}; expected f8_e4m3 [{rows}, {cols // 16}] "
                          "(one per 16 weights)")
        inp = _scalar(tensors[base + lay.input], where, lay.reciprocal) if base + lay.input in tensors else None
        p = QuantParams("nvfp4", tensor_scale=_scalar(tensors[s2_name], where, lay.reciprocal), input_scale=inp)
        out.append(Nvfp4Matrix(base + ".weight", codes, scales, p))
        for n in (w, scale_name, s2_name, base + lay.input):
            rest.pop(n, None)
    left = sorted(n for n, (_sf, t) in rest.items() if t.dtype.name == "f8_e4m3" or n.endswith(lay.scale_2))
    if left:
        raise IEError(f"{where}: {left[0]}: not part of an NVFP4 weight (an FP8 layer beside NVFP4 ones, Model "
                      "Optimizer's mixed precision, is not supported)")
    return rest, out


def chunks(m: Nvfp4Matrix, advance: Callable[[int], None]) -> Iterator[bytes]:
    """The IEBIN payload of ``m``, a few MiB of rows at a time (codes and
    scales read in step), every scale byte checked on the way by the payload
    scan's rule (finite.py), naming the checkpoint's scale tensor."""
    (csf, ct), (ssf, st) = m.codes, m.scales
    rows, cols = m.shape
    check = finite.checker({"dtype": "nvfp4", "shape": m.shape, "quant": NVFP4.quant_dict(cols, m.params)},
                           ssf.path, st.name)
    per = max(2, CHUNK_BYTES // (cols // 2)) // 2 * 2  # rows per step (even: whole 8-byte units of scales)
    for craw, sraw in zip(csf.iter_chunks(ct, per * cols // 2), ssf.iter_chunks(st, per * cols // 16)):
        b = np.frombuffer(craw, np.uint8).reshape(-1, cols // 2)
        codes = np.empty((b.shape[0], cols), np.uint8)
        codes[:, 0::2] = b & 0x0F
        codes[:, 1::2] = b >> 4
        out = NVFP4.pack_blocks(np.frombuffer(sraw, np.uint8).reshape(-1, 4), codes.reshape(-1, 64)).tobytes()
        check(out)
        advance(len(craw) + len(sraw))
        yield out
