"""Importance matrices: what `ieconv imatrix` collects (against a float64
numpy forward pass with the matrix inputs captured), the file format's
round trip, and its strict reader on broken files."""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, run_tool
from decoder_ref import forward, load_weights
from iekit.formats import imatrix
from iekit.formats.errors import FormatError

TEXT = GOLDEN / "text" / "eval-sample.txt"


def collect_ids(tmp_path, model_dir, ids: list[int], ctx: int = 16,
                out_name: str = "im.npz") -> tuple[imatrix.Imatrix, os.PathLike]:
    """`ieconv imatrix` over exact token ids, as a user runs it: the file read back, and its path
    (``out_name`` .gguf: llama.cpp's GGUF imatrix)."""
    (tmp_path / "ids.txt").write_text(",".join(map(str, ids)))
    out = tmp_path / out_name
    res = run_tool("ieconv", "imatrix", "--model-dir", model_dir, "--ids-file", tmp_path / "ids.txt",
                   "-o", out, "--ctx", str(ctx), "--threads", "2")
    assert res.returncode == 0, res.stderr
    return imatrix.read_any(out), out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_collected_means_match_the_float64_reference(tmp_path, name):
    ids = [int(i) for i in np.random.default_rng(4).integers(3, 300, 48)]
    im, _ = collect_ids(tmp_path, GOLDEN_IEBIN / name, ids)
    assert im.tokens == 48 and im.meta["chunks"] == 3 and im.meta["ctx"] == 16
    model, w = load_weights(GOLDEN_IEBIN / name)
    ref: dict[str, np.ndarray] = {}
    for c in range(3):  # each chunk a fresh sequence
        inputs: dict[str, np.ndarray] = {}
        forward(model, w, ids[16 * c:16 * (c + 1)], inputs=inputs)
        for k, v in inputs.items():
            ref[k] = ref.get(k, 0) + v
    assert set(im.entries) == set(ref)
    for k, v in ref.items():
        np.testing.assert_allclose(im.entries[k], v / 48, rtol=2e-4, atol=1e-7, err_msg=k)


def test_cli_text_overwrite_and_errors(tmp_path):
    out = tmp_path / "im.npz"
    args = ("--model-dir", GOLDEN_IEBIN / "tiny-llama", "-o", out, "--ctx", "64", "-q")
    assert run_tool("ieconv", "imatrix", "--text-file", TEXT, *args, "--chunks", "2").returncode == 0
    first = out.read_bytes()
    assert_one_line_error(run_tool("ieconv", "imatrix", "--text-file", TEXT, *args), "exists", "--overwrite")
    assert out.read_bytes() == first
    assert run_tool("ieconv", "imatrix", "--text-file", TEXT, *args, "--chunks", "2", "--overwrite").returncode == 0
    assert out.read_bytes() == first  # deterministic
    (tmp_path / "empty.txt").write_text("  \n")
    assert_one_line_error(run_tool("ieconv", "imatrix", "--text-file", tmp_path / "empty.txt", *args, "--overwrite"),
                          "empty.txt", "no text")
    (tmp_path / "short.txt").write_text("1,2,3")
    assert_one_line_error(run_tool("ieconv", "imatrix", "--ids-file", tmp_path / "short.txt", *args, "--overwrite"),
                          "fewer than one chunk")


def _entries():
    return {"a.weight": np.array([1.0, 0.5, 0.0], np.float32), "b.weight": np.arange(1, 65, dtype=np.float32),
            "s.experts.down_proj": np.arange(12, dtype=np.float32).reshape(4, 3)}


META = {"tokens": 10, "chunks": 1, "ctx": 10, "source": {"model_dir": "m"}}


