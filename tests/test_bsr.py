"""BSR block-sparse matrices: the format's round trips and golden files, the
converter's policies and inputs, and the native GEMV against independent
references (scipy.sparse.bsr_matrix on divisible shapes, dense float64 numpy
on tail shapes, hand-computed products on hand-written matrices).
"""

from __future__ import annotations

import json
import math
import shutil
import zlib

import numpy as np
import pytest
import scipy.sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.convert.block_sparse import convert_file, to_bsr
from iekit.formats import bsr
from iekit.formats.bsr import keep_count
from iekit.formats.dense_matrix import load_dense
from iekit.formats.errors import FormatError, IEError
from iekit.runtime.native import _native

GOLDEN_BSR = GOLDEN / "bsr"
CASES = json.loads((GOLDEN_BSR / "cases.json").read_text())["cases"]
ISAS = _native.cpu_features()["isas"]
RTOL = 1e-5


def native_of(m: bsr.BsrMatrix):
    return _native.BsrMatrix(m.rows, m.cols, m.block_rows, m.block_cols, m.row_ptr, m.col_idx, m.values)


def sparse_blocks(rng: np.random.Generator, rows: int, cols: int, br: int, bc: int, density: float) -> np.ndarray:
    """A float32 matrix whose non-zeros sit in about `density` of its blocks."""
    nbr, nbc = -(-rows // br), -(-cols // bc)
    keep = np.repeat(np.repeat(rng.random((nbr, nbc)) < density, br, 0), bc, 1)[:rows, :cols]
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    a[~keep] = 0
    return a


def assert_gemv_close(y: np.ndarray, a64: np.ndarray, x: np.ndarray, bias: np.ndarray | None = None) -> None:
    """|y - A x| <= 1e-5 (|A| |x| + |bias|) element-wise (A over the stored blocks)."""
    x64 = np.asarray(x, np.float64)
    want = x64 @ a64.T
    scale = np.abs(x64) @ np.abs(a64).T + 1e-30
    if bias is not None:
        want = want + bias
        scale = scale + np.abs(bias)
    assert y.shape == want.shape
    err = np.abs(y - want) / scale
    assert err.max() <= RTOL, err.max()


# --------------------------------------------------------------------------
# Hand-written matrices with known products (exact in float32)
# --------------------------------------------------------------------------

# The source document's hand-written cases, as committed (golden/bsr/make_golden_bsr.py writes them).
HAND_4X4 = np.load(GOLDEN_BSR / "hand_4x4.npy")
HAND_8X8 = np.load(GOLDEN_BSR / "hand_8x8.npy")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2])
def test_hand_4x4(isa, threads):
    m = to_bsr(HAND_4X4, 2, 2).matrix
    assert m.row_ptr.tolist() == [0, 1, 2]  # block (0,0), then (1,1); (0,1) and (1,0) are zero
    assert m.col_idx.tolist() == [0, 1]
    assert m.values.tolist() == [[[1, 2], [3, 4]], [[0, 0], [5, 6]]]
    n = native_of(m)
    x = np.array([1, 2, 3, 4], np.float32)
    assert n.gemv(x, threads=threads, isa=isa).tolist() == [5, 11, 0, 39]
    assert m.matvec_f64(x).tolist() == [5, 11, 0, 39]
    bias = np.array([1, -1, 2, 0.5], np.float32)
    assert n.gemv(x, bias=bias, threads=threads, isa=isa).tolist() == [6, 10, 2, 39.5]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_hand_8x8(isa, threads):
    m = to_bsr(HAND_8X8, 4, 4).matrix
    assert m.row_ptr.tolist() == [0, 1, 3]  # (0,0); (1,0) holding the lone -1; (1,1)
    assert m.col_idx.tolist() == [0, 0, 1]
    np.testing.assert_array_equal(m.to_dense(), HAND_8X8)
    n = native_of(m)
    x = np.arange(1, 9, dtype=np.float32)
    assert n.gemv(x, threads=threads, isa=isa).tolist() == [10, 20, 12, 4, 5, 12, 19, 32]
    xb = np.stack([x, np.ones(8, np.float32), np.zeros(8, np.float32)])
    y = n.gemv(xb, bias=np.ones(8, np.float32), threads=threads, isa=isa)
    assert y.tolist() == [[11, 21, 13, 5, 6, 13, 20, 33], [5, 9, 4, 5, 2, 3, 3, 5], [1] * 8]


