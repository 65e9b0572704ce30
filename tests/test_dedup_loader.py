"""The dedup runtime loader: every rule has an input that breaks it, for
the native loader (through the binding, bypassing the Python validator) and
for the Python index validator; then IE_DEDUP_STRICT, the LRU cache, debug
logging (the IE_DEDUP_* rules: tests/test_env.py)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_one_line_error, python_bounded, run_tool
from dedup_util import near_copies, write_artifact
from iekit.formats import dedup as fmt
from iekit.formats.errors import FormatError, IEError
from iekit.runtime import _native
from iekit.runtime.dedup import DedupConfig, DedupWarning, open_store
from iekit.runtime.tensor_source import TensorSource

N0, N1 = 1001, 700


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A valid artifact: group 0 = a0..a2 (1001 bytes), group 1 = b0, b1 (700)."""
    rng = np.random.default_rng(1)
    d = tmp_path_factory.mktemp("loader") / "model"
    g0 = near_copies(rng, 3, N0, 0.02)
    g1 = near_copies(rng, 2, N1, 0.05)
    write_artifact(d, [{"members": {f"a{i}": r for i, r in enumerate(g0)}},
                       {"members": {f"b{i}": r for i, r in enumerate(g1)}, "default_member": "b0"}],
                   extra={"plain": bytes(range(200))})
    return d


@pytest.fixture
def art(base, tmp_path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(base, d, symlinks=True)
    return d


def meta_of(d: Path) -> dict[str, Any]:
    return json.loads((d / fmt.INDEX_NAME).read_text())


def store_from(d: Path, arrays: dict[str, Any] | None = None, **kw):
    a = fmt.load_index(d).arrays() if arrays is None else arrays
    return _native.DedupStore(str(d), **a, **{"cache_mb": 1.0, **kw})


def original(d: Path, name: str) -> np.ndarray:
    src = TensorSource(d, DedupConfig(enabled=False))
    return np.array(src.get(name))


def test_valid_artifact_serves_every_member(art):
    s = store_from(art)
    assert len(s) == 5 and s.names() == ["a0", "a1", "a2", "b0", "b1"]
    for name in s.names():
        got = s.get(name)
        assert np.array_equal(got, original(art, name))
        assert not got.flags.writeable
    with pytest.raises(KeyError):
        s.get("plain")
    assert "plain" not in s and "a1" in s and s.nbytes("b1") == N1


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.tuples(st.integers(1, 5), st.integers(1, 3000),
                                                    st.sampled_from([0.0, 0.01, 0.5, 1.0])), min_size=1, max_size=3))
def test_loader_reconstructs_random_artifacts(tmp_path_factory, seed, shapes):
    rng = np.random.default_rng(seed)
    d = tmp_path_factory.mktemp("rand") / "model"
    groups = [{"members": {f"g{g}m{j}": r for j, r in enumerate(near_copies(rng, k, n, frac))}}
              for g, (k, n, frac) in enumerate(shapes)]
    write_artifact(d, groups)
    for isa in _native.cpu_features()["isas"]:
        s = store_from(d, isa=isa, cache_mb=0.0)
        for g in groups:
            for name, data in g["members"].items():
                assert np.array_equal(s.get(name), data), (isa, name)


# --------------------------------------------------------------------------
# native loader rules (arrays handed straight to the binding)
# --------------------------------------------------------------------------


def _set(key: str, i: int, v: int) -> Callable[[dict], None]:
    def f(a: dict) -> None:
        a[key] = a[key].copy()
        a[key][i] = v
    return f


def _put(key: str, v: Any) -> Callable[[dict], None]:
    return lambda a: a.__setitem__(key, v)


