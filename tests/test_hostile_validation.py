"""Hostile inputs from a security review: each once silently accepted, or
answered with an internal error (exit 3) or an unbounded allocation.

- a safetensors shard whose header length is off by one (its JSON still
  parses, ending in padding spaces) was read with every tensor shifted;
- NaN/Inf stored in weights (a NaN int4w scale with a matching digest)
  passed ``validate --deep`` and ``verify quant``, and decoding emitted id 0
  forever;
- wrong JSON types in model.ie.json / q4_manifest.json raised TypeError, a
  valid 104-byte .bsr made ``verify bsr`` allocate 192 GiB, and
  ``generate --ctx 2147483647`` died in the allocator.

The contract: one stderr line ``FILE: FIELD: message``, exit 1.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import (BIN_DIR, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool,
                      st_write)
from iekit.formats import checksums
from iekit.formats.errors import FormatError, IEError
from iekit.formats.finite import PayloadScan
from iekit.formats.jsonio import dumps_canonical
from iekit.formats.safetensors_reader import SafetensorsFile

MIXEDQ = GOLDEN_IEBIN / "tiny-llama-mixedq"
LLAMA = GOLDEN_IEBIN / "tiny-llama"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def corrupt(src: Path, dst: Path, name: str, rel_off: int, data: bytes) -> Path:
    """A copy of model dir ``src`` with ``data`` written at byte ``rel_off`` of
    tensor ``name``'s payload, and that tensor's digest updated to match (the
    bytes are what they claim to be: only their meaning is wrong)."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / "model.ie.json").read_text())
    t = next(t for t in meta["tensors"] if t["name"] == name)
    assert 0 <= rel_off and rel_off + len(data) <= t["nbytes"]
    b = bytearray((dst / "model.ie.bin").read_bytes())
    o = t["file_data_offset"] + rel_off
    b[o:o + len(data)] = data
    (dst / "model.ie.bin").write_bytes(bytes(b))
    alg = meta["checksum"]
    t[alg] = checksums.digest(alg, bytes(b[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]))
    (dst / "model.ie.json").write_bytes(dumps_canonical(meta))
    return dst


def f16(v: float) -> bytes:
    return struct.pack("<e", v)


def f32(v: float) -> bytes:
    return struct.pack("<f", v)


NAN, INF = float("nan"), float("inf")


# --------------------------------------------------------------------------
# finding 3: the data section must be fully covered (as safetensors requires)
# --------------------------------------------------------------------------


def _shard(path: Path, tensors: dict) -> tuple[bytes, bytes]:
    st_write(path, tensors)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n], raw[8 + n:]


def _short_header_shard(path: Path) -> None:
    """The header padded with spaces (still valid JSON), its length stated one
    byte short: the data section starts one byte early, holding a space."""
    header, data = _shard(path, {"w": ("F32", [8], np.arange(8, dtype=np.float32).tobytes())})
    header += b"   "
    path.write_bytes(struct.pack("<Q", len(header) - 1) + header + data)


def test_safetensors_header_one_byte_short_is_refused(tmp_path):
    import safetensors.numpy

    p = tmp_path / "model.safetensors"
    _short_header_shard(p)
    with pytest.raises(Exception, match="not fully covered"):  # the reference library refuses it
        safetensors.numpy.load_file(str(p))
    with pytest.raises(FormatError) as ei:
        SafetensorsFile(p)
    assert ei.value.field == "header_size" and "fully covered" in ei.value.message


def test_convert_refuses_a_shard_shifted_by_a_short_header(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(GOLDEN_HF / "tiny-llama" / "config.json", hf)
    _short_header_shard(hf / "model.safetensors")
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "out", "-q")
    assert_one_line_error(res, "model.safetensors", "header_size", "fully covered")
    assert not (tmp_path / "out" / "model.ie.json").exists()


def _assemble(path: Path, header: dict, data: bytes) -> None:
    hb = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


