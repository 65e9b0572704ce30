"""``ierun generate`` and ``ierun logits``: the decoder as a user drives it."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import click
import numpy as np

from iekit.cli.support import SEED, threads_option
from iekit.formats.atomic import check_new_file, write_file_atomic
from iekit.formats.errors import IEError
from iekit.formats.fileio import SMALL_FILE_MAX, utf8_text
from iekit.formats.model_spec import ARCHITECTURES

from . import cuda, expert_copies, kv_cache
from .env import ACTS
from .sampling import Sampler, stream
from .token_ids import parse_ids
from .gguf_models import model_dir_flag

_model_dir = model_dir_flag("IEBIN model directory, or a .gguf (imported once, cached): "
                            f"{', '.join(a.removesuffix('ForCausalLM') for a in ARCHITECTURES)}.")
_threads = threads_option("Decoder threads.")
_ctx = click.option("--ctx", type=click.IntRange(min=1), default=None,
                    help="KV cache positions [min(max_position_embeddings, 4096)]; at most "
                         "max_position_embeddings, and the KV cache must fit the memory available.")
_act = click.option("--act", type=click.Choice(ACTS), default="auto", show_default=True,
                    help="Activations into quantized matrices: f32, or int8 (a scale per 32 elements, per 256 for the "
                         "super-block types, as llama.cpp's q8_K; faster, less exact); auto: "
                         "int8 where layer matrices have fewer than 8 bits per weight (4-bit types), else f32 "
                         "(always f32 with --device cuda).")
_device = click.option("--device", type=click.Choice(cuda.DEVICES), default="cpu", show_default=True,
                       help="Where the decoder runs: cpu, or cuda (a CUDA build of iekit and a visible GPU; the "
                            "weights are uploaded once, f32 activations).")


# C0 controls other than newline and tab would drive the terminal (a tiny
# model happily emits \x0e, "shift out"); streamed text shows them escaped.
_CONTROLS = {c: f"\\x{c:02x}" for c in range(32) if chr(c) not in "\n\t"} | {0x7F: "\\x7f"}


def printable(text: str) -> str:
    return text.translate(_CONTROLS)


def read_stdin_text(what: str) -> str:
    """Standard input as UTF-8 text, at most the text reader's size (``--prompt -``)."""
    data = sys.stdin.buffer.read(SMALL_FILE_MAX + 1)
    if len(data) > SMALL_FILE_MAX:
        raise IEError(f"{what}: standard input holds more than {SMALL_FILE_MAX} bytes")
    return utf8_text(data, f"{what}: standard input")


def prompt_ids(dec, prompt: str | None, ids: str | None) -> list[int]:
    if (prompt is None) == (ids is None):
        raise click.UsageError("give exactly one of --prompt and --ids")
    if prompt is not None:
        return dec.encode(prompt)
    try:
        return parse_ids(ids)
    except ValueError as e:
        raise IEError(f"--ids: {e}") from None


def chat_ids(dec, model_dir: Path, messages: list[dict[str, str]]) -> list[int]:
    """The conversation in the model's chat template (runtime/chat.py), ready for the assistant's turn."""
    from .chat import load_template, render

    template, specials, source = load_template(model_dir)
    return dec.encode(render(template, specials, messages, str(source)),
                      add_special_tokens=False)


def chat_loop(dec, model_dir: Path, system: str | None, max_new: int, sampler: Sampler, ignore_eos: bool) -> None:
    """``--chat`` without ``--prompt``: each line of standard input is the
    user's next message, answered in the conversation so far (whose prefix
    the KV cache keeps: only the new turn is computed), until end of input."""
    from .chat import load_template

    load_template(model_dir)  # no template: one error line before anything is read
    messages = [{"role": "system", "content": system}] if system is not None else []
    tty = sys.stdin.isatty()
    while True:
        if tty:
            click.echo("> ", nl=False, err=True)
        raw = sys.stdin.buffer.readline(SMALL_FILE_MAX)
        if not raw:
            return
        line = utf8_text(raw, "standard input").rstrip("\n")  # bytes: bad UTF-8 is one line, not exit 3
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = _generate_one(dec, chat_ids(dec, model_dir, messages), max_new, sampler, ignore_eos, False)
        messages.append({"role": "assistant", "content": reply})


@click.command("generate")
@_model_dir
@click.option("-p", "--prompt", help="Prompt text (tokenized with the model's tokenizer.json); - reads it from standard input.")
@click.option("--ids", help="Prompt as comma-separated token ids (models without a tokenizer).")
@click.option("--prompts-file", type=click.Path(path_type=Path, dir_okay=False),
              help="Or many prompts, one per line (text, or 'ids: 1,2,3'; blank lines skipped), each generated "
                   "in turn with the same settings (one JSON line each with --json).")
