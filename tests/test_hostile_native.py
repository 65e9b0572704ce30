"""Every exposed native function checks its arguments; every size product is
overflow-checked (issue 11, finding 9). Each of these crashed, read out of
bounds or wrapped before: SIGFPE in microbench (a byte count that wrapped to
0), a segfault in pin_threads(0), an out-of-bounds read in touch_bytes on a
reversed view, signed overflow for 2^62 columns."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from conftest import BIN_DIR, GOLDEN_IEBIN, assert_one_line_error, copy_model, python_bounded, run_tool
from iekit.runtime.native import _native


def test_microbench_with_a_byte_count_that_wraps_is_one_line():
    res = run_tool("ierun", "microbench", "--kernel", "f32", "--rows", str(2**32), "--cols", str(2**32))
    assert_one_line_error(res, "size overflows")


@pytest.mark.parametrize("dtype, rows, cols, group", [
    ("f32", 2**32, 2**32, 0),         # 2^66 bytes: wraps size_t
    ("f32", 3, 2**62, 0),             # 3 * 2^64 bytes: signed overflow of the old products
    ("q8_0", 2**40, 2**30, 0),
    ("int4w", 2**40, 2**30, 32),      # the scale planes overflow even where the codes would not
])
def test_sizes_that_overflow_are_refused(dtype, rows, cols, group):
    with pytest.raises(ValueError, match="size overflows"):
        _native.expected_nbytes(dtype, rows, cols, group_size=group)
    with pytest.raises(ValueError, match="size overflows"):
        _native.WeightSpec(dtype, rows, cols, group_size=group)


def test_decoder_checks_its_threads_and_affinity():
    """The decoder's pool (csrc/common/thread_pool.h) is made with the
    decoder: a bad thread count or pinning mode is one error, in Python's
    check and in the native constructor behind it."""
    from conftest import GOLDEN_IEBIN

    from iekit.formats.errors import IEError
    from iekit.runtime.decoder import Decoder

    for bad in (0, -3):
        with pytest.raises(IEError, match="threads must be >= 1"):
            Decoder(GOLDEN_IEBIN / "tiny-llama", threads=bad, ctx=16)
    with pytest.raises(IEError, match="affinity must be compact, scatter or auto, got 'sideways'"):
        Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2, ctx=16, affinity="sideways")
    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2, ctx=16, affinity="compact")
    assert len(dec.pinned) == 2 and dec.logits([1, 2, 3]).shape == (3, 320)


def test_touch_bytes_refuses_views_that_are_not_one_range():
    buf = np.arange(256, dtype=np.uint8)
    with pytest.raises(ValueError, match="contiguous"):
        _native.touch_bytes(buf[::-1], 0, 64, 1)
    with pytest.raises(ValueError, match="contiguous"):
        _native.touch_bytes(buf[::2], 0, 64, 1)
    with pytest.raises(ValueError, match="stride"):
        _native.touch_bytes(buf, 0, 64, 0)


@pytest.mark.parametrize("start, nbytes, stride", [(0, 256, 1), (10, 1000, 7), (255, 300, 256), (3, 2**63, 2**62),
                                                   (5, 100, 1000)])
def test_touch_bytes_reads_one_byte_per_stride_wrapping(start, nbytes, stride):
    buf = np.random.default_rng(0).integers(0, 256, 256, dtype=np.uint8)
    reads = -(-nbytes // stride)
    want = sum(int(buf[(start + k * stride) % 256]) for k in range(reads))
    assert _native.touch_bytes(buf, start, nbytes, stride) == want


def test_bench_gemv_bounds_what_it_allocates():
    with pytest.raises(ValueError, match="min_bytes"):
        _native.bench_gemv("f32", 4, 32, min_bytes=2**62)


@pytest.mark.parametrize("cmd", [("ierun", "generate", "--model-dir", "{m}", "--ids", "1,2", "--max-new", "1"),
                                 ("ierun", "microbench", "--kernel", "q4_0", "--rows", "64", "--cols", "64"),
                                 ("ieconv", "imatrix", "--model-dir", "{m}", "--text-file", "x", "-o", "y.npz")])
def test_threads_beyond_what_a_pool_takes_is_a_usage_error(cmd):
    """--threads 100000 once segfaulted inside libgomp; every command's
    --threads now stops at the pool's limit with a usage line."""
    from conftest import GOLDEN_IEBIN

    args = [a.format(m=GOLDEN_IEBIN / "tiny-llama") for a in cmd[1:]]
    res = run_tool(cmd[0], *args, "--threads", "100000")
    assert res.returncode == 2 and "--threads" in res.stderr and "4096" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args, needle", [
    (("ierun", "generate", "--model-dir", "{m}", "--ids", "1,2", "--max-new", "1", "--seed", "-1"), "--seed"),
    (("ierun", "microbench", "--kernel", "bsr", "--seed", "-1"), "--seed"),
    (("ierun", "microbench", "--kernel", "bsr", "--density", "0"), "--density"),
    (("ierun", "microbench", "--kernel", "bsr", "--density", "nan"), "--density"),
    (("ierun", "microbench", "--kernel", "bsr", "--density", "2"), "--density"),
    (("ierun", "microbench", "--kernel", "dedup", "--density", "-1"), "--density"),
    (("ierun", "microbench", "--kernel", "bsr", "--iters", "0"), "--iters"),
    (("ierun", "microbench", "--kernel", "bsr", "--iters", "99999999999"), "--iters"),
    (("ierun", "microbench", "--kernel", "q4_0", "--min-mib", "65536"), "--min-mib"),
    (("ierun", "microbench", "--kernel", "dedup", "--nbytes", "65535"), "MiB is available"),
])
def test_numeric_options_out_of_range_are_usage_errors(args, needle):
    """Numbers a command cannot use (a negative seed, a density outside
    (0, 1] or NaN, no iterations or years of them, buffers past the memory
    there is) are a usage line, exit 2, before any work: never exit 3 or a
    wrapped counter."""
    res = run_tool(args[0], *[a.format(m=GOLDEN_IEBIN / "tiny-llama") for a in args[1:]], timeout=60)
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, (res.returncode, res.stderr)