@pytest.mark.parametrize("case, field, words", [
    ("gap_between", "b.data_offsets", ["[16, 20)", "after tensor 'a'"]),
    ("gap_at_start", "a.data_offsets", ["[0, 4)", "start"]),
    ("trailing", "header_size", ["cover 32 of the 36", "4 trailing"]),
    ("zero_size_inside", "z.data_offsets", ["overlaps tensor 'a'"]),
])
def test_safetensors_gaps_and_trailing_bytes_are_refused(tmp_path, case, field, words):
    p = tmp_path / "x.safetensors"
    a = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    b = {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}
    if case == "gap_between":
        _assemble(p, {"a": a, "b": {**b, "data_offsets": [20, 36]}}, bytes(36))
    elif case == "gap_at_start":
        _assemble(p, {"a": {**a, "data_offsets": [4, 20]}, "b": {**b, "data_offsets": [20, 36]}}, bytes(36))
    elif case == "trailing":
        _assemble(p, {"a": a, "b": b}, bytes(36))
    else:
        _assemble(p, {"a": a, "b": b, "z": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}}, bytes(32))
    with pytest.raises(FormatError) as ei:
        SafetensorsFile(p)
    assert ei.value.field == field, str(ei.value)
    for w in words:
        assert w in ei.value.message, (w, str(ei.value))


def test_safetensors_exact_tiling_with_zero_size_tensors_is_accepted(tmp_path):
    p = tmp_path / "ok.safetensors"
    _assemble(p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                  "z": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]},
                  "y": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}, bytes(16))
    with SafetensorsFile(p) as sf:
        assert sf.tensors["a"].nbytes == 16


# --------------------------------------------------------------------------
# finding 4: non-finite stored values
# --------------------------------------------------------------------------

# (tensor, byte offset in its payload, bytes, words the message must hold)
NONFINITE_PARAMS = [
    # int4w [64, 128], group 64, symmetric, f16 scales: qs plane 4096 bytes, scale 5 = row 2 group 1
    ("model.layers.0.mlp.down_proj.weight", 4096 + 2 * 5, f16(NAN), ["scale of row 2, group 1", "nan"]),
    # int4w [32, 64], group 32, affine, f32: qs 1024, scales 256, min 3 = row 1 group 1
    ("model.layers.0.self_attn.k_proj.weight", 1280 + 4 * 3, f32(-INF), ["min of row 1, group 1", "-inf"]),
    # q4_0 [64, 64]: 18-byte blocks, 2 per row; d of block 3
    ("model.layers.0.self_attn.o_proj.weight", 18 * 3, f16(INF), ["block 3 (row 1, columns 32..63)", "d is inf"]),
    # q4_1 [64, 128]: 20-byte blocks, 4 per row; m of block 6
    ("model.layers.1.mlp.down_proj.weight", 20 * 6 + 2, f16(NAN), ["block 6 (row 1, columns 64..95)", "m is nan"]),
    # q8_0 [320, 64]: 34-byte blocks, 2 per row; d of block 5
    ("lm_head.weight", 34 * 5, f16(NAN), ["block 5 (row 2, columns 32..63)", "d is nan"]),
]


@pytest.mark.parametrize("name, off, data, words", NONFINITE_PARAMS, ids=lambda v: str(v)[:24])
def test_validate_deep_rejects_nonfinite_scales(tmp_path, name, off, data, words):
    d = corrupt(MIXEDQ, tmp_path / "m", name, off, data)
    assert run_tool("ieconv", "validate", d).returncode == 0  # shallow: the JSON and sizes are fine
    res = run_tool("ieconv", "validate", "--deep", d)
    assert_one_line_error(res, "model.ie.json", "tensors[", name, "non-finite", *words)
    # no flag makes a non-finite scale acceptable
    assert_one_line_error(run_tool("ieconv", "validate", "--deep", "--allow-nonfinite", d), name, *words)


@pytest.mark.parametrize("name, off, data, words", NONFINITE_PARAMS, ids=lambda v: str(v)[:24])
def test_verify_quant_fails_on_nonfinite_scales(tmp_path, name, off, data, words):
    d = corrupt(MIXEDQ, tmp_path / "m", name, off, data)
    res = run_tool("ierun", "verify", "quant", "--model-dir", d, "--json")
    assert_one_line_error(res, "verify quant", name, "finite", *words)
    rep = json.loads(res.stdout)
    bad = next(r for r in rep["results"] if r["name"] == name)
    assert not bad["ok"] and not bad["checks"]["finite"] and not bad["checks"]["gemv"]
    assert bad["gemv_max_rel"] is None  # JSON has no Infinity


@pytest.mark.parametrize("dtype, value, shown", [("f32", f32(INF), "inf"), ("f16", f16(NAN), "nan"),
                                                 ("bf16", b"\x80\xff", "-inf")])
