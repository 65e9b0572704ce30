"""bench-quality's own arithmetic (benchmarks/quality_bench.py): the bits
per weight it prints beside every GGUF, ik_llama.cpp's included, whose types
this project does not read."""

from __future__ import annotations

import pytest
import quality_bench
from gguf_build import kv_bytes, raw_gguf

from iekit.formats.errors import FormatError
from iekit.formats.gguf_file import open_gguf


def _model(tmp_path, head_type: int):
    kvs = [kv_bytes("general.architecture", "str", "llama"), kv_bytes("tokenizer.ggml.tokens", "strs", ["a", "bc"]),
           kv_bytes("llama.block_count", "u32", 1), kv_bytes("general.alignment", "u32", 32)]
    # the embedding (f32, not counted), a Q4_0 matrix (8 rows of 2 blocks: 288 bytes), the head (576 bytes:
    # 16 rows of Q4_0, or of a type with the same size), a norm (f32, not counted); no padding between them
    tensors = [("token_embd.weight", [64, 10], 0, 0), ("blk.0.ffn_down.weight", [64, 8], 2, 2560),
               ("output.weight", [64, 16], head_type, 2848), ("blk.0.attn_norm.weight", [64], 0, 3424)]
    return raw_gguf(tmp_path / f"m{head_type}.gguf", kvs, tensors, bytes(3424 + 256))


def test_gguf_bpw_counts_quantized_matrices_by_their_bytes_even_of_unknown_types(tmp_path):
    q4_0 = _model(tmp_path, 2)
    assert len(open_gguf(q4_0).tensors) == 4  # a well-formed file, to our own reader too
    assert quality_bench.gguf_bpw(q4_0) == 4.5
    ik = _model(tmp_path, 144)  # ik_llama.cpp's IQ4_KS: a type id gguf-py and our reader refuse
    with pytest.raises(FormatError, match="unknown ggml type 144"):
        open_gguf(ik)
    assert quality_bench.gguf_bpw(ik) == 4.5
    # the header is still read strictly: a file cut inside its tensor infos is refused, not sized
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(ik.read_bytes()[:200])
    with pytest.raises(FormatError, match="past the end"):
        quality_bench.gguf_bpw(cut)


def test_a_llamacpp_tool_killed_by_a_signal_runs_once_more_without_repacking(tmp_path):
    """benchmarks/llamacpp.py run_repack_safe, for llama.cpp's AMX crash: a
    tool that dies of a signal is run again with the flag; one that exits
    with an error, or was already given the flag, is not."""
    import sys

    import llamacpp

    log = tmp_path / "runs"
    # a stand-in tool: records its arguments, then dies of SIGSEGV unless given --no-repack
    tool = [sys.executable, "-c", "import os, signal, sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + "
            "'\\n'); '--no-repack' in sys.argv or os.kill(os.getpid(), signal.SIGSEGV)", str(log), "-m", "x"]
    res, note = llamacpp.run_repack_safe(tool, ["--no-repack"])
    assert (res.returncode, note) == (0, "--no-repack")
    assert log.read_text().splitlines() == ["-m x", "-m x --no-repack"]
    log.unlink()
    res, note = llamacpp.run_repack_safe([*tool, "--repack", "0"], ["--repack", "0"])  # given the flag: no retry
    assert res.returncode < 0 and note is None and len(log.read_text().splitlines()) == 1
    res, note = llamacpp.run_repack_safe([sys.executable, "-c", "raise SystemExit(3)"], ["--no-repack"])
    assert (res.returncode, note) == (3, None)
