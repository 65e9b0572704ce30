"""`ieconv dedup-pack`: a packed model directory (grouped tensors only in the
dedup store, entries with "store": "dedup") is smaller than the plain one,
validates (deep: every member rebuilt and hashed), runs with logits
bit-identical to the plain model's through the fused GEMV (cache 0) and the
store's cache alike, and refuses broken or missing stores with one line."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import run_tool
from nearcopy import nearcopy_llama
from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.errors import FormatError
from iekit.runtime.decoder import Decoder

IDS = "1,2,3,4,5,6,7,8,9,10,11,12"  # 12 > kMaxBatch: the prefill GEMM path too


def _env(**kw: str) -> dict[str, str]:
    return {**os.environ, **kw}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """(plain model, packed model) of the near-copy Llama."""
    t = tmp_path_factory.mktemp("pack")
    plain = nearcopy_llama(t)
    packed = t / "packed"
    res = run_tool("ieconv", "dedup-pack", "-q", "--json", "--model-dir", plain, "--out-dir", packed)
    assert res.returncode == 0, res.stderr
    return plain, packed


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=False)
    return dst


def test_packed_directory_is_smaller_and_entries_point_at_the_store(pair):
    plain, packed = pair
    pm, km = iebin.load_model(plain), iebin.load_model(packed)
    idx = fmt.load_index(packed)
    members = {m["name"] for _g, _j, _grp, m in idx.members()}
    assert {t["name"] for t in km.in_store} == members and len(members) == 14
    for t in km.in_store:
        assert t["store"] == "dedup" and "file" not in t and "file_data_offset" not in t
        assert t[km.checksum] == pm.tensor(t["name"])[km.checksum]  # digests of the original bytes
    stored = sum(t["nbytes"] for t in km.stored)
    assert km.meta["files"][0]["nbytes"] < stored + 64 * len(km.stored)  # model.ie.bin holds only the rest
    size = lambda d, names: sum((d / n).stat().st_size for n in names)  # noqa: E731
    plain_files = ["model.ie.json", "model.ie.bin"]
    packed_files = plain_files + ["model.dedup.json", "model.defaults.bin", "model.masks.bin", "model.exceptions.bin"]
    assert size(packed, packed_files) < 0.85 * size(plain, plain_files)


def test_packed_model_validates_deep_and_index_alone(pair):
    _plain, packed = pair
    res = run_tool("ieconv", "validate", "--deep", packed)
    assert res.returncode == 0 and "checksums verified" in res.stdout, res.stderr
    res = run_tool("ieconv", "validate", "--deep", packed / "model.dedup.json")
    assert res.returncode == 0 and "members match model.ie.json" in res.stdout, res.stderr
    res = run_tool("ieconv", "inspect", "--json", packed / "model.dedup.json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["members"] == 14
    res = run_tool("ieconv", "inspect", "--json", packed)
    assert res.returncode == 0 and json.loads(res.stdout)["tensors_in_store"] == 14, res.stderr


def test_verify_dedup_proves_a_packed_model_by_its_digests(pair, tmp_path):
    """A packed model has no original bytes to compare with: `ierun verify
    dedup` rebuilds every member and checks it against the digest recorded
    from the original, and names the member whose exception byte flipped."""
    _plain, packed = pair
    res = run_tool("ierun", "verify", "dedup", "--model-dir", packed, "--no-zstd", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(res.stdout)
    assert rep["ok"] and rep["checks"]["reconstruction"] == 14 and rep["checks"]["model"] == 14, rep
    d = _copy(packed, tmp_path / "p")
    m = next(m for _g, _j, _grp, m in fmt.load_index(d).members() if m["exceptions"]["count"])
    raw = bytearray((d / "model.exceptions.bin").read_bytes())
    raw[m["exceptions"]["offset"]] ^= 0x01
    (d / "model.exceptions.bin").write_bytes(bytes(raw))
    res = run_tool("ierun", "verify", "dedup", "--model-dir", d, "--no-zstd")
    assert res.returncode == 1 and f"{m['name']!r}: reconstructed bytes hash to" in res.stdout + res.stderr


@pytest.mark.parametrize("cache_mb", ["0", "256"])
def test_packed_logits_equal_the_plain_models(pair, tmp_path, cache_mb):
    plain, packed = pair
    for d, name in ((plain, "a.npy"), (packed, "b.npy")):
        res = run_tool("ierun", "logits", "--model-dir", d, "--ids", IDS, "--out", tmp_path / name, "--threads", "2",
                       env=_env(IE_DEDUP_CACHE_MB=cache_mb))
        assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.load(tmp_path / "a.npy"))


def test_cache_zero_multiplies_in_place_and_counts_it(pair, monkeypatch):
    _plain, packed = pair
    monkeypatch.setenv("IE_DEDUP_CACHE_MB", "0")
    dec = Decoder(packed, threads=2)
    dec.prefill(list(range(1, 13)))  # 12 tokens: one prefill chunk through the GEMM, from the same steps
    before = dec.dedup_stats
    assert before["fused_calls"] == 14
    dec.step(13)  # a decode step: fused GEMV only
    after = dec.dedup_stats
    assert after["cached_bytes"] == 0 and after["entries"] == 0
    # The strict check at load streamed each member through one buffer; no product rebuilt one whole.
    assert before["reconstructed_bytes"] == 0 and before["misses"] == 0
    assert after["fused_calls"] - before["fused_calls"] == 14
    assert after["reconstructed_bytes"] == before["reconstructed_bytes"]  # nothing rebuilt whole
    idx = fmt.load_index(packed)
    read = sum(grp["nbytes"] + m["mask"]["nbytes"] + m["exceptions"]["count"]
               for _g, _j, grp, m in idx.members())
    assert after["fused_bytes"] - before["fused_bytes"] == read


def test_missing_store_is_one_line_naming_the_file(pair, tmp_path):
    _plain, packed = pair
    d = _copy(packed, tmp_path / "p")
    (d / "model.masks.bin").unlink()
    for tool, args in (("ieconv", ("validate", d)),
                       ("ierun", ("logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "x.npy"))):
        res = run_tool(tool, *map(str, args), env=_env(IE_DEDUP="0"))
        assert res.returncode == 1, (tool, res.stderr)
        assert "model.masks.bin" in res.stderr and "does not exist" in res.stderr and "Traceback" not in res.stderr
    (d / "model.dedup.json").unlink()
    res = run_tool("ieconv", "validate", d)
    assert res.returncode == 1 and ".store: tensor" in res.stderr and "model.dedup.json does not exist" in res.stderr


def test_flipped_exception_byte_fails_deep_validation_and_the_runtime(pair, tmp_path):
    _plain, packed = pair
    d = _copy(packed, tmp_path / "p")
    idx = fmt.load_index(d)
    _g, _j, _grp, m = next((g, j, grp, m) for g, j, grp, m in idx.members() if m["exceptions"]["count"])
    blob = d / "model.exceptions.bin"
    raw = bytearray(blob.read_bytes())
    raw[m["exceptions"]["offset"]] ^= 0x01
    blob.write_bytes(bytes(raw))
    res = run_tool("ieconv", "validate", "--deep", d)
    assert res.returncode == 1 and "checksum mismatch" in res.stderr, res.stderr
    res = run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "x.npy")
    assert res.returncode == 1 and m["name"] in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_pack_refuses_to_replace_files_or_write_into_the_source(pair, tmp_path):
    plain, _packed = pair
    out = tmp_path / "o"
    out.mkdir()
    (out / "model.ie.json").write_text("mine")
    res = run_tool("ieconv", "dedup-pack", "-q", "--model-dir", plain, "--out-dir", out)
    assert res.returncode == 1 and "--overwrite" in res.stderr
    assert (out / "model.ie.json").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["model.ie.json"]
    res = run_tool("ieconv", "dedup-pack", "-q", "--model-dir", plain, "--out-dir", plain)
    assert res.returncode == 1 and "is the source directory" in res.stderr
    res = run_tool("ieconv", "dedup-pack", "-q", "--model-dir", _packed, "--out-dir", tmp_path / "again")
    assert res.returncode == 1 and "already packed" in res.stderr and not (tmp_path / "again").exists()


def test_pack_writes_nothing_when_no_group_pays(tmp_path):
    from dedup_util import write_iebin

    rng = np.random.default_rng(0)
    m = write_iebin(tmp_path / "m", {f"t{i}": ("u8", [8192], rng.integers(0, 256, 8192, dtype=np.uint8).tobytes())
                                     for i in range(3)})
    res = run_tool("ieconv", "dedup-pack", "-q", "--model-dir", m, "--out-dir", tmp_path / "o")
    assert res.returncode == 1 and "no group" in res.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("change, field, needle", [
    (lambda t: t.update(file="model.ie.bin"), "tensors[{i}].file", "unknown key 'file'"),
    (lambda t: t.update(store="zstd"), "tensors[{i}].store", "unknown store 'zstd'"),
    (lambda t: t.pop("nbytes"), "tensors[{i}]", "missing key 'nbytes'"),
])
def test_store_entry_rules(pair, change, field, needle):
    _plain, packed = pair
    meta = json.loads((packed / "model.ie.json").read_text())
    i = next(i for i, t in enumerate(meta["tensors"]) if "store" in t)
    change(meta["tensors"][i])
    with pytest.raises(FormatError, match=re.escape(field.format(i=i)) + f": .*{needle}"):
        iebin.validate_meta(meta, packed / "model.ie.json")


def test_a_store_entry_the_index_does_not_hold_is_refused(pair, tmp_path):
    _plain, packed = pair
    d = _copy(packed, tmp_path / "p")
    meta = json.loads((d / "model.ie.json").read_text())
    t = next(t for t in meta["tensors"] if "store" not in t and t["nbytes"] > 0)
    t.pop("file")
    t.pop("file_data_offset")
    t["store"] = "dedup"
    (d / "model.ie.json").write_text(json.dumps(meta))
    res = run_tool("ieconv", "validate", d)
    assert res.returncode == 1 and f"{t['name']!r} lives in the dedup store" in res.stderr and "no member" in res.stderr
