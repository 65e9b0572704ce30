"""The CUDA kernels (csrc/cuda/, docs/cuda.md).

Without a CUDA build or a device, what runs is the CPU side: the load-time
repack the upload applies (q4_0 / q4_1 -> int4w planes) held to the stored
bytes through the CPU dequantizer, and `--device cuda` refused in one line
by every command that takes it. With a device (tests marked `gpu`), every
kernel is held to an independent reference: the dequantizer to the CPU's
bit for bit (every weight type), the GEMV to float64 (every type, batch
1..8, odd shapes, bias), dedup reconstruction to the members' bytes, BSR
to float64.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_tool
from dedup_util import write_artifact
from test_bsr import native_of, sparse_blocks
from test_gemv import VARIANTS, gen, make_weights, vid
from iekit.convert.block_sparse import to_bsr
from iekit.runtime import cuda, kernels, native
from iekit.runtime.dedup import open_store

N = native._native
WHY = cuda.unavailable()


def gpu(test):
    """Marked `gpu`, and skipped (saying why) without a CUDA build and a device."""
    return pytest.mark.gpu(pytest.mark.skipif(WHY is not None, reason=f"no CUDA: {WHY}")(test))


# ------------------------------------------------------------ CPU side (always)

@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
def test_repack_is_the_int4w_twin_of_the_stored_bytes(kind):
    rng = np.random.default_rng(5)
    for rows, cols in ((37, 96), (3, 32), (8, 4096)):
        raw, wd, entry = make_weights(kind, rows, cols, rng)
        spec, planar = N.repack_planar(raw, kind, rows, cols)
        assert (spec.dtype, spec.rows, spec.cols, spec.group_size, spec.scale_dtype) == ("int4w", rows, cols, 32, "f16")
        assert spec.symmetric == (kind == "q4_0") and planar.size == spec.nbytes
        got = N.dequantize(planar, "int4w", rows, cols, group_size=32, symmetric=spec.symmetric)
        assert np.array_equal(got.view(np.uint32), wd.view(np.uint32))
        # the codes are the stored blocks' codes, in order (a real split, not a re-quantization)
        bb = 18 if kind == "q4_0" else 20
        codes = raw.reshape(rows, cols // 32, bb)[:, :, bb - 16:]
        assert np.array_equal(planar[: rows * cols // 2].reshape(rows, cols // 32, 16), codes)


@pytest.mark.parametrize("kind", ["f32", "bf16", "q8_0", "q5_1", "q4_k"])
def test_types_read_as_stored_have_no_repack(kind):
    rng = np.random.default_rng(1)
    raw, _, _ = make_weights(kind, 4, 256, rng)
    assert N.repack_planar(raw, kind, 4, 256) is None


def test_repack_checks_its_buffer():
    with pytest.raises(ValueError, match="needs 36 bytes"):
        N.repack_planar(np.zeros(35, np.uint8), "q4_0", 2, 32)


@pytest.mark.skipif(WHY is None, reason="a device is visible: the refusal cannot happen here")
@pytest.mark.parametrize("argv", [
    ["verify", "quant", "--model-dir", "golden/iebin/tiny-llama", "--device", "cuda"],
    ["verify", "dedup", "--model-dir", "golden/iebin/tiny-llama", "--device", "cuda"],
    ["verify", "bsr", "x.bsr", "--device", "cuda"],
    ["microbench", "--kernel", "q4_0", "--device", "cuda"],
])
def test_device_cuda_without_cuda_is_one_line(argv):
    r = run_tool("ierun", *argv)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "--device cuda" in lines[0] and WHY in lines[0], r.stdout + r.stderr


# ------------------------------------------------------------ on a device

@gpu
@pytest.mark.parametrize("v", VARIANTS, ids=vid)
def test_device_dequantize_is_bit_exact(v):
    for i, (rows, cols) in enumerate(v[4]):
        raw, wd, entry, _ = gen(v, rows, cols, 300 + i)
        got = kernels.dequantize(raw, entry, device="cuda")
        assert got.shape == (rows, cols)
        assert np.array_equal(got.view(np.uint32), wd.view(np.uint32)), (v, rows, cols)


@gpu
@pytest.mark.parametrize("v", VARIANTS, ids=vid)
def test_device_gemv_matches_float64(v):
    for i, (rows, cols) in enumerate(v[4]):
        raw, wd, entry, rng = gen(v, rows, cols, 400 + i)
        w64 = wd.astype(np.float64)
        for b in range(1, 9):
            x = rng.standard_normal((b, cols)).astype(np.float32)
            bias = rng.standard_normal(rows).astype(np.float32) if b % 2 else None
            y = kernels.gemv(raw, entry, x, bias=bias, device="cuda")
            assert y.shape == (b, rows)
            assert kernels.max_rel_error(y, x, w64, bias) <= 1e-5, (v, rows, cols, b)
        y1 = kernels.gemv(raw, entry, x[0], device="cuda")  # 1-D x -> 1-D y
        assert y1.shape == (rows,)


BLOCK_KINDS = ["q8_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs", "iq4_xsh",
               "iq3_s", "iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m", "mxfp4"]


@gpu
@pytest.mark.parametrize("kind", ["int4w", "q4_0", "q4_1", "bf16", "f16", "f32"] + BLOCK_KINDS)
def test_device_gemv_at_decode_shapes(kind):
    """The shapes the kernels are tuned for (and the split over warps each
    picks), at the batches decode (1) and prefill chunks (up to 8) use. For
    the block types, rows of 88 and 448 spans end in a partial step of a
    warp (32 spans) and a partial x tile, and 14336 and 32768 columns split
    a row over two and four warps."""
    rng = np.random.default_rng(9)
    for rows, cols in ((512, 14336), (2048, 4096), (100, 8192), (37, 2816), (9, 32768)):
        raw, wd, entry = make_weights(kind, rows, cols, rng, group_size=128)
        for b in (1, 2, 3, 8):
            x = rng.standard_normal((b, cols)).astype(np.float32)
            y = kernels.gemv(raw, entry, x, device="cuda")
            assert kernels.max_rel_error(y, x, wd.astype(np.float64)) <= 1e-5, (kind, rows, cols, b)


@gpu
def test_device_gemv_refuses_bad_arguments():
    rng = np.random.default_rng(0)
    raw, _, entry = make_weights("q4_0", 4, 64, rng)
    with pytest.raises(ValueError, match="batch must be 1..8"):
        kernels.gemv(raw, entry, np.zeros((9, 64), np.float32), device="cuda")
    with pytest.raises(ValueError, match="needs 144 bytes"):
        N.cuda_gemv(raw[:-1], "q4_0", 4, 64, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="act='f32'"):
        kernels.gemv(raw, entry, np.zeros(64, np.float32), act="int8", device="cuda")


@gpu
def test_device_dedup_reconstruction_is_bit_exact(tmp_path):
    rng = np.random.default_rng(2)
    base = rng.integers(0, 256, 3 * (64 << 10) + 1000, dtype=np.uint8)  # several chunks and a short last line
    members = {}
    for j, density in enumerate((0.0, 0.001, 0.02, 0.5)):
        m = base.copy()
        idx = rng.choice(m.size, int(m.size * density), replace=False)
        m[idx] ^= rng.integers(1, 256, idx.size, dtype=np.uint8)
        members[f"w{j}"] = m
    write_artifact(tmp_path, [{"members": members}])
    store, _ = open_store(tmp_path, cache_mb=0)
    for name, m in members.items():
        assert np.array_equal(cuda.dedup_reconstruct(store, name), m), name


@gpu
def test_device_bsr_gemv_matches_float64():
    rng = np.random.default_rng(4)
    for rows, cols, br, bc in ((100, 70, 16, 16), (64, 64, 4, 40), (33, 129, 8, 64)):
        m = to_bsr(sparse_blocks(rng, rows, cols, br, bc, 0.4), br, bc).matrix
        nm = native_of(m)
        a64 = m.to_dense(np.float64)
        for b in (1, 3, 8):
            x = rng.standard_normal((b, cols)).astype(np.float32)
            bias = rng.standard_normal(rows).astype(np.float32)
            y = cuda.DeviceBsr(nm).gemv(x, bias=bias)
            assert kernels.max_rel_error(y, x, a64, bias) <= 1e-5, (rows, cols, br, bc, b)


@gpu
def test_microbench_on_the_device_reports_a_fraction_of_copy_bandwidth():
    r = run_tool("ierun", "microbench", "--kernel", "q4_0", "--device", "cuda", "--rows", "4096", "--cols", "4096",
                 "--iters", "5", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["device"] == "cuda" and d["cuda_kernel"] == "planar4" and 0 < d["fraction"] < 1.5
    assert d["read_bw_gbps"] > 100 and d["weight_bytes"] == 4096 * 4096 // 32 * 18
