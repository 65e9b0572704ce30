"""``ieconv gptq``: hf-to-iebin --q4-map with error-compensated quantization.

Per matrix, the input covariance E[x xᵀ] is collected by running the float
model (--ref-dir) over calibration text (runtime/hessians.py), and each
scale block's rounding error is cancelled as far as the remaining columns
allow (formats/gptq.py). The artifact is an ordinary IEBIN model: the same
schemes and bytes per weight as the manifest says, only better codes.
"""

from __future__ import annotations

from pathlib import Path

import click

from iekit.cli.support import human_bytes, threads_option
from iekit.formats import expert_stacks, fingerprints, gptq, hf_checkpoint, iebin
from iekit.formats.errors import IEError
from iekit.formats.gptq_partial import PartialRun
from iekit.formats.q4_manifest import load_manifest, plan
from iekit.formats.workers import one_blas_thread

from .conversion_output import convert_progress, err, report_conversion
from .artifact_out import natural_key
from .hf_to_iebin import convert

# 32 x 512 tokens: on the widened SmolLM2 at 4.0 bits (1536-wide down_proj inputs, q2_k/q3_k fitted 32 columns at
# a time) 16 chunks left KL 0.096, 32 gave 0.081 and 64 no better (docs/quality.md); wider models want more.
DEFAULT_CHUNKS = 32
MEMORY_BUDGET = 1 << 30  # bytes of covariances held at once (float64, n² per matrix input)


def calibration_options(f):
    """The calibration text the input covariances come from (--text-file or
    --ids-file, --ctx, --chunks): ieconv gptq's, and q4-manifest --ref-dir's,
    which must see the same covariances to predict gptq's errors."""
    for opt in reversed([
            click.option("--text-file", type=click.Path(path_type=Path), help="Calibration text (UTF-8), tokenized by the model."),
            click.option("--ids-file", type=click.Path(path_type=Path), help="Calibration token ids instead of text."),
            click.option("--ctx", type=click.IntRange(min=4), default=None,
                         help="Tokens per chunk, each a fresh sequence [512, or the model's max_position_embeddings "
                              "if smaller]."),
            click.option("--chunks", type=click.IntRange(min=1), default=DEFAULT_CHUNKS, show_default=True,
                         help="Calibration chunks (more tokens: better-conditioned covariances, a longer pass).")]):
        f = opt(f)
    return f


def calibration(hf_shapes: dict[str, list[int]], ref_dir: Path, order: list[str], text_file: Path | None,
                ids_file: Path | None, chunks: int, ctx: int | None, threads: int):
    """(the float artifact ``ref_dir`` loaded, the calibration chunks, where
    they came from), after checking that it is the checkpoint whose shapes
    are ``hf_shapes``."""
    # The runtime (the native extension included) only when a model runs: every other ieconv command starts without it.
    from iekit.runtime.calibration import calibration_chunks, float_decoder

    ref = float_decoder(ref_dir, threads=threads, ctx=ctx)
    ref_shapes = {t["name"]: t["shape"] for t in ref.model.tensors}
    for name in order:
        if ref_shapes.get(name, hf_shapes[name]) != hf_shapes[name]:
            raise IEError(f"{ref_dir}: {name} is {ref_shapes[name]}, the checkpoint has {hf_shapes[name]}: "
                          "--ref-dir must be this checkpoint's float artifact")
    parts, what = calibration_chunks(ref, text_file, ids_file, chunks)
    return ref, parts, what


def run_inputs(src: hf_checkpoint.HFSource, ref_dir: Path, q4_map: Path, parts: list[list[int]], sequential: bool,
               force: bool, refit_scales: bool) -> dict[str, object]:
    """What a gptq run's codes depend on, as fingerprints (formats/gptq_partial.py):
    a resumed run must match every one: the checkpoint and the float artifact
    as their fingerprints take them, the rest by content."""
    return {"checkpoint": fingerprints.checkpoint(src),
            "ref_dir": fingerprints.artifact(ref_dir),
            "q4_map": fingerprints.small_file(q4_map),
            "calibration": fingerprints.token_chunks(parts),
            "sequential": sequential, "force": force, "refit_scales": refit_scales}


@click.command("gptq")
@click.option("--hf-dir", type=click.Path(path_type=Path), required=True, help="HF model directory (the float weights).")
@click.option("--ref-dir", type=click.Path(path_type=Path), required=True,
              help="Its float IEBIN artifact (hf-to-iebin without --q4-map): run over the text to collect covariances.")
@click.option("--q4-map", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="q4_manifest.json selecting the tensors and schemes (ieconv q4-manifest, --target-bpw included).")
@click.option("--out-dir", type=click.Path(path_type=Path), required=True, help="Output directory for the artifact.")
@calibration_options
@click.option("--sequential/--no-sequential", default=False, show_default=True,
              help="Take each layer's covariances from the model with the layers before it already quantized "
                   "(one calibration pass per layer instead of one in all).")
@click.option("--refit-scales/--no-refit-scales", default=gptq.REFIT_SCALES, show_default=True,
              help="Once a matrix's codes are final, refit its scales (and mins; a k-quant's or i-quant's "
                   "sub-block scales too) to less output error under the covariance, codes held: the same bytes "
                   "per weight, about 10% less KL on SmolLM2.")
