"""``ierun verify``: prove an artifact's numerics, tensor by tensor.

``verify quant`` checks every quantized tensor of an IEBIN model:
  1. checksum: the payload's digest equals the one in model.ie.json (the
     payload as the runtime reads it: with IE_DEDUP=1, rebuilt by the dedup
     loader where the tensor is grouped);
  1b. finite: every stored scale/minimum is finite (formats/finite.py) and
     so is every dequantized weight; a NaN/Inf is a failure naming where it is;
  2. dequant: the C++ dequantizer equals the Python reference
     (formats/quant.py) bit for bit;
  3. gemv: the fused C++ GEMV (float activations) on random x, single and
     batched, agrees with float64 ``W_deq @ x``: |y - ref| <= 1e-5 * (|W_deq| @ |x|)
     element-wise (relative to the magnitude of the products summed); a
     non-finite output is a failure, never skipped;
  4. with --hf-dir: every element is within the scheme's rounding bound of
     the source value (not for error-compensated tensors, ieconv gptq: their
     codes were fitted to moved values); RMSE, max |error| and SQNR (dB) are reported.
Exit 0 only when every check of every tensor holds.
"""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from iekit.cli.support import SEED, stdout_console, threads_option
from iekit.formats import checksums, expert_stacks, iebin
from iekit.formats.casting import decode_f32
from iekit.formats.errors import IEError
from iekit.formats.finite import scan_bytes
from iekit.formats.hf_checkpoint import collect_tensors, from_dir
from iekit.formats.quant import SCHEMES, matrix_dims
from iekit.formats.safetensors_reader import CHUNK_BYTES

from . import cuda, kernels, plots
from .tensor_source import TensorSource
from .gguf_models import model_dir_flag

GEMV_RTOL = 1e-5
BATCH = 4

out = stdout_console()


@dataclass
class TensorReport:
    name: str
    dtype: str
    shape: list[int]
    checks: dict[str, bool] = field(default_factory=dict)
    gemv_max_rel: float | None = None
    rmse: float | None = None
    max_abs_err: float | None = None
    sqnr_db: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def check_gemv(raw: np.ndarray, t: dict, w_deq: np.ndarray, rng: np.random.Generator, threads: int,
               device: str = "cpu") -> float:
    """kernels.max_rel_error over a single and a batched GEMV."""
    worst = 0.0
    w64 = w_deq.astype(np.float64)
    for b in (1, BATCH):
        x = rng.standard_normal((b, w_deq.shape[1])).astype(np.float32)
        y = kernels.gemv(raw, t, x if b > 1 else x[0], threads=threads, device=device).reshape(b, -1)
        worst = max(worst, kernels.max_rel_error(y, x, w64))
    return worst


def check_source(src: expert_stacks.AsWritten, quantized: list[dict], hf_dir: Path, meta_path: Path) -> None:
    """--hf-dir must be this model's source: every quantized tensor there, as a
    float tensor of the same shape as written (gpt-oss's float stacks are
    transposed on conversion: formats/expert_stacks.py). Checked before any tensor is compared, so
    another model's checkpoint is one clear error, not a failure deep inside."""
    hint = f"is --hf-dir the checkpoint {meta_path.parent} was converted from?"
    missing = [t["name"] for t in quantized if t["name"] not in src.tensors]
    if missing:
        raise IEError(f"{hf_dir}: has no tensor {missing[0]!r}"
                      f"{f' (nor {len(missing) - 1} other quantized tensors)' if len(missing) > 1 else ''}; {hint}")
    for t in quantized:
        st, shape = src.tensors[t["name"]][1], src.shape(t["name"])
        if shape != list(t["shape"]):
            raise IEError(f"{hf_dir}: tensor {t['name']!r} has shape {shape} (as written) but {meta_path} records "
                          f"{t['shape']}; {hint}")
        if not st.dtype.is_float:
            raise IEError(f"{hf_dir}: tensor {t['name']!r} is {st.dtype.name}, not a float tensor "
                          f"that could have been quantized; {hint}")


