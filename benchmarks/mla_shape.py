"""Latent attention's speed beside llama.cpp's: a DeepSeek-V2-Lite-shaped
attention (16 heads, a latent of 512, 64 rotary + 128 unrotated key dims,
128 value dims; q through a rank-768 pair, as GLM-4.7-Flash's, since
llama.cpp reads q_proj only at V2-Lite's depth) over 4 dense layers 2048
wide, random bf16 weights (no
download), run by ``ierun bench`` and by llama.cpp's ``llama-bench`` on
the GGUF ``ieconv iebin-to-gguf`` writes of it, llama-bench's tests
(pp512, tg32, each at depth 0 and 4096) on the same threads.

    .venv/bin/python benchmarks/mla_shape.py --work /tmp/mla [--threads 2]

Both run the attention absorbed (queries taken into the latent's space, a
cache of 576 elements per position and layer); docs/benchmarks.md keeps
the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HIDDEN, HEADS, Q_RANK, LATENT, ROPE, NOPE, VALUE, INTER = 4, 2048, 16, 768, 512, 64, 128, 128, 2048


def checkpoint(out: Path) -> None:
    """The checkpoint, with tiny-llama's tokenizer (its 320 tokens the vocabulary)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "golden/hf/tiny-llama" / f, out / f)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    rng = np.random.default_rng(0)

    def m(r: int, c: int) -> np.ndarray:
        return (rng.standard_normal((r, c)) * 0.02).astype(np.float32)

    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": m(vocab, HIDDEN), "lm_head.weight": m(vocab, HIDDEN), "model.norm.weight": ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": ones(HIDDEN), p + "post_attention_layernorm.weight": ones(HIDDEN),
                  p + "self_attn.q_a_proj.weight": m(Q_RANK, HIDDEN), p + "self_attn.q_a_layernorm.weight": ones(Q_RANK),
                  p + "self_attn.q_b_proj.weight": m(HEADS * (NOPE + ROPE), Q_RANK),
                  p + "self_attn.kv_a_proj_with_mqa.weight": m(LATENT + ROPE, HIDDEN),
                  p + "self_attn.kv_a_layernorm.weight": ones(LATENT),
                  p + "self_attn.kv_b_proj.weight": m(HEADS * (NOPE + VALUE), LATENT),
                  p + "self_attn.o_proj.weight": m(HIDDEN, HEADS * VALUE), p + "mlp.gate_proj.weight": m(INTER, HIDDEN),
                  p + "mlp.up_proj.weight": m(INTER, HIDDEN), p + "mlp.down_proj.weight": m(HIDDEN, INTER)})
    save_file(dict(sorted(t.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": HIDDEN,
           "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": HEADS, "vocab_size": vocab, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "hidden_act": "silu", "q_lora_rank": Q_RANK, "kv_lora_rank": LATENT,
           "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": VALUE, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 256, "n_shared_experts": 1,
           "first_k_dense_replace": LAYERS, "norm_topk_prob": False, "topk_method": "greedy",
           "scoring_func": "softmax", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))


def run(cmd: list[str]) -> str:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{cmd[0]}: {res.stderr.strip()[-2000:]}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    checkpoint(a.work / "hf")
    run([bin_dir / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", a.work / "hf", "--out-dir", a.work / "ie",
         "--dtype", "bf16"])
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
