"""iq4_xsh's dequantization written from docs/formats/quant.md alone: the
independent reference the native kernels (tests/test_gemv.py) and the
quantizer (tests/test_iq4xsh.py) are held to. No other tool has the type."""

from __future__ import annotations

import numpy as np

# ggml's kvalues_iq4nl, as docs/formats/quant.md lists them.
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def deq_iq4_xsh(raw: np.ndarray) -> np.ndarray:
    """iq4_xsh blocks [n, 137] from the spec: s_j = f32(d) * (l_j - 32) in
    float32, w = s_j * (grid[q] + 4 * shift bit j), one rounding each."""
    d = raw[:, 0:2].copy().view("<f2").astype(np.float32)[:, 0]
    h = raw[:, 2:4].copy().view("<u2")[:, 0].astype(np.int32)
    j = np.arange(8)
    l = ((raw[:, 4 + j // 2] >> (4 * (j % 2))) & 0xF).astype(np.int32) | (((h[:, None] >> (2 * j)) & 3) << 4)
    s = (d[:, None] * (l - 32).astype(np.float32)).astype(np.float32)
    qs = raw[:, 8:136].reshape(-1, 8, 16)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2)
    shift = ((raw[:, 136, None] >> j) & 1).astype(np.float32) * np.float32(4)
    return (s[..., None] * (IQ4_GRID[q] + shift[..., None])).astype(np.float32).reshape(-1, 256)
