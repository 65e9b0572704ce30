"""Synthetic Hugging Face checkpoints at real sizes, for the benchmarks that
need one (bench_moe.py, scale_bench.py): safetensors shards written tensor
by tensor from a generator of byte chunks, so a 16 GB model is never held in
memory, with the config and the shard index transformers reads."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path
from typing import Callable, Iterable

ITEMSIZE = {"U8": 1, "BF16": 2, "F16": 2, "F32": 4}

Tensor = tuple[str, str, list[int]]  # name, safetensors dtype, shape


def write_shard(path: Path, tensors: list[Tensor], chunks: Callable[[str, str, list[int]], Iterable[bytes]]) -> int:
    """One safetensors file: the header, then each tensor's bytes as
    ``chunks(name, dtype, shape)`` yields them. Returns the data bytes."""
    header, off = {}, 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, dtype, shape in tensors:
            written = sum(f.write(c) for c in chunks(name, dtype, shape))
            if written != math.prod(shape) * ITEMSIZE[dtype]:
                raise ValueError(f"{name}: {written} bytes generated for {dtype} {shape}")
    return off


def write_checkpoint(d: Path, config: dict, shards: list[list[Tensor]],
                     chunks: Callable[[str, str, list[int]], Iterable[bytes]]) -> int:
    """``config`` and one shard per list of ``shards`` into ``d``, with
    model.safetensors.index.json; each shard named on stderr as it is done.
    Returns the checkpoint's data bytes."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=1))
    weight_map, total = {}, 0
    for s, tensors in enumerate(shards):
        fname = f"model-{s:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(d / fname, tensors, chunks)
        weight_map.update({t[0]: fname for t in tensors})
        print(f"  wrote {fname} ({total / 1e9:.2f} GB so far)", file=sys.stderr)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total

