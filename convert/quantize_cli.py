"""``ieconv quantize``: the calibrated pipeline in one command, resumable by stage.

The best policy this project has (docs/quality.md, "The goals as make
bench-quality prints them") is six commands with a dozen flags that must
agree: a float reference, an importance matrix, two sets of KL probes, a
``--target-bpw`` policy whose candidates are measured as gptq will
quantize them, and gptq itself. A user should not have to know that
recipe, nor lose an hour of it to a Ctrl-C. Each stage is the documented
command run as a child process (the same bytes as typing it; its memory
returned when it ends, so the pipeline's peak is its largest stage's),
its outputs kept in a work directory and its record in
``WORK/stages.json`` (formats/quantize_stages.py); the same command run
again goes on from the first stage not done, and kl-probes and gptq
resume inside theirs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import stat
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import click
from rich.table import Table

from iekit.cli.support import FiniteFloat, human_bytes, split_max_size_option, threads_option
from iekit.formats import expert_stacks, fingerprints, hf_checkpoint, iebin
from iekit.formats.hf_checkpoint import SINGLE_NAME
from iekit.formats.atomic import TEMP_NAME, StagedFiles, make_dirs
from iekit.formats.errors import IEError
from iekit.formats.fileio import file_kind, read_small
from iekit.formats.gguf_file import shard_paths
from iekit.formats.kl_probes_partial import partial_dir
from iekit.formats.paths import real_path
from iekit.formats.quant import SCHEMES
from iekit.formats.quantize_stages import STATE_NAME, Finished, StageLog

from .artifact_out import check_out_dir, check_out_file
from .conversion_output import err
from .gguf_to_hf import check_float_source
from .gptq_cli import DEFAULT_CHUNKS
from .iebin_to_gguf import planned_files
from .kl_probes_cli import probe_plan

WORK_NAME = ".quantize"  # the default work directory, inside --out-dir; removed once the artifact is there
# A reference this large in f32 is made q8_0 instead (--reference auto): kl-probes holds it beside a quantized
# variant, and an 8B model's 32 GB of f32 would not fit a 24 GB machine (q8_0: 8.5 GB, docs/quality.md).
F32_REFERENCE_MAX = 8 << 30
# Budgets below this also get KL probes at 3-4 bits (ieconv kl-probes --help): a policy puts its
# cheapest matrices up to 2 bits under the budget (at 4.5, the rotated SmolLM2's layer-0 down_proj
# went to q2_k, 2.6 bits), where the 4-5-bit set alone extrapolates their KL (docs/quality.md).
LOW_PROBES_BELOW = 5.5
PROBE_SETS = (("kl-probes", "q5_1", "iq4_nl", "kl-probes.json"),
              ("kl-probes (3-4 bits)", "iq4_nl", "iq3_s", "kl-probes-low.json"))
# What the stages write in the work directory (nothing else is there: _check_work)
HF_NAME, ROT_NAME, REF_NAME, REF_MAP_NAME = "hf", "rotated", "ref", "ref_q8_0.json"
IMATRIX_NAME, MANIFEST_NAME, EVAL_NAME = "imatrix.npz", "q4_manifest.json", "eval.json"
MEASURED_NAME = "measurements.json"  # the policy's measured errors: kept, so another budget measures nothing
WORK_NAMES = frozenset({STATE_NAME, HF_NAME, ROT_NAME, REF_NAME, REF_MAP_NAME, IMATRIX_NAME, MANIFEST_NAME, EVAL_NAME,
                        MEASURED_NAME,
                        *(file for *_, file in PROBE_SETS), *(partial_dir(Path(file)).name for *_, file in PROBE_SETS)})


@dataclass
class Stage:
    """One command of the pipeline: ``argv`` (the ``tool``'s sub-command and
    its arguments: what the record compares), ``extra`` (flags that change
    no output: -q, --overwrite), ``outputs`` (what it writes), ``reads``
    (an input no earlier stage writes and the run's inputs do not cover:
    the eval stage's held-out text), ``stdout`` (a file its standard output
    goes to, one of its outputs). It is kept only while its outputs and
    reads are as it left them (``watched``, fingerprints.outputs)."""

    name: str
    argv: list[str]
    outputs: list[Path] | Callable[[], list[Path]]  # or, where they depend on what a stage before makes, a function
    extra: list[str] = field(default_factory=list)
    tool: str = "ieconv"
    stdout: Path | None = None
    reads: list[Path] = field(default_factory=list)

    @property
    def watched(self) -> list[Path]:
        return [*(self.outputs() if callable(self.outputs) else self.outputs), *self.reads]


def _planned(stages: list[Stage]) -> list[tuple[str, tuple[str, ...], list[Path]]]:
    """The stages as StageLog compares them with its records."""
    return [(s.name, tuple(s.argv), s.watched) for s in stages]


def probe_sets(src: hf_checkpoint.HFSource, target_bpw: float) -> list[tuple[str, str, str, str]]:
    """PROBE_SETS' entries this budget uses (the 3-4-bit one below
    LOW_PROBES_BELOW) whose probe can store some of the model's matrices:
    iq3_s stores none of a model whose rows are no 256-element
    super-blocks, and ieconv kl-probes refuses to measure nothing."""
    sets = []
    for entry in PROBE_SETS[:2 if target_bpw < LOW_PROBES_BELOW else 1]:
        name, base, probe, _file = entry
        if probe_plan(src, base, probe)[1]:
            sets.append(entry)
        else:
            err.print(f"{name}: left out: {probe} can store none of this model's matrices", markup=False)
    return sets


def plan(hf_dir: Path, out_dir: Path, work: Path, ref_dir: Path | None, reference: str, calib_file: list[str],
         ctx: int, chunks: int, probe_chunks: int, sets: list[tuple[str, str, str, str]], target_bpw: float,
         gguf_types: bool, gguf: Path | None, threads: int, overwrite: bool, quiet: bool,
         eval_text: Path | None = None, resume: bool = True, split_max_size: int | None = None) -> list[Stage]:
    """The stages, in order, as a user would type them (``calib_file``: --text-file or --ids-file and
    the file; ``sets``: the KL probe sets, probe_sets; ``eval_text``: held-out text the artifact is
    scored on against the reference; ``resume`` False: kl-probes and gptq discard what an interrupted
    run of theirs kept)."""
    calib = [*calib_file, "--ctx", str(ctx)]
    fresh = [] if resume else ["--no-resume"]
    t = ["--threads", str(threads)]
    q = ["-q"] if quiet else []
    stages = []
    if ref_dir is None:
        ref_dir = work / REF_NAME
        to_ref = ["hf-to-iebin", "--hf-dir", str(hf_dir), "--out-dir", str(ref_dir)]
        if reference == "q8_0":  # every matrix at q8_0 (the embedding, a lookup, kept): a quarter of f32's bytes
            ref_map = work / REF_MAP_NAME
            stages.append(Stage("reference policy", ["q4-manifest", "--hf-dir", str(hf_dir), "--scheme", "q8_0",
                                                     "--quantize-head", "-o", str(ref_map)], [ref_map], ["--overwrite"]))
            to_ref += ["--q4-map", str(ref_map)]
        stages.append(Stage(f"reference ({reference})", to_ref, [ref_dir / iebin.META_NAME], [*q, "--overwrite"]))
    im = work / IMATRIX_NAME
    stages.append(Stage("imatrix", ["imatrix", "--model-dir", str(ref_dir), *calib, "--chunks", str(chunks), *t,
                                    "-o", str(im)], [im], [*q, "--overwrite"]))
    probe_args = []
    for name, base, probe, file in sets:
        path = work / file
        stages.append(Stage(name, ["kl-probes", "--hf-dir", str(hf_dir), "--ref-dir", str(ref_dir), *calib,
                                   "--imatrix", str(im), "--base", base, "--probe", probe, "--chunks",
                                   str(probe_chunks), *t, "-o", str(path)], [path], [*q, "--overwrite", *fresh]))
        probe_args += ["--kl-probes", str(path)]
    man = work / MANIFEST_NAME
    stages.append(Stage("policy", ["q4-manifest", "--hf-dir", str(hf_dir), "--target-bpw", repr(target_bpw),
                                   "--quantize-head", "--imatrix", str(im), *probe_args,
                                   *(["--gguf-types"] if gguf_types else []), "--ref-dir", str(ref_dir), *calib,
                                   "--chunks", str(chunks), *t, "--measurements", str(work / MEASURED_NAME),
                                   "-o", str(man)], [man], ["--overwrite"]))
    over = ["--overwrite"] if overwrite else []
    stages.append(Stage("gptq", ["gptq", "--hf-dir", str(hf_dir), "--ref-dir", str(ref_dir), "--q4-map", str(man),
                                 *calib, "--chunks", str(chunks), *t, "--out-dir", str(out_dir)],
                        [out_dir / iebin.META_NAME], [*q, *over, *fresh]))
    if eval_text is not None:  # another (or an edited) text is scored again
        ev = work / EVAL_NAME
        stages.append(Stage("eval", ["eval", "--model-dir", str(out_dir), "--ref-dir", str(ref_dir), "--text-file",
                                     str(eval_text), "--ctx", str(ctx), *t, "--json"], [ev], tool="ierun", stdout=ev,
                            reads=[eval_text]))
    if gguf is not None:
        split = ["--split-max-size", str(split_max_size)] if split_max_size else []
        stages.append(Stage("gguf", ["iebin-to-gguf", "--model-dir", str(out_dir), "--out", str(gguf), *split],
                            partial(gguf_files, out_dir, gguf, split_max_size), [*q, *over]))
    return stages


def gguf_files(out_dir: Path, gguf: Path, split_max_size: int | None) -> list[Path]:
    """The files the gguf stage writes: ``gguf``, or its split's, whose names the artifact's tensors decide
    (planned from it once gptq made it)."""
    if not split_max_size or not (out_dir / iebin.META_NAME).is_file():
        return [gguf]
    try:
        return planned_files(out_dir, gguf, split_max_size=split_max_size)
    except IEError:  # an artifact gptq will replace (of types GGUF has not): the stage cannot be kept anyway
        return [gguf]


def source_stages(hf_dir: Path | None, gguf: Path | None, rotate: int | None, work: Path,
                  quiet: bool) -> tuple[list[Stage], Path]:
    """The stages that make the checkpoint the others read, and its
    directory: with ``gguf`` the file written as an HF checkpoint
    (gguf-to-hf), with ``rotate`` (a seed) that checkpoint rotated (ieconv
    rotate); neither: ``hf_dir`` as it is. The plan is made from that
    checkpoint, so these run (or are kept) first."""
    extra = [*(["-q"] if quiet else []), "--overwrite"]
    stages = []
    if gguf is not None:
        hf_dir = work / HF_NAME
        stages.append(Stage("checkpoint", ["gguf-to-hf", "--gguf", str(gguf), "--out-dir", str(hf_dir)],
                            [hf_dir / SINGLE_NAME, hf_dir / "config.json"], extra))
    if rotate is not None:
        rot = work / ROT_NAME
        stages.append(Stage("rotate", ["rotate", "--hf-dir", str(hf_dir), "--out-dir", str(rot), "--seed", str(rotate)],
                            [rot / SINGLE_NAME, rot / "config.json"], extra))
        hf_dir = rot
    return stages, hf_dir


def _f32_bytes(src: hf_checkpoint.HFSource) -> int:
    return 4 * sum(math.prod(shape) for _dtype, shape in expert_stacks.shapes_as_written(src).values())


def _check_work(work: Path, owned: frozenset[str]) -> None:
    """The work directory holds only what this command writes there: a
    symlink, a FIFO or a file in its place, or a file it did not write
    inside, is refused, never removed."""
    try:
        st = os.lstat(work)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise IEError(f"{work}: is {file_kind(st.st_mode)}, where ieconv quantize keeps its stages' outputs; "
                      "move it away or pass another --work-dir")
    for p in work.iterdir():
        if p.name not in owned and not TEMP_NAME.match(p.name):
            raise IEError(f"{p}: inside the work directory {work}, and not written by ieconv quantize; move it away "
                          "or pass another --work-dir")


def _remove_work(work: Path, owned: frozenset[str]) -> None:
    """The default work directory goes once the artifact is there: only what
    this command wrote in it (the reference can be as large as the model)."""
    for name in owned:
        p = work / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif os.path.lexists(p):
            p.unlink()
    try:
        work.rmdir()
    except OSError:  # something appeared in it meanwhile: left as it is
        err.print(f"note: {work} was kept: it holds files ieconv quantize did not write", markup=False)


def _mix_line(out_dir: Path, gguf: list[Path]) -> str:
    """The summary's line on what was made: size, bits per weight, the types (``gguf``: the files exported)."""
    m = iebin.load_model(out_dir)
    totals = iebin.dtype_totals(m.tensors)
    count, _bytes, bpw = iebin.quantized_totals(totals)
    types = ", ".join(f"{v[0]} {k}" for k, v in sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
                      if k in SCHEMES)
    size = sum(os.path.getsize(out_dir / f["name"]) for f in m.meta["files"])
    files = f" ({len(gguf)} files)" if len(gguf) > 1 else ""
    also = f"; {gguf[0].name}{files} {human_bytes(sum(p.stat().st_size for p in gguf))}" if gguf else ""
    mix = f"{bpw:.3f} bits per weight over {count} quantized tensors: {types}" if count else "no quantized tensors"
    return f"{out_dir}: {human_bytes(size)}{also}; {mix}"


