"""``ierun bench``: decode throughput of a real model, one JSON line per round.

The command wires the parts together in the order the design's timing
discipline needs: environment (runtime/env.py), prompts, the model and the
tokenized prompts -- every input is checked before anything is measured,
so a bad one fails fast -- then the warm-up rounds, the read-bandwidth
yardstick (same process, same threads as the decoder; with --device cuda
the device-to-device copy bandwidth), then for each round
the timed window (bench_run.run_round) followed by everything that must
stay outside it: counters, peak RSS, the yardstick again (so each round is
judged against the machine as it was around it), metrics, printing. stdout carries only the JSON lines, so a harness
can read it as JSON Lines; progress and warnings go to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import click
import numpy as np

from iekit.cli.support import threads_option
from iekit.formats.errors import IEError

from . import bench_llama, cuda, expert_copies, kv_cache
from .cpu_topology import LLC_MULTIPLE, dram_probe_bytes, last_level_cache_bytes
from .env import ACT_PREC_OF, ACTS, PRECISIONS, BenchEnv
from .bench_run import read_prompts, reset_rss_peak, round_record, rss_peak_mb, run_round, tokenize
from .gguf_models import model_dir_flag

CUDA_READ_BW_MB = 256  # --device cuda's default yardstick: several times a GPU's L2 (50 MiB on an H100)
CUDA_COPY_ITERS = 20  # device copies per yardstick reading (median): a 256 MiB copy takes well under 1 ms


def _warn(msg: str) -> None:
    click.echo(f"warning: {msg}", err=True)


def _note(msg: str) -> None:
    click.echo(f"ierun bench: {msg}", err=True)


def _load_decoder(model_dir: Path, threads: int, env: BenchEnv, device: str,
                  cache_types: tuple[str | None, str | None], experts: str,
                  ctx: int | None = None) -> tuple[Any, list[str]]:
    """The Decoder and the warnings it raised while loading (e.g. the dedup
    fallback), as one-line messages: they go to stderr as 'warning: ...'
    lines and into the JSON, not as Python's two-line warning format."""
    from .decoder import Decoder

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            dec = Decoder(model_dir, threads=threads, act=env.act, affinity=env.affinity, device=device,
                          ctx=ctx, cache_type_k=cache_types[0], cache_type_v=cache_types[1],
                          experts=experts, ctx_flag="the largest -p/-n plus the largest -d")
        except (IEError, OSError) as e:
            reason = str(e) if isinstance(e, IEError) else f"{e.filename or model_dir}: {e.strerror or e}"
            raise IEError(env.model_error(str(model_dir), reason)) from None
    return dec, [str(w.message) for w in caught]


def _dedup_fields(dec: Any) -> dict[str, Any]:
    """dedup_active: IE_DEDUP=1 falls back to model.ie.bin (with a warning)
    when the artifact is unusable, so the flag alone can overstate it;
    dedup_cache: the loader's counters (hits, misses, bytes; fused_calls and
    fused_bytes: products computed from the blobs in place) while active."""
    st = getattr(dec, "dedup_stats", None)
    if st is None:
        return {"dedup_active": None, "dedup_cache": None}
    keys = ("hits", "misses", "evictions", "bypasses", "entries", "cached_bytes", "capacity_bytes",
            "reconstructed_bytes", "fused_calls", "fused_bytes")
    return {"dedup_active": bool(st.get("active")),
            "dedup_cache": {k: st[k] for k in keys if k in st} if st.get("active") else None}