def test_validate_deep_rejects_nonfinite_float_weights_unless_allowed(tmp_path, dtype, value, shown):
    src = tmp_path / "src"
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", src, "-q",
                   *([] if dtype == "f32" else ["--dtype", dtype]))
    assert res.returncode == 0, res.stderr
    itemsize = 4 if dtype == "f32" else 2
    # model.layers.0.mlp.down_proj.weight is [64, 128]: element 130 = (1, 2)
    d = corrupt(src, tmp_path / "m", "model.layers.0.mlp.down_proj.weight", itemsize * 130, value)
    res = run_tool("ieconv", "validate", "--deep", d)
    assert_one_line_error(res, "model.ie.json", "tensors[3]", "model.layers.0.mlp.down_proj.weight",
                          f"{dtype} element 130 (index (1, 2)) is {shown}", "--allow-nonfinite")
    ok = run_tool("ieconv", "validate", "--deep", "--allow-nonfinite", d)
    assert ok.returncode == 0 and "non-finite floats allowed" in ok.stdout, ok.stderr


def _poisoned_checkpoint(src: Path, dst: Path, name: str, index: int, value: float) -> Path:
    """A copy of HF checkpoint ``src`` with element ``index`` of tensor
    ``name`` set to ``value`` in the tensor's own dtype (f32/f16/bf16)."""
    shutil.copytree(src, dst)
    for shard in dst.glob("*.safetensors"):
        b = bytearray(shard.read_bytes())
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        if name in h:
            dt = h[name]["dtype"]
            raw = (np.array([value], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes() if dt == "BF16" \
                else np.array([value], {"F32": "<f4", "F16": "<f2"}[dt]).tobytes()
            o = 8 + n + h[name]["data_offsets"][0] + index * len(raw)
            b[o:o + len(raw)] = raw
            shard.write_bytes(bytes(b))
            return dst
    raise AssertionError(f"{name} not in {src}")


@pytest.mark.parametrize("model, name, index, value, cmd, shown", [
    # copied in the kernel, so found by the digest's read-back: the first tensor written
    ("tiny-llama", "lm_head.weight", 3, np.nan, [], "element 3 (index (0, 3)) is nan"),
    # and the last one (its read-back ends only in finish())
    ("tiny-llama", "model.norm.weight", 5, -np.inf, [], "element 5 is -inf"),
    ("tiny-qwen2", "model.layers.0.mlp.down_proj.weight", 2, np.nan, [], "bf16 element 2 (index (0, 2)) is nan"),
    # a cast: the source's NaN, and a finite f32 that overflows f16
    ("tiny-llama", "model.layers.1.self_attn.q_proj.weight", 7, np.nan, ["--dtype", "f16"], "f16 element 7"),
    ("tiny-llama", "model.layers.1.self_attn.q_proj.weight", 7, 1e6, ["--dtype", "f16"], "is inf"),
])
def test_hf_to_iebin_refuses_nonfinite_float_weights_unless_allowed(tmp_path, model, name, index, value, cmd, shown):
    """What hf-to-iebin writes, validate --deep accepts: a NaN or ±inf weight
    (it turns every logit into NaN) is refused, naming the shard, tensor and
    element, with nothing written; --allow-nonfinite keeps it, as validate's
    flag of the same name accepts it."""
    src = _poisoned_checkpoint(GOLDEN_HF / model, tmp_path / "hf", name, index, value)
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "o", *cmd)
    assert_one_line_error(res, ".safetensors", f"tensor '{name}'", shown, "--allow-nonfinite")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("o.*"))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", tmp_path / "o", *cmd,
                   "--allow-nonfinite")
    assert res.returncode == 0, res.stderr
    assert_one_line_error(run_tool("ieconv", "validate", "--deep", tmp_path / "o"), name, shown)
    assert run_tool("ieconv", "validate", "--deep", "--allow-nonfinite", tmp_path / "o").returncode == 0


def test_a_failed_read_back_is_raised_by_the_next_tensor(tmp_path):
    """IebinWriter checks a kernel-copied payload on its hashing worker; a
    failure there stops the run at the next add_*, not only at finish()
    after every other tensor was written."""
    from iekit.formats.atomic import StagedFiles
    from iekit.formats.iebin import IebinWriter

    def bad(view):
        raise FormatError("src.safetensors", "tensor 'a'", "f32 element 0 is nan")

    with pytest.raises(FormatError, match="tensor 'a'"), StagedFiles(tmp_path) as staged:
        w = IebinWriter(staged)
        w.add_copy("a", "f32", [1], 4, lambda fd, off: os.pwrite(fd, b"\0" * 4, off), check=bad)
        w._pending[-1][1].exception(timeout=10)  # the worker has run the check
        w.add_tensor("b", "f32", [1], [b"\0" * 4], 4)
    assert not list(tmp_path.iterdir())


