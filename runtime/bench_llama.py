"""``ierun bench -p 512 -n 128 -t 1,2``: llama-bench's tests, measured its way.

Users compare engines with ``llama-bench -p 512 -n 128 -t 2``; this is the
same vocabulary, so the figures sit beside llama-bench's in one table:

- ``ppP`` (prompt processing): P token ids run through an empty context in
  one prefill, tokens/s of that call;
- ``tgN`` (text generation): N single-token decode steps from an empty
  context (the first on the empty cache), tokens/s of the N steps;
- each test runs once untimed, then ``-r`` times; the figure is the mean and
  standard deviation of the repetitions' tokens/s, as llama-bench reports;
- ``-d D``: each test runs after D tokens already fill the context (their
  prefill untimed), labelled ``tg128 @ d2048`` as llama-bench labels it: a
  long context's decode reads the whole KV cache every step;
- every comma-separated value of ``-p``, ``-n``, ``-d`` and ``-t`` is its
  own test (one decoder per thread count: its pool is made with the decoder);
- ``-o md`` (default: llama-bench's markdown table), ``csv``, ``json``
  (one array) or ``jsonl`` (one object per test).

The token ids are fixed and spread over the vocabulary (no tokenizer
needed), different for every repetition's first id, so no KV-cache prefix
is ever reused. The JSON-lines rounds of plain ``ierun bench`` (tps_true,
roofline fraction) stay for harnesses; this is the summary a person reads.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from typing import Any

import click

from iekit.cli.support import MAX_THREADS
from iekit.formats.errors import IEError

FORMATS = ("md", "csv", "json", "jsonl")
FIELDS = ("model", "model_filename", "size", "params", "backend", "threads", "type_k", "type_v", "experts_copied",
          "test", "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "samples_ts", "solo_jobs")


def parse_list(name: str, value: str | None) -> list[int]:
    """'128,512' -> [128, 512]; each at least 0 for -n/-p (0 skips that kind) and -d, 1..MAX_THREADS for -t."""
    if value is None:
        return []
    out = []
    for part in value.split(","):
        try:
            v = int(part)
        except ValueError:
            raise click.BadParameter(f"{part!r} is not an integer (a comma-separated list like 128,512)",
                                     param_hint=name) from None
        if v < (1 if name == "-t" else 0):
            raise click.BadParameter(f"{v} is too small", param_hint=name)
        if name == "-t" and v > MAX_THREADS:
            raise click.BadParameter(f"{v} is more than {MAX_THREADS} threads", param_hint=name)
        out.append(v)
    return out


def _ids(n: int, vocab: int, rep: int) -> list[int]:
    return [(rep * 104729 + i * 7919 + 17) % vocab for i in range(n)]


def _pp(dec: Any, p: int, depth: int, rep: int) -> float:
    ids = _ids(depth + p, dec.spec.vocab, rep)
    dec.reset()
    if depth:
        dec.prefill(ids[:depth])
    t0 = time.perf_counter()
    dec.prefill(ids)  # the cached depth is kept: the p new ids run
    return p / (time.perf_counter() - t0)


def _tg(dec: Any, n: int, depth: int, rep: int) -> float:
    ids = _ids(depth + n, dec.spec.vocab, rep)
    dec.reset()
    if depth:
        dec.prefill(ids[:depth])
    t0 = time.perf_counter()
    if not depth:  # the first token on the empty cache, as llama-bench runs it
        dec.prefill(ids[:1])
    for t in ids[depth or 1:]:
        dec.step(t)
    return n / (time.perf_counter() - t0)


def model_type(meta: dict[str, Any], tensors: list[dict[str, Any]], params: int) -> str:
    """llama-bench's model column: architecture, parameter count and weight
    type ("llama 135M Q4_0"). The type is a GGUF's own file type where the
    model was imported from one as it was, else the type holding most of the
    layers' matrix bytes ("Q4_K mixed" where others hold a third or more);
    embeddings and head are left out, as in llama.cpp's "mostly" types. A
    model requantized on import (--q4-map: its tensors carry the converter's
    quant_error) holds other types than its source file said ("F16")."""
    size = (f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M" if params >= 1e7
            else f"{params / 1e6:.2f}M")
    gguf_type = (meta.get("source") or {}).get("gguf", {}).get("file_type")
    if isinstance(gguf_type, str) and not any("quant_error" in e for e in tensors):
        kind = gguf_type.removeprefix("MOSTLY_")
    else:
        by_type: dict[str, int] = {}
        for e in tensors:
            if len(e["shape"]) >= 2 and ".layers." in e["name"]:
                by_type[e["dtype"]] = by_type.get(e["dtype"], 0) + e["nbytes"]
        top = max(by_type, key=by_type.__getitem__, default="?")
        kind = top.upper() + (" mixed" if by_type and by_type[top] < 2 * sum(by_type.values()) / 3 else "")
    return f"{meta.get('model', {}).get('model_type', '?')} {size} {kind}"


def run_tests(load, threads: list[int], n_prompt: list[int], n_gen: list[int], reps: int,
              backend: str, depths: list[int] = (0,)) -> list[dict[str, Any]]:
    """One record per (threads, test, depth); ``load(threads, ctx)`` makes a
    decoder whose cache holds ctx positions (as llama-bench sizes its
    context: the largest test plus the deepest depth). Each thread count's
    decoder is gone before the next one loads: two at once would hold two
    sets of weight copies (rows8, and a mixture's experts), and the second's
    --experts auto would judge the memory by the first's."""
    rows = []
    ctx = max([*n_prompt, *n_gen, 1]) + max(depths)
    for t in threads:
        rows += _tests(load(t, ctx), t, n_prompt, n_gen, reps, backend, depths)
    return rows


def _tests(dec, t: int, n_prompt: list[int], n_gen: list[int], reps: int, backend: str,
           depths: list[int]) -> list[dict[str, Any]]:
    """run_tests' records of one decoder (``t`` threads)."""
    rows = []
    params = sum(math.prod(e["shape"]) for e in dec.model.tensors)
    label = model_type(dec.model.meta, dec.model.tensors, params)
    tests = [("pp", p) for p in n_prompt if p] + [("tg", n) for n in n_gen if n]
    for (kind, size), depth in ((test, d) for test in tests for d in depths):
        fn = _pp if kind == "pp" else _tg
        fn(dec, size, depth, reps)  # untimed: clocks, caches, the pool's first wake-up
        solo0 = dec.solo_jobs
        samples = [fn(dec, size, depth, r) for r in range(reps)]
        rows.append({"model": label, "model_filename": str(dec.model.dir), "size": dec.model_bytes,
                     "params": params, "backend": backend, "threads": t, "type_k": dec.cache_types[0],
                     "type_v": dec.cache_types[1], "experts_copied": dec.copied_experts,
                     "test": f"{kind}{size}" + (f" @ d{depth}" if depth else ""),
                     "n_prompt": size if kind == "pp" else 0, "n_gen": size if kind == "tg" else 0,
                     "n_depth": depth,
                     "avg_ts": statistics.fmean(samples),
                     "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                     "samples_ts": samples, "solo_jobs": dec.solo_jobs - solo0})
    return rows


def _size(b: int) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    """The records as llama-bench prints them (md), or as csv / json / jsonl."""
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "samples_ts": ";".join(f"{v:.3f}" for v in r["samples_ts"])})
        return buf.getvalue()
    head = "| model | size | params | backend | threads | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: | ---: |\n"
    return head + "".join(f"| {r['model']} | {_size(r['size'])} | {_params(r['params'])} | {r['backend']} | "
                          f"{r['threads']} | {r['test']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |\n" for r in rows)
