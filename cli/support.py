"""What both command-line tools (ieconv, ierun) share: the error contract and the console.

A user error ends as one line on stderr and a non-zero exit status, never a
traceback: exit 1 for bad input (IEError, OS errors), 2 for bad usage
(click), 130 on Ctrl-C (at any moment, start-up included: the console
scripts enter through convert/entry.py and runtime/entry.py), 3 for an
internal bug (traceback with IE_DEBUG=1).
Warnings (e.g. a dedup artifact that cannot be used) are one line too,
``warning: message``, without Python's source-line echo.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

import click

from iekit.formats.errors import IEError
from iekit.formats.workers import physical_cores

from .interrupt import exit_interrupted


def stdout_console():
    """The console results are printed on. soft_wrap: a result line stays one
    line however narrow the terminal; piped output gets a wide page so tables
    never truncate tensor names. No emoji codes: a path or tensor name with
    ``:fire:`` in it prints as written (and rich's emoji table, 10 ms to
    import, is never loaded)."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 200)


def stderr_console():
    """The console progress bars, summaries and warnings go to: as
    stdout_console, on stderr, at the terminal's width."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


MAX_THREADS = 4096  # what a native thread pool accepts (csrc/common/thread_pool.cpp)
# Every --seed: what numpy's generators accept (a negative seed was an internal error, exit 3).
SEED = click.IntRange(0, 2**63 - 1)


class FiniteFloat(click.FloatRange):
    """click's FloatRange without NaN and ±inf, which compare false to every
    bound and so pass it: ``--target-bpw nan`` was a manifest "meeting" a
    target of nan."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{v} is not a finite number.", param, ctx)
        return v


def threads_option(what: str):
    """The one ``--threads`` of every command that computes (generate, eval,
    verify, bench, microbench, info, imatrix, gptq, kl-probes): by default the
    physical cores this process may use, so a user on a 32-core machine does
    not silently get one thread (a second hyperthread per core adds no memory
    bandwidth to a memory-bound decode); at most MAX_THREADS, a usage error
    before anything is loaded rather than a refusal deep in the native code."""
    return click.option("--threads", type=click.IntRange(min=1, max=MAX_THREADS), default=None,
                        callback=lambda _ctx, _param, v: physical_cores() if v is None else v,
                        help=f"{what}  [default: the physical cores this process may use]")


def split_max_size_option(what: str):
    """``--split-max-size`` (iebin-to-gguf, quantize --gguf) as convert_hf_to_gguf.py reads it: bytes, or N
    with K, M or G (powers of 1000)."""

    def parse(_ctx, _param, value: str | None) -> int | None:
        if value is None:
            return None
        text = value.strip().upper()
        scale = {"K": 1000, "M": 1000**2, "G": 1000**3}.get(text[-1:], 1)
        digits = text[:-1] if scale > 1 else text
        if not digits.isdigit() or int(digits) < 1:
            raise click.BadParameter(f"{value!r}: a positive number of bytes, or N followed by K, M or G (50G)")
        return int(digits) * scale

    text = ("split into files of at most this many tensor bytes (K, M, G: 1000, 1000², 1000³), named as "
            "llama.cpp's gguf-split names them: OUT-00001-of-0000N.gguf; llama.cpp, and every GGUF input here, "
            "opens them from the first. Hugging Face takes files up to 50G.")
    return click.option("--split-max-size", callback=parse, metavar="N[K|M|G]",
                        help=f"{what} {text}" if what else text[0].upper() + text[1:])


def human_bytes(n: int) -> str:
    """1536 -> '1.50 KiB' (binary units), for summaries and tables."""
    if n < 1024:
        return f"{n} B"
    e = min(int(math.log(n, 1024)), 4)
    return f"{n / 1024 ** e:.2f} {'BKMGT'[e]}iB"


def _fail(msg: str, code: int) -> int:
    click.echo(msg, err=True)
    return code


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"warning: {message}", err=True)


def run_cli(group: click.Group, prog_name: str) -> None:
    warnings.showwarning = _one_line_warning
    try:
        rc = group.main(prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort as e:  # click's wrapping of Ctrl-C (and of EOF at a prompt)
        if isinstance(e.__cause__, KeyboardInterrupt):
            exit_interrupted()
        rc = _fail("aborted", 130)
    except click.ClickException as e:
        e.show()
        rc = e.exit_code
    except IEError as e:
        rc = _fail(f"error: {e}", 1)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        rc = _fail(f"error: {where}{e.strerror or e}", 1)
    except KeyboardInterrupt:
        exit_interrupted()
    except Exception as e:  # a bug: keep the one-line contract, offer the traceback
        if os.environ.get("IE_DEBUG") == "1":
            raise
        rc = _fail(f"internal error: {type(e).__name__}: {e} (set IE_DEBUG=1 for a traceback)", 3)
    sys.exit(rc if isinstance(rc, int) else 0)