def test_round_trip_is_byte_identical(tmp_path):
    p = tmp_path / "im.npz"
    imatrix.write(p, imatrix.Imatrix(_entries(), META))
    im = imatrix.read(p)
    assert {k: v.tolist() for k, v in im.entries.items()} == {k: v.tolist() for k, v in _entries().items()}
    assert imatrix.to_bytes(im) == p.read_bytes()
    with pytest.raises(FormatError, match="exists"):
        imatrix.write(p, im)
    found, missing = imatrix.select_for(im, {"a.weight": [8, 3], "c.weight": [8, 3]}, "im")
    assert list(found) == ["a.weight"] and missing == ["c.weight"]
    with pytest.raises(FormatError, match="c.weight: no entry for any of the 1 matrices"):
        imatrix.select_for(im, {"c.weight": [8, 3]}, "im")
    with pytest.raises(FormatError, match="a.weight: 3 columns, the matrix has 4"):
        imatrix.select_for(im, {"a.weight": [8, 4]}, "im")
    # An expert stack [experts, rows, cols] takes [experts, cols] (each expert its own) or [cols] (shared).
    found, _ = imatrix.select_for(im, {"s.experts.down_proj": [4, 5, 3], "a.weight": [4, 6, 3]}, "im")
    assert found["s.experts.down_proj"].shape == (4, 3) and found["a.weight"].shape == (3,)
    with pytest.raises(FormatError, match="4 experts' importances, but the tensor is a stack of 2"):
        imatrix.select_for(im, {"s.experts.down_proj": [2, 5, 3]}, "im")
    with pytest.raises(FormatError, match="4 experts' importances, but the tensor is one matrix"):
        imatrix.select_for(im, {"s.experts.down_proj": [5, 3]}, "im")


