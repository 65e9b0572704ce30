"""The BSR validator, one hostile input per rule, held against BOTH loaders.

Every bad file starts from a small valid matrix and breaks exactly one rule
(the crc32 is recomputed unless the crc is the point), built byte by byte
here rather than by the writer, which refuses to emit them. Each must be
rejected by formats/bsr.py (BsrFormatError: code and field) and by the C++
loader (bsr_check: the same code and field; BsrMatrix.load: ValueError
"FILE: FIELD: message"). A rule enforced by one loader only, or reported
against a different field, fails here.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_one_line_error, run_tool
from iekit.formats import bsr
from iekit.runtime.native import _native

U32 = (1 << 32) - 1
HEADER = struct.Struct("<8sIIQQIIQQQQQIIII")
NAN_BITS = 0x7FC00000


@dataclass
class Spec:
    """A BSR file, field by field; every default describes a valid 6×10 matrix in 4×4 blocks
    (2 × 3 block grid, tails of 2 rows and 2 columns)."""

    rows: int = 6
    cols: int = 10
    block_rows: int = 4
    block_cols: int = 4
    row_ptr: list = field(default_factory=lambda: [0, 2, 3])
    col_idx: list = field(default_factory=lambda: [0, 2, 1])
    values: np.ndarray | None = None
    magic: bytes = bsr.MAGIC
    version: int = 1
    header_bytes: int = 96
    n_block_rows: int | None = None
    nnzb: int | None = None
    row_ptr_bytes: int | None = None
    col_idx_bytes: int | None = None
    values_bytes: int | None = None
    value_dtype: int = 0
    flags: int = 0
    crc: int | None = None
    reserved: int = 0
    tail: bytes = b""

    def default_values(self) -> np.ndarray:
        v = np.arange(1, 1 + 3 * 16, dtype=np.float32).reshape(3, 4, 4)
        v[1, :, 2:] = 0  # block (0, 2): columns 10, 11 are padding
        v[2, 2:, :] = 0  # block (1, 1): rows 6, 7 are padding
        return v

    def encode(self) -> bytes:
        vals = self.default_values() if self.values is None else self.values
        payload = (np.array(self.row_ptr, "<u4").tobytes() + np.array(self.col_idx, "<u4").tobytes()
                   + np.ascontiguousarray(vals, "<f4").tobytes())
        nnzb = len(self.col_idx) if self.nnzb is None else self.nnzb
        nbr = -(-self.rows // self.block_rows) if self.n_block_rows is None and self.block_rows else (self.n_block_rows or 0)
        rp = 4 * len(self.row_ptr) if self.row_ptr_bytes is None else self.row_ptr_bytes
        ci = 4 * nnzb if self.col_idx_bytes is None else self.col_idx_bytes
        vb = 4 * nnzb * self.block_rows * self.block_cols if self.values_bytes is None else self.values_bytes
        crc = zlib.crc32(payload) if self.crc is None else self.crc
        return HEADER.pack(self.magic, self.version, self.header_bytes, self.rows, self.cols, self.block_rows,
                           self.block_cols, nbr, nnzb, rp, ci, vb, self.value_dtype, self.flags, crc,
                           self.reserved) + payload + self.tail


def values_with(**cells) -> np.ndarray:
    v = Spec().default_values()
    for k, val in cells.items():
        b, i, j = (int(c) for c in k[1:].split("_"))
        v[b, i, j] = val
    return v


def bits(x: int) -> np.float32:
    return np.array([x], np.uint32).view(np.float32)[0]


# (id, bytes, code, field)
CASES: list[tuple[str, bytes, str, str]] = [
    ("empty", b"", "bad_magic", "magic"),
    ("short-magic", b"IEBS", "bad_magic", "magic"),
    ("bad-magic", Spec(magic=b"IEBSR\0\0\1").encode(), "bad_magic", "magic"),
    ("safetensors", b"\x08\0\0\0\0\0\0\0{}" + bytes(100), "bad_magic", "magic"),
    ("truncated-header", Spec().encode()[:60], "truncated", "header"),
    ("version", Spec(version=2).encode(), "bad_version", "version"),
    ("header-bytes", Spec(header_bytes=128).encode(), "bad_header_bytes", "header_bytes"),
    ("dtype", Spec(value_dtype=1).encode(), "bad_dtype", "value_dtype"),
    ("flags", Spec(flags=1).encode(), "bad_flags", "flags"),
    ("reserved", Spec(reserved=7).encode(), "bad_reserved", "reserved"),
    ("rows-zero", Spec(rows=0, n_block_rows=0).encode(), "zero_dim", "rows"),
    ("cols-zero", Spec(cols=0).encode(), "zero_dim", "cols"),
    ("block-rows-zero", Spec(block_rows=0, n_block_rows=2).encode(), "zero_dim", "block_rows"),
    ("block-cols-zero", Spec(block_cols=0).encode(), "zero_dim", "block_cols"),
    # 2^64 - 1 block columns cannot be indexed by a u32 col_idx.
    ("cols-u32", Spec(cols=(1 << 64) - 1, block_cols=1).encode(), "index_range", "cols"),
    ("n-block-rows", Spec(n_block_rows=3).encode(), "size_field", "n_block_rows"),
    ("nnzb-u32", Spec(nnzb=1 << 32).encode(), "index_range", "nnzb"),
    ("nnzb-grid", Spec(nnzb=7).encode(), "index_range", "nnzb"),
    ("row-ptr-bytes", Spec(row_ptr_bytes=16).encode(), "size_field", "row_ptr_bytes"),
    ("col-idx-bytes", Spec(col_idx_bytes=8).encode(), "size_field", "col_idx_bytes"),
    ("values-bytes", Spec(values_bytes=4 * 3 * 16 - 4).encode(), "size_field", "values_bytes"),
    # 4 × nnzb × block_rows × block_cols does not fit 64 bits: no field value can match it.
    ("values-bytes-overflow",
     Spec(rows=1 << 63, cols=1 << 63, block_rows=1 << 31, block_cols=1 << 31, nnzb=U32,
          row_ptr_bytes=4 * ((1 << 32) + 1), values_bytes=(1 << 64) - 1).encode(), "size_field", "values_bytes"),
    # Each size field right, their sum with the header past 2^64.
    ("file-size-overflow",
     Spec(rows=(1 << 15) * (1 << 20), cols=(1 << 15) * (1 << 20), block_rows=1 << 15, block_cols=1 << 15,
          nnzb=U32, row_ptr_bytes=4 * ((1 << 20) + 1)).encode(), "file_size", "(size)"),
    ("file-truncated", Spec().encode()[:-1], "file_size", "(size)"),
    ("file-trailing", Spec(tail=b"\0").encode(), "file_size", "(size)"),
    ("crc", Spec(crc=12345).encode(), "crc", "crc32"),
    ("row-ptr-0", Spec(row_ptr=[1, 2, 3]).encode(), "row_ptr", "row_ptr[0]"),
    ("row-ptr-decreasing", Spec(row_ptr=[0, 3, 2], col_idx=[0, 1, 2]).encode(), "row_ptr", "row_ptr[2]"),
    ("row-ptr-last", Spec(row_ptr=[0, 2, 2]).encode(), "row_ptr", "row_ptr[2]"),
    ("col-idx-range", Spec(col_idx=[0, 3, 1]).encode(), "col_idx", "col_idx[1]"),
    ("col-idx-u32", Spec(col_idx=[0, U32, 1]).encode(), "col_idx", "col_idx[1]"),
    ("col-order-equal", Spec(col_idx=[2, 2, 1]).encode(), "col_order", "col_idx[1]"),
    ("col-order-descending", Spec(col_idx=[2, 0, 1]).encode(), "col_order", "col_idx[1]"),
    ("nan", Spec(values=values_with(v0_1_1=np.nan)).encode(), "nonfinite", "values[5]"),
    ("inf", Spec(values=values_with(v2_0_3=np.inf)).encode(), "nonfinite", "values[35]"),
    ("minus-inf", Spec(values=values_with(v0_0_0=-np.inf)).encode(), "nonfinite", "values[0]"),
    ("padding-col", Spec(values=values_with(v1_3_2=1.0)).encode(), "padding", "values[30]"),
    ("padding-row", Spec(values=values_with(v2_2_0=0.5)).encode(), "padding", "values[40]"),
    ("padding-minus-zero", Spec(values=values_with(v1_0_3=-0.0)).encode(), "padding", "values[19]"),
    ("padding-nan-bits", Spec(values=values_with(v2_3_3=bits(NAN_BITS))).encode(), "nonfinite", "values[47]"),
]


def write(tmp_path: Path, data: bytes, name: str = "bad.bsr") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_the_base_file_is_valid(tmp_path):
    p = write(tmp_path, Spec().encode(), "ok.bsr")
    m = bsr.read(p)
    assert (m.rows, m.cols, m.nnzb, m.n_block_cols) == (6, 10, 3, 3)
    assert _native.bsr_check(str(p)) == {"ok": True, "status": 0, "code": "ok", "field": "", "message": "",
                                         "error": ""}
    n = _native.BsrMatrix.load(str(p))
    np.testing.assert_array_equal(n.values, m.values)
    assert bsr.encode(m) == p.read_bytes()  # the test builder and the writer agree on every byte


@pytest.mark.parametrize("data,code,fld", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_rejected_by_both_loaders(tmp_path, data, code, fld):
    p = write(tmp_path, data)
    with pytest.raises(bsr.BsrFormatError) as e:
        bsr.read(p)
    assert (e.value.code, e.value.field) == (code, fld), str(e.value)
    assert str(e.value).startswith(f"{p}: {fld}: ")
    r = _native.bsr_check(str(p))
    assert (r["ok"], r["code"], r["field"]) == (False, code, fld), r
    assert r["error"] == f"{p}: {fld}: {r['message']}"
    with pytest.raises(ValueError) as e2:
        _native.BsrMatrix.load(str(p))
    assert str(e2.value).startswith(f"{p}: {fld}: ")


def test_codes_are_distinct_and_shared():
    codes = {c[2] for c in CASES}
    assert codes == set(bsr.CODES)  # every rule family has a failing input here


@pytest.mark.parametrize("cells,fld", [({"v0_1_1": np.nan}, "values[5]"), ({"v2_0_3": -np.inf}, "values[35]")])
def test_allow_nonfinite(tmp_path, cells, fld):
    p = write(tmp_path, Spec(values=values_with(**cells)).encode())
    bsr.read(p, allow_nonfinite=True)
    assert _native.bsr_check(str(p), allow_nonfinite=True)["ok"]
    _native.BsrMatrix.load(str(p), allow_nonfinite=True)
    assert_one_line_error(run_tool("ieconv", "validate", p), f"{p}: {fld}: non-finite")
    assert run_tool("ieconv", "validate", "--allow-nonfinite", p).returncode == 0
    # Non-finite padding is still padding.
    q = write(tmp_path, Spec(values=values_with(v1_0_2=np.nan)).encode(), "pad.bsr")
    with pytest.raises(bsr.BsrFormatError) as e:
        bsr.read(q, allow_nonfinite=True)
    assert (e.value.code, e.value.field) == ("padding", "values[18]")
    assert _native.bsr_check(str(q), allow_nonfinite=True)["field"] == "values[18]"


def test_io_errors(tmp_path):
    missing = tmp_path / "missing.bsr"
    r = _native.bsr_check(str(missing))
    assert (r["ok"], r["code"], r["field"]) == (False, "io", "(file)")
    with pytest.raises(ValueError, match=f"{missing}: \\(file\\): "):
        _native.BsrMatrix.load(str(missing))
    with pytest.raises(OSError):
        bsr.read(missing)
    assert _native.bsr_check(str(tmp_path))["code"] == "io"  # a directory


# The in-memory constructors (the writer's check_matrix, the C++ from-arrays
# constructor) apply the payload rules too.
ARRAY_CASES = [
    ("row-ptr-0", dict(row_ptr=[1, 2, 3]), "row_ptr", "row_ptr[0]"),
    ("row-ptr-last", dict(row_ptr=[0, 2, 2]), "row_ptr", "row_ptr[2]"),
    ("col-range", dict(col_idx=[0, 3, 1]), "col_idx", "col_idx[1]"),
    ("col-order", dict(col_idx=[2, 0, 1]), "col_order", "col_idx[1]"),
    ("nonfinite", dict(values=values_with(v0_1_1=np.inf)), "nonfinite", "values[5]"),
    ("padding", dict(values=values_with(v1_3_2=1.0)), "padding", "values[30]"),
    ("zero-dim", dict(cols=0), "zero_dim", "cols"),
    ("row-ptr-length", dict(row_ptr=[0, 3]), "size_field", "row_ptr"),
    ("values-length", dict(values=Spec().default_values()[:2]), "size_field", "values"),
]


@pytest.mark.parametrize("kw,code,fld", [c[1:] for c in ARRAY_CASES], ids=[c[0] for c in ARRAY_CASES])
def test_array_constructors_reject(kw, code, fld):
    s = Spec(**{k: v for k, v in kw.items() if k != "values"})
    vals = kw.get("values", s.default_values())
    m = bsr.BsrMatrix(s.rows, s.cols, s.block_rows, s.block_cols, np.array(s.row_ptr, np.uint32),
                      np.array(s.col_idx, np.uint32), vals)
    with pytest.raises(bsr.BsrFormatError) as e:
        bsr.encode(m)
    assert (e.value.code, e.value.field) == (code, fld)
    with pytest.raises(ValueError, match=rf"^\(arrays\): {re.escape(fld)}: "):
        _native.BsrMatrix(s.rows, s.cols, s.block_rows, s.block_cols, m.row_ptr, m.col_idx, vals)


@pytest.mark.parametrize("case", ["bad-magic", "crc", "col-order-equal", "padding-col"])
def test_cli_one_line_errors(tmp_path, case):
    data, code, fld = next(c[1:] for c in CASES if c[0] == case)
    p = write(tmp_path, data)
    assert_one_line_error(run_tool("ieconv", "validate", p), f"error: {p}: {fld}: ")
    assert_one_line_error(run_tool("ieconv", "inspect", p), f"error: {p}: {fld}: ")
    np.save(tmp_path / "d.npy", np.zeros((6, 10), np.float32))
    assert_one_line_error(run_tool("ierun", "verify", "bsr", p, "--dense", tmp_path / "d.npy"), f"{p}: {fld}: ")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_loaders_agree_on_random_corruptions(tmp_path, data):
    """Any byte changed anywhere (the crc32 fixed up or not): both loaders accept, or
    both reject with the same code and field."""
    base = bytearray(Spec().encode())
    n = data.draw(st.integers(1, 4))
    for _ in range(n):
        base[data.draw(st.integers(0, len(base) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        base[88:92] = struct.pack("<I", zlib.crc32(bytes(base[96:])))
    p = write(tmp_path, bytes(base), "fuzz.bsr")
    try:
        bsr.read(p)
        py = ("ok", "")
    except bsr.BsrFormatError as e:
        py = (e.code, e.field)
    r = _native.bsr_check(str(p))
    assert py == (r["code"], r["field"]), (py, r)


def test_is_bsr_path(tmp_path):
    assert bsr.is_bsr_path(tmp_path / "missing.bsr")
    assert not bsr.is_bsr_path(tmp_path)
    plain = write(tmp_path, b"{}", "model.ie.json")
    assert not bsr.is_bsr_path(plain)
    assert bsr.is_bsr_path(write(tmp_path, Spec().encode(), "weights.bin"))