@click.option("--chat", is_flag=True,
              help="Wrap the prompt as the user's message in the model's chat template (tokenizer_config.json), "
                   "for instruction-tuned models.")
@click.option("--system", help="With --chat: a system message first.")
@click.option("-n", "--max-new", default=32, show_default=True, type=click.IntRange(min=0),
              help="New tokens at most (EOS stops earlier; llama-cli's -n).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at EOS: generate exactly --max-new tokens.")
@click.option("--temp", default=0.0, show_default=True, help="Sampling temperature; 0 is greedy.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0),
              help="Sample among the k most likely tokens only (0: off).")
@click.option("--top-p", default=1.0, show_default=True, help="Nucleus sampling: keep the most likely tokens up to this mass.")
@click.option("--min-p", default=0.0, show_default=True,
              help="Drop tokens less likely than this fraction of the most likely one (0: off).")
@click.option("--repeat-penalty", default=1.0, show_default=True,
              help="llama.cpp's repetition penalty on the last --repeat-last-n tokens (1: off; greedy too).")
@click.option("--repeat-last-n", default=64, show_default=True, type=click.IntRange(min=0),
              help="Tokens the repetition penalty looks back over.")
@click.option("--seed", type=SEED, default=None, help="Sampling seed (reproducible runs).")
@_threads
@_ctx
@_act
@_device
@kv_cache.options
@expert_copies.option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (prompt and generated ids, text).")
def generate_cmd(model_dir, prompt, ids, prompts_file, chat, system, max_new, ignore_eos, temp, top_k, top_p, min_p,
                 repeat_penalty, repeat_last_n, seed, threads, ctx, act, device, cache_type_k, cache_type_v, experts,
                 as_json):
    """Generate text from a prompt: greedy by default, --temp/--top-k/--top-p/--min-p/--seed to sample.

    The text streams to stdout as tokens come (control characters shown as
    \\xNN; a final EOS token is not printed); the speed goes to stderr at
    the end. With --json nothing streams and one object with the exact ids
    and text is printed at the end (no timings: the same run, the same
    bytes). --chat formats the prompt with the model's chat template (as
    transformers' apply_chat_template does); --chat without --prompt is a
    conversation on standard input, one message per line, until its end.
    --prompts-file runs many prompts in one process (the model is loaded
    once). Generation stops where the context (--ctx) is full, with a note.
    """
    from .bench_run import read_prompts, tokenize
    from .chat import first_turn
    from .decoder import Decoder

    if system is not None and not chat:
        raise click.UsageError("--system only applies with --chat")
    if prompts_file is not None and (prompt is not None or ids is not None):
        raise click.UsageError("give --prompts-file, or --prompt / --ids, not both")
    if chat and ids is not None:
        raise click.UsageError("--chat takes --prompt, not --ids")
    if ids is None and prompt is None and prompts_file is None and not chat:
        raise click.UsageError("give --prompt, --ids or --prompts-file (or --chat alone, to chat on standard input)")
    try:
        sampler = Sampler(temp, top_p, seed, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty,
                          repeat_last_n=repeat_last_n)
    except IEError as e:  # a value out of range is bad usage (exit 2), as for every other option
        raise click.UsageError(str(e)) from None
    if prompt == "-":
        prompt = read_stdin_text("--prompt -")
    lines = read_prompts(prompts_file)[1] if prompts_file is not None else None
    bad = next((ln for ln in lines or [] if chat and ln.ids is not None), None)
    if bad is not None:  # before anything runs
        raise IEError(f"{bad.where}: --chat takes text prompts, not 'ids:' lines")
    interactive = chat and prompt is None and lines is None
    if interactive and as_json:
        raise click.UsageError("--json needs --prompt (without it, --chat reads a conversation from standard input)")
    dec = Decoder(model_dir, threads=threads, ctx=ctx, act=act, device=device, cache_type_k=cache_type_k,
                  cache_type_v=cache_type_v, experts=experts)
    if interactive:
        chat_loop(dec, model_dir, system, max_new, sampler, ignore_eos)
        return
    if lines is None:
        pids = chat_ids(dec, model_dir, first_turn(prompt, system)) if chat else prompt_ids(dec, prompt, ids)
        _generate_one(dec, pids, max_new, sampler, ignore_eos, as_json)
        return
    # Every prompt is tokenized and checked (vocabulary, context) before the first one runs.
    # (generation stops where the context is full, so only the prompts themselves must fit)
    all_ids = ([chat_ids(dec, model_dir, first_turn(ln.text, system)) for ln in lines] if chat
               else tokenize(lines, dec, 1))
    for line, pids in zip(lines, all_ids):
        if not as_json:
            click.echo(f"### {line.where}: {printable(line.text) if line.text is not None else 'ids'}")
        _generate_one(dec, pids, max_new, sampler, ignore_eos, as_json)


