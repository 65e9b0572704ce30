"""What the converters print on stderr: the progress bar they drive and
their closing lines (hf-to-iebin, gguf-to-iebin, gptq)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from iekit.cli.support import stderr_console

from .artifact_out import ConvertResult
from .artifact_out import Progress as ConvertProgress

err = stderr_console()


@contextmanager
def convert_progress(quiet: bool) -> Iterator[ConvertProgress]:
    """A rich progress bar (bytes, speed, time left) on stderr, as the converter's callbacks."""
    with Progress(TextColumn("{task.description:<40.40}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                  disable=quiet, transient=True) as bar:
        state: dict = {}

        def start(label: str, total: int) -> None:
            if "task" in state:
                bar.remove_task(state["task"])
            state["task"] = bar.add_task(label, total=total)

        yield ConvertProgress(start=start, advance=lambda n: bar.advance(state["task"], n),
                              describe=lambda t: bar.update(state["task"], description=t))


WORST_SHOWN = 5  # matrices the converters list by predicted loss


def report_conversion(res: ConvertResult) -> None:
    """The converters' closing lines on stderr: warnings, and the matrices
    quantization hurt most by its own prediction."""
    for w in res.warnings or []:
        err.print(f"warning: {w}", markup=False)
    if res.removed:
        err.print(f"removed the previous artifact's {', '.join(res.removed)} from {res.out_dir} "
                  "(not part of the new one)", markup=False)
    if not res.errors:
        return
    worst = sorted(res.errors.items(), key=lambda kv: -kv[1].sq_error)[:WORST_SHOWN]
    if any(e.compensated for e in res.errors.values()):
        how, head = "under the input covariance", "Σ δHδᵀ"
    elif any(e.weighted for e in res.errors.values()):
        how, head = "importance-weighted", "Σ imp·(w−ŵ)²"
    else:
        how, head = "unweighted", "Σ (w−ŵ)²"
    table = Table(title=f"predicted loss (squared error added to the outputs, {how}): the {len(worst)} largest of "
                        f"{len(res.errors)} quantized matrices (all: ieconv inspect {res.out_dir})",
                  title_justify="left")
    for col in ("tensor", head, "share", "SQNR dB"):
        table.add_column(col, justify="left" if col == "tensor" else "right")
    total = sum(e.sq_error for e in res.errors.values())
    for name, e in worst:
        table.add_row(name, f"{e.sq_error:.4g}", f"{e.sq_error / total:.1%}" if total else "", f"{e.sqnr_db:.1f}")
    err.print(table)
