"""The strict safetensors reader: hostile inputs and exact bytes.

Valid files are written by the real ``safetensors`` library; hostile ones are
derived from them by editing the header or the bytes by hand. Every rejection
must be a FormatError naming the file and the field (``str == "FILE: FIELD: msg"``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
from safetensors import safe_open

from iekit.formats.errors import FormatError
from iekit.formats.safetensors_reader import MAX_HEADER_BYTES, SafetensorsFile

# safetensors header dtype -> numpy dtype (None: numpy has no bf16) and the
# dtype name TensorSpec (safetensors >= 0.7) takes
DTYPES: dict[str, tuple[str | None, str]] = {
    "F64": ("<f8", "float64"),
    "F32": ("<f4", "float32"),
    "F16": ("<f2", "float16"),
    "BF16": (None, "bfloat16"),
    "I64": ("<i8", "int64"),
    "I32": ("<i4", "int32"),
    "I16": ("<i2", "int16"),
    "I8": ("i1", "int8"),
    "U8": ("u1", "uint8"),
    "BOOL": ("?", "bool"),
}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
SPEC_NAME = {**{k: v[1] for k, v in DTYPES.items()}, "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def serialize(specs: dict[str, tuple[str, list[int], bytes]], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write raw tensors ``{name: (ST_DTYPE, shape, data)}`` with the safetensors library."""
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7: pointers, not bytes
        keep = []
        flat = {}
        for name, (dt, shape, data) in specs.items():
            buf = np.frombuffer(bytearray(data) or bytearray(1), dtype=np.uint8)
            keep.append(buf)
            flat[name] = safetensors.TensorSpec(dtype=SPEC_NAME[dt], shape=list(shape),
                                                data_ptr=buf.ctypes.data, data_len=len(data))
        safetensors.serialize_file(flat, path, metadata=metadata)
        del keep
    else:
        safetensors.serialize_file({n: {"dtype": dt, "shape": list(s), "data": d} for n, (dt, s, d) in specs.items()},
                                   path, metadata=metadata)


def split(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def assemble(path: Path, header: dict | bytes | str, data: bytes) -> None:
    hb = header if isinstance(header, bytes) else (header if isinstance(header, str) else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


def expect_error(path: Path, field: str, *words: str) -> FormatError:
    with pytest.raises(FormatError) as ei:
        with SafetensorsFile(path):
            pass
    e = ei.value
    s = str(e)
    assert (e.file, e.field) == (os.fspath(path), field), s
    assert s.startswith(f"{path}: {field}: "), s
    for w in words:
        assert w in e.message, (w, s)
    return e


@pytest.fixture
def two(tmp_path) -> Path:
    """A valid file: a = F32 [2, 3], b = F32 [4] (both 4-byte, so offsets are easy)."""
    p = tmp_path / "two.safetensors"
    serialize({"a": ("F32", [2, 3], bytes(range(24))), "b": ("F32", [4], bytes(range(100, 116)))}, p)
    with SafetensorsFile(p) as sf:  # the baseline is valid
        assert set(sf.tensors) == {"a", "b"}
    return p


def edit_header(path: Path, fn) -> None:
    header, data = split(path)
    fn(header)
    assemble(path, header, data)


# --------------------------------------------------------------------------
# framing: the 8-byte length and the header bytes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\x00", b"\x08\x00\x00\x00\x00\x00\x00"])
def test_file_shorter_than_8_bytes(tmp_path, content):
    p = tmp_path / "short.safetensors"
    p.write_bytes(content)
    expect_error(p, "header_size", "too short", f"{len(content)} bytes")


def test_header_length_past_end_of_file(two):
    raw = two.read_bytes()
    two.write_bytes(struct.pack("<Q", len(raw) - 8 + 1) + raw[8:])
    expect_error(two, "header_size", "past the end")


def test_truncated_inside_header(two):
    (n,) = struct.unpack("<Q", two.read_bytes()[:8])
    os.truncate(two, 8 + n - 1)
    expect_error(two, "header_size", "past the end", str(n))


@pytest.mark.parametrize("hlen", [MAX_HEADER_BYTES + 1, 2 ** 32, 2 ** 63, 2 ** 64 - 1])
def test_header_length_over_limit(tmp_path, hlen):
    assert MAX_HEADER_BYTES == 100_000_000  # the safetensors library's own limit
    p = tmp_path / "huge.safetensors"
    p.write_bytes(struct.pack("<Q", hlen) + b"{}" + b" " * 64)
    expect_error(p, "header_size", "exceeds", str(hlen))


def test_header_length_at_limit_is_checked_against_the_file(tmp_path):
    # exactly the limit is allowed by the length rule; this small file is then too short
    p = tmp_path / "limit.safetensors"
    p.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES) + b"{}")
    expect_error(p, "header_size", "past the end")