def _zip(members: dict[str, bytes], compress=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as z:
        for k, v in members.items():
            z.writestr(k, v)
    return buf.getvalue()


def _npy(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, a, version=(1, 0), allow_pickle=False)
    return f.getvalue()


def _huge_header() -> bytes:
    """A .npy v1.0 header claiming [2**32, 2**32] float32 (2**64 elements: np.prod wraps to 0), no data."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


GOOD_META = json.dumps({**META, "format": "iekit-imatrix", "version": 1}).encode()


@pytest.mark.parametrize("members, needle", [
    ({"a.weight.npy": _npy(np.array([np.nan], np.float32)), "__meta__.json": GOOD_META}, "column 0 is nan"),
    ({"a.weight.npy": _npy(np.array([1, -1], np.float32)), "__meta__.json": GOOD_META}, "column 1 is -1.0"),
    ({"a.weight.npy": _npy(np.array([1.0])), "__meta__.json": GOOD_META}, "<f8 [1], expected <f4 [cols] or [experts, cols]"),
    ({"a.weight.npy": _npy(np.ones((2, 2, 2), np.float32)), "__meta__.json": GOOD_META}, "expected <f4 [cols] or [experts"),
    ({"a.weight.npy": _npy(np.ones((0, 2), np.float32)), "__meta__.json": GOOD_META}, "shape [0, 2], expected [cols]"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32))[:-4], "__meta__.json": GOOD_META}, "[3] in 8 data bytes"),
    ({"a.weight.npy": _npy(np.array([[1, 2], [3, np.inf]], np.float32)), "__meta__.json": GOOD_META},
     "column 1 of expert 1 is inf"),
    ({"a.weight.npy": b"not npy", "__meta__.json": GOOD_META}, "a.weight.npy"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32))}, "__meta__.json: missing"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": b"{"}, "invalid JSON"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": GOOD_META.replace(b'"tokens": 10', b'"tokens": "10"')},
     "tokens: expected int"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": GOOD_META.replace(b'"tokens": 10', b'"tokens": true')},
     "tokens: expected int"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": GOOD_META.replace(b'"tokens": 10', b'"tokens": 0')},
     "tokens: 0 (must be >= 1)"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": GOOD_META.replace(b'"version": 1', b'"version": 2')},
     "this reader knows"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "notes.txt": b"", "__meta__.json": GOOD_META},
     "notes.txt: unexpected member"),
    ({"__meta__.json": GOOD_META}, "no matrices"),
    # issue 45: each of these was exit 3 (np.prod wrapped the shape to 0; json.loads recursed) or failed the
    # conversion later, blaming its own output
    ({"a.weight.npy": _huge_header(), "__meta__.json": GOOD_META}, "data bytes"),
    ({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": b"[" * 100_000 + b"]" * 100_000},
     "nesting too deep"),
    ({"a.weight.npy": _npy(np.array([1, 3e38], np.float32)), "__meta__.json": GOOD_META}, "at most 1e+30"),
])
def test_broken_files_are_one_clear_error(tmp_path, members, needle):
    p = tmp_path / "im.npz"
    p.write_bytes(_zip(members))
    with pytest.raises(FormatError, match=None) as e:
        imatrix.read(p)
    assert needle in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_not_a_zip_deflated_truncated_and_a_fifo(tmp_path):
    p = tmp_path / "im.npz"
    p.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(FormatError, match="not an imatrix file"):
        imatrix.read(p)
    p.write_bytes(_zip({"a.weight.npy": _npy(np.ones(3, np.float32)), "__meta__.json": GOOD_META},
                       zipfile.ZIP_DEFLATED))
    with pytest.raises(FormatError, match="compressed member"):
        imatrix.read(p)
    good = imatrix.to_bytes(imatrix.Imatrix(_entries(), META))
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(FormatError):
        imatrix.read(p)
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    with pytest.raises(FormatError, match="FIFO"):
        imatrix.read(fifo)


def test_golden_round_trip_and_meta_schema(tmp_path):
    import jsonschema

    golden = GOLDEN / "imatrix" / "example.npz"
    im = imatrix.read(golden)
    assert imatrix.to_bytes(im) == golden.read_bytes()
    assert np.load(golden)["model.layers.0.mlp.down_proj.weight"].shape == (64,)  # numpy reads it as an .npz
    schema = json.loads((GOLDEN.parent / "schemas" / "imatrix_meta.schema.json").read_text())
    jsonschema.validate(im.meta, schema)
    out = tmp_path / "im.npz"
    assert run_tool("ieconv", "imatrix", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--text-file", TEXT, "-o", out,
                    "--ctx", "64", "--chunks", "1", "-q").returncode == 0
    jsonschema.validate(imatrix.read(out).meta, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**im.meta, "tokens": 0}, schema)


def test_mutated_golden_files_are_refused_or_accepted_never_crash(tmp_path):
    """A deterministic mini-fuzz (fuzz/fuzz_python.py's py_imatrix found a truncated member raising
    EOFError from zipfile): byte flips, truncations and stretched sizes of the golden file."""
    good = (GOLDEN / "imatrix" / "example.npz").read_bytes()
    rng = np.random.default_rng(0)
    p = tmp_path / "im.npz"
    for i in range(1500):
        b = bytearray(good)
        if i % 3 == 0:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        p.write_bytes(bytes(b))
        try:
            imatrix.read(p)
        except FormatError as e:
            assert "\n" not in str(e) and str(p) in str(e)


def test_validate_and_inspect_an_imatrix(tmp_path):
    golden = GOLDEN / "imatrix" / "example.npz"
    res = run_tool("ieconv", "validate", golden)
    assert res.returncode == 0 and res.stdout.strip() == f"OK {golden}: importance matrix v1, 2 matrices, 512 tokens in 1 chunks"
    res = run_tool("ieconv", "inspect", golden, "--json")
    got = json.loads(res.stdout)
    rows = {r["name"]: r for r in got["matrices"]}
    down = rows["model.layers.0.mlp.down_proj.weight"]
    a = np.linspace(0, 2, 64, dtype=np.float32).astype(np.float64)
    assert down["cols"] == 64 and down["mean"] == pytest.approx(a.mean()) and down["max"] == pytest.approx(2.0)
    assert down["top1pct_share"] == pytest.approx(2.0 / a.sum())  # 64 columns: the top one
    assert got["meta"]["tokens"] == 512
    assert "top 1% of columns hold" in run_tool("ieconv", "inspect", golden).stdout
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage")
    assert_one_line_error(run_tool("ieconv", "validate", bad), "bad.npz", "not an imatrix file")
    assert_one_line_error(run_tool("ieconv", "inspect", bad), "bad.npz", "not an imatrix file")


def _legacy(entries: dict[str, tuple[int, list[float]]], trailer: bytes | None = b"") -> bytes:
    """llama.cpp's legacy .dat layout, written from its description (common/imatrix-loader.cpp)."""
    import struct

    out = struct.pack("<i", len(entries))
    for name, (ncall, vals) in entries.items():
        n = name.encode()
        out += struct.pack("<i", len(n)) + n + struct.pack("<ii", ncall, len(vals)) + struct.pack(f"<{len(vals)}f", *vals)
    if trailer is None:
        return out
    return out + struct.pack("<i", 10) + struct.pack("<i", 8) + b"wiki.raw" + trailer


def test_llama_cpp_legacy_imatrix_is_read_and_used(tmp_path):
    p = tmp_path / "im.dat"
    p.write_bytes(_legacy({"blk.0.ffn_down.weight": (2, [4.0] * 128), "blk.0.attn_q.weight": (0, [1.5] * 64)}))
    im = imatrix.read_any(p)
    assert im.meta == {"format": "llama.cpp-legacy", "chunks": 10, "dataset": "wiki.raw"}
    assert im.entries["blk.0.ffn_down.weight"].tolist() == [2.0] * 128  # means: the sums / ncall
    assert im.entries["blk.0.attn_q.weight"].tolist() == [1.5] * 64  # ncall 0: as stored
    p2 = tmp_path / "short.dat"
    p2.write_bytes(_legacy({"blk.0.ffn_down.weight": (1, [1.0] * 128)}, trailer=None))  # no trailer: fine
    assert imatrix.read_any(p2).meta["chunks"] is None
    res = run_tool("ieconv", "validate", p)
    assert res.returncode == 0 and res.stdout.strip() == f"OK {p}: llama.cpp legacy importance matrix, 2 matrices, 10 chunks"
    assert "blk.0.ffn_down.weight" in run_tool("ieconv", "inspect", p).stdout
    # used by the converter under the Hugging Face names
    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN / "hf" / "tiny-llama", "-o", m,
                    "--scheme", "q4_0").returncode == 0
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN / "hf" / "tiny-llama", "--q4-map", m,
                   "--out-dir", tmp_path / "o", "--imatrix", p)
    assert res.returncode == 0, res.stderr
    assert "(2 importance-weighted)" in res.stderr and "no entry for 12 of the 14 matrices" in res.stderr


