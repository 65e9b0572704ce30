"""``ierun``: the runtime command line."""

from __future__ import annotations

import copy
import json
import sys

import click
from rich.table import Table

from iekit.cli.support import run_cli, stdout_console, threads_option

from .bench import bench
from .decode_cli import generate_cmd, logits_cmd
from .eval_cli import eval_cmd, verify_model_cmd
from .microbench import microbench
from .verify import verify_quant_cmd
from .verify_bsr import verify_bsr_cmd
from .verify_dedup import dedup_cmd as verify_dedup_cmd

out = stdout_console()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="iekit", prog_name="ierun")
def cli() -> None:
    """Run and verify iekit artifacts with the native (C++/SIMD) runtime.

    Kernels exist as a scalar reference and AVX2/FMA variants, AVX-VNNI ones for the int8 GEMVs
    (Intel client cores without AVX-512), and AVX-512 ones for dedup (VBMI2), the prefill GEMM and the
    int8 GEMVs (VNNI); the best one this CPU supports is chosen at run time
    (IE_ISA=scalar|avx2|avxvnni|avx512|amx overrides; avx512 needs AVX-512 F/BW/VL/VBMI2/VNNI, amx also AMX-TILE/INT8).
    """


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.option("--bandwidth", is_flag=True,
              help="Also measure memory read bandwidth (a buffer of 4x the last-level cache, at least 256 MiB).")
@click.option("--fma-peak", is_flag=True, help="Also measure the multiply-add peak (GFLOPS of the selected kernels' ISA).")
@click.option("--int8-peak", is_flag=True,
              help="Also measure the int8 multiply-add peak (the int8 dot product of the selected kernels' ISA; "
                   "AVX2: vpmaddubsw; amx: tile multiplies), what act=int8 prefill is a fraction of.")
@threads_option("Threads for --bandwidth and the peaks.")
def info(as_json: bool, bandwidth: bool, fma_peak: bool, int8_peak: bool, threads: int):
    """CPU features, kernel ISAs available here, and the one selected; whether
    this build has CUDA and which devices it sees; with --bandwidth,
    --fma-peak and --int8-peak the yardsticks benchmarks report against."""
    from . import native
    from .cpu_topology import dram_probe_bytes, last_level_cache_bytes

    f = native.cpu_features()
    f["llc_bytes"] = last_level_cache_bytes()
    if f["cuda_build"]:  # what --device cuda would run on (docs/cuda.md)
        f["cuda_devices"] = native._native.cuda_devices()
    if bandwidth:
        f["read_bandwidth"] = native.read_bandwidth(bytes=dram_probe_bytes(), threads=threads)
    if fma_peak:
        f["fma_peak"] = native.fma_peak(threads=threads)
    if int8_peak:
        f["int8_peak"] = native.int8_peak(threads=threads)
    if as_json:
        click.echo(json.dumps(f, sort_keys=True))
        return
    t = Table(title="iekit native runtime", show_header=False)
    t.add_row("logical cpus", str(f["logical_cpus"]))
    t.add_row("last-level cache", f"{f['llc_bytes'] / 2**20:g} MiB" if f["llc_bytes"] else "unknown")
    t.add_row("cpu flags", " ".join(k for k, v in f["flags"].items() if v) or "(none)")
    t.add_row("kernel ISAs", ", ".join(f["isas"]))
    t.add_row("selected ISA", f["selected_isa"])
    t.add_row("CUDA build", "yes" if f["cuda_build"] else "no (`make build-cuda` makes one)")
    if f["cuda_build"]:
        t.add_row("CUDA devices", ", ".join(f"{d['index']}: {d['name']} ({d['total_mem_bytes'] / 2**30:.0f} GiB, "
                                            f"compute {d['compute_capability']})" for d in f["cuda_devices"])
                  or "none visible")
    if bandwidth:
        bw = f["read_bandwidth"]
        t.add_row("read bandwidth", f"{bw['gbps']:.2f} GB/s ({bw['threads']} threads, {bw['isa']}, "
                                    f"{bw['bytes'] / 2**20:g} MiB read)")
    if fma_peak:
        fp = f["fma_peak"]
        t.add_row("FMA peak", f"{fp['gflops']:.1f} GFLOPS float32 ({fp['threads']} threads, {fp['isa']})")
    if int8_peak:
        ip = f["int8_peak"]
        t.add_row("int8 peak", f"{ip['gmacs']:.1f} G int8 multiply-adds/s ({ip['threads']} threads, {ip['isa']})")
    out.print(t)


@cli.group()
def verify() -> None:
    """Prove an artifact against its definition with the native kernels.

    Each subcommand exits 0 only when every check holds, else prints one
    line naming what failed and exits 1.
    """


cli.add_command(generate_cmd)
cli.add_command(logits_cmd)
cli.add_command(microbench)
cli.add_command(bench)
cli.add_command(eval_cmd)
verify.add_command(verify_quant_cmd)
# Its name before it covered every scheme (mxfp4, the k-quants, ...): kept for
# the scripts that use it, hidden from --help.
_verify_int4 = copy.copy(verify_quant_cmd)
_verify_int4.hidden = True
verify.add_command(_verify_int4, "int4")
verify.add_command(verify_dedup_cmd)
verify.add_command(verify_bsr_cmd)
verify.add_command(verify_model_cmd)


def main() -> None:
    run_cli(cli, "ierun")


if __name__ == "__main__":
    sys.exit(main())
