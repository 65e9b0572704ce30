"""What ``ierun bench`` measures, kept apart from the command line.

Three parts, each testable with a fake decoder (any object with the
Decoder's attributes and methods):

* ``read_prompts`` / ``tokenize``: the prompts file, text or ``ids:`` lines;
  tokenizing happens once, before any timing.
* ``run_round``: the timed window of one round and nothing else: greedy
  generation of every prompt (prefill + decode steps, argmax) plus the
  optional work-touch after each generated token. It only records clock
  readings; every derived number is computed after the window.
* ``round_record``: the JSON object of one round from those readings, the
  counters read after the window, and the bandwidth yardstick.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from iekit.formats.errors import FormatError, IEError
from iekit.formats.fileio import read_utf8

from .env import BenchEnv
from .sampling import Sampler, stream
from .token_ids import parse_ids

IDS_PREFIX = "ids:"
DEFAULT_PROMPTS = "prompts/default.txt"  # inside the iekit.runtime package
CHECKSUM_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class PromptLine:
    where: str                       # "FILE:LINE", for error messages
    text: str | None = None          # a text prompt (tokenized by the model's tokenizer.json)
    ids: tuple[int, ...] | None = None  # an "ids: 1,2,3" prompt


def read_prompts(path: str | Path | None) -> tuple[str, list[PromptLine]]:
    """(source label, prompts). ``None`` reads the prompts shipped in the
    package. Blank lines are skipped; every other line is one prompt."""
    if path is None:
        source = f"<iekit.runtime/{DEFAULT_PROMPTS}>"
        text = resources.files("iekit.runtime").joinpath(DEFAULT_PROMPTS).read_text(encoding="utf-8")
    else:
        source = str(path)
        text = read_utf8(path)  # a FIFO, /dev/zero or bad UTF-8 is one line, as for eval --text-file
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        where = f"{source}:{n}"
        if line.startswith(IDS_PREFIX):
            try:
                ids = tuple(parse_ids(line[len(IDS_PREFIX):]))
            except ValueError as e:
                raise FormatError(path or source, f"line {n}", f"'{IDS_PREFIX} ...': {e}") from None
            prompts.append(PromptLine(where, ids=ids))
        else:
            prompts.append(PromptLine(where, text=line))
    if not prompts:
        raise FormatError(source, "lines", "no prompts (every line is blank)")
    return source, prompts


def tokenize(prompts: Sequence[PromptLine], dec: Any, max_new: int) -> list[list[int]]:
    """Token ids of every prompt, checked against the model's vocabulary
    and context (prompt + max_new generated tokens must fit)."""
    out = []
    for p in prompts:
        if p.ids is not None:
            ids = list(p.ids)
        else:
            try:
                ids = list(dec.encode(p.text))
            except IEError as e:
                raise IEError(f"{p.where}: cannot tokenize a text prompt ({e}); "
                              f"give token ids instead: a line 'ids: 1,2,3'") from None
        if not ids:
            raise IEError(f"{p.where}: the prompt tokenizes to no tokens")
        try:  # the last generated token is never fed back, so it takes no place in the cache
            dec.check_ids(ids, final_len=len(ids) + max_new - 1)
        except IEError as e:
            raise IEError(f"{p.where}: {e} ({len(ids)} prompt tokens, --max-new {max_new})") from None
        out.append(ids)
    return out


@dataclass
class RoundTimes:
    """Clock readings of one timed window (seconds)."""
    wall_s: float = 0.0
    tokens: int = 0                  # generated tokens, the first of each prompt (from prefill) included
    prefill_s: list[float] = field(default_factory=list)  # one per prompt
    step_s: list[float] = field(default_factory=list)     # one per decode step call
    touch_checksum: int = 0          # sum of Decoder.touch results, mod 2**64
    step_split: dict[str, float] | None = None  # Decoder.step_times() of the window (None: not split)


def run_round(dec: Any, prompts: Sequence[Sequence[int]], max_new: int, env: BenchEnv,
              clock: Callable[[], float] = time.perf_counter, ignore_eos: bool = False) -> RoundTimes:
    """The timed window: greedy generation of every prompt, up to
    ``max_new`` tokens or EOS (the EOS token counts as generated; with
    ``ignore_eos`` exactly ``max_new``), and the work-touch after each
    generated token when IE_BYTES_PER_TOKEN > 0. Anything not needed to
    generate stays outside (metrics, RSS, I/O)."""
    r = RoundTimes()
    touch = env.bytes_per_token > 0
    nbytes, stride = env.bytes_per_token, env.stride_bytes
    greedy = Sampler()
    checksum = 0
    dec.reset_step_times()
    t_start = clock()
    for ids in prompts:
        t0 = clock()
        for i, _tok in enumerate(stream(dec, list(ids), max_new, greedy, stop_at_eos=not ignore_eos)):
            # the interval before a token is its prefill (first) or decode step
            (r.step_s if i else r.prefill_s).append(clock() - t0)
            r.tokens += 1
            if touch:
                checksum += dec.touch(nbytes, stride)
            t0 = clock()
    r.wall_s = clock() - t_start
    r.step_split = dec.step_times()
    r.touch_checksum = checksum & CHECKSUM_MASK
    return r


def rss_peak_mb() -> float:
    """Peak resident set size in MiB: VmHWM from /proc/self/status, or
    getrusage's ru_maxrss (KiB on Linux) where /proc is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_rss_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: ``5`` > clear_refs).
    The read-bandwidth yardstick allocates its buffer (4x the last-level
    cache, at least 256 MiB, by default) in this process; without the reset
    it, not the decoder, would set rss_peak_mb for any model smaller than
    that."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _pct_ms(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) * 1e3 if xs else None