NATIVE_RULES = [
    # (id, change to the arrays, expected text in the error)
    ("alignment", _put("alignment", 48), "alignment: must be a power of two"),
    ("absolute path", lambda a: a["blob_names"].__setitem__(0, "/etc/passwd"), "blobs.defaults.name: '/etc/passwd' is absolute"),
    ("dotdot path", lambda a: a["blob_names"].__setitem__(1, "../model/model.masks.bin"), "contains '..'"),
    ("missing blob", lambda a: a["blob_names"].__setitem__(2, "nope.bin"), "blobs.exceptions.name: 'nope.bin' does not exist"),
    ("same file twice", lambda a: a["blob_names"].__setitem__(2, "model.masks.bin"), "same file as blobs.masks"),
    ("blob size", lambda a: a["blob_sizes"].__setitem__(1, a["blob_sizes"][1] + 1), "(size): file is"),
    ("array lengths", lambda a: a.__setitem__("exc_count", a["exc_count"][:-1]), "member arrays have different lengths"),
    ("group arrays", lambda a: a.__setitem__("group_default_offset", a["group_default_offset"][:1]), "group arrays have different lengths"),
    ("group index", _set("member_group", 4, 2), "names group 2 of 2"),
    ("negative group", _set("member_group", 0, -1), "names group -1"),
    ("empty group", lambda a: a.__setitem__("member_group", np.zeros(5, np.int64)), "groups[1].members: a group needs at least one member"),
    ("group nbytes", _set("group_nbytes", 1, 0), "groups[1].nbytes: must be >= 1"),
    ("misaligned default", _set("group_default_offset", 1, 1088 - 32), "groups[1].default.offset: offset 1056 is not a multiple of alignment 64"),
    ("negative offset", _set("mask_offset", 1, -64), "groups[0].members[1].mask.offset: must be >= 0"),
    ("default past end", _set("group_default_offset", 1, 1024 + 64), "groups[1].default.offset: bytes [1088, 1088+700) run past the end"),
    ("mask past end", _set("mask_offset", 4, 10 * 64), "groups[1].members[1].mask.offset"),
    ("exceptions past end", _set("exc_count", 4, 10_000), "groups[1].members[1].exceptions.count: must be in [0, 700]"),
    ("count beyond blob", _set("exc_offset", 1, 1 << 40), "run past the end of model.exceptions.bin"),
    ("overlap", _set("mask_offset", 1, 0), "].mask.offset: overlaps groups[0].members["),
    ("mask nbytes words", lambda a: _set("mask_nbytes", 0, int(a["mask_nbytes"][0]) - 1)(a),
     "groups[0].members[0].mask.nbytes: a 1001-byte tensor's mask is 2 bytes of line bits after up to 16 8-byte words"),
    ("mask nbytes short", _set("mask_nbytes", 0, 1), "groups[0].members[0].mask.nbytes"),
    ("mask arrays", lambda a: a.__setitem__("mask_nbytes", a["mask_nbytes"][:-1]), "member arrays have different lengths"),
    ("duplicate name", lambda a: a["names"].__setitem__(3, "a0"), "groups[1].members[0].name: duplicate member name 'a0'"),
    ("empty name", lambda a: a["names"].__setitem__(3, ""), "groups[1].members[0].name: must be a non-empty string"),
    # one more exception than mask bits (the extra byte is zero padding, so only the popcount rule breaks)
    ("popcount", lambda a: _set("exc_count", 1, int(a["exc_count"][1]) + 1)(a),
     "groups[0].members[1].exceptions.count: member 'a1': mask has"),
]


@pytest.mark.parametrize("change, needle", [r[1:] for r in NATIVE_RULES], ids=[r[0] for r in NATIVE_RULES])
def test_native_loader_rule(art, change, needle):
    a = fmt.load_index(art).arrays()
    change(a)
    with pytest.raises(ValueError) as ei:
        store_from(art, a)
    assert needle in str(ei.value), str(ei.value)


def test_native_loader_rule_model_dir(art):
    a = fmt.load_index(art).arrays()
    with pytest.raises(ValueError, match="model directory does not exist"):
        _native.DedupStore(str(art / "nope"), **a)


def test_native_loader_rule_symlink_escape(art, tmp_path):
    outside = tmp_path / "outside.bin"
    shutil.copy(art / "model.masks.bin", outside)
    (art / "model.masks.bin").unlink()
    (art / "model.masks.bin").symlink_to(outside)
    with pytest.raises(ValueError, match="blobs.masks.name: 'model.masks.bin' resolves outside the model directory"):
        store_from(art, fmt.DedupIndex(art / fmt.INDEX_NAME, meta_of(art)).arrays())


def _patch_blob(d: Path, blob: str, pos: int, value: int) -> None:
    data = bytearray((d / blob).read_bytes())
    data[pos] = value
    (d / blob).write_bytes(bytes(data))


def _last_line_word(art: Path) -> tuple[int, str, int]:
    """(member index, name, offset in model.masks.bin) of the word of the last
    line of a group-0 member whose last line (bytes 960..1000) differs."""
    data = (art / "model.masks.bin").read_bytes()
    lb = fmt.line_bits_nbytes(N0)
    for j, m in enumerate(meta_of(art)["groups"][0]["members"]):
        off, n = m["mask"]["offset"], m["mask"]["nbytes"]
        if data[off + n - 1] & 0x80:  # line 15: bit 7 of the second line-bit byte
            return j, m["name"], off + n - lb - 8
    raise AssertionError("no member of group 0 differs in its last line")