@pytest.mark.parametrize("header", [b"not json", b"{\"a\": ", b"{'a': 1}", b"\x00" * 8, b""])
def test_header_not_json(tmp_path, header):
    p = tmp_path / "bad.safetensors"
    assemble(p, header, b"")
    expect_error(p, "(file)", "invalid JSON")


def test_header_not_utf8(tmp_path):
    p = tmp_path / "bad.safetensors"
    assemble(p, b'{"__metadata__": {"k": "\xff"}}', b"")
    expect_error(p, "(file)", "UTF-8")


@pytest.mark.parametrize("header", ["[]", "[{\"dtype\": \"F32\"}]", "\"F32\"", "42", "null"])
def test_header_not_an_object(tmp_path, header):
    p = tmp_path / "bad.safetensors"
    assemble(p, header, b"")
    expect_error(p, "header", "not a JSON object")


def test_header_nan_literal(two):
    header, data = split(two)
    text = json.dumps(header).replace('"shape": [4]', '"shape": [NaN]')
    assert "NaN" in text
    assemble(two, text, data)
    expect_error(two, "(file)", "NaN")


def test_duplicate_tensor_names_in_header(two):
    header, data = split(two)
    text = json.dumps(header)
    dup = '"a": ' + json.dumps(header["a"])
    assert dup in text
    assemble(two, text.replace(dup, dup + ", " + dup), data)
    expect_error(two, "(file)", "duplicate key 'a'")


def test_duplicate_keys_inside_an_entry(two):
    header, data = split(two)
    text = json.dumps(header)
    assert '"dtype": "F32"' in text
    assemble(two, text.replace('"dtype": "F32"', '"dtype": "F16", "dtype": "F32"', 1), data)
    expect_error(two, "(file)", "duplicate key 'dtype'")


@pytest.mark.parametrize("header", [
    '{"a": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 0]}}',
    "[" * 100_000 + "]" * 100_000,
], ids=["5000-digit-int", "deep-nesting"])
def test_hostile_json_is_a_format_error(tmp_path, header):
    p = tmp_path / "bad.safetensors"
    assemble(p, header, b"")
    with pytest.raises(FormatError):
        SafetensorsFile(p)


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.safetensors", "(file)", "no such file")


def test_directory(tmp_path):
    expect_error(tmp_path, "(file)", "is a directory")


# --------------------------------------------------------------------------
# tensor entries
# --------------------------------------------------------------------------


def test_unsupported_dtype_written_by_the_library(tmp_path):
    """F8_E5M2 has no reader here; F8_E4M3 does (FP8 checkpoints: formats/hf_fp8.py), and reads as such."""
    p = tmp_path / "f8.safetensors"
    serialize({"w": ("F8_E5M2", [4], bytes(4))}, p)
    assert split(p)[0]["w"]["dtype"] == "F8_E5M2"
    expect_error(p, "w.dtype", "unsupported dtype 'F8_E5M2'")
    serialize({"w": ("F8_E4M3", [4], bytes(4))}, p)
    with SafetensorsFile(p) as sf:
        assert sf.tensors["w"].dtype.name == "f8_e4m3" and not sf.tensors["w"].dtype.is_float


