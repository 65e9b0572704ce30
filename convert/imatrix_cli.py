"""``ieconv imatrix``: an importance matrix from calibration text (formats/imatrix.py),
and what `ieconv validate` / `inspect` show of an imatrix file.

The collection runs the model's own decoder (runtime/imatrix.py) in f32
activations, chunk by chunk, with a progress bar; the file is checked and
written atomically, never over an existing one without --overwrite.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import click
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from iekit.cli.support import stderr_console, stdout_console, threads_option
from iekit.formats import imatrix
from iekit.formats.atomic import check_new_file
from iekit.formats.errors import IEError
from iekit.formats.gguf_file import is_gguf_file

from .gguf_names import arch_of, importance_to_gguf

DEFAULT_CTX = 512


def _model_dir(ctx, param, value):
    """ierun's --model-dir callback (a GGUF becomes its import), imported
    when the command runs: ieconv starts without the runtime."""
    from iekit.runtime.gguf_models import model_dir_option

    return model_dir_option(ctx, param, value)


@click.command("imatrix")
@click.option("-m", "--model-dir", required=True, callback=_model_dir, type=click.Path(path_type=Path),
              help="IEBIN model to collect on: the float reference (e.g. hf-to-iebin, or gguf-to-iebin --dequantize), "
                   "or a .gguf as llama-imatrix takes it (imported once, cached; run with f32 activations).")
@click.option("-f", "--text-file", type=click.Path(path_type=Path),
              help="Calibration text (UTF-8), tokenized by the model (llama-imatrix's -f).")
@click.option("--ids-file", type=click.Path(path_type=Path), help="Calibration token ids instead of text.")
@click.option("-o", "--out", "out_path", type=click.Path(path_type=Path), required=True,
              help="The imatrix file to write: ours (.npz), or llama.cpp's GGUF imatrix when it ends in .gguf "
                   "(or with --output-format gguf).")
@click.option("--output-format", type=click.Choice(["npz", "gguf"]), default=None,
              help="npz: ours (every ieconv command reads it); gguf: llama.cpp's GGUF imatrix under its tensor names, "
                   "as llama-imatrix writes it, for llama-quantize --imatrix (ieconv reads it too). "
                   "[default: gguf for a .gguf file name, else npz]")
@click.option("--in-file", type=click.Path(path_type=Path),
              help="Collect nothing: write this .npz of ours (made on this model) as llama.cpp's GGUF imatrix, as "
                   "llama-imatrix --in-file converts its .dat. The .npz keeps no per-expert row counts: each "
                   "expert's count is the tokens (its means, all llama-quantize uses, are kept).")
@click.option("--ctx", type=click.IntRange(min=2), default=DEFAULT_CTX, show_default=True,
              help="Tokens per chunk; each chunk runs as a fresh sequence (the tail shorter than a chunk is left out).")
@click.option("--chunks", type=click.IntRange(min=1), default=None, help="Use only the first N chunks.")
@threads_option("Threads.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def imatrix_cmd(model_dir, text_file, ids_file, out_path, output_format, in_file, ctx, chunks, threads, overwrite,
                quiet):
    """Collect an importance matrix: per input column of every matrix, the mean of x²
    over calibration text, as llama-imatrix does: an importance-weighted
    quantizer weights its error by it (the columns that carry large
    activations matter most): pass it to q4-manifest, hf-to-iebin or
    gguf-to-iebin as --imatrix. Written as llama.cpp's GGUF imatrix (-o
    NAME.gguf) it is llama-quantize's --imatrix too.

    Example: ieconv imatrix --model-dir smollm2-f32/ --text-file calib.txt -o imatrix.npz --chunks 40
    (or as llama-imatrix: ieconv imatrix -m model.gguf -f calib.txt -o imatrix.gguf, then
    llama-quantize --imatrix imatrix.gguf model.gguf out.gguf Q4_K_M)
    """
    # The runtime (the native extension included) only when a model runs: every other ieconv command starts without it.
    from iekit.runtime.calibration import calibration_chunks, float_decoder
    from iekit.runtime.imatrix import collect

    check_new_file(out_path, overwrite)
    fmt = output_format or ("gguf" if out_path.suffix == ".gguf" else "npz")
    if in_file is not None:
        _convert(model_dir, in_file, out_path, fmt, text_file or ids_file, overwrite, quiet)
        return
    dec = float_decoder(model_dir, threads=threads, ctx=ctx)
    arch = arch_of(dec.model.meta, dec.model.meta_path) if fmt == "gguf" else None  # refused before the run, not after it
    parts, what = calibration_chunks(dec, text_file, ids_file, chunks)
    used = [t for p in parts for t in p]
    source = {"model_dir": str(model_dir), "calibration": what,
              "ids_sha256": hashlib.sha256(np.asarray(used, "<i4").tobytes()).hexdigest()}
    err = stderr_console()
    with Progress(TextColumn("imatrix"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task("", total=len(parts))
        im, warnings = collect(dec, parts, source, lambda i: bar.update(task, advance=1))
    if arch is None:
        imatrix.write(out_path, im, overwrite=overwrite)
    else:
        entries = importance_to_gguf(im.entries, im.routed, im.tokens, arch, str(out_path))
        imatrix.write_llamacpp_gguf(out_path, entries, arch=arch.gguf, datasets=[_dataset(what)], chunk_count=len(parts),
                                    chunk_size=dec.max_ctx, overwrite=overwrite)
    for w in warnings:
        err.print(f"warning: {w}", markup=False)
    if not quiet:
        kind = "" if arch is None else " (llama.cpp's GGUF imatrix, for llama-quantize --imatrix)"
        err.print(f"imatrix: {len(im.entries)} matrices, {im.tokens} tokens in {len(parts)} chunks of {dec.max_ctx} "
                  f"-> {out_path}{kind}", markup=False)


def _dataset(calibration: str) -> str:
    """The calibration file as given ("--text-file calib.txt" -> "calib.txt"): what llama-imatrix records of its -f."""
    flag, _, path = calibration.partition(" ")
    return path if flag in ("--text-file", "--ids-file") else calibration


def _convert(model_dir: Path, in_file: Path, out_path: Path, fmt: str, calibration: Path | None, overwrite: bool,
             quiet: bool) -> None:
    """--in-file: our .npz, checked against the model's matrices, as llama.cpp's GGUF imatrix."""
    from iekit.formats import iebin

    if fmt != "gguf":
        raise click.UsageError("--in-file writes llama.cpp's GGUF imatrix: -o NAME.gguf (or --output-format gguf)")
    if calibration is not None:
        raise click.UsageError(f"--in-file converts a collected imatrix; {calibration} would not be read")
    im = imatrix.read_any(in_file)
    if im.meta["format"] in imatrix.LLAMACPP_FORMATS:
        raise IEError(f"{in_file}: already llama.cpp's imatrix: llama-quantize takes it as it is (llama-imatrix "
                      "--in-file x.dat -o x.gguf converts a .dat)")
    model = iebin.load_model(model_dir)
    arch = arch_of(model.meta, model.meta_path)
    shapes = {t["name"]: t["shape"] for t in model.tensors}
    stray = sorted(set(im.entries) - set(shapes))
    if stray:
        raise IEError(f"{in_file}: {stray[0]}: not a matrix of {model_dir} ({len(stray)} such entries; the imatrix "
                      "of another model?)")
    imatrix.select_for(im, {n: shapes[n] for n in im.entries}, str(in_file))  # columns and experts
    entries = importance_to_gguf(im.entries, {}, im.tokens, arch, str(in_file))
    imatrix.write_llamacpp_gguf(out_path, entries, arch=arch.gguf, datasets=[_dataset(im.meta["source"].get("calibration", ""))],
                                chunk_count=im.meta["chunks"], chunk_size=im.meta["ctx"], overwrite=overwrite)
    if not quiet:
        stderr_console().print(f"imatrix: {len(entries)} llama.cpp entries from {in_file} -> {out_path}", markup=False)


def is_imatrix_path(path: Path) -> bool:
    """What `ieconv validate` and `inspect` hand to this module: ours (.npz) or
    llama.cpp's (a GGUF by its magic, whatever its name; legacy .dat), after
    a GGUF model has been told apart (its general.type)."""
    return path.suffix in (".npz", ".dat", ".gguf") or is_gguf_file(path)


def validate_imatrix(path: Path) -> None:
    im = imatrix.read_any(path)
    if im.meta["format"] == imatrix.LLAMACPP_LEGACY:
        chunks = f", {im.meta['chunks']} chunks" if im.meta["chunks"] is not None else ""
        stdout_console().print(f"OK {path}: llama.cpp legacy importance matrix, {len(im.entries)} matrices{chunks}",
                               markup=False)
        return
    if im.meta["format"] == imatrix.LLAMACPP_GGUF:
        stdout_console().print(f"OK {path}: llama.cpp GGUF importance matrix, {len(im.entries)} matrices, "
                               f"{im.tokens} tokens in {im.meta['chunks']} chunks of {im.meta['ctx']}", markup=False)
        return
    stdout_console().print(f"OK {path}: importance matrix v{im.meta['version']}, {len(im.entries)} matrices, "
                           f"{im.tokens} tokens in {im.meta['chunks']} chunks", markup=False)


def inspect_imatrix(path: Path, as_json: bool) -> None:
    """Per matrix: columns, mean and max importance, and the share of the sum held by its top 1% of
    columns (how concentrated the activations are: what an importance-weighted quantizer exploits)."""
    im = imatrix.read_any(path)
    rows = []
    for name in sorted(im.entries):
        a = im.entries[name].astype(np.float64)
        k = max(1, a.size // 100)
        top = np.sort(a)[-k:].sum() / a.sum() if a.sum() > 0 else 0.0
        n = im.routed.get(name)
        rows.append({"name": name, "cols": int(a.shape[-1]), "experts": int(a.shape[0]) if a.ndim == 2 else None,
                     "mean": float(a.mean()), "max": float(a.max()), "top1pct_share": float(top),
                     "routed": None if n is None else [int(x) for x in np.atleast_1d(n)]})
    if as_json:
        click.echo(json.dumps({"path": str(path), "meta": im.meta, "matrices": rows}, sort_keys=True))
        return
    con = stdout_console()
    summary = Table(title=str(path), show_header=False)
    for key in ("format", "tokens", "chunks", "ctx", "dataset"):
        if im.meta.get(key) is not None:
            summary.add_row(key, str(im.meta[key]))
    for key, v in sorted(im.meta.get("source", {}).items()):
        summary.add_row(f"source {key}", str(v))
    con.print(summary)
    table = Table(title="matrices (importance = mean x² of the input column)")
    routed = any(r["routed"] for r in rows)
    cols = (("name", "left"), ("cols", "right"), ("experts", "right"), ("mean", "right"), ("max", "right"),
            ("top 1% of columns hold", "right")) + ((("rows per expert", "right"),) if routed else ())
    for col, just in cols:
        table.add_column(col, justify=just)
    for r in rows:
        table.add_row(r["name"], str(r["cols"]), "" if r["experts"] is None else str(r["experts"]), f"{r['mean']:.4g}",
                      f"{r['max']:.4g}", f"{100 * r['top1pct_share']:.1f}%", *([_routing(r["routed"])] if routed else []))
    con.print(table)
    unrouted = sum(n == 0 for r in rows for n in r["routed"] or [])
    if unrouted:
        con.print(f"{unrouted} expert entries got no calibration row: quantizers weight them evenly "
                  "(more calibration text routes to more experts)", markup=False)


def _routing(n: list[int] | None) -> str:
    """How evenly the calibration reached a stack's experts: the fewest and most rows, and how many got none."""
    if not n:
        return ""
    none = sum(x == 0 for x in n)
    return f"{min(n)}–{max(n)}" + (f", {none} none" if none else "")
