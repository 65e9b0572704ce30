"""``ieconv dedup-plan``, ``dedup-extract``, ``dedup-link`` (added to ieconv by convert/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from iekit.cli.support import human_bytes, stdout_console

out = stdout_console()
err = Console(stderr=True, highlight=False, soft_wrap=True)


@click.command("dedup-plan")
@click.option("--model-dir", required=True, type=click.Path(path_type=Path), help="IEBIN model directory.")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path), help="Where to write tensor_map.json and groups.indices.json.")
@click.option("--min-bytes", default=4096, show_default=True, help="Ignore tensors smaller than this (index and padding overhead).")
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
def dedup_plan_cmd(model_dir: Path, out_dir: Path, min_bytes: int, overwrite: bool, as_json: bool):
    """Find groups of near-identical tensors (same dtype and size) by sampling.

    Reads 4096 sampled bytes per tensor (fixed positions), pairs candidates
    (all pairs in small buckets, LSH banding in large ones) and groups them
    greedily where mask + exceptions cost less than the tensor. Prints the
    estimated saving per group; `ieconv dedup-extract` makes it real.
    """
    from .dedup_plan import plan, write_plan

    p = plan(model_dir, min_bytes=min_bytes)
    tm_path, gr_path = write_plan(p, out_dir, overwrite)
    orig = sum(g.estimate["original_bytes"] for g in p.groups)
    saved = sum(g.estimate["saved_bytes"] for g in p.groups)
    if as_json:
        click.echo(json.dumps({"tensor_map": str(tm_path), "groups_file": str(gr_path), "tensors": p.tensors,
                               "candidates": p.candidates,
                               "groups": [{"members": g.members, "dtype": g.dtype, "nbytes": g.nbytes, **g.estimate} for g in p.groups],
                               "est_original_bytes": orig, "est_saved_bytes": saved}, sort_keys=True))
        return
    t = Table(title="dedup plan (estimated from samples)")
    for col, just in (("#", "right"), ("first member", "left"), ("members", "right"), ("dtype", "left"),
                      ("bytes each", "right"), ("exc. rate", "right"), ("est. saved", "right")):
        t.add_column(col, justify=just)
    for i, g in enumerate(p.groups):
        t.add_row(str(i), g.members[0], str(len(g.members)), g.dtype, human_bytes(g.nbytes),
                  f"{100 * g.estimate['exception_rate']:.2f}%", human_bytes(g.estimate["saved_bytes"]))
    out.print(t)
    out.print(f"OK {gr_path}: {len(p.groups)} groups of {sum(len(g.members) for g in p.groups)} tensors "
              f"(of {p.tensors}); est. saving {human_bytes(saved)} of {human_bytes(orig)} grouped bytes", markup=False)


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


COMMANDS = (dedup_plan_cmd, dedup_extract_cmd, dedup_link_cmd)
