"""Seed corpora for the native fuzz targets, written from golden/ in each
harness's input encoding (see the comment at the top of each fuzz/*.cpp).

    python fuzz/make_seeds.py OUT_DIR     # OUT_DIR/<target>/seed-*
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

from iekit.formats import bsr, dedup

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden"


def dedup_seed(model_dir: Path) -> bytes:
    """fuzz_dedup_store's encoding of a real dedup artifact."""
    a = dedup.load_index(model_dir).arrays()
    out = struct.pack("<IBB", a["alignment"], len(a["group_nbytes"]), len(a["names"]))
    for n, off in zip(a["group_nbytes"], a["group_default_offset"]):
        out += struct.pack("<qq", int(n), int(off))
    for g, mo, mn, eo, ec in zip(a["member_group"], a["mask_offset"], a["mask_nbytes"], a["exc_offset"], a["exc_count"]):
        out += struct.pack("<Bqqqq", int(g), int(mo), int(mn), int(eo), int(ec))
    blobs = [(model_dir / name).read_bytes() for name in a["blob_names"]]
    out += struct.pack("<qqq", *a["blob_sizes"]) + struct.pack("<III", *map(len, blobs))
    return out + b"".join(blobs)


def bsr_arrays_seed(m: bsr.BsrMatrix) -> bytes:
    """fuzz_bsr_arrays' encoding (u16 dims, u8 blocks, u8 counts, u16 indices, f32 values)."""
    out = struct.pack("<HHBBBB", m.rows, m.cols, m.block_rows, m.block_cols, len(m.row_ptr), len(m.col_idx))
    out += np.asarray(m.row_ptr, "<u2").tobytes() + np.asarray(m.col_idx, "<u2").tobytes()
    return out + np.asarray(m.values, "<f4").tobytes()


def gemv_seeds() -> list[bytes]:
    """fuzz_gemv: u8 type, i64 rows, cols, group, u8 flags, then weight bytes."""
    rng = np.random.default_rng(0)
    seeds = []
    for t, (rows, cols, group) in enumerate([(4, 32, 0), (3, 64, 0), (2, 96, 0), (5, 128, 64), (2, 64, 0),
                                             (3, 96, 0), (4, 64, 0)]):
        seeds.append(struct.pack("<Bqqq", t, rows, cols, group) + bytes([0x41]) + rng.bytes(1024))
    return seeds


def main(out: Path) -> None:
    seeds: dict[str, list[bytes]] = {
        "fuzz_bsr_file": [p.read_bytes() for p in sorted((GOLDEN / "bsr").glob("*.bsr"))],
        "fuzz_bsr_arrays": [bsr_arrays_seed(bsr.read(p)) for p in sorted((GOLDEN / "bsr").glob("*.bsr"))
                            if bsr.read(p).rows < 65536],
        "fuzz_dedup_store": [dedup_seed(GOLDEN / "dedup" / "model" / "dedup_out")],
        "fuzz_gemv": gemv_seeds(),
        "fuzz_decoder": [bytes(range(256)) * 4],
    }
    for target, blobs in seeds.items():
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for i, b in enumerate(blobs):
            (d / f"seed-{i}").write_bytes(b)
    print(f"seeds: {', '.join(f'{t} {len(b)}' for t, b in seeds.items())} -> {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "build" / "fuzz-corpus")
