"""``ieconv kl-probes``: measure what each group of matrices costs the model
when quantized more coarsely, for ``q4-manifest --target-bpw --kl-probes``.

The predicted error the bits-per-weight policy ranks matrices by does not
say how much the model's output distribution suffers: that depends on where
the matrix sits (a value projection's error reaches every later token
through attention). So this closes the loop with the model itself: every
quantized matrix at --base, then one group at a time (a layer pattern of
the usual policy, or the head) at --probe, each artifact scored against the
float reference with ``ierun eval``'s KL (runtime/evaluation.py). Two
conversions (all at base, all at probe; _Variants composes the rest) and one
evaluation per group, plus the base: minutes on a 135M model
(docs/formats/kl_probes.md).
"""

from __future__ import annotations

import os
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from iekit.cli.support import stderr_console, threads_option
from iekit.formats import fingerprints, hf_checkpoint, iebin, kl_probes
from iekit.formats.atomic import check_new_file, write_file_atomic
from iekit.formats.jsonio import dumps_canonical, load_json
from iekit.formats.kl_probes_partial import PROBE_BIN, PROBE_META, ProbesRun
from iekit.formats.paths import real_path
from iekit.formats.q4_manifest import default_manifest, is_tied, layer_pattern, manifest_from
from iekit.formats.quant import SCHEMES, QuantParams
from iekit.formats.weight_types import manifest_schemes

from .bpw_policy import group_of
from .hf_to_iebin import convert

QUANTIZED = [n for n in manifest_schemes() if n != "int4w"]
REF_CACHE_BYTES = 1 << 30  # the reference's scored logits kept in memory (SmolLM2, 4 chunks of 512: 200 MB)


@click.command("kl-probes")
@click.option("--hf-dir", type=click.Path(path_type=Path), required=True, help="HF model directory (the float weights).")
@click.option("--ref-dir", type=click.Path(path_type=Path), required=True,
              help="Its float IEBIN artifact (hf-to-iebin without --q4-map): the reference the KL is measured against.")
