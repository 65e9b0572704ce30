"""The IEBIN schema2 validator, one test per rule, plus `ieconv iebin-upgrade`.

Every bad input starts from a fresh, valid artifact converted from the golden
tiny-llama checkpoint and breaks exactly one rule, so a test fails if the rule
is not enforced, or if it is reported against the wrong file or field.
The error contract: ``str(FormatError) == "FILE: FIELD: message"``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest

from conftest import run_tool
from iekit.convert.hf_to_iebin import convert
from iekit.formats import checksums
from iekit.formats.errors import FormatError
from iekit.formats.hf_checkpoint import from_dir
from iekit.formats.iebin import BIN_NAME, META_NAME, TENSOR_KEYS, load_model, validate_meta
from iekit.formats.paths import resolve_inside
from iekit.formats.safetensors_reader import SafetensorsFile

REPO = Path(__file__).resolve().parent.parent
GOLDEN_LLAMA = REPO / "golden" / "hf" / "tiny-llama"
SCHEMA_FILE = REPO / "schemas" / "iebin.schema.json"
IECONV = Path(sys.executable).with_name("ieconv")
EMPTY_DIGEST = checksums.digest(checksums.DEFAULT, b"")

I = 3  # the tensor most tests break: model.layers.0.mlp.down_proj.weight, f32 [64, 128]


# --------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iebin-base") / "art"
    convert(from_dir(GOLDEN_LLAMA), out)
    return out


@pytest.fixture
def art(base_artifact, tmp_path) -> Path:
    """A fresh, valid, private copy of the converted artifact."""
    d = tmp_path / "art"
    shutil.copytree(base_artifact, d)
    return d


@pytest.fixture(scope="module", params=checksums.NAMES)
def base_artifact_by(request, tmp_path_factory) -> tuple[Path, checksums.Algorithm]:
    out = tmp_path_factory.mktemp(f"iebin-{request.param}") / "art"
    convert(from_dir(GOLDEN_LLAMA), out, checksum=request.param)
    return out, checksums.ALGORITHMS[request.param]


@pytest.fixture
def art_by(base_artifact_by, tmp_path) -> tuple[Path, checksums.Algorithm]:
    """A private copy of the artifact written with each checksum algorithm, and the algorithm."""
    d = tmp_path / "art"
    shutil.copytree(base_artifact_by[0], d)
    return d, base_artifact_by[1]


def read_meta(d: Path) -> dict[str, Any]:
    return json.loads((d / META_NAME).read_text())


def write_meta(d: Path, meta: Any) -> None:
    (d / META_NAME).write_text(json.dumps(meta, indent=1))


def edit(d: Path, fn: Callable[[dict], Any]) -> None:
    m = read_meta(d)
    fn(m)
    write_meta(d, m)


def set_tensor(i: int, **kv) -> Callable[[dict], None]:
    return lambda m: m["tensors"][i].update(kv)


def tindex(d: Path, name: str) -> int:
    return [t["name"] for t in read_meta(d)["tensors"]].index(name)


def expect_error(d: Path | str, field: str, *words: str, deep: bool = False, file: str | Path | None = None) -> FormatError:
    """load_model must raise FormatError for exactly FILE and FIELD, and the
    message must contain every one of ``words``."""
    file = os.fspath(file if file is not None else Path(d) / META_NAME)
    with pytest.raises(FormatError) as ei:
        load_model(d, deep=deep)
    e = ei.value
    s = str(e)
    assert (e.file, e.field) == (file, field), s
    assert s.startswith(f"{file}: {field}: "), s
    for w in words:
        assert w in e.message, (w, s)
    assert "\n" not in s
    return e


def run_ieconv(*args: str) -> subprocess.CompletedProcess:
    assert IECONV.is_file(), f"console script not installed at {IECONV}"
    env = dict(os.environ)
    env.pop("IE_DEBUG", None)
    env.pop("COLUMNS", None)  # what rich sees when output is piped
    return run_tool("ieconv", *args, env=env, timeout=120)


def assert_cli_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --------------------------------------------------------------------------
# the baseline really is valid (so every failure below is the mutation's)
# --------------------------------------------------------------------------


def test_valid_artifact_loads_deep(art):
    m = load_model(art, deep=True)
    assert len(m.tensors) == 21
    assert m.tensors[I]["name"] == "model.layers.0.mlp.down_proj.weight"
    assert m.tensors[I]["shape"] == [64, 128] and m.tensors[I]["dtype"] == "f32"
    # load_model also accepts the model.ie.json path itself
    assert load_model(art / META_NAME).meta == m.meta


# --------------------------------------------------------------------------
# top level
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["gguf", "IEBIN", "", None, 1])
def test_unknown_format(art, value):
    edit(art, lambda m: m.update(format=value))
    expect_error(art, "format", "unknown format", repr(value))


@pytest.mark.parametrize("value", [3, 1, 0, "2", True, 2.0, None, [2]])
def test_unsupported_version(art, value):
    edit(art, lambda m: m.update(version=value))
    expect_error(art, "version", "unsupported version", repr(value))


@pytest.mark.parametrize("value", ["md5", "SHA256", None])
def test_unsupported_checksum_algorithm(art, value):
    edit(art, lambda m: m.update(checksum=value))
    expect_error(art, "checksum", "unsupported checksum", repr(value))


_SPECIFIC = {
    "format": ("format", "unknown format"),
    "version": ("version", "unsupported version"),
    "alignment": ("alignment", "power of two"),
    "checksum": ("checksum", "unsupported checksum"),
    "tensors": ("tensors", "missing or not a list"),
}
TOP_KEYS = ["format", "version", "alignment", "checksum", "producer", "model", "config",
            "tokenizer", "source", "aux_files", "files", "tensors"]


@pytest.mark.parametrize("key", TOP_KEYS)
def test_missing_top_level_key(art, key):
    edit(art, lambda m: m.pop(key))
    field, word = _SPECIFIC.get(key, ("(root)", f'"{key}" is a required property'))
    expect_error(art, field, word)


def test_unknown_top_level_key(art):
    edit(art, lambda m: m.update(shards=[]))
    expect_error(art, "(root)", "'shards'", "Additional properties")


@pytest.mark.parametrize("value", ["[]", "\"iebin\"", "null", "2"])
def test_root_not_an_object(art, value):
    (art / META_NAME).write_text(value)
    expect_error(art, "(root)", "JSON object")


@pytest.mark.parametrize("value", [0, 3, 48, 96, -64, 2 ** 21, True, "64", 64.0, None])
def test_alignment_not_a_power_of_two(art, value):
    edit(art, lambda m: m.update(alignment=value))
    expect_error(art, "alignment", "power of two", repr(value))


@pytest.mark.parametrize("value", [1, 32, 64, 128])
def test_alignment_that_every_offset_honours_is_valid(art, value):
    # control for the alignment rules: all tiny-llama offsets are multiples of 256
    edit(art, lambda m: m.update(alignment=value))
    assert load_model(art).meta["alignment"] == value


# --------------------------------------------------------------------------
# tensor entries: keys
# --------------------------------------------------------------------------


@pytest.mark.parametrize("key", TENSOR_KEYS)
def test_missing_tensor_key(art, key):
    edit(art, lambda m: m["tensors"][I].pop(key))
    expect_error(art, f"tensors[{I}]", f"missing key {key!r}")


def test_tensor_entry_not_an_object(art):
    edit(art, lambda m: m["tensors"].__setitem__(I, ["name", "x"]))
    expect_error(art, f"tensors[{I}]", "not an object")


def test_unknown_tensor_key(art):
    edit(art, set_tensor(I, layout="row_major"))
    expect_error(art, f"tensors[{I}].layout", "unknown key 'layout'")


@pytest.mark.parametrize("mutate, key", [
    (lambda t: t.update(shard=t["file"]), "shard"),
    (lambda t: t.update(shard_data_offset=t["file_data_offset"]), "shard_data_offset"),
    # a whole legacy entry: the first legacy key is reported, not the missing schema2 keys
    (lambda t: t.update(shard=t.pop("file"), shard_data_offset=t.pop("file_data_offset")), "shard"),
])
def test_legacy_tensor_keys_point_to_iebin_upgrade(art, mutate, key):
    edit(art, lambda m: mutate(m["tensors"][I]))
    expect_error(art, f"tensors[{I}].{key}", "legacy", "ieconv iebin-upgrade")


# --------------------------------------------------------------------------
# name, dtype, shape, nbytes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", None, 7])
def test_tensor_name_must_be_non_empty_string(art, value):
    edit(art, set_tensor(I, name=value))
    expect_error(art, f"tensors[{I}].name", "non-empty string")


def test_duplicate_tensor_names(art):
    edit(art, lambda m: m["tensors"][I + 1].update(name=m["tensors"][I]["name"]))
    expect_error(art, f"tensors[{I + 1}].name", "duplicate", "model.layers.0.mlp.down_proj.weight", f"tensors[{I}]")


@pytest.mark.parametrize("value", ["F32", "Bf16", "BOOL", "I8"])
def test_dtype_must_be_lowercase(art, value):
    edit(art, set_tensor(I, dtype=value))
    expect_error(art, f"tensors[{I}].dtype", "lowercase", repr(value.lower()))


@pytest.mark.parametrize("value", ["f8", "float32", "q7_k", "f32 ", ""])
def test_unknown_dtype(art, value):
    edit(art, set_tensor(I, dtype=value))
    expect_error(art, f"tensors[{I}].dtype", "unknown dtype", repr(value))


@pytest.mark.parametrize("value", [None, 32, ["f32"]])
def test_dtype_not_a_string(art, value):
    edit(art, set_tensor(I, dtype=value))
    expect_error(art, f"tensors[{I}].dtype", "must be a string")


@pytest.mark.parametrize("shape, j, word", [
    ([-64, 128], 0, "negative"),
    ([64, -1], 1, "negative"),
    ([64, 128.0], 1, "not an integer"),
    ([2.0, 128], 0, "not an integer"),
    ([True, 128], 0, "not an integer"),
    ([64, False], 1, "not an integer"),
    (["64", 128], 0, "not an integer"),
    ([64, None], 1, "not an integer"),
])
def test_bad_shape_dimension(art, shape, j, word):
    edit(art, set_tensor(I, shape=shape))
    expect_error(art, f"tensors[{I}].shape[{j}]", word)


@pytest.mark.parametrize("value", ["64x128", 8192, None, {"0": 64}])
def test_shape_not_a_list(art, value):
    edit(art, set_tensor(I, shape=value))
    expect_error(art, f"tensors[{I}].shape", "must be a list")


@pytest.mark.parametrize("shape", [[2 ** 40, 2 ** 40], [2 ** 61], [2 ** 64], [2, 2, 2 ** 62]])
def test_shape_byte_size_overflows_64_bits(art, shape):
    edit(art, set_tensor(I, shape=shape))
    expect_error(art, f"tensors[{I}].shape", "overflows 64 bits")


def test_shape_just_below_64_bit_overflow_is_an_nbytes_error(art):
    # (2**61 - 1) * 4 bytes fits in int64: the overflow check must not fire
    edit(art, set_tensor(I, shape=[2 ** 61 - 1]))
    expect_error(art, f"tensors[{I}].nbytes", "disagrees")


@pytest.mark.parametrize("delta", [4, -4, 1, 32768])
def test_nbytes_disagrees_with_shape_and_dtype(art, delta):
    edit(art, set_tensor(I, nbytes=32768 + delta))
    expect_error(art, f"tensors[{I}].nbytes", "disagrees", "32768")


def test_nbytes_disagrees_after_dtype_change(art):
    edit(art, set_tensor(I, dtype="f16"))  # same bytes, half the itemsize
    expect_error(art, f"tensors[{I}].nbytes", "disagrees", "16384")


@pytest.mark.parametrize("value", [-1, -32768, "32768", 32768.0, True, None])
def test_nbytes_not_a_non_negative_integer(art, value):
    edit(art, set_tensor(I, nbytes=value))
    expect_error(art, f"tensors[{I}].nbytes", "non-negative integer")


# --------------------------------------------------------------------------
# offsets, ranges, overlaps
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-64, -1, "164096", 164096.0, None, False])
def test_offset_not_a_non_negative_integer(art, value):
    edit(art, set_tensor(I, file_data_offset=value))
    expect_error(art, f"tensors[{I}].file_data_offset", "non-negative integer")


@pytest.mark.parametrize("delta", [1, 8, 32, 63])
def test_offset_not_a_multiple_of_alignment(art, delta):
    edit(art, lambda m: m["tensors"][I].update(file_data_offset=m["tensors"][I]["file_data_offset"] + delta))
    expect_error(art, f"tensors[{I}].file_data_offset", "not a multiple of alignment 64")


def test_offset_plus_nbytes_overflows_64_bits(art):
    edit(art, set_tensor(I, file_data_offset=(2 ** 63) - 64))
    expect_error(art, f"tensors[{I}].file_data_offset", "overflows 64 bits")


def test_tensor_runs_past_end_of_file(art):
    last = tindex(art, "model.norm.weight")  # ends exactly at the end of model.ie.bin
    edit(art, lambda m: m["tensors"][last].update(file_data_offset=m["tensors"][last]["file_data_offset"] + 64))
    expect_error(art, f"tensors[{last}].file_data_offset", "past the end", BIN_NAME)


def test_tensor_starting_at_end_of_file_runs_past_it(art):
    size = (art / BIN_NAME).stat().st_size
    edit(art, set_tensor(I, file_data_offset=size))
    expect_error(art, f"tensors[{I}].file_data_offset", "past the end")


def test_tensors_with_the_same_offset_overlap(art):
    # tensors[4] (f32 [128, 64]) has the same byte size as tensors[3]
    edit(art, lambda m: m["tensors"][I + 1].update(file_data_offset=m["tensors"][I]["file_data_offset"]))
    expect_error(art, f"tensors[{I + 1}].file_data_offset", "overlaps", "model.layers.0.mlp.down_proj.weight")


def test_tensors_partially_overlap(art):
    edit(art, lambda m: m["tensors"][I + 1].update(file_data_offset=m["tensors"][I]["file_data_offset"] + 64))
    expect_error(art, f"tensors[{I + 1}].file_data_offset", "overlaps", "model.layers.0.mlp.down_proj.weight")


def _empty(name: str, offset: int) -> dict:
    return {"name": name, "dtype": "f32", "shape": [0], "file": BIN_NAME, "file_data_offset": offset,
            "nbytes": 0, checksums.DEFAULT: EMPTY_DIGEST}


def test_zero_size_tensor_inside_another_tensor_overlaps(art):
    edit(art, lambda m: m["tensors"].append(_empty("empty", m["tensors"][I]["file_data_offset"] + 64)))
    expect_error(art, "tensors[21].file_data_offset", "overlaps", "'empty'", "model.layers.0.mlp.down_proj.weight")


def test_zero_size_tensor_at_another_tensors_start_overlaps(art):
    edit(art, lambda m: m["tensors"].append(_empty("empty", m["tensors"][I]["file_data_offset"])))
    e = expect_error(art, "tensors[3].file_data_offset", "overlaps", "'empty'")
    assert "down_proj" in e.message


def test_zero_size_tensor_at_end_of_file_is_valid(art):
    # control for the zero-size rules: a zero-size tensor may sit right at EOF
    size = (art / BIN_NAME).stat().st_size
    edit(art, lambda m: m["tensors"].append(_empty("empty", size)))
    assert load_model(art, deep=True).tensor("empty")["nbytes"] == 0


def test_two_zero_size_tensors_at_one_offset_overlap(art):
    size = (art / BIN_NAME).stat().st_size
    edit(art, lambda m: m["tensors"].extend([_empty("empty_a", size), _empty("empty_b", size)]))
    expect_error(art, "tensors[22].file_data_offset", "overlaps", "'empty_a'", "'empty_b'")


def test_zero_size_tensor_past_end_of_file(art):
    size = (art / BIN_NAME).stat().st_size
    edit(art, lambda m: m["tensors"].append(_empty("empty", size + 64)))
    expect_error(art, "tensors[21].file_data_offset", "past the end")


def test_overlap_through_an_aliased_file_name(art):
    def alias(m):
        m["files"].append({"name": "./" + BIN_NAME, "nbytes": m["files"][0]["nbytes"]})
        m["tensors"][I + 1].update(file="./" + BIN_NAME, file_data_offset=m["tensors"][I]["file_data_offset"])
    edit(art, alias)
    with pytest.raises(FormatError, match="overlap|listed twice|alias"):
        load_model(art)


# --------------------------------------------------------------------------
# file references
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["/etc/passwd", "../art/model.ie.bin", "sub/../model.ie.bin", "..",
                                   "sub\\model.ie.bin", "C:\\model.ie.bin"])
def test_tensor_file_escaping_the_directory(art, value):
    edit(art, set_tensor(I, file=value))
    expect_error(art, f"tensors[{I}].file", repr(value))


@pytest.mark.parametrize("value", ["/etc/passwd", "../model.ie.bin", "a\\b"])
def test_files_name_escaping_the_directory(art, value):
    edit(art, lambda m: m["files"][0].update(name=value))
    expect_error(art, "files[0].name", repr(value))


@pytest.mark.parametrize("value", ["/etc/passwd", "../config.json", "a\\b"])
def test_aux_file_name_escaping_the_directory(art, value):
    edit(art, lambda m: m["aux_files"][0].update(name=value))
    expect_error(art, "aux_files[0].name", repr(value))


@pytest.mark.parametrize("value, word", [
    ("/etc/passwd", "absolute"),
    ("sub/../model.ie.bin", "'..'"),
    ("sub\\model.ie.bin", "backslash"),
])
def test_resolve_inside_messages(tmp_path, value, word):
    with pytest.raises(FormatError) as ei:
        resolve_inside(tmp_path, value, "meta.json", "tensors[0].file")
    assert str(ei.value).startswith("meta.json: tensors[0].file: ")
    assert word in ei.value.message


@pytest.mark.parametrize("value, word", [
    ("/etc/passwd", "absolute"),
    ("sub/../model.ie.bin", "'..'"),
    ("sub\\model.ie.bin", "backslash"),
])
def test_load_model_explains_escaping_paths(art, value, word):
    edit(art, set_tensor(I, file=value))
    expect_error(art, f"tensors[{I}].file", word)


@pytest.fixture
def outside_file(tmp_path_factory, base_artifact) -> Path:
    """A copy of model.ie.bin in a directory unrelated to the artifact."""
    p = tmp_path_factory.mktemp("outside") / "secret.bin"
    shutil.copyfile(base_artifact / BIN_NAME, p)
    return p


def test_symlinked_bin_pointing_outside(art, outside_file):
    (art / BIN_NAME).unlink()
    os.symlink(outside_file, art / BIN_NAME)
    expect_error(art, "files[0].name", "outside the model directory")


def test_listed_symlink_pointing_outside(art, outside_file):
    os.symlink(outside_file, art / "evil.bin")

    def point(m):
        m["files"].append({"name": "evil.bin", "nbytes": outside_file.stat().st_size})
        m["tensors"][I]["file"] = "evil.bin"
    edit(art, point)
    expect_error(art, "files[1].name", "outside the model directory", "evil.bin")


def test_unlisted_symlink_pointing_outside(art, outside_file):
    os.symlink(outside_file, art / "evil.bin")
    edit(art, set_tensor(I, file="evil.bin"))
    expect_error(art, f"tensors[{I}].file", "outside the model directory")


def test_symlinked_aux_file_pointing_outside(art, tmp_path_factory):
    secret = tmp_path_factory.mktemp("outside") / "config.json"
    shutil.copyfile(art / "config.json", secret)
    (art / "config.json").unlink()
    os.symlink(secret, art / "config.json")
    field = f"aux_files[{[a['name'] for a in read_meta(art)['aux_files']].index('config.json')}].name"
    expect_error(art, field, "outside the model directory")


@pytest.mark.parametrize("value", ["config.json", "other.bin", "model.ie.json"])
def test_tensor_file_not_listed_in_files(art, value):
    edit(art, set_tensor(I, file=value))
    expect_error(art, f"tensors[{I}].file", "not listed in files", repr(value))


def test_listed_file_missing(art):
    edit(art, lambda m: m["files"].append({"name": "missing.bin", "nbytes": 0}))
    expect_error(art, "files[1].name", "does not exist")


def test_file_listed_twice(art):
    edit(art, lambda m: m["files"].append(dict(m["files"][0])))
    expect_error(art, "files[1].name", "listed twice")


def test_truncated_bin_names_the_bin(art):
    binp = art / BIN_NAME
    size = binp.stat().st_size
    os.truncate(binp, size - 1)
    e = expect_error(art, "(size)", "truncated", str(size - 1), str(size), file=os.path.realpath(binp))
    assert str(e).startswith(f"{os.path.realpath(binp)}: (size): ")


def test_bin_with_extra_bytes(art):
    with open(art / BIN_NAME, "ab") as f:
        f.write(b"\0" * 64)
    expect_error(art, "(size)", "files[0].nbytes", file=os.path.realpath(art / BIN_NAME))


def test_truncated_bin_with_matching_files_nbytes(art):
    # the files[] record agrees with the truncated file, but the last tensor no longer fits
    binp = art / BIN_NAME
    size = binp.stat().st_size
    os.truncate(binp, size - 1)
    edit(art, lambda m: m["files"][0].update(nbytes=size - 1))
    expect_error(art, f"tensors[{tindex(art, 'model.norm.weight')}].file_data_offset", "past the end")


def test_aux_file_size_mismatch_without_deep(art):
    cfg = art / "config.json"
    cfg.write_bytes(cfg.read_bytes() + b" ")
    expect_error(art, "(size)", "aux_files", file=os.path.realpath(cfg))


def test_aux_file_missing(art):
    (art / "tokenizer.json").unlink()
    i = [a["name"] for a in read_meta(art)["aux_files"]].index("tokenizer.json")
    expect_error(art, f"aux_files[{i}].name", "does not exist")


# --------------------------------------------------------------------------
# checksums
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["A", "a-1", "a+1", "g", "", None, 0, "upper"])
def test_bad_digest_string(art_by, value):
    art, alg = art_by
    n = alg.hex_digits
    value = {"A": "A" * n, "a-1": "a" * (n - 1), "a+1": "a" * (n + 1), "g": "g" * n,
             "upper": checksums.digest(alg.name, b"").upper()}.get(value, value)
    edit(art, set_tensor(I, **{alg.name: value}))
    expect_error(art, f"tensors[{I}].{alg.name}", f"{n} lowercase hex")


def test_a_digest_of_another_algorithm_is_refused(art_by):
    """A record hashed otherwise than the file's ``checksum`` says would go unchecked."""
    art, alg = art_by
    other = next(a for a in checksums.NAMES if a != alg.name)

    def swap(m):
        t = m["tensors"][I]
        del t[alg.name]
        t[other] = checksums.digest(other, b"")
    edit(art, swap)
    expect_error(art, f"tensors[{I}].{other}", f"in a file whose checksum is {alg.name!r}")
    edit(art, lambda m: m.update(checksum="md5"))
    expect_error(art, "checksum", "unsupported checksum algorithm 'md5'", "xxh3_128, sha256")


