"""Split GGUF models (llama.cpp's gguf-split, convert_hf_to_gguf's
--split-max-tensors): opened from the first file as llama.cpp's loader opens
them, the others found by name beside it. Written here by gguf-py's own
writer (tests/gguf_build.py, ``split_max_tensors``): the files as the format's
owner writes them. A split imports to the bytes the unsplit file does; the
tensor table is the union of what gguf's reader sees in each file; ierun
takes the first file as -m and re-imports when any shard changes; a shard
missing, opened first, renamed, from another split, or holding what the first
does not is one line naming the file and the key."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN_HF, assert_one_line_error, run_tool
from gguf_build import gguf_from_hf

from iekit.formats.errors import FormatError
from iekit.formats.gguf_file import open_gguf, shard_paths

QUANT = {r"mlp": "Q4_1", r"q_proj": "Q8_0"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    """(the unsplit file, the first of its split into 3 files of at most 8 tensors)."""
    d = tmp_path_factory.mktemp("split")
    whole = gguf_from_hf(GOLDEN_HF / "tiny-llama", d / "whole.gguf", quant=QUANT)
    (d / "split").mkdir()
    first = gguf_from_hf(GOLDEN_HF / "tiny-llama", d / "split" / "m.gguf", quant=QUANT, split_max_tensors=8)
    assert first.name == "m-00001-of-00003.gguf"
    return whole, first


def _copy_split(first: Path, to: Path) -> Path:
    to.mkdir()
    for p in shard_paths(first):
        shutil.copy(p, to / p.name)
    return to / first.name


def test_the_table_is_every_shards_tensors_as_gguf_reads_them(files):
    from gguf import GGUFReader

    whole, first = files
    g = open_gguf(first)
    assert [p.name for p in g.paths] == [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    theirs = {}
    for i, p in enumerate(g.paths):
        for t in GGUFReader(p).tensors:
            theirs[t.name] = (i, t.tensor_type.name, [int(d) for d in reversed(t.shape)], bytes(t.data.tobytes()))
    assert len(g.tensors) == len(theirs) == 21 == g.fields["split.tensors.count"]
    for t in g.tensors:
        assert (t.shard, t.ggml_type, t.shape, g.tensor_bytes(t).tobytes()) == theirs[t.name], t.name
    one = open_gguf(whole)
    assert {t.name: t.shape for t in one.tensors} == {t.name: t.shape for t in g.tensors}
    assert {k: v for k, v in g.fields.items() if not k.startswith("split.")} == one.fields
    g.close()


def test_a_split_imports_to_the_bytes_of_the_whole_file(tmp_path, files):
    whole, first = files
    for name, src in (("whole", whole), ("split", first)):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "whole" / "model.ie.bin").read_bytes() == (tmp_path / "split" / "model.ie.bin").read_bytes()
    shards = json.loads((tmp_path / "split" / "model.ie.json").read_text())["source"]["shards"]
    assert [(s["name"], s["nbytes"]) for s in shards] == [(p.name, p.stat().st_size) for p in shard_paths(first)]
    res = run_tool("ieconv", "validate", first)
    assert res.returncode == 0 and "21 tensors in 3 files" in res.stdout, res.stdout + res.stderr
    listed = json.loads(run_tool("ieconv", "inspect", "--json", first).stdout)
    assert len(listed["files"]) == 3 and {t["file"] for t in listed["tensors"]} == {0, 1, 2}


def test_gguf_to_hf_and_q4_manifest_take_the_first_file(tmp_path, files):
    whole, first = files
    for name, src in (("whole", whole), ("split", first)):
        res = run_tool("ieconv", "gguf-to-hf", "-q", "--gguf", src, "--out-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr
        res = run_tool("ieconv", "q4-manifest", "--gguf", src, "-o", tmp_path / f"{name}.json", "--scheme", "q4_0")
        assert res.returncode == 0, res.stderr
    from safetensors.numpy import load_file

    a, b = (load_file(tmp_path / n / "model.safetensors") for n in ("whole", "split"))  # the header names the file
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert (tmp_path / "whole.json").read_text() == (tmp_path / "split.json").read_text()


def test_ierun_takes_the_first_file_and_reimports_a_changed_shard(tmp_path, files):
    whole, first = files
    first = _copy_split(first, tmp_path / "m")
    env = {**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")}
    outs = []
    for src in (whole, first):
        res = run_tool("ierun", "generate", "-m", src, "--ids", "1,2,3", "--max-new", "4", env=env)
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1]
    assert len(list((tmp_path / "cache").iterdir())) == 2
    last = shard_paths(first)[-1]
    g = open_gguf(first)
    t = next(t for t in g.tensors if t.shard == 2 and t.ggml_type == "F32")
    g.close()
    raw = bytearray(last.read_bytes())
    raw[t.offset:t.offset + 4] = np.float32(0.5).tobytes()  # one weight of the last shard changed
    last.write_bytes(bytes(raw))
    res = run_tool("ierun", "generate", "-m", first, "--ids", "1,2,3", "--max-new", "4", env=env)
    assert res.returncode == 0, res.stderr
    assert len(list((tmp_path / "cache").iterdir())) == 3
    assert "while its 3 files' xxh3_128 digest is the same" in res.stderr
    shard_paths(first)[1].unlink()
    assert_one_line_error(run_tool("ierun", "generate", "-m", first, "--ids", "1", "--max-new", "1", env=env),
                          "m-00002-of-00003.gguf: (file): no such file")


def _patch(path: Path, key: str, value: bytes) -> None:
    """Overwrite the value of ``key`` (a scalar, same size) in place: after the key's name, its u32 type."""
    raw = bytearray(path.read_bytes())
    at = raw.index(key.encode()) + len(key) + 4
    raw[at:at + len(value)] = value
    path.write_bytes(bytes(raw))


