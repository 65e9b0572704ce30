"""Python's weight-type registry (formats/weight_types.py) and C++'s table
(csrc/common/weight_types.h) describe the same types: same names in the
same order, same block geometry and flags, and the same byte count for
every matrix over a grid of shapes and int4w parameters. Editing one
table without the other fails here."""

from __future__ import annotations

import itertools

import pytest

from iekit.formats import weight_types
from iekit.formats.quant import QuantParams
from iekit.runtime.kernels import native_weight_args
from iekit.runtime.native import _native

SHAPES = [(1, 32), (3, 64), (7, 96), (64, 128), (5, 384), (2, 4096), (11, 1056), (3, 256), (4, 1280)]
INT4W = [QuantParams("int4w", g, sym, sd) for g, sym, sd in
         itertools.product([None, 32, 64, 128], [True, False], ["f16", "f32"])]


def test_tables_agree():
    assert _native.weight_types() == weight_types.table()


@pytest.mark.parametrize("name", weight_types.names())
def test_nbytes_agree_over_a_grid(name):
    wt = weight_types.get(name)
    checked = 0
    for rows, cols in SHAPES + ([(9, 37), (1, 1)] if not wt.quantized else []):
        if cols % wt.block_elems:
            continue
        for p in INT4W if name == "int4w" else [None]:
            if p is not None and p.group_size and cols % p.group_size:
                continue
            py = wt.nbytes(rows, cols, p)
            spec = _native.WeightSpec(**native_weight_args(wt, rows, cols, p))
            assert spec.nbytes == py, (name, rows, cols, p)
            assert _native.expected_nbytes(**native_weight_args(wt, rows, cols, p)) == py
            assert (spec.dtype, spec.rows, spec.cols) == (name, rows, cols)
            checked += 1
    assert checked >= sum(1 for _r, c in SHAPES if c % wt.block_elems == 0)  # no shape it can hold skipped


def test_both_sides_refuse_the_same_geometry():
    """A quantized type's cols must be whole blocks in both languages."""
    for f in weight_types.table():
        if f["block_elems"] == 1:
            continue
        with pytest.raises(ValueError, match=f"multiple of {f['block_elems']}"):
            _native.WeightSpec(f["name"], 1, f["block_elems"] + 1, group_size=f["block_elems"] if f["name"] == "int4w" else 0)
