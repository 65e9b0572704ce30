"""iq4_nl and iq4_xs (formats/quant.py, the iq4 search of
formats/quant_search.py): what the non-linear grid is for, its index, its
checks. Their bytes against llama.cpp's, gguf.quants' dequantization of
them, their error bound and their importance weighting are tested with the
k-quants (tests/test_kquant.py).
References: numpy float64 for the errors; ggml's best_index_int8 for the index.
"""

from __future__ import annotations

import numpy as np
import pytest

from iekit.formats import quant_search as qs
from iekit.formats.quant import SCHEMES, QuantParams


def test_the_non_linear_grid_beats_q4_0_at_the_same_size():
    """iq4_nl's reason to exist: on bell-shaped weights its grid (dense near
    zero) leaves less error than q4_0's uniform one, at the same 18 bytes per 32."""
    x = np.random.default_rng(5).standard_normal((64, 512)).astype(np.float32)
    err = {}
    for scheme in ("q4_0", "iq4_nl"):
        s, p = SCHEMES[scheme], QuantParams(scheme)
        raw = s.quantize(x, p)
        err[scheme] = float(((x.astype(np.float64) - s.dequantize(raw, *x.shape, p)) ** 2).mean())
    assert SCHEMES["iq4_nl"].block_bytes == SCHEMES["q4_0"].block_bytes
    assert err["iq4_nl"] < 0.9 * err["q4_0"]


def test_iq4_index_is_ggml_best_index_int8():
    """Nearest grid entry, ties to the upper one, ends clamp (ggml's best_index_int8)."""
    v = qs.IQ4_VALUES
    a = np.array([-300, -127, -115.5, -115.4, 0, -4.5, 1, 113, 114, 1e30, (89 + 113) / 2], np.float32)
    assert qs.iq4_index(a).tolist() == [0, 0, 1, 1, 8, 8, 8, 15, 15, 15, 15]
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32)  # every tie between neighbours goes up
    assert qs.iq4_index(mid).tolist() == list(range(1, 16))


def test_iq4_xs_needs_whole_super_blocks():
    assert "multiple of 256" in SCHEMES["iq4_xs"].check([4, 576], QuantParams("iq4_xs"))
    assert SCHEMES["iq4_nl"].check([4, 576], QuantParams("iq4_nl")) is None


@pytest.mark.parametrize("scheme, block, words", [("iq4_nl", 3, "block 3 (row 0, columns 96..127)"),
                                                  ("iq4_xs", 1, "block 1 (row 0, columns 256..511)")])
def test_a_nonfinite_d_makes_the_payload_invalid(scheme, block, words):
    """ieconv validate --deep's payload scan (formats/finite.py) reads each
    block's f16 d from the weight-type's F16_FIELDS: the iq4 blocks' d too."""
    from iekit.formats.finite import PayloadScan

    s, p = SCHEMES[scheme], QuantParams(scheme)
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    raw = s.quantize(x, p).copy()
    raw[block * s.block_bytes:block * s.block_bytes + 2] = np.array([np.nan], np.float16).view(np.uint8)
    scan = PayloadScan({"dtype": scheme, "shape": [2, 512], "quant": s.quant_dict(512, p)})
    for at in range(0, raw.size, 100):  # in odd-sized chunks, as the validator streams
        scan.feed(raw[at:at + 100].tobytes())
    assert scan.problem is not None and words in scan.problem and "d is nan" in scan.problem