def test_hand_8x8_policies():
    # Block squared norms: (0,0) 45, (1,0) 1, (1,1) 30; total 76.
    for conv in (to_bsr(HAND_8X8, 4, 4, threshold=1.0), to_bsr(HAND_8X8, 4, 4, keep_density=0.5)):
        assert conv.matrix.row_ptr.tolist() == [0, 1, 2] and conv.matrix.col_idx.tolist() == [0, 1]
        assert conv.kept_blocks == 2 and conv.total_blocks == 4 and conv.density == 0.5
        assert conv.dropped_rel_frobenius == pytest.approx(math.sqrt(1 / 76), rel=1e-12)
    exact = to_bsr(HAND_8X8, 4, 4)
    assert exact.policy == "exact" and exact.kept_blocks == 3 and exact.dropped_rel_frobenius == 0


# --------------------------------------------------------------------------
# Independent references: scipy (divisible shapes), numpy float64 (tails)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rows,cols,br,bc,density", [
    (64, 64, 16, 16, 0.3), (32, 48, 4, 8, 0.5), (30, 20, 3, 5, 0.2), (16, 16, 1, 1, 0.4),
    (8, 64, 8, 32, 0.9), (128, 96, 16, 16, 0.1),
])
def test_structure_and_gemv_vs_scipy(rows, cols, br, bc, density):
    rng = np.random.default_rng(rows * 1000 + cols + br)
    a = sparse_blocks(rng, rows, cols, br, bc, density)
    m = to_bsr(a, br, bc).matrix
    ref = scipy.sparse.bsr_matrix(a, blocksize=(br, bc))
    ref.sort_indices()
    np.testing.assert_array_equal(m.row_ptr, ref.indptr)
    np.testing.assert_array_equal(m.col_idx, ref.indices)
    np.testing.assert_array_equal(m.values, ref.data)
    n = native_of(m)
    ref64 = ref.astype(np.float64)
    for isa in ISAS:
        for b in (1, 3, 8):
            x = rng.standard_normal((b, cols)).astype(np.float32)
            y = n.gemv(x, threads=2, isa=isa)
            want = (ref64 @ x.astype(np.float64).T).T
            scale = np.abs(x).astype(np.float64) @ np.abs(a).astype(np.float64).T + 1e-30
            assert (np.abs(y - want) / scale).max() <= RTOL


@pytest.mark.parametrize("rows,cols,br,bc", [(10, 13, 4, 8), (1, 1, 4, 4), (33, 70, 16, 16), (7, 9, 2, 3),
                                             (5, 100, 5, 7), (100, 5, 9, 2), (17, 17, 16, 16)])
def test_tail_shapes_vs_numpy(rows, cols, br, bc):
    rng = np.random.default_rng(rows + 7 * cols)
    a = sparse_blocks(rng, rows, cols, br, bc, 0.6)
    m = to_bsr(a, br, bc).matrix
    np.testing.assert_array_equal(m.to_dense(), a)  # exact policy: lossless, padding cut off
    n = native_of(m)
    for isa in ISAS:
        for b, threads in ((1, 1), (2, 2), (5, 3), (8, 2)):
            x = rng.standard_normal((b, cols)).astype(np.float32)
            bias = rng.standard_normal(rows).astype(np.float32)
            assert_gemv_close(n.gemv(x, bias=bias, threads=threads, isa=isa), a.astype(np.float64), x, bias)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 70), cols=st.integers(1, 70), br=st.integers(1, 20), bc=st.integers(1, 20),
       density=st.floats(0, 1), batch=st.integers(1, 8), threads=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       with_bias=st.booleans())