def test_rotate_refuses_a_nonfinite_weight(tmp_path):
    """Rotated, one NaN would fill a whole row or column of every matrix it meets."""
    src = _poisoned_checkpoint(GOLDEN_HF / "tiny-llama", tmp_path / "hf", "model.layers.0.mlp.up_proj.weight", 9,
                               np.inf)
    res = run_tool("ieconv", "rotate", "-q", "--hf-dir", src, "--out-dir", tmp_path / "rot")
    assert_one_line_error(res, ".safetensors", "model.layers.0.mlp.up_proj.weight", "element 9 (index (0, 9)) is inf")
    assert "--allow-nonfinite" not in res.stderr  # rotate has no such flag
    assert not (tmp_path / "rot").exists()


def test_gguf_to_iebin_refuses_a_nonfinite_float_tensor_unless_allowed(tmp_path):
    """A GGUF's F32 tensors are copied, and checked like hf-to-iebin's."""
    from gguf_build import gguf_from_hf

    from iekit.formats.gguf_file import open_gguf

    good = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "good.gguf")
    t = next(t for t in open_gguf(good).tensors if t.name == "blk.1.attn_norm.weight")
    data = bytearray(good.read_bytes())
    data[t.offset + 4 * 6:t.offset + 4 * 7] = f32(NAN)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", "blk.1.attn_norm.weight", "element 6 is nan", "--allow-nonfinite")
    assert not (tmp_path / "o").exists()
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "o", "--allow-nonfinite")
    assert res.returncode == 0, res.stderr
    assert run_tool("ieconv", "validate", "--deep", "--allow-nonfinite", tmp_path / "o").returncode == 0


def test_payload_scan_is_independent_of_chunking():
    """validate --deep streams payloads in chunks: a NaN is found wherever the
    chunk boundaries fall (even splitting a block or an element)."""
    rng = np.random.default_rng(0)
    entries = {
        "int4w": ({"dtype": "int4w", "shape": [4, 64], "quant": {"scheme": "int4w", "group_size": 32,
                   "symmetric": False, "scale_dtype": "f32", "layout": "planar-v1"}}, 4 * 32, 8, 4),
        "q4_1": ({"dtype": "q4_1", "shape": [4, 64], "quant": {"scheme": "q4_1", "block_size": 32}}, 0, 20, 2),
        "f32": ({"dtype": "f32", "shape": [4, 64]}, 0, 4, 4),
    }
    for kind, (entry, base, stride, width) in entries.items():
        nbytes = {"int4w": 4 * 32 + 2 * 4 * 2 * 4, "q4_1": 4 * 2 * 20, "f32": 4 * 64 * 4}[kind]
        raw = bytearray(nbytes)
        k = 5
        o = base + stride * k + (2 if kind == "q4_1" else 0)
        raw[o:o + width] = f16(NAN) if width == 2 else f32(NAN)
        for size in (1, 3, 7, 19, 64, nbytes):
            s = PayloadScan(entry)
            for i in range(0, nbytes, size):
                s.feed(bytes(raw[i:i + size]))
            assert s.problem is not None and "nan" in s.problem, (kind, size)
            one = PayloadScan(entry)
            one.feed(bytes(raw))
            assert s.problem == one.problem, (kind, size)
        clean = PayloadScan(entry)
        clean.feed(bytes(rng.integers(0, 60, nbytes, dtype=np.uint8)))  # small bytes: finite f16/f32 patterns
        assert clean.problem is None, (kind, clean.problem)


def test_max_rel_error_never_skips_nonfinite_outputs():
    from iekit.runtime.kernels import max_rel_error

    w = np.array([[1.0, np.nan], [1.0, 2.0]])
    x = np.ones((1, 2), np.float32)
    y = np.array([[np.nan, 3.0]], np.float32)
    assert max_rel_error(y, x, w) == float("inf")
    assert max_rel_error(y, x, w, allow_nonfinite=True) == 0.0  # verify bsr --allow-nonfinite only


