"""gpt-oss-20b at its real size: conversion, then decoding with 2 threads.

Writes a synthetic checkpoint with gpt-oss-20b's exact config and tensor
shapes (24 layers, 32 MXFP4 experts of 2880 channels, top-4, vocab 201088;
about 13 GB) into --dir, streamed tensor by tensor (never held in RAM):
random bf16 bits for the float tensors, random e2m1 nibbles and E8M0 scales
2^-8..2^-4 for the experts. Then, each in a child process:

- ``ieconv hf-to-iebin``: wall time and peak RSS (ru_maxrss), which must stay
  flat, far below the model size;
- ``ierun bench --threads 2`` over token-id prompts: decode tok/s,
  ``mb_per_token`` (the active experts' bytes, not all 32), the roofline
  fraction, active parameters per token, and peak RSS, which stays below the
  model size because only the routed experts are paged in; and
  ``ierun generate`` of one token from a one-token prompt (one forward
  pass), whose peak RSS shows the paging: the token routes to 4 of each
  layer's 32 experts and only those are read (the bench's prompts, with
  random router weights, touch nearly all);
- ``ieconv dedup-plan`` with every expert a unit of its own (768 experts of
  each of the two stacks' sizes): time, peak RSS, groups found, and per
  expert bucket the sampled byte agreement of the closest pair, of
  neighbouring experts and over all pairs.

One JSON line with all of it. The checkpoint and artifact stay in --dir
(delete it after; --keep-source 0 removes the checkpoint once converted).

    python benchmarks/bench_moe.py [--dir /tmp/ie-bench-moe] [--max-new 8]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

import child_rss  # benchmarks/, beside this script
import synthetic_checkpoint

H, HEADS, KV, HD, E, K, I, V, LAYERS = 2880, 64, 8, 64, 32, 4, 2880, 201088, 24
CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
    "num_local_experts": E, "num_experts_per_tok": K, "vocab_size": V, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "attention_bias": True,
    "tie_word_embeddings": False, "hidden_act": "silu", "eos_token_id": 200002,
    "layer_types": ["sliding_attention", "full_attention"] * (LAYERS // 2),
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False},
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"]},
}
CHUNK = 64 << 20


def layer_tensors(i: int) -> list[tuple[str, str, list[int]]]:
    p = f"model.layers.{i}."
    out = [(p + "input_layernorm.weight", "BF16", [H]), (p + "post_attention_layernorm.weight", "BF16", [H]),
           (p + "self_attn.sinks", "BF16", [HEADS])]
    for n, rows, cols in (("q", HEADS * HD, H), ("k", KV * HD, H), ("v", KV * HD, H), ("o", H, HEADS * HD)):
        out += [(p + f"self_attn.{n}_proj.weight", "BF16", [rows, cols]), (p + f"self_attn.{n}_proj.bias", "BF16", [rows])]
    out += [(p + "mlp.router.weight", "BF16", [E, H]), (p + "mlp.router.bias", "BF16", [E])]
    for n, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
        out += [(p + f"mlp.experts.{n}_blocks", "U8", [E, rows, cols // 32, 16]),
                (p + f"mlp.experts.{n}_scales", "U8", [E, rows, cols // 32]),
                (p + f"mlp.experts.{n}_bias", "BF16", [E, rows])]
    return out


def fill(rng: np.random.Generator, name: str, dtype: str, n: int) -> np.ndarray:
    """n bytes of the tensor: bf16 of magnitude 2^-8..2^-1 (norms near 1),
    random e2m1 code bytes, or E8M0 scales 2^-8..2^-4."""
    if dtype == "U8":
        return rng.integers(119, 124, n, np.uint8) if name.endswith("_scales") else rng.integers(0, 256, n, np.uint8)
    bits = rng.integers(0, 1 << 16, n // 2, np.uint16)
    exp = (0x3F80 if "norm" in name else 0x3B80) + ((bits & 0x0380) if "norm" not in name else 0)
    return ((bits & 0x807F) | exp).astype(np.uint16).view(np.uint8)


def chunks_from(rng: np.random.Generator):
    """synthetic_checkpoint's chunk generator over fill: CHUNK bytes at a time."""
    def chunks(name: str, dtype: str, shape: list[int]):
        left = math.prod(shape) * synthetic_checkpoint.ITEMSIZE[dtype]
        while left:
            n = min(CHUNK, left)
            yield fill(rng, name, dtype, n).tobytes()
            left -= n

    return chunks


def write_checkpoint(d: Path, layers: int = LAYERS, vocab: int = V) -> int:
    """gpt-oss-20b's checkpoint, or (vs_llamacpp.py's MoE row) its first
    ``layers`` layers over a ``vocab``-token vocabulary."""
    rng = np.random.default_rng(0)
    config = dict(CONFIG, num_hidden_layers=layers, vocab_size=vocab, layer_types=CONFIG["layer_types"][:layers])
    if vocab != V:
        config["eos_token_id"] = 2  # a tokenizer of its own (SmolLM2's: <|im_end|>)
    shards = [[("model.embed_tokens.weight", "BF16", [vocab, H]), ("model.norm.weight", "BF16", [H])],
              *[layer_tensors(i) for i in range(layers)], [("lm_head.weight", "BF16", [vocab, H])]]
    return synthetic_checkpoint.write_checkpoint(d, config, shards, chunks_from(rng))


# Qwen3-30B-A3B's shapes (vs_llamacpp.py's Q4_K_M mixture): 128 experts of 2048 x 768, top 8.
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False,
    "use_sliding_window": False, "sliding_window": None,
}