def test_native_loader_rule_tail_bits(art):
    j, name, word = _last_line_word(art)
    data = (art / "model.masks.bin").read_bytes()
    _patch_blob(art, "model.masks.bin", word + 5, data[word + 5] | 0x80)  # byte 40 + 7 of the last line: past byte 1000
    a = fmt.DedupIndex(art / fmt.INDEX_NAME, meta_of(art)).arrays()
    with pytest.raises(ValueError, match=rf"groups\[0\]\.members\[{j}\]\.mask: member '{name}': bits past the tensor's last byte"):
        store_from(art, a)


@pytest.mark.parametrize("blob", ["model.defaults.bin", "model.masks.bin", "model.exceptions.bin"])
def test_native_loader_rule_padding(art, blob):
    m = meta_of(art)
    pos = {"model.defaults.bin": N0, "model.masks.bin": m["groups"][0]["members"][0]["mask"]["nbytes"],
           "model.exceptions.bin": m["groups"][0]["members"][0]["exceptions"]["count"]}[blob]
    _patch_blob(art, blob, pos, 1)
    with pytest.raises(ValueError, match=rf"{blob}: \(padding\): byte {pos} between regions is not zero"):
        store_from(art, fmt.DedupIndex(art / fmt.INDEX_NAME, meta_of(art)).arrays())


def test_native_loader_rule_trailing_bytes(art):
    with open(art / "model.exceptions.bin", "ab") as f:
        f.write(b"\x07")
    a = fmt.DedupIndex(art / fmt.INDEX_NAME, meta_of(art)).arrays()
    a["blob_sizes"][2] += 1
    with pytest.raises(ValueError, match="after the last region is not zero"):
        store_from(art, a)


# --------------------------------------------------------------------------
# Python index validator rules (same artifact, the JSON edited)
# --------------------------------------------------------------------------


def _m(path: str, value: Any) -> Callable[[dict], None]:
    def f(meta: dict) -> None:
        keys = path.split("/")
        o = meta
        for k in keys[:-1]:
            o = o[int(k)] if isinstance(o, list) else o[k]
        last = keys[-1]
        if value is _DEL:
            del o[last]
        elif isinstance(o, list):
            o[int(last)] = value
        else:
            o[last] = value
    return f


_DEL = object()

INDEX_RULES = [
    ("format", _m("format", "other"), "format", "unknown format"),
    ("version", _m("version", 3), "version", "unsupported version 3 (this build reads 2)"),
    ("version 1", _m("version", 1), "version", "version 1 stored a mask bit per byte; re-run ieconv dedup-extract or dedup-pack"),
    ("policy", _m("policy", "lossy"), "policy", "only 'lossless'"),
    ("alignment", _m("alignment", 48), "alignment", "power of two"),
    ("alignment range", _m("alignment", 0), "alignment", "less than the minimum"),
    ("checksum", _m("checksum", "md5"), "checksum", "unsupported checksum algorithm 'md5' (known: xxh3_128, sha256)"),
    ("missing key", _m("producer", _DEL), "(root)", "\"producer\" is a required property"),
    ("unknown key", _m("extra", 1), "(root)", "Additional properties"),
    ("blob missing", _m("blobs/masks", _DEL), "blobs", "\"masks\" is a required property"),
    ("blob path", _m("blobs/masks/name", "../x.bin"), "blobs.masks.name", ""),
    ("blob twice", _m("blobs/exceptions/name", "model.masks.bin"), "blobs.exceptions.name", "the three blobs are different files"),
    ("nbytes type", _m("groups/0/nbytes", "1001"), "groups[0].nbytes", "is not of type \"integer\""),
    ("nbytes zero", _m("groups/0/nbytes", 0), "groups[0].nbytes", "less than the minimum"),
    ("shape", _m("groups/0/members/1/shape", [1000]), "groups[0].nbytes", "disagrees with u8[1000]"),
    ("dtype", _m("groups/0/dtype", "U8"), "groups[0].dtype", "unknown dtype"),
    ("digest format", _m("groups/0/members/0/xxh3_128", "ABC"), "groups[0].members[0].xxh3_128", "does not match"),
    ("two digests", _m("groups/0/default/sha256", "0" * 64), "groups[0].default", "is valid under more than one of the schemas listed in the 'oneOf' keyword"),
    ("no members", _m("groups/1/members", []), "groups[1].members", ""),
    ("duplicate", _m("groups/1/members/1/name", "a0"), "groups[1].members[1].name", "duplicate member name 'a0'"),
    ("count", _m("groups/1/members/1/exceptions/count", 701), "groups[1].members[1].exceptions.count", "701 exceptions for a 700-byte tensor"),
    ("default member", _m("groups/1/default/member", "a0"), "groups[1].default.member", "not a member"),
    ("default member exc", _m("groups/1/default/member", "b1"), "groups[1].default.member", "must have 0 exceptions"),
    ("misaligned", _m("groups/0/members/1/mask/offset", 96), "groups[0].members[1].mask.offset", "not a multiple of alignment 64"),
    ("past end", _m("groups/1/default/offset", 1088), "groups[1].default.offset", "run past the end of model.defaults.bin"),
    ("overlap", _m("groups/0/members/2/mask/offset", 192), "groups[0].members[2].mask.offset", "overlaps groups[0].members[1].mask"),
    ("negative", _m("groups/0/members/0/exceptions/offset", -64), "groups[0].members[0].exceptions.offset", "less than the minimum"),
]