HELP = """Time greedy decoding of a converted model: one JSON line per round.

With -p and/or -n it runs llama-bench's tests instead: ppP (a P-token
prompt through an empty context) and tgN (N decode steps), for every value
of -p, -n and -t, -r timed repetitions each, printed as llama-bench prints
them (-o md; csv, json, jsonl): `ierun bench --model-dir M -p 512 -n 128
-t 1,2`. The rest of this help is about the rounds.

Each round runs every prompt in turn on the decoder (--device cpu, or
cuda: the CUDA decoder, f32 activations): prefill, then
greedy decoding of --max-new tokens (fewer on EOS, the EOS token counted,
unless --ignore-eos). --warmup rounds run first and are not counted. The
decoder keeps its KV cache between prompts and rounds and reuses the part
shared with the previous sequence (kv_hits). Only the JSON lines go to
stdout; progress, warnings and a summary (median and spread over the
rounds) go to stderr.

\b
Prompts file: one prompt per line, blank lines skipped. A line is
  text            tokenized with the model's tokenizer.json
  ids: 1,2,3      token ids given directly (models without a tokenizer)
Without --prompts-file, ~10 short English prompts shipped with iekit.

\b
Timed window (wall_time_s): only generation (prefill + decode steps +
greedy argmax of each prompt) and the optional work-touch loop.
Tokenizing, model loading, the bandwidth yardstick (after the warm-up,
then after every round), RSS and counter reads and printing are outside it.

\b
JSON fields (per round):
  round               1-based round number
  tokens_generated    tokens produced, the first of each prompt (which
                      comes out of prefill) included
  decode_steps        Decoder.step calls (tokens_generated - prompts,
                      fewer after EOS)
  wall_time_s         the timed window
  tps_true            tokens_generated / wall_time_s
  latency_p50_ms,     percentiles of the per-token decode times (one step
  latency_p95_ms      and the argmax that picks the token; prefill is not
                      a step: see prefill_ms); null if no step ran (--max-new 1)
  prefill_ms          sum over prompts of the prefill time
  rss_peak_mb         peak RSS (VmHWM, MiB) of loading the model and all
                      rounds so far, read after the window; the bandwidth
                      buffer is excluded (VmHWM is reset after measuring
                      it; rss_peak_reset: false where that failed)
  read_bw_bytes       size of the bandwidth buffer (--bandwidth-mb)
  llc_bytes           the last-level caches of the CPUs this process may use,
                      as /sys reports them (null where it does not, and
                      on --device cuda): read_bw_bytes is 4x this by default
  read_bw_in_cache    true when read_bw_bytes is under 4x llc_bytes (a
                      smaller --bandwidth-mb): part of the yardstick comes
                      from cache, so read_bw_gbps overstates memory and every
                      *_roofline_fraction understates (null where llc_bytes is)
  kv_hits, kv_misses  the decoder's KV prefix-cache counters, this round
  weight_bytes_per_token  weight bytes one decode step reads (of a mixture of
                      experts: the router and the top_k routed experts only)
  active_params_per_token weights one decode step multiplies (the same
                      matrices, vectors and head, not the embedding lookup)
  touch_bytes_per_token   IE_BYTES_PER_TOKEN (0: no work-touch)
  stride_bytes        IE_STRIDE_BYTES
  touch_checksum      sum of the work-touch checksums (IE_VERIFY_TOUCH=1),
                      else null
  mb_per_token        (weight_bytes_per_token + touch_bytes_per_token)/1e6
  bytes_touched       tokens_generated x bytes per token (as above)
  model_bytes         tensor bytes in the artifact
  model_coverage      weight_bytes_per_token / model_bytes
  effective_gbps      bytes_touched / wall_time_s / 1e9
  read_bw_before_gbps streaming read bandwidth just before and just after
  read_bw_after_gbps  the round, in this process with --threads threads
                      over a --bandwidth-mb buffer; --device cuda: the
                      device-to-device copy bandwidth (bytes read + bytes
                      written) of a --bandwidth-mb buffer, timed with CUDA
                      events
  read_bw_gbps        the larger of the two (what the machine can do)
  read_bw_spread      (larger - smaller) / larger
  roofline_fraction   effective_gbps / read_bw_gbps
  decode_gbps         the decode steps alone: decode_steps x bytes per
                      token / their summed time (prefill excluded)
  decode_roofline_fraction
                      decode_gbps / read_bw_gbps; both null if no step ran
  decode_matmul_ms    a decode step's wall time (ms, mean) inside weight
  decode_attention_ms matmuls (their threads' start and join included),
  decode_other_ms     inside attention, and in the rest (norms, RoPE,
                      activation quantization, residual adds); null on
                      --device cuda
  matmul_gbps         weight_bytes_per_token / decode_matmul_ms: how fast
                      the kernels streamed the weights while decoding
  matmul_roofline_fraction
                      matmul_gbps / read_bw_gbps: with decode_*_ms, says
                      whether a step is limited by the kernels or by the
                      work between them
  busy                true when the yardstick moved by more than 10%
                      around the round, or roofline_fraction > 1: the
                      machine was shared, the fraction is not trustworthy
                      (also a warning on stderr)
  precision           storage of the matrices (e.g. int4w, f32,
                      mixed(int4w,f32)); precision_expected: IE_PRECISION
  act_prec            IE_ACT_PREC as requested; act: what ran (f32|int8;
                      auto resolved)
  type_k, type_v      the KV cache's element types (f16|f32; llama-bench's
                      fields of the same names)
  experts_copied      a mixture of experts' matrices copied into the fast
                      kernels' layout at load (--experts), not read in
                      place; false for a dense model
  dedup, dedup_active IE_DEDUP=1 seen; tensors really served by the dedup
                      loader (false after its fallback, null if unknown)
  affinity            thread pinning passed to the decoder (null: none)
  pinned_cpus         the CPU each decoder thread was pinned to (-1: the
                        OS refused), null without IE_TP_USE_AFFINITY=1
  threads, device, model_dir, prompts (the prompts source), n_prompts,
  max_new, ignore_eos, rounds, warmup_rounds, warnings (environment and
  model-loading warnings, also on stderr)

\b
Environment (runtime/env.py; a value that cannot be honoured is a
warning, never fatal, except IE_DEDUP*: a malformed one is an error):
  IE_PRECISION        expected storage ({precisions},
                      fp32|fp16): warn if the matrices are stored otherwise
  IE_REQUIRE_MODEL=1  an unloadable model is an error (it always is: there
                      is no stub mode; the message says which applied)
  IE_BYTES_PER_TOKEN  work-touch: after each generated token read this many
                      bytes of the mapped model.ie.bin, one load per
                      IE_STRIDE_BYTES (default 256), wrapping around the
                      file and continuing where the last token stopped
  IE_VERIFY_TOUCH=1   report the work-touch checksum
  IE_DEDUP*           the decoder's lossless dedup loader (IE_DEDUP=1;
                      a value other than 0|1 is an error, as everywhere)
  IE_ACT_PREC         auto (default) | fp32 | int8; fp8|fp16|bf16: not
                      supported, auto is used; --act wins over it
  IE_TP_USE_AFFINITY=1 with AFFINITY=compact|scatter|auto (default auto)
                      pins the decoder's threads
""".replace("{precisions}", "|".join(PRECISIONS))


