"""``ieconv dedup-plan``, ``dedup-extract``, ``dedup-link`` (added to ieconv by convert/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from iekit.cli.support import human_bytes, stderr_console, stdout_console

out = stdout_console()
err = stderr_console()


def is_dedup_index_path(path: Path) -> bool:
    """What `ieconv validate` and `inspect` hand to this module: a dedup index."""
    return path.name.endswith(".dedup.json")


def _index_with_model(path: Path, deep: bool):
    """The index, cross-checked against the model.ie.json beside it, if any."""
    from iekit.formats import dedup as fmt
    from iekit.formats import iebin

    idx = fmt.load_index(path, deep=deep)
    meta_path = idx.dir / iebin.META_NAME
    model = iebin.load_model(idx.dir) if meta_path.exists() else None
    if model is not None:
        fmt.cross_check(idx, model.tensors, model.meta_path, model.checksum)
    return idx, model


def validate_dedup_index(path: Path, deep: bool) -> None:
    idx, model = _index_with_model(path, deep)
    t = idx.totals()
    checked = ", region checksums and masks verified" if deep else ""
    against = f", members match {model.meta_path.name}" if model else ""
    out.print(f"OK {idx.path}: dedup index v{idx.meta['version']}, {t['groups']} groups, {t['members']} tensors, "
              f"{human_bytes(t['original_bytes'])} stored as {human_bytes(t['stored_bytes'])}{against}{checked}", markup=False)


def inspect_dedup_index(path: Path, as_json: bool) -> None:
    idx, _model = _index_with_model(path, False)
    rows = [{"group": g, "dtype": grp["dtype"], "nbytes": grp["nbytes"], "members": len(grp["members"]),
             "first": grp["members"][0]["name"], "exceptions": sum(m["exceptions"]["count"] for m in grp["members"])}
            for g, grp in enumerate(idx.groups)]
    t = idx.totals()
    if as_json:
        click.echo(json.dumps({"path": str(idx.path), "format": idx.meta["format"], "checksum": idx.meta["checksum"],
                               **t, "groups": rows}, sort_keys=True))
        return
    table = Table(title=f"{idx.path}")
    for col, just in (("#", "right"), ("first member", "left"), ("members", "right"), ("dtype", "left"),
                      ("bytes each", "right"), ("exc. rate", "right")):
        table.add_column(col, justify=just)
    for r in rows:
        table.add_row(str(r["group"]), r["first"], str(r["members"]), r["dtype"], human_bytes(r["nbytes"]),
                      f"{100 * r['exceptions'] / (r['nbytes'] * r['members']):.2f}%")
    out.print(table)
    out.print(f"{t['members']} tensors, {human_bytes(t['original_bytes'])} -> {human_bytes(t['defaults_bytes'])} "
              f"defaults + {human_bytes(t['masks_bytes'])} masks + {human_bytes(t['exceptions_bytes'])} exceptions "
              f"= {human_bytes(t['stored_bytes'])}", markup=False)


@click.command("dedup-plan")
@click.option("--model-dir", required=True, type=click.Path(path_type=Path), help="IEBIN model directory.")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path), help="Where to write tensor_map.json and groups.indices.json.")
@click.option("--min-bytes", default=4096, show_default=True, help="Ignore tensors smaller than this (index and padding overhead).")
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--explain", is_flag=True, help="One line per candidate group, kept or dropped, with the numbers behind the verdict.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
@click.option("--whole-stacks", is_flag=True,
              help="Group expert stacks [experts, rows, cols] as whole tensors instead of expert by expert "
                   "(what dedup-pack stores).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def dedup_plan_cmd(model_dir: Path, out_dir: Path, min_bytes: int, overwrite: bool, explain: bool, as_json: bool,
                   whole_stacks: bool, quiet: bool):
    """Find groups of near-identical tensors (same dtype and size) by sampling.

    Reads 4096 sampled bytes per tensor (fixed positions), pairs candidates
    (all pairs in small buckets, LSH banding in large ones) and groups them
    greedily where mask + exceptions cost less than the tensor. Each expert
    of a stack [experts, rows, cols] is a unit of its own, named STACK[e],
    so experts group with each other and across layers. The buckets table
    says how alike each bucket's units are: the sampled byte agreement of
    the closest candidate pair, of neighbours (expert e and e + 1), and the
    mean over all pairs.

    A group is kept only if it pays: its estimated store (default + masks +
    exceptions + ~512 bytes of index and padding per member) must be smaller
    than the plain members, the model you can run without it. zstd -3 of the
    members (estimated from up to 8 windows of 64 KiB per member) is shown
    beside it for comparison only: the runtime cannot run a compressed
    model. --explain says why each group is kept or dropped. When no group
    pays, the plan is written with no groups. `ieconv dedup-extract` makes
    the plan real.
    """
    from .dedup_plan import plan, write_plan

    with Progress(TextColumn("dedup-plan sampling"), BarColumn(), MofNCompleteColumn(), TextColumn("tensors"),
                  console=err, disable=quiet or as_json, transient=True) as bar:
        task = bar.add_task("sample", total=None)
        p = plan(model_dir, min_bytes=min_bytes, progress=lambda done, total: bar.update(task, completed=done, total=total),
                 split_experts=not whole_stacks)
    plain = sum(g.plain_bytes for g in p.groups)
    store = sum(g.store_bytes for g in p.groups)
    if as_json:
        tm_path, gr_path = write_plan(p, out_dir, overwrite)

        def row(g):
            return {"members": g.members, "dtype": g.dtype, "nbytes": g.nbytes, **g.estimate,
                    "plain_bytes": g.plain_bytes, "overhead_bytes": g.overhead_bytes, "store_bytes": g.store_bytes,
                    "verdict": "kept" if g.reason is None else "dropped", "reason": g.reason, "explain": g.explain()}
        click.echo(json.dumps({"tensor_map": str(tm_path), "groups_file": str(gr_path), "tensors": p.tensors,
                               "candidates": p.candidates, "experts": p.experts,
                               "buckets": [b.as_json() for b in p.buckets],
                               "groups": [row(g) for g in p.groups], "dropped": [row(g) for g in p.dropped],
                               "est_original_bytes": plain, "est_saved_bytes": sum(g.estimate["saved_bytes"] for g in p.groups),
                               "est_store_bytes": store, "est_model_bytes_before": p.model_bytes,
                               "est_model_bytes_after": p.model_bytes_after}, sort_keys=True))
        return
    if p.buckets:
        bt = Table(title=f"buckets of equal dtype and size ({p.experts} expert slices among the units)" if p.experts
                   else "buckets of equal dtype and size")
        for col in ("first unit", "units", "dtype", "bytes each", "pairs", "closest pair", "neighbours", "all pairs"):
            bt.add_column(col, justify="left" if col in ("first unit", "dtype") else "right")
        pct = "{:.2%}".format
        for b in p.buckets:
            bt.add_row(b.first, str(b.units), b.dtype, human_bytes(b.nbytes), str(b.pairs),
                       "-" if b.best_agreement is None else pct(b.best_agreement), pct(b.neighbour_agreement),
                       pct(b.mean_agreement))
        out.print(bt)
    candidates = p.groups + p.dropped  # kept first
    t = Table(title="dedup plan (estimated from samples)")
    for col, just in (("#", "right"), ("first member", "left"), ("members", "right"), ("dtype", "left"),
                      ("bytes each", "right"), ("exc. rate", "right"), ("plain", "right"), ("zstd -3 (est.)", "right"),
                      ("dedup (est.)", "right"), ("verdict", "left")):
        t.add_column(col, justify=just)
    for i, g in enumerate(candidates):
        t.add_row(str(i), g.members[0], str(len(g.members)), g.dtype, human_bytes(g.nbytes),
                  f"{100 * g.estimate['exception_rate']:.2f}%", human_bytes(g.plain_bytes),
                  human_bytes(g.estimate["zstd_bytes"]), human_bytes(g.store_bytes),
                  "pays" if g.reason is None else f"dropped ({g.reason})")
    if candidates:
        out.print(t)
    if explain:
        for i, g in enumerate(candidates):
            out.print(f"#{i} {g.members[0]} (+{len(g.members) - 1}, {g.dtype}, {human_bytes(g.nbytes)} each): {g.explain()}",
                      markup=False)
    if p.groups:
        out.print(f"plan: {sum(len(g.members) for g in p.groups)} tensors in {len(p.groups)} groups, {human_bytes(plain)} plain -> "
                  f"{human_bytes(store)} dedup (est., {plain / store:.2f}x); model {human_bytes(p.model_bytes)} -> "
                  f"{human_bytes(p.model_bytes_after)} (est.)", markup=False)
    elif p.dropped:
        best = min(p.dropped, key=lambda g: g.store_bytes / g.plain_bytes)
        out.print(f"no group pays: best candidate {best.members[0]} (+{len(best.members) - 1}, {human_bytes(best.nbytes)} each): "
                  f"{best.explain()}", markup=False)
    else:
        out.print(f"no group pays: no candidate group among {p.candidates} tensors of equal dtype and size", markup=False)
    tm_path, gr_path = write_plan(p, out_dir, overwrite)
    out.print(f"OK {gr_path}: {len(p.groups)} groups of {sum(len(g.members) for g in p.groups)} tensors "
              f"(of {p.tensors}); {len(p.dropped)} candidate groups dropped", markup=False)


@click.command("dedup-extract")
@click.option("--model-dir", required=True, type=click.Path(path_type=Path), help="Directory the tensor map's file paths are relative to.")
@click.option("--tensor-map", required=True, type=click.Path(path_type=Path, dir_okay=False), help="tensor_map.json (from dedup-plan).")
@click.option("--groups", "groups_path", required=True, type=click.Path(path_type=Path, dir_okay=False), help="groups.indices.json (from dedup-plan, or hand-written).")
@click.option("--out-prefix", required=True, type=click.Path(path_type=Path), help="Output path stem: PREFIX.defaults.bin, .masks.bin, .exceptions.bin, .dedup.json.")
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def dedup_extract_cmd(model_dir, tensor_map, groups_path, out_prefix, overwrite, as_json, quiet):
    """Write the defaults, masks and exceptions blobs and their index.

    Streams group by group (memory: one default plus one chunk per member),
    checks every member's digest against the tensor map while reading, and
    writes atomically (index last). Then: `ieconv dedup-link MODEL_DIR`.
    """
    from .dedup_extract import extract
    from iekit.formats.dedup import load_groups, load_tensor_map

    tm = load_tensor_map(tensor_map).tensors
    total = sum(tm[m].nbytes for g in load_groups(groups_path, tm) for m in g.members)
    with Progress(TextColumn("extract"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err,
                  disable=quiet or as_json, transient=True) as bar:
        task = bar.add_task("extract", total=total)
        res = extract(model_dir, tensor_map, groups_path, out_prefix, overwrite,
                      progress=lambda n: bar.advance(task, n))
    summary = {"index": str(res.index_path), "groups": res.groups, "members": res.members,
               "original_bytes": res.original_bytes, **{f"{k}_bytes": v for k, v in res.blob_bytes.items()},
               "dedup_bytes": res.dedup_bytes, "seconds": res.seconds}
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    b = res.blob_bytes
    ratio = res.original_bytes / res.dedup_bytes if res.dedup_bytes else float("nan")
    out.print(f"OK {res.index_path}: {res.groups} groups, {res.members} tensors, {human_bytes(res.original_bytes)} -> "
              f"{human_bytes(b['defaults'])} defaults + {human_bytes(b['masks'])} masks + {human_bytes(b['exceptions'])} exceptions "
              f"= {human_bytes(res.dedup_bytes)} ({ratio:.2f}x) in {res.seconds:.2f} s", markup=False)


@click.command("dedup-link")
@click.argument("model_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--index", "index_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The *.dedup.json to link (default: MODEL_DIR/dedup_out/model.dedup.json, or the only one in a subdirectory).")
@click.option("--overwrite", is_flag=True, help="Replace regular files that are in the way (existing links are always replaced).")
def dedup_link_cmd(model_dir: Path, index_path: Path | None, overwrite: bool):
    """Link a dedup artifact into MODEL_DIR, where IE_DEDUP=1 looks for it.

    Creates relative symlinks model.dedup.json and the three blobs (names as
    the index records them), checks they stay inside MODEL_DIR and that the
    index then loads through them.
    """
    from .dedup_link import link

    for dest, rel in link(model_dir, index_path, overwrite):
        out.print(f"{dest} -> {rel}", markup=False)
    out.print(f"OK {model_dir}: dedup artifact linked (IE_DEDUP=1 ierun verify dedup --model-dir {model_dir})", markup=False)


@click.command("dedup-pack")
@click.option("--model-dir", required=True, type=click.Path(path_type=Path, file_okay=False), help="The plain IEBIN model directory (read only).")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path, file_okay=False), help="Where to write the packed model (a new directory, or one without its files).")
@click.option("--tensor-map", type=click.Path(path_type=Path, dir_okay=False), help="tensor_map.json from dedup-plan (with --groups; default: plan now).")
@click.option("--groups", "groups_path", type=click.Path(path_type=Path, dir_okay=False), help="groups.indices.json from dedup-plan, or hand-written (with --tensor-map).")
@click.option("--min-bytes", default=4096, show_default=True, help="When planning now: ignore tensors smaller than this.")
@click.option("--overwrite", is_flag=True, help="Replace the packed model's files where OUT_DIR already holds them.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def dedup_pack_cmd(model_dir, out_dir, tensor_map, groups_path, min_bytes, overwrite, as_json, quiet):
    """Write a deduplicated model directory that is smaller than the plain one.

    Grouped tensors are stored once as their group's default plus a mask and
    exceptions per tensor (model.dedup.json + model.defaults.bin,
    model.masks.bin, model.exceptions.bin); model.ie.bin keeps only the other
    tensors, and the grouped tensors' entries in model.ie.json say
    "store": "dedup". ierun runs it directly (the store is required; with
    IE_DEDUP_CACHE_MB=0 each product rebuilds a few rows at a time where
    it reads them, so no tensor is ever held whole), and `ieconv validate --deep` and
    `ierun verify dedup` prove every tensor bit for bit.

    Without --tensor-map/--groups the plan is made here, as dedup-plan would
    (only groups that pay). Nothing is written when no group pays.
    """
    from iekit.formats import dedup as fmt

    from .dedup_pack import pack

    if (tensor_map is None) != (groups_path is None):
        raise click.UsageError("--tensor-map and --groups go together (or neither: plan now)")
    if tensor_map is not None:
        tm = fmt.load_tensor_map(tensor_map)
        groups = fmt.load_groups(groups_path, tm.tensors)
        label = tensor_map
    else:
        from .dedup_plan import plan

        p = plan(model_dir, min_bytes=min_bytes, split_experts=False)  # a packed model stores whole tensors
        label = model_dir / fmt.TENSOR_MAP_NAME  # (not written: the plan made here)
        tm = fmt.validate_tensor_map(p.tensor_map, label)
        groups = fmt.validate_groups(p.groups_json(), model_dir / fmt.GROUPS_NAME, tm.tensors)
    total = sum(t.nbytes for t in tm.tensors.values())
    with Progress(TextColumn("pack"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err,
                  disable=quiet or as_json, transient=True) as bar:
        task = bar.add_task("pack", total=total)
        res = pack(model_dir, out_dir, tm, groups, label, overwrite, progress=lambda n: bar.advance(task, n))
    summary = {"out_dir": str(res.out_dir), "groups": res.groups, "members": res.members,
               "plain_bytes": res.plain_bytes, "packed_bytes": res.packed_bytes, "store_bytes": res.store_bytes,
               "ratio": res.packed_bytes / res.plain_bytes, "seconds": res.seconds}
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    out.print(f"OK {res.out_dir}: {res.groups} groups of {res.members} tensors in the dedup store; "
              f"{human_bytes(res.plain_bytes)} -> {human_bytes(res.packed_bytes)} "
              f"({res.packed_bytes / res.plain_bytes:.2f}x of the plain model, store {human_bytes(res.store_bytes)}) "
              f"in {res.seconds:.2f} s", markup=False)


COMMANDS = (dedup_plan_cmd, dedup_extract_cmd, dedup_link_cmd, dedup_pack_cmd)
