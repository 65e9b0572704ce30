"""Hugging Face's MXFP4 checkpoints (gpt-oss) -> IEBIN ``mxfp4`` tensors, without dequantizing.

A checkpoint whose config.json says ``quantization_config.quant_method =
"mxfp4"`` stores each quantized matrix stack ``P`` (e.g.
``model.layers.0.mlp.experts.gate_up_proj``) as two uint8 tensors:

- ``P_blocks`` [experts, rows, cols / 32, 16]: per 32-element block, 16
  bytes of e2m1 codes, byte k holding element 2k (low nibble) and 2k + 1
  (high nibble);
- ``P_scales`` [experts, rows, cols / 32]: per block one E8M0 byte e, the
  block's scale 2^(e − 127).

Rows are output features and blocks run along the input (transformers
transposes after dequantizing), so a stack is [experts, rows, cols] in GEMV
orientation as it stands. IEBIN's ``mxfp4`` is ggml's block_mxfp4 instead
(docs/formats/quant.md): the scale byte in front of its block's codes and
the codes in q4_0's nibble order (byte j: elements j and j + 16). Why the
repack: one block is one contiguous 17-byte record like every other block
type, so the same row-contiguous kernels, dedup and validators read it, and
``gguf.quants`` is a byte-for-byte reference. The repack only moves bits:
every weight is the same value (tests/test_hf_mxfp4.py dequantizes both
sides).

Everything about a pair is checked before anything is written: both halves
present, uint8, shapes that agree, scale bytes that are finite E8M0 values
(at most 252, formats/quant.py's E8M0_MAX), and no float 3-D stack beside
MXFP4 ones in the same module (a layer mixing bf16 and MXFP4 experts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from iekit.formats.errors import IEError
from iekit.formats.quant import E8M0_MAX, SCHEMES, QuantParams
from iekit.formats.safetensors_reader import SafetensorsFile, SafetensorsTensor

BLOCKS, SCALES = "_blocks", "_scales"
CHUNK_ROWS_BYTES = 8 * 1024 * 1024  # block bytes repacked per step
MXFP4 = SCHEMES["mxfp4"]


@dataclass(frozen=True)
class Mxfp4Pair:
    """One HF blocks + scales pair: the IEBIN tensor it becomes."""

    name: str  # the IEBIN tensor name (the pair's common prefix)
    blocks: tuple[SafetensorsFile, SafetensorsTensor]
    scales: tuple[SafetensorsFile, SafetensorsTensor]

    @property
    def shape(self) -> list[int]:
        *lead, groups, _ = self.blocks[1].shape
        return [*lead, groups * 32]

    @property
    def nbytes(self) -> int:
        return MXFP4.tensor_nbytes(self.shape, QuantParams("mxfp4"))

    @property
    def source_nbytes(self) -> int:
        return self.blocks[1].nbytes + self.scales[1].nbytes


def quant_method(config: Any) -> str | None:
    q = config.get("quantization_config") if isinstance(config, dict) else None
    method = q.get("quant_method") if isinstance(q, dict) else None
    return method if isinstance(method, str) else None


def split_pairs(tensors: dict[str, tuple[SafetensorsFile, SafetensorsTensor]], config: Any,
                where: str) -> tuple[dict[str, tuple[SafetensorsFile, SafetensorsTensor]], list[Mxfp4Pair]]:
    """The checkpoint's tensors without its MXFP4 halves, and those halves as
    pairs (in name order). ``where`` names the checkpoint in messages.
    Raises IEError naming the tensor for every broken rule."""
    halves = {n for n in tensors if n.endswith(BLOCKS) or n.endswith(SCALES)}
    u8_halves = {n for n in halves if tensors[n][1].dtype.name == "u8"}
    method = quant_method(config)
    if method != "mxfp4":
        if u8_halves:
            n = sorted(u8_halves)[0]
            raise IEError(f"{where}: {n} is an MXFP4 half (uint8 *{BLOCKS} / *{SCALES}) but config.json "
                          f"quantization_config.quant_method is {method!r}, not 'mxfp4'")
        return tensors, []
    rest = dict(tensors)
    pairs = []
    for n in sorted(halves):
        if not n.endswith(BLOCKS):
            base = n[: -len(SCALES)]
            if base + BLOCKS not in tensors:
                raise IEError(f"{where}: {n} has no {base + BLOCKS} (an MXFP4 scale tensor needs its blocks)")
            continue
        base = n[: -len(BLOCKS)]
        if base + SCALES not in tensors:
            raise IEError(f"{where}: {n} has no {base + SCALES} (MXFP4 blocks need their E8M0 scales)")
        if base in tensors:
            raise IEError(f"{where}: {base} is both a tensor and an MXFP4 pair ({n})")
        pair = Mxfp4Pair(base, tensors[n], tensors[base + SCALES])
        _check_pair(pair, where)
        pairs.append(pair)
        del rest[n], rest[base + SCALES]
    _check_not_mixed(rest, pairs, where)
    return rest, pairs


def _check_pair(p: Mxfp4Pair, where: str) -> None:
    b, s = p.blocks[1], p.scales[1]
    for t in (b, s):
        if t.dtype.name != "u8":
            raise IEError(f"{where}: {t.name}: MXFP4 halves are uint8, got {t.dtype.name}")
    if len(b.shape) < 3 or b.shape[-1] != 16:
        raise IEError(f"{where}: {b.name}: shape {list(b.shape)} is not [..., rows, cols/32, 16]")
    if list(s.shape) != list(b.shape[:-1]):
        raise IEError(f"{where}: {s.name}: shape {list(s.shape)} does not match {b.name}'s blocks "
                      f"{list(b.shape[:-1])} (one scale per 32-element block)")
    if len(b.shape) > 4 or 0 in b.shape:
        raise IEError(f"{where}: {b.name}: shape {list(b.shape)}: expected [rows, cols/32, 16] or "
                      "[experts, rows, cols/32, 16], none empty")


def _check_not_mixed(rest: dict[str, tuple[SafetensorsFile, SafetensorsTensor]], pairs: list[Mxfp4Pair],
                     where: str) -> None:
    modules = {p.name.rpartition(".")[0]: p.name for p in pairs}
    for n, (_sf, t) in sorted(rest.items()):
        parent = n.rpartition(".")[0]
        if parent in modules and t.dtype.is_float and len(t.shape) >= 3:
            raise IEError(f"{where}: {parent} mixes MXFP4 ({modules[parent]}) and {t.dtype.name} ({n}) "
                          "expert weights; convert a checkpoint with one kind per layer")


def repack(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF blocks [n, 16] and scales [n] (uint8) -> IEBIN mxfp4 blocks [n, 17]:
    the codes in element order, packed as the scheme packs them."""
    codes = np.empty((blocks.shape[0], 32), np.uint8)
    codes[:, 0::2] = blocks & 0x0F
    codes[:, 1::2] = blocks >> 4
    return MXFP4.pack_blocks(scales, codes)


def chunks(p: Mxfp4Pair, advance: Callable[[int], None]) -> Iterator[bytes]:
    """The IEBIN payload of pair ``p``, a few MiB at a time (both halves read
    in step), every scale byte checked on the way."""
    (bsf, bt), (ssf, st) = p.blocks, p.scales
    nblocks = st.nbytes
    per = max(1, CHUNK_ROWS_BYTES // 16)
    done = 0
    for braw, sraw in zip(bsf.iter_chunks(bt, per * 16), ssf.iter_chunks(st, per)):
        b = np.frombuffer(braw, np.uint8).reshape(-1, 16)
        s = np.frombuffer(sraw, np.uint8)
        bad = np.flatnonzero(s > E8M0_MAX)
        if bad.size:
            k = done + int(bad[0])
            idx = tuple(int(i) for i in np.unravel_index(k, st.shape))
            raise IEError(f"{st.name}: E8M0 scale {s[bad[0]]} at {idx} is not a finite block scale "
                          f"(codes above {E8M0_MAX} overflow float32, 255 is NaN)")
        advance(len(braw) + len(sraw))
        done += s.size
        yield repack(b, s).tobytes()
    if done != nblocks:
        raise IEError(f"{st.name}: read {done} of {nblocks} scales")