@pytest.mark.parametrize("mutate, needle", [
    (lambda b: b[:-3], "file ends at byte"),
    (lambda b: b + b"x", "bytes after the trailer"),
    (lambda b: b"\x00\x00\x00\x00" + b[4:], "not an importance matrix"),
    (lambda b: b[:4] + b"\xff\xff\xff\x7f" + b[8:], "entry 0: name length"),
    (lambda b: b.replace(b"\x00\x00\x80\x40", b"\x00\x00\xc0\x7f", 1), "importances are finite, >= 0"),
    (lambda b: b.replace(b"\x00\x00\x80\x40", b"\x00\x00\x80\xc0", 1), "importances are finite, >= 0"),
    (lambda b: b"GGUF" + b[4:], "GGUF version"),
])
def test_hostile_legacy_imatrix_is_one_clear_error(tmp_path, mutate, needle):
    p = tmp_path / "im.dat"
    p.write_bytes(mutate(_legacy({"blk.0.ffn_down.weight": (1, [4.0] * 8)})))
    with pytest.raises(FormatError, match=needle) as e:
        imatrix.read_any(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    res = run_tool("ieconv", "validate", p)
    assert_one_line_error(res, str(p))


def test_duplicate_legacy_entries_are_refused(tmp_path):
    p = tmp_path / "im.dat"
    body = _legacy({"a.weight": (1, [1.0])}, trailer=None)
    p.write_bytes(b"\x02\x00\x00\x00" + body[4:] + body[4:])
    with pytest.raises(FormatError, match="a.weight: appears twice"):
        imatrix.read_any(p)


LLAMACPP_GGUF = GOLDEN / "imatrix" / "tiny-llama.llamacpp.gguf"
LLAMACPP_DAT = GOLDEN / "imatrix" / "tiny-llama.llamacpp.dat"


def test_llama_imatrix_gguf_and_dat_files_read_to_its_means():
    """llama-imatrix's own two files of one run (golden/imatrix): the means are
    in_sum2 / counts as gguf's GGUFReader sees the tensors, the same from both."""
    from gguf import GGUFReader

    g, d = imatrix.read_any(LLAMACPP_GGUF), imatrix.read_any(LLAMACPP_DAT)
    assert g.meta == {"format": "llama.cpp-gguf", "chunks": 6, "ctx": 64, "tokens": 384, "dataset": "eval-sample.txt"}
    assert d.meta == {"format": "llama.cpp-legacy", "chunks": 6, "dataset": "eval-sample.txt"}
    tensors = {t.name: np.asarray(t.data, np.float32).reshape(-1) for t in GGUFReader(LLAMACPP_GGUF).tensors}
    assert len(g.entries) == 14 and set(g.entries) == set(d.entries)
    for name, v in g.entries.items():
        assert np.array_equal(v, tensors[name + ".in_sum2"] / tensors[name + ".counts"][0]), name
        assert np.array_equal(v, d.entries[name]), name


def test_ieconv_imatrix_agrees_with_llama_imatrix(tmp_path):
    """The same model (the golden GGUF, imported) and text, chunked as llama-imatrix
    chunks it: the first layer's inputs agree to float rounding; later ones to
    1.3% (llama.cpp's quantized matmuls take 8-bit activations, ours f32)."""
    from iekit.convert.gguf_names import hf_name

    out = tmp_path / "ours.npz"
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", GOLDEN / "gguf" / "tiny-llama-mixed", "--text-file", TEXT,
                   "--ctx", "64", "--chunks", "6", "-o", out)
    assert res.returncode == 0, res.stderr
    # the GGUF itself, as llama-imatrix is run (-m FILE -f TEXT): imported, then the same statistics
    direct = tmp_path / "direct.npz"
    res = run_tool("ieconv", "imatrix", "-q", "-m", GOLDEN / "gguf" / "tiny-llama.mixed.gguf", "-f", TEXT,
                   "--ctx", "64", "--chunks", "6", "-o", direct,
                   env={**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr
    ours, theirs, d = imatrix.read(out), imatrix.read_any(LLAMACPP_GGUF), imatrix.read(direct)
    assert d.entries.keys() == ours.entries.keys()
    assert all(np.array_equal(v, ours.entries[k]) for k, v in d.entries.items())
    assert ours.tokens == theirs.tokens == 384
    assert set(ours.entries) - {"lm_head.weight"} == {hf_name(n) for n in theirs.entries}  # llama.cpp: --process-output
    for name, v in theirs.entries.items():
        rel = np.abs(ours.entries[hf_name(name)] - v).max() / v.max()
        assert rel < (1e-5 if name.startswith("blk.0.attn_") and name != "blk.0.attn_output.weight" else 3e-2), name


def _gguf_fields_and_tensors(path) -> tuple[dict, dict]:
    """What gguf's own reader sees: the key-values, and per tensor its shape (numpy order) and values."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: np.asarray(t.data, np.float32).reshape(list(reversed([int(d) for d in t.shape])))
                    for t in r.tensors}


def test_ieconv_imatrix_writes_what_llama_imatrix_writes(tmp_path):
    """`-o NAME.gguf` is llama.cpp's GGUF imatrix. Against llama-imatrix's own file
    of the same GGUF, text and chunks (golden), gguf's reader sees the same keys
    (its -f as given; the architecture as a label), the same tensors and shapes
    (and the head's, which llama-imatrix writes with --process-output), the same
    counts, and sums that agree as the means do; read back, the means are the
    .npz's; an existing file stays unless --overwrite, and a rewrite is the same
    bytes."""
    from iekit.convert.gguf_names import importance_to_hf

    args = ["imatrix", "-q", "-m", GOLDEN / "gguf" / "tiny-llama.mixed.gguf", "-f", TEXT, "--ctx", "64", "--chunks", "6"]
    env = {**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")}
    out, npz = tmp_path / "ours.gguf", tmp_path / "ours.npz"
    for path in (out, npz):
        res = run_tool("ieconv", *args, "-o", path, env=env)
        assert res.returncode == 0, res.stderr
    (ours_kv, ours), (theirs_kv, theirs) = _gguf_fields_and_tensors(out), _gguf_fields_and_tensors(LLAMACPP_GGUF)
    assert theirs_kv["imatrix.datasets"] == ["eval-sample.txt"] and ours_kv["imatrix.datasets"] == [str(TEXT)]
    assert ours_kv == {**theirs_kv, "general.architecture": "llama", "imatrix.datasets": [str(TEXT)]}
    assert set(ours) == set(theirs) | {"output.weight.in_sum2", "output.weight.counts"}
    for name, v in theirs.items():
        assert ours[name].shape == v.shape, name
        if name.endswith(".counts"):
            assert v.tolist() == [384.0] and ours[name].tolist() == [384.0], name
        else:
            rel = np.abs(ours[name] - v).max() / v.max()
            assert rel < (1e-5 if name.startswith(("blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v")) else 3e-2), name
    mine = imatrix.read(npz)
    back = importance_to_hf(imatrix.read_any(out).entries, set(mine.entries), str(out))
    assert back.keys() == mine.entries.keys()
    for k, v in mine.entries.items():
        np.testing.assert_allclose(back[k], v, rtol=1e-6, err_msg=k)
    before = out.read_bytes()
    assert_one_line_error(run_tool("ieconv", *args, "-o", out, env=env), str(out), "--overwrite")
    assert run_tool("ieconv", *args, "-o", out, "--overwrite", env=env).returncode == 0
    assert out.read_bytes() == before
    # --output-format gguf whatever the name; npz for a .gguf name
    for fmt, path, magic in (("gguf", tmp_path / "a.imatrix", b"GGUF"), ("npz", tmp_path / "b.gguf", b"PK")):
        assert run_tool("ieconv", *args, "-o", path, "--output-format", fmt, env=env).returncode == 0
        assert path.read_bytes()[:len(magic)] == magic


def test_llama_imatrix_gguf_is_validated_inspected_and_used(tmp_path):
    res = run_tool("ieconv", "validate", LLAMACPP_GGUF)
    assert res.returncode == 0
    assert res.stdout.strip() == f"OK {LLAMACPP_GGUF}: llama.cpp GGUF importance matrix, 14 matrices, 384 tokens in 6 chunks of 64"
    assert "blk.1.ffn_down.weight" in run_tool("ieconv", "inspect", LLAMACPP_GGUF).stdout
    m = tmp_path / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN / "hf" / "tiny-llama", "-o", m, "--scheme", "q4_0",
                    "--imatrix", LLAMACPP_GGUF).returncode == 0
    outs = []
    for im in (LLAMACPP_GGUF, LLAMACPP_DAT):
        outs.append(tmp_path / im.suffix[1:])
        res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN / "hf" / "tiny-llama", "--q4-map", m,
                       "--out-dir", outs[-1], "--imatrix", im)
        assert res.returncode == 0, res.stderr
        assert "(14 importance-weighted)" in res.stderr and "warning" not in res.stderr
    assert (outs[0] / "model.ie.bin").read_bytes() == (outs[1] / "model.ie.bin").read_bytes()
    # a GGUF model where an imatrix should be: one line saying so (`ieconv validate` checks it as a model)
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN / "hf" / "tiny-llama", "--q4-map",
                                   m, "--out-dir", tmp_path / "x", "--imatrix",
                                   GOLDEN / "gguf" / "tiny-llama.mixed.gguf"),
                          "general.type", "a GGUF model, not an importance matrix")
    assert run_tool("ieconv", "validate", GOLDEN / "gguf" / "tiny-llama.mixed.gguf").returncode == 0


def _gguf_imatrix(path, tensors, kv=None):
    """A GGUF imatrix written with gguf's GGUFWriter, as llama-imatrix lays it out;
    ``kv`` overrides (value None: leave the key out)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")  # llama-imatrix writes no architecture; the reader ignores it
    keys = {"general.type": ("string", "imatrix"), "imatrix.datasets": ("array", ["wiki.txt"]),
            "imatrix.chunk_count": ("uint32", 4), "imatrix.chunk_size": ("uint32", 512)}
    keys.update(kv or {})
    for k, v in keys.items():
        if v is not None:
            getattr(w, f"add_{v[0]}")(k, v[1])
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GOOD = {"blk.0.ffn_down.weight.in_sum2": np.full(8, 40.0, np.float32),
        "blk.0.ffn_down.weight.counts": np.array([10.0], np.float32)}


@pytest.mark.parametrize("tensors, kv, needle", [
    ({}, {"general.type": ("string", "model")}, "general.type"),
    ({}, {"imatrix.chunk_count": None}, "imatrix.chunk_count"),
    ({}, {"imatrix.chunk_size": ("string", "512")}, "imatrix.chunk_size"),
    ({}, {"imatrix.datasets": ("uint32", 3)}, "imatrix.datasets"),
    ({"blk.0.ffn_down.weight.in_sum2": np.full(8, 40.0, np.float16)}, {}, "expected F32"),
    ({"blk.0.ffn_down.weight.counts": None}, {}, "blk.0.ffn_down.weight.counts: missing"),
    ({"blk.0.ffn_up.weight": np.ones(8, np.float32)}, {}, "unexpected tensor"),
    ({"blk.0.ffn_down.weight.counts": np.array([np.nan], np.float32)}, {}, "token count"),
    ({"blk.0.ffn_down.weight.counts": np.array([-1.0], np.float32)}, {}, "token count"),
    ({"blk.0.ffn_down.weight.in_sum2": -np.ones(8, np.float32)}, {}, "finite, >= 0"),
    ({"blk.0.ffn_down_exps.weight.in_sum2": np.ones((2, 8), np.float32),
      "blk.0.ffn_down_exps.weight.counts": np.ones((3, 1), np.float32)}, {}, "per expert"),
    ({"blk.0.ffn_down_exps.weight.in_sum2": np.ones((2, 8), np.float32),
      "blk.0.ffn_down_exps.weight.counts": np.array([[4.0], [np.inf]], np.float32)}, {}, "token count"),
    ({"blk.0.ffn_down_exps.weight.in_sum2": np.array([np.ones(8), -np.ones(8)], np.float32),
      "blk.0.ffn_down_exps.weight.counts": np.ones((2, 1), np.float32)}, {}, "expert 1"),
], ids=["model-gguf", "no-chunk-count", "chunk-size-type", "datasets-type", "f16", "no-counts", "stray-tensor",
        "nan-count", "negative-count", "negative-sums", "expert-counts-shape", "expert-count-inf", "expert-sums"])
def test_hostile_gguf_imatrix_is_one_clear_error(tmp_path, tensors, kv, needle):
    p = tmp_path / "imatrix.gguf"
    _gguf_imatrix(p, {k: v for k, v in {**GOOD, **tensors}.items() if v is not None}, kv)
    with pytest.raises(FormatError, match=needle) as e:
        imatrix.read_any(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    # validate takes a GGUF whose general.type is not "imatrix" for a model, and checks it as one
    assert_one_line_error(run_tool("ieconv", "validate", p), str(p),
                          "llama.embedding_length" if needle == "general.type" else needle)


def test_gguf_imatrix_zero_count_means_ones(tmp_path):
    """llama-quantize's rule for a matrix no token reached."""
    p = tmp_path / "imatrix.gguf"
    _gguf_imatrix(p, {**GOOD, "blk.0.ffn_down.weight.counts": np.array([0.0], np.float32)})
    assert imatrix.read_any(p).entries["blk.0.ffn_down.weight"].tolist() == [1.0] * 8
    _gguf_imatrix(p, GOOD)
    assert imatrix.read_any(p).entries["blk.0.ffn_down.weight"].tolist() == [4.0] * 8


def test_a_file_that_is_no_imatrix_says_so(tmp_path):
    """--imatrix README.md was read as a legacy .dat: 'entry count: 1701388323'."""
    p = tmp_path / "README.md"
    p.write_text("# iekit\n\nConvert and run models.\n")
    with pytest.raises(FormatError, match="not an importance matrix"):
        imatrix.read_any(p)
