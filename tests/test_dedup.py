"""Lossless dedup: the encoding, dedup-plan, dedup-extract, dedup-link,
``ierun verify dedup``, and the golden artifact.

The encoding is checked against its definition (property tests over random
groups); the tools end to end on a model whose layers are near-copies; and
verify against a single flipped byte of every kind in every blob.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import GOLDEN, assert_one_line_error, run_tool
from dedup_util import near_copies, write_artifact, write_iebin
from iekit.convert.dedup_extract import extract
from iekit.convert.dedup_link import link
from iekit.convert.dedup_plan import candidate_pairs, merge_groups, plan, sample_runs, write_plan
from iekit.formats import dedup as fmt
from iekit.formats.errors import FormatError, IEError
from iekit.runtime import _native
from iekit.runtime.dedup import DedupConfig
from iekit.runtime.verify_dedup import verify_dedup

ISAS = _native.cpu_features()["isas"]
GOLDEN_DEDUP = GOLDEN / "dedup"


# --------------------------------------------------------------------------
# the encoding, against its definition
# --------------------------------------------------------------------------


@st.composite
def groups(draw, max_k=6, max_n=3000):
    """A random group: k members of n bytes, near-copies of a base with a
    random fraction of bytes changed (from identical to unrelated)."""
    k = draw(st.integers(1, max_k))
    n = draw(st.integers(1, max_n))
    seed = draw(st.integers(0, 2**32 - 1))
    frac = draw(st.sampled_from([0.0, 0.001, 0.01, 0.2, 0.7, 1.0]))
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, n, dtype=np.uint8)
    rows = []
    for _ in range(k):
        x = base.copy()
        sel = rng.random(n) < frac
        x[sel] = rng.integers(0, 4, int(sel.sum()), dtype=np.uint8)  # few values: ties and repeats
        rows.append(x)
    return np.stack(rows)


def counter_majority(rows: np.ndarray) -> np.ndarray:
    out = np.empty(rows.shape[1], np.uint8)
    for i in range(rows.shape[1]):
        c = collections.Counter(rows[:, i].tolist())
        best = max(c.values())
        out[i] = min(v for v, n in c.items() if n == best)
    return out


@settings(max_examples=60, deadline=None)
@given(groups())
def test_reconstruction_is_exact_and_popcounts_match(rows):
    default = fmt.majority(rows)
    n = rows.shape[1]
    for member in rows:
        mask, exc = fmt.encode(member, default)
        bits = fmt.mask_bits(mask, n)  # the region's own rules hold (raises otherwise)
        assert np.array_equal(bits, np.packbits(member != default, bitorder="little"))
        lines = -(-n // 64)
        assert mask.size == -(-lines // 8) + 8 * int(np.count_nonzero(np.any(
            np.pad(member != default, (0, -n % 64)).reshape(lines, 64), axis=1)))
        assert fmt.popcount(bits) == exc.size
        assert np.array_equal(fmt.decode(default, mask, exc), member)
        for isa in ISAS:
            for threads in (1, 2):
                got = _native.dedup_reconstruct(default, mask, exc, isa=isa, threads=threads)
                assert np.array_equal(got, member), (isa, threads)


@settings(max_examples=60, deadline=None)
@given(groups(max_k=8, max_n=500))
def test_majority_never_has_more_exceptions_than_any_member_as_default(rows):
    def total(default):
        return sum(int((r != default).sum()) for r in rows)

    maj = total(fmt.majority(rows))
    assert all(maj <= total(r) for r in rows)


@settings(max_examples=40, deadline=None)
@given(groups(max_k=40, max_n=200))
def test_majority_matches_a_counter_reference(rows):
    """Both code paths (k <= 16 pairwise, k > 16 sorted) implement one rule:
    most frequent byte, ties to the smallest value."""
    assert np.array_equal(fmt.majority(rows), counter_majority(rows))


def test_kernels_on_large_sparse_and_dense_masks():
    """Sizes across chunk boundaries (DEDUP_CHUNK), zero and full blocks,
    and exceptions ending mid-tensor (the AVX2 kernel's checked tail)."""
    rng = np.random.default_rng(7)
    chunk = _native.DEDUP_CHUNK
    for n, frac in ((chunk * 3 + 77, 0.01), (chunk * 2, 1.0), (chunk + 5, 0.0), (5000, 0.3)):
        default = rng.integers(0, 256, n, dtype=np.uint8)
        member = default.copy()
        sel = rng.random(n) < frac
        sel[n // 2:] = False  # no exceptions in the second half
        member[sel] ^= rng.integers(1, 256, int(sel.sum()), dtype=np.uint8)
        mask, exc = fmt.encode(member, default)
        prefix = _native.dedup_prefix(default, mask, exc.size)
        assert tuple(prefix[-1]) == ((mask.size - -(-n // 512)) // 8, exc.size) and len(prefix) == -(-n // chunk) + 1
        for isa in ISAS:
            for threads in (1, 2):
                for nt in (0, 1):
                    got = _native.dedup_reconstruct(default, mask, exc, prefix=prefix, isa=isa, threads=threads,
                                                    stream_stores=nt)
                    assert np.array_equal(got, member), (n, frac, isa, threads, nt)


def _guarded(nbytes: int):
    """A uint8 array that ends exactly at a PROT_NONE page: reading one byte
    past its end kills the process instead of passing silently."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    size = -(-nbytes // page) * page
    buf = mmap.mmap(-1, size + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base + size, page, 0) == 0
    arr = np.frombuffer(buf, np.uint8, count=nbytes, offset=size - nbytes)
    return arr, buf


@pytest.mark.parametrize("isa", ISAS)
def test_kernels_never_read_past_the_exceptions(isa):
    rng = np.random.default_rng(4)
    for n, frac in ((4096, 0.3), (70_000, 0.02), (300, 1.0), (1000, 0.004)):
        default = rng.integers(0, 256, n, dtype=np.uint8)
        member = default.copy()
        sel = rng.random(n) < frac
        sel[-1] = True  # the last exception is the tensor's last byte
        member[sel] ^= 0x5A
        mask, exc = fmt.encode(member, default)
        guarded, keep = _guarded(exc.size)
        guarded[:] = exc
        got = _native.dedup_reconstruct(default, mask, guarded, isa=isa, threads=2)
        assert np.array_equal(got, member)
        del guarded, got
        keep.close()


@pytest.mark.parametrize("isa", ISAS)
def test_kernel_rejects_inconsistent_inputs(isa):
    default = np.zeros(100, np.uint8)  # 2 lines: 1 byte of line bits
    word = np.zeros(8, np.uint8)
    word[3] = 0b101  # bytes 24 and 26
    mask = np.concatenate([word, np.array([0b01], np.uint8)])
    with pytest.raises(ValueError, match="exceptions.count: mask has 2 set bits"):
        _native.dedup_reconstruct(default, mask, np.zeros(1, np.uint8), isa=isa)
    with pytest.raises(ValueError, match="cannot be words"):
        _native.dedup_reconstruct(default, mask[1:], np.zeros(2, np.uint8), isa=isa)
    for bad, rule in ((np.array([0b11], np.uint8), "name 2 lines but the region holds 1 words"),
                      (np.array([0b101], np.uint8), "line bits past the tensor's last line"),
                      (None, "is zero"), ("tail", "bits past the tensor's last byte")):
        m = mask.copy()
        if bad is None:
            m[:8] = 0
        elif isinstance(bad, str):
            m = np.concatenate([word, np.zeros(8, np.uint8), np.array([0b11], np.uint8)])
            m[8 + 7] = 0x80  # line 1's word: bit 63 is byte 127 of a 100-byte tensor
        else:
            m[8:] = bad
        with pytest.raises(ValueError, match=rule):
            _native.dedup_reconstruct(default, m, np.zeros(2, np.uint8), isa=isa)
        with pytest.raises(ValueError, match=rule):
            fmt.mask_bits(m, default.size)
    bad_prefix = np.array([[0, 0], [1, 5]], np.uint64)
    with pytest.raises(ValueError, match="prefix"):
        _native.dedup_reconstruct(default, mask, np.zeros(2, np.uint8), prefix=bad_prefix, isa=isa)


def test_bench_dedup_reports_against_read_bandwidth():
    from iekit.runtime.bench_dedup import bench_dedup

    r = bench_dedup(nbytes=3 << 20, density=0.01, threads=2, seed=1, passes=2, bw_bytes=8 << 20)
    assert r["kernel"] == "dedup" and r["exact"] and r["isa"] in ISAS
    assert r["gbps"] > 0 and r["read_bw_gbps"] > 0 and r["fraction"] == pytest.approx(r["gbps"] / r["read_bw_gbps"])
    assert r["bytes_read"] == (3 << 20) + r["mask_bytes"] + r["exceptions"]
    lines = (3 << 20) // 64  # a word per line with a set bit: 1 - 0.99^64 = 47% of them
    words, rest = divmod(r["mask_bytes"] - lines // 8, 8)
    assert rest == 0 and 0.44 < words / lines < 0.51
    assert 0.005 < r["exceptions"] / (3 << 20) < 0.015


def test_ierun_microbench_dedup_json():
    r = run_tool("ierun", "microbench", "--kernel", "dedup", "--nbytes", "2", "--density", "0.05", "--threads", "2",
                 "--iters", "2", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["kernel"] == "dedup" and res["exact"] and res["nbytes"] == 2 << 20
    assert res["fraction"] == pytest.approx(res["gbps"] / res["read_bw_gbps"])
    bad = run_tool("ierun", "microbench", "--kernel", "dedup", "--block-rows", "4")
    assert bad.returncode == 2 and "--block-rows does not apply to --kernel dedup" in bad.stderr


# --------------------------------------------------------------------------
# dedup-plan
# --------------------------------------------------------------------------


def test_sample_runs_are_fixed_sorted_and_inside():
    for n in (1, 4096, 4097, 10_000, 1 << 30):
        runs = sample_runs(n)
        assert runs == sample_runs(n)
        assert sum(r for _s, r in runs) == min(n, 4096)
        assert all(0 <= s and s + r <= n for s, r in runs)
        assert [s for s, _ in runs] == sorted(s for s, _ in runs)
    big = sample_runs(1 << 30)
    assert big[-1][0] > (1 << 30) * 0.9  # stratified: the whole tensor is covered


def test_lsh_finds_near_copies_among_many():
    """Beyond ALL_PAIRS_MAX tensors, banding must still link every family
    (1% bytes changed) and link few unrelated pairs."""
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(5):
        rows += near_copies(rng, 20, 4096, 0.01)
    rows += [rng.integers(0, 256, 4096, dtype=np.uint8) for _ in range(30)]
    X = np.stack(rows)
    pairs = candidate_pairs(X)
    fam = lambda i: i // 20 if i < 100 else -1 - i  # noqa: E731
    linked = {(fam(i), fam(j)) for i, j in pairs}
    for f in range(5):
        members = {i for i, j in pairs if fam(i) == f == fam(j)} | {j for i, j in pairs if fam(i) == f == fam(j)}
        assert members == set(range(20 * f, 20 * f + 20))
    assert not any(a != b for a, b in linked)
    assert len(pairs) < 5 * 20 * 64  # O(tensors x bands), not all pairs


@pytest.fixture(scope="module")
def nearcopy_model(tmp_path_factory) -> Path:
    """8 layers whose bf16 weights are near-copies (1% of elements changed),
    quantized-style u8 blocks that are near-copies too, and tensors that must
    not be grouped: same-size noise, and small norms."""
    rng = np.random.default_rng(11)
    d = tmp_path_factory.mktemp("nearcopy") / "model"
    base = rng.integers(0, 1 << 16, 128 * 256, dtype=np.uint16)
    qbase = rng.integers(0, 256, 40_000, dtype=np.uint8)
    tensors = {}
    for layer in range(8):
        w = base.copy()
        idx = rng.choice(w.size, w.size // 100, replace=False)
        w[idx] = rng.integers(0, 1 << 16, idx.size, dtype=np.uint16)
        tensors[f"layers.{layer}.mlp.weight"] = ("bf16", [128, 256], w.tobytes())
        q = qbase.copy()
        idx = rng.choice(q.size, q.size // 100, replace=False)
        q[idx] = rng.integers(0, 256, idx.size, dtype=np.uint8)
        tensors[f"layers.{layer}.q.blocks"] = ("u8", [40_000], q.tobytes())
        tensors[f"layers.{layer}.norm"] = ("f32", [256], rng.standard_normal(256).astype(np.float32).tobytes())
    tensors["noise.weight"] = ("bf16", [128, 256], rng.integers(0, 1 << 16, 128 * 256, dtype=np.uint16).tobytes())
    return write_iebin(d, tensors)


def test_plan_extract_verify_on_nearcopy_model(nearcopy_model, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(nearcopy_model, model)
    p = plan(model)
    got = sorted(sorted(g.members) for g in p.groups)
    assert got == [sorted(f"layers.{i}.mlp.weight" for i in range(8)), sorted(f"layers.{i}.q.blocks" for i in range(8))]
    for g in p.groups:
        assert g.estimate["saved_bytes"] > 0.6 * g.estimate["original_bytes"]
    tm, gr = write_plan(p, model / "dedup_out")
    res = extract(model, tm, gr, model / "dedup_out" / "model")
    assert res.original_bytes == 8 * (128 * 256 * 2 + 40_000)
    assert res.dedup_bytes < 0.4 * res.original_bytes  # mask 1/8 + ~2% exceptions per member, one default
    # the plan's estimate is close to the real size
    est = sum(g.estimate["dedup_bytes"] for g in p.groups)
    assert abs(est - res.dedup_bytes) < 0.05 * res.dedup_bytes
    link(model)
    rep = verify_dedup(model, config=DedupConfig(cache_mb=1))
    assert rep.ok, rep.failures
    assert rep.checks["reconstruction"] == 16
    assert rep.zstd_bytes is not None and rep.zstd_bytes > rep.dedup_bytes  # zstd alone cannot find cross-tensor copies


def test_plan_does_not_fragment_families(tmp_path):
    """3 families of N near-copies (1% of bytes changed) among same-size noise
    give exactly 3 groups of N. Some members come as pairs of siblings (one a
    copy of the other with 0.2% changed, as a fine-tune of a fine-tune): a
    sibling pair is more alike than either is to the family, so the greedy
    pass starts a group with it before either joins the family's group, and
    nothing merged groups later: without the merge pass the planner makes 14
    groups here (34 + 32 + 32 members and 11 pairs; on 3 × 1000 plain
    near-copies, 3 + 30). Noise is random bytes: no default saves anything on
    it (~255/256 of its bytes would be exceptions), so it stays ungrouped."""
    rng = np.random.default_rng(5)
    N, n, pairs = 40, 16384, 4
    tensors = {}
    for f in range(3):
        rows = near_copies(rng, N, n, 0.01)
        for s in range(pairs):  # members 2s + 1 are siblings of members 2s
            sib = rows[2 * s].copy()
            idx = rng.choice(n, n // 500, replace=False)
            sib[idx] = rng.integers(0, 256, idx.size, dtype=np.uint8)
            rows[2 * s + 1] = sib
        for i, x in enumerate(rows):
            tensors[f"f{f}.{i}"] = x
    for i in range(30):
        tensors[f"noise.{i}"] = rng.integers(0, 256, n, dtype=np.uint8)
    names = sorted(tensors, key=lambda _: rng.random())  # families interleaved in the file
    model = write_iebin(tmp_path / "m", {k: ("u8", [n], tensors[k].tobytes()) for k in names})
    p = plan(model)
    got = sorted(sorted(g.members) for g in p.groups)
    assert got == [sorted(f"f{f}.{i}" for i in range(N)) for f in range(3)]
    tm, gr = write_plan(p, model / "dedup_out")
    res = extract(model, tm, gr, model / "dedup_out" / "model")
    assert res.original_bytes == 3 * N * n
    est = sum(g.estimate["dedup_bytes"] for g in p.groups)
    assert abs(est - res.dedup_bytes) < 0.05 * res.dedup_bytes
    # one default per family, then 1/8 mask + ~1-2% exceptions per member
    assert res.dedup_bytes < 3 * n + 3 * N * n * (1 / 8 + 0.03)


def test_merge_pass_joins_split_families_only():
    """Two families each split in halves (as an unlucky greedy order could)
    become one group each; a sampled non-member joins nothing."""
    rng = np.random.default_rng(8)
    X = np.stack(near_copies(rng, 100, 4096, 0.015) + near_copies(rng, 100, 4096, 0.015)
                 + [rng.integers(0, 256, 4096, dtype=np.uint8)])
    halves = [list(range(a, a + 50)) for a in (150, 0, 100, 50)]
    assert merge_groups(X, halves, 16384) == [list(range(100)), list(range(100, 200))]
    assert merge_groups(X, [], 16384) == []


def test_cli_plan_extract_link_verify(nearcopy_model, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(nearcopy_model, model)
    out = model / "dedup_out"
    r = run_tool("ieconv", "dedup-plan", "--model-dir", model, "--out-dir", out, "--json")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    assert len(planned["groups"]) == 2 and planned["est_saved_bytes"] > 0
    r = run_tool("ieconv", "dedup-plan", "--model-dir", model, "--out-dir", out)
    assert_one_line_error(r, "--overwrite")
    r = run_tool("ieconv", "dedup-extract", "--model-dir", model, "--tensor-map", out / "tensor_map.json",
                 "--groups", out / "groups.indices.json", "--out-prefix", out / "model", "-q")
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout
    r = run_tool("ieconv", "dedup-link", model)
    assert r.returncode == 0, r.stderr
    for name in ("model.dedup.json", "model.defaults.bin", "model.masks.bin", "model.exceptions.bin"):
        assert os.readlink(model / name) == f"dedup_out/{name}"  # relative
    env = {**os.environ, "IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"}
    r = run_tool("ierun", "verify", "dedup", "--model-dir", model, "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["groups"] == 2 and rep["members"] == 16
    assert rep["ratio"] > 2.5 and rep["zstd_bytes"] > rep["dedup_bytes"]
    r = run_tool("ierun", "verify", "dedup", "--model-dir", model, "--no-zstd", env=env)
    assert r.returncode == 0 and "bit-exact" in r.stdout, r.stdout + r.stderr
    r = run_tool("ierun", "verify", "dedup", "--model-dir", model, env={**env, "IE_DEDUP_POLICY": "lossy"})
    assert_one_line_error(r, "IE_DEDUP_POLICY", "lossless")


# --------------------------------------------------------------------------
# dedup-extract
# --------------------------------------------------------------------------


def _plan_files(model: Path, groups_obj: dict | None = None) -> tuple[Path, Path]:
    p = plan(model, min_bytes=1024)
    tm, gr = write_plan(p, model / "dedup_out")
    if groups_obj is not None:
        gr.write_text(json.dumps(groups_obj))
    return tm, gr


@pytest.fixture
def small_model(tmp_path) -> Path:
    rng = np.random.default_rng(5)
    rows = near_copies(rng, 3, 5000, 0.01)
    return write_iebin(tmp_path / "m", {f"t{i}": ("u8", [5000], r.tobytes()) for i, r in enumerate(rows)}
                       | {"odd": ("u8", [4000], rng.integers(0, 256, 4000, dtype=np.uint8).tobytes())})


@pytest.mark.parametrize("groups_obj, field, needle", [
    ({"groups": [{"members": ["t0", "nope"]}]}, "groups[0].members[1]", "not in the tensor map"),
    ({"groups": [{"members": ["t0", "odd"]}]}, "groups[0].members[1]", "equal nbytes"),
    ({"groups": [{"members": ["t0", "t0"]}]}, "groups[0].members[1]", "listed twice"),
    ({"groups": [{"members": ["t0", "t1"]}, {"members": ["t2", "t1"]}]}, "groups[1].members[1]", "already in groups[0]"),
    ({"groups": [{"members": ["t0", "t1"], "default_member": "t2"}]}, "groups[0].default_member", "not a member"),
    ({"groups": [{"members": ["t0"]}]}, "groups[0].members", "has less than 2 items"),
])
def test_extract_rejects_bad_groups(small_model, groups_obj, field, needle):
    tm, gr = _plan_files(small_model, {"format": "iekit-dedup-groups", "version": 1, **groups_obj})
    with pytest.raises(FormatError) as ei:
        extract(small_model, tm, gr, small_model / "dedup_out" / "model")
    assert ei.value.file == str(gr) and ei.value.field == field and needle in ei.value.message
    assert not list((small_model / "dedup_out").glob("model.*"))


def test_extract_detects_a_stale_map_and_writes_nothing(small_model):
    tm, gr = _plan_files(small_model, {"format": "iekit-dedup-groups", "version": 1,
                                       "groups": [{"members": ["t0", "t1", "t2"]}]})
    with open(small_model / "model.ie.bin", "r+b") as f:  # the model changed after planning
        f.seek(fmt.load_tensor_map(tm).tensors["t1"].offset + 10)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(FormatError, match="stale map") as ei:
        extract(small_model, tm, gr, small_model / "dedup_out" / "model")
    assert ei.value.field == "tensors.t1.xxh3_128"
    assert sorted(p.name for p in (small_model / "dedup_out").iterdir()) == ["groups.indices.json", "tensor_map.json"]


def test_extract_named_default_and_small_chunks(small_model, monkeypatch):
    """A named default has no exceptions; streaming in chunks smaller than
    the tensor gives the same blobs as one chunk."""
    import iekit.convert.dedup_extract as ex

    tm, gr = _plan_files(small_model, {"format": "iekit-dedup-groups", "version": 1,
                                       "groups": [{"members": ["t0", "t1", "t2"], "default_member": "t1"}]})
    a = extract(small_model, tm, gr, small_model / "a" / "model")
    monkeypatch.setattr(ex, "MIN_CHUNK", 512)
    monkeypatch.setattr(ex, "CHUNK_BUDGET", 3 * 1024)
    assert ex.chunk_size(3) == 1024
    b = extract(small_model, tm, gr, small_model / "b" / "model")
    for name in ("model.defaults.bin", "model.masks.bin", "model.exceptions.bin", "model.dedup.json"):
        assert (a.index_path.parent / name).read_bytes() == (b.index_path.parent / name).read_bytes()
    meta = json.loads(a.index_path.read_text())
    g = meta["groups"][0]
    assert g["default"]["member"] == "t1"
    assert [m["exceptions"]["count"] == 0 for m in g["members"]] == [False, True, False]


def test_extract_refuses_to_overwrite(small_model):
    tm, gr = _plan_files(small_model)
    extract(small_model, tm, gr, small_model / "dedup_out" / "model")
    with pytest.raises(IEError, match="--overwrite"):
        extract(small_model, tm, gr, small_model / "dedup_out" / "model")
    extract(small_model, tm, gr, small_model / "dedup_out" / "model", overwrite=True)


# --------------------------------------------------------------------------
# dedup-link
# --------------------------------------------------------------------------


def test_link_rules(small_model, tmp_path):
    tm, gr = _plan_files(small_model)
    extract(small_model, tm, gr, small_model / "dedup_out" / "model")
    links = link(small_model)
    assert [d.name for d, _ in links][-1] == "model.dedup.json"  # index last
    assert link(small_model)  # idempotent
    fmt.load_index(small_model, deep=True)
    # a regular file in the way is only replaced with overwrite
    (small_model / "model.masks.bin").unlink()
    (small_model / "model.masks.bin").write_bytes(b"x")
    with pytest.raises(IEError, match="not a symlink"):
        link(small_model)
    link(small_model, overwrite=True)
    assert (small_model / "model.masks.bin").is_symlink()
    # an index outside the model directory is refused
    outside = tmp_path / "elsewhere"
    shutil.copytree(small_model / "dedup_out", outside)
    with pytest.raises(IEError, match="is outside .* only an artifact inside the model directory"):
        link(small_model, outside / "model.dedup.json")
    # the index already in the model directory: nothing to link
    with pytest.raises(IEError, match="already in"):
        link(small_model, small_model / "model.dedup.json")


def test_link_refuses_a_model_directory_the_artifact_is_not_of(small_model, tmp_path):
    """The links serve the model beside them: an artifact of another model,
    or a model.ie.json that does not load, is refused and nothing is linked
    (both were linked and reported OK)."""
    tm, gr = _plan_files(small_model)
    extract(small_model, tm, gr, small_model / "dedup_out" / "model")
    other = tmp_path / "other"
    shutil.copytree(GOLDEN_DEDUP.parent / "iebin" / "tiny-llama", other)
    shutil.copytree(small_model / "dedup_out", other / "dedup_out")
    with pytest.raises(FormatError, match="is not a tensor of .*model.ie.json"):
        link(other)
    broken = tmp_path / "broken"
    shutil.copytree(small_model, broken)
    (broken / "model.ie.json").write_bytes(b"\xff" * 64)
    with pytest.raises(FormatError, match="model.ie.json.*not valid UTF-8"):
        link(broken)
    for d in (other, broken):
        assert not [p for p in d.iterdir() if p.is_symlink()]


# --------------------------------------------------------------------------
# golden
# --------------------------------------------------------------------------


def test_golden_dedup_regenerates_byte_identically(tmp_path):
    spec = importlib.util.spec_from_file_location("make_golden_dedup", GOLDEN_DEDUP / "make_golden_dedup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.build(tmp_path)
    committed = sorted(p.relative_to(GOLDEN_DEDUP / "model") for p in (GOLDEN_DEDUP / "model").rglob("*") if p.is_file())
    made = sorted(p.relative_to(tmp_path / "model") for p in (tmp_path / "model").rglob("*") if p.is_file())
    assert made == committed and len(made) == 8
    for rel in committed:
        assert (tmp_path / "model" / rel).read_bytes() == (GOLDEN_DEDUP / "model" / rel).read_bytes(), rel
    idx = fmt.load_index(GOLDEN_DEDUP / "model" / "dedup_out", deep=True)
    assert [len(g["members"]) for g in idx.groups] == [4, 3]
    assert idx.groups[1]["default"]["member"] == "blk.0.q4.weight"


def test_golden_dedup_verifies(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(GOLDEN_DEDUP / "model", model)
    link(model)
    rep = verify_dedup(model)
    assert rep.ok, rep.failures
    assert rep.original_bytes == 4 * 2048 + 3 * 2048 and rep.dedup_bytes < rep.original_bytes / 2


# --------------------------------------------------------------------------
# verify: a single flipped byte anywhere in any blob fails
# --------------------------------------------------------------------------


N = 1100  # 18 lines (spare line bits in the last byte), not a multiple of 64 (padding after regions)


@pytest.fixture(scope="module")
def flip_base(tmp_path_factory) -> Path:
    """Two groups. In group 0 the default is hand-made: at position P0 it
    holds a byte no member has, so every member's mask bit is set there and
    no reconstruction reads default[P0]."""
    rng = np.random.default_rng(9)
    d = tmp_path_factory.mktemp("flip") / "model"
    g0 = near_copies(rng, 3, N, 0.02)
    default0 = fmt.majority(np.stack(g0))
    default0[P0] = (max(int(r[P0]) for r in g0) + 1) % 256
    assert all(r[P0] != default0[P0] for r in g0)
    g1 = near_copies(rng, 2, 700, 0.05)
    write_artifact(d, [{"members": {f"a{i}": r for i, r in enumerate(g0)}, "default": default0},
                       {"members": {f"b{i}": r for i, r in enumerate(g1)}}],
                   extra={"other": bytes(100)})
    return d


P0 = 17


def _positions(model: Path) -> dict[str, tuple[str, int, int]]:
    """One (blob, byte offset, bit) per kind of byte."""
    meta = json.loads((model / "model.dedup.json").read_text())
    g0, g1 = meta["groups"]
    m0 = g0["members"][0]
    mask = np.frombuffer((model / "model.masks.bin").read_bytes(), np.uint8)
    moff, mn = m0["mask"]["offset"], m0["mask"]["nbytes"]
    lines, lb = fmt.line_count(N), fmt.line_bits_nbytes(N)
    line_bits = np.unpackbits(mask[moff + mn - lb:moff + mn], count=lines, bitorder="little")
    clear = int(np.flatnonzero(line_bits == 0)[0])
    default = np.frombuffer((model / "model.defaults.bin").read_bytes(), np.uint8)
    masks_of_g0 = [np.unpackbits(fmt.mask_bits(mask[m["mask"]["offset"]:m["mask"]["offset"] + m["mask"]["nbytes"]], N),
                                 count=N, bitorder="little") for m in g0["members"]]
    read_pos = int(np.flatnonzero(~np.any(masks_of_g0, axis=0))[0])
    assert all(mk[P0] for mk in masks_of_g0) and line_bits[0]  # line 0 (P0's) has word 0
    assert g1["default"]["offset"] > N and default.size > N  # padding after group 0's default
    e0 = g0["members"][0]["exceptions"]
    return {
        "default byte read by members": ("model.defaults.bin", g0["default"]["offset"] + read_pos, 1),
        "default byte every member overrides": ("model.defaults.bin", g0["default"]["offset"] + P0, 1),
        "defaults padding": ("model.defaults.bin", N, 1),
        "mask word byte": ("model.masks.bin", moff, 1),
        "mask line bit set": ("model.masks.bin", moff + mn - lb, 1),
        "mask line bit clear": ("model.masks.bin", moff + mn - lb + clear // 8, 1 << clear % 8),
        "mask tail bits": ("model.masks.bin", moff + mn - 1, 1 << lines % 8),
        "masks padding": ("model.masks.bin", moff + mn, 1),
        "exception byte": ("model.exceptions.bin", e0["offset"], 1),
        "exceptions padding": ("model.exceptions.bin", e0["offset"] + e0["count"], 1),
    }


def test_flip_base_verifies(flip_base):
    rep = verify_dedup(flip_base)
    assert rep.ok, rep.failures
    assert len(_positions(flip_base)) == 10


@pytest.mark.parametrize("kind", ["default byte read by members", "default byte every member overrides",
                                  "defaults padding", "mask word byte", "mask line bit set", "mask line bit clear",
                                  "mask tail bits", "masks padding", "exception byte", "exceptions padding"])
def test_a_flipped_byte_fails_verify(flip_base, tmp_path, kind):
    model = tmp_path / "model"
    shutil.copytree(flip_base, model)
    blob, pos, bit = _positions(model)[kind]
    with open(model / blob, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ bit]))
    rep = verify_dedup(model, zstd=False)
    assert not rep.ok
    assert any(f"blobs.{blob.split('.')[1]}.xxh3_128" in f for f in rep.failures)  # the whole-blob checksum
    if kind == "default byte every member overrides":
        # reconstruction alone cannot see it: only the region checksum does
        assert rep.checks["reconstruction"] == 5
        assert any("groups[0].default.xxh3_128" in f for f in rep.failures)
    if kind.startswith("mask") and "padding" not in kind:
        assert any("loader:" in f for f in rep.failures)  # a line-mask rule of the native loader


def test_flipped_byte_fails_the_cli(flip_base, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(flip_base, model)
    blob, pos, _bit = _positions(model)["default byte every member overrides"]
    data = bytearray((model / blob).read_bytes())
    data[pos] ^= 0x80
    (model / blob).write_bytes(bytes(data))
    r = run_tool("ierun", "verify", "dedup", "--model-dir", model, "--no-zstd",
                 env={**os.environ, "IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"})
    assert r.returncode == 1 and "FAIL" in r.stdout and "checksum mismatch" in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_digests_of_golden_blobs_are_recorded():
    import xxhash

    idx = fmt.load_index(GOLDEN_DEDUP / "model" / "dedup_out")
    assert idx.meta["checksum"] == "xxh3_128"
    for k in fmt.BLOB_KEYS:
        assert xxhash.xxh3_128(idx.blob_path(k).read_bytes()).hexdigest() == idx.meta["blobs"][k]["xxh3_128"]


@pytest.mark.parametrize("alg", ["xxh3_128", "sha256"])
def test_dedup_records_the_models_checksum(tmp_path, alg):
    """plan -> extract -> link -> verify on a model of either algorithm: the map
    and the index carry the model's digests (each member's equals the model's
    entry, by the library's own hash), and a loader refuses an index whose
    algorithm is not the model's."""
    import xxhash

    ref = {"sha256": lambda b: hashlib.sha256(b).hexdigest(), "xxh3_128": lambda b: xxhash.xxh3_128(b).hexdigest()}[alg]
    rows = near_copies(np.random.default_rng(9), 3, 6000, 0.01)
    model = write_iebin(tmp_path / "m", {f"t{i}": ("u8", [6000], r.tobytes()) for i, r in enumerate(rows)}, checksum=alg)
    p = plan(model, min_bytes=1024)
    tm, gr = write_plan(p, model / "dedup_out")
    assert json.loads(tm.read_text())["checksum"] == alg
    extract(model, tm, gr, model / "dedup_out" / "model")
    link(model)
    idx = fmt.load_index(model, deep=True)
    assert idx.meta["checksum"] == alg
    for _g, _j, _grp, m in idx.members():
        assert m[alg] == ref(rows[int(m["name"][1:])].tobytes())
        assert all(other not in m for other in ("sha256", "xxh3_128") if other != alg)
    rep = verify_dedup(model, zstd=False)
    assert rep.ok, rep.failures
    other = "sha256" if alg == "xxh3_128" else "xxh3_128"
    from iekit.formats import iebin

    m = iebin.load_model(model)
    with pytest.raises(FormatError, match=rf"checksum: '{alg}' digests, but model.ie.json records '{other}'"):
        # as if the index came from another conversion of the model
        fmt.cross_check(idx, m.tensors, m.meta_path, other)
    meta = json.loads((model / "model.dedup.json").read_text())
    meta["checksum"] = other  # the index's records no longer match its own field
    (model / "dedup_out" / "model.dedup.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=rf"blobs.defaults.{alg}: {alg} digest in a file whose checksum is '{other}'"):
        fmt.load_index(model)
