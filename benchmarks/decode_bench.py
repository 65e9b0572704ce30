"""Decode throughput of an int4w model several times the LLC, end to end.

The tiny golden models fit in cache, so their ``roofline_fraction`` says
nothing about memory-bound decoding. This script writes a random synthetic
Llama checkpoint (f16, numpy + safetensors only: hidden 2048, intermediate
5632, 16 heads / 4 KV heads, 8 layers, vocab 8192; ~0.8 GB, ~0.26 GB once
converted), converts it with the usual policy (``ieconv q4-manifest``:
projections int4w, embeddings and head kept in f16) and runs

    ierun bench --model-dir ... --max-new 32 --rounds 3 --threads 2

with prompts given as token ids (the model has no tokenizer). It prints the
bench JSON lines as they are and one summary line. Everything lives in a
temporary directory under out/, removed at the end unless --keep.

    python benchmarks/decode_bench.py [--threads 2] [--max-new 32] [--rounds 3] [--keep] [--no-llamacpp]
                                      [--scheme int4w]

``--scheme`` picks another type for the layer matrices (q4_k, iq4_xs, ...).

With llama.cpp's ``llama-bench`` and ``llama-quantize`` (on PATH, in
build/llamacpp/bin after ``make llamacpp``, or given with --llama-bench /
--llama-quantize) the same weights also go to llama.cpp, as the reference
at the same size: written as an f16 GGUF (the way convert_hf_to_gguf.py
writes a Llama, tests/gguf_build.py; no vocabulary, llama.cpp's "none"
tokenizer), made Q4_0 with the same policy (``llama-quantize
--token-embedding-type f16 --output-tensor-type f16``: only the layer
matrices are 4-bit, as ours), and decoded by ``llama-bench -p 0 -n
--max-new -t --threads``. Its decode tok/s times the bytes it reads per
token (every tensor but the embedding) over the same read-bandwidth
yardstick, measured just before and just after it (the larger), is its
fraction of the roofline beside ours. ``--no-llamacpp`` skips it.

``--device cuda --size large`` is the GPU's case (docs/cuda.md): hidden
4096, intermediate 14336, 32 heads / 8 KV heads, 8 layers, vocab 32000 --
a 1.3 GB int4w artifact, 1.2 GB of weights read per token -- decoded with
``ierun bench --device cuda``, whose yardstick is the device's copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llamacpp

from iekit.formats import weight_table

ROOT = Path(__file__).resolve().parents[1]

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 8,
    "vocab_size": 8192, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float16",
    # No EOS: every prompt generates exactly --max-new tokens, so rounds are comparable.
    "bos_token_id": 1, "eos_token_id": None,
}

# --size large: the shapes of the GPU goal (a >= 1 GB int4w model; Llama-3-8B's layer shapes).
LARGE = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
         "vocab_size": 32000}


def write_checkpoint(d: Path, seed: int = 0, config: dict | None = None) -> int:
    """A random Llama checkpoint of ``config`` (default CONFIG) in one
    safetensors file (a Gemma 3 one where the config's architecture says
    so: its q/k norms and sandwich norms, every norm 0, which Gemma applies
    as 1 + 0); returns its tensor bytes. Weights are N(0, 1/fan_in) so
    activations stay finite through the layers; a tied model has no
    lm_head.weight."""
    import numpy as np
    from safetensors.numpy import save_file

    c = CONFIG if config is None else config
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = hd * c["num_attention_heads"], hd * c["num_key_value_heads"]
    gemma = c["architectures"] == ["Gemma3ForCausalLM"]
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * cols ** -0.5).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return (np.zeros if gemma else np.ones)(n, np.float16)

    t = {"model.embed_tokens.weight": mat(v, h), "model.norm.weight": norm(h)}
    if not c.get("tie_word_embeddings"):
        t["lm_head.weight"] = mat(v, h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": mat(q, h), p + "self_attn.k_proj.weight": mat(kv, h),
                  p + "self_attn.v_proj.weight": mat(kv, h), p + "self_attn.o_proj.weight": mat(h, q),
                  p + "mlp.gate_proj.weight": mat(inter, h), p + "mlp.up_proj.weight": mat(inter, h),
                  p + "mlp.down_proj.weight": mat(h, inter),
                  p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h)})
        if gemma:
            t.update({p + "pre_feedforward_layernorm.weight": norm(h), p + "post_feedforward_layernorm.weight": norm(h),
                      p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd)})
    d.mkdir(parents=True)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(c, indent=2))
    return sum(a.nbytes for a in t.values())


def write_prompts(path: Path, n: int = 4, length: int = 16, seed: int = 1) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = ["ids: " + ",".join(str(int(i)) for i in rng.integers(3, CONFIG["vocab_size"], length)) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")


def llamacpp_q4_0(tmp: Path, quantize: str, threads: int) -> Path:
    """The checkpoint in tmp/hf as llama.cpp's Q4_0 with f16 embedding and head (our policy)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_build import gguf_from_hf

    f16 = gguf_from_hf(tmp / "hf", tmp / "f16.gguf", quant={".": "F16"}, tokenizer="none")
    out = tmp / "q4_0.gguf"
    run([quantize, "--token-embedding-type", "f16", "--output-tensor-type", "f16", str(f16), str(out), "Q4_0",
         str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    f16.unlink()
    return out


def llamacpp_decode(gguf_path: Path, bench: str, threads: int, n: int, rounds: int) -> dict:
    """llama-bench's tg over the Q4_0 file, and its roofline fraction against ierun bench's yardstick."""
    import gguf

    from iekit.runtime.bench_run import BUSY_SPREAD
    from iekit.runtime.cpu_topology import dram_probe_bytes
    from iekit.runtime.native import read_bandwidth

    tensors = gguf.GGUFReader(str(gguf_path)).tensors
    emb = next(t for t in tensors if t.name == "token_embd.weight")
    per_token = sum(int(t.n_bytes) for t in tensors if t is not emb) + int(emb.n_bytes) // CONFIG["vocab_size"]

    def yardstick() -> float:
        return float(read_bandwidth(bytes=dram_probe_bytes(), threads=threads, passes=5)["gbps"])

    before = yardstick()
    res = run([bench, "-m", str(gguf_path), "-p", "0", "-n", str(n), "-t", str(threads), "-r", str(rounds),
               "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    after = yardstick()
    rec = next(r for r in json.loads(res.stdout) if r.get("n_gen"))
    bw = max(before, after)
    tps = float(rec["avg_ts"])
    fraction = tps * per_token / 1e9 / bw
    return {"tg_tps": tps, "tg_tps_stddev": float(rec["stddev_ts"]), "mb_per_token": per_token / 1e6,
            "read_bw_before_gbps": before, "read_bw_after_gbps": after, "read_bw_gbps": bw,
            "decode_roofline_fraction": fraction,
            "busy": abs(before - after) / bw > BUSY_SPREAD or fraction > 1}  # ierun bench's rule


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--size", choices=("small", "large"), default="small")
    ap.add_argument("--scheme", default="int4w", choices=weight_table.names(quantized=True),
                    help="the layer matrices' weight type (ieconv q4-manifest --scheme); llama.cpp's reference stays Q4_0")
    ap.add_argument("--llama-bench", default=llamacpp.tool("llama-bench"), help=llamacpp.where("llama-bench"))
    ap.add_argument("--llama-quantize", default=llamacpp.tool("llama-quantize"), help=llamacpp.where("llama-quantize"))
    ap.add_argument("--no-llamacpp", action="store_true", help="skip the llama.cpp reference")
    args = ap.parse_args()
    with_llamacpp = not args.no_llamacpp and args.device == "cpu" and args.llama_bench and args.llama_quantize
    if args.size == "large":
        CONFIG.update(LARGE)
    bindir = Path(sys.executable).parent
    root = Path("out")
    root.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="decode-bench-", dir=root))
    try:
        t0 = time.perf_counter()
        src_bytes = write_checkpoint(tmp / "hf")
        print(f"decode_bench: wrote {src_bytes / 1e6:.0f} MB f16 checkpoint in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        t0 = time.perf_counter()
        run([str(bindir / "ieconv"), "q4-manifest", "--hf-dir", str(tmp / "hf"), "-o", str(tmp / "q4.json"),
             "--scheme", args.scheme])
        run([str(bindir / "ieconv"), "hf-to-iebin", "-q", "--hf-dir", str(tmp / "hf"), "--out-dir", str(tmp / "iebin"),
             "--q4-map", str(tmp / "q4.json")])
        iebin_mb = (tmp / "iebin" / "model.ie.bin").stat().st_size / 1e6
        print(f"decode_bench: converted to {iebin_mb:.0f} MB {args.scheme} IEBIN in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        q4_0 = llamacpp_q4_0(tmp, args.llama_quantize, args.threads) if with_llamacpp else None
        shutil.rmtree(tmp / "hf")  # not needed any more; frees the page cache for the run
        write_prompts(tmp / "prompts.txt")
        res = run([str(bindir / "ierun"), "bench", "--device", args.device, "--model-dir", str(tmp / "iebin"),
                   "--prompts-file", str(tmp / "prompts.txt"), "--max-new", str(args.max_new),
                   "--rounds", str(args.rounds), "--threads", str(args.threads)], stdout=subprocess.PIPE, text=True)
        recs = [json.loads(line) for line in res.stdout.splitlines()]
        for line in res.stdout.splitlines():
            print(line)
        rf = [r["roofline_fraction"] for r in recs]
        drf = [r["decode_roofline_fraction"] for r in recs]
        tps = " ".join(f"{r['tps_true']:.2f}" for r in recs)
        last = recs[-1]
        where = "cuda" if args.device == "cuda" else f"{args.threads} threads"
        print(f"decode_bench: {iebin_mb:.0f} MB {last['precision']} model, {where}: "
              f"tps_true {tps}, "
              f"roofline_fraction {' '.join(f'{x:.3f}' for x in rf)} (median {statistics.median(rf):.3f}), "
              f"decode steps alone {' '.join(f'{x:.3f}' for x in drf)} (median {statistics.median(drf):.3f}) "
              f"of read_bw {last['read_bw_gbps']:.2f} GB/s, mb_per_token {last['mb_per_token']:.1f}, "
              f"effective {last['effective_gbps']:.2f} GB/s, decode step p50 {last['latency_p50_ms']:.2f} ms, "
              f"prefill {last['prefill_ms']:.0f} ms")
        decode_tps = [r["decode_gbps"] * 1e3 / r["mb_per_token"] for r in recs]
        label = "int4w g64" if args.scheme == "int4w" else args.scheme
        ours = (f"decode_bench: ierun {label}: decode {statistics.median(decode_tps):.1f} tok/s, "
                f"{last['mb_per_token']:.1f} MB/token, {statistics.median(drf):.3f} of the roofline")
        if q4_0 is not None:
            ref = llamacpp_decode(q4_0, args.llama_bench, args.threads, args.max_new, args.rounds)
            print(json.dumps({"llama_cpp": "Q4_0", **ref}))
            busy = " (busy: not trustworthy)" if ref["busy"] else ""
            print(f"{ours}\ndecode_bench: llama.cpp Q4_0:    decode {ref['tg_tps']:.1f} tok/s (llama-bench tg"
                  f"{args.max_new}), {ref['mb_per_token']:.1f} MB/token, {ref['decode_roofline_fraction']:.3f} of "
                  f"the roofline ({ref['read_bw_gbps']:.2f} GB/s){busy}")
        elif args.device == "cpu":
            print(f"{ours}\ndecode_bench: llama.cpp: skipped (no llama-bench / llama-quantize: make llamacpp, or "
                  "--llama-bench and --llama-quantize)")
    finally:
        if args.keep:
            print(f"decode_bench: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