def test_aux_and_source_records_follow_the_checksum(art_by):
    art, alg = art_by
    meta = read_meta(art)
    assert meta["checksum"] == alg.name
    for rec in meta["aux_files"] + meta["source"]["shards"]:
        assert set(rec) == {"name", "nbytes", alg.name}
        path = (art / rec["name"]) if rec in meta["aux_files"] else GOLDEN_LLAMA / rec["name"]
        assert rec[alg.name] == checksums.digest(alg.name, path.read_bytes())
    edit(art, lambda m: m["source"]["shards"][0].update({alg.name: "x"}))
    expect_error(art, f"source.shards[0].{alg.name}", "lowercase hex")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_payload_checksum_mismatch_needs_deep(art_by, where):
    art, alg = art_by
    t = read_meta(art)["tensors"][I]
    pos = {"first": 0, "middle": t["nbytes"] // 2, "last": t["nbytes"] - 1}[where]
    _flip(art / BIN_NAME, t["file_data_offset"] + pos)
    load_model(art, deep=False)  # the shallow check cannot see payload bytes
    expect_error(art, f"tensors[{I}].{alg.name}", "checksum mismatch", deep=True)


def test_aux_checksum_mismatch_needs_deep(art_by):
    art, alg = art_by
    cfg = art / "config.json"
    data = bytearray(cfg.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, different bytes
    cfg.write_bytes(bytes(data))
    i = [a["name"] for a in read_meta(art)["aux_files"]].index("config.json")
    load_model(art, deep=False)
    expect_error(art, f"aux_files[{i}].{alg.name}", "checksum mismatch", deep=True)


# --------------------------------------------------------------------------
# the JSON text itself
# --------------------------------------------------------------------------


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("mutate, words", [
    (lambda s: s[: len(s) // 2], ["invalid JSON"]),
    (lambda s: s.rstrip().rstrip("}"), ["invalid JSON"]),
    (lambda s: s.replace("{", "{,", 1), ["invalid JSON"]),
    (lambda s: "\ufeff" + s, ["invalid JSON"]),
    (lambda s: "", ["invalid JSON"]),
    (lambda s: _replace_once(s, '"version": 2', '"version": 2, "version": 2'), ["duplicate key 'version'"]),
    (lambda s: _replace_once(s, '"name": "model.layers.0.mlp.down_proj.weight"',
                             '"name": "x", "name": "model.layers.0.mlp.down_proj.weight"'), ["duplicate key 'name'"]),
    (lambda s: _replace_once(s, '"vocab_size": 320', '"vocab_size": NaN'), ["NaN"]),
    (lambda s: _replace_once(s, '"vocab_size": 320', '"vocab_size": Infinity'), ["Infinity"]),
    (lambda s: _replace_once(s, '"vocab_size": 320', '"vocab_size": -Infinity'), ["Infinity"]),
])
def test_invalid_json_text(art, mutate, words):
    p = art / META_NAME
    p.write_text(mutate(p.read_text()), encoding="utf-8")
    expect_error(art, "(file)", *words)


def test_nan_written_by_json_dumps_is_rejected(art):
    edit(art, lambda m: m["config"].update(note=float("nan")))  # json.dumps writes the NaN literal
    assert b"NaN" in (art / META_NAME).read_bytes()
    expect_error(art, "(file)", "NaN")


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xe9t\xe9", b"\xed\xa0\x80"])
def test_meta_not_utf8(art, bad):
    p = art / META_NAME
    data = p.read_bytes()
    assert b'"producer": "ieconv"' in data
    p.write_bytes(data.replace(b'"producer": "ieconv"', b'"producer": "ieconv' + bad + b'"', 1))
    expect_error(art, "(file)", "UTF-8")


def test_meta_missing(art):
    (art / META_NAME).unlink()
    expect_error(art, "(file)", "no such file")


def test_meta_path_is_a_directory(art):
    (art / META_NAME).unlink()
    (art / META_NAME).mkdir()
    expect_error(art, "(file)", "is a directory")


def test_model_path_missing(tmp_path):
    expect_error(tmp_path / "nope", "(file)", "no such file", file=tmp_path / "nope")


# --------------------------------------------------------------------------
# the command line contract: `ieconv validate`
# --------------------------------------------------------------------------


def _cli_cases() -> list:
    def dtype(d):
        edit(d, set_tensor(I, dtype="f8"))

    def truncate(d):
        os.truncate(d / BIN_NAME, (d / BIN_NAME).stat().st_size - 1)

    def bad_json(d):
        (d / META_NAME).write_text("{")

    def missing(d):
        (d / META_NAME).unlink()

    def escape(d):
        edit(d, set_tensor(I, file="/etc/passwd"))

    def nan(d):
        edit(d, lambda m: m["config"].update(x=float("inf")))

    return [
        pytest.param(dtype, [], [f"tensors[{I}].dtype", "unknown dtype"], id="unknown-dtype"),
        pytest.param(truncate, [], [BIN_NAME, "(size)"], id="truncated-bin"),
        pytest.param(bad_json, [], [META_NAME, "(file)", "invalid JSON"], id="invalid-json"),
        pytest.param(missing, [], [META_NAME, "no such file"], id="missing-meta"),
        pytest.param(escape, [], [f"tensors[{I}].file", "/etc/passwd"], id="absolute-path"),
        pytest.param(nan, ["--deep"], ["(file)", "Infinity"], id="infinity-literal"),
    ]


@pytest.mark.parametrize("break_it, flags, needles", _cli_cases())
def test_cli_validate_reports_one_line(art, break_it, flags, needles):
    break_it(art)
    res = run_ieconv("validate", *flags, art)
    assert_cli_error(res, *needles)
    assert res.stdout == ""


def test_cli_validate_checksum_mismatch_only_with_deep(art):
    t = read_meta(art)["tensors"][I]
    _flip(art / BIN_NAME, t["file_data_offset"] + 5)
    ok = run_ieconv("validate", art)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK ") and ok.stderr == ""
    assert_cli_error(run_ieconv("validate", "--deep", art), f"tensors[{I}].{checksums.DEFAULT}", "checksum mismatch")


def test_cli_validate_valid_artifact(art):
    res = run_ieconv("validate", "--deep", art / META_NAME)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    out = " ".join(res.stdout.split())
    assert out.startswith("OK ") and "21 tensors" in out and "checksums verified" in out


def test_cli_validate_ok_is_one_line_for_long_paths(art, tmp_path):
    deep_dir = tmp_path / ("d" * 120) / ("e" * 120)
    shutil.copytree(art, deep_dir)
    res = run_ieconv("validate", deep_dir)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 1, res.stdout


@pytest.mark.parametrize("text", [
    '{"format": "iebin", "version": ' + "9" * 5000 + "}",
    "[" * 100_000 + "]" * 100_000,
], ids=["5000-digit-int", "deep-nesting"])
def test_cli_validate_hostile_json_is_a_format_error(art, text):
    (art / META_NAME).write_text(text)
    assert_cli_error(run_ieconv("validate", art), META_NAME, "(file)")


# --------------------------------------------------------------------------
# the JSON Schema and the code agree
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema_validator():
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_valid_artifact_satisfies_json_schema(art, schema_validator):
    meta = read_meta(art)
    errors = list(schema_validator.iter_errors(meta))
    assert errors == [], [e.message for e in errors]
    validate_meta(meta, "m.json")


def test_gguf_import_satisfies_json_schema(schema_validator):
    """source.kind "gguf" and its source.gguf object (golden/gguf); an unknown key there is not."""
    meta = read_meta(REPO / "golden" / "gguf" / "tiny-llama-mixed")
    assert meta["source"]["kind"] == "gguf"
    assert list(schema_validator.iter_errors(meta)) == []
    meta["source"]["gguf"]["quantizer"] = "x"
    assert list(schema_validator.iter_errors(meta)) != []


def _m_dtype(m):
    m["tensors"][I]["dtype"] = "f8"


def _m_dtype_upper(m):
    m["tensors"][I]["dtype"] = "F32"


def _m_neg_dim(m):
    m["tensors"][I]["shape"] = [-64, 128]


def _m_float_dim(m):
    m["tensors"][I]["shape"] = [64, 128.5]


def _m_bool_dim(m):
    m["tensors"][I]["shape"] = [True, 128]


def _m_extra_tensor_key(m):
    m["tensors"][I]["layout"] = "row_major"


def _m_legacy_key(m):
    m["tensors"][I]["shard"] = BIN_NAME


def _m_extra_top_key(m):
    m["shards"] = []


def _m_abs_path(m):
    m["tensors"][I]["file"] = "/etc/passwd"


def _m_dotdot(m):
    m["tensors"][I]["file"] = "../model.ie.bin"


def _m_backslash(m):
    m["files"][0]["name"] = "a\\model.ie.bin"


def _m_version(m):
    m["version"] = "2"


def _m_alignment(m):
    m["alignment"] = 48


def _m_sha(m):
    m["tensors"][I][checksums.DEFAULT] = "A" * 32


def _m_neg_nbytes(m):
    m["tensors"][I]["nbytes"] = -1


def _m_neg_offset(m):
    m["tensors"][I]["file_data_offset"] = -64


def _m_missing_key(m):
    del m["tensors"][I][checksums.DEFAULT]


@pytest.mark.parametrize("mutate", [_m_dtype, _m_dtype_upper, _m_neg_dim, _m_float_dim, _m_bool_dim,
                                    _m_extra_tensor_key, _m_legacy_key, _m_extra_top_key, _m_abs_path,
                                    _m_dotdot, _m_backslash, _m_version, _m_alignment, _m_sha,
                                    _m_neg_nbytes, _m_neg_offset, _m_missing_key],
                         ids=lambda f: f.__name__[3:])
def test_json_schema_alone_rejects_what_the_code_rejects(art, schema_validator, mutate):
    meta = read_meta(art)
    mutate(meta)
    assert list(schema_validator.iter_errors(meta)), "the JSON schema accepts a meta the validator rejects"
    with pytest.raises(FormatError):
        validate_meta(meta, "m.json")


def test_json_schema_and_code_accept_valid_variants(art, schema_validator):
    # controls: what the code accepts, the schema must accept too
    meta = read_meta(art)
    size = meta["files"][0]["nbytes"]
    meta["alignment"] = 32
    meta["tensors"].append(_empty("empty", size))
    meta["tensors"].append({**_empty("empty_3d", size + 64), "shape": [3, 0, 5]})
    assert list(schema_validator.iter_errors(meta)) == []
    validate_meta(meta, "m.json")


# --------------------------------------------------------------------------
# `ieconv iebin-upgrade`
# --------------------------------------------------------------------------

LEGACY = "legacy.ie.json"


@pytest.fixture
def legacy_dir(tmp_path) -> tuple[Path, list[dict]]:
    """Golden shards copied next to a legacy (pre-schema2) metadata file that
    points into them with absolute offsets and uppercase dtypes."""
    d = tmp_path / "legacy"
    d.mkdir()
    entries = []
    for shard in sorted(GOLDEN_LLAMA.glob("*.safetensors")):
        shutil.copyfile(shard, d / shard.name)
        with SafetensorsFile(d / shard.name) as sf:
            for t in sf.tensors.values():
                entries.append({"name": t.name, "dtype": t.dtype.safetensors, "shape": list(t.shape),
                                "shard": shard.name, "shard_data_offset": t.start})
    assert len(entries) == 21 and all(e["dtype"] == "F32" for e in entries)
    (d / LEGACY).write_text(json.dumps({"format": "iebin", "version": 1, "tensors": entries}, indent=1))
    return d, entries


def test_iebin_upgrade_in_place(legacy_dir):
    from safetensors import safe_open

    d, entries = legacy_dir
    orig = (d / LEGACY).read_bytes()
    res = run_ieconv("iebin-upgrade", d / LEGACY)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "OK" in res.stdout

    assert (d / (LEGACY + ".bak")).read_bytes() == orig
    m = load_model(d / LEGACY, deep=True)
    meta = m.meta
    assert meta["version"] == 2 and meta["format"] == "iebin" and meta["source"]["kind"] == "legacy"
    assert [t["name"] for t in meta["tensors"]] == [e["name"] for e in entries]
    assert all(t["dtype"] == "f32" for t in meta["tensors"])
    assert sorted(f["name"] for f in meta["files"]) == sorted(p.name for p in GOLDEN_LLAMA.glob("*.safetensors"))
    for f in meta["files"]:
        assert f["nbytes"] == (d / f["name"]).stat().st_size

    # checksums: of the bytes the legacy entries point at, and of the values
    # the safetensors library itself decodes (independent of our reader)
    for e, t in zip(entries, meta["tensors"]):
        assert (t["file"], t["file_data_offset"], t["shape"]) == (e["shard"], e["shard_data_offset"], e["shape"])
        with open(d / e["shard"], "rb") as f:
            f.seek(e["shard_data_offset"])
            raw = f.read(t["nbytes"])
        assert len(raw) == t["nbytes"] == 4 * _prod(e["shape"])
        assert t[checksums.DEFAULT] == checksums.digest(checksums.DEFAULT, raw)
        with safe_open(d / e["shard"], "numpy") as sf:
            assert checksums.digest(checksums.DEFAULT, sf.get_tensor(e["name"]).tobytes()) == t[checksums.DEFAULT]

    # alignment: a power of two dividing every offset, and the largest such (<= 64)
    align = meta["alignment"]
    assert align & (align - 1) == 0
    assert all(t["file_data_offset"] % align == 0 for t in meta["tensors"])
    best = max(p for p in (1, 2, 4, 8, 16, 32, 64) if all(t["file_data_offset"] % p == 0 for t in meta["tensors"]))
    assert align == best


def _prod(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def test_iebin_upgrade_dict_form_long_dtypes_to_new_file(legacy_dir):
    d, entries = legacy_dir
    legacy = {"tensors": {e["name"]: {"dtype": "float32", "shape": e["shape"], "shard": e["shard"],
                                      "shard_data_offset": e["shard_data_offset"]} for e in entries}}
    (d / LEGACY).write_text(json.dumps(legacy))
    orig = (d / LEGACY).read_bytes()
    res = run_ieconv("iebin-upgrade", d / LEGACY, "-o", d / "model.ie.json")
    assert res.returncode == 0, res.stderr
    assert (d / LEGACY).read_bytes() == orig
    assert not (d / (LEGACY + ".bak")).exists()
    meta = load_model(d, deep=True).meta
    assert {t["name"] for t in meta["tensors"]} == {e["name"] for e in entries}
    assert {t["dtype"] for t in meta["tensors"]} == {"f32"}


def _legacy_case(d: Path, fn: Callable[[dict], None]) -> bytes:
    p = d / LEGACY
    legacy = json.loads(p.read_text())
    fn(legacy)
    p.write_text(json.dumps(legacy))
    return p.read_bytes()


@pytest.mark.parametrize("mutate, needles", [
    (lambda lg: lg["tensors"][0].update(dtype="FOO"), ["tensors[0].dtype", "unknown dtype", "FOO"]),
    (lambda lg: lg["tensors"][0].update(shard="../x"), ["tensors[0].file", "../x"]),
    (lambda lg: lg["tensors"][0].update(shard="/etc/passwd"), ["tensors[0].file", "/etc/passwd"]),
    (lambda lg: lg["tensors"][0].update(shard="nope.safetensors"), ["tensors[0].file", "does not exist"]),
    (lambda lg: lg["tensors"][0].update(shard_data_offset=10 ** 9), ["tensors[0].file_data_offset", "past the end"]),
    (lambda lg: lg["tensors"][0].update(shard_data_offset=-8), ["tensors[0].file_data_offset", "non-negative"]),
    (lambda lg: lg["tensors"][0].update(shape=[-1]), ["tensors[0].shape", "non-negative"]),
    (lambda lg: lg["tensors"][0].update(nbytes=3), ["tensors[0].nbytes", "disagrees"]),
    (lambda lg: lg.update(tensors="x"), ["tensors", "neither a list nor an object"]),
], ids=["unknown-dtype", "dotdot-shard", "absolute-shard", "missing-shard", "offset-past-end",
        "negative-offset", "negative-dim", "nbytes", "tensors-not-list"])
def test_iebin_upgrade_rejects_bad_legacy(legacy_dir, mutate, needles):
    d, _ = legacy_dir
    before = _legacy_case(d, mutate)
    res = run_ieconv("iebin-upgrade", d / LEGACY)
    assert_cli_error(res, LEGACY, *needles)
    assert (d / LEGACY).read_bytes() == before
    assert not (d / (LEGACY + ".bak")).exists()


def test_iebin_upgrade_rejects_past_end_on_last_shard_byte(legacy_dir):
    # off-by-one control: ending exactly at EOF is fine, one byte further is not
    d, entries = legacy_dir
    shard = entries[0]["shard"]
    size = (d / shard).stat().st_size
    for off, ok in ((size - 8, True), (size - 7, False)):
        t = {"name": "t", "dtype": "U8", "shape": [8], "shard": shard, "shard_data_offset": off}
        (d / LEGACY).write_text(json.dumps({"tensors": [t]}))
        res = run_ieconv("iebin-upgrade", "--no-backup", d / LEGACY)
        if ok:
            assert res.returncode == 0, res.stderr
            assert load_model(d / LEGACY, deep=True).tensors[0]["file_data_offset"] == off
        else:
            assert_cli_error(res, "tensors[0].file_data_offset", "past the end")


def test_iebin_upgrade_rejected_overlap_leaves_legacy_untouched(legacy_dir):
    d, _ = legacy_dir

    def overlap(lg):
        a, b = lg["tensors"][0], lg["tensors"][1]
        b.update(shard=a["shard"], shard_data_offset=a["shard_data_offset"], shape=a["shape"])
    before = _legacy_case(d, overlap)
    res = run_ieconv("iebin-upgrade", "--no-backup", d / LEGACY)
    assert res.returncode == 1
    assert "overlaps" in res.stderr
    assert (d / LEGACY).read_bytes() == before


# --------------------------------------------------------------------------
# quantized entries (dtype = scheme, with a `quant` object)
# --------------------------------------------------------------------------

MIXEDQ = REPO / "golden" / "iebin" / "tiny-llama-mixedq"


@pytest.fixture
def qart(tmp_path) -> tuple[Path, int]:
    """A private copy of the golden mixed-scheme artifact and the index of its first int4w tensor."""
    d = tmp_path / "q"
    shutil.copytree(MIXEDQ, d)
    i = next(i for i, t in enumerate(read_meta(d)["tensors"]) if t["dtype"] == "int4w")
    return d, i


@pytest.mark.parametrize("mutate,field,needle", [
    (lambda t: t.pop("quant"), "quant", "quant"),
    (lambda t: t.update(nbytes=t["nbytes"] - 64), "nbytes", "nbytes"),
    (lambda t: t["quant"].update(group_size=48), "group_size", "group_size"),
    (lambda t: t["quant"].update(scale_dtype="bf16"), "scale_dtype", "scale_dtype"),
    (lambda t: t["quant"].update(layout="blocked-k"), "layout", "layout"),
    (lambda t: t["quant"].update(scheme="q4_0"), "scheme", "scheme"),
], ids=["no-quant", "nbytes", "group-size", "scale-dtype", "layout", "scheme-mismatch"])
def test_quantized_entry_rules(qart, mutate, field, needle):
    d, i = qart
    edit(d, lambda m: mutate(m["tensors"][i]))
    assert_cli_error(run_ieconv("validate", d), META_NAME, f"tensors[{i}]", needle)


def test_float_entry_with_quant_object_is_rejected(qart):
    d, _ = qart
    j = next(j for j, t in enumerate(read_meta(d)["tensors"]) if t["dtype"] == "f32")
    edit(d, lambda m: m["tensors"][j].update(quant={"scheme": "int4w", "group_size": 32}))
    assert_cli_error(run_ieconv("validate", d), META_NAME, f"tensors[{j}]", "quant")


@pytest.mark.parametrize("mutate,field", [
    (lambda e: e.update(sq_error=-1.0), "quant_error.sq_error"),
    (lambda e: e.update(sq_norm="455.7"), "quant_error.sq_norm"),
    (lambda e: e.update(sq_error=True), "quant_error.sq_error"),
    (lambda e: e.update(sq_norm=None), "quant_error.sq_norm"),
    (lambda e: e.update(weighted=0), "quant_error.weighted"),
    (lambda e: e.pop("sq_norm"), "quant_error"),
    (lambda e: e.update(kl=0.1), "quant_error: Additional properties are not allowed ('kl'"),
    (lambda e: e.update(compensated=1), "quant_error.compensated"),
], ids=["negative", "string", "bool-as-number", "null", "int-as-bool", "missing", "unknown-key", "compensated-int"])
def test_quant_error_rules(qart, mutate, field):
    """The predicted-loss record of a quantized entry: its three keys (and an
    optional boolean "compensated"), sums that are numbers >= 0 (JSON itself
    has no NaN/Infinity to carry); the JSON Schema holds these rules, so the
    error line is its message, naming the field."""
    d, i = qart
    assert read_meta(d)["tensors"][i]["quant_error"]["weighted"] is False  # the golden conversion recorded one
    edit(d, lambda m: mutate(m["tensors"][i]["quant_error"]))
    assert_cli_error(run_ieconv("validate", d), META_NAME, f"tensors[{i}].{field}")


def test_quant_error_on_a_float_entry_or_not_an_object_is_rejected(qart, schema_validator):
    d, i = qart
    meta = read_meta(d)
    j = next(j for j, t in enumerate(meta["tensors"]) if t["dtype"] == "f32")
    meta["tensors"][j]["quant_error"] = meta["tensors"][i]["quant_error"]
    assert list(schema_validator.iter_errors(meta)) != []
    edit(d, lambda m: m["tensors"][j].update(quant_error={"weighted": False, "sq_error": 0.0, "sq_norm": 0.0}))
    assert_cli_error(run_ieconv("validate", d), META_NAME, f"tensors[{j}].quant_error", "unknown key")
    shutil.rmtree(d)
    shutil.copytree(MIXEDQ, d)
    edit(d, lambda m: m["tensors"][i].update(quant_error=[0.0, 0.0]))
    assert_cli_error(run_ieconv("validate", d), META_NAME, f"tensors[{i}].quant_error", "object")
    shutil.rmtree(d)
    shutil.copytree(MIXEDQ, d)
    edit(d, lambda m: m["tensors"][i].pop("quant_error"))  # optional: an artifact of an earlier ieconv
    assert run_ieconv("validate", d).returncode == 0
    rec = {"weighted": True, "sq_error": 0.5, "sq_norm": 2.0, "compensated": True}  # what ieconv gptq writes
    edit(d, lambda m: m["tensors"][i].update(quant_error=rec))
    assert run_ieconv("validate", d).returncode == 0
