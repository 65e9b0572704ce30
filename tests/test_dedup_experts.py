"""Dedup and block-sparse on expert stacks [experts, rows, cols].

dedup-plan treats each expert of a stack as a unit of its own, STACK[e]
(tensor_entries.expert_slice), so experts that are near copies of each other group;
extract, link, ``ierun verify dedup`` and the decoder (IE_DEDUP=1) serve
such members; a packed model stores whole tensors only and says so.
block-sparse and ``verify bsr`` take one expert by the same name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.formats import checksums, iebin
from iekit.formats.tensor_entries import expert_of
from iekit.formats import dedup as fmt
from iekit.convert.dedup_plan import describe_bucket
from iekit.formats.casting import decode_f32
from iekit.formats.errors import IEError
from iekit.runtime.decoder import Decoder

IDS = [3, 17, 250, 9, 64, 101, 7, 300, 42, 5, 11, 77]
STACK = "model.layers.0.mlp.experts.gate_up_proj"


def near_copy_experts(dst: Path, model: str, frac: float = 0.01) -> Path:
    """``model`` with every expert of every stack replaced by its expert 0
    with ``frac`` of its bytes changed (a low bit flipped: values stay
    finite), digests updated: experts that dedup across."""
    shutil.copytree(GOLDEN_IEBIN / model, dst)
    meta = json.loads((dst / iebin.META_NAME).read_text())
    data = bytearray((dst / iebin.BIN_NAME).read_bytes())
    rng = np.random.default_rng(0)
    for t in meta["tensors"]:
        if len(t["shape"]) != 3:
            continue
        n, off = t["shape"][0], t["file_data_offset"]
        a = np.frombuffer(bytes(data[off:off + t["nbytes"]]), np.uint8).reshape(n, -1).copy()
        for e in range(1, n):
            a[e] = a[0]
            idx = rng.choice(a.shape[1] // 2, max(1, int(frac * a.shape[1])), replace=False) * 2
            a[e, idx] ^= 1
        data[off:off + t["nbytes"]] = a.tobytes()
        t[meta["checksum"]] = checksums.digest(meta["checksum"], a.tobytes())
    (dst / iebin.BIN_NAME).write_bytes(bytes(data))
    iebin.write_meta(dst / iebin.META_NAME, meta)
    return dst


def plan_extract_link(model: Path, *plan_args: str) -> dict:
    out = model / "dedup_out"
    res = run_tool("ieconv", "dedup-plan", "--json", "--model-dir", model, "--out-dir", out, "--min-bytes", "1024",
                   *plan_args)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    for args in (("dedup-extract", "-q", "--model-dir", model, "--tensor-map", out / "tensor_map.json",
                  "--groups", out / "groups.indices.json", "--out-prefix", out / "model"),
                 ("dedup-link", model)):
        res = run_tool("ieconv", *args)
        assert res.returncode == 0, (args, res.stderr)
    return summary


@pytest.fixture(scope="module", params=["tiny-gpt-oss", "tiny-gpt-oss-mxfp4"])
def experts_model(request, tmp_path_factory) -> tuple[Path, dict]:
    model = near_copy_experts(tmp_path_factory.mktemp("experts") / "m", request.param)
    return model, plan_extract_link(model)


def test_plan_groups_experts_of_a_stack(experts_model):
    """Each stack's four near-copy experts form one group of STACK[0..3]
    where that pays (not for experts of ~1 KiB: the index entries and
    padding, 512 bytes a member, eat the saving); the buckets report finds
    the closest pair."""
    model, summary = experts_model
    stacks = [t for t in iebin.load_model(model).tensors if len(t["shape"]) == 3]
    assert summary["experts"] == 4 * len(stacks)
    groups = sorted(sorted(g["members"]) for g in summary["groups"])
    assert groups == sorted([f"{t['name']}[{e}]" for e in range(4)] for t in stacks if t["nbytes"] >= 4 * 2048)
    for b in summary["buckets"]:
        if b["first"].endswith("[0]"):
            assert b["best_agreement"] > 0.95
    tmap = json.loads((model / "dedup_out" / "tensor_map.json").read_text())["tensors"]
    m = iebin.load_model(model)
    for name in groups[0]:
        t = m.expert(name)
        raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        assert tmap[name]["offset"] == t["file_data_offset"]
        assert tmap[name][m.checksum] == checksums.digest(m.checksum, raw)


def test_bucket_agreements_against_brute_force():
    """The report's numbers on a sample matrix: the closest candidate pair,
    neighbours, and the mean over all pairs (counted per position in the
    planner), against a plain loop over pairs."""
    rng = np.random.default_rng(3)
    X = rng.integers(0, 6, (9, 300), dtype=np.uint8)
    X[4] = X[2]
    X[4, :30] += 1
    pairs = {(i, j) for i in range(9) for j in range(i + 1, 9)}
    b = describe_bucket(X, [f"s[{i}]" for i in range(9)], "bf16", 300, pairs)
    agree = {(i, j): float(np.mean(X[i] == X[j])) for i, j in pairs}
    assert b.best_agreement == agree[(2, 4)] == 0.9
    assert b.neighbour_agreement == pytest.approx(np.mean([agree[(i, i + 1)] for i in range(8)]), abs=1e-12)
    assert b.mean_agreement == pytest.approx(np.mean(list(agree.values())), abs=1e-12)
    assert (b.units, b.pairs, b.first) == (9, 36, "s[0]")


def test_verify_dedup_rebuilds_every_expert(experts_model):
    model, _ = experts_model
    res = run_tool("ierun", "verify", "dedup", "--json", "--model-dir", model,
                   env={"IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    rep = json.loads(res.stdout)
    assert rep["checks"]["reconstruction"] == rep["members"] > 0


@pytest.mark.parametrize("cache_mb", ["0", "64"])
def test_decoder_serves_expert_members_bit_exactly(experts_model, monkeypatch, cache_mb):
    """Logits with the experts from the store (the fused GEMV at cache 0,
    the LRU cache otherwise) equal those from model.ie.bin bit for bit."""
    model, _ = experts_model
    plain = Decoder(model, threads=2, act="f32").logits(IDS)
    for k, v in {"IE_DEDUP": "1", "IE_DEDUP_STRICT": "1", "IE_DEDUP_CACHE_MB": cache_mb}.items():
        monkeypatch.setenv(k, v)
    d = Decoder(model, threads=2, act="f32")
    assert d.source.source_of(f"{STACK}[1]") == "dedup"
    assert np.array_equal(d.logits(IDS), plain)
    stats = d.dedup_stats
    assert (stats["fused_calls"] if cache_mb == "0" else stats["hits"] + stats["misses"]) > 0


def test_strict_load_hashes_the_stack_of_a_corrupted_expert(experts_model, tmp_path, monkeypatch):
    """An expert slice has no digest in model.ie.json: a flipped exception
    byte is caught by hashing its whole stack, and the error names it."""
    model, _ = experts_model
    bad = tmp_path / "bad"
    shutil.copytree(model, bad, symlinks=False)
    exc = bad / "model.exceptions.bin"
    raw = bytearray(exc.read_bytes())
    index = fmt.load_index(bad)
    first = next(m for _g, _j, _grp, m in index.members() if m["exceptions"]["count"])
    raw[first["exceptions"]["offset"]] ^= 0xFF
    exc.write_bytes(bytes(raw))
    # The index records the region digests too; rewrite it so only the
    # model.ie.json digest can catch the change.
    meta = json.loads((bad / fmt.INDEX_NAME).read_text())
    alg = meta["checksum"]
    meta["blobs"]["exceptions"][alg] = checksums.digest(alg, bytes(raw))
    for grp in meta["groups"]:
        for m in grp["members"]:
            if m["name"] == first["name"]:
                lo, n = m["exceptions"]["offset"], m["exceptions"]["count"]
                m["exceptions"][alg] = checksums.digest(alg, bytes(raw[lo:lo + n]))
    (bad / fmt.INDEX_NAME).write_text(json.dumps(meta))
    for k, v in {"IE_DEDUP": "1", "IE_DEDUP_STRICT": "1", "IE_DEDUP_CACHE_MB": "0"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(IEError, match=r"IE_DEDUP_STRICT=1: the experts of .*hash to"):
        Decoder(bad, threads=1, act="f32")


def test_pack_stores_whole_tensors_and_refuses_an_expert_plan(experts_model, tmp_path):
    model, _ = experts_model
    out = model / "dedup_out"
    res = run_tool("ieconv", "dedup-pack", "--model-dir", model, "--out-dir", tmp_path / "p",
                   "--tensor-map", out / "tensor_map.json", "--groups", out / "groups.indices.json")
    assert_one_line_error(res, "is one expert of a stack", "--whole-stacks")
    assert not (tmp_path / "p").exists()


def test_pack_groups_whole_stacks_across_layers(tmp_path, monkeypatch):
    """Layer 1's stacks near copies of layer 0's: dedup-pack groups the
    stacks whole, model.ie.bin drops them, and the packed model decodes bit
    for bit as the plain one (each stack rebuilt once, sliced per expert)."""
    model = tmp_path / "m"
    shutil.copytree(GOLDEN_IEBIN / "tiny-gpt-oss", model)
    meta = json.loads((model / iebin.META_NAME).read_text())
    data = bytearray((model / iebin.BIN_NAME).read_bytes())
    by_name = {t["name"]: t for t in meta["tensors"]}
    rng = np.random.default_rng(1)
    for stack in ("gate_up_proj", "down_proj"):
        src, dst = (by_name[f"model.layers.{i}.mlp.experts.{stack}"] for i in (0, 1))
        a = np.frombuffer(bytes(data[src["file_data_offset"]:][:src["nbytes"]]), np.uint8).copy()
        a[rng.choice(a.size // 2, a.size // 200, replace=False) * 2] ^= 1
        data[dst["file_data_offset"]:dst["file_data_offset"] + dst["nbytes"]] = a.tobytes()
        dst[meta["checksum"]] = checksums.digest(meta["checksum"], a.tobytes())
    (model / iebin.BIN_NAME).write_bytes(bytes(data))
    iebin.write_meta(model / iebin.META_NAME, meta)
    res = run_tool("ieconv", "dedup-pack", "--json", "--model-dir", model, "--out-dir", tmp_path / "p")
    assert res.returncode == 0, res.stderr
    packed = iebin.load_model(tmp_path / "p")
    in_store = {t["name"] for t in packed.in_store}
    assert {f"model.layers.{i}.mlp.experts.{s}" for i in (0, 1) for s in ("gate_up_proj", "down_proj")} <= in_store
    plain = Decoder(model, threads=2, act="f32").logits(IDS)
    for cache in ("0", "64"):
        monkeypatch.setenv("IE_DEDUP_CACHE_MB", cache)
        assert np.array_equal(Decoder(tmp_path / "p", threads=2, act="f32").logits(IDS), plain)


def _groups_file(path: Path, members: list[list[str]]) -> Path:
    path.write_text(json.dumps({"format": fmt.GROUPS_FORMAT, "version": fmt.VERSION,
                                "groups": [{"members": m} for m in members]}))
    return path


def test_error_a_plan_that_stores_bytes_twice(experts_model, tmp_path):
    """A hand-edited plan grouping a stack and one of its experts (the same
    bytes in two members): refused before anything is written."""
    model, _ = experts_model
    tmap = json.loads((model / "dedup_out" / "tensor_map.json").read_text())
    other = "model.layers.1.mlp.experts.gate_up_proj"
    assert other in tmap["tensors"] and f"{STACK}[0]" in tmap["tensors"]
    tmap["tensors"][STACK] = {**tmap["tensors"][other], "offset": tmap["tensors"][f"{STACK}[0]"]["offset"]}
    (tmp_path / "tm.json").write_text(json.dumps(tmap))
    groups = _groups_file(tmp_path / "g.json", [[STACK, other], [f"{STACK}[0]", f"{STACK}[1]"]])
    res = run_tool("ieconv", "dedup-extract", "--model-dir", model, "--tensor-map", tmp_path / "tm.json",
                   "--groups", groups, "--out-prefix", tmp_path / "o" / "model")
    assert_one_line_error(res, "g.json", "shares bytes of model.ie.bin")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rename,needle", [
    (lambda n: n.replace("[1]", "[4]"), "has 4 experts"),
    (lambda n: n.replace("gate_up_proj[1]", "nope[1]"), "nor an expert of one"),
    (lambda n: n.replace("[1]", ""), "the same bytes twice"),
])
def test_error_index_names_an_expert_the_model_lacks(experts_model, tmp_path, rename, needle):
    """model.dedup.json naming expert 4 of a 4-expert stack, a stack that
    does not exist, or the stack in an expert's place: one line naming the
    index and the member."""
    model, _ = experts_model
    bad = tmp_path / "bad"
    shutil.copytree(model, bad, symlinks=False)
    meta = json.loads((bad / fmt.INDEX_NAME).read_text())
    m = next(m for g in meta["groups"] for m in g["members"] if m["name"] == f"{STACK}[1]")
    m["name"] = rename(m["name"])
    (bad / fmt.INDEX_NAME).write_text(json.dumps(meta))
    res = run_tool("ierun", "bench", "--model-dir", bad, "--rounds", "1", "--warmup", "0", "--max-new", "1", env={"IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"})
    assert_one_line_error(res, "model.dedup.json", "members[", needle)


def test_block_sparse_takes_one_expert(tmp_path):
    """`--tensor STACK[e]`: expert e's matrix, bit for bit; the stack's own
    name, an expert past the end, or a non-canonical index are one-line errors."""
    model = GOLDEN_IEBIN / "tiny-gpt-oss"
    m = iebin.load_model(model)
    t = m.tensor(STACK)
    whole = decode_f32(m.path_of(t).read_bytes()[t["file_data_offset"]:][:t["nbytes"]], t["dtype"]).reshape(t["shape"])
    bsr_path = tmp_path / "e2.bsr"
    res = run_tool("ieconv", "block-sparse", "--json", "--model-dir", model, "--tensor", f"{STACK}[2]",
                   "--block-rows", "8", "--block-cols", "8", "-o", bsr_path)
    assert res.returncode == 0, res.stderr
    from iekit.formats import bsr
    assert np.array_equal(bsr.read(bsr_path).to_dense(), whole[2])
    res = run_tool("ierun", "verify", "bsr", bsr_path, "--model-dir", model, "--tensor", f"{STACK}[2]")
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_tool("ierun", "verify", "bsr", bsr_path, "--model-dir", model, "--tensor", f"{STACK}[3]")
    assert res.returncode == 1
    for name, needle in ((STACK, "name one expert"), (f"{STACK}[4]", "has 4 experts"),
                         (f"{STACK}[02]", "no tensor named")):
        res = run_tool("ieconv", "block-sparse", "--model-dir", model, "--tensor", name,
                       "--block-rows", "8", "--block-cols", "8", "-o", tmp_path / "x.bsr")
        assert_one_line_error(res, "model.ie.json", needle)
    assert not (tmp_path / "x.bsr").exists()


def test_expert_names_parse_one_way():
    assert expert_of("a.b[0]") == ("a.b", 0) and expert_of("a[31]") == ("a", 31)
    for name in ("a", "a[]", "[3]", "a[03]", "a[-1]", "a[1 ]", "a[٣]", "a[1]x"):
        assert expert_of(name) is None, name