def write_qwen3_moe_checkpoint(d: Path, layers: int = 4, vocab: int = 49152) -> int:
    """The first ``layers`` layers of Qwen3-30B-A3B's shapes, every tensor
    bf16 (fill's magnitudes), over a ``vocab``-token vocabulary (SmolLM2's
    tokenizer: <|im_end|> = 2): what llama-quantize makes a Q4_K_M mixture
    of. About 1.35 GB a layer."""
    c = QWEN3_MOE
    h, hd, e, inter = c["hidden_size"], c["head_dim"], c["num_experts"], c["moe_intermediate_size"]
    rng = np.random.default_rng(0)
    config = dict(c, num_hidden_layers=layers, vocab_size=vocab, eos_token_id=2)

    def layer(i: int) -> list[tuple[str, str, list[int]]]:
        p = f"model.layers.{i}."
        out = [(p + n, "BF16", [size]) for n, size in (("input_layernorm.weight", h), ("post_attention_layernorm.weight", h),
                                                         ("self_attn.q_norm.weight", hd), ("self_attn.k_norm.weight", hd))]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        out += [(p + f"self_attn.{n}_proj.weight", "BF16", [rows, cols])
                for n, rows, cols in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q))]
        out.append((p + "mlp.gate.weight", "BF16", [e, h]))
        out += [(p + f"mlp.experts.{x}.{n}.weight", "BF16", [rows, cols]) for x in range(e)
                for n, rows, cols in (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter))]
        return out

    shards = [[("model.embed_tokens.weight", "BF16", [vocab, h]), ("model.norm.weight", "BF16", [h])],
              *[layer(i) for i in range(layers)], [("lm_head.weight", "BF16", [vocab, h])]]
    return synthetic_checkpoint.write_checkpoint(d, config, shards, chunks_from(rng))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ie-bench-moe"))
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-source", type=int, default=1)
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.generate:
        print(write_checkpoint(a.generate))
        return
    bindir = Path(sys.executable).parent
    src, out, log = a.dir / "hf", a.dir / "iebin", a.dir / "log.txt"
    # Written by a child, so this process never holds more than a few MB (docs in child_rss.py).
    a.dir.mkdir(parents=True, exist_ok=True)
    gen_s, _ = child_rss.run([sys.executable, __file__, "--generate", str(src)], log, a.dir / "size.txt")
    size = int((a.dir / "size.txt").read_text())
    shutil.rmtree(out, ignore_errors=True)
    conv_s, conv_rss = child_rss.run([str(bindir / "ieconv"), "hf-to-iebin", "-q", "--hf-dir", str(src),
                                      "--out-dir", str(out)], log)
    if not a.keep_source:
        shutil.rmtree(src)
    prompts = a.dir / "prompts.txt"
    prompts.write_text("ids: 200006,17360,200008,3575,553,261,10297,29186\nids: 12194,11,1495,553,481,30\n")
    child_rss.run([str(bindir / "ierun"), "bench", "--model-dir", str(out), "--threads", str(a.threads),
                   "--prompts-file", str(prompts), "--max-new", str(a.max_new), "--rounds", "1", "--ignore-eos"],
                  log, a.dir / "bench.jsonl")
    rec = json.loads((a.dir / "bench.jsonl").read_text().strip().splitlines()[-1])
    one_s, one_rss = child_rss.run([str(bindir / "ierun"), "generate", "--model-dir", str(out), "--threads",
                                    str(a.threads), "--ids", "200006", "--max-new", "1", "--ignore-eos"], log)
    plan_s, plan_rss = child_rss.run([str(bindir / "ieconv"), "dedup-plan", "--json", "--overwrite", "--model-dir",
                                      str(out), "--out-dir", str(a.dir / "dedup_out")], log, a.dir / "plan.json")
    plan = json.loads((a.dir / "plan.json").read_text())
    print(json.dumps({
        "checkpoint_gb": size / 1e9, "generate_s": round(gen_s, 1), "convert_s": round(conv_s, 1),
        "convert_gbps": round(size / conv_s / 1e9, 3), "convert_rss_peak_mb": round(conv_rss),
        "model_bytes": rec["model_bytes"], "threads": a.threads, "tps_true": rec["tps_true"],
        "decode_tps": (rec["decode_steps"] / (rec["wall_time_s"] - rec["prefill_ms"] / 1e3)
                       if rec["decode_steps"] else None),
        "mb_per_token": rec["mb_per_token"], "model_coverage": rec["model_coverage"],
        "active_params_per_token": rec["active_params_per_token"], "read_bw_gbps": rec["read_bw_gbps"],
        "roofline_fraction": rec["roofline_fraction"], "decode_roofline_fraction": rec["decode_roofline_fraction"],
        "bench_rss_peak_mb": rec["rss_peak_mb"], "act_prec": rec.get("act_prec"),
        "one_token_rss_peak_mb": round(one_rss), "one_token_s": round(one_s, 1),
        "dedup_plan_s": round(plan_s, 1), "dedup_plan_rss_peak_mb": round(plan_rss), "dedup_units": plan["candidates"],
        "dedup_experts": plan["experts"], "dedup_groups": len(plan["groups"]),
        "dedup_candidate_groups_dropped": len(plan["dropped"]),
        "dedup_expert_buckets": [{k: b[k] for k in ("first", "units", "nbytes", "pairs", "best_agreement",
                                                    "neighbour_agreement", "mean_agreement")}
                                 for b in plan["buckets"] if b["first"].endswith("]")],
    }))


if __name__ == "__main__":
    main()
