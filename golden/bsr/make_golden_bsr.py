"""Writes golden/bsr: small dense inputs and their .bsr conversions (cases.json).

Run with an installed iekit: ``python golden/bsr/make_golden_bsr.py``. The
inputs are hand-written or drawn from a seeded generator and stored as .npy
(or raw .bin); the tests re-convert the committed inputs and compare bytes,
so they never depend on this script's random streams.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from iekit.convert.block_sparse import convert_file

HERE = Path(__file__).resolve().parent

# Hand-written: two non-zero 2×2 blocks on the diagonal, one off-diagonal zero block pair.
HAND_4X4 = [[1, 2, 0, 0],
            [3, 4, 0, 0],
            [0, 0, 0, 0],
            [0, 0, 5, 6]]

# 4×4 blocks: (0,0) dense, (0,1) zero, (1,0) one non-zero (-1 at [6, 1]), (1,1) identity-like.
HAND_8X8 = [[1, 1, 1, 1, 0, 0, 0, 0],
            [2, 2, 2, 2, 0, 0, 0, 0],
            [0, 0, 0, 3, 0, 0, 0, 0],
            [4, 0, 0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, 2, 0, 0],
            [0, -1, 0, 0, 0, 0, 3, 0],
            [0, 0, 0, 0, 0, 0, 0, 4]]


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20251122)
    tail = rng.standard_normal((10, 13)).astype(np.float16)
    tail[:4, :8] = 0  # one whole zero block
    tail[rng.random((10, 13)) < 0.5] = 0
    raw = rng.standard_normal((12, 20)).astype(np.float32)
    raw[4:8] = 0  # an empty block row
    raw[:, 8:12] = 0
    mixed = rng.standard_normal((24, 40)).astype(np.float32) * 0.1
    mixed[rng.random((24, 40)) < 0.97] = 0  # sparse small values: mostly below the threshold
    mixed[0:8, 8:16] += 2.0  # two strong blocks
    mixed[16:24, 32:40] -= 1.5
    ties = np.zeros((20, 36), np.float32)
    for br, bc, v in [(0, 0, 1.0), (0, 3, 1.0), (1, 1, 1.0), (2, 8, 1.0), (4, 4, 1.0), (3, 2, 0.5),
                      (1, 7, 2.0), (4, 0, 0.25), (2, 2, -1.0)]:
        ties[br * 4:(br + 1) * 4, bc * 4:(bc + 1) * 4] = v  # six blocks tie at |v| = 1
    return {"hand_4x4.npy": np.array(HAND_4X4, np.float32), "hand_8x8.npy": np.array(HAND_8X8, np.float32),
            "tail_10x13_f16.npy": tail, "raw_12x20.bin": raw, "mixed_24x40.npy": mixed, "ties_20x36.npy": ties}


def convert_case(case: dict, src_dir: Path, out: Path) -> None:
    dense = src_dir / case["dense"]
    convert_file(out, case["block_rows"], case["block_cols"], dense=dense, rows=case.get("rows"),
                 cols=case.get("cols"), threshold=case.get("threshold"), keep_density=case.get("keep_density"),
                 overwrite=True)


def main() -> None:
    for name, a in inputs().items():
        if name.endswith(".npy"):
            np.save(HERE / name, a)
        else:
            a.astype("<f4").tofile(HERE / name)
    for case in json.loads((HERE / "cases.json").read_text())["cases"]:
        convert_case(case, HERE, HERE / case["out"])
        print("wrote", case["out"])


if __name__ == "__main__":
    main()