@threads_option("Threads.")
@click.option("--force", is_flag=True, help="Also quantize embeddings/norms the manifest selects.")
@click.option("--overwrite", is_flag=True, help="Replace the artifact in --out-dir as a whole (as hf-to-iebin --overwrite).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Take the matrices an interrupted run of the same inputs kept in OUT_DIR/.gptq-partial instead "
                   "of quantizing them again; --no-resume discards them.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def gptq_cmd(hf_dir, ref_dir, q4_map, out_dir, text_file, ids_file, ctx, chunks, sequential, refit_scales, threads, force,
             overwrite, resume, quiet):
    """Convert with error-compensated quantization (GPTQ-style) per a q4 manifest.

    Rounding every weight to its nearest grid point ignores that a matrix's
    inputs are correlated. This runs the float model over calibration text,
    takes each matrix's input covariance E[x xᵀ], and quantizes one scale
    block at a time (32 columns at a time inside a 256-element super-block),
    moving the columns not yet quantized to cancel the error (the optimal
    update under that covariance). Same schemes, same size: the bytes are
    the manifest's; only the codes are chosen better. The covariance's
    diagonal is the imatrix statistic, so no --imatrix is needed. Use text
    the evaluation does not. Each expert of a mixture is compensated under
    the covariances of the rows routed to it (docs/moe.md). --sequential
    fits each layer to the inputs the
    quantized earlier layers give it, at one calibration pass per layer
    (docs/quality.md says what it buys). Then each matrix's scales are
    refitted to its final codes (--no-refit-scales: as the blocks were
    quantized).

    Each compensated matrix is kept in OUT_DIR/.gptq-partial as soon as it
    is made: after a Ctrl-C, a kill or a reboot, the same command goes on
    from there (the artifact is the one an uninterrupted run writes); the
    directory goes once the artifact is committed.

    \b
    Example:
      ieconv q4-manifest --hf-dir M -o q.json --target-bpw 4.5 --imatrix imatrix.npz
      ieconv gptq --hf-dir M --ref-dir m-f32/ --q4-map q.json --text-file calib.txt --out-dir m-q/
    """
    with one_blas_thread():  # the same run, the same bytes (formats/workers.py)
        _gptq(hf_dir, ref_dir, q4_map, out_dir, text_file, ids_file, ctx, chunks, sequential, refit_scales, threads,
              force, overwrite, resume, quiet)


def _gptq(hf_dir, ref_dir, q4_map, out_dir, text_file, ids_file, ctx, chunks, sequential, refit_scales, threads, force,
          overwrite, resume, quiet) -> None:
    from iekit.runtime.hessians import Hessians

    manifest = load_manifest(q4_map)
    src = hf_checkpoint.from_dir(hf_dir)
    shapes = expert_stacks.shapes_as_written(src)
    order = sorted(plan(manifest, shapes, force=force).quantize, key=natural_key)
    ref, parts, what = calibration({n: s for n, (_d, s) in shapes.items()}, ref_dir, order, text_file, ids_file,
                                   chunks, ctx, threads)
    partial = PartialRun(out_dir, run_inputs(src, ref_dir, q4_map, parts, sequential, force, refit_scales), resume)
    partial.check_names(set(order))
    resumed = len(partial.done)
    if resumed:
        err.print(f"resuming: {resumed} of {len(order)} matrices from {partial.dir} (kept by an interrupted run of "
                  "the same inputs)", markup=False)
    try:
        with convert_progress(quiet) as prog:
            cov = Hessians(ref, parts, order, MEMORY_BUDGET, sequential=sequential, kept=set(partial.done),
                           on_chunk=lambda i, n: prog.describe(f"covariances: chunk {i}/{n}"))
            res = convert(src, out_dir, overwrite=overwrite, progress=prog, manifest=manifest, force=force,
                          covariances=cov, partial=partial, refit_scales=refit_scales)
    except KeyboardInterrupt:  # (an error is one line: the next run says "resuming" instead)
        if partial.done and partial.dir.is_dir():
            err.print(f"{len(partial.done)} of {len(order)} matrices are kept in {partial.dir}: the same command "
                      "goes on from them (--no-resume discards them)", markup=False)
        raise
    partial.finish()
    report_conversion(res)
    plain = [n for n in order if cov.slot_of(n) is None]
    if plain:  # a tensor no matrix input of the decoder feeds (an embedding the manifest quantizes)
        err.print(f"warning: {len(plain)} matrices have no input covariance here and were quantized without error "
                  f"compensation (e.g. {plain[0]})", markup=False)
    if cov.unrouted:
        layers = sorted({slot // 4 for slot, _e in cov.unrouted})
        err.print(f"warning: {len({(s // 4, e) for s, e in cov.unrouted})} experts (layers {', '.join(map(str, layers))}) "
                  "got no calibration row: each was compensated under the mean covariance of its layer's routed "
                  "experts (more calibration text, --chunks, routes to more)", markup=False)
    done = sum(e.compensated for e in res.errors.values())
    tokens = sum(len(p) for p in parts)
    resumed_note = f" ({resumed} kept by the interrupted run)" if resumed else ""
    err.print(f"converted {res.tensors} tensors ({human_bytes(res.bytes_out)} model.ie.bin, {res.quantized_tensors} "
              f"quantized, {done} error-compensated{resumed_note}; covariances of {tokens} tokens ({what}), "
              f"{cov.passes} pass{'es' if cov.passes != 1 else ''}) in {res.seconds:.1f} s -> {res.out_dir}",
              markup=False)