def source_values(src: expert_stacks.AsWritten, name: str, shape: list[int]) -> np.ndarray | None:
    """The source tensor's values as written (a transposed stack [experts, out, in])."""
    if name not in src.tensors:
        return None
    st = src.tensors[name][1]
    raw = b"".join(src.chunks(name, CHUNK_BYTES, lambda _n: None))
    return decode_f32(raw, st.dtype.name).reshape(shape)


def verify_quant(model_dir: Path, hf_dir: Path | None, threads: int, seed: int,
                device: str = "cpu") -> list[TensorReport]:
    # Through the runtime's own tensor source: with IE_DEDUP=1 the bytes
    # checked are those the dedup loader rebuilds, as the decoder reads them.
    source = TensorSource(model_dir, threads=threads)
    model = source.model
    quantized = [t for t in model.tensors if t["dtype"] in SCHEMES]
    if not quantized:
        raise IEError(f"{model.meta_path}: no quantized tensors to verify")
    rng = np.random.default_rng(seed)
    reports = []
    with ExitStack() as stack:
        src = None
        if hf_dir:
            checkpoint = from_dir(hf_dir)
            src = expert_stacks.AsWritten(checkpoint.config, collect_tensors(checkpoint, stack))
            check_source(src, quantized, hf_dir, model.meta_path)
        for t in quantized:
            r = TensorReport(t["name"], t["dtype"], t["shape"])
            raw = source.get(t["name"])
            r.checks["checksum"] = checksums.digest(model.checksum, raw) == t[model.checksum]
            scheme = SCHEMES[t["dtype"]]
            # An expert stack is checked one matrix at a time (memory: one
            # expert's float64 copies, not the whole stack's).
            count, rows, cols = matrix_dims(t["shape"])
            params = scheme.params_from(t["quant"], cols)
            per, sub = len(raw) // count, {**t, "shape": [rows, cols]}
            # codes fitted to error-compensated values (formats/gptq.py): no per-element bound
            compensated = bool(t.get(iebin.ERROR_KEY, {}).get("compensated"))
            problem = scan_bytes(t, raw)
            w_all = source_values(src, t["name"], t["shape"]) if src else None
            worst, dequant_ok, bound_ok = 0.0, True, True
            sig = noise = max_abs = 0.0
            for k in range(count):
                part = raw[k * per:(k + 1) * per]
                with np.errstate(over="ignore", invalid="ignore"):
                    ref = scheme.dequantize(part, rows, cols, params)
                native = kernels.dequantize(part, sub, device=device)
                dequant_ok &= bool(np.array_equal(native.view(np.uint32), ref.view(np.uint32)))
                if problem is None and not np.isfinite(ref).all():
                    at = tuple(int(i) for i in np.argwhere(~np.isfinite(ref))[0])
                    problem = f"dequantized weight {((k,) if count > 1 else ()) + at} is {ref[at]!r} (float32 overflow)"
                worst = max(worst, check_gemv(part, sub, ref, rng, threads, device))
                if w_all is not None:
                    w = w_all.reshape(count, rows, cols)[k]
                    err = w.astype(np.float64) - ref
                    if not compensated:
                        bound_ok &= bool((np.abs(err) <= scheme.error_bound(w, part, params)).all())
                    sig += float(np.sum(w.astype(np.float64) ** 2))
                    noise += float(np.sum(err ** 2))
                    max_abs = max(max_abs, float(np.abs(err).max()))
            r.checks["dequant"] = dequant_ok
            r.checks["finite"] = problem is None
            if problem:
                r.notes.append(problem)
            # JSON has no infinity: a non-finite output (or error) is reported as null and fails.
            r.gemv_max_rel = worst if math.isfinite(worst) else None
            r.checks["gemv"] = worst <= GEMV_RTOL
            if not math.isfinite(worst):
                r.notes.append("GEMV output is not finite")
            if hf_dir and w_all is None:
                r.checks["bound"] = False
                r.notes.append("not in --hf-dir")
            elif hf_dir:
                if compensated:
                    r.notes.append("error-compensated: no rounding bound against the source")
                else:
                    r.checks["bound"] = bound_ok
                r.rmse = math.sqrt(noise / (count * rows * cols))
                r.max_abs_err = max_abs
                # None when the error is exactly zero (or the tensor is): JSON has no infinity.
                r.sqnr_db = 10 * math.log10(sig / noise) if noise > 0 and sig > 0 else None
            reports.append(r)
    return reports


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def print_table(reports: list[TensorReport], with_source: bool) -> None:
    t = Table(title="ierun verify quant")
    cols = ["tensor", "dtype", "checksum", "finite", "dequant", "gemv (max rel)"]
    if with_source:
        cols += ["bound", "RMSE", "max |err|", "SQNR dB"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("tensor", "dtype") else "right")
    mark = {True: "[green]ok[/]", False: "[red bold]FAIL[/]", None: "[dim]n/a[/]"}
    for r in reports:
        row = [r.name, r.dtype, mark[r.checks["checksum"]], mark[r.checks["finite"]], mark[r.checks["dequant"]],
               f"{mark[r.checks['gemv']]} {_fmt(r.gemv_max_rel, '.1e') or 'non-finite'}"]
        if with_source:
            row += [mark[r.checks.get("bound")], _fmt(r.rmse, ".3e"), _fmt(r.max_abs_err, ".3e"), _fmt(r.sqnr_db, ".1f")]
        t.add_row(*row)
    out.print(t)


