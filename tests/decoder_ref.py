"""An independent float64 numpy forward pass of the Llama family, for tests.

Written from the transformers modelling code's definitions (RMSNorm,
rotate-half RoPE, GQA with a causal softmax, SwiGLU), not from the C++
decoder. Weights are dequantized with the Python reference
(formats/quant.py), so comparing it with the native decoder on a quantized
artifact checks the whole INT4 inference path, not only single GEMVs.
"""

from __future__ import annotations

import numpy as np

from iekit.formats import iebin
from iekit.formats.casting import decode_f32
from iekit.formats.quant import SCHEMES, matrix_dims


def load_weights(model_dir) -> tuple[dict, dict[str, np.ndarray]]:
    m = iebin.load_model(model_dir)
    out = {}
    for t in m.tensors:
        raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        if t["dtype"] in SCHEMES:
            s = SCHEMES[t["dtype"]]
            count, rows, cols = matrix_dims(t["shape"])  # an expert stack: count matrices' rows in a row
            w = s.dequantize(np.frombuffer(raw, np.uint8), count * rows, cols,
                             s.params_from(t["quant"], cols)).reshape(t["shape"])
        else:
            w = decode_f32(raw, t["dtype"]).reshape(t["shape"])
        out[t["name"]] = np.asarray(w, np.float64)
    return m.meta["model"], out


def forward(model: dict, w: dict[str, np.ndarray], ids: list[int], window: int = 0,
            inputs: dict[str, np.ndarray] | None = None, outer: dict[str, np.ndarray] | None = None,
            k_dtype: type | None = None, v_dtype: type | None = None) -> np.ndarray:
    """Logits [len(ids), vocab] in float64; ``window`` > 0: query q sees keys
    q - window < k <= q (Mistral's sliding window). ``k_dtype``, ``v_dtype``
    (np.float16): every key (after RoPE), every value rounded to it, as a
    cache of that type holds them. ``inputs``, when given,
    receives per matrix name the sum over positions of x² of its input, per
    column (an importance matrix's statistic; the head's under its name);
    ``outer`` the sum over positions of x xᵀ (the input covariance's)."""
    H, nh = model["hidden_size"], model["num_attention_heads"]
    nkv = model["num_key_value_heads"] or nh
    hd = model["head_dim"] or H // nh
    eps = model["norm_eps"]
    theta = model["rope_theta"]
    n = len(ids)
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.outer(np.arange(n), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def norm(x, g):
        return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    def rope(x):  # x [n, heads, hd]
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    def lin(name, x):
        if inputs is not None:
            inputs[name + ".weight"] = (x * x).sum(0)
        if outer is not None:
            outer[name + ".weight"] = x.T @ x
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    if window:
        mask += np.tril(np.full((n, n), -np.inf), -window)
    for i in range(model["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope(lin(p + "self_attn.q_proj", h).reshape(n, nh, hd))
        k = rope(lin(p + "self_attn.k_proj", h).reshape(n, nkv, hd))
        v = lin(p + "self_attn.v_proj", h).reshape(n, nkv, hd)
        if k_dtype is not None:
            k = k.astype(k_dtype).astype(np.float64)
        if v_dtype is not None:
            v = v.astype(v_dtype).astype(np.float64)
        k, v = np.repeat(k, nh // nkv, 1), np.repeat(v, nh // nkv, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + lin(p + "self_attn.o_proj", np.einsum("hqk,khd->qhd", a, v).reshape(n, nh * hd))
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g = lin(p + "mlp.gate_proj", h)
        x = x + lin(p + "mlp.down_proj", g / (1 + np.exp(-g)) * lin(p + "mlp.up_proj", h))
    head = "lm_head.weight" if "lm_head.weight" in w else "model.embed_tokens.weight"
    h = norm(x, w["model.norm.weight"])
    if inputs is not None:
        inputs[head] = (h * h).sum(0)
    if outer is not None:
        outer[head] = h.T @ h
    return h @ w[head].T


def kl_top1(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(mean KL(ref || got) in nats, top-1 agreement) over positions."""
    def logp(z):
        z = z.astype(np.float64) - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lg = logp(ref), logp(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    return float(kl.mean()), float((ref.argmax(-1) == got.argmax(-1)).mean())