@pytest.mark.parametrize("cmd", ["generate", "logits", "bench"])
def test_decoding_stops_on_nonfinite_logits(tmp_path, cmd):
    d = corrupt(MIXEDQ, tmp_path / "m", *NONFINITE_PARAMS[0][:3])
    args = {"generate": ["generate", "--model-dir", d, "--ids", "1,2,3", "--max-new", "5"],
            "logits": ["logits", "--model-dir", d, "--ids", "1,2,3", "--out", tmp_path / "l.npy"],
            "bench": ["bench", "--model-dir", d, "--max-new", "4", "--rounds", "1"]}[cmd]
    res = run_tool("ierun", *args)
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "model.ie.json: logits: non-finite" in line and "position" in line, line
    assert not (tmp_path / "l.npy").exists()


def test_nonfinite_logits_leave_the_decoder_usable(tmp_path):
    from iekit.runtime.decoder import Decoder

    d = corrupt(LLAMA, tmp_path / "m", "lm_head.weight", 4 * 64 * 7, f32(NAN))  # row 7 of the head: logit 7
    dec = Decoder(d)
    with pytest.raises(IEError, match="non-finite"):
        dec.prefill([1, 2, 3])
    assert dec.n_past == 0


# --------------------------------------------------------------------------
# finding 8: types before iteration, sizes bounded before allocation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["files", "aux_files"])
@pytest.mark.parametrize("value", [7, "x", {"name": "model.ie.bin"}, None])
def test_files_of_the_wrong_type(tmp_path, key, value):
    d = edited_artifact(LLAMA, tmp_path / "m", lambda m: m.update({key: value}))
    for tool, args in (("ieconv", ["validate", d]), ("ieconv", ["inspect", d]),
                       ("ierun", ["generate", "--model-dir", d, "--ids", "1"])):
        assert_one_line_error(run_tool(tool, *args), "model.ie.json", key)


@pytest.mark.parametrize("manifest, field", [
    ({"version": 1, "rules": 1}, "rules"),
    ({"version": 1, "rules": True}, "rules"),
    ({"version": 1, "tensors": [1]}, "tensors"),
    ({"version": 1, "tensors": 7}, "tensors"),
    ({"version": 1, "tensors": "x"}, "tensors"),
])
def test_q4_manifest_of_the_wrong_type(tmp_path, manifest, field):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(manifest))
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", tmp_path / "o",
                   "--q4-map", p, "-q")
    assert_one_line_error(res, str(p), field)


def _bsr_header(rows: int, cols: int, br: int, bc: int) -> bytes:
    """A valid .bsr with no stored block: 96-byte header + row_ptr [0, 0]."""
    payload = struct.pack("<II", 0, 0)
    return struct.pack("<8sIIQQIIQQQQQIIII", b"IEBSR\0\0\0", 1, 96, rows, cols, br, bc, 1, 0, 8, 0, 0, 0, 0,
                       zlib.crc32(payload), 0) + payload


def _limit_memory(nbytes: int):
    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return pre


def test_verify_bsr_of_a_104_byte_file_with_huge_blocks(tmp_path):
    """1×24 matrix in 2^31×24 blocks: valid, and nothing may be sized by the
    padded block (the dense reference used to be 192 GiB)."""
    p = tmp_path / "big.bsr"
    p.write_bytes(_bsr_header(1, 24, 2**31, 24))
    assert p.stat().st_size == 104
    dense = tmp_path / "d.npy"
    np.save(dense, np.zeros((1, 24), np.float32))
    res = subprocess.run([str(BIN_DIR / "ierun"), "verify", "bsr", str(p), "--dense", str(dense), "--json"],
                         capture_output=True, text=True, timeout=300, preexec_fn=_limit_memory(8 << 30))
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert json.loads(res.stdout)["ok"]

    from iekit.formats import bsr

    assert bsr.read(p).to_dense().shape == (1, 24)


def test_verify_bsr_refuses_a_dense_reference_that_cannot_fit(tmp_path):
    from iekit.runtime.verify_bsr import verify_bsr

    p = tmp_path / "tall.bsr"
    p.write_bytes(_bsr_header(2**32 - 1, 24, 2**32 - 1, 24))
    dense = np.broadcast_to(np.float32(0), (2**32 - 1, 24))  # matches the shape, holds nothing
    with pytest.raises(FormatError) as ei:
        verify_bsr(p, dense, threads=1, seed=0)
    assert ei.value.field == "rows" and "verify bsr" in ei.value.message