@click.command("quant")
@model_dir_flag("IEBIN model directory, or a .gguf (imported once, cached).")
@click.option("--hf-dir", type=click.Path(path_type=Path), help="Source HF checkpoint: also check rounding bounds and report error stats.")
@threads_option("GEMV threads.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random activations.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw each tensor's SQNR and RMSE by layer and kind to this PNG, to see which tensors "
                   "the manifest should keep at higher precision (needs --hf-dir and matplotlib: "
                   "pip install 'iekit[plot]').")
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
@click.option("--device", type=click.Choice(cuda.DEVICES), default="cpu", show_default=True,
              help="Run the dequantizer and the GEMV on this device (cuda: a `make build-cuda` build and a GPU).")
def verify_quant_cmd(model_dir: Path, hf_dir: Path | None, threads: int, seed: int, as_json: bool,
                    plot_path: Path | None, overwrite: bool, device: str):
    """Verify every quantized tensor: checksum, C++ vs Python dequantization
    (bit-exact), fused GEMV vs float64 (rel. error <= 1e-5) and, with
    --hf-dir, the rounding bound against the source weights. With --device
    cuda the device's dequantizer and GEMV are the ones held to the references."""
    if device == "cuda":
        cuda.require("ierun verify quant")
    if plot_path is not None:
        if hf_dir is None:
            raise click.UsageError("--plot draws SQNR and RMSE against the source weights: give --hf-dir too")
        plots.check_target(plot_path, overwrite)
    reports = verify_quant(model_dir, hf_dir, threads, seed, device)
    if plot_path is not None:
        plots.tensor_plot(reports, f"ierun verify quant: {model_dir}", plot_path, overwrite)
    failed = [r for r in reports if not r.ok]
    if as_json:
        click.echo(json.dumps({"ok": not failed, "model_dir": str(model_dir), "device": device, "tensors": len(reports),
                               "failed": len(failed), "gemv_rtol": GEMV_RTOL,
                               "results": [{**asdict(r), "ok": r.ok} for r in reports]}, sort_keys=True))
    else:
        print_table(reports, hf_dir is not None)
    if failed:
        def why(r: TensorReport) -> str:
            s = f"{r.name}: " + ",".join(k for k, v in r.checks.items() if not v)
            return s + (f" [{r.notes[0]}]" if not r.checks["finite"] else "")

        raise IEError(f"verify quant: {len(failed)} of {len(reports)} quantized tensors failed "
                      f"({', '.join(why(r) for r in failed[:3])}{', …' if len(failed) > 3 else ''})")
    if not as_json:
        out.print(f"OK: {len(reports)} quantized tensors verified", markup=False)