def test_gemv_property(rows, cols, br, bc, density, batch, threads, seed, with_bias):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    m = to_bsr(a, br, bc, keep_density=density).matrix
    n = native_of(m)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32) if with_bias else None
    a64 = m.to_dense(np.float64)
    for isa in ISAS:
        y = n.gemv(x if batch > 1 else x[0], bias=bias, threads=threads, isa=isa)
        assert_gemv_close(y.reshape(batch, rows), a64, x, bias)


@pytest.mark.parametrize("isa", ISAS)
def test_blocks_larger_than_the_matrix_cost_nothing(isa, tmp_path):
    """Padding is never computed or buffered: 2^20 × 2^20 blocks over a 5×7 matrix
    need no terabytes of scratch."""
    big = 1 << 20
    m = bsr.BsrMatrix(5, 7, big, big, np.zeros(2, np.uint32), np.zeros(0, np.uint32), np.zeros((0, big, big), np.float32))
    bsr.write(tmp_path / "big.bsr", m)
    assert (tmp_path / "big.bsr").stat().st_size == 96 + 8
    n = _native.BsrMatrix.load(str(tmp_path / "big.bsr"))
    bias = np.arange(5, dtype=np.float32)
    assert n.gemv(np.ones((3, 7), np.float32), bias=bias, threads=2, isa=isa).tolist() == [bias.tolist()] * 3
    # One 16×16 block over a 3×5 matrix: only the 3×5 corner is ever read.
    a = np.arange(15, dtype=np.float32).reshape(3, 5)
    n = native_of(to_bsr(a, 16, 16).matrix)
    x = np.arange(5, dtype=np.float32)
    assert n.gemv(x, isa=isa).tolist() == (a @ x).tolist()


def test_gemv_argument_errors():
    n = native_of(to_bsr(HAND_8X8, 4, 4).matrix)
    for bad in (np.zeros(7, np.float32), np.zeros((9, 8), np.float32), np.zeros((2, 7), np.float32),
                np.zeros((1, 1, 8), np.float32)):
        with pytest.raises(ValueError):
            n.gemv(bad)
    with pytest.raises(ValueError, match="bias"):
        n.gemv(np.zeros(8, np.float32), bias=np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="threads"):
        n.gemv(np.zeros(8, np.float32), threads=0)
    with pytest.raises(ValueError, match="not available"):
        n.gemv(np.zeros(8, np.float32), isa="avx9000")


def test_native_properties_and_views():
    m = to_bsr(HAND_8X8, 4, 4).matrix
    n = native_of(m)
    assert (n.rows, n.cols, n.block_rows, n.block_cols, n.n_block_rows, n.n_block_cols, n.nnzb) == (8, 8, 4, 4, 2, 2, 3)
    assert n.density == 0.75 and n.payload_bytes == m.payload_bytes and n.source == "(arrays)"
    vals = n.values
    del n  # the view keeps the matrix alive
    np.testing.assert_array_equal(vals, m.values)
    assert not vals.flags.writeable
    with pytest.raises(ValueError):
        vals[0, 0, 0] = 1


def test_crc32_matches_zlib():
    for data in (b"", b"a", bytes(range(256)) * 37, np.random.default_rng(0).bytes(100_003)):
        assert _native.bsr_crc32(data) == zlib.crc32(data)


# --------------------------------------------------------------------------
# Round trips and golden files
# --------------------------------------------------------------------------


def test_round_trip_byte_identical(tmp_path):
    rng = np.random.default_rng(5)
    a = sparse_blocks(rng, 45, 77, 8, 16, 0.4)
    p1, p2 = tmp_path / "a.bsr", tmp_path / "b.bsr"
    bsr.write(p1, to_bsr(a, 8, 16).matrix)
    bsr.write(p2, bsr.read(p1))
    assert p1.read_bytes() == p2.read_bytes()
    n = _native.BsrMatrix.load(str(p1))
    again = bsr.BsrMatrix(n.rows, n.cols, n.block_rows, n.block_cols, n.row_ptr.copy(), n.col_idx.copy(),
                          n.values.copy())
    assert bsr.encode(again) == p1.read_bytes()  # the C++ loader keeps every bit
    assert n.source == str(p1)