def _with_kv(src: Path, dst: Path, extra: dict[str, str]) -> None:
    """``src`` rewritten by gguf's writer with string key-values added (its tensors' bytes as they are)."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), "llama")
    for k, f in r.fields.items():
        if k.startswith("split."):
            getattr(w, {"split.no": "add_uint16", "split.count": "add_uint16",
                        "split.tensors.count": "add_int32"}[k])(k, f.contents())
    for k, v in extra.items():
        w.add_string(k, v)
    for t in r.tensors:
        quantized = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type if quantized else None)  # blocks: rows of bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("case", ["missing", "second-first", "renamed", "other-split", "twice", "count", "total",
                                  "foreign-key", "other-value"])
def test_a_broken_split_is_one_line(tmp_path, files, case):
    _whole, first = files
    first = _copy_split(first, tmp_path / "m")
    shards = shard_paths(first)
    arg, needles = first, []
    if case == "missing":
        shards[1].unlink()
        needles = [shards[1].name, "no such file"]
    elif case == "second-first":
        arg, needles = shards[1], ["split.no", "open it from its first file, m-00001-of-00003.gguf"]
    elif case == "renamed":
        arg = first.rename(first.with_name("model.gguf"))
        needles = ["split.count", "NAME-00001-of-00003.gguf"]
    elif case == "other-split":  # the second file of the same model split in two
        other = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "two.gguf", quant=QUANT, split_max_tensors=12)
        shutil.copy(shard_paths(other)[1], shards[1])
        needles = [shards[1].name, "split.count", "expected 3"]
    elif case == "twice":  # the second file again under the third's name, numbered as the third
        shutil.copy(shards[1], shards[2])
        _patch(shards[2], "split.no", np.uint16(2).tobytes())
        needles = [shards[2].name, "is in m-00002-of-00003.gguf too"]
    elif case == "count":
        _patch(first, "split.tensors.count", np.int32(20).tobytes())
        needles = [shards[1].name, "split.tensors.count", "expected 20"]
    elif case == "total":  # every file says 20, and they hold 21
        for p in shards:
            _patch(p, "split.tensors.count", np.int32(20).tobytes())
        needles = [first.name, "split.tensors.count", "is 20, but the 3 files hold 21 tensors"]
    elif case == "foreign-key":
        _with_kv(shards[2], tmp_path / "x.gguf", {"general.name": "another model"})
        shutil.move(tmp_path / "x.gguf", shards[2])
        needles = [shards[2].name, "general.name", "does not hold"]
    else:
        _with_kv(shards[2], tmp_path / "x.gguf", {})
        shutil.move(tmp_path / "x.gguf", shards[2])
        _patch(shards[2], "general.architecture", b"\x05\x00\x00\x00\x00\x00\x00\x00qwen2")
        needles = [shards[2].name, "general.architecture", "another value"]
    with pytest.raises(FormatError) as e:
        open_gguf(arg).close()
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)
    assert_one_line_error(run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", arg, "--out-dir", tmp_path / "o"),
                          *needles)
    assert not (tmp_path / "o").exists()


def test_a_shard_that_cannot_be_opened_is_named(files, monkeypatch):
    """Out of file descriptors (a split of very many files) or unreadable: one
    line naming the shard, and the shards already open are closed."""
    import errno
    import io

    from iekit.formats import gguf_file

    _whole, first = files
    opened, real = [], io.FileIO

    def file_io(path, mode="r"):
        if str(path).endswith("-00003-of-00003.gguf"):
            raise OSError(errno.EMFILE, "Too many open files")
        f = real(path, mode)
        opened.append(f)
        return f

    monkeypatch.setattr(gguf_file.io, "FileIO", file_io)
    with pytest.raises(FormatError, match=r"m-00003-of-00003.gguf: \(file\): cannot open: Too many open files"):
        open_gguf(first)
    assert len(opened) == 2 and all(f.closed for f in opened)
