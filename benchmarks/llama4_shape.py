"""Llama 4's layer at speed beside llama.cpp's: a Scout-shaped model cut to
fit (8 layers 2048 wide, 16 heads of 128 over 4 KV heads, every 4th layer
unrotated and the others in chunks, q/k norms; 16 experts of 1024 channels,
the top one fed its router weight, beside a shared expert of 1024, in every
layer), random weights (no download), in bf16 or quantized by
``--scheme`` (q4_0: the same blocks both sides), run by ``ierun bench`` and by
llama.cpp's ``llama-bench`` on the GGUF ``ieconv iebin-to-gguf`` writes of
it, llama-bench's tests (pp512, tg32, each at depth 0 and 4096) on the same
threads.

    .venv/bin/python benchmarks/llama4_shape.py --work /tmp/l4 [--threads 2] [--scheme q4_0]

docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from mla_shape import run

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, INTER = 8, 2048, 16, 4, 128, 16, 1024


def checkpoint(out: Path) -> None:
    """The checkpoint, with tiny-llama's tokenizer (its 320 tokens the vocabulary); expert stacks as
    transformers stores them, [experts, in, out]."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "golden/hf/tiny-llama" / f, out / f)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    rng = np.random.default_rng(0)

    def m(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": m(vocab, HIDDEN), "lm_head.weight": m(vocab, HIDDEN), "model.norm.weight": ones(HIDDEN)}
    for i in range(LAYERS):
        p, f = f"model.layers.{i}.", f"model.layers.{i}.feed_forward."
        t.update({p + "input_layernorm.weight": ones(HIDDEN), p + "post_attention_layernorm.weight": ones(HIDDEN),
                  p + "self_attn.q_proj.weight": m(HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.k_proj.weight": m(KV_HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.v_proj.weight": m(KV_HEADS * HEAD_DIM, HIDDEN),
                  p + "self_attn.o_proj.weight": m(HIDDEN, HEADS * HEAD_DIM),
                  f + "router.weight": m(EXPERTS, HIDDEN), f + "experts.gate_up_proj": m(EXPERTS, HIDDEN, 2 * INTER),
                  f + "experts.down_proj": m(EXPERTS, INTER, HIDDEN),
                  f + "shared_expert.gate_proj.weight": m(INTER, HIDDEN),
                  f + "shared_expert.up_proj.weight": m(INTER, HIDDEN),
                  f + "shared_expert.down_proj.weight": m(HIDDEN, INTER)})
    save_file(dict(sorted(t.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": HIDDEN,
           "intermediate_size": INTER, "intermediate_size_mlp": 2 * INTER, "num_hidden_layers": LAYERS,
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": vocab,
           "max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "hidden_act": "silu", "num_local_experts": EXPERTS,
           "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scheme", default="bf16", help="bf16, or a q4-manifest --scheme (q4_0: llama.cpp's type too)")
    a = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    checkpoint(a.work / "hf")
    weights = ["--dtype", "bf16"]
    if a.scheme != "bf16":
        run([bin_dir / "ieconv", "q4-manifest", "--hf-dir", a.work / "hf", "-o", a.work / "q.json", "--scheme", a.scheme])
        weights = ["--q4-map", a.work / "q.json"]
    run([bin_dir / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", a.work / "hf", "--out-dir", a.work / "ie",
         *weights])
    run([bin_dir / "ieconv", "iebin-to-gguf", "-q", "--overwrite", "--model-dir", a.work / "ie", "--out",
         a.work / "m.gguf"])
    tests = ["-p", "512", "-n", "32", "-d", "0,4096", "-t", str(a.threads), "-r", "2"]
    print("ierun:")
    print(run([bin_dir / "ierun", "bench", "-m", a.work / "ie", *tests, "-o", "md"]))
    llama_bench = shutil.which("llama-bench") or ROOT / "build/llamacpp/bin/llama-bench"
    if Path(llama_bench).exists():
        print("llama.cpp:")
        print(run([llama_bench, "-m", a.work / "m.gguf", *tests, "-o", "md"]))
    else:
        print("llama.cpp: llama-bench not built (make llamacpp)")


if __name__ == "__main__":
    main()