def _summary(recs: list[dict[str, Any]]) -> str:
    """Median and spread of the counted rounds, for people (stderr)."""
    tps = np.array([r["tps_true"] or 0.0 for r in recs])
    roof = np.array([r["roofline_fraction"] or 0.0 for r in recs])
    med = float(np.median(tps))
    spread = (tps.max() - tps.min()) / med if med > 0 else 0.0
    busy = sum(r["busy"] for r in recs)
    return (f"{len(recs)} round{'s' * (len(recs) > 1)}: median {med:.2f} tok/s (min {tps.min():.2f}, max "
            f"{tps.max():.2f}, spread {spread:.0%}), roofline median {float(np.median(roof)):.1%}"
            + (f"; {busy} busy round{'s' * (busy > 1)} (see 'busy')" if busy else ""))


def _split_summary(recs: list[dict[str, Any]]) -> str | None:
    """Where a decode step's time went (medians over the rounds); None where
    the decoder does not split it."""
    if any(r["decode_matmul_ms"] is None for r in recs):
        return None
    mm, att, other, frac = (float(np.median([r[k] or 0.0 for r in recs])) for k in
                            ("decode_matmul_ms", "decode_attention_ms", "decode_other_ms", "matmul_roofline_fraction"))
    total = mm + att + other
    return (f"a decode step: {total:.2f} ms = weight matmuls {mm:.2f} ({mm / total:.0%} of it; streaming at "
            f"{frac:.0%} of the read bandwidth) + attention {att:.2f} + other {other:.2f}")


@click.command("bench", help=HELP)
@click.option("--device", type=click.Choice(cuda.DEVICES), default="cpu", show_default=True,
              help="Decoder to run: cpu, or cuda (a CUDA build of iekit and a visible GPU).")
@model_dir_flag("IEBIN model directory (model.ie.json + model.ie.bin), or a .gguf (imported once, cached).")
@click.option("--prompts-file", default=None, help="Prompts, one per line (text or 'ids: 1,2,3').")
@click.option("--max-new", type=click.IntRange(min=1), default=64, show_default=True,
              help="Tokens to generate per prompt (fewer on EOS, unless --ignore-eos).")
@click.option("--ignore-eos", is_flag=True,
              help="Generate exactly --max-new tokens per prompt, past EOS: every round and every model does "
                   "the same work, so tok/s compare like for like.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds (JSON lines).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Rounds run first and not counted (page cache, CPU clocks, allocator).")
