"""``ierun eval`` and ``ierun verify model``: is the quantized model any good?"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from iekit.cli.support import FiniteFloat, stderr_console, stdout_console, threads_option
from iekit.formats.errors import IEError

from . import evaluation, expert_copies, kv_cache, plots
from .env import ACTS
from .token_ids import load_ids
from .gguf_models import model_dir_flag, model_dir_option

out = stdout_console()
err = stderr_console()

def _options(f):
    for opt in reversed([
        model_dir_flag("IEBIN model directory to evaluate (e.g. the int4w artifact), or a .gguf (imported once, "
                       "cached)."),
        click.option("-f", "--text-file", type=click.Path(path_type=Path, dir_okay=False),
                     help="UTF-8 text (e.g. wiki.test.raw), tokenized with the model's tokenizer.json "
                          "(llama-perplexity's -f)."),
        click.option("--ids-file", type=click.Path(path_type=Path, dir_okay=False),
                     help="Exact token ids instead of text, separated by commas and/or whitespace."),
        click.option("-c", "--ctx", type=click.IntRange(min=4), default=None,
                     help=f"Tokens per chunk, llama-perplexity's -c [{evaluation.DEFAULT_CTX}, or the models' "
                          "max_position_embeddings if smaller]."),
        click.option("--chunks", type=click.IntRange(min=1), default=None, help="Evaluate the first N chunks only [all]."),
        threads_option("Decoder threads."),
        click.option("--act", type=click.Choice(ACTS), default="auto", show_default=True,
                     help="The evaluated model's activations into quantized matrices, as `ierun generate "
                          "--act` (auto: int8 for 4-bit layer matrices); the reference always runs with f32 (and the "
                          "model's KV cache types)."),
        kv_cache.options,
        expert_copies.option,
    ]):
        f = opt(f)
    return f


def run_eval(model_dir, ref_dir, text_file, ids_file, ctx, chunks, threads, act, progress: bool,
             cache_types: tuple[str | None, str | None] = (None, None), experts: str = "auto"):
    """Load the model(s), score the chunks, return (scores, summary). Both
    run with ``cache_types`` (K, V; None: the commands' default), as
    llama-perplexity --kl-divergence runs both with its cache type: the KL
    is then the weights' and activations' alone."""
    from .decoder import Decoder

    # Without --ctx: DEFAULT_CTX, or the smaller context of either model.
    model = Decoder(model_dir, threads=threads, ctx=ctx, default_ctx=evaluation.DEFAULT_CTX, act=act,
                    cache_type_k=cache_types[0], cache_type_v=cache_types[1], experts=experts)
    ref = None
    if ref_dir is not None:
        ref = Decoder(ref_dir, threads=threads, ctx=ctx, default_ctx=model.max_ctx, act="f32",
                      cache_type_k=model.cache_types[0], cache_type_v=model.cache_types[1])
        evaluation.check_comparable(model, ref)
    ctx = model.max_ctx if ref is None else min(model.max_ctx, ref.max_ctx)
    ids, what = load_ids(model, text_file, ids_file)
    try:
        model.check_vocab(ids)
    except IEError as e:
        raise IEError(f"{what}: {e}") from None
    parts = evaluation.chunk_ids(ids, ctx, chunks, what)
    with Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
                  TimeRemainingColumn(), TextColumn("{task.description}"), console=err, transient=True,
                  disable=not progress) as bar:
        task = bar.add_task("", total=len(parts))

        def on_chunk(s: evaluation.Scores) -> None:
            f = s.running()
            desc = f"PPL {f['ppl']:.4g}"
            if ref is not None:
                desc += f" · KL {f['kld_mean']:.4g} · top-1 {100 * f['top1_agree']:.2f}%"
            bar.update(task, advance=1, description=desc)

        scores = evaluation.evaluate(model, parts, ref, on_chunk if progress else None)
    summary = scores.summary()
    summary.update(model_dir=str(model_dir), ref_dir=None if ref_dir is None else str(ref_dir), act=model.act,
                   threads=threads, tokens_in=len(ids))
    return scores, summary


def _pm(v: float, se: float, spec: str = ".4f") -> str:
    return f"{v:{spec}} ± {se:{spec}}"


def print_summary(s: dict) -> None:
    t = Table(title=f"ierun eval: {s['model_dir']}" + (f" against {s['ref_dir']}" if s["ref_dir"] else ""),
              show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("tokens scored", f"{s['tokens_scored']} ({s['chunks']} chunks of {s['ctx']}, second half of each)")
    t.add_row("perplexity", _pm(s["ppl"], s["ppl_se"]))
    if s["ref_dir"]:
        t.add_row("perplexity (reference)", _pm(s["ppl_ref"], s["ppl_ref_se"]))
        t.add_row("ln(PPL / PPL_ref)", _pm(s["ln_ppl_ratio"], s["ln_ppl_ratio_se"], ".5f"))
        t.add_row("KL(ref ‖ model) mean", _pm(s["kld_mean"], s["kld_se"], ".6f"))
        t.add_row("KL median / p90 / p99 / max",
                  " / ".join(f"{s[k]:.6f}" for k in ("kld_median", "kld_p90", "kld_p99", "kld_max")))
        t.add_row("top-1 agreement", f"{100 * s['top1_agree']:.3f} ± {100 * s['top1_agree_se']:.3f} %")
        t.add_row("Δp of ref's top token", f"mean {s['dp_mean']:+.5f}, RMS {s['dp_rms']:.5f}, "
                                           f"p1 {s['dp_p1']:+.5f}, p99 {s['dp_p99']:+.5f}")
    t.add_row("time", f"{s['seconds']:.2f} s, {s['tokens_per_s']:.0f} tokens/s "
                      f"({'2 models' if s['ref_dir'] else '1 model'}, {s['threads']} thread{'s' if s['threads'] != 1 else ''}, act {s['act']})")
    out.print(t)


_HELP_SCORING = (
    "The ids are cut into chunks of --ctx tokens (a tail shorter than a chunk is left out); each chunk runs from "
    "position 0 with an empty KV cache. Positions i in [ctx/2, ctx-1) of each chunk are scored, each predicting "
    "id i+1: the first half is context only, as llama-perplexity does. Perplexity, KL and top-1 are all over "
    "those positions. The reference runs the same chunk right after the model, in the same process: no logits "
    "file, and memory holds one chunk's logits.")


@click.command("eval", help="Perplexity of a model on a text and, with --ref-dir, how far it is from a reference: "
                            "KL(ref ‖ model) per token, top-1 agreement, Δp of the reference's top token.\n\n"
                            + _HELP_SCORING + "\n\nStandard errors treat tokens as independent (a lower bound).")
@_options
@click.option("--ref-dir", callback=model_dir_option, type=click.Path(path_type=Path),
              help="Reference IEBIN model (e.g. the f32 artifact): same architecture, vocabulary and tokenizer.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON line (ppl, ppl_ref, kld_mean, kld_median, kld_p99, top1_agree, tokens_scored, ...).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw the KL distribution, KL by position and the Δp distribution to this PNG "
                   "(needs --ref-dir and matplotlib: pip install 'iekit[plot]').")
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
def eval_cmd(model_dir, text_file, ids_file, ctx, chunks, threads, act, cache_type_k, cache_type_v, experts, ref_dir,
             as_json, plot_path, overwrite):
    if plot_path is not None:
        if ref_dir is None:
            raise click.UsageError("--plot draws KL divergence and Δp: give --ref-dir too")
        plots.check_target(plot_path, overwrite)
    scores, s = run_eval(model_dir, ref_dir, text_file, ids_file, ctx, chunks, threads, act,
                         progress=err.is_terminal, cache_types=(cache_type_k, cache_type_v), experts=experts)
    if plot_path is not None:
        plots.eval_plot(scores, s, f"{model_dir} vs {ref_dir}", plot_path, overwrite)
    if as_json:
        click.echo(json.dumps(s, sort_keys=True))
    else:
        print_summary(s)
    if plot_path is not None:
        err.print(f"plot: {plot_path}", markup=False)


@click.command("model", help="Exit 1 when the model drifts from its reference further than allowed: its mean "
                             "KL(ref ‖ model) over the text must be at most --max-kld (and its top-1 agreement "
                             "at least --min-top1 when given).\n\n" + _HELP_SCORING)
@_options
@click.option("--ref-dir", required=True, type=click.Path(path_type=Path), help="Reference IEBIN model.")
@click.option("--max-kld", required=True, type=FiniteFloat(min=0), help="Largest mean KL divergence (nats) allowed.")
@click.option("--min-top1", type=FiniteFloat(0, 1), default=None, help="Smallest top-1 agreement allowed (0..1).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line: the eval figures plus ok and the limits.")
def verify_model_cmd(model_dir, text_file, ids_file, ctx, chunks, threads, act, cache_type_k, cache_type_v, experts,
                     ref_dir, max_kld, min_top1, as_json):
    _, s = run_eval(model_dir, ref_dir, text_file, ids_file, ctx, chunks, threads, act, progress=err.is_terminal,
                    cache_types=(cache_type_k, cache_type_v), experts=experts)
    fails = []
    if not s["kld_mean"] <= max_kld:
        fails.append(f"mean KL divergence {s['kld_mean']:.6g} > --max-kld {max_kld:g}")
    if min_top1 is not None and not s["top1_agree"] >= min_top1:
        fails.append(f"top-1 agreement {s['top1_agree']:.6g} < --min-top1 {min_top1:g}")
    if as_json:
        click.echo(json.dumps({**s, "ok": not fails, "max_kld": max_kld, "min_top1": min_top1}, sort_keys=True))
    else:
        print_summary(s)
    if fails:
        raise IEError(f"verify model: {model_dir} drifts from {ref_dir}: {'; '.join(fails)} "
                      f"({s['tokens_scored']} tokens)")
    if not as_json:
        out.print(f"OK: mean KL divergence {s['kld_mean']:.6g} <= {max_kld:g} over {s['tokens_scored']} tokens",
                  markup=False)