@click.option("--text-file", type=click.Path(path_type=Path), help="Text to score (UTF-8), tokenized by the model.")
@click.option("--ids-file", type=click.Path(path_type=Path), help="Token ids to score instead of text.")
@click.option("-o", "--out", "out_path", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The kl-probes.json to write.")
@click.option("--imatrix", type=click.Path(path_type=Path, dir_okay=False),
              help="Importance matrix every artifact is quantized with (as q4-manifest will use it).")
@click.option("--base", type=click.Choice(QUANTIZED), default="q5_1", show_default=True,
              help="The scheme every quantized matrix has.")
@click.option("--probe", type=click.Choice(QUANTIZED), default="iq4_nl", show_default=True,
              help="The coarser scheme each group takes in turn.")
@click.option("--ctx", type=click.IntRange(min=4), default=None,
              help="Tokens per chunk, as ierun eval [512, or the model's max_position_embeddings if smaller].")
@click.option("--chunks", type=click.IntRange(min=1), default=4, show_default=True, help="Chunks scored per measurement.")
@threads_option("Threads.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Take the conversions and scorings an interrupted run of the same inputs kept in .OUT.partial "
                   "(beside the output) instead of making them again; --no-resume discards them.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def kl_probes_cmd(hf_dir, ref_dir, text_file, ids_file, out_path, imatrix, base, probe, ctx, chunks, threads,
                  overwrite, resume, quiet):
    """Measure the KL each group of matrices costs at a coarser scheme.

    Every matrix the usual policy quantizes (the head included) gets --base;
    then each group (one layer pattern, e.g. model.layers.*.self_attn.v_proj.weight,
    or the head) in turn gets --probe, and the mean KL against --ref-dir is
    measured. q4-manifest --target-bpw --kl-probes FILE then spends bits where
    they save the most KL.

    Example: ieconv kl-probes --hf-dir M --ref-dir m-f32/ --text-file eval.txt
    --imatrix imatrix.npz -o kl-probes.json

    For budgets below about 4.5 bits measure a second set where those
    policies put matrices (--base iq4_nl --probe iq3_s -o kl-probes-low.json)
    and give q4-manifest both (--kl-probes kl-probes.json --kl-probes
    kl-probes-low.json): each set prices the errors in its own range. A group
    the probe cannot store (iq3_s on rows that are no whole 256-element
    super-blocks) is left out and named.

    The work is kept in .OUT.partial beside the output (-o OUT) as it is
    done: the two conversions, then each scoring. After a Ctrl-C or a kill
    the same command goes on from there (the output is the one an
    uninterrupted run writes); the folder goes once the output is written.
    """
    # The runtime (the native extension included) only when a model runs: every other ieconv command starts without it.
    from iekit.runtime import evaluation
    from iekit.runtime.calibration import calibration_chunks, float_decoder

    if base == probe:
        raise click.UsageError("--probe must differ from --base")
    check_new_file(out_path, overwrite)
    src = hf_checkpoint.from_dir(hf_dir)
    manifest, groups, unfit = probe_plan(src, base, probe, imatrix)
    if not groups:
        raise click.UsageError(f"--probe {probe} can store no group of this model's matrices")
    err = stderr_console()
    unprobed: dict[str, list[str]] = {}  # per layer pattern the reasons (a fallback's exact entries: one per layer)
    for g, why in unfit.items():
        unprobed.setdefault(layer_pattern(g), []).append(why)
    for pattern, whys in unprobed.items():
        count = f"{len(whys)} tensors; " if len(whys) > 1 else ""
        err.print(f"not probed: {pattern} ({count}{whys[0]}); q4-manifest prices it from the probed groups",
                  markup=False)
    ref = float_decoder(ref_dir, threads=threads, ctx=ctx)
    parts, what = calibration_chunks(ref, text_file, ids_file, chunks)
    run = ProbesRun(out_path, run_inputs(src, ref_dir, imatrix, parts, base, probe), resume)
    try:
        with run, Progress(TextColumn("{task.description:<44.44}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True,
                           disable=quiet) as bar:
            if run.kept():
                err.print(f"resuming: {run.describe(len(groups))} from {run.dir} (kept by an interrupted run of the "
                          "same inputs)", markup=False)
            task = bar.add_task(f"converting: all {base}", total=len(groups) + 3, completed=2 if run.converted else 0)
            variants = _Variants(src, run, manifest, probe, groups,
                                 lambda label: bar.update(task, advance=1, description=label))

            # The reference's logits, computed once for all nine scorings where they fit in REF_CACHE_BYTES.
            rows = sum(len(evaluation.scored_positions(len(p))) for p in parts)
            cache = [] if rows * ref.spec.vocab * 4 <= REF_CACHE_BYTES else None

            def kl_of(model_path: Path, label: str) -> dict:
                bar.update(task, description=label)
                model = float_decoder(model_path, threads=threads, ctx=ref.max_ctx)
                evaluation.check_comparable(model, ref)
                s = evaluation.evaluate(model, parts, ref, ref_cache=cache).summary()
                bar.update(task, advance=1)
                return s

            if run.base_kl is None:
                first = kl_of(variants.base, f"all {base}")
                base_kl, tokens = float(first["kld_mean"]), int(first["tokens_scored"])
                run.put_base(base_kl, tokens)
            else:
                base_kl, tokens = run.base_kl, run.tokens
                bar.update(task, advance=1)
            results = {}
            for g in groups:
                if g in run.groups:
                    results[g] = run.groups[g]
                    bar.update(task, advance=1)
                else:
                    results[g] = float(kl_of(variants.with_probe(g), g)["kld_mean"])
                    run.put(g, results[g])
    except KeyboardInterrupt:  # (an error is one line: the next run says "resuming" instead)
        if run.kept() and run.dir.is_dir():
            err.print(f"{run.describe(len(groups))} are kept in {run.dir}: the same command goes on from them "
                      "(--no-resume discards them)", markup=False)
        raise
    p = kl_probes.KLProbes({"scheme": base}, {"scheme": probe}, tokens, base_kl, results)
    write_file_atomic(out_path, kl_probes.dumps(p), replace=overwrite)
    run.finish()
    if not quiet:
        width = max(len(g) for g in results)
        err.print(f"all {base}: KL {base_kl:.4f} over {tokens} tokens; one group at {probe}:", markup=False)
        for g, kl in sorted(results.items(), key=lambda kv: -kv[1]):
            err.print(f"  {g:<{width}}  KL {kl:.4f}  (+{kl - base_kl:.4f})", markup=False)
        err.print(f"-> {out_path}", markup=False)


def run_inputs(src: hf_checkpoint.HFSource, ref_dir: Path, imatrix: Path | None, parts: list[list[int]], base: str,
               probe: str) -> dict[str, object]:
    """What a run's measurements depend on, as fingerprints
    (formats/kl_probes_partial.py): the checkpoint and the reference as
    formats/fingerprints.py takes them, the importance matrix and the scored
    token ids by content, the two schemes by name."""
    return {"checkpoint": fingerprints.checkpoint(src), "ref_dir": fingerprints.artifact(ref_dir),
            "imatrix": fingerprints.small_file(imatrix), "calibration": fingerprints.token_chunks(parts),
            "base": base, "probe": probe}


class _Variants:
    """The artifacts the probes score, each matrix quantized once per scheme:
    the model converted with every matrix at base, and again with every group
    at probe (that payload and its metadata moved beside the first as
    PROBE_BIN and PROBE_META); the variant with one group at probe is then
    only metadata, base's entries with the group's swapped for the probe
    conversion's (an IEBIN entry names its file). Nine conversions of
    SmolLM2 became two. Both are made in the run's work folder and recorded
    there, or taken as an interrupted run of the same inputs left them."""

    VARIANT = "variant.ie.json"

    def __init__(self, src, run: ProbesRun, manifest: dict, probe: str, groups: list[str],
                 converted: Callable[[str], None]):
        self.base = run.base_dir
        self.groups = _groups(manifest)
        if run.converted is None:
            where = run.dir / "q4_manifest.json"  # (named in messages only)
            convert(src, self.base, manifest=manifest_from(manifest, where))
            converted(f"converting: every group at {probe}")
            convert(src, run.staging_dir, manifest=manifest_from(_all_at(manifest, probe, groups), where))
            os.replace(run.staging_dir / iebin.BIN_NAME, self.base / PROBE_BIN)
            os.replace(run.staging_dir / iebin.META_NAME, self.base / PROBE_META)
            shutil.rmtree(run.staging_dir)
            run.put_converted()
            converted("scoring")
        self.meta = load_json(self.base / iebin.META_NAME)
        self.probe_entries = {t["name"]: {**t, "file": PROBE_BIN}
                              for t in load_json(self.base / PROBE_META)["tensors"]}
        self.probe_file = {"name": PROBE_BIN, "nbytes": (self.base / PROBE_BIN).stat().st_size}

    def with_probe(self, group: str) -> Path:
        """The metadata of the base artifact with ``group`` at probe (replacing the previous variant's)."""
        meta = {**self.meta, "files": [*self.meta["files"], self.probe_file],
                "tensors": [self.probe_entries[t["name"]] if group_of(t["name"], self.groups) == group else t
                            for t in self.meta["tensors"]]}
        path = self.base / self.VARIANT
        write_file_atomic(path, dumps_canonical(meta), replace=True)
        return path


def probe_plan(src: hf_checkpoint.HFSource, base: str, probe: str, imatrix: Path | None = None):
    """(the usual manifest at ``base``, the groups ``probe`` can store, the
    rest with the reason): what a kl-probes run measures, known
    before any model runs (ieconv quantize leaves out a probe set that
    would measure nothing)."""
    with ExitStack() as stack:
        shapes = {n: (t.dtype.name, list(t.shape)) for n, (_f, t) in hf_checkpoint.collect_tensors(src, stack).items()}
    imp = None if imatrix is None else os.fspath(real_path(imatrix))
    manifest = default_manifest(shapes, base, head=base, tied=is_tied(shapes, src.config), imatrix=imp)
    return (manifest, *_probed_groups(manifest, shapes, probe))


def _probed_groups(manifest: dict, shapes: dict[str, tuple[str, list[int]]], probe: str) -> tuple[list[str], dict]:
    """The manifest's groups (each rule's pattern, each exact entry's name),
    split into those every member of which ``probe`` can store and the rest
    with the reason: a super-block probe (iq3_s) cannot store SmolLM2's
    576-wide o_proj rows, and a probe that fell back to another scheme would
    measure that scheme instead."""
    groups = _groups(manifest)
    unfit: dict[str, str] = {}
    for name, (_dtype, shape) in shapes.items():
        group = group_of(name, groups)
        if group is not None and group not in unfit and (why := SCHEMES[probe].check(shape, QuantParams(probe))):
            unfit[group] = why
    return [g for g in groups if g not in unfit], unfit


def _groups(manifest: dict) -> list[str]:
    """The usual manifest's groups: each rule's pattern, then each exact
    entry's name; bpw_policy.group_of finds a tensor's as the manifest
    resolves it (an exact entry first, else the first rule matching)."""
    return [r["match"] for r in manifest["rules"]] + sorted(manifest["tensors"])


def _all_at(manifest: dict, probe: str, groups: list[str]) -> dict:
    """The manifest with every group of ``groups`` (rules and exact entries) at ``probe``."""
    return {**manifest, "rules": [{"match": r["match"], "scheme": probe} if r["match"] in groups else r
                                  for r in manifest["rules"]],
            "tensors": {n: {"scheme": probe} if n in groups else s for n, s in manifest["tensors"].items()}}