# ------------------------------------------------ the C++ loaders never block on a FIFO (issue 45, item 8)

def test_bsr_loader_refuses_a_fifo_without_opening_it_blocking(tmp_path):
    os.mkfifo(tmp_path / "m.bsr")
    res = python_bounded(f"from iekit.runtime.native import _native; print(_native.bsr_check({str(tmp_path / 'm.bsr')!r}))")
    assert res.returncode == 0, res.stderr
    assert "'ok': False" in res.stdout and "not a regular file (a FIFO)" in res.stdout, res.stdout
    np.save(tmp_path / "d.npy", np.ones((4, 4), np.float32))
    cli = subprocess.run([str(BIN_DIR / "ierun"), "verify", "bsr", str(tmp_path / "m.bsr"), "--dense",
                          str(tmp_path / "d.npy")], capture_output=True, text=True, timeout=60)
    assert_one_line_error(cli, "m.bsr", "not a regular file")


# ------------------------------------------------ a mapped model that shrinks (issue 45, item 11)

def test_a_model_file_truncated_under_the_runtime_is_one_line(tmp_path):
    """ierun reads model.ie.bin in place; truncated while mapped, the next
    read past the new end was a SIGBUS that killed it without a word."""
    d = copy_model(GOLDEN_IEBIN / "tiny-llama", tmp_path / "m")
    res = python_bounded(f"""
import os
from iekit.runtime.decoder import Decoder
dec = Decoder({str(d)!r}, threads=2)
os.truncate({str(d / 'model.ie.bin')!r}, 0)
dec.logits([1, 2, 3])
print("ran on a truncated file")
""")
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert res.stderr.splitlines() == [f"error: {d}: a model file ierun had mapped (model.ie.bin, a dedup blob) "
                                       "shrank while in use (SIGBUS); model files must not change while ierun runs"]