@pytest.mark.parametrize("case", CASES, ids=[c["out"] for c in CASES])
def test_golden_regenerates_byte_identically(case, tmp_path):
    out = tmp_path / case["out"]
    convert_file(out, case["block_rows"], case["block_cols"], dense=GOLDEN_BSR / case["dense"],
                 rows=case.get("rows"), cols=case.get("cols"), threshold=case.get("threshold"),
                 keep_density=case.get("keep_density"))
    assert out.read_bytes() == (GOLDEN_BSR / case["out"]).read_bytes()


@pytest.mark.parametrize("case", CASES, ids=[c["out"] for c in CASES])
def test_golden_loads_and_matches_its_dense(case):
    path = GOLDEN_BSR / case["out"]
    assert path.stat().st_size < 4096
    m = bsr.read(path)
    assert _native.bsr_check(str(path))["ok"]
    dense, _ = load_dense(GOLDEN_BSR / case["dense"], case.get("rows"), case.get("cols"))
    stored = m.to_dense()
    kept = stored != 0
    np.testing.assert_array_equal(stored[kept], dense[kept])
    if "threshold" not in case and "keep_density" not in case:
        np.testing.assert_array_equal(stored, dense)


def test_golden_keep_density_breaks_ties_by_block_index():
    m = bsr.read(GOLDEN_BSR / "keep_20x36_b4x4.bsr")
    r, c = m.block_coords()
    # ceil(0.08 × 45) = 4 blocks: (1,7) (|v| = 2), then three of the six blocks tied at |v| = 1,
    # the lowest block indices (row-major): (0,0), (0,3), (1,1) but not (2,2), (2,8), (4,4).
    assert list(zip(r.tolist(), c.tolist())) == [(0, 0), (0, 3), (1, 1), (1, 7)]


# --------------------------------------------------------------------------
# Converter policies and inputs
# --------------------------------------------------------------------------


def test_threshold_boundary_and_nonfinite_blocks():
    a = np.zeros((4, 8), np.float32)
    a[0, 0] = 0.5   # block 0: max |v| == T -> dropped
    a[0, 4] = -0.75  # block 1: kept
    a[2, 1] = np.nan  # block 2: NaN compares false -> kept
    a[3, 5] = 1e-9   # block 3: dropped
    conv = to_bsr(a, 2, 4, threshold=0.5)
    assert conv.matrix.col_idx.tolist() == [1, 0] and conv.matrix.row_ptr.tolist() == [0, 1, 2]
    with pytest.raises(bsr.BsrFormatError) as e:
        bsr.encode(conv.matrix)
    assert e.value.code == "nonfinite"
    bsr.encode(conv.matrix, allow_nonfinite=True)


def test_keep_density_ties_and_zero_blocks():
    a = np.zeros((2, 8), np.float32)
    a[:, 0:2] = 1.0  # block 0
    a[:, 2:4] = -1.0  # block 1: same norm as block 0
    a[:, 6:8] = 1.0  # block 3: same norm again; block 2 is all zero
    assert to_bsr(a, 2, 2, keep_density=0.5).matrix.col_idx.tolist() == [0, 1]
    assert to_bsr(a, 2, 2, keep_density=0.25).matrix.col_idx.tolist() == [0]
    assert to_bsr(a, 2, 2, keep_density=1.0).matrix.col_idx.tolist() == [0, 1, 3]  # never the zero block
    assert to_bsr(a, 2, 2, keep_density=0.0).kept_blocks == 0
    assert to_bsr(a[:, ::-1].copy(), 2, 2, keep_density=0.25).matrix.col_idx.tolist() == [0]


def test_keep_count_is_ceil_without_float_noise():
    assert keep_count(0.1, 65536) == 6554
    assert keep_count(0.25, 65536) == 16384
    assert keep_count(0.3, 45) == 14
    assert keep_count(0.7, 10) == 7  # 0.7 * 10 = 7.000000000000001
    assert keep_count(1.0, 3) == 3 and keep_count(0.0, 3) == 0