# The yardstick before and after a round differing by more than this, or a
# decoder faster than the yardstick, means something else used the memory.
BUSY_SPREAD = 0.10


def step_split_fields(split: dict[str, float] | None, weight_bpt: int, read_bw_gbps: float) -> dict[str, Any]:
    """The decode step split (Decoder.step_times) as per-step milliseconds,
    and the weight matmuls' own streaming rate: weight bytes per step over
    the time inside them. All null where the steps were not split (CUDA)
    or none ran."""
    if not split or not split["steps"] or split["matmul_s"] <= 0:
        return dict.fromkeys(("decode_matmul_ms", "decode_attention_ms", "decode_other_ms", "matmul_gbps",
                              "matmul_roofline_fraction"))
    steps = split["steps"]
    matmul_gbps = weight_bpt * steps / split["matmul_s"] / 1e9
    return {
        "decode_matmul_ms": split["matmul_s"] / steps * 1e3,
        "decode_attention_ms": split["attention_s"] / steps * 1e3,
        "decode_other_ms": (split["total_s"] - split["matmul_s"] - split["attention_s"]) / steps * 1e3,
        "matmul_gbps": matmul_gbps,
        "matmul_roofline_fraction": matmul_gbps / read_bw_gbps if read_bw_gbps > 0 else None,
    }


def round_record(n: int, t: RoundTimes, *, dec: Any, env: BenchEnv, kv: tuple[int, int],
                 read_bw: tuple[float, float], rss_mb: float, base: dict[str, Any]) -> dict[str, Any]:
    """One round's JSON object. ``kv`` is (hits, misses) of this round;
    ``read_bw`` the yardstick (GB/s) measured just before and just after it;
    ``base`` holds the fields that are the same every round."""
    read_bw_gbps = max(read_bw)  # the machine's capability: a busy reading is the lower one
    spread = (max(read_bw) - min(read_bw)) / read_bw_gbps if read_bw_gbps > 0 else None
    weight_bpt = int(dec.weight_bytes_per_token)
    bpt = weight_bpt + env.bytes_per_token            # bytes read per generated token
    bytes_touched = t.tokens * bpt
    wall = t.wall_s
    eff = bytes_touched / wall / 1e9 if wall > 0 else None
    step_total = sum(t.step_s)
    decode_gbps = len(t.step_s) * bpt / step_total / 1e9 if step_total > 0 else None
    rec = {
        "round": n,
        "tokens_generated": t.tokens,
        "decode_steps": len(t.step_s),
        "wall_time_s": wall,
        "tps_true": t.tokens / wall if wall > 0 else None,
        "latency_p50_ms": _pct_ms(t.step_s, 50),
        "latency_p95_ms": _pct_ms(t.step_s, 95),
        "prefill_ms": sum(t.prefill_s) * 1e3,
        "rss_peak_mb": rss_mb,
        "kv_hits": kv[0],
        "kv_misses": kv[1],
        "weight_bytes_per_token": weight_bpt,
        "active_params_per_token": int(dec.active_params_per_token),
        "touch_bytes_per_token": env.bytes_per_token,
        "stride_bytes": env.stride_bytes,
        "touch_checksum": t.touch_checksum if env.verify_touch and env.bytes_per_token > 0 else None,
        "mb_per_token": bpt / 1e6,
        "bytes_touched": bytes_touched,
        "model_bytes": int(dec.model_bytes),
        "model_coverage": weight_bpt / dec.model_bytes if dec.model_bytes else None,
        "effective_gbps": eff,
        "read_bw_gbps": read_bw_gbps,
        "read_bw_before_gbps": read_bw[0],
        "read_bw_after_gbps": read_bw[1],
        "read_bw_spread": spread,
        "roofline_fraction": eff / read_bw_gbps if eff is not None and read_bw_gbps > 0 else None,
        "decode_gbps": decode_gbps,
        "decode_roofline_fraction": decode_gbps / read_bw_gbps if decode_gbps is not None and read_bw_gbps > 0 else None,
    }
    rec.update(step_split_fields(t.step_split, weight_bpt, read_bw_gbps))
    frac = rec["roofline_fraction"]
    rec["busy"] = bool((spread is not None and spread > BUSY_SPREAD) or (frac is not None and frac > 1))
    rec.update(base)
    return rec
