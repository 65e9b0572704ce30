"""The golden dedup artifact: a tiny IEBIN model with near-copy tensors and
what ``dedup-plan`` + ``dedup-extract`` make of it.

    python golden/dedup/make_golden_dedup.py [ROOT]     # default: golden/dedup

writes ROOT/model/{model.ie.json, model.ie.bin} and ROOT/model/dedup_out/
{tensor_map.json, groups.indices.json, model.defaults.bin, model.masks.bin,
model.exceptions.bin, model.dedup.json}. tests/test_dedup.py regenerates it
into a temporary directory and compares every file byte for byte.

Every byte comes from SHAKE-256 of a label (no RNG library whose stream
could change), so the output depends only on iekit.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

from iekit.convert.dedup_extract import extract
from iekit.convert.dedup_plan import plan, write_plan
from iekit.formats.atomic import StagedFiles
from iekit.formats.iebin import IebinWriter

MIN_BYTES = 1024  # the tensors are tiny; the default (4096) would skip them all


def det_bytes(label: str, n: int) -> np.ndarray:
    return np.frombuffer(hashlib.shake_256(label.encode()).digest(n), np.uint8).copy()


def near_copy(base: np.ndarray, label: str, changes: int, itemsize: int) -> np.ndarray:
    """``base`` with ``changes`` elements (of ``itemsize`` bytes) replaced."""
    out = base.copy()
    elems = base.size // itemsize
    pos = np.frombuffer(hashlib.shake_256(f"{label}/pos".encode()).digest(8 * changes), "<u8") % elems
    vals = det_bytes(f"{label}/val", changes * itemsize).reshape(changes, itemsize)
    for p, v in zip(pos, vals):
        out[int(p) * itemsize:(int(p) + 1) * itemsize] = v
    return out


def tensors() -> dict[str, tuple[str, list[int], bytes]]:
    out: dict[str, tuple[str, list[int], bytes]] = {}
    attn = det_bytes("attn", 2048)  # bf16 [16, 64]
    q4 = det_bytes("q4", 2048)  # u8 [2048]: quantized blocks are bytes too
    for i in range(4):
        # 1% of the 1024 elements changed (10), so each layer differs from the base.
        out[f"blk.{i}.attn.weight"] = ("bf16", [16, 64], near_copy(attn, f"attn.{i}", 10, 2).tobytes())
        if i < 3:
            out[f"blk.{i}.q4.weight"] = ("u8", [2048], near_copy(q4, f"q4.{i}", 20, 1).tobytes())
    out["noise.weight"] = ("bf16", [16, 64], det_bytes("noise", 2048).tobytes())  # same size, unrelated
    out["norm.weight"] = ("f32", [64], det_bytes("norm", 256).tobytes())  # below MIN_BYTES
    return out


def write_model(model_dir: Path) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    with StagedFiles(model_dir) as staged:
        w = IebinWriter(staged)
        for name, (dtype, shape, data) in tensors().items():
            w.add_tensor(name, dtype, shape, [data], len(data))
        w.finish(config={}, source={"kind": "hf_dir", "name": "golden-dedup", "revision": None, "shards": []},
                 tokenizer_files=[], aux_files=[])


def build(root: Path) -> Path:
    model_dir = root / "model"
    write_model(model_dir)
    p = plan(model_dir, min_bytes=MIN_BYTES)
    # Exercise both default kinds: the q4 group names its first member.
    for g in p.groups:
        if g.dtype == "u8":
            g.default_member = g.members[0]
    out = model_dir / "dedup_out"
    tm, gr = write_plan(p, out, overwrite=True)
    extract(model_dir, tm, gr, out / "model", overwrite=True)
    return model_dir


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    print(build(root))