@threads_option("Decoder threads, also used for the read-bandwidth yardstick.")
@click.option("--act", type=click.Choice(ACTS), default=None,
              help="Activations into quantized matrices, as `ierun generate --act` (default: IE_ACT_PREC, else auto: "
                   "int8 for 4-bit layer matrices).")
@click.option("-p", "--n-prompt", "n_prompt", default=None, metavar="LIST",
              help="llama-bench's prompt-processing tests: comma-separated prompt lengths (pp512: -p 512). With "
                   "-p or -n, bench runs llama-bench's tests instead of rounds (runtime/bench_llama.py).")
@click.option("-n", "--n-gen", "n_gen", default=None, metavar="LIST",
              help="llama-bench's text-generation tests: comma-separated token counts (tg128: -n 128).")
@click.option("-d", "--n-depth", "n_depth", default=None, metavar="LIST",
              help="With -p/-n: llama-bench's depths, comma-separated: each test runs after that many tokens "
                   "already fill the context, untimed (tg128 @ d2048: -n 128 -d 2048)  [default: 0].")
@click.option("-t", "thread_list", default=None, metavar="LIST",
              help="With -p/-n: comma-separated thread counts, one decoder each, loaded once the last is freed "
                   "(-t 1,2)  [default: --threads].")
@click.option("-r", "--repetitions", type=click.IntRange(min=1), default=5, show_default=True,
              help="With -p/-n: timed repetitions per test (after one untimed run).")
@click.option("-o", "--output", type=click.Choice(bench_llama.FORMATS), default="md", show_default=True,
              help="With -p/-n: llama-bench's markdown table, csv, json (one array) or jsonl.")
@click.option("--bandwidth-mb", type=click.IntRange(min=1), default=None,
              help="Buffer of the read-bandwidth yardstick, MiB. Keep it several times the last-level "
                   "cache: a smaller one measures the caches, not memory (read_bw_gbps, roofline_fraction).  "
                   f"[default: 4x the last-level cache, at least 256; --device cuda {CUDA_READ_BW_MB}]")