def _scores(path: Path, text: Path) -> str:
    """The eval stage's line of the summary, from its JSON line (ierun eval --json)."""
    try:
        e = json.loads(read_small(path))
        return (f"scored on {text.name} ({e['tokens_scored']} tokens, act {e['act']}): KL {e['kld_mean']:.4f} ± "
                f"{e['kld_se']:.4f}, top-1 {e['top1_agree']:.1%}, perplexity {e['ppl']:.2f} (reference "
                f"{e['ppl_ref']:.2f})")
    except (ValueError, KeyError, TypeError) as exc:
        raise IEError(f"{path}: not ierun eval's JSON line ({exc!r}); remove it and run the command again") from None


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _let_finish(pid: int) -> None:
    """After a Ctrl-C: the child got it too when it came from the terminal
    (one process group) and is let finish its own cleanup (gptq keeps its
    finished matrices); otherwise it is passed on after 3 s. A child
    already reaped (it ended, and wait4 returned, just before the
    interrupt was raised) is done: seen as 'error: No child processes',
    exit 1, when a Ctrl-C met a stage that stopped at once."""
    deadline = time.monotonic() + 3.0
    try:
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGINT)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        return


TOOL_MODULES = {"ieconv": "iekit.convert.entry", "ierun": "iekit.runtime.cli"}


