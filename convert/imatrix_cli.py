"""``ieconv imatrix``: an importance matrix from calibration text (formats/imatrix.py).

The collection runs the model's own decoder (runtime/imatrix.py) in f32
activations, chunk by chunk, with a progress bar; the file is checked and
written atomically, never over an existing one without --overwrite.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from iekit.formats import imatrix
from iekit.formats.atomic import check_new_file
from iekit.runtime import evaluation
from iekit.runtime.cpu_topology import physical_cores
from iekit.runtime.eval_cli import load_ids

DEFAULT_CTX = 512


@click.command("imatrix")
@click.option("--model-dir", type=click.Path(path_type=Path), required=True,
              help="IEBIN model to collect on: the float reference (e.g. gguf-to-iebin --dequantize, or hf-to-iebin).")
@click.option("--text-file", type=click.Path(path_type=Path), help="Calibration text (UTF-8), tokenized by the model.")
@click.option("--ids-file", type=click.Path(path_type=Path), help="Calibration token ids instead of text.")
@click.option("-o", "--out", "out_path", type=click.Path(path_type=Path), required=True, help="The imatrix file to write (.npz).")
@click.option("--ctx", type=click.IntRange(min=2), default=DEFAULT_CTX, show_default=True,
              help="Tokens per chunk; each chunk runs as a fresh sequence (the tail shorter than a chunk is left out).")
@click.option("--chunks", type=click.IntRange(min=1), default=None, help="Use only the first N chunks.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Threads (default: the physical cores).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def imatrix_cmd(model_dir, text_file, ids_file, out_path, ctx, chunks, threads, overwrite, quiet):
    """Collect an importance matrix: per input column of every matrix, the mean of x²
    over calibration text, as llama-imatrix does: an importance-weighted
    quantizer weights its error by it (the columns that carry large
    activations matter most). iekit's quantizers do not read it yet.

    Example: ieconv imatrix --model-dir smollm2-f32/ --text-file calib.txt -o imatrix.npz --chunks 40
    """
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.imatrix import collect

    check_new_file(out_path, overwrite)
    threads = threads or physical_cores()
    dec = Decoder(model_dir, threads=threads, ctx=ctx, act="f32")
    ids, what = load_ids(dec, text_file, ids_file)
    parts = evaluation.chunk_ids(ids, ctx, chunks, what)
    used = [t for p in parts for t in p]
    source = {"model_dir": str(model_dir), "calibration": what,
              "ids_sha256": hashlib.sha256(np.asarray(used, "<i4").tobytes()).hexdigest()}
    err = Console(stderr=True)
    with Progress(TextColumn("imatrix"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task("", total=len(parts))
        im = collect(dec, parts, source, lambda i: bar.update(task, advance=1))
    imatrix.write(out_path, im, overwrite=overwrite)
    if not quiet:
        err.print(f"imatrix: {len(im.entries)} matrices, {im.tokens} tokens in {len(parts)} chunks of {ctx} -> {out_path}")