@pytest.mark.parametrize("value", ["f32", "F32 ", "FLOAT32", "U16", "C64", ""])
def test_unsupported_dtype_spelling(two, value):
    edit_header(two, lambda h: h["b"].update(dtype=value))
    expect_error(two, "b.dtype", "unsupported dtype", repr(value))


@pytest.mark.parametrize("value", [None, 4, ["F32"]])
def test_dtype_not_a_string(two, value):
    edit_header(two, lambda h: h["b"].update(dtype=value))
    expect_error(two, "b.dtype", "not a string")


def test_dtype_missing(two):
    edit_header(two, lambda h: h["b"].pop("dtype"))
    expect_error(two, "b.dtype", "missing")


@pytest.mark.parametrize("shape", [[-4], [2, -3], [-1, -6], [4.0], [True, 4], ["4"], [None], "4", None, {"0": 4}])
def test_bad_shape(two, shape):
    edit_header(two, lambda h: h["b"].update(shape=shape))
    expect_error(two, "b.shape", "non-negative integers")


def test_shape_missing(two):
    edit_header(two, lambda h: h["b"].pop("shape"))
    expect_error(two, "b.shape", "non-negative integers")


@pytest.mark.parametrize("shape", [[2 ** 62], [2 ** 40, 2 ** 40], [2 ** 64]])
def test_shape_overflows_int64(two, shape):
    edit_header(two, lambda h: h["b"].update(shape=shape))
    expect_error(two, "b.shape", "overflows")


def test_entry_not_an_object(two):
    edit_header(two, lambda h: h.update(b=[0, 16]))
    expect_error(two, "b", "not an object")


@pytest.mark.parametrize("offs", [None, [0], [0, 16, 32], [0.0, 16], [False, 16], ["0", "16"], {"0": 0}])
def test_data_offsets_malformed(two, offs):
    edit_header(two, lambda h: h["b"].update(data_offsets=offs))
    expect_error(two, "b.data_offsets", "[begin, end]")


@pytest.mark.parametrize("offs", [[16, 0], [-16, 0], [-4, 12]])
def test_data_offsets_invalid_range(two, offs):
    edit_header(two, lambda h: h["b"].update(data_offsets=offs))
    expect_error(two, "b.data_offsets", "invalid range")


def _last_tensor(path: Path) -> tuple[str, int]:
    header, _ = split(path)
    name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    return name, header[name]["data_offsets"][1]


@pytest.mark.parametrize("cut", [1, 4, 16])
def test_data_offsets_past_end_of_truncated_file(two, cut):
    name, end = _last_tensor(two)
    _, data = split(two)
    assert end == len(data)
    os.truncate(two, two.stat().st_size - cut)
    expect_error(two, f"{name}.data_offsets", "past", str(end))


def test_data_offsets_past_end_by_header_edit(two):
    _, data = split(two)
    edit_header(two, lambda h: h["b"].update(data_offsets=[len(data) - 12, len(data) + 4]))
    expect_error(two, "b.data_offsets", "past")


@pytest.mark.parametrize("mutate, words", [
    (lambda h: h["a"].update(shape=[2, 2]), ["24", "16"]),  # range holds 24 bytes, shape needs 16
    (lambda h: h["a"].update(shape=[3, 3]), ["24", "36"]),
    (lambda h: h["a"].update(dtype="F64"), ["24", "48"]),
    (lambda h: h["a"].update(dtype="F16"), ["24", "12"]),
    (lambda h: h["a"].update(shape=[]), ["24", "4"]),
    (lambda h: h["a"].update(shape=[0]), ["24", "0"]),
    (lambda h: h["a"].update(data_offsets=[h["a"]["data_offsets"][0], h["a"]["data_offsets"][1] - 1]), ["23", "24"]),
])
def test_data_offsets_size_mismatch_with_shape(two, mutate, words):
    edit_header(two, mutate)
    expect_error(two, "a.data_offsets", "range holds", *words)