def _generate_one(dec, pids: list[int], max_new: int, sampler: Sampler, ignore_eos: bool, as_json: bool) -> str:
    """One prompt's generation, streamed (or one JSON line), then its speed
    on stderr; returns the text (the ids, without a tokenizer)."""
    has_tok = dec.has_tokenizer
    new: list[int] = []
    shown = ""

    def visible() -> list[int]:  # the generated ids as text shows them: a final EOS is not text
        return new[:-1] if new and new[-1] in dec.eos_ids and not ignore_eos else new

    dec.check_ids(pids)  # the prompt fits the context; generation then stops where the context is full
    room = dec.max_ctx - len(pids) + 1  # the last token generated is never fed back: it takes no position
    limit = min(max_new, room)
    t0 = time.perf_counter()
    t_first = None
    try:
        for tok in stream(dec, pids, limit, sampler, stop_at_eos=not ignore_eos):
            t_first = t_first or time.perf_counter()
            new.append(tok)
            if as_json:
                continue
            text = dec.decode(visible()) if has_tok else " ".join(map(str, visible()))
            # Byte-level tokens may end mid-character: print only what is settled.
            if not text.endswith("\ufffd"):
                click.echo(printable(text[len(shown):]), nl=False)
                sys.stdout.flush()
                shown = text
    except BaseException:
        if shown:  # end the streamed line, so that the error (or "interrupted") starts a line of its own
            click.echo()
            sys.stdout.flush()
        raise
    t_end = time.perf_counter()
    full = limit < max_new and len(new) == limit and not (new and new[-1] in dec.eos_ids and not ignore_eos)
    text = dec.decode(visible()) if has_tok else None
    reply = text if text is not None else " ".join(map(str, visible()))
    if as_json:  # exact and reproducible: the same run prints the same object (no timings)
        click.echo(json.dumps({"prompt_ids": pids, "generated_ids": new, "text": text,
                               "stopped_at_eos": bool(new) and new[-1] in dec.eos_ids and not ignore_eos,
                               "stopped_at_ctx": full}))
        return reply
    if text is not None and text != shown:
        click.echo(printable(text[len(shown):]), nl=False)
    click.echo()
    sys.stdout.flush()  # the text first, then the figures (stderr is unbuffered)
    prefill = (t_first or t_end) - t0
    tps = f", {(len(new) - 1) / (t_end - t_first):.1f} tok/s after the first" if t_first and len(new) > 1 else ""
    if full:  # llama.cpp's llama-simple stops here too (llama-cli would shift the context instead)
        click.echo(f"[stopped: the context of {dec.max_ctx} positions is full (--ctx raises it)]", err=True)
    click.echo(f"[{len(pids)} prompt tokens in {prefill:.2f} s; {len(new)} generated{tps}]", err=True)
    return reply


@click.command("logits")
@_model_dir
@click.option("--ids", help="Token ids, comma-separated.")
@click.option("--prompt", help="Or text, tokenized with the model's tokenizer.json.")
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Output .npy: float32 [n_ids, vocab], row i = logits after ids[:i+1].")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")
@_threads
@_ctx
@_act
@_device
@kv_cache.options
@expert_copies.option
def logits_cmd(model_dir, ids, prompt, out_path, overwrite, threads, ctx, act, device, cache_type_k, cache_type_v,
               experts):
    """Write the logits of every position of one sequence to a .npy file.

    The file is written under a temporary name and renamed, so a failed run
    never leaves a partial file. An existing file is not replaced without
    --overwrite; the folder must exist.
    """
    from .decoder import Decoder

    check_new_file(out_path, overwrite)
    dec = Decoder(model_dir, threads=threads, ctx=ctx, act=act, device=device, cache_type_k=cache_type_k,
                  cache_type_v=cache_type_v, experts=experts)
    seq = prompt_ids(dec, prompt, ids)
    out = dec.logits(seq)
    buf = io.BytesIO()
    np.save(buf, out.astype(np.float32, copy=False))
    write_file_atomic(out_path, buf.getvalue(), replace=overwrite)
    click.echo(f"OK {out_path}: float32 {list(out.shape)}", err=True)