@pytest.mark.parametrize("change, field, needle", [r[1:] for r in INDEX_RULES], ids=[r[0] for r in INDEX_RULES])
def test_index_validator_rule(art, change, field, needle):
    meta = meta_of(art)
    change(meta)
    (art / fmt.INDEX_NAME).write_text(json.dumps(meta))
    with pytest.raises(FormatError) as ei:
        fmt.load_index(art)
    e = ei.value
    assert e.file == str(art / fmt.INDEX_NAME) and e.field == field and needle in e.message, str(e)


@pytest.mark.parametrize("text, needle", [('{"format": 1, "format": 2}', "duplicate key"), ("[1, NaN]", "NaN"), ("{", "invalid JSON")])
def test_index_validator_rejects_bad_json(art, text, needle):
    (art / fmt.INDEX_NAME).write_text(text)
    with pytest.raises(FormatError, match=needle):
        fmt.load_index(art)


def test_index_validator_file_rules(art, tmp_path):
    (art / "model.masks.bin").rename(art / "gone.bin")
    with pytest.raises(FormatError, match="blobs.masks.name: 'model.masks.bin' does not exist"):
        fmt.load_index(art)
    (art / "gone.bin").rename(art / "model.masks.bin")
    with open(art / "model.defaults.bin", "ab") as f:
        f.write(b"\0")
    with pytest.raises(FormatError, match=r"model.defaults.bin: \(size\): file is 1725 bytes but model.dedup.json blobs.defaults.nbytes says 1724"):
        fmt.load_index(art)
    os.truncate(art / "model.defaults.bin", 1724)
    shutil.move(art / "model.exceptions.bin", tmp_path / "x.bin")
    (art / "model.exceptions.bin").symlink_to(tmp_path / "x.bin")
    with pytest.raises(FormatError, match="resolves outside the model directory"):
        fmt.load_index(art)


