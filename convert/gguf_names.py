"""llama.cpp tensor names -> Hugging Face names (Llama family).

One table for what reads llama.cpp's names: the GGUF importer, and the
converters reading a llama.cpp importance matrix (``--imatrix x.dat``).
"""

from __future__ import annotations

import re

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_BLK = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor, or None when it has none here."""
    top, _, suffix = gguf_name.partition(".")
    if top in _TOP and suffix in ("weight", "bias"):
        return f"{_TOP[top]}.{suffix}"
    m = _BLK.fullmatch(gguf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"model.layers.{int(m.group(1))}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None