def test_bsr_to_dense_matches_the_padded_definition():
    """to_dense no longer builds the padded grid: same matrix, tail blocks included."""
    from iekit.formats import bsr

    rng = np.random.default_rng(1)
    for rows, cols, br, bc in ((10, 13, 4, 8), (3, 5, 8, 8), (16, 16, 4, 4), (7, 40, 7, 16), (9, 9, 2, 3)):
        nbr, nbc = -(-rows // br), -(-cols // bc)
        keep = rng.random((nbr, nbc)) < 0.6
        pad = rng.standard_normal((nbr * br, nbc * bc)).astype(np.float32)
        pad[rows:], pad[:, cols:] = 0, 0  # padding is +0.0
        pad *= np.repeat(np.repeat(keep, br, 0), bc, 1)
        r, c = np.nonzero(keep)
        vals = np.array([pad[i * br:(i + 1) * br, j * bc:(j + 1) * bc] for i, j in zip(r, c)],
                        np.float32).reshape(-1, br, bc)
        row_ptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.uint32)
        m = bsr.BsrMatrix(rows, cols, br, bc, row_ptr, c.astype(np.uint32), vals)
        bsr.check_matrix(m)
        np.testing.assert_array_equal(m.to_dense(), pad[:rows, :cols])
        np.testing.assert_array_equal(m.to_dense(np.float64), pad[:rows, :cols].astype(np.float64))


def test_generate_ctx_beyond_the_model(tmp_path):
    res = run_tool("ierun", "generate", "--model-dir", LLAMA, "--ids", "1,2", "--ctx", "2147483647")
    assert_one_line_error(res, "--ctx", "2147483647", "max_position_embeddings (128)")
    res = run_tool("ierun", "logits", "--model-dir", LLAMA, "--ids", "1,2", "--ctx", "129", "--out", tmp_path / "x.npy")
    assert_one_line_error(res, "--ctx", "max_position_embeddings")
    assert run_tool("ierun", "generate", "--model-dir", LLAMA, "--ids", "1,2", "--ctx", "128",
                    "--max-new", "2").returncode == 0


def test_ctx_of_a_model_that_does_not_state_its_positions(tmp_path):
    d = edited_artifact(LLAMA, tmp_path / "m", lambda m: reconfigure(m, max_position_embeddings=None))
    assert run_tool("ierun", "generate", "--model-dir", d, "--ids", "1,2", "--ctx", "200",
                    "--max-new", "2").returncode == 0
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1", "--ctx", str(2**31)),
                          "--ctx", "larger than the decoder supports")


def test_generate_ctx_whose_kv_cache_cannot_fit(tmp_path):
    d = edited_artifact(LLAMA, tmp_path / "m", lambda m: reconfigure(m, max_position_embeddings=2**31 - 1))
    res = subprocess.run([str(BIN_DIR / "ierun"), "generate", "--model-dir", str(d), "--ids", "1,2",
                          "--ctx", str(2**31 - 1)], capture_output=True, text=True, timeout=300,
                         preexec_fn=_limit_memory(8 << 30))
    assert_one_line_error(res, "--ctx", "KV cache", "memory available")


@pytest.mark.parametrize("edit, words", [
    (lambda m: reconfigure(m, head_dim=2**40), ["model.head_dim", "larger than the decoder supports"]),
    (lambda m: reconfigure(m, head_dim=2**30), ["model.head_dim", "q_proj"]),
    (lambda m: reconfigure(m, eos_token_id=[[]]), ["model.eos_token_id"]),
    (lambda m: reconfigure(m, eos_token_id=["2"]), ["model.eos_token_id"]),
    (lambda m: reconfigure(m, rope_scaling={"rope_type": "llama3", "factor": "x"}), ["rope_scaling.factor"]),
    (lambda m: reconfigure(m, rope_scaling={"rope_type": "llama3", "factor": 8}),
     ["rope_scaling.original_max_position_embeddings"]),
    (lambda m: reconfigure(m, rope_scaling={"rope_type": "llama3", "factor": 8, "low_freq_factor": 5,
                                            "original_max_position_embeddings": 64}), ["high_freq_factor"]),
])
def test_decoder_hostile_model_summary(tmp_path, edit, words):
    d = edited_artifact(LLAMA, tmp_path / "m", edit)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "model.ie.json", *words)
