"""``ierun verify bsr``: prove a .bsr file against the dense matrix it came from.

Checks, each pass/fail:
  1. load: the C++ loader accepts the file (every rule, crc32 included) and so
     does the Python reader (formats/bsr.py, the reference);
  2. structure: both see the same dims, row_ptr, col_idx and values (bit for bit);
  3. blocks: every stored block holds exactly the dense input's values (the
     file is this matrix, sparsified, not another one of the same shape);
  4. gemv: the native kernel of every ISA available here, single (with a bias)
     and batched (b = 4 and 8), agrees with float64 over the stored blocks:
     |y - ref| <= 1e-5 × (|A| @ |x| + |bias|) element-wise.
Reported, not checked: the relative Frobenius norm of what was dropped,
||dense - A||_F / ||dense||_F (0 for an exact conversion).
Exit 0 only when every check holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from iekit.cli.support import SEED, stdout_console, threads_option
from iekit.formats import bsr
from iekit.formats.dense_matrix import load_dense
from iekit.formats.errors import FormatError, IEError

from . import cuda
from .kernels import max_rel_error
from .memory import available_bytes, gib
from .native import _native
from .gguf_models import model_dir_option

GEMV_RTOL = 1e-5
BATCHES = (1, 4, 8)
# The checks hold the matrix densely several times over (float32 and float64
# copies, |A|, the kept-block mask, the GEMV outputs): about this many bytes
# per element at the peak. A matrix is verified only when that fits the memory
# available and it has at most MAX_DENSE_ELEMENTS elements (docs/formats/bsr.md);
# a .bsr file of a few bytes can declare any rows × cols.
DENSE_BYTES_PER_ELEMENT = 40
MAX_DENSE_ELEMENTS = 1 << 32

out = stdout_console()


def gemv_max_rel(native_m, ref: bsr.BsrMatrix, isa: str, threads: int, rng: np.random.Generator,
                 allow_nonfinite: bool = False, a64: np.ndarray | None = None) -> float:
    """kernels.max_rel_error over a single GEMV with bias and the batched ones.
    A non-finite output fails, except that with --allow-nonfinite the rows
    reached by the NaN/Inf values the user accepted must be non-finite and
    are not measured."""
    if a64 is None:
        a64 = ref.to_dense(np.float64)
    worst = 0.0
    for b in BATCHES:
        x = rng.standard_normal((b, ref.cols)).astype(np.float32)
        bias = rng.standard_normal(ref.rows).astype(np.float32) if b == 1 else None
        y = native_m.gemv(x[0] if b == 1 else x, bias=bias, threads=threads, isa=isa).reshape(b, -1)
        worst = max(worst, max_rel_error(y, x, a64, bias, allow_nonfinite))
    return worst


def check_dense_size(path: Path, rows: int, cols: int) -> None:
    """Refuse, before allocating, a matrix whose dense checks cannot fit."""
    n = rows * cols
    if n > MAX_DENSE_ELEMENTS:
        raise FormatError(path, "rows", f"{rows}×{cols} = {n} elements is more than verify bsr checks densely "
                          f"({MAX_DENSE_ELEMENTS})")
    need, avail = n * DENSE_BYTES_PER_ELEMENT, available_bytes()
    if avail is not None and need > avail:
        raise FormatError(path, "rows", f"verifying a {rows}×{cols} matrix needs about {gib(need)} for its dense "
                          f"references, more than the {gib(avail)} of memory available")


def verify_bsr(path: Path, dense: np.ndarray, threads: int, seed: int, allow_nonfinite: bool = False,
               device: str = "cpu") -> dict:
    try:
        native_m = _native.BsrMatrix.load(str(path), allow_nonfinite=allow_nonfinite)
    except ValueError as e:
        raise IEError(str(e)) from None
    ref = bsr.read(path, allow_nonfinite=allow_nonfinite)
    if dense.shape != (ref.rows, ref.cols):
        raise IEError(f"{path}: the matrix is {ref.rows}×{ref.cols} but the dense input is "
                      f"{'×'.join(map(str, dense.shape))}")
    check_dense_size(path, ref.rows, ref.cols)
    checks: dict[str, bool] = {"load": True}
    checks["structure"] = bool(
        (native_m.rows, native_m.cols, native_m.block_rows, native_m.block_cols, native_m.nnzb)
        == (ref.rows, ref.cols, ref.block_rows, ref.block_cols, ref.nnzb)
        and np.array_equal(native_m.row_ptr, ref.row_ptr) and np.array_equal(native_m.col_idx, ref.col_idx)
        and np.array_equal(native_m.values.view(np.uint32), ref.values.view(np.uint32)))
    stored = ref.to_dense()
    grid = np.zeros((ref.n_block_rows, ref.n_block_cols), bool)
    grid[ref.block_coords()] = True
    # Each block row/column repeated as many times as it has rows/columns inside
    # the matrix (never the padded block size: a block may dwarf the matrix).
    in_r = np.minimum(ref.block_rows, ref.rows - np.arange(ref.n_block_rows, dtype=np.int64) * ref.block_rows)
    in_c = np.minimum(ref.block_cols, ref.cols - np.arange(ref.n_block_cols, dtype=np.int64) * ref.block_cols)
    kept = np.repeat(np.repeat(grid, in_r, 0), in_c, 1)
    checks["blocks"] = bool(np.array_equal(stored[kept].view(np.uint32), dense[kept].view(np.uint32)))
    rng = np.random.default_rng(seed)
    isas = _native.cpu_features()["isas"]
    a64 = ref.to_dense(np.float64)
    rel = {isa: gemv_max_rel(native_m, ref, isa, threads, rng, allow_nonfinite, a64) for isa in isas}
    if device == "cuda":  # the device kernel too, held to the same reference
        rel["cuda"] = gemv_max_rel(cuda.DeviceBsr(native_m), ref, "", threads, rng, allow_nonfinite, a64)
    del a64
    checks["gemv"] = all(v <= GEMV_RTOL for v in rel.values())
    d64 = dense.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where a kept block holds inf
        total = float(np.nansum(d64 * d64))
        dropped = float(np.nansum(np.where(kept, 0.0, d64) ** 2))  # = the dropped blocks' mass when `blocks` holds
    return {
        "ok": all(checks.values()), "path": str(path), "rows": ref.rows, "cols": ref.cols,
        "block_rows": ref.block_rows, "block_cols": ref.block_cols, "nnzb": ref.nnzb, "density": ref.density,
        "checks": checks, "gemv_max_rel": rel, "gemv_rtol": GEMV_RTOL, "batches": list(BATCHES),
        "threads": threads, "dropped_rel_frobenius": (dropped / total) ** 0.5 if total > 0 else 0.0,
    }


def print_report(r: dict) -> None:
    mark = {True: "[green]ok[/]", False: "[red bold]FAIL[/]"}
    t = Table(title=f"ierun verify bsr {r['path']}", show_header=False)
    t.add_row("matrix", f"{r['rows']}×{r['cols']}, {r['block_rows']}×{r['block_cols']} blocks, "
              f"{r['nnzb']} stored (density {r['density']:.4f})")
    t.add_row("load (C++ and Python)", mark[r["checks"]["load"]])
    t.add_row("structure C++ == Python", mark[r["checks"]["structure"]])
    t.add_row("stored blocks == dense input", mark[r["checks"]["blocks"]])
    for isa, v in r["gemv_max_rel"].items():
        t.add_row(f"gemv {isa} (b = {', '.join(map(str, r['batches']))})",
                  f"{mark[v <= r['gemv_rtol']]} max rel {v:.1e} (<= {r['gemv_rtol']:g})")
    t.add_row("dropped rel. Frobenius", f"{r['dropped_rel_frobenius']:.3e}")
    out.print(t)


@click.command("bsr")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--dense", "dense_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The dense source: .npy, or raw float32 .bin with --rows/--cols.")
@click.option("--rows", type=click.IntRange(min=1), help="Rows of a raw .bin --dense.")
@click.option("--cols", type=click.IntRange(min=1), help="Columns of a raw .bin --dense.")
@click.option("--model-dir", callback=model_dir_option, type=click.Path(path_type=Path), help="IEBIN model holding the dense --tensor.")
@click.option("--tensor", help="Tensor name in --model-dir (STACK[e]: expert e of a stack).")
@threads_option("GEMV threads.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random x and bias.")
@click.option("--allow-nonfinite", is_flag=True,
              help="Accept NaN/Inf values (as written by ieconv block-sparse --allow-nonfinite); "
                   "GEMV outputs they reach must be non-finite and are not measured.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
@click.option("--device", type=click.Choice(cuda.DEVICES), default="cpu", show_default=True,
              help="cuda: also check the CUDA BSR kernel (a `make build-cuda` build and a GPU).")
def verify_bsr_cmd(path, dense_path, rows, cols, model_dir, tensor, threads, seed, allow_nonfinite, as_json, device):
    """Verify a .bsr file: C++ and Python loaders agree, the stored blocks are
    the dense input's, and the native GEMV (single and batched, every ISA,
    and the CUDA kernel with --device cuda) matches float64 (rel. error <=
    1e-5); reports the dropped mass."""
    if device == "cuda":
        cuda.require("ierun verify bsr")
    dense, _label = load_dense(dense_path, rows, cols, model_dir, tensor)
    r = verify_bsr(path, dense, threads, seed, allow_nonfinite, device)
    if as_json:
        click.echo(json.dumps(r, sort_keys=True))
    else:
        print_report(r)
    if not r["ok"]:
        raise IEError(f"verify bsr: {path}: failed: {', '.join(k for k, v in r['checks'].items() if not v)}")
    if not as_json:
        out.print(f"OK {path}: structure, blocks and GEMV verified", markup=False)