def test_overlapping_data_offsets(two):
    header, _ = split(two)
    a0, a1 = header["a"]["data_offsets"]
    b0, b1 = header["b"]["data_offsets"]
    assert (b1 - b0) == 16 and (a1 - a0) == 24
    first, second = ("a", "b") if a0 < b0 else ("b", "a")
    f0 = header[first]["data_offsets"][0]
    # move the later tensor to start 4 bytes into the earlier one, keeping its size
    size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    edit_header(two, lambda h: h[second].update(data_offsets=[f0 + 4, f0 + 4 + size]))
    expect_error(two, f"{second}.data_offsets", "overlaps", repr(first))


def test_identical_data_offsets_overlap(tmp_path):
    p = tmp_path / "same.safetensors"
    serialize({"a": ("F32", [4], bytes(16)), "b": ("I32", [4], bytes(16))}, p)
    edit_header(p, lambda h: h["b"].update(data_offsets=h["a"]["data_offsets"]))
    expect_error(p, "b.data_offsets", "overlaps", "'a'")


def test_one_byte_overlap(tmp_path):
    p = tmp_path / "u8.safetensors"
    serialize({"a": ("U8", [8], bytes(range(8))), "b": ("U8", [8], bytes(range(8, 16)))}, p)
    with SafetensorsFile(p) as sf:  # control: touching ranges are fine
        assert (sf.tensors["a"].nbytes, sf.tensors["b"].nbytes) == (8, 8)
    edit_header(p, lambda h: h.update(a={**h["a"], "data_offsets": [0, 8]}, b={**h["b"], "data_offsets": [7, 15]}))
    expect_error(p, "b.data_offsets", "overlaps", "'a'")


def test_zero_size_tensor_may_share_an_offset(tmp_path):
    # control: the library writes zero-size tensors with begin == end == a neighbour's begin
    p = tmp_path / "z.safetensors"
    serialize({"a": ("F32", [4], bytes(range(16))), "z": ("F32", [0, 3], b""), "y": ("U8", [0], b"")}, p)
    with SafetensorsFile(p) as sf:
        assert sf.tensors["z"].nbytes == 0 and sf.tensors["y"].nbytes == 0
        assert b"".join(sf.iter_chunks(sf.tensors["a"])) == bytes(range(16))


@pytest.mark.parametrize("value", [{"k": 1}, {"k": None}, {"k": ["v"]}, {"k": {"x": "y"}}, [], "text", None, 3])
def test_metadata_not_str_to_str(two, value):
    edit_header(two, lambda h: h.update(__metadata__=value))
    expect_error(two, "__metadata__", "string to string")


def test_metadata_written_by_the_library(tmp_path):
    p = tmp_path / "meta.safetensors"
    serialize({"a": ("U8", [3], b"abc")}, p, metadata={"format": "pt", "note": "ünïcode"})
    with SafetensorsFile(p) as sf:
        assert sf.metadata == {"format": "pt", "note": "ünïcode"}
        assert set(sf.tensors) == {"a"}  # __metadata__ is not a tensor


def test_file_shrinking_after_open(two):
    with SafetensorsFile(two) as sf:
        name, _ = _last_tensor(two)
        os.truncate(two, two.stat().st_size - 4)
        with pytest.raises(FormatError) as ei:
            b"".join(sf.iter_chunks(sf.tensors[name], 8))
    assert str(ei.value).startswith(f"{two}: {name}: ")
    assert "shrank" in ei.value.message


# --------------------------------------------------------------------------
# exact bytes for every supported dtype
# --------------------------------------------------------------------------

SHAPES = [[], [0], [3, 0], [1], [5], [2, 3], [3, 1, 7], [33]]


