"""iq4_nl and iq4_xs (formats/quant.py, the iq4 search of
formats/quant_search.py) against llama.cpp itself.

References, none of them our code:
- golden/quant/iq4_*.bin: ggml's ``quantize_iq4_nl`` / ``quantize_iq4_xs``
  bytes for golden/quant/input.npy, without and with the importance vector
  golden/quant/importance.npy (golden/quant/make_golden_quant.py);
- ``gguf.quants.dequantize`` for what the bytes mean;
- numpy float64 for the weighted errors.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iekit.formats import quant_search as qs
from iekit.formats.errors import IEError
from iekit.formats.quant import SCHEMES, QuantParams

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "quant"
IQ4 = ("iq4_nl", "iq4_xs")


def _golden(name: str) -> np.ndarray:
    return np.frombuffer((GOLDEN / name).read_bytes(), np.uint8)


def _gguf_deq(raw: np.ndarray, rows: int, scheme: str) -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[scheme.upper()]).astype(np.float32)


@pytest.mark.parametrize("scheme", IQ4)
@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
def test_bytes_equal_llama_cpp(scheme, with_imatrix):
    x = np.load(GOLDEN / "input.npy")
    imp = np.load(GOLDEN / "importance.npy") if with_imatrix else None
    s = SCHEMES[scheme]
    ours = s.quantize(x, QuantParams(scheme), importance=imp)
    ref = _golden(f"{scheme}{'-imatrix' if with_imatrix else ''}.bin")
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, f"first differing byte {bad[0]} (row {bad[0] // (x.shape[1] // s.block_elems * s.block_bytes)})"


@pytest.mark.parametrize("scheme", IQ4)
def test_dequantizes_as_gguf_does_within_the_bound(scheme):
    x = np.load(GOLDEN / "input.npy")
    s, p = SCHEMES[scheme], QuantParams(scheme)
    for raw in (s.quantize(x, p), s.quantize(x, p, importance=np.load(GOLDEN / "importance.npy"))):
        ours = s.dequantize(raw, *x.shape, p)
        assert np.array_equal(ours.view(np.uint32), _gguf_deq(raw, x.shape[0], scheme).view(np.uint32))
        assert (np.abs(x - ours) <= s.error_bound(x, raw, p)).all()


@settings(max_examples=30, deadline=None)
@given(scheme=st.sampled_from(IQ4), rows=st.integers(1, 4), supers=st.integers(1, 2),
       log_scale=st.floats(-30, 3), seed=st.integers(0, 2**31))
def test_round_trip_on_random_scales(scheme, rows, supers, log_scale, seed):
    rng = np.random.default_rng(seed)
    s, p = SCHEMES[scheme], QuantParams(scheme)
    x = (rng.standard_normal((rows, 256 * supers)) * 10.0 ** log_scale).astype(np.float32)
    raw = s.quantize(x, p)
    assert raw.size == s.nbytes(*x.shape, p)
    deq = s.dequantize(raw, *x.shape, p)
    assert np.array_equal(deq.view(np.uint32), _gguf_deq(raw, rows, scheme).view(np.uint32))
    assert (np.abs(x - deq) <= s.error_bound(x, raw, p)).all()


@pytest.mark.parametrize("scheme", IQ4)
def test_error_bound_catches_a_wrong_code(scheme):
    x = np.load(GOLDEN / "input.npy")[-4:]
    s, p = SCHEMES[scheme], QuantParams(scheme)
    raw = s.quantize(x, p).copy()
    codes = 2 if scheme == "iq4_nl" else 8
    raw[codes + 5] ^= 0x0C  # element 5 of the first block of row 0 moves by 4 or more grid steps
    deq = s.dequantize(raw, *x.shape, p)
    assert not (np.abs(x - deq) <= s.error_bound(x, raw, p)).all()


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


@pytest.mark.parametrize("scheme", IQ4)
def test_importance_lowers_the_weighted_error(scheme):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    imp = np.where(rng.random(512) < 0.1, 50.0, 0.1).astype(np.float32)
    s, p = SCHEMES[scheme], QuantParams(scheme)
    err = lambda raw: float((imp * (x.astype(np.float64) - s.dequantize(raw, *x.shape, p)) ** 2).sum())  # noqa: E731
    assert err(s.quantize(x, p, importance=imp)) < 0.9 * err(s.quantize(x, p))


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


@pytest.mark.parametrize("scheme", IQ4)
def test_bad_importance_is_refused(scheme):
    imp = np.ones(256, np.float32)
    imp[3] = np.nan
    with pytest.raises(IEError, match=r"w\.v: importance of column 3 is nan"):
        SCHEMES[scheme].quantize(np.ones((2, 256), np.float32), QuantParams(scheme), name="w.v", importance=imp)


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
