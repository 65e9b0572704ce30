"""The fused dedup GEMV (csrc/gemv/dedup_gemv.cpp): a member multiplied a
few rows at a time, each step rebuilt from default + mask + exceptions where
the kernel reads it, equals the stored-format GEMV over the member's own
bytes, for every weight type, ISA and activation precision, and never holds
the whole member; and the streamed read the runtime verifies members with."""

from __future__ import annotations

import numpy as np
import pytest

from dedup_util import write_artifact
from test_gemv import VARIANTS, gen, vid
from iekit.formats import dedup as fmt
from iekit.runtime import native
from iekit.runtime.dedup import open_store

N = native._native
ISAS = native.cpu_features()["isas"]
def _rows_for(raw_row: int) -> int:
    """An odd row count (a last step shorter than the kernel's) spanning
    several of the store's 64 KiB prefix chunks, so the second thread's first
    row starts mid-chunk and finds its cursor from the prefix table."""
    return max(9, (5 * N.DEDUP_CHUNK) // (2 * raw_row)) | 1


def _members(v, seed: int):
    """Three near copies of one matrix of the variant (2% of bytes taken
    from another valid matrix of the type, so every member stays valid)."""
    kind, _gs, _sym, _sd, shapes = v
    rows, cols = shapes[0]
    raw, *_ = gen(v, rows, cols, seed)
    rows = _rows_for(raw.size // rows)
    base, _wd, entry, rng = gen(v, rows, cols, seed)
    other, *_ = gen(v, rows, cols, seed + 1)
    out = {}
    for j in range(3):
        m = base.copy()
        idx = rng.choice(m.size, m.size // 50, replace=False)
        m[idx] = other[idx]
        out[f"w{j}"] = m
    return out, entry, rows, cols


@pytest.mark.parametrize("v", VARIANTS, ids=vid)
def test_fused_gemv_equals_the_gemv_of_the_rebuilt_member(v, tmp_path):
    members, entry, rows, cols = _members(v, 7)
    write_artifact(tmp_path, [{"members": members}])
    store, _ = open_store(tmp_path, cache_mb=0)
    q = entry.get("quant") or {}
    kw = {}
    if v[0] == "int4w":
        kw = dict(group_size=q["group_size"], symmetric=q["symmetric"], scale_dtype=q["scale_dtype"])
    rng = np.random.default_rng(3)
    calls = 0
    acts = ["f32"] + (["int8"] if v[0] not in ("f32", "f16", "bf16") else [])
    for name, w in members.items():
        x = rng.standard_normal((3, cols)).astype(np.float32)
        bias = rng.standard_normal(rows).astype(np.float32)
        for isa in ISAS:
            for act in acts:
                for threads in (1, 2):
                    ref = N.gemv(w, v[0], rows, cols, x, bias=bias, act=act, threads=threads, isa=isa, **kw)
                    got = N.gemv_dedup(store, name, v[0], rows, cols, x, bias=bias, act=act, threads=threads,
                                       isa=isa, **kw)
                    np.testing.assert_array_equal(got, ref, err_msg=f"{name} {isa} {act} t{threads}")
                    calls += 1
    st = store.stats()
    assert st["reconstructed_bytes"] == 0 and st["cached_bytes"] == 0  # never rebuilt whole
    # Each call reads the default, the member's mask and its exceptions once.
    n = next(iter(members.values())).size
    default = fmt.majority(np.stack(list(members.values())))
    coded = {name: fmt.encode(w, default) for name, w in members.items()}  # (line mask, exceptions)
    per_name = calls // len(members)
    assert st["fused_calls"] == calls
    assert st["fused_bytes"] == sum(per_name * (n + mask.size + exc.size) for mask, exc in coded.values())


def test_read_into_rebuilds_any_slice_and_refuses_past_the_end(tmp_path):
    rng = np.random.default_rng(5)
    base = rng.integers(0, 256, 200_003, dtype=np.uint8)
    members = {}
    for j in range(3):
        m = base.copy()
        idx = rng.choice(m.size, m.size // 20, replace=False)
        m[idx] = rng.integers(0, 256, idx.size, dtype=np.uint8)
        members[f"w{j}"] = m
    write_artifact(tmp_path, [{"members": members}])
    store, _ = open_store(tmp_path, cache_mb=0)
    for name, w in members.items():
        for off, n in ((0, w.size), (1, 7), (13, 70_001), (65_535, 3), (w.size - 5, 5), (w.size, 0)):
            out = np.full(n, 0xAA, np.uint8)
            store.read_into(name, off, out)
            np.testing.assert_array_equal(out, w[off:off + n], err_msg=f"{name} [{off}, +{n})")
    with pytest.raises(ValueError, match="past the end of w0"):
        store.read_into("w0", base.size - 2, np.empty(3, np.uint8))
    with pytest.raises(KeyError):
        store.read_into("nope", 0, np.empty(1, np.uint8))
    st = store.stats()
    assert st["reconstructed_bytes"] == 0 and st["misses"] == 0  # a streamed read is not a rebuild
