"""The prefill GEMM (csrc/gemm/) against float64 over the exact dequantized
weights, for every weight type and ISA, and the property the decoder relies
on: a row's result does not depend on how many rows share the call."""

from __future__ import annotations

import numpy as np
import pytest

from iekit.runtime import kernels, native
from test_gemv import make_weights

ISAS = native.cpu_features()["isas"]
CASES = [("f32", 0, (13, 100)), ("f16", 0, (7, 37)), ("bf16", 0, (6, 64)), ("q4_0", 0, (11, 96)),
         ("q4_1", 0, (5, 64)), ("q8_0", 0, (9, 160)), ("int4w", 32, (13, 96)), ("int4w", 64, (7, 192))]


def _gemm(raw, entry, x, bias=None, threads=1, isa=""):
    p = kernels.weight_params(entry)
    return native._native.gemm(kernels.as_bytes(raw), p["dtype"], p["rows"], p["cols"], x, bias=bias,
                               group_size=p["group_size"], symmetric=p["symmetric"], scale_dtype=p["scale_dtype"],
                               threads=threads, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind,group_size,shape", CASES)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 70])
def test_gemm_matches_float64(isa, kind, group_size, shape, n):
    rng = np.random.default_rng(n)
    rows, cols = shape
    raw, w, entry = make_weights(kind, rows, cols, rng, group_size=group_size)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    y = _gemm(raw, entry, x, bias=bias, threads=2, isa=isa)
    assert y.shape == (n, rows)
    assert kernels.max_rel_error(y, x, w.astype(np.float64), bias) <= 1e-5


@pytest.mark.parametrize("isa", ISAS)
def test_a_rows_result_does_not_depend_on_the_call(isa):
    """Bit for bit: rows computed alone, in a short call or in a long one
    (the decoder cuts a prefill into chunks; eval's logits must not change)."""
    rng = np.random.default_rng(0)
    raw, _, entry = make_weights("int4w", 19, 128, rng, group_size=32)
    x = rng.standard_normal((50, 128)).astype(np.float32)
    full = _gemm(raw, entry, x, threads=2, isa=isa)
    for a, b in ((0, 1), (3, 20), (17, 50)):
        assert np.array_equal(_gemm(raw, entry, x[a:b], threads=1, isa=isa), full[a:b])


def test_gemm_argument_errors():
    raw, _, entry = make_weights("f32", 4, 8, np.random.default_rng(0))
    with pytest.raises(ValueError, match="threads"):
        _gemm(raw, entry, np.ones((2, 8), np.float32), threads=0)
    with pytest.raises(ValueError, match="x must be"):
        _gemm(raw, entry, np.ones((2, 9), np.float32))
    with pytest.raises(ValueError, match="needs 128 bytes, got 127"):
        _gemm(raw[:-1], entry, np.ones((2, 8), np.float32))
