"""GEMV kernels and dequantizers against independent references.

References never use the code under test (nor formats/quant.py):
- q4_0 / q4_1 / q5_0 / q5_1 / q8_0 bytes come from ``gguf.quants.quantize`` and are
  dequantized with ``gguf.quants.dequantize`` (llama.cpp's own layout);
- q4_k, q5_k, q6_k, q3_k, q2_k, iq4_nl, iq4_xs, iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s and iq1_m bytes are random blocks (gguf-py
  quantizes none of them) with the f16 scales set to sane magnitudes, dequantized with
  ``gguf.quants``;
- int4w bytes are packed here from random codes/scales following
  docs/formats/quant.md, and dequantized here with numpy from the same text;
- iq4_xsh bytes are random blocks (no other tool has the type), dequantized
  here with numpy from docs/formats/quant.md;
- products are ``W_deq @ x`` in float64.

Bounds: act=f32 must be within 1e-5 * (|W| @ |x| + |bias|) of the float64
product (float32 accumulation over <= ~1000 terms, typically ~1e-7).
act=int8 is checked twice: (1) within the same 1e-5 bound of W @ x~, where
x~ is the int8-quantized activation computed here (so the integer kernels
are checked tightly), and (2) within the analytic quantization bound of the
exact W @ x: |x - x~| <= d/2 per element (d = max|x_block| / 127), so
|y - W x| <= |W| @ (d/2) + 1e-5 * scale.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from iekit.formats import weight_types
from iekit.formats.errors import IEError
from iekit.formats.quant import SCHEMES, QuantParams
from iekit.runtime import kernels, native
from iq4xsh_ref import deq_iq4_xsh

ISAS = native.cpu_features()["isas"]
GGML = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
        "q5_0": gguf.GGMLQuantizationType.Q5_0, "q5_1": gguf.GGMLQuantizationType.Q5_1,
        "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_k": gguf.GGMLQuantizationType.Q4_K,
        "q5_k": gguf.GGMLQuantizationType.Q5_K, "q6_k": gguf.GGMLQuantizationType.Q6_K,
        "q3_k": gguf.GGMLQuantizationType.Q3_K, "q2_k": gguf.GGMLQuantizationType.Q2_K,
        "iq4_nl": gguf.GGMLQuantizationType.IQ4_NL, "iq4_xs": gguf.GGMLQuantizationType.IQ4_XS,
        "mxfp4": gguf.GGMLQuantizationType.MXFP4, "iq3_s": gguf.GGMLQuantizationType.IQ3_S,
        "iq3_xxs": gguf.GGMLQuantizationType.IQ3_XXS, "iq2_xxs": gguf.GGMLQuantizationType.IQ2_XXS,
        "iq2_xs": gguf.GGMLQuantizationType.IQ2_XS, "iq2_s": gguf.GGMLQuantizationType.IQ2_S,
        "iq1_s": gguf.GGMLQuantizationType.IQ1_S, "iq1_m": gguf.GGMLQuantizationType.IQ1_M}
# Random-block types: (block elements, bytes, the offsets of the f16 scale fields).
RANDOM_BLOCKS = {"q4_k": (256, 144, (0, 2)), "q5_k": (256, 176, (0, 2)), "q6_k": (256, 210, (208,)),
                 "q3_k": (256, 110, (108,)), "q2_k": (256, 84, (80, 82)),
                 "iq4_nl": (32, 18, (0,)), "iq4_xs": (256, 136, (0,)), "iq3_s": (256, 110, (0,)),
                 "iq3_xxs": (256, 98, (0,)), "iq2_xxs": (256, 66, (0,)), "iq2_xs": (256, 74, (0,)),
                 "iq2_s": (256, 82, (0,)), "iq1_s": (256, 50, (0,))}


# ------------------------------------------------------------------ references

def pack_int4w(codes: np.ndarray, scales: np.ndarray, mins: np.ndarray | None, scale_dtype: str) -> np.ndarray:
    """planar-v1 from the spec: qs plane (per 32-block, byte j = elem j | elem j+16 << 4),
    then the scales plane [rows, G], then (affine) the mins plane, little-endian."""
    rows, cols = codes.shape
    blocks = codes.reshape(rows, cols // 32, 32).astype(np.uint8)
    qs = (blocks[:, :, :16] | (blocks[:, :, 16:] << 4)).reshape(-1)
    sd = np.dtype("<f2") if scale_dtype == "f16" else np.dtype("<f4")
    planes = [qs, np.ascontiguousarray(scales, dtype=sd).view(np.uint8).reshape(-1)]
    if mins is not None:
        planes.append(np.ascontiguousarray(mins, dtype=sd).view(np.uint8).reshape(-1))
    return np.concatenate(planes)


def deq_int4w(codes, scales, mins, group_size) -> np.ndarray:
    """Spec dequantization in float32 without FMA: s*(q-8), or s*q + m (two roundings)."""
    s = np.repeat(scales.astype(np.float32), group_size, axis=1)
    if mins is None:
        return s * (codes.astype(np.float32) - np.float32(8))
    m = np.repeat(mins.astype(np.float32), group_size, axis=1)
    return (s * codes.astype(np.float32)) + m


def quantize_q8_ref(x: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """act=int8 activations, one scale per ``block`` elements (a weight type's act_block: 32, or 256):
    d = max|x|/127 (float32), q = round_half_away(x * (1/d)); d returned per 32 elements (repeated)."""
    xb = x.reshape(-1, block).astype(np.float32)
    d = (np.abs(xb).max(axis=1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (xb * inv[:, None]).astype(np.float64)  # the float32 product, exactly
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return q.astype(np.int8).reshape(x.shape), np.repeat(d, block // 32)


def act_block(kind: str) -> int:
    """Elements per int8 activation scale of weight type ``kind`` (the registry's act_block)."""
    return weight_types.get(kind).act_block


def make_weights(kind: str, rows: int, cols: int, rng, group_size=0, symmetric=True, scale_dtype="f16"):
    """(raw uint8 bytes, float32 W_deq [rows, cols], tensor entry)."""
    entry = {"name": "w", "dtype": kind, "shape": [rows, cols]}
    if kind == "f32":
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        return w.view(np.uint8).reshape(-1), w, entry
    if kind == "f16":
        w = rng.standard_normal((rows, cols)).astype(np.float16)
        return w.view(np.uint8).reshape(-1), w.astype(np.float32), entry
    if kind == "bf16":
        bits = (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8).reshape(-1), (bits.astype(np.uint32) << 16).view(np.float32), entry
    if kind in RANDOM_BLOCKS:
        elems, nbytes, f16_at = RANDOM_BLOCKS[kind]
        raw = rng.integers(0, 256, size=(rows * cols // elems, nbytes), dtype=np.uint8)
        for at in f16_at:
            dd = rng.uniform(-1, 1, raw.shape[0]) * 10.0 ** rng.uniform(-4, -2, raw.shape[0])
            raw[:, at:at + 2] = dd.astype(np.float16)[:, None].view(np.uint8)
        raw[0, f16_at[0]:f16_at[0] + 2] = 0  # d = 0 (q4_k, q5_k: every sub-block is -min)
        entry["quant"] = {"scheme": kind, "block_size": elems}
        return raw.reshape(-1), gguf.quants.dequantize(raw.reshape(rows, -1), GGML[kind]).astype(np.float32), entry
    if kind == "q1_0":  # random signs under a random f16 d (0 in the first block); gguf-py cannot decode Q1_0, so
        # the scheme's numpy, which tests/test_q1_0.py holds to ggml's dequantize_row_q1_0
        raw = rng.integers(0, 256, size=(rows * cols // 128, 18), dtype=np.uint8)
        dd = rng.uniform(-1, 1, raw.shape[0]) * 10.0 ** rng.uniform(-4, -2, raw.shape[0])
        raw[:, 0:2] = dd.astype(np.float16)[:, None].view(np.uint8)
        raw[0, 0:2] = 0
        entry["quant"] = {"scheme": kind, "block_size": 128}
        return raw.reshape(-1), SCHEMES["q1_0"].dequantize(raw.reshape(-1), rows, cols, QuantParams("q1_0")), entry
    if kind == "iq4_xsh":  # random codes, sub-scales and grid shifts under a random f16 d (0 in the first block)
        raw = rng.integers(0, 256, size=(rows * cols // 256, 137), dtype=np.uint8)
        dd = rng.uniform(-1, 1, raw.shape[0]) * 10.0 ** rng.uniform(-4, -2, raw.shape[0])
        raw[:, 0:2] = dd.astype(np.float16)[:, None].view(np.uint8)
        raw[0, 0:2] = 0
        entry["quant"] = {"scheme": kind, "block_size": 256}
        return raw.reshape(-1), deq_iq4_xsh(raw).reshape(rows, cols), entry
    if kind == "iq1_m":  # random codes and sub-scales under a random d, spread over the scale words (0 in the first block)
        s = SCHEMES[kind]
        raw = rng.integers(0, 256, size=(rows * cols // 256, 56), dtype=np.uint8)
        dd = rng.uniform(-1, 1, raw.shape[0]) * 10.0 ** rng.uniform(-4, -2, raw.shape[0])
        dd[0] = 0
        s.set_f16_field(raw, 0, dd.astype(np.float16))
        entry["quant"] = {"scheme": kind, "block_size": 256}
        return raw.reshape(-1), gguf.quants.dequantize(raw.reshape(rows, -1), GGML[kind]).astype(np.float32), entry
    if kind == "mxfp4":  # random codes under E8M0 scales 2^-9 .. 2^-2, and the subnormal scales of e = 0, 1
        raw = rng.integers(0, 256, size=(rows * cols // 32, 17), dtype=np.uint8)
        raw[:, 0] = rng.integers(119, 127, raw.shape[0])
        raw[0, 0], raw[-1, 0] = 0, 1
        entry["quant"] = {"scheme": kind, "block_size": 32}
        return raw.reshape(-1), gguf.quants.dequantize(raw.reshape(rows, -1), GGML[kind]).astype(np.float32), entry
    if kind in GGML:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        w[0, :32] = 0  # an all-zero block (d = 0)
        raw = gguf.quants.quantize(w, GGML[kind])
        entry["quant"] = {"scheme": kind, "block_size": 32}
        return raw.reshape(-1), gguf.quants.dequantize(raw, GGML[kind]).astype(np.float32), entry
    assert kind == "int4w"
    g = cols // group_size
    codes = rng.integers(0, 16, size=(rows, cols), dtype=np.uint8)
    # Scales of both signs and mixed magnitudes (symmetric scales may be negative), one zero group.
    scales = (rng.uniform(-1, 1, (rows, g)) * 10.0 ** rng.uniform(-3, 0, (rows, g))).astype(np.float32)
    scales[0, 0] = 0
    mins = None if symmetric else (rng.uniform(-1, 1, (rows, g)) * 0.5).astype(np.float32)
    if scale_dtype == "f16":
        scales = scales.astype(np.float16)
        mins = None if mins is None else mins.astype(np.float16)
    raw = pack_int4w(codes, scales, mins, scale_dtype)
    entry["quant"] = {"scheme": "int4w", "group_size": group_size, "symmetric": symmetric,
                      "scale_dtype": scale_dtype, "layout": "planar-v1"}
    return raw, deq_int4w(codes, scales, mins, group_size), entry


# (kind, group_size, symmetric, scale_dtype, [(rows, cols), ...]); cols are multiples of 32 but not of
# 64/256 where the format allows, odd row counts everywhere.
INT4W = [("int4w", gs, sym, sd, shapes)
         for sym in (True, False) for sd in ("f16", "f32")
         for gs, shapes in ((32, [(37, 96), (5, 32)]), (64, [(37, 192), (3, 64)]), (128, [(13, 384)]),
                            ("cols", [(37, 160), (9, 384), (3, 32)]))]
VARIANTS = [("f32", 0, True, "f16", [(37, 100), (5, 7), (3, 1)]),
            ("f16", 0, True, "f16", [(37, 100), (6, 13)]),
            ("bf16", 0, True, "f16", [(37, 100), (2, 33)]),
            ("q4_0", 0, True, "f16", [(37, 96), (9, 64), (2, 32)]),
            ("q4_1", 0, True, "f16", [(37, 96), (9, 64)]),
            ("q8_0", 0, True, "f16", [(37, 96), (9, 64)]),
            ("q5_0", 0, True, "f16", [(37, 96), (9, 64), (2, 32)]),
            ("q5_1", 0, True, "f16", [(37, 96), (9, 64)]),
            ("q4_k", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq4_nl", 0, True, "f16", [(37, 96), (9, 64), (2, 32), (6, 416), (3, 224)]),
            ("mxfp4", 0, True, "f16", [(37, 96), (9, 64), (2, 32), (6, 416), (3, 224)]),
            ("iq4_xs", 0, True, "f16", [(37, 512), (3, 256)]),
            ("q5_k", 0, True, "f16", [(37, 512), (3, 256)]),
            ("q6_k", 0, True, "f16", [(37, 512), (3, 256)]),
            ("q3_k", 0, True, "f16", [(37, 512), (3, 256)]),
            ("q2_k", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq3_s", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq3_xxs", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq2_xxs", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq2_xs", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq2_s", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq1_s", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq1_m", 0, True, "f16", [(37, 512), (3, 256)]),
            ("iq4_xsh", 0, True, "f16", [(37, 512), (3, 256)]),
            ("q1_0", 0, True, "f16", [(37, 384), (3, 128)])] + INT4W


def vid(v):
    kind, gs, sym, sd, _ = v
    return f"{kind}-g{gs}-{'sym' if sym else 'aff'}-{sd}" if kind == "int4w" else kind


def gen(v, rows, cols, seed):
    kind, gs, sym, sd, _ = v
    rng = np.random.default_rng(seed)
    raw, wd, entry = make_weights(kind, rows, cols, rng, cols if gs == "cols" else gs, sym, sd)
    return raw, wd, entry, rng


# --------------------------------------------------------------------- tests

@pytest.mark.parametrize("v", VARIANTS, ids=vid)
def test_dequantize_bit_exact(v):
    for i, (rows, cols) in enumerate(v[4]):
        raw, wd, entry, _ = gen(v, rows, cols, 100 + i)
        got = kernels.dequantize(raw, entry)
        assert got.shape == (rows, cols) and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), wd.view(np.uint32)), (v, rows, cols)
        assert kernels.expected_nbytes(entry) == raw.size


# act=int8 exists for the packed formats only (float weights have no int8 path).
GEMV_CASES = [(v, act) for v in VARIANTS for act in ("f32", "int8") if act == "f32" or v[0] not in ("f32", "f16", "bf16")]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("v,act", GEMV_CASES, ids=[f"{vid(v)}-{a}" for v, a in GEMV_CASES])
def test_gemv_matches_reference(v, act, isa):
    for i, (rows, cols) in enumerate(v[4]):
        raw, wd, entry, rng = gen(v, rows, cols, 200 + i)
        wd64, wabs = wd.astype(np.float64), np.abs(wd).astype(np.float64)
        for batch in (1, 2, 3, 5, 8):
            for threads in (1, 2):
                use_bias = (batch + threads) % 2 == 0
                x = rng.standard_normal((batch, cols)).astype(np.float32)
                x[0, : min(cols, 5)] *= 100  # outliers within a block
                bias = rng.standard_normal(rows).astype(np.float32) if use_bias else None
                xin = x[0] if batch == 1 else x
                y = kernels.gemv(raw, entry, xin, bias=bias, threads=threads, act=act, isa=isa)
                assert y.dtype == np.float32 and y.shape == ((rows,) if batch == 1 else (batch, rows))
                y = y.reshape(batch, rows).astype(np.float64)
                b64 = np.zeros(rows) if bias is None else bias.astype(np.float64)
                where = f"{vid(v)} [{rows}x{cols}] b={batch} t={threads} bias={use_bias} {act} {isa}"
                if act == "f32":
                    ref = x.astype(np.float64) @ wd64.T + b64
                    scale = np.abs(x).astype(np.float64) @ wabs.T + np.abs(b64)
                    assert np.all(np.abs(y - ref) <= 1e-5 * scale + 1e-30), where
                else:
                    q, d = quantize_q8_ref(x, act_block(v[0]))
                    xq = q.astype(np.float64) * np.repeat(d.reshape(batch, -1).astype(np.float64), 32, axis=1)
                    ref_q = xq @ wd64.T + b64
                    scale_q = np.abs(xq) @ wabs.T + np.abs(b64)
                    assert np.all(np.abs(y - ref_q) <= 1e-5 * scale_q + 1e-30), where
                    ref = x.astype(np.float64) @ wd64.T + b64
                    half_step = np.repeat(d.reshape(batch, -1).astype(np.float64), 32, axis=1) / 2 * (1 + 1e-6)
                    bound = half_step @ wabs.T + 1e-5 * (np.abs(x).astype(np.float64) @ wabs.T + np.abs(b64))
                    assert np.all(np.abs(y - ref) <= bound + 1e-30), where


# Every quantized type has a rows8 copy (floats read their stored layout).
ROWS8_VARIANTS = [v for v in VARIANTS if v[0] not in ("f32", "f16", "bf16")]


# The ISAs with rows8 kernels: AVX2's (maddubs), AVX-VNNI's and AVX-512's (vpdpbusd), each where this CPU has it.
ROWS8_ISAS = [i for i in ISAS if i != "scalar"]


@pytest.mark.skipif(not ROWS8_ISAS, reason="the rows8 kernels are AVX2, AVX-VNNI and AVX-512 VNNI")
@pytest.mark.parametrize("isa", ROWS8_ISAS)
@pytest.mark.parametrize("v", ROWS8_VARIANTS, ids=vid)
def test_rows8_layout_matches_reference(v, isa):
    """The decoder's row-interleaved int8 kernel: every packed type and
    parameter set, row counts that leave a partial tile, one token and
    prefill chunks up to kMaxRows8Batch = 512 rows (four tokens at a time per
    tile, and a tail of one to three), 1-3 threads (tile
    splits), with and without bias, within the same bounds as the stored layout."""
    for i, (rows, cols) in enumerate(v[4] + [(3, v[4][0][1]), (64, v[4][0][1])]):
        raw, wd, entry, rng = gen(v, rows, cols, 300 + i)
        wd64, wabs = wd.astype(np.float64), np.abs(wd).astype(np.float64)
        for batch, threads in ((1, 1), (1, 2), (1, 3), (3, 2), (5, 1), (8, 3), (13, 2), (64, 1), (211, 2)):
            x = rng.standard_normal((batch, cols)).astype(np.float32)
            x[0, : min(cols, 5)] *= 100
            bias = rng.standard_normal(rows).astype(np.float32) if threads != 2 else None
            y = kernels.gemv(raw, entry, x[0] if batch == 1 else x, bias=bias, threads=threads, act="int8",
                             isa=isa, layout="rows8").reshape(batch, rows)
            q, d = quantize_q8_ref(x, act_block(v[0]))
            xq = q.astype(np.float64) * np.repeat(d.reshape(batch, -1).astype(np.float64), 32, axis=1)
            b64 = np.zeros(rows) if bias is None else bias.astype(np.float64)
            ref = xq @ wd64.T + b64
            bound = 1e-5 * (np.abs(xq) @ wabs.T + np.abs(b64)) + 1e-30
            assert np.all(np.abs(y - ref) <= bound), (vid(v), rows, batch, threads, isa)


@pytest.mark.skipif(len(ROWS8_ISAS) < 2, reason="needs two rows8 kernels: AVX2 and a VNNI one")
@pytest.mark.parametrize("v", ROWS8_VARIANTS, ids=vid)
def test_rows8_isas_agree_bit_for_bit(v):
    """VNNI's kernels compute the AVX2 kernels' integers another way (int32
    dpbusd sums, signed values offset by 128, sub-scales by vpmulld) and then
    the same float operations in the same order: every output must be the
    same float, one token and prefill chunks, activations with outliers."""
    rows, cols = v[4][0]
    raw, _, entry, rng = gen(v, rows + 5, cols, 900)
    for batch in (1, 4, 13, 32, 53):
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        x[:, : min(cols, 7)] *= 300
        ys = [kernels.gemv(raw, entry, x[0] if batch == 1 else x, threads=2, act="int8", isa=isa, layout="rows8")
              for isa in ROWS8_ISAS]
        assert all(np.array_equal(ys[0], y) for y in ys[1:]), (vid(v), batch)


@pytest.mark.skipif(not ROWS8_ISAS, reason="the rows8 kernels are AVX2, AVX-VNNI and AVX-512 VNNI")
@pytest.mark.parametrize("isa", ROWS8_ISAS)
@pytest.mark.parametrize("v", ROWS8_VARIANTS, ids=vid)
def test_packing_layout_is_rows8_bit_for_bit(v, isa):
    """layout='packing' (a decoder's experts in prefill) runs the rows8
    kernels on tiles each thread packs from the stored bytes as it goes, one
    or a pair at a time, the fast nibble packers for q4_0's and q4_k's orders
    and the code-by-code one for the rest: every output must be the float
    of a pack_rows8 copy, for partial tiles, odd tile counts split over
    threads, and token counts that take every kernel (one token, the four-
    and eight-token tiles and pairs, AMX's sixteen)."""
    rows, cols = v[4][0]
    for i, extra in enumerate((0, 5, 11)):
        raw, _, entry, rng = gen(v, rows + extra, cols, 1300 + i)
        for batch, threads in ((1, 1), (3, 2), (8, 3), (16, 2), (21, 1), (64, 3), (509, 2)):
            x = rng.standard_normal((batch, cols)).astype(np.float32)
            x[:, : min(cols, 7)] *= 300
            bias = rng.standard_normal(rows + extra).astype(np.float32) if threads == 3 else None
            y = [kernels.gemv(raw, entry, x[0] if batch == 1 else x, bias=bias, threads=threads, act="int8", isa=isa,
                              layout=layout) for layout in ("rows8", "packing")]
            assert np.array_equal(y[0], y[1]), (vid(v), rows + extra, batch, threads, isa)


# One 32-block of each type whose largest-magnitude code fills every element: the bytes before the
# codes (a unit scale; mxfp4: E8M0 128, which gguf-py reads as values 0..12), the code byte, and the
# value it decodes to.
_EXTREME_BLOCKS = {"q4_0": (np.float16(1).tobytes(), 0x00, -8),
                   "q5_0": (np.float16(1).tobytes() + b"\0" * 4, 0x00, -16),
                   "q8_0": (np.float16(1).tobytes(), 0x81, -127), "iq4_nl": (np.float16(1).tobytes(), 0x00, -127),
                   "mxfp4": (bytes([128]), 0x77, 12)}


@pytest.mark.skipif(not ROWS8_ISAS, reason="the rows8 kernels are AVX2, AVX-VNNI and AVX-512 VNNI")
@pytest.mark.parametrize("isa", ROWS8_ISAS)
@pytest.mark.parametrize("kind", sorted(_EXTREME_BLOCKS))
def test_rows8_int16_sums_hold_at_the_largest_codes(kind, isa):
    """Where a rows8 kernel sums products in int16 before widening (the
    4-bit codes, q5_0 every 8 products, mxfp4's |value| <= 12: 16 products
    per 16-bit lane), the largest codes times activations all at 127 (and
    -127) are the worst case; one more product per lane, or a type whose
    values reach 127, would wrap it. VNNI has no int16 step; there these
    blocks check the offset of 128 that its signed values are read with, at
    their extreme. Each sum must be the exact product."""
    head, code, value = _EXTREME_BLOCKS[kind]
    rows, cols = 16, 256
    blocks = cols // 32
    nbytes = native.expected_nbytes(kind, rows, cols)
    block = np.frombuffer(head + bytes([code]) * (nbytes // (rows * blocks) - len(head)), np.uint8)
    raw = np.tile(block, rows * blocks)
    wd = gguf.quants.dequantize(raw.reshape(rows, -1), GGML[kind]).astype(np.float64)
    assert np.all(wd == value)
    x = np.stack([np.full(cols, 1.0), np.full(cols, -1.0), np.where(np.arange(cols) % 2, 1.0, -1.0)]).astype(np.float32)
    y = native.gemv(raw, kind, rows, cols, x, act="int8", isa=isa, layout="rows8").reshape(3, rows)
    d = np.float32(1) / np.float32(127)
    ref = (x.astype(np.float64) * 127 * np.float64(d)) @ wd.T  # the quantized activations, exactly
    assert np.all(np.abs(y - ref) <= 1e-5 * np.abs(ref).max()), kind


def _mxfp4_at_every_exponent(rows, cols, rng):
    """mxfp4 rows whose E8M0 scales run from the subnormal floats (e = 0, 1)
    to 2^32 (e = 160: larger would overflow the sums' floats in the
    reference too), the first three rows' all subnormal or the smallest
    normal; and their float64 values."""
    blocks = cols // 32
    e = np.array([0, 1, 2, 3, 100, 127, 128, 129, 160], np.uint8)
    raw = np.concatenate([e[rng.integers(0, len(e), (rows * blocks, 1))],
                          rng.integers(0, 256, (rows * blocks, 16), dtype=np.uint8)], axis=1)
    raw[: 3 * blocks, 0] = rng.integers(0, 3, 3 * blocks)
    raw = raw.ravel()
    return raw, gguf.quants.dequantize(raw.reshape(rows, -1), GGML["mxfp4"]).astype(np.float64)


def _mxfp4_within_bound(raw, wd, x, isa, **layout):
    """native.gemv of those rows (float64 values wd) and x with int8
    activations, checked against the float64 product of x as the int8
    kernels read it (quantized per 32), within 1e-5 of its magnitude."""
    (rows, cols), batch = wd.shape, x.shape[0]
    q, d = quantize_q8_ref(x)
    xq = q.astype(np.float64) * np.repeat(d.reshape(batch, -1).astype(np.float64), 32, axis=1)
    y = native.gemv(raw, "mxfp4", rows, cols, x[0] if batch == 1 else x, act="int8", isa=isa,
                    **layout).reshape(batch, rows)
    assert np.all(np.abs(y - xq @ wd.T) <= 1e-5 * (np.abs(xq) @ np.abs(wd).T) + 1e-300), (isa, batch, layout)
    return y


@pytest.mark.skipif(not ROWS8_ISAS, reason="the rows8 kernels are AVX2, AVX-VNNI and AVX-512 VNNI")
def test_rows8_mxfp4_scales_at_every_exponent():
    """mxfp4's E8M0 scales, 2^(e - 128) with its values doubled, at every
    kind of exponent: each ISA's rows8 kernel, one token and prefill chunks
    (the AVX-512 and AMX ones turn the bytes into floats their own way),
    within the reference's bound and bit for bit the same across the ISAs."""
    rows, cols = 24, 256
    rng = np.random.default_rng(17)
    raw, wd = _mxfp4_at_every_exponent(rows, cols, rng)
    for batch in (1, 13, 64):
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        ys = [_mxfp4_within_bound(raw, wd, x, isa, layout="rows8") for isa in ROWS8_ISAS]
        assert all(np.array_equal(ys[0], y) for y in ys[1:]), batch


@pytest.mark.parametrize("isa", ISAS)
def test_stored_mxfp4_scales_at_every_exponent(isa):
    """The same scales through each ISA's stored-layout kernel (a decoder's
    experts at one to eight tokens; AVX-512's makes 2^(e - 127) from the
    exponent byte and halves it with the activation's scale, e = 0 its one
    subnormal case): 11 blocks a row, so four-block steps and a three-block
    tail, 4-row steps and single rows."""
    rows, cols = 23, 352
    rng = np.random.default_rng(19)
    raw, wd = _mxfp4_at_every_exponent(rows, cols, rng)
    for batch in (1, 3, 8):
        _mxfp4_within_bound(raw, wd, rng.standard_normal((batch, cols)).astype(np.float32), isa, threads=2)


# Super-block types whose sums meet their sub-scales: (the sub-scale bytes, what they are set to,
# the f16 fields set to 1.0). Each byte pattern gives every sub-scale its largest magnitude:
# q4_k, q5_k 63 (mins 63), q6_k -128 or 127 at random, q3_k and iq4_xs -32, q2_k 15.
_EXTREME_SUB_SCALES = {"q4_k": (slice(4, 16), 0xFF, (0, 2)), "q5_k": (slice(4, 16), 0xFF, (0, 2)),
                       "q6_k": (slice(192, 208), None, (208,)), "q3_k": (slice(96, 108), 0x00, (108,)),
                       "iq4_xs": (slice(2, 8), 0x00, (0,)), "q2_k": (slice(0, 16), 0xFF, (80, 82))}


@pytest.mark.skipif(not ROWS8_ISAS, reason="the rows8 kernels are AVX2, AVX-VNNI and AVX-512 VNNI")
@pytest.mark.parametrize("kind", sorted(_EXTREME_SUB_SCALES))
def test_rows8_sub_scales_at_their_extremes(kind):
    """The AMX kernels multiply a sub-block's integer sum by its sub-scale
    as floats (and add q6_k's two halves by an fma) where the other ISAs
    multiply integers: the same float only while |sum x sub-scale| < 2^24.
    Every sub-scale at its largest magnitude, codes at both ends (rows of
    all-zero and all-one code bytes) and at random, activations all +-127:
    the products at their bound, within the float64 reference's and bit for
    bit the same on every ISA, one token and prefill chunks of 16-token passes."""
    scale_bytes, fill, f16_at = _EXTREME_SUB_SCALES[kind]
    elems, nbytes, _ = RANDOM_BLOCKS[kind]
    rows, cols = 40, 512
    rng = np.random.default_rng(23)
    blocks = rng.integers(0, 256, (rows, cols // elems, nbytes), dtype=np.uint8)
    blocks[:8] = 0x00
    blocks[8:16] = 0xFF
    blocks[:, :, scale_bytes] = (rng.choice(np.array([0x80, 0x7F], np.uint8), blocks[:, :, scale_bytes].shape)
                                 if fill is None else fill)
    for at in f16_at:
        blocks[:, :, at:at + 2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    raw = blocks.ravel()
    wd = gguf.quants.dequantize(raw.reshape(rows, -1), GGML[kind]).astype(np.float64)
    for batch in (1, 32, 53):
        x = np.where(rng.random((batch, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
        x[0] = 1.0
        q, d = quantize_q8_ref(x, act_block(kind))
        assert np.all(np.abs(q) == 127)
        xq = q.astype(np.float64) * np.repeat(d.reshape(batch, -1).astype(np.float64), 32, axis=1)
        ref = xq @ wd.T
        ys = []
        for isa in ROWS8_ISAS:
            y = native.gemv(raw, kind, rows, cols, x[0] if batch == 1 else x, act="int8", isa=isa,
                            layout="rows8").reshape(batch, rows)
            assert np.all(np.abs(y - ref) <= 1e-5 * (np.abs(xq) @ np.abs(wd).T) + 1e-300), (isa, batch)
            ys.append(y)
        assert all(np.array_equal(ys[0], y) for y in ys[1:]), batch


@pytest.mark.parametrize("call, match", [
    (lambda: native.gemv(np.zeros(64 * 4, np.uint8).view(np.uint8), "f32", 8, 8, np.zeros(8, np.float32),
                         layout="rows8"), "layout 'rows8' is read by"),
    (lambda: native.gemv(np.zeros(8 * 18, np.uint8), "q4_0", 8, 32, np.zeros(32, np.float32), layout="rows8"),
     "not q4_0 with act='f32'"),
    (lambda: native.gemv(np.zeros(8 * 256 * 2, np.uint8), "bf16", 8, 256, np.zeros(256, np.float32), act="int8",
                         layout="rows8"), "q5_1, mxfp4, q3_k, q2_k, iq3_s, iq4_xsh, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m, q1_0 matrices .*, not bf16 with act='int8'"),
    (lambda: native.gemv(np.zeros(8 * 18, np.uint8), "q4_0", 8, 32, np.zeros(32, np.float32), act="int8",
                         layout="rows4"), "layout must be 'stored', 'rows8' or 'packing'"),
    (lambda: native.gemv(np.zeros(8 * 18, np.uint8), "q4_0", 8, 32, np.zeros(32, np.float32), layout="packing"),
     "layout 'packing' is read by .* not q4_0 with act='f32'"),
])
def test_rows8_layout_refused_where_it_is_not_read(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("block", (32, 256))
@pytest.mark.parametrize("isa", ISAS)
def test_int8_activation_quantizer_matches_reference(isa, block):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(32 * 64).astype(np.float32) * 10.0 ** rng.uniform(-3, 3, 32 * 64).astype(np.float32)
    x[:256] = 0  # d = 0
    x[256:288] = np.linspace(-127, 127, 32, dtype=np.float32) / 2  # exact .5 ties
    x[288:320] = rng.choice([-2.5, 2.5, 0.5, -0.5, 1.5], 32).astype(np.float32)
    x[320] = 127 * 2.0  # max of its block
    q, d = native.quantize_act_q8(x, isa=isa, block=block)
    qr, dr = quantize_q8_ref(x, block)
    assert np.array_equal(d.view(np.uint32), dr.view(np.uint32))
    assert np.array_equal(q, qr)
    if block == 256:  # one scale per 256 elements, its largest magnitude's
        assert len(set(d[8:16].tolist())) == 1 and d[8] == np.abs(x[256:512]).max() / np.float32(127)


@pytest.mark.parametrize("isa", ISAS)
def test_int8_activation_quantizer_never_launders_nonfinite_values(isa):
    """A block holding NaN or +-inf gets a NaN scale and zero codes (every product with it is
    NaN); the other blocks are quantized as usual."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal(32 * 4).astype(np.float32)
    x[3], x[40], x[100] = np.nan, np.inf, -np.inf
    q, d = native.quantize_act_q8(x, isa=isa)
    assert np.isnan(d[[0, 1, 3]]).all() and not (q[:64] != 0).any() and not (q[96:] != 0).any()
    qr, dr = quantize_q8_ref(x[64:96])
    assert d[2] == dr[0] and np.array_equal(q[64:96], qr)
    x256 = np.concatenate([x, np.ones(128, np.float32)])  # one scale per 256: the NaN reaches the whole block
    q, d = native.quantize_act_q8(x256, isa=isa, block=256)
    assert np.isnan(d).all() and not q.any()
    w = np.full(4 * 18, 0x11, np.uint8).reshape(4, 18)
    w[:, :2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    y = native.gemv(w.reshape(-1), "q4_0", 1, 128, x, act="int8", isa=isa)
    assert np.isnan(y).all()


@pytest.mark.parametrize("isa", ISAS)
def test_isas_agree_on_exact_inputs(isa):
    """Small-integer weights and activations make every float32 sum exact: all ISAs must then
    return exactly the integer product."""
    rng = np.random.default_rng(3)
    rows, cols, gs = 11, 160, 32
    codes = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    scales = np.ones((rows, cols // gs), np.float16)
    raw = pack_int4w(codes, scales, None, "f16")
    x = rng.integers(-8, 9, (4, cols)).astype(np.float32)
    y = native.gemv(raw, "int4w", rows, cols, x, group_size=gs, isa=isa, threads=2)
    assert np.array_equal(y, x @ (codes.astype(np.float32) - 8).T)


def test_weights_from_memmap_slice_without_copy(tmp_path):
    rng = np.random.default_rng(5)
    raw, wd, entry = make_weights("int4w", 33, 256, rng, 64, False, "f16")
    path = tmp_path / "model.ie.bin"
    pad = 4096 + 3  # an unaligned offset inside the file
    path.write_bytes(b"\0" * pad + raw.tobytes() + b"\0" * 17)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    view = mm[pad : pad + raw.size]
    x = rng.standard_normal(256).astype(np.float32)
    y = kernels.gemv(view, entry, x, threads=2)
    ref = wd.astype(np.float64) @ x
    assert np.all(np.abs(y - ref) <= 1e-5 * (np.abs(wd) @ np.abs(x)))
    assert np.array_equal(kernels.dequantize(view, entry), wd)
    # bytes and memoryview work too; a strided view is refused instead of copied
    assert np.array_equal(kernels.gemv(raw.tobytes(), entry, x), y)
    with pytest.raises(ValueError, match="contiguous"):
        native.gemv(np.repeat(raw, 2)[::2], "int4w", 33, 256, x, group_size=64, symmetric=False)


def test_group_sizes_beyond_the_fixed_set():
    """Any multiple of 32 that divides cols (e.g. 96, 256) runs, on every ISA."""
    for gs, cols in ((96, 192), (256, 512), (160, 320)):
        rng = np.random.default_rng(gs)
        raw, wd, entry = make_weights("int4w", 7, cols, rng, gs, gs != 96, "f16")
        x = rng.standard_normal(cols).astype(np.float32)
        for isa in ISAS:
            for act in ("f32", "int8"):
                y = kernels.gemv(raw, entry, x, act=act, isa=isa)
                tol = 1e-5 if act == "f32" else 2e-2
                assert np.all(np.abs(y - wd.astype(np.float64) @ x) <= tol * (np.abs(wd) @ np.abs(x))), (gs, isa, act)


# ----------------------------------------------------------------- errors

def _int4w(rows=4, cols=64, gs=32):
    rng = np.random.default_rng(0)
    raw, _, entry = make_weights("int4w", rows, cols, rng, gs, True, "f16")
    return raw, entry


@pytest.mark.parametrize("call, match", [
    (lambda: native.gemv(_int4w()[0][:-1], "int4w", 4, 64, np.ones(64, np.float32), group_size=32),
     r"int4w \[4, 64\] needs 144 bytes, got 143"),
    (lambda: native.gemv(np.zeros(64 * 96 // 2 + 64 * 2 * 2, np.uint8), "int4w", 64, 96, np.ones(96, np.float32),
                         group_size=64), "group_size 64 does not divide cols 96"),
    (lambda: native.gemv(np.zeros(18 * 4, np.uint8), "q4_0", 4, 100, np.ones(100, np.float32)),
     "cols must be a multiple of 32, got 100"),
    (lambda: native.gemv(_int4w()[0], "int4w", 4, 64, np.ones((9, 64), np.float32), group_size=32),
     "batch must be 1..8, got 9"),
    (lambda: native.gemv(np.zeros(8 * 18, np.uint8), "q4_0", 8, 32, np.ones((513, 32), np.float32), act="int8",
                         layout="rows8"), "batch must be 1..512, got 513"),
    (lambda: native.gemv(np.zeros(16, np.uint8), "q7_k", 1, 32, np.ones(32, np.float32)),
     "unknown weight dtype 'q7_k'"),
    (lambda: native.gemv(_int4w()[0], "int4w", 4, 64, np.ones(63, np.float32), group_size=32),
     "x must have 64 elements, got 63"),
    (lambda: native.gemv(np.zeros(4 * 64 * 2, np.uint8), "f16", 4, 64, np.ones(64, np.float32), act="int8"),
     "act='int8' applies to int4w, q4_0, q4_1, q8_0, q4_k, iq4_nl, iq4_xs, q5_k, q6_k, q5_0, q5_1, mxfp4, q3_k, q2_k, iq3_s, iq4_xsh, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m, nvfp4 and q1_0"),
    (lambda: native.gemv(_int4w()[0], "int4w", 4, 64, np.ones(64, np.float32), group_size=32, bias=np.ones(3)),
     "bias must be 1-D with 4 elements"),
    (lambda: native.gemv(_int4w()[0], "int4w", 4, 64, np.ones(64, np.float32)), "int4w needs group_size"),
    (lambda: native.dequantize(np.zeros(10, np.uint8), "q8_0", 1, 32), r"q8_0 \[1, 32\] needs 34 bytes, got 10"),
    (lambda: native.gemv(np.zeros(4 * 4, np.float32), "f32", 4, 4, np.ones(4, np.float32)), "1-D uint8"),
])
def test_bad_arguments_raise_valueerror(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_wrapper_errors_are_ieerror():
    raw, entry = _int4w()
    with pytest.raises(IEError, match="needs 144 bytes, got 140"):
        kernels.gemv(raw[:140], entry, np.ones(64, np.float32))
    with pytest.raises(IEError, match="planar-v1 only"):
        kernels.gemv(raw, {**entry, "quant": {**entry["quant"], "layout": "tiled"}}, np.ones(64, np.float32))
    with pytest.raises(IEError, match="has no GEMV kernel"):
        kernels.gemv(raw, {**entry, "dtype": "i8"}, np.ones(64, np.float32))
    with pytest.raises(IEError, match="2-D"):
        kernels.dequantize(raw, {**entry, "shape": [4, 8, 8]})


# ----------------------------------------------------------------- benchmark

def test_bench_gemv_reports_timings():
    r = native.bench_gemv("int4w", 64, 256, group_size=64, threads=2, min_bytes=1 << 20, iters=3)
    assert r["weight_bytes"] == native.expected_nbytes("int4w", 64, 256, 64)
    assert r["copies"] * r["weight_bytes"] > 1 << 20
    assert 0 < r["ms_min"] <= r["ms_median"] and r["gbps"] > 0 and len(r["times_ms"]) == 3
    assert np.isfinite(r["checksum"])


def test_ierun_microbench_json():
    from conftest import run_tool

    res = run_tool("ierun", "microbench", "--kernel", "int4w", "--rows", "64", "--cols", "256", "--threads", "2",
                   "--group-size", "32", "--affine", "--act", "int8", "--iters", "3", "--min-mib", "1", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    for key in ("kernel", "rows", "cols", "threads", "ms", "gbps", "read_bw_gbps", "fraction", "act", "group_size",
                "isa", "batch"):
        assert key in r, key
    assert r["kernel"] == "int4w" and r["group_size"] == 32 and r["act"] == "int8" and r["symmetric"] is False
    assert r["read_bw_bytes"] >= 256 << 20 and r["fraction"] > 0


@pytest.mark.skipif("avx2" not in ISAS, reason="the rows8 kernel is AVX2")
def test_ierun_microbench_times_a_prefill_chunk_on_rows8_and_refuses_more():
    """--layout rows8 and packing time up to the decoder's largest int8
    prefill chunk (MAX_ROWS8_BATCH rows, a model with experts); the stored
    layout stops at MAX_BATCH; past either, one usage line."""
    from conftest import run_tool

    base = ["ierun", "microbench", "--kernel", "q4_0", "--rows", "64", "--cols", "256", "--threads", "1",
            "--act", "int8", "--iters", "2", "--min-mib", "1", "--json"]
    res = run_tool(*base, "--layout", "rows8", "--batch", str(native.MAX_ROWS8_BATCH))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["batch"] == native.MAX_ROWS8_BATCH == 512
    for layout, top in (("rows8", native.MAX_ROWS8_BATCH), ("packing", native.MAX_ROWS8_BATCH),
                        ("stored", native.MAX_BATCH)):
        res = run_tool(*base, "--layout", layout, "--batch", str(top + 1))
        assert res.returncode == 2 and f"--batch must be 1..{top} with --layout {layout}, got {top + 1}" in res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.parametrize("kernel,args,needle", [
    ("f16", ["--affine"], "--affine does not apply to --kernel f16 (only int4w)"),
    ("q4_0", ["--group-size", "32"], "--group-size does not apply to --kernel q4_0 (only int4w)"),
    ("bf16", ["--act", "int8"], "--act does not apply to --kernel bf16"),
    ("bsr", ["--batch", "4"], "--batch does not apply to --kernel bsr"),
    ("int4w", ["--seed", "3"], "--seed does not apply to --kernel int4w"),
    ("dedup", ["--min-mib", "8"], "--min-mib does not apply to --kernel dedup"),
])
def test_ierun_microbench_refuses_options_its_kernel_does_not_read(kernel, args, needle):
    from conftest import run_tool

    res = run_tool("ierun", "microbench", "--kernel", kernel, *args)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
