#!/usr/bin/env python3
"""llama.cpp's own quantizer bytes, frozen as the reference for formats/quant.py.

gguf-py dequantizes every k-quant and iq4 type but quantizes none, and its
q4_0/q4_1 quantizers take no importance weights; so the reference for those is
ggml itself. This calls ``quantize_<type>(src, dst, nrow, n_per_row,
imatrix)`` of a built ``libggml-base.so`` (llama-cpp-python 0.3.36's vendored
llama.cpp, built without -march, so no FMA contraction: IEEE float32
arithmetic in source order) through ctypes, on a fixed input with hostile
rows, with and without an importance vector:

    python golden/quant/make_golden_quant.py --libggml .../build/bin/libggml-base.so

Writes golden/quant/input.npy (float32 [rows, 512]), importance.npy
(float32 [512]) and <type>.bin / <type>-imatrix.bin for q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
q6_k, q3_k, q2_k, iq4_nl, iq4_xs.
Deterministic: running it twice writes the same bytes. The tests only read
the files (tests/test_kquant.py).
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COLS = 512
ROW_BYTES = {"q4_0": COLS // 32 * 18, "q4_1": COLS // 32 * 20, "q5_0": COLS // 32 * 22, "q5_1": COLS // 32 * 24,
             "q4_k": COLS // 256 * 144,
             "q5_k": COLS // 256 * 176, "q6_k": COLS // 256 * 210, "q3_k": COLS // 256 * 110, "q2_k": COLS // 256 * 84,
             "iq4_nl": COLS // 32 * 18, "iq4_xs": COLS // 256 * 136}


def hostile_input() -> np.ndarray:
    rng = np.random.default_rng(20261124)
    rows = [
        np.zeros(COLS),                                       # all zero
        np.full(COLS, 3.25),                                  # constant (positive: min clamps to 0)
        np.full(COLS, -0.75),                                 # constant negative
        np.r_[rng.standard_normal(COLS - 1) * 1e-3, 60.0],    # one outlier
        -np.abs(rng.standard_normal(COLS)),                   # all negative
        np.abs(rng.standard_normal(COLS)) + 2.0,              # all positive, offset
        np.full(COLS, 1e-41),                                 # subnormal
        np.r_[np.zeros(COLS - 1), -1e-39],                    # one subnormal
        rng.standard_normal(COLS) * 1e-6,                     # tiny
        np.tile([0.5, -0.5], COLS // 2),                      # ties
        np.repeat(rng.standard_normal(COLS // 32) * 4, 32),   # constant sub-blocks, varied
        rng.standard_normal(COLS) * np.repeat(10.0 ** rng.uniform(-3, 1, COLS // 32), 32),  # sub-block scales spread
        rng.integers(-8, 8, COLS) * 0.125,                    # already on a 4-bit grid
        rng.standard_t(3, COLS),                              # heavy tails
    ]
    rows += list(rng.standard_normal((18, COLS)) * rng.uniform(0.01, 3, (18, 1)))
    return np.array(rows, dtype=np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libggml", required=True, help="path to libggml-base.so")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.libggml)
    x = hostile_input()
    rng = np.random.default_rng(7)
    imp = (rng.gamma(0.5, 2.0, COLS) + 1e-3).astype(np.float32)  # skewed, as real importances are
    imp[5] = 0.0  # a column never seen
    np.save(HERE / "input.npy", x)
    np.save(HERE / "importance.npy", imp)
    for name, row_bytes in ROW_BYTES.items():
        fn = getattr(lib, f"quantize_{name.replace('_k', '_K')}")
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        for suffix, qw in (("", None), ("-imatrix", imp)):
            out = np.zeros(x.shape[0] * row_bytes, np.uint8)
            n = fn(x.ctypes.data, out.ctypes.data, x.shape[0], COLS, None if qw is None else qw.ctypes.data)
            assert n == out.size, (name, n, out.size)
            (HERE / f"{name}{suffix}.bin").write_bytes(out.tobytes())


if __name__ == "__main__":
    main()