def test_policy_argument_errors():
    a = np.ones((4, 4), np.float32)
    for kw in ({"threshold": -1.0}, {"threshold": float("nan")}, {"keep_density": 1.5},
               {"threshold": 0.1, "keep_density": 0.5}):
        with pytest.raises(IEError):
            to_bsr(a, 2, 2, **kw)
    with pytest.raises(IEError):
        to_bsr(a, 0, 2)


def test_converter_output_is_deterministic(tmp_path):
    rng = np.random.default_rng(11)
    np.save(tmp_path / "d.npy", rng.standard_normal((40, 40)).astype(np.float32))
    for i in range(2):
        convert_file(tmp_path / f"{i}.bsr", 8, 8, dense=tmp_path / "d.npy", keep_density=0.37)
    assert (tmp_path / "0.bsr").read_bytes() == (tmp_path / "1.bsr").read_bytes()


def test_inputs(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 10)).astype(np.float32)
    a.tofile(tmp_path / "a.bin")
    np.save(tmp_path / "h.npy", a.astype(np.float16))
    np.save(tmp_path / "be.npy", a.astype(">f4"))
    np.save(tmp_path / "d.npy", a.astype(np.float64))
    np.save(tmp_path / "v.npy", a[0])
    np.testing.assert_array_equal(load_dense(tmp_path / "a.bin", 6, 10)[0], a)
    np.testing.assert_array_equal(load_dense(tmp_path / "be.npy")[0], a)
    np.testing.assert_array_equal(load_dense(tmp_path / "h.npy")[0], a.astype(np.float16).astype(np.float32))
    with pytest.raises(FormatError, match=r"a\.bin: \(size\): file is 240 bytes"):
        load_dense(tmp_path / "a.bin", 6, 11)
    with pytest.raises(FormatError, match="d.npy: dtype: float64"):
        load_dense(tmp_path / "d.npy")
    with pytest.raises(FormatError, match="v.npy: shape: must be 2-D"):
        load_dense(tmp_path / "v.npy")
    with pytest.raises(IEError, match="--rows and --cols"):
        load_dense(tmp_path / "a.bin")
    with pytest.raises(IEError):
        load_dense(tmp_path / "h.npy", 6, 10)


def test_iebin_tensor_input_bf16():
    from iekit.formats import iebin
    from iekit.formats.casting import decode_f32

    model = GOLDEN_IEBIN / "tiny-qwen2"
    name = "model.layers.0.mlp.down_proj.weight"
    a, label = load_dense(model_dir=model, tensor=name)
    m = iebin.load_model(model)
    t = m.tensor(name)
    raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
    np.testing.assert_array_equal(a, decode_f32(raw, "bf16").reshape(t["shape"]))
    assert a.shape == (64, 128) and label.endswith(name)
    with pytest.raises(FormatError, match=r"tensors\[\d+\]\.shape"):
        load_dense(model_dir=model, tensor="model.layers.0.input_layernorm.weight")
    with pytest.raises(IEError, match="no tensor named"):
        load_dense(model_dir=model, tensor="nope")