def _run(stage: Stage) -> tuple[float, int]:
    """The stage's command as a child process; (seconds, its peak RSS in
    bytes). A failure or a signal ends the pipeline with one line naming
    the stage. Its standard output, where the stage keeps it, goes to a
    staged file renamed into place once the stage has succeeded."""
    argv = [sys.executable, "-m", TOOL_MODULES[stage.tool], *stage.argv, *stage.extra]
    with StagedFiles(stage.stdout.parent) if stage.stdout else contextlib.nullcontext() as staged:
        out = staged.open(stage.stdout.name) if staged else None
        actions = [(os.POSIX_SPAWN_DUP2, out.fileno(), 1)] if out else []
        t0 = time.monotonic()
        pid = os.posix_spawn(sys.executable, argv, os.environ, file_actions=actions)
        try:
            _pid, status, usage = os.wait4(pid, 0)
        except KeyboardInterrupt:
            _let_finish(pid)
            raise
        seconds = time.monotonic() - t0
        _check_status(stage, status)
    return seconds, usage.ru_maxrss * 1024


def _check_status(stage: Stage, status: int) -> None:
    """One line naming the stage for a child that failed or died of a signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        hint = " (out of memory?)" if sig == signal.SIGKILL else ""
        raise IEError(f"stage {stage.name}: killed by signal {signal.Signals(sig).name}{hint}; the stages before it "
                      "are kept: the same command goes on from there")
    code = os.WEXITSTATUS(status)
    if code == 130:
        raise KeyboardInterrupt
    if code != 0:
        raise IEError(f"stage {stage.name}: {stage.tool} {stage.argv[0]} failed (exit {code}, its error above); the "
                      "stages before it are kept: the same command goes on from there")


def _stage(s: Stage, head: str, log: StageLog, kept: Finished | None) -> tuple[Finished, bool]:
    """Stage ``s`` under the heading ``head``: ``kept`` (the earlier run's
    record) said, or run and recorded; (its record, whether it was kept)."""
    if kept is not None:
        err.print(f"{head}: kept from an earlier run (it took {_duration(kept.seconds)})", markup=False)
        return kept, True
    err.print(f"{head}: {s.tool} {' '.join(s.argv)}", markup=False, soft_wrap=True)
    seconds, rss = _run(s)
    made = fingerprints.outputs(s.watched)
    if made is None:
        raise IEError(f"stage {s.name}: finished, but {', '.join(map(str, s.watched))} are not all there")
    rec = Finished(s.name, tuple(s.argv), made, round(seconds, 3), rss)
    log.add(rec)
    return rec, False


@click.command("quantize")
@click.option("--hf-dir", type=click.Path(path_type=Path), help="HF model directory (the float weights).")
@click.option("--from-gguf", "gguf_in", type=click.Path(path_type=Path, dir_okay=False),
              help="Or the weights as a GGUF file (F16/BF16/F32, as llama.cpp's convert_hf_to_gguf.py writes "
                   "them): a first stage writes it as an HF checkpoint in the work directory (ieconv gguf-to-hf), "
                   "which the other stages read. Needs the model's size in disk space there.")
@click.option("--rotate", type=click.IntRange(min=0), is_flag=False, flag_value=0, default=None,
              help="Rotate the residual stream first (ieconv rotate, this seed; 0 without one): the same function, "
                   "no channel standing out. With gptq's codes it gave 0.44-0.62x the KL at 3.5-4 bits on a "
                   "widened SmolLM2 (docs/quality.md); the head is untied, its bits counted. Score both on your "
                   "model (--eval-text). The rotated checkpoint is f32, in the work directory (twice a bf16 checkpoint's "
                   "size).")
@click.option("--allow-requantize", is_flag=True,
              help="With --from-gguf: accept a quantized GGUF (its codes are quantized again: a second rounding "
                   "error on top of the first; llama-quantize's flag of the same name).")
@click.option("--out-dir", type=click.Path(path_type=Path), required=True, help="Output directory for the artifact.")
@click.option("--target-bpw", type=FiniteFloat(min=1.0), required=True,
              help="Average bits per weight over the quantized matrices (q4-manifest --target-bpw): 4.5, 4.0, 3.25 ...")
@click.option("--text-file", type=click.Path(path_type=Path),
              help="Calibration text (UTF-8), tokenized by the model: the imatrix, the KL probes, the policy's and "
                   "gptq's covariances all come from it. Use text the evaluation does not.")
@click.option("--ids-file", type=click.Path(path_type=Path), help="Calibration token ids instead of text.")
@click.option("--eval-text", type=click.Path(path_type=Path, dir_okay=False),
              help="Held-out text to score the artifact on once it is written (ierun eval against the float "
                   "reference, int8 activations where the runtime uses them): KL, top-1 agreement and perplexity "
                   "in the summary, and in WORK/eval.json. Use text the calibration did not see.")
@click.option("--ctx", type=click.IntRange(min=4), default=None,
              help="Tokens per chunk [512, or the model's max_position_embeddings if smaller].")
@click.option("--chunks", type=click.IntRange(min=1), default=DEFAULT_CHUNKS, show_default=True,
              help="Calibration chunks for the imatrix, the policy and gptq (fewer: faster, worse-conditioned "
                   "covariances; at 8B on 2 cores gptq with 2 chunks takes about 2 hours, docs/quality.md).")
@click.option("--probe-chunks", type=click.IntRange(min=1), default=4, show_default=True,
              help="Chunks each KL probe scores (ieconv kl-probes --chunks).")
@click.option("--kl-probes/--no-kl-probes", default=True, show_default=True,
              help="Measure the KL each group of matrices costs (one set, and a second at 3-4 bits for budgets "
                   "below 5.5) and spend bits by it; --no-kl-probes ranks by the imatrix-weighted error alone "
                   "(much faster at 8B: the probes score the model twice per layer pattern).")
@click.option("--gguf-types", is_flag=True,
              help="Only types llama.cpp also has, so the artifact exports to GGUF byte for byte.")
@click.option("--gguf", "gguf_out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the artifact as this GGUF file (for llama.cpp, Ollama, LM Studio); implies --gguf-types.")
@split_max_size_option("With --gguf:")
@click.option("--ref-dir", type=click.Path(path_type=Path),
              help="The checkpoint's float IEBIN artifact, if you have one (hf-to-iebin without --q4-map); "
                   "else one is made in the work directory.")
@click.option("--reference", type=click.Choice(["auto", "f32", "q8_0"]), default="auto", show_default=True,
              help="The reference made when there is no --ref-dir: auto is f32 up to 8 GiB of f32 weights "
                   "(about 2B parameters), q8_0 above (a quarter of the memory; docs/quality.md's 8B runs use it).")
@click.option("--work-dir", type=click.Path(path_type=Path),
              help="Where the stages' outputs are kept (the reference, imatrix, KL probes, policy). Default "
                   "OUT_DIR/.quantize, removed once the artifact is written; a --work-dir you give is kept, and "
                   "another budget run with it reuses every stage before the policy.")
@threads_option("Threads of every stage.")
@click.option("--overwrite", is_flag=True,
              help="Replace the artifact in --out-dir and the --gguf file when their stages run (a stage kept from "
                   "an earlier run does not run again: remove the work directory to start over).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Let kl-probes and gptq go on from what an interrupted run of theirs kept (they refuse work "
                   "kept from other inputs, e.g. after a new --target-bpw); --no-resume discards it. Finished "
                   "stages are kept either way.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars (the stage lines and the summary stay).")
def quantize_cmd(hf_dir, gguf_in, rotate, allow_requantize, out_dir, target_bpw, text_file, ids_file, eval_text, ctx, chunks,
                 probe_chunks, kl_probes, gguf_types, gguf_out, split_max_size, ref_dir, reference, work_dir, threads,
                 overwrite, resume, quiet):
    """Quantize a checkpoint to --target-bpw bits with everything that
    buys quality: importance matrix, KL probes, a policy measured as gptq
    quantizes, and gptq's error-compensated codes.

    Runs, as child processes, the commands a user would type (each stage's
    line shows it): with --from-gguf gguf-to-hf (the weights as an HF
    checkpoint), hf-to-iebin (the float reference), imatrix, kl-probes
    (twice below 5.5 bits), q4-manifest --target-bpw --kl-probes --ref-dir,
    gptq, with --eval-text ierun eval (how far the artifact is from the
    reference), and with --gguf iebin-to-gguf. Each finished stage is
    recorded in the work directory: after a Ctrl-C, a kill or a failed
    stage, the same command goes on from the first stage not done (kl-probes
    from its last scoring, gptq from its last finished matrix). A summary gives each stage's minutes and
    peak memory, and with --eval-text the artifact's KL, top-1 agreement and
    perplexity.

    \b
    Example:
      ieconv quantize --hf-dir M --text-file calib.txt --target-bpw 4.0 --out-dir m-q4/ --eval-text held.txt
      ieconv quantize --from-gguf m-f16.gguf --text-file calib.txt --target-bpw 4.0 --out-dir m-q4/ --gguf m-q4.gguf
    """
    if (text_file is None) == (ids_file is None):
        raise click.UsageError("give the calibration text as --text-file or --ids-file (one of them)")
    if (hf_dir is None) == (gguf_in is None):
        raise click.UsageError("give the weights as --hf-dir or --from-gguf (one of them)")
    if allow_requantize and gguf_in is None:
        raise click.UsageError("--allow-requantize is about a quantized --from-gguf file")
    if split_max_size and gguf_out is None:
        raise click.UsageError("--split-max-size splits the --gguf export; give --gguf too")
    if rotate is not None and ref_dir is not None:  # gptq's covariances are of its reference's activations
        raise click.UsageError("--rotate makes the reference of the rotated model: a --ref-dir is of the unrotated one")
    from iekit.runtime.token_ids import read_source  # the runtime is imported by the commands that run it

    calib_file = real_path(text_file or ids_file)
    read_source(text_file, ids_file)
    if eval_text is not None:
        eval_text = real_path(eval_text)
        read_source(eval_text, None)
        if eval_text == calib_file:
            err.print(f"warning: {eval_text} is also the calibration text: the artifact was fitted to it, so its "
                      "scores there flatter it", markup=False)
    out_dir = real_path(out_dir)
    if gguf_out is not None:
        gguf_out = real_path(gguf_out)
        gguf_types = True
    if ref_dir is not None:
        ref_dir = real_path(ref_dir)
        if not (ref_dir / iebin.META_NAME).is_file():
            raise IEError(f"{ref_dir}: no {iebin.META_NAME}: --ref-dir must be the checkpoint's float IEBIN artifact")
    keep_work = work_dir is not None
    # a --work-dir given may be a link to another disk; the default one is never followed (its files are removed)
    work = real_path(work_dir) if keep_work else out_dir / WORK_NAME
    if gguf_in is not None:
        gguf_in = real_path(gguf_in)
        shards = shard_paths(gguf_in)
        if gguf_out in shards:
            raise IEError(f"{gguf_out}: --gguf would replace the --from-gguf file the weights come from")
        check_float_source(gguf_in, allow_requantize)
        checkpoint = fingerprints.digest(b"".join(fingerprints.stat_line(p) for p in shards))
    else:
        hf_dir = real_path(hf_dir)
        checkpoint = fingerprints.checkpoint(hf_checkpoint.from_dir(hf_dir))
    if work in (out_dir, hf_dir) or (ref_dir is not None and work == ref_dir):
        raise IEError(f"{work}: --work-dir must be a directory of its own, not the checkpoint, reference or output")
    _check_work(work, WORK_NAMES)
    source, hf_dir = source_stages(hf_dir, gguf_in, rotate, work, quiet)
    inputs = {"checkpoint": checkpoint, "calibration": fingerprints.digest(fingerprints.stat_line(calib_file)),
              "ref_dir": fingerprints.artifact(ref_dir) if ref_dir else None}
    log = StageLog(work, inputs)
    if log.inputs_changed:
        err.print(f"{log.path}: kept from a run of other inputs (the checkpoint or the calibration text changed): "
                  "every stage runs again", markup=False)

    def check_outputs(artifact: bool, gguf: bool) -> None:  # before a stage runs: what gptq and the export replace
        if artifact:
            check_out_dir(out_dir, overwrite, [iebin.META_NAME, iebin.BIN_NAME], src_dir=hf_dir)
        if gguf and gguf_out is not None:  # a split's names wait for the artifact: any of that stem's are refused
            for p in [gguf_out, *(sorted(gguf_out.parent.glob(f"{gguf_out.stem}-?????-of-?????.gguf"))
                                  if split_max_size else [])]:
                check_out_file(p, overwrite, "the .gguf file")

    # The stages that write the checkpoint the plan is made from: kept, or run before the plan. Where one runs,
    # every later stage does (the records after it are of other weights), so the outputs are checked now.
    src_kept = log.matching(_planned(source))
    if src_kept < len(source):
        log.keep_prefix(_planned(source[:src_kept]))
        check_outputs(True, True)
        make_dirs(work)
    rows = [_stage(s, f"[{i + 1}] {s.name}", log, log.finished[i] if i < src_kept else None)
            for i, s in enumerate(source)]
    src = hf_checkpoint.from_dir(hf_dir)
    if ctx is None:  # one context for every stage (imatrix's own default ignores the model's limit)
        ctx = min(512, int(src.config.get("max_position_embeddings") or 512))
    if reference == "auto":
        reference = "f32" if _f32_bytes(src) <= F32_REFERENCE_MAX else "q8_0"
    calib = [f"--{'text' if text_file else 'ids'}-file", str(calib_file)]
    sets = probe_sets(src, target_bpw) if kl_probes else []
    stages = source + plan(hf_dir, out_dir, work, ref_dir, reference, calib, ctx, chunks, probe_chunks, sets,
                           target_bpw, gguf_types, gguf_out, threads, overwrite, quiet, eval_text, resume,
                           split_max_size)
    kept = log.keep_prefix(_planned(stages))
    if src_kept == len(source):  # (else checked before the checkpoint's stages ran)
        check_outputs(any(s.name == "gptq" for s in stages[kept:]), kept < len(stages))
        make_dirs(work)
    for i, s in enumerate(stages[len(source):], start=len(source)):
        rows.append(_stage(s, f"[{i + 1}/{len(stages)}] {s.name}", log, log.finished[i] if i < kept else None))
    table = Table(title=f"ieconv quantize: {target_bpw} bits per weight -> {out_dir}")
    for c in ("stage", "minutes", "peak RSS"):
        table.add_column(c, justify="left" if c == "stage" else "right")
    for rec, was_kept in rows:
        table.add_row(rec.name, f"{rec.seconds / 60:.2f}" + (" (kept)" if was_kept else ""),
                      human_bytes(rec.peak_rss_bytes))
    err.print(table)
    err.print(_mix_line(out_dir, gguf_files(out_dir, gguf_out, split_max_size) if gguf_out else []), markup=False)
    if eval_text is not None:
        err.print(_scores(work / EVAL_NAME, eval_text), markup=False)
    if keep_work:
        err.print(f"the stages' outputs are kept in {work}", markup=False)
    else:
        _remove_work(work, WORK_NAMES)
