"""``ierun verify dedup``: prove a dedup artifact reproduces its tensors.

Checks, in order (docs/formats/dedup.md, "Verification"); all of 2-6 run
and every failure is reported:
  1. index: model.dedup.json passes the index rules and the three blobs
     exist inside the model directory with the recorded sizes (else stop);
  2. model: with a model.ie.json, every member is one of its tensors with the
     same dtype, shape, nbytes and digest;
  3. checksums: each blob file's digest and each region's (default, mask,
     exceptions). This is what catches a flipped byte that reconstruction
     never reads: a default byte every member overrides, or padding;
  4. content: each line mask well formed (a word per set line bit, no zero
     word, no bit past the tensor's end) with popcount = exception count,
     zero padding;
  5. loader: the native DedupStore accepts the artifact (its own rules);
  6. reconstruction: every member rebuilt by the runtime kernel (the ISA
     ierun selects) hashes to its recorded digest and, when model.ie.bin
     holds it, equals those bytes.
Verification is always strict: an unusable artifact fails, it never falls
back. IE_DEDUP_CACHE_MB / IE_DEDUP_DEBUG / IE_DEDUP_POLICY apply.

The report compares the dedup bytes with zstd (level 3, each grouped tensor
compressed on its own, the way a loader would) on the same original bytes,
as an honest baseline.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from iekit.cli.support import human_bytes, stdout_console, threads_option
from iekit.formats import checksums
from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.tensor_entries import expert_of
from iekit.formats.errors import IEError
from iekit.formats.fileio import iter_range

from . import cuda
from .dedup import DedupConfig, open_store

ZSTD_LEVEL = 3

out = stdout_console()


@dataclass
class DedupReport:
    model_dir: str
    groups: int = 0
    members: int = 0
    original_bytes: int = 0
    defaults_bytes: int = 0
    masks_bytes: int = 0
    exceptions_bytes: int = 0
    zstd_level: int = ZSTD_LEVEL
    zstd_bytes: int | None = None
    dedup_zstd_bytes: int | None = None
    isa: str = ""
    checks: dict[str, int] = field(default_factory=dict)  # check -> items passed
    failures: list[str] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def dedup_bytes(self) -> int:
        return self.defaults_bytes + self.masks_bytes + self.exceptions_bytes

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, dedup_bytes=self.dedup_bytes,
                 ratio=self.original_bytes / self.dedup_bytes if self.dedup_bytes else None,
                 saved_fraction=1 - self.dedup_bytes / self.original_bytes if self.original_bytes else None,
                 zstd_ratio=self.original_bytes / self.zstd_bytes if self.zstd_bytes else None)
        return d


class _ZstdTotal:
    """Compressed size at ZSTD_LEVEL of each stream on its own (one frame
    per begin/end: a tensor, a blob), fed chunk by chunk and summed."""

    def __init__(self) -> None:
        import zstandard

        self._zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self._c = None
        self.total = 0

    def begin(self) -> None:
        self._c = self._zstd.compressobj()

    def add(self, data) -> None:
        self.total += len(self._c.compress(data))

    def end(self) -> None:
        self.total += len(self._c.flush())
        self._c = None


def verify_dedup(model_dir: Path, *, config: DedupConfig | None = None, zstd: bool = True, threads: int = 0,
                 isa: str = "", device: str = "cpu") -> DedupReport:
    t0 = time.perf_counter()
    config = config if config is not None else DedupConfig.from_env()
    model_dir = Path(model_dir)
    rep = DedupReport(str(model_dir))
    index = fmt.load_index(model_dir)  # 1: raises on the first broken rule
    t = index.totals()
    rep.groups, rep.members, rep.original_bytes = t["groups"], t["members"], t["original_bytes"]
    rep.defaults_bytes, rep.masks_bytes, rep.exceptions_bytes = (t[f"{k}_bytes"] for k in fmt.BLOB_KEYS)
    rep.checks["index"] = 1

    model = None
    if (model_dir / iebin.META_NAME).exists():
        model = iebin.load_model(model_dir)
        try:
            fmt.cross_check(index, model.tensors, model.meta_path, model.checksum)
            rep.checks["model"] = rep.members
        except IEError as e:
            rep.failures.append(str(e))

    problems = fmt.check_blobs(index, deep=True)  # 3 + 4
    rep.failures += [str(e) for e in problems]
    bad_sums = sum(e.field.endswith("." + index.meta["checksum"]) for e in problems)
    rep.checks["checksums"] = 3 + sum(1 + 2 * len(g["members"]) for g in index.groups) - bad_sums
    rep.checks["content"] = max(0, rep.members - (len(problems) - bad_sums))

    try:
        store, _ = open_store(model_dir, cache_mb=config.cache_mb, debug=config.debug, threads=threads, isa=isa,
                              index=index)
    except IEError as e:
        rep.failures.append(f"loader: {e}")
        store = None
    # The members' original bytes, where the model still holds them (a packed
    # model keeps only its digests: the reconstruction is checked against those).
    by_name = {t["name"]: t for t in model.stored} if model else {}
    zc = _ZstdTotal() if zstd else None
    if store is not None:
        rep.checks["loader"] = 1
        rep.isa = "cuda" if device == "cuda" else store.stats()["isa"]
    exact = 0
    # One pass per member: its original bytes (model.ie.bin, else the verified
    # reconstruction) are compared and fed to the zstd baseline chunk by chunk.
    for _g, _j, _grp, m in index.members():
        if store is None:
            data = None
        elif device == "cuda":  # rebuilt by the device kernel from the uploaded blobs
            data = cuda.dedup_reconstruct(store, m["name"])
        else:
            data = store.get(m["name"])
        ok = data is not None
        if ok:
            alg = index.meta["checksum"]
            got = checksums.digest(alg, data)
            ok = got == m[alg]
            if not ok:
                rep.failures.append(f"{index.path}: {m['name']!r}: reconstructed bytes hash to {got[:12]}…, "
                                    f"recorded {m[alg][:12]}…")
        te = by_name.get(m["name"]) or _expert_entry(model, m["name"])
        pos = 0
        if zc is not None and (te is not None or ok):
            zc.begin()
        if te is not None:
            with open(model.path_of(te), "rb") as f:
                for buf in iter_range(f, te["file_data_offset"], te["nbytes"]):
                    if ok and data[pos:pos + len(buf)].tobytes() != buf:
                        ok = False
                        rep.failures.append(f"{index.path}: {m['name']!r}: reconstruction differs from the "
                                            f"model.ie.bin bytes at offset >= {pos}")
                    if zc is not None:
                        zc.add(buf)
                    pos += len(buf)
        elif ok and zc is not None:
            zc.add(data)
        elif zc is not None:
            zc = None  # neither the original nor a verified reconstruction: no honest baseline
        if zc is not None:
            zc.end()
        if ok:
            exact += 1
        del data
    if store is not None:
        rep.checks["reconstruction"] = exact
        rep.cache = store.stats()
        store.clear_cache()
    if zstd:
        rep.zstd_bytes = zc.total if zc is not None else None
        blobs = _ZstdTotal()
        for k in fmt.BLOB_KEYS:
            path = index.blob_path(k)
            blobs.begin()
            with open(path, "rb") as f:
                for buf in iter_range(f, 0, path.stat().st_size):
                    blobs.add(buf)
            blobs.end()
        rep.dedup_zstd_bytes = blobs.total
    rep.seconds = time.perf_counter() - t0
    return rep


def _expert_entry(model: iebin.IebinModel | None, name: str) -> dict[str, Any] | None:
    """The model.ie.bin range of a member that is an expert slice STACK[e],
    or None (no model, another name, or one cross_check already refused)."""
    if model is None or expert_of(name) is None:
        return None
    try:
        return model.expert(name)
    except IEError:
        return None


def _hb(n: int | None) -> str:
    return "—" if n is None else f"{human_bytes(n)} ({n})"


def print_report(rep: DedupReport) -> None:
    t = Table(title=f"ierun verify dedup {rep.model_dir}", show_header=False)
    d = rep.as_json()
    t.add_row("groups", str(rep.groups))
    t.add_row("members", str(rep.members))
    t.add_row("original bytes", _hb(rep.original_bytes))
    t.add_row("defaults + masks + exceptions",
              f"{_hb(rep.defaults_bytes)} + {_hb(rep.masks_bytes)} + {_hb(rep.exceptions_bytes)} = {_hb(rep.dedup_bytes)}")
    t.add_row("dedup ratio", f"{d['ratio']:.3f}x (saves {100 * d['saved_fraction']:.1f}%)" if d["ratio"] else "—")
    if rep.zstd_bytes is not None:
        t.add_row(f"zstd -{rep.zstd_level} alone (per tensor)", f"{_hb(rep.zstd_bytes)}, ratio {d['zstd_ratio']:.3f}x")
    if rep.dedup_zstd_bytes is not None:
        t.add_row(f"zstd -{rep.zstd_level} of the dedup blobs", _hb(rep.dedup_zstd_bytes))
    t.add_row("kernel", rep.isa or "—")
    if rep.cache:
        c = rep.cache
        t.add_row("cache", f"{c['hits']} hits, {c['misses']} misses, {c['evictions']} evictions, {c['bypasses']} bypasses "
                           f"({c['capacity_bytes']} bytes)")
    t.add_row("checks passed", ", ".join(f"{k} {v}" for k, v in rep.checks.items()))
    t.add_row("result", "OK: bit-exact" if rep.ok else f"FAILED ({len(rep.failures)})")
    out.print(t)
    for f in rep.failures:
        out.print(f"  FAIL {f}", markup=False)


@click.command("dedup")
@click.option("--model-dir", required=True, type=click.Path(path_type=Path), help="Model directory holding model.dedup.json (see `ieconv dedup-link`).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
@click.option("--no-zstd", is_flag=True, help="Skip the zstd baseline (it reads and compresses every grouped tensor).")
@threads_option("Reconstruction threads.")
@click.option("--device", type=click.Choice(cuda.DEVICES), default="cpu", show_default=True,
              help="Rebuild the members with this device's kernel (cuda: a `make build-cuda` build and a GPU).")
def dedup_cmd(model_dir: Path, as_json: bool, no_zstd: bool, threads: int, device: str):
    """Rebuild every grouped tensor with the runtime kernel and check it bit for bit.

    Also checks every blob's and region's digest, so a flipped byte in any of
    the three blobs fails even where no member reads it. Exit 0 only when
    every check holds; prints sizes against a zstd -3 baseline.
    """
    if device == "cuda":
        cuda.require("ierun verify dedup")
    rep = verify_dedup(model_dir, zstd=not no_zstd, threads=threads, device=device)
    if as_json:
        click.echo(json.dumps(rep.as_json(), sort_keys=True))
    else:
        print_report(rep)
    if not rep.ok:
        raise IEError(f"verify dedup: {len(rep.failures)} check(s) failed; first: {rep.failures[0]}")