def test_index_validator_deep_rules(art):
    """Content rules: each reported with its field, all of them at once."""
    m = meta_of(art)
    g0 = m["groups"][0]
    assert fmt.check_blobs(fmt.load_index(art), deep=True) == []
    mk = g0["members"][1]["mask"]["offset"]
    data = bytearray((art / "model.masks.bin").read_bytes())
    data[mk] ^= 0x01  # one bit more or less in word 0 (line 0): popcount and checksums
    m2 = g0["members"][2]["mask"]
    lines = data[m2["offset"] + m2["nbytes"] - 2:m2["offset"] + m2["nbytes"]]
    clear = next(i for i in range(16) if not lines[i // 8] >> (i % 8) & 1)
    data[m2["offset"] + m2["nbytes"] - 2 + clear // 8] |= 1 << (clear % 8)  # a line bit without its word
    data[g0["members"][0]["mask"]["nbytes"]] = 9  # padding after members[0]'s mask
    (art / "model.masks.bin").write_bytes(bytes(data))
    fields = sorted(e.field for e in fmt.check_blobs(fmt.load_index(art), deep=True))
    assert fields == ["(padding)", "blobs.masks.xxh3_128", "groups[0].members[1].exceptions.count",
                      "groups[0].members[1].mask.xxh3_128", "groups[0].members[2].mask",
                      "groups[0].members[2].mask.xxh3_128"]
    with pytest.raises(FormatError):
        fmt.load_index(art, deep=True)


def test_runtime_cross_checks_members_against_model_ie_json(art):
    meta = meta_of(art)
    meta["groups"][0]["members"][1]["xxh3_128"] = "0" * 32
    (art / fmt.INDEX_NAME).write_text(json.dumps(meta))
    with pytest.raises(IEError, match=r"groups\[0\]\.members\[1\]\.xxh3_128: 'a1': xxh3_128 .* differs from model.ie.json"):
        TensorSource(art, DedupConfig(enabled=True, strict=True))
    meta["groups"][0]["members"][1]["name"] = "zzz"
    (art / fmt.INDEX_NAME).write_text(json.dumps(meta))
    with pytest.raises(IEError, match="'zzz' is not a tensor of"):
        TensorSource(art, DedupConfig(enabled=True, strict=True))


# --------------------------------------------------------------------------
# IE_DEDUP / IE_DEDUP_STRICT: a missing blob
# --------------------------------------------------------------------------


def test_tensor_source_serves_dedup_and_iebin(art):
    src = TensorSource(art, DedupConfig(enabled=True, strict=True))
    assert src.source_of("a1") == "dedup" and src.source_of("plain") == "iebin"
    assert bytes(src.get("plain")) == bytes(range(200))
    ref = TensorSource(art, DedupConfig(enabled=False))
    for name in ("a0", "a1", "a2", "b0", "b1"):
        assert np.array_equal(src.get(name), ref.get(name))
    assert src.stats()["active"] and src.stats()["misses"] == 5


def test_strict_fails_on_a_missing_blob(art):
    (art / "model.exceptions.bin").unlink()
    with pytest.raises(IEError, match="IE_DEDUP_STRICT=1: .*blobs.exceptions.name: 'model.exceptions.bin' does not exist"):
        TensorSource(art, DedupConfig(enabled=True, strict=True))


def test_non_strict_warns_once_and_falls_back(art):
    expected = {n: bytes(TensorSource(art, DedupConfig()).get(n)) for n in ("a0", "b1", "plain")}
    (art / "model.exceptions.bin").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        src = TensorSource(art, DedupConfig(enabled=True, strict=False))
        got = {n: bytes(src.get(n)) for n in expected}
        src.get("a0")
    dedup_warnings = [w for w in caught if issubclass(w.category, DedupWarning)]
    assert len(dedup_warnings) == 1 and "model.exceptions.bin" in str(dedup_warnings[0].message)
    assert got == expected
    assert src.source_of("a0") == "iebin" and src.stats()["active"] is False


def test_disabled_ignores_a_broken_artifact(art):
    (art / fmt.INDEX_NAME).write_text("{broken")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        src = TensorSource(art, DedupConfig(enabled=False, strict=True))
    assert src.store is None and src.source_of("a0") == "iebin"


def test_cli_strict_missing_blob(art):
    (art / "model.masks.bin").unlink()
    r = run_tool("ierun", "verify", "dedup", "--model-dir", art,
                 env={**os.environ, "IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"})
    assert_one_line_error(r, "model.masks.bin", "does not exist")


# --------------------------------------------------------------------------
# LRU cache and debug log
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    rng = np.random.default_rng(2)
    d = tmp_path_factory.mktemp("lru") / "model"
    write_artifact(d, [{"members": {n: r for n, r in zip("abc", near_copies(rng, 3, 65536, 0.01))}}])
    return d


def test_lru_eviction_and_counters(three):
    src = TensorSource(three, DedupConfig(enabled=True, strict=True, cache_mb=0.15))  # room for two tensors
    s = src.store
    keep_a = src.get("a")
    expect_a = bytes(keep_a)
    for name in "bacba":  # a was fetched above: [a] -> b [b a] -> a hit [a b] -> c evicts b -> b evicts a -> a evicts c
        src.get(name)
    st_ = s.stats()
    assert (st_["hits"], st_["misses"], st_["evictions"], st_["bypasses"]) == (1, 5, 3, 0)
    assert st_["entries"] == 2 and st_["cached_bytes"] == 2 * 65536 and st_["capacity_bytes"] == int(0.15 * 1048576)
    assert bytes(keep_a) == expect_a  # an evicted tensor stays valid for whoever holds it
    src.get("a")
    assert s.stats()["hits"] == 2
    s.clear_cache()
    assert s.stats()["entries"] == 0 and s.stats()["cached_bytes"] == 0


def test_tensor_larger_than_cache_bypasses(three):
    s, _ = open_store(three, cache_mb=0.01)
    for _ in range(3):
        s.get("a")
    st_ = s.stats()
    assert (st_["hits"], st_["misses"], st_["bypasses"], st_["entries"]) == (0, 3, 3, 0)


def test_debug_logs_parsing_and_cache_decisions(three, capfd):
    s, _ = open_store(three, cache_mb=0.07, debug=True)  # one tensor fits
    s.get("a")
    s.get("a")
    s.get("b")
    err = capfd.readouterr().err
    for needle in ("ie-dedup: parsing", "index ok: 1 groups, 3 members", "mapped defaults",
                   "validated 1 groups, 3 members", "cache miss a", "cache hit  a", "evict      a", "cache miss b"):
        assert needle in err, (needle, err)
    s2, _ = open_store(three, cache_mb=1)
    s2.get("a")
    assert capfd.readouterr().err == ""


# -- IE_DEDUP_STRICT=1 verifies what it rebuilds (issue 11, finding 5) --------

def _exceptions_region(art: Path, name: str) -> tuple[int, int]:
    for grp in meta_of(art)["groups"]:
        for m in grp["members"]:
            if m["name"] == name:
                return m["exceptions"]["offset"], m["exceptions"]["count"]
    raise KeyError(name)


def test_strict_refuses_a_flipped_exception_byte(art):
    off, count = _exceptions_region(art, "a1")
    assert count > 0
    _patch_blob(art, "model.exceptions.bin", off, (art / "model.exceptions.bin").read_bytes()[off] ^ 0x5A)
    src = TensorSource(art, DedupConfig(enabled=True, strict=True))  # the structure is intact: it loads
    with pytest.raises(IEError, match=r"IE_DEDUP_STRICT=1: .*'a1'.*xxh3_128.*model.ie.json"):
        src.get("a1")
    assert np.array_equal(src.get("a0"), original(art, "a0"))  # other members still verified and served


def test_strict_refuses_a_member_moved_to_another_group_of_the_same_size(tmp_path):
    """Two groups of equal nbytes: pointing a member at the other group keeps every
    structural rule (and the member's own digest) intact."""
    rng = np.random.default_rng(7)
    d = tmp_path / "model"
    write_artifact(d, [{"members": {f"a{i}": r for i, r in enumerate(near_copies(rng, 2, 512, 0.02))}},
                       {"members": {f"b{i}": r for i, r in enumerate(near_copies(rng, 2, 512, 0.02))}}])
    meta = meta_of(d)
    moved = meta["groups"][0]["members"].pop(1)
    meta["groups"][1]["members"].append(moved)
    (d / fmt.INDEX_NAME).write_text(json.dumps(meta))
    src = TensorSource(d, DedupConfig(enabled=True, strict=True))
    with pytest.raises(IEError, match=rf"IE_DEDUP_STRICT=1: .*{moved['name']!r}.*xxh3_128"):
        src.get(moved["name"])


def test_strict_verifies_once_per_tensor(art, monkeypatch):
    from iekit.formats import checksums

    calls = []
    real = checksums.digest
    monkeypatch.setattr("iekit.runtime.tensor_source.checksums.digest", lambda a, b: calls.append(1) or real(a, b))
    src = TensorSource(art, DedupConfig(enabled=True, strict=True))
    for _ in range(3):
        src.get("a1")
    assert len(calls) == 1


def test_native_loader_refuses_a_fifo_blob_without_blocking(art):
    """The index was checked while the blob was a file; the loader meets a
    FIFO in its place (the old one opened it first, and open(2) of a FIFO
    waits for a writer: a hang)."""
    code = f"""
import os
from iekit.formats import dedup as fmt
from iekit.runtime.native import _native
d = {str(art)!r}
arrays = fmt.load_index(d).arrays()
os.unlink(os.path.join(d, "model.masks.bin"))
os.mkfifo(os.path.join(d, "model.masks.bin"))
try:
    _native.DedupStore(d, **arrays, cache_mb=1.0)
except ValueError as e:
    print(e)
"""
    res = python_bounded(code)
    assert res.returncode == 0, res.stderr
    assert "model.masks.bin: (file): not a regular file (a FIFO)" in res.stdout, res.stdout
