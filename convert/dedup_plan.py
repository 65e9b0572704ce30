"""``ieconv dedup-plan``: find groups of near-identical tensors by sampling.

Reading every byte of every pair of tensors is out of the question for
thousands of tensors and tens of GB, so the planner reads a fixed sample of
each tensor and works on samples only:

1. Tensors are bucketed by (dtype, nbytes): only equal-size tensors can
   share a default. Each expert ``STACK[e]`` of a 3-D stack is a unit of
   its own (``plan_units``), so experts group with each other.
2. Each tensor contributes ``sample_bytes`` bytes (64 runs of 64 bytes at
   positions derived from SHAKE-256 of the size, stratified over the tensor:
   every tensor of a bucket is sampled at the same positions, the same way on
   every run and machine). Tensors no larger than the sample are read whole.
3. Candidate pairs: every pair in a bucket of at most ALL_PAIRS_MAX tensors;
   beyond that, bit-sampling LSH for Hamming similarity: 64 bands of 4 sample
   bytes spread over the tensor; tensors whose band bytes are equal share a
   bucket and are linked to the bucket's first tensor. Two tensors agreeing
   on a fraction p of bytes collide in some band with probability
   1 - (1 - p^4)^64 (0.99 for p = 0.5). Work is O(tensors × bands).
4. Greedy star grouping: candidate pairs by decreasing sampled similarity;
   a pair of ungrouped tensors starts a group (centre = the earlier tensor)
   when that saves bytes; a tensor joins an existing group when its mask +
   exceptions (estimated against the centre) cost less than its bytes.
   One pass, never revisited, so it fragments: see ``merge_groups``.
5. Merge pass: largest first, a group or ungrouped tensor joins an earlier
   group at least as large (whose sampled majority stays its default) when
   its members' masks + exceptions there cost less than keeping it on its
   own; candidates from the same banding over the units' sampled defaults.
   O(tensors × sampled bytes) apart from the banding.
6. Each candidate group is re-estimated with the byte-wise majority of the
   samples (the default extract will use) and kept only if it pays: its
   store (default + masks + exceptions, plus MEMBER_OVERHEAD of index and
   padding per member) must be smaller than the plain members, the model
   the user can run without it. zstd -3 of the members is estimated beside
   it and reported (a general-purpose compressor's size, for comparison;
   the runtime cannot run a compressed model): from up to ZSTD_WINDOWS
   windows of ZSTD_WINDOW bytes per member, placed like the samples (by
   size only), each compressed on its own and scaled by nbytes / sampled
   bytes; tensors no larger than that sample are compressed whole. Only
   members of candidate groups are compressed, so the extra I/O is at most
   512 KiB per member. Groups that do not pay stay in ``Plan.dropped``
   with the reason.

The estimate is only an estimate; ``ierun verify dedup`` reports the real
numbers after ``dedup-extract``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zstandard

from iekit.formats import checksums
from iekit.formats.fileio import PreadFiles, iter_range
from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.tensor_entries import expert_slice
from iekit.formats.atomic import StagedFiles, make_dirs, remove_dirs
from iekit.formats.errors import IEError
from iekit.formats.jsonio import dumps_canonical

SAMPLE_BYTES = 4096
RUN_BYTES = 64
MIN_BYTES = 4096  # below this, padding and index entries eat the saving
ALL_PAIRS_MAX = 64
LSH_BANDS = 64
LSH_BAND_BYTES = 4
# Index entry (~450 bytes of JSON) and alignment padding of two regions.
MEMBER_OVERHEAD = 512
# Merge pass: candidate groups a unit is evaluated against, best agreement first.
MERGE_TRIES = 4
# The zstd figure reported beside each group: level 3 (as ``ierun verify dedup``), sampled.
ZSTD_LEVEL = 3
ZSTD_WINDOW = 64 << 10
ZSTD_WINDOWS = 8


def sample_runs(nbytes: int, sample_bytes: int = SAMPLE_BYTES, run: int = RUN_BYTES) -> list[tuple[int, int]]:
    """(start, length) of the sampled runs of an ``nbytes`` tensor, sorted.

    One run per stratum of the tensor, its place in the stratum taken from
    SHAKE-256("iekit-dedup-sample:<nbytes>"), so the positions depend on
    nothing but the size (no RNG library whose stream could change).
    """
    if nbytes <= sample_bytes:
        return [(0, nbytes)]
    nruns = sample_bytes // run
    digest = hashlib.shake_256(f"iekit-dedup-sample:{nbytes}".encode()).digest(8 * nruns)
    span = nbytes - run
    out = []
    for r in range(nruns):
        lo, hi = span * r // nruns, span * (r + 1) // nruns
        u = int.from_bytes(digest[8 * r:8 * r + 8], "little")
        out.append((lo + u % (hi - lo + 1), run))
    return out


def read_samples(paths: list[tuple[Path, int]], runs: list[tuple[int, int]]) -> np.ndarray:
    """Sample matrix (tensors × sampled bytes); one pread per run."""
    total = sum(n for _s, n in runs)
    X = np.empty((len(paths), total), np.uint8)
    with PreadFiles() as files:
        for i, (path, base) in enumerate(paths):
            pos = 0
            for start, n in runs:
                X[i, pos:pos + n] = np.frombuffer(files.read(path, base + start, n), np.uint8)
                pos += n
    return X


def candidate_pairs(X: np.ndarray) -> set[tuple[int, int]]:
    k, S = X.shape
    if k <= ALL_PAIRS_MAX:
        return {(i, j) for i in range(k) for j in range(i + 1, k)}
    stride = max(1, S // LSH_BAND_BYTES)
    pairs: set[tuple[int, int]] = set()
    for b in range(min(LSH_BANDS, stride)):
        cols = [b + t * stride for t in range(LSH_BAND_BYTES) if b + t * stride < S]
        keys = np.zeros(k, np.uint64)
        for c in cols:
            keys = (keys << np.uint64(8)) | X[:, c].astype(np.uint64)
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
        ends = np.r_[starts[1:], k]
        for s, e in zip(starts, ends):
            if e - s > 1:
                first = int(order[s])
                for o in order[s + 1:e]:
                    o = int(o)
                    pairs.add((min(first, o), max(first, o)))
    return pairs


def _mask_bytes(diff: np.ndarray, n: int) -> float:
    """Estimated mask bytes of members whose sampled bytes differ from their
    default where ``diff`` (members × sampled bytes) is set: each member's
    line bits plus a word per 64-byte line holding a difference. The share
    of such lines is the share of sampled runs holding one: a run is
    RUN_BYTES = 64 bytes at a random offset, a line at another phase, with
    the same odds (a tensor sampled whole is cut into lines as stored)."""
    rows, S = diff.shape
    runs = np.pad(diff, ((0, 0), (0, -S % RUN_BYTES))).reshape(rows, -1, RUN_BYTES).any(axis=2)
    return rows * fmt.line_bits_nbytes(n) + 8 * fmt.line_count(n) * float(runs.mean(axis=1).sum())


def _join_saving(X: np.ndarray, u: int, ref: int, n: int) -> float:
    """Bytes saved by storing tensor ``u`` as mask + exceptions against the
    bytes of tensor ``ref`` (sampled)."""
    diff = X[u] != X[ref]
    return n - _mask_bytes(diff[None], n) - float(diff.mean()) * n - MEMBER_OVERHEAD


@dataclass
class PlannedGroup:
    dtype: str
    nbytes: int
    members: list[str]
    estimate: dict[str, Any] = field(default_factory=dict)
    default_member: str | None = None  # the planner always leaves the majority; people may name one
    reason: str | None = None  # why it was dropped: "plain" (see ``verdict``); None when it pays

    @property
    def plain_bytes(self) -> int:
        return len(self.members) * self.nbytes

    @property
    def overhead_bytes(self) -> int:
        """Index entries and alignment padding: not in the blobs that
        ``dedup_bytes`` estimates, but a cost of the store all the same."""
        return len(self.members) * MEMBER_OVERHEAD

    @property
    def store_bytes(self) -> int:
        """What the rule compares: blobs + index and padding."""
        return self.estimate["dedup_bytes"] + self.overhead_bytes

    def explain(self) -> str:
        """One line, the verdict in numbers (ratios are plain / estimate)."""
        e = self.estimate
        dedup = self.plain_bytes / self.store_bytes
        vs_plain = f"{dedup:.2f}x smaller than plain" if dedup >= 1 else f"{1 / dedup:.2f}x larger than plain"
        head = "kept" if self.reason is None else f"dropped ({self.reason})"
        return (f"{head}: exception rate {100 * e['exception_rate']:.1f}% -> dedup {vs_plain}, "
                f"zstd -{ZSTD_LEVEL} {self.plain_bytes / max(1, e['zstd_bytes']):.2f}x")


def verdict(g: PlannedGroup) -> str | None:
    """None when ``g`` pays (its store is smaller than the plain members: the
    model the user can run without it), else "plain". zstd -3 is reported
    beside it, not a bar: the runtime cannot run a zstd-compressed model, so
    losing to zstd left the user with the whole plain model."""
    return "plain" if g.store_bytes >= g.plain_bytes else None


def zstd_sizes(paths: list[tuple[Path, int]], n: int) -> list[int]:
    """Estimated zstd -3 size of each ``n``-byte tensor at (path, offset).

    Windows at fixed positions (``sample_runs`` with ZSTD_WINDOW runs, so
    every run and machine agrees), each compressed on its own and scaled by
    n / sampled bytes; one window (the whole tensor) when n is at most the
    sample. Windows of 64 KiB keep what zstd finds in float and quantized
    weights (entropy of exponents, runs of zeros); what they miss is repeats
    further apart than a window, which can only make the estimate larger
    than zstd of the whole tensor.
    """
    runs = sample_runs(n, ZSTD_WINDOWS * ZSTD_WINDOW, ZSTD_WINDOW)
    sampled = sum(r for _s, r in runs)
    zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    out = []
    with PreadFiles() as files:
        for path, base in paths:
            packed = sum(len(zc.compress(files.read(path, base + s, r))) for s, r in runs)
            out.append(round(packed * n / sampled))
    return out


def group_bucket(X: np.ndarray, n: int, pairs: set[tuple[int, int]]) -> list[list[int]]:
    """Greedy star grouping of one (dtype, nbytes) bucket over its candidate
    ``pairs``; lists of row indices."""
    k = X.shape[0]
    sim_cache: dict[tuple[int, int], float] = {}

    def sim(i: int, j: int) -> float:
        key = (min(i, j), max(i, j))
        if key not in sim_cache:
            sim_cache[key] = float(np.mean(X[key[0]] == X[key[1]]))
        return sim_cache[key]

    edges = sorted(((sim(i, j), i, j) for i, j in pairs), key=lambda e: (-e[0], e[1], e[2]))
    centre: list[int] = []
    members: list[list[int]] = []
    group_of = [-1] * k
    for _p, i, j in edges:
        gi, gj = group_of[i], group_of[j]
        if gi == -1 and gj == -1:
            # A new group stores one default plus two masks: it pays off when
            # the second tensor's saving covers the first one's (empty) mask.
            if _join_saving(X, j, i, n) - fmt.line_bits_nbytes(n) - MEMBER_OVERHEAD > 0:
                group_of[i] = group_of[j] = len(centre)
                centre.append(i)
                members.append([i, j])
        elif (gi == -1) != (gj == -1):
            g, u = (gi, j) if gi != -1 else (gj, i)
            if _join_saving(X, u, centre[g], n) > 0:
                group_of[u] = g
                members[g].append(u)
    return merge_groups(X, members, n)


def _member_costs(X: np.ndarray, rows: list[int], default: np.ndarray, n: int) -> float:
    """Estimated bytes of ``rows`` stored as mask + exceptions against
    ``default`` (sampled), index and padding included."""
    diff = X[rows] != default
    return len(rows) * MEMBER_OVERHEAD + _mask_bytes(diff, n) + np.count_nonzero(diff) / X.shape[1] * n


def merge_groups(X: np.ndarray, groups: list[list[int]], n: int) -> list[list[int]]:
    """Final merge pass of one bucket: a group, or an ungrouped tensor, joins
    a larger group when its members cost fewer bytes there (mask + estimated
    exceptions against that group's sampled majority, which stays) than kept
    on their own (own default + masks + exceptions, or raw bytes).

    The greedy pass never revisits a decision: an edge between two ungrouped
    tensors starts a group even when both would have joined a group formed
    later, and an edge between two groups is skipped. So near-copies whose
    mutual similarity happens to exceed (by sampling noise, or because they
    share changes) their similarity to the family's tensors end up in groups
    of their own, each paying a default. This pass undoes that.

    Units (groups and ungrouped rows) are ordered by size, largest first;
    each unit may only join an earlier, still standing group, so the pass is
    one sweep and no group moves twice. Candidates come from the same
    banding as the tensors (``candidate_pairs`` on the units' sampled
    defaults; the largest unit of a band bucket is its first), ranked by the
    agreement of the two defaults; the best MERGE_TRIES are evaluated exactly
    on the members' samples. Work, with k tensors, u ≤ k units and S sampled
    bytes: majorities O(k·S); banding O(u·bands·log u); ranking O(S) per
    candidate pair (at most u·bands pairs, in practice a few per unit);
    evaluation O(MERGE_TRIES·k·S). Nothing beyond the samples is read.
    """
    k = X.shape[0]
    grouped = {r for g in groups for r in g}
    units = [sorted(g) for g in groups] + [[r] for r in range(k) if r not in grouped]
    if not any(len(u) > 1 for u in units):
        return []
    units.sort(key=lambda u: (-len(u), u[0]))
    defaults = np.stack([fmt.majority(X[u]) for u in units])
    nbrs: dict[int, set[int]] = {}
    for a, b in candidate_pairs(defaults):  # a < b: a is at least as large
        nbrs.setdefault(b, set()).add(a)
    into = list(range(len(units)))  # the standing group a unit joined (itself if none)
    merged = [list(u) for u in units]
    for u in range(1, len(units)):
        targets = {into[t] for t in nbrs.get(u, ())}
        targets = [t for t in targets if len(units[t]) > 1]
        if not targets:
            continue
        rows = units[u]
        alone = float(len(rows) * n)  # raw bytes, or its own group if that is cheaper
        if len(rows) > 1:
            alone = min(alone, n + _member_costs(X, rows, defaults[u], n))
        ranked = sorted(targets, key=lambda t: (-int(np.count_nonzero(defaults[t] == defaults[u])), t))
        best, best_cost = -1, alone
        for t in ranked[:MERGE_TRIES]:
            cost = _member_costs(X, rows, defaults[t], n)
            if cost < best_cost:
                best, best_cost = t, cost
        if best >= 0:
            into[u] = best
            merged[best] += rows
    return [sorted(merged[u]) for u in range(len(units)) if into[u] == u and len(merged[u]) > 1]


def estimate_group(X: np.ndarray, rows: list[int], n: int, zstd_bytes: int) -> dict[str, Any]:
    """Blob bytes of a group with the sampled majority as default (what
    extract writes: default + masks + exceptions), next to ``zstd_bytes``,
    the members' estimated zstd -3 size."""
    S = X.shape[1]
    maj = fmt.majority(X[rows])
    rates = [float(np.mean(X[r] != maj)) for r in rows]
    exc = sum(round(r * n) for r in rates)
    dedup_bytes = n + round(_mask_bytes(X[rows] != maj, n)) + exc
    original = len(rows) * n
    return {"sampled_bytes": S, "exception_rate": round(sum(rates) / len(rates), 6),
            "original_bytes": original, "dedup_bytes": dedup_bytes, "saved_bytes": original - dedup_bytes,
            "zstd_bytes": zstd_bytes}


@dataclass
class Bucket:
    """What the planner saw in one (dtype, nbytes) bucket, for the report:
    how alike its units are, whether or not any group formed."""
    dtype: str
    nbytes: int
    units: int
    first: str
    pairs: int  # candidate pairs (all pairs, or those LSH banding proposed)
    best_agreement: float | None  # the most similar candidate pair's sampled byte agreement
    neighbour_agreement: float  # mean sampled agreement of consecutive units (expert e and e + 1, layer i and i + 1)
    mean_agreement: float  # mean over all pairs of units: the bucket's typical pair

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe_bucket(X: np.ndarray, names: list[str], dtype: str, n: int, pairs: set[tuple[int, int]]) -> Bucket:
    best = max((float(np.mean(X[i] == X[j])) for i, j in pairs), default=None)
    neighbour = float(np.mean(X[1:] == X[:-1]))
    # All k(k-1)/2 pairs in O(k S): at each sampled position, sum n_b(n_b - 1)
    # over the byte values' counts n_b counts the ordered pairs that agree
    # (positions a block at a time: k × 256 counters, whatever S).
    k, S = X.shape
    agree = 0.0
    for c0 in range(0, S, 256):
        cols = X[:, c0:c0 + 256].astype(np.int64) + 256 * np.arange(min(256, S - c0))
        counts = np.bincount(cols.ravel(), minlength=256 * cols.shape[1]).astype(np.float64)
        agree += float((counts * (counts - 1)).sum())
    return Bucket(dtype, n, k, names[0], len(pairs), best, neighbour, agree / (k * (k - 1) * S))


def plan_units(model: iebin.IebinModel, split_experts: bool) -> list[dict[str, Any]]:
    """The byte ranges the planner groups: every tensor in a backing file, or
    with ``split_experts`` each expert ``STACK[e]`` of a 3-D stack in its
    place (tensor_entries.expert_slice), so experts can group with each other and with
    other layers' experts. A packed model's store members are grouped already."""
    units = []
    for t in model.stored:
        if split_experts and len(t["shape"]) == 3 and t["shape"][0] > 1:
            units += [expert_slice(t, e) for e in range(t["shape"][0])]
        else:
            units.append(t)
    return units


def add_expert_ranges(tmap: dict[str, Any], model: iebin.IebinModel, names: list[str]) -> None:
    """Add the grouped expert slices to the tensor map, each with the digest
    of its bytes (read whole here: model.ie.json has only the stack's), so
    extract checks them as it checks any tensor."""
    alg = tmap["checksum"]
    for name in names:
        t = model.expert(name)
        h = checksums.ALGORITHMS[alg].new()
        with open(model.path_of(t), "rb") as f:
            for buf in iter_range(f, t["file_data_offset"], t["nbytes"]):
                h.update(buf)
        tmap["tensors"][name] = {"file": t["file"], "offset": t["file_data_offset"], "nbytes": t["nbytes"],
                                 "dtype": t["dtype"], "shape": t["shape"], alg: h.hexdigest()}


@dataclass
class Plan:
    tensor_map: dict[str, Any]
    groups: list[PlannedGroup]  # the groups that pay: written to groups.indices.json
    dropped: list[PlannedGroup]  # candidate groups that do not pay, with their reason
    tensors: int
    candidates: int  # units in buckets of two or more
    model_bytes: int  # all tensors of model.ie.json
    min_bytes: int = MIN_BYTES
    buckets: list[Bucket] = field(default_factory=list)
    experts: int = 0  # expert slices among the units (0: no stack was split)

    @property
    def model_bytes_after(self) -> int:
        """Estimated model size with the kept groups stored as dedup."""
        return self.model_bytes - sum(g.plain_bytes - g.store_bytes for g in self.groups)

    def groups_json(self) -> dict[str, Any]:
        return {"format": fmt.GROUPS_FORMAT, "version": fmt.VERSION,
                "plan": {"sample_bytes": SAMPLE_BYTES, "run_bytes": RUN_BYTES, "min_bytes": self.min_bytes,
                         "all_pairs_max": ALL_PAIRS_MAX, "lsh_bands": LSH_BANDS, "lsh_band_bytes": LSH_BAND_BYTES},
                "groups": [{"members": g.members, "default_member": g.default_member, "estimate": g.estimate}
                           for g in self.groups]}


def plan(model_dir: Path, min_bytes: int = MIN_BYTES, progress: Callable[[int, int], None] | None = None,
         split_experts: bool = True) -> Plan:
    """Group the tensors of the IEBIN model in ``model_dir`` (with
    ``split_experts``, the experts of its stacks one by one: plan_units)."""
    model = iebin.load_model(model_dir)
    tmap = fmt.tensor_map_from_model(model)
    units = plan_units(model, split_experts)
    order = {t["name"]: i for i, t in enumerate(units)}
    buckets: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for t in units:
        if t["nbytes"] >= max(1, min_bytes):
            buckets.setdefault((t["dtype"], t["nbytes"]), []).append(t)
    buckets = {k: v for k, v in buckets.items() if len(v) > 1}
    total = sum(len(v) for v in buckets.values())
    done = 0
    kept: list[PlannedGroup] = []
    dropped: list[PlannedGroup] = []
    seen: list[Bucket] = []
    for (dtype, n), ts in sorted(buckets.items(), key=lambda kv: order[kv[1][0]["name"]]):
        paths = [(model.path_of(t), t["file_data_offset"]) for t in ts]
        X = read_samples(paths, sample_runs(n))
        pairs = candidate_pairs(X)
        seen.append(describe_bucket(X, [t["name"] for t in ts], dtype, n, pairs))
        for rows in group_bucket(X, n, pairs):
            zstd_bytes = sum(zstd_sizes([paths[r] for r in rows], n))
            g = PlannedGroup(dtype, n, [ts[r]["name"] for r in rows], estimate_group(X, rows, n, zstd_bytes))
            g.reason = verdict(g)
            (kept if g.reason is None else dropped).append(g)
        done += len(ts)
        if progress:
            progress(done, total)
    for gs in (kept, dropped):
        gs.sort(key=lambda g: order[g.members[0]])
    add_expert_ranges(tmap, model, [m for g in kept for m in g.members if "expert" in units[order[m]]])
    return Plan(tmap, kept, dropped, len(model.tensors), total, sum(t["nbytes"] for t in model.tensors), min_bytes,
                seen, sum("expert" in t for t in units))


def write_plan(p: Plan, out_dir: Path, overwrite: bool = False) -> tuple[Path, Path]:
    """tensor_map.json + groups.indices.json, atomically, validated first."""
    names = (fmt.TENSOR_MAP_NAME, fmt.GROUPS_NAME)
    clash = [n for n in names if os.path.lexists(out_dir / n)]
    if clash and not overwrite:
        raise IEError(f"{out_dir}: already holds {', '.join(clash)}; pass --overwrite to replace")
    groups = p.groups_json()
    tm = fmt.validate_tensor_map(p.tensor_map, out_dir / fmt.TENSOR_MAP_NAME)
    fmt.validate_groups(groups, out_dir / fmt.GROUPS_NAME, tm.tensors)
    created = make_dirs(out_dir)  # only now, and removed again if writing fails
    try:
        with StagedFiles(out_dir, replace=overwrite, exclusive=True) as staged:
            staged.write_bytes(fmt.TENSOR_MAP_NAME, dumps_canonical(p.tensor_map))
            staged.write_bytes(fmt.GROUPS_NAME, dumps_canonical(groups))
    except BaseException:
        remove_dirs(created)
        raise
    return out_dir / fmt.TENSOR_MAP_NAME, out_dir / fmt.GROUPS_NAME
