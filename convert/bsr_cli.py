"""``ieconv block-sparse`` and the BSR side of ``ieconv validate`` / ``inspect``.

Kept out of convert/cli.py so the format's commands live next to each other;
cli.py registers ``block_sparse_cmd`` and hands ``validate``/``inspect`` a
path to ``validate_bsr``/``inspect_bsr`` when ``bsr.is_bsr_path`` says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from iekit.cli.support import human_bytes, stdout_console
from iekit.formats import bsr

from .block_sparse import convert_file

out = stdout_console()


def summary(m: bsr.BsrMatrix) -> dict:
    """The numbers `inspect --json` prints (and the converter's --json reuses)."""
    per_row = np.diff(m.row_ptr.astype(np.int64))
    return {
        "rows": m.rows, "cols": m.cols, "block_rows": m.block_rows, "block_cols": m.block_cols,
        "n_block_rows": m.n_block_rows, "n_block_cols": m.n_block_cols,
        "blocks": m.n_block_rows * m.n_block_cols, "nnzb": m.nnzb, "density": m.density,
        "blocks_per_block_row": {"min": int(per_row.min()), "max": int(per_row.max()),
                                 "mean": float(per_row.mean())},
        "empty_block_rows": int((per_row == 0).sum()),
        "bytes": {"row_ptr": 4 * (m.n_block_rows + 1), "col_idx": 4 * m.nnzb, "values": int(m.values.nbytes),
                  "file": m.file_bytes, "dense_f32": m.dense_bytes},
        "bytes_vs_dense": m.file_bytes / m.dense_bytes,
    }


def _line(m: bsr.BsrMatrix) -> str:
    return (f"{m.rows}×{m.cols} f32, {m.block_rows}×{m.block_cols} blocks, {m.nnzb} of "
            f"{m.n_block_rows * m.n_block_cols} stored (density {m.density:.4f}), "
            f"{human_bytes(m.file_bytes)} vs {human_bytes(m.dense_bytes)} dense ({m.file_bytes / m.dense_bytes:.3f}×)")


def validate_bsr(path: Path, allow_nonfinite: bool) -> None:
    m = bsr.read(path, allow_nonfinite=allow_nonfinite)
    out.print(f"OK {path}: BSR v{bsr.VERSION}, {_line(m)}, crc32 verified", markup=False)


def inspect_bsr(path: Path, as_json: bool, allow_nonfinite: bool) -> None:
    m = bsr.read(path, allow_nonfinite=allow_nonfinite)
    s = summary(m)
    if as_json:
        click.echo(json.dumps({"path": str(path), "format": "bsr", "version": bsr.VERSION, **s}, sort_keys=True))
        return
    t = Table(title=f"{path}", show_header=False)
    t.add_row("format", f"BSR v{bsr.VERSION}, f32 values")
    t.add_row("shape", f"{m.rows} × {m.cols}")
    t.add_row("block", f"{m.block_rows} × {m.block_cols}")
    t.add_row("block grid", f"{m.n_block_rows} × {m.n_block_cols} = {s['blocks']} blocks")
    t.add_row("stored blocks", f"{m.nnzb} (density {m.density:.4f})")
    pr = s["blocks_per_block_row"]
    t.add_row("blocks per block row", f"min {pr['min']}, mean {pr['mean']:.2f}, max {pr['max']}; "
              f"{s['empty_block_rows']} empty")
    b = s["bytes"]
    t.add_row("bytes", f"row_ptr {human_bytes(b['row_ptr'])}, col_idx {human_bytes(b['col_idx'])}, values {human_bytes(b['values'])}")
    t.add_row("file vs dense f32", f"{human_bytes(b['file'])} vs {human_bytes(b['dense_f32'])} ({s['bytes_vs_dense']:.3f}×)")
    out.print(t)


@click.command("block-sparse")
@click.argument("dense", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--rows", type=click.IntRange(min=1), help="Rows of a raw float32 .bin input.")
@click.option("--cols", type=click.IntRange(min=1), help="Columns of a raw float32 .bin input.")
@click.option("--model-dir", type=click.Path(path_type=Path), help="IEBIN model directory to take --tensor from.")
@click.option("--tensor", help="Name of a 2-D f32/f16/bf16 tensor in --model-dir, or STACK[e]: expert e of a stack "
              "[experts, rows, cols].")
@click.option("--block-rows", required=True, type=click.IntRange(1, bsr.U32_MAX), help="Block height.")
@click.option("--block-cols", required=True, type=click.IntRange(1, bsr.U32_MAX), help="Block width.")
@click.option("--threshold", type=float, help="Drop blocks whose max |value| <= T.")
@click.option("--keep-density", type=float, help="Keep the ceil(D × blocks) blocks of largest L2 norm (0 <= D <= 1).")
@click.option("-o", "--out", "out_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Output .bsr file.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--allow-nonfinite", is_flag=True, help="Store NaN/Inf values instead of refusing them.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the summary line.")
def block_sparse_cmd(dense, rows, cols, model_dir, tensor, block_rows, block_cols, threshold, keep_density,
                     out_path, overwrite, allow_nonfinite, as_json):
    """Convert a dense matrix to a block-sparse BSR file (docs/formats/bsr.md).

    \b
    DENSE is a .npy (float32, or float16/bfloat16 widened exactly) or a raw
    little-endian float32 .bin with --rows/--cols; or take a tensor from an
    IEBIN model with --model-dir/--tensor (f32, f16, bf16; one expert of a
    stack as STACK[e], e.g. 'model.layers.0.mlp.experts.down_proj[3]').

    \b
    Policies (default: exact, lossless — every block holding a non-zero):
      --threshold T      drop blocks whose max |value| <= T
      --keep-density D   keep the top D fraction of blocks by L2 norm
                         (ties: lower block index first)
    All-zero blocks are never stored. Reports the kept density and the
    relative Frobenius norm of what was dropped. Written atomically; the
    same input and options always give the same bytes.
    """
    if threshold is not None and keep_density is not None:
        raise click.UsageError("--threshold and --keep-density are alternatives; give at most one")
    conv, label = convert_file(out_path, block_rows, block_cols, dense=dense, rows=rows, cols=cols,
                               model_dir=model_dir, tensor=tensor, threshold=threshold, keep_density=keep_density,
                               overwrite=overwrite, allow_nonfinite=allow_nonfinite)
    m = conv.matrix
    if as_json:
        click.echo(json.dumps({"out": str(out_path), "source": label, "policy": conv.policy,
                               "kept_blocks": conv.kept_blocks, "total_blocks": conv.total_blocks,
                               "kept_density": conv.density, "dropped_rel_frobenius": conv.dropped_rel_frobenius,
                               **summary(m)}, sort_keys=True))
        return
    out.print(f"OK {out_path}: {conv.policy}, kept {conv.kept_blocks} of {conv.total_blocks} blocks "
              f"(density {conv.density:.4f}), dropped rel. Frobenius error {conv.dropped_rel_frobenius:.3e}; "
              f"{human_bytes(m.file_bytes)} vs {human_bytes(m.dense_bytes)} dense ({m.file_bytes / m.dense_bytes:.3f}×)",
              markup=False)