def _payload(rng: np.random.Generator, dt: str, shape: list[int]) -> bytes:
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dt == "BOOL":
        return rng.integers(0, 2, size=n, dtype=np.uint8).tobytes()
    return rng.integers(0, 256, size=n * ITEMSIZE[dt], dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def all_dtypes(tmp_path_factory) -> tuple[Path, dict[str, tuple[str, list[int], bytes]]]:
    rng = np.random.default_rng(1234)
    specs = {f"{dt.lower()}_{'x'.join(map(str, s)) or 'scalar'}": (dt, s, _payload(rng, dt, s))
             for dt in DTYPES for s in SHAPES}
    p = tmp_path_factory.mktemp("st") / "all.safetensors"
    serialize(specs, p)
    return p, specs


def test_every_tensor_is_listed(all_dtypes):
    p, specs = all_dtypes
    with SafetensorsFile(p) as sf:
        assert set(sf.tensors) == set(specs)
        assert sf.metadata == {}
        for name, (dt, shape, data) in specs.items():
            t = sf.tensors[name]
            assert (t.dtype.safetensors, list(t.shape), t.nbytes) == (dt, shape, len(data))
            assert t.dtype.itemsize == ITEMSIZE[dt]


@pytest.mark.parametrize("chunk", [8, 16, 24, 1 << 20])
@pytest.mark.parametrize("dt", list(DTYPES))
def test_iter_chunks_yields_exactly_the_written_bytes(all_dtypes, dt, chunk):
    p, specs = all_dtypes
    raw = p.read_bytes()
    with SafetensorsFile(p) as sf, safe_open(p, "numpy") as ref:
        for name, (sdt, shape, data) in specs.items():
            if sdt != dt:
                continue
            t = sf.tensors[name]
            chunks = list(sf.iter_chunks(t, chunk))
            got = b"".join(chunks)
            assert got == data, name
            assert raw[t.start:t.start + t.nbytes] == data, name
            # bounded, full-size chunks (except the last), never empty
            assert all(0 < len(c) <= chunk for c in chunks), name
            assert all(len(c) == chunk for c in chunks[:-1]), name
            assert len(chunks) == -(-len(data) // chunk), name
            np_dt = DTYPES[dt][0]
            if np_dt is not None:  # numpy cannot represent bf16: compared against the serialized bytes above
                arr = ref.get_tensor(name)
                assert arr.dtype == np.dtype(np_dt) and list(arr.shape) == shape, name
                assert arr.tobytes() == got, name


def test_iter_chunks_matches_numpy_save_file(tmp_path):
    # a second, independent writer path: safetensors.numpy.save_file
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    arrays = {
        "f64": rng.standard_normal((3, 5)),
        "f32": rng.standard_normal(17).astype(np.float32),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "i64": rng.integers(-2 ** 62, 2 ** 62, size=4, dtype=np.int64),
        "i8": rng.integers(-128, 128, size=(9,), dtype=np.int8),
        "b": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.int32),
    }
    p = tmp_path / "np.safetensors"
    save_file(arrays, p)
    with SafetensorsFile(p) as sf:
        for name, arr in arrays.items():
            t = sf.tensors[name]
            assert list(t.shape) == list(arr.shape)
            assert b"".join(sf.iter_chunks(t, 8)) == arr.astype(arr.dtype.newbyteorder("<")).tobytes(), name


def test_read_rows_reads_exactly_those_rows(tmp_path):
    """What q4-manifest --target-bpw measures on: chosen rows only, against safetensors' own reader."""
    from safetensors.numpy import save_file

    w = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    p = tmp_path / "m.safetensors"
    save_file({"a": np.ones(3, np.float16), "w": w}, str(p))
    with SafetensorsFile(p) as f:
        t = f.tensors["w"]
        got = np.frombuffer(f.read_rows(t, [0, 3, 6]), np.float32).reshape(3, 5)
        with pytest.raises(IndexError, match="w: row 7 of 7"):
            f.read_rows(t, [7])
    with safe_open(str(p), "np") as ref:
        assert np.array_equal(got, ref.get_tensor("w")[[0, 3, 6]])


def test_streamed_writer_is_read_by_safetensors_and_rewrites_identically(tmp_path):
    """formats/safetensors_writer.py (ieconv rotate's): safetensors' own reader
    and ours accept its file, and writing what was read gives the same bytes."""
    from safetensors.numpy import load_file

    from iekit.formats.safetensors_writer import SafetensorsWriter

    rng = np.random.default_rng(0)
    tensors = {"b.weight": rng.standard_normal((3, 5)).astype("<f4"), "a.bias": rng.standard_normal(7).astype("<f4"),
               "c.half": rng.standard_normal((2, 3)).astype("<f2")}
    dtype = {"<f4": "f32", "<f2": "f16"}

    def write(path, arrays):
        with open(path, "wb") as f:
            w = SafetensorsWriter(f, [(n, dtype[a.dtype.str], list(a.shape)) for n, a in arrays.items()], {"format": "pt"})
            for n, a in arrays.items():  # in pieces, as the rotation streams them
                raw = a.tobytes()
                w.write(n, [raw[:4], raw[4:]])
            w.finish()

    write(tmp_path / "a.safetensors", tensors)
    got = load_file(tmp_path / "a.safetensors")
    assert set(got) == set(tensors) and all(np.array_equal(got[n], a) for n, a in tensors.items())
    assert (8 + struct.unpack("<Q", (tmp_path / "a.safetensors").read_bytes()[:8])[0]) % 8 == 0
    with SafetensorsFile(tmp_path / "a.safetensors") as sf:
        assert sf.metadata == {"format": "pt"}
        again = {n: np.frombuffer(b"".join(sf.iter_chunks(sf.tensors[n])), tensors[n].dtype).reshape(tensors[n].shape)
                 for n in tensors}
    write(tmp_path / "b.safetensors", again)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()

    with open(tmp_path / "c.safetensors", "wb") as f:
        w = SafetensorsWriter(f, [("x", "f32", [2]), ("y", "f32", [1])], {})
        with pytest.raises(ValueError, match="'y' written where 'x' comes next"):
            w.write("y", [b"\0" * 4])
        with pytest.raises(ValueError, match="got 4 bytes, its header says 8"):
            w.write("x", [b"\0" * 4])


def test_a_view_of_rows_kept_apart_reads_them_in_order(tmp_path):
    """A fused matrix's part (formats/fused_tensors.py: Qwen3-Next's blocked projections) is a view whose rows lie
    in several byte ranges: every reader (chunks of any size, a copy, chosen rows) gives those rows in order."""
    from dataclasses import replace

    from iekit.formats import fused_tensors

    w = np.arange(24 * 5, dtype=np.float32).reshape(24, 5)
    serialize({"m": ("F32", [24, 5], w.tobytes())}, tmp_path / "m.safetensors")
    cfg = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 2, "linear_value_head_dim": 2}
    runs = fused_tensors.row_runs(cfg, fused_tensors.QKVZ, 24, "m")
    with SafetensorsFile(tmp_path / "m.safetensors") as sf:
        t = sf.tensors["m"]
        for k, rows in enumerate(fused_tensors.part_sizes(runs)):
            want = w[fused_tensors.part_index(runs, k)]
            parts = fused_tensors.split({"architectures": ["Qwen3NextForCausalLM"], **cfg},
                                        {"x.linear_attn.in_proj_qkvz.weight": (sf, t)}, "m")
            view = parts[f"x.{fused_tensors.FUSED[fused_tensors.QKVZ][k]}"][1]
            assert view.shape == (rows, 5) and len(view.runs) > 1
            for chunk in (8, 20, 4096):
                assert b"".join(sf.iter_chunks(view, chunk)) == want.tobytes()
            assert sf.read_rows(view, [rows - 1, 0, 3]) == want[[rows - 1, 0, 3]].tobytes()
            with open(tmp_path / "out", "wb+") as f:
                f.write(b"\0" * 7)
                sf.copy_to(view, f.fileno(), 7)
            assert (tmp_path / "out").read_bytes()[7:] == want.tobytes()
            assert replace(view, runs=()).ranges() == ((view.start, view.nbytes),)