def test_iebin_tensor_input_rejects_quantized():
    model = GOLDEN_IEBIN / "tiny-llama-mixedq"
    meta = json.loads((model / "model.ie.json").read_text())
    q = next(t["name"] for t in meta["tensors"] if t["dtype"] not in ("f32", "f16", "bf16"))
    with pytest.raises(FormatError, match=r"tensors\[\d+\]\.dtype"):
        load_dense(model_dir=model, tensor=q)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def test_cli_convert_validate_inspect_verify(tmp_path):
    rng = np.random.default_rng(8)
    a = sparse_blocks(rng, 50, 70, 8, 16, 0.5)
    np.save(tmp_path / "d.npy", a)
    out = tmp_path / "w.bsr"
    res = run_tool("ieconv", "block-sparse", tmp_path / "d.npy", "--block-rows", "8", "--block-cols", "16",
                   "-o", out, "--keep-density", "0.25", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["kept_blocks"] == keep_count(0.25, 7 * 5) and 0 < info["dropped_rel_frobenius"] < 1
    res = run_tool("ieconv", "validate", out)
    assert res.returncode == 0 and res.stdout.startswith(f"OK {out}: BSR v1, 50×70") and "crc32" in res.stdout
    res = run_tool("ieconv", "inspect", out, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["nnzb"] == info["kept_blocks"]
    assert run_tool("ieconv", "inspect", out).returncode == 0
    res = run_tool("ierun", "verify", "bsr", out, "--dense", tmp_path / "d.npy", "--threads", "2", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["ok"] and all(rep["checks"].values()) and set(rep["gemv_max_rel"]) == set(ISAS)
    assert rep["dropped_rel_frobenius"] == pytest.approx(info["dropped_rel_frobenius"], rel=1e-9)
    # Extensionless copy: found by its magic.
    shutil.copy(out, tmp_path / "noext")
    assert run_tool("ieconv", "validate", tmp_path / "noext").returncode == 0


def test_cli_nonfinite_needs_the_flag_at_every_step(tmp_path):
    a = np.zeros((8, 8), np.float32)
    a[0, 1], a[5, 6], a[6, 0] = np.nan, np.inf, 2.5
    np.save(tmp_path / "d.npy", a)
    out = tmp_path / "w.bsr"
    args = ["--block-rows", "4", "--block-cols", "4", "-o", out]
    assert_one_line_error(run_tool("ieconv", "block-sparse", tmp_path / "d.npy", *args), "non-finite")
    assert run_tool("ieconv", "block-sparse", tmp_path / "d.npy", *args, "--allow-nonfinite").returncode == 0
    assert_one_line_error(run_tool("ieconv", "validate", out), f"{out}: values[", "non-finite")
    assert run_tool("ieconv", "validate", out, "--allow-nonfinite").returncode == 0
    assert_one_line_error(run_tool("ierun", "verify", "bsr", out, "--dense", tmp_path / "d.npy"), "non-finite")
    res = run_tool("ierun", "verify", "bsr", out, "--dense", tmp_path / "d.npy", "--allow-nonfinite", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    # rows 0-3 and 4-7 both reach a non-finite value, so no output is measured, but none may be finite
    assert rep["ok"] and rep["nnzb"] == 3


def test_cli_bfloat16_npy_input(tmp_path):
    """numpy saves ml_dtypes.bfloat16 as a 2-byte void; its bits are bfloat16."""
    rng = np.random.default_rng(2)
    a = sparse_blocks(rng, 16, 32, 4, 8, 0.5)
    bits = (a.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exactly representable values below
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    np.save(tmp_path / "b.npy", bits.view("V2"))
    np.save(tmp_path / "w.npy", widened)
    out = tmp_path / "b.bsr"
    res = run_tool("ieconv", "block-sparse", tmp_path / "b.npy", "--block-rows", "4", "--block-cols", "8", "-o", out)
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(bsr.read(out).to_dense(), widened)
    assert run_tool("ierun", "verify", "bsr", out, "--dense", tmp_path / "w.npy").returncode == 0


def test_cli_raw_and_iebin_inputs(tmp_path):
    a = np.random.default_rng(2).standard_normal((12, 20)).astype(np.float32)
    a.tofile(tmp_path / "d.bin")
    res = run_tool("ieconv", "block-sparse", tmp_path / "d.bin", "--rows", "12", "--cols", "20",
                   "--block-rows", "4", "--block-cols", "8", "-o", tmp_path / "r.bsr", "--threshold", "1e-3")
    assert res.returncode == 0, res.stderr
    res = run_tool("ierun", "verify", "bsr", tmp_path / "r.bsr", "--dense", tmp_path / "d.bin", "--rows", "12",
                   "--cols", "20")
    assert res.returncode == 0, res.stderr
    model, name = GOLDEN_IEBIN / "tiny-qwen2", "model.layers.0.mlp.down_proj.weight"
    res = run_tool("ieconv", "block-sparse", "--model-dir", model, "--tensor", name, "--block-rows", "16",
                   "--block-cols", "16", "-o", tmp_path / "t.bsr")
    assert res.returncode == 0, res.stderr
    res = run_tool("ierun", "verify", "bsr", tmp_path / "t.bsr", "--model-dir", model, "--tensor", name)
    assert res.returncode == 0, res.stderr


def test_cli_errors_are_one_line(tmp_path):
    a = np.random.default_rng(2).standard_normal((12, 20)).astype(np.float32)
    a.tofile(tmp_path / "d.bin")
    np.save(tmp_path / "d.npy", a)
    np.save(tmp_path / "other.npy", a + 1)
    out = tmp_path / "w.bsr"
    assert_one_line_error(run_tool("ieconv", "block-sparse", tmp_path / "d.bin", "--rows", "12", "--cols", "21",
                                   "--block-rows", "4", "--block-cols", "4", "-o", out), "d.bin: (size):")
    assert not out.exists()
    assert run_tool("ieconv", "block-sparse", tmp_path / "d.npy", "--block-rows", "4", "--block-cols", "4",
                    "-o", out).returncode == 0
    assert_one_line_error(run_tool("ieconv", "block-sparse", tmp_path / "d.npy", "--block-rows", "4",
                                   "--block-cols", "4", "-o", out), "exists; pass --overwrite")
    bad = tmp_path / "bad.bsr"
    bad.write_bytes(out.read_bytes()[:-1])
    assert_one_line_error(run_tool("ieconv", "validate", bad), f"{bad}: (size):")
    assert_one_line_error(run_tool("ieconv", "inspect", bad), f"{bad}: (size):")
    assert_one_line_error(run_tool("ierun", "verify", "bsr", bad, "--dense", tmp_path / "d.npy"), f"{bad}: (size):")
    assert_one_line_error(run_tool("ieconv", "validate", tmp_path / "missing.bsr"), "missing.bsr")
    # A different dense matrix of the same shape: the stored blocks are not its blocks.
    assert_one_line_error(run_tool("ierun", "verify", "bsr", out, "--dense", tmp_path / "other.npy"),
                          "verify bsr:", "failed: blocks")
    assert_one_line_error(run_tool("ierun", "verify", "bsr", out, "--dense", tmp_path / "d.bin", "--rows", "20",
                                   "--cols", "12"), "12×20")


# --------------------------------------------------------------------------
# Benchmark helper (tiny sizes: shape of the result, not speed)
# --------------------------------------------------------------------------


def test_bench_bsr_smoke():
    from iekit.runtime.bench_bsr import bench_bsr

    r = bench_bsr(256, 192, 16, 16, 0.25, 2, 0, iters=6, min_bytes=1 << 20, bandwidth=False)
    for k in ("kernel", "rows", "cols", "block_rows", "block_cols", "density", "threads", "dense_ms", "bsr_ms",
              "speedup", "gbps", "read_bw_gbps", "fraction"):
        assert k in r
    assert r["kernel"] == "bsr" and r["bsr_ms"] > 0 and r["dense_ms"] > 0 and r["copies_bsr"] >= 2
    assert r["max_rel_diff"] <= RTOL


def test_ierun_microbench_bsr_json():
    res = run_tool("ierun", "microbench", "--kernel", "bsr", "--rows", "256", "--cols", "512", "--block-rows", "8",
                   "--block-cols", "16", "--density", "0.25", "--threads", "2", "--iters", "3", "--min-mib", "1",
                   "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    for key in ("dense_ms", "bsr_ms", "speedup", "gbps", "read_bw_gbps", "fraction"):
        assert r[key] > 0, key
    assert (r["block_rows"], r["block_cols"]) == (8, 16) and abs(r["kept_density"] - 0.25) < 0.02
    assert r["max_rel_diff"] < 1e-5
    bad = run_tool("ierun", "microbench", "--kernel", "bsr", "--scale-dtype", "f16")
    assert bad.returncode == 2 and "--scale-dtype does not apply to --kernel bsr" in bad.stderr