@kv_cache.options
@expert_copies.option
def bench(device: str, model_dir: Path, prompts_file: str | None, max_new: int, ignore_eos: bool, rounds: int,
          warmup: int, threads: int | None, act: str | None, n_prompt: str | None, n_gen: str | None,
          n_depth: str | None, thread_list: str | None, repetitions: int, output: str, bandwidth_mb: int,
          cache_type_k: str | None, cache_type_v: str | None, experts: str) -> None:
    cache_types = (cache_type_k, cache_type_v)
    env = BenchEnv.from_env()
    for w in env.warnings:
        _warn(w)
    if act is not None:
        if env.act_prec_set and env.act != act:
            _warn(f"--act {act} overrides IE_ACT_PREC={env.act_prec}")
        env = dataclasses.replace(env, act=act, act_prec=ACT_PREC_OF[act])
    if device == "cuda":
        from .decoder import check_device

        check_device(device)  # before anything is read or measured
        if env.act == "int8":  # said here, where it is known whether --act or IE_ACT_PREC asked for it
            asked = "--act int8" if act else f"IE_ACT_PREC={env.act_prec}"
            raise IEError(f"{asked}: the CUDA decoder runs f32 activations only (f32 or auto)")
    if n_prompt is not None or n_gen is not None:
        from .native import cpu_features

        pp, tg = bench_llama.parse_list("-p", n_prompt), bench_llama.parse_list("-n", n_gen)
        depths = bench_llama.parse_list("-d", n_depth) or [0]
        ts = bench_llama.parse_list("-t", thread_list) or [threads]
        backend = "CUDA" if device == "cuda" else f"CPU ({cpu_features()['selected_isa']})"

        def load(t: int, ctx: int) -> Any:
            dec, msgs = _load_decoder(model_dir, t, env, device, cache_types, experts, ctx)
            for w in msgs:
                _warn(w)
            return dec

        click.echo(bench_llama.render(bench_llama.run_tests(load, ts, pp, tg, repetitions, backend, depths), output),
                   nl=False)
        return
    if thread_list is not None:
        raise click.UsageError("-t lists threads for llama-bench's tests (-p/-n); the rounds take --threads")
    if n_depth is not None:
        raise click.UsageError("-d lists depths for llama-bench's tests (-p/-n); the rounds have none")
    source, lines = read_prompts(prompts_file)

    # Every input is checked before the yardstick: a bad model or prompt
    # fails at once, not after seconds of streaming.
    dec, load_warnings = _load_decoder(model_dir, threads, env, device, cache_types, experts)
    precision = str(dec.precision)
    msg = env.precision_warning(tuple(dec.precisions))
    later = load_warnings + ([msg] if msg else [])
    for w in later:
        _warn(w)
    prompts = tokenize(lines, dec, max_new)

    from .native import read_bandwidth

    # The yardstick runs on the decoder's threads (pinned when
    # IE_TP_USE_AFFINITY=1), or on its device, before the first counted round
    # and after every round: each round is judged against the machine as it
    # was around it.
    # Its buffer must not count as the decoder's peak RSS: VmHWM is reset
    # after each measurement and the peak kept here.
    llc = None if device == "cuda" else last_level_cache_bytes()
    if bandwidth_mb is not None:
        read_bw_bytes = bandwidth_mb << 20
    else:
        read_bw_bytes = CUDA_READ_BW_MB << 20 if device == "cuda" else dram_probe_bytes()
    in_cache = None if llc is None else read_bw_bytes < LLC_MULTIPLE * llc
    if in_cache:
        _warn(f"the {read_bw_bytes / 2**20:g} MiB yardstick is under {LLC_MULTIPLE}x the {llc / 2**20:g} MiB last-level "
              "cache: part of it is read from cache, so read_bw_gbps overstates memory (read_bw_in_cache)")
    peak = rss_peak_mb()
    rss_reset = True

    def yardstick() -> float:
        nonlocal peak, rss_reset
        peak = max(peak, rss_peak_mb())
        if device == "cuda":
            gbps = cuda.copy_gbps(read_bw_bytes, CUDA_COPY_ITERS)
        else:
            gbps = float(read_bandwidth(bytes=read_bw_bytes, threads=threads, passes=5)["gbps"])
        rss_reset = reset_rss_peak() and rss_reset
        return gbps

    for n in range(1, warmup + 1):
        t = run_round(dec, prompts, max_new, env, ignore_eos=ignore_eos)
        _note(f"warm-up {n}/{warmup}: {t.tokens} tokens in {t.wall_s:.3f} s = "
              f"{t.tokens / t.wall_s if t.wall_s > 0 else 0:.2f} tok/s (not counted)")
    base = {"precision": precision, "precision_expected": env.precision_expected, "act_prec": env.act_prec,
            "act": dec.act, "type_k": dec.cache_types[0], "type_v": dec.cache_types[1],
            "experts_copied": dec.copied_experts, "dedup": env.dedup,
            **_dedup_fields(dec), "affinity": env.affinity,
            "pinned_cpus": getattr(dec, "pinned", None),
            "threads": threads, "device": device, "model_dir": str(model_dir), "prompts": source,
            "n_prompts": len(prompts), "max_new": max_new, "ignore_eos": ignore_eos, "rounds": rounds,
            "warmup_rounds": warmup, "read_bw_bytes": read_bw_bytes, "llc_bytes": llc,
            "read_bw_in_cache": in_cache,
            "warnings": list(env.warnings) + later}
    before = yardstick()
    recs = []
    for n in range(1, rounds + 1):
        kv0 = (int(dec.kv_hits), int(dec.kv_misses))
        t = run_round(dec, prompts, max_new, env, ignore_eos=ignore_eos)
        # Everything below is after the window.
        kv = (int(dec.kv_hits) - kv0[0], int(dec.kv_misses) - kv0[1])
        rss = max(rss_peak_mb(), peak)  # VmHWM since the last reset, or since the start where that failed
        after = yardstick()
        rec = round_record(n, t, dec=dec, env=env, kv=kv, read_bw=(before, after), rss_mb=rss,
                           base={**base, "rss_peak_reset": rss_reset})
        click.echo(json.dumps(rec))
        recs.append(rec)
        _note(f"round {n}/{rounds}: {t.tokens} tokens in {t.wall_s:.3f} s = {rec['tps_true']:.2f} tok/s, "
              f"roofline {rec['roofline_fraction'] or 0:.1%} of {rec['read_bw_gbps']:.2f} GB/s")
        if rec["busy"]:
            _warn(f"round {n}: the machine was busy (yardstick {before:.2f} GB/s before, {after:.2f} after"
                  f"{', decoding faster than it' if (rec['roofline_fraction'] or 0) > 1 else ''}); "
                  "its roofline_fraction is not trustworthy")
        before = after
    _note(_summary(recs))
    split = _split_summary(recs)
    if split:
        _note(split)
