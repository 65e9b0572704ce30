// Decoding of stored weight bytes (docs/formats/quant.md): every weight
// type's layout and arithmetic, once. The CPU's dequantizer and scalar
// reference (csrc/gemv) and the CUDA kernels (csrc/cuda, built with
// -fmad=false as the CPU side is with -ffp-contract=off) call these same
// functions, so the device computes the CPU's float32 values bit for bit
// and the CPU tests check the code the GPU runs. Byte-addressed loads only
// (half.h): block formats put their fields at any offset.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/half.h"
#include "common/hd.h"
#include "common/codebooks.h"
#include "common/weight_types.h"

namespace ie {
// Internal linkage on purpose (as gemv/kernels.h explains): files built
// with different ISA flags include this.
namespace {

// q4_k: sub-block j (0..7) of a 144-byte super-block (d, dmin: f16; 12
// bytes of 6-bit sub-scales and sub-mins; 128 bytes of codes) decodes as
// w = scale * q - min, both the f32 products d * sc_j and dmin * m_j that
// ggml's dequantize_row_q4_K forms. Its codes are the low nibbles (j even)
// or high nibbles (j odd) of code bytes 32 * (j / 2) .. 32 * (j / 2) + 31.
constexpr int kQ4kBytes = wtype_info(WType::Q4_K).block_bytes;
constexpr int kQ4kCodes = wtype_info(WType::Q4_K).code_offset;

struct Q4kSub {
  float scale, min;
};

IE_HD Q4kSub q4k_sub(const uint8_t* blk, int j) {
  const uint8_t* sc = blk + 4;
  int ls, lm;
  if (j < 4) {
    ls = sc[j] & 63;
    lm = sc[j + 4] & 63;
  } else {
    ls = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
    lm = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
  return {f16_to_f32(load_u16(blk)) * static_cast<float>(ls), f16_to_f32(load_u16(blk + 2)) * static_cast<float>(lm)};
}

// The nibble of element e (0..31) of sub-block j, for 128 code bytes at `at`.
IE_HD int kq_nibble(const uint8_t* blk, int at, int j, int e) { return (blk[at + 32 * (j / 2) + e] >> (4 * (j % 2))) & 0xF; }

// Code e of sub-block j.
IE_HD int q4k_code(const uint8_t* blk, int j, int e) { return kq_nibble(blk, kQ4kCodes, j, e); }

// q5_k: q4_k's super-block (the same d, dmin and 12 scale bytes, so q4k_sub
// gives its sub-blocks' scale and min) with 5-bit codes: the low nibbles as
// q4_k stores them but at 48, the fifth bits in the 32 bytes at 16 (bit j of
// byte e: element e of sub-block j).
constexpr int kQ5kBytes = wtype_info(WType::Q5_K).block_bytes;
constexpr int kQ5kCodes = wtype_info(WType::Q5_K).code_offset;
constexpr int kQ5kHigh = 16;

IE_HD int q5k_code(const uint8_t* blk, int j, int e) {
  return kq_nibble(blk, kQ5kCodes, j, e) | (((blk[kQ5kHigh + e] >> j) & 1) << 4);
}

// q5_0 / q5_1: 32-element blocks whose codes (0..31) keep their fifth bits
// in a little-endian u32 at `at` (bit e: element e) and their low nibbles
// in the 16 bytes after it, in q4_0's order (byte e: elements e and e + 16).
IE_HD int q5_code(const uint8_t* blk, int at, int e) {
  const uint32_t qh = load_u32(blk + at);
  return ((blk[at + 4 + e % 16] >> (4 * (e / 16))) & 0xF) | static_cast<int>(((qh >> e) & 1u) << 4);
}

// q6_k: 256-element super-blocks of sixteen 16-element sub-blocks, w =
// (d * sc_j) * (q - 32): 6-bit codes q, int8 sub-scales sc_j at 192, f16 d
// at 208. Element i = 128 h + 32 k + l (half h, quarter k) has its low
// nibble in byte 64 h + 32 (k % 2) + l (high nibble for k >= 2) and its high
// two bits at bit 2 k of byte 128 + 32 h + l.
constexpr int kQ6kHigh = 128, kQ6kScales = 192, kQ6kD = 208;

IE_HD float q6k_scale(const uint8_t* blk, int j) {
  return f16_to_f32(load_u16(blk + kQ6kD)) * static_cast<float>(static_cast<int8_t>(blk[kQ6kScales + j]));
}

// The bit pair of element i (0..255) in ggml's 64-byte layout at `at`
// (q2_k's codes, q3_k's low code bits, q6_k's high ones): byte 32 h + l of
// half h holds elements 128 h + l, + 32, + 64, + 96 at bits 0, 2, 4, 6.
IE_HD int kq_pair(const uint8_t* blk, int at, int i) {
  return (blk[at + 32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3;
}

IE_HD int q6k_code(const uint8_t* blk, int i) {
  const int h = i / 128, k = i % 128 / 32, l = i % 32;
  const int lo = (blk[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
  return lo | (kq_pair(blk, kQ6kHigh, i) << 4);
}

// q3_k: 256-element super-blocks of sixteen 16-element sub-blocks, w =
// (d * (l_j - 32)) * (q - 4): 3-bit codes q, 6-bit sub-scales l_j in the 12
// bytes at 96 (low nibble: byte j % 8, high nibble for j >= 8; high bit
// pair: bits 2 (j / 4) of byte 104 + j % 4), f16 d at 108. Element i = 128 h
// + 32 k + l (half h, quarter k) has its low bit pair at bits 2 k of byte
// 32 + 32 h + l and its high bit at bit i / 32 of byte i % 32.
constexpr int kQ3kLow = 32, kQ3kScales = 96, kQ3kD = 108;

IE_HD int q3k_sub_scale(const uint8_t* blk, int j) {
  const int low = (blk[kQ3kScales + j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (blk[kQ3kScales + 8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | high << 4) - 32;
}

IE_HD float q3k_scale(const uint8_t* blk, int j) {
  return f16_to_f32(load_u16(blk + kQ3kD)) * static_cast<float>(q3k_sub_scale(blk, j));
}

IE_HD int q3k_code(const uint8_t* blk, int i) {
  return kq_pair(blk, kQ3kLow, i) | (((blk[i % 32] >> (i / 32)) & 1) << 2);
}

// q2_k: 256-element super-blocks of sixteen 16-element sub-blocks, w =
// (d * sc_j) * q - (dmin * m_j): 2-bit codes q, byte j of the 16 at 0
// holding sc_j (low nibble) and m_j (high), f16 d at 80 and dmin at 82.
// Element i = 128 h + 32 k + l has its code at bits 2 k of byte 16 + 32 h + l.
constexpr int kQ2kCodes = wtype_info(WType::Q2_K).code_offset;
constexpr int kQ2kD = 80, kQ2kDmin = 82;

IE_HD Q4kSub q2k_sub(const uint8_t* blk, int j) {
  return {f16_to_f32(load_u16(blk + kQ2kD)) * static_cast<float>(blk[j] & 0xF),
          f16_to_f32(load_u16(blk + kQ2kDmin)) * static_cast<float>(blk[j] >> 4)};
}

IE_HD int q2k_code(const uint8_t* blk, int i) { return kq_pair(blk, kQ2kCodes, i); }

// iq3_s: 256-element super-blocks of eight 32-element sub-blocks; four
// weights share a 9-bit index into the codebook (codebooks.h), each weight
// its sign: w = d * (1 + 2 s_j) * (+-g). Sub-block j's tuple m has its low
// index byte at 2 + 8 j + m and its high bit at bit m of byte 66 + j;
// element e's sign is bit e % 8 of byte 74 + 4 j + e / 8; s_j is nibble j % 2
// of byte 106 + j / 2. The scale is the f32 product ggml forms.
constexpr int kIq3sQs = 2, kIq3sQh = 66, kIq3sSigns = 74, kIq3sScales = 106;

// Sub-block j's multiplier of d, 1 + 2 s_j (1..31).
IE_HD int iq3s_sub_scale(const uint8_t* blk, int j) { return 1 + 2 * ((blk[kIq3sScales + j / 2] >> (4 * (j % 2))) & 0xF); }

IE_HD float iq3s_scale(const uint8_t* blk, int j) {
  return f16_to_f32(load_u16(blk)) * static_cast<float>(iq3s_sub_scale(blk, j));
}

// The 32 signed values (-15..15, odd) of sub-block j, one codebook word per four.
IE_HD void iq3s_values(const uint8_t* blk, int j, int* out) {
  IE_UNROLL
  for (int m = 0; m < 8; ++m) {
    const uint32_t word = iq3s_grid()[blk[kIq3sQs + 8 * j + m] | (((blk[kIq3sQh + j] >> m) & 1) << 8)];
    const int signs = blk[kIq3sSigns + 4 * j + m / 2] >> (4 * (m % 2));
    for (int k = 0; k < 4; ++k) {
      const int g = static_cast<int>((word >> (8 * k)) & 0xFF);
      out[4 * m + k] = (signs >> k) & 1 ? -g : g;
    }
  }
}

// iq3_xxs: iq3_s's super-blocks with an 8-bit index into a 256-entry
// codebook of 4, 12, .., 52, 62 (codebooks.h) and no high bits: sub-block
// j's tuple m has its index at byte 2 + 8 j + m; the u32 at 66 + 4 j holds
// in bits 7 g .. 7 g + 6 the signs of its elements 8 g .. 8 g + 6 (the
// eighth's sign is their parity: an even number negative) and s_j in bits
// 28..31. w = d * (0.5 + s_j) * 0.5 * (+-g), the f32 product ggml forms.
constexpr int kIq3xxsQs = 2, kIq3xxsAux = 66;

IE_HD uint32_t iq3xxs_aux(const uint8_t* blk, int j) { return load_u32(blk + kIq3xxsAux + 4 * j); }

// q1_0 (ggml's block_q1_0): d (f16), then 128 sign bits; the u32 of 32-block
// j of the block at blk, bit e its element 32 j + e's (set: +d, clear: -d).
constexpr int kQ1Qs = wtype_info(WType::Q1_0).code_offset;
IE_HD uint32_t q1_signs(const uint8_t* blk, int j) { return load_u32(blk + kQ1Qs + 4 * j); }

// Sub-block j's multiplier of d / 4, 1 + 2 s_j (1..31).
IE_HD int iq3xxs_sub_scale(const uint8_t* blk, int j) { return 1 + 2 * static_cast<int>(iq3xxs_aux(blk, j) >> 28); }

IE_HD float iq3xxs_scale(const uint8_t* blk, int j) {
  return f16_to_f32(load_u16(blk)) * (0.5f + static_cast<float>(iq3xxs_aux(blk, j) >> 28)) * 0.5f;
}

// The 32 sign bits of a sub-block (bit e: element e negative) from its
// sign/scale word aux (iq3_xxs, iq2_xxs): each seven stored bits and their
// parity. constexpr: the AVX2 kernels' table of sign masks is built from it.
IE_HD constexpr uint32_t even_signs(uint32_t aux) {
  uint32_t out = 0;
  IE_UNROLL
  for (int g = 0; g < 4; ++g) {
    uint32_t s = (aux >> (7 * g)) & 0x7F, p = s;
    p ^= p >> 4;
    p ^= p >> 2;
    p ^= p >> 1;
    out |= (s | (p & 1) << 7) << (8 * g);
  }
  return out;
}

// Byte k of the result: `byte` where bit k of bits is set, else 0 (k < 8):
// the SIMD kernels' and the rows8 packer's tables of sign masks.
IE_HD constexpr uint64_t byte_mask(uint32_t bits, uint8_t byte) {
  uint64_t m = 0;
  for (int k = 0; k < 8; ++k)
    if ((bits >> k) & 1) m |= uint64_t{byte} << (8 * k);
  return m;
}

// The 32 signed values of a sub-block whose 32 / K codebook words (K
// magnitudes each) idx[0 .. 32 / K - 1] name (index bytes, or iq2_xs's and
// iq2_s's Iq2Index), negative where neg's bits are set.
template <int K, class Word, class Index>
IE_HD void codebook_values(const Word* grid, Index idx, uint32_t neg, int* out) {
  IE_UNROLL
  for (int m = 0; m < 32 / K; ++m) {
    const Word word = grid[idx[m]];
    for (int k = 0; k < K; ++k) {
      const int g = static_cast<int>((word >> (8 * k)) & 0xFF);
      out[K * m + k] = (neg >> (K * m + k)) & 1 ? -g : g;
    }
  }
}

// The 32 signed values (+-4 .. +-62) of sub-block j, one codebook word per four.
IE_HD void iq3xxs_values(const uint8_t* blk, int j, int* out) {
  codebook_values<4>(iq3xxs_grid(), blk + kIq3xxsQs + 8 * j, even_signs(iq3xxs_aux(blk, j)), out);
}

// iq2_xxs: iq3_xxs's signs and scales over a 256-entry codebook of
// eight-tuples of 8, 25, 43 (codebooks.h): sub-block j's eight bytes at
// 2 + 8 j are its four indices (tuple m: elements 8 m .. 8 m + 7), then its
// sign/scale word as iq3_xxs's. w = d * (0.5 + s_j) * 0.25 * (+-g), the f32
// product ggml forms.
constexpr int kIq2xxsQs = 2;

IE_HD uint32_t iq2xxs_aux(const uint8_t* blk, int j) { return load_u32(blk + kIq2xxsQs + 8 * j + 4); }

// Sub-block j's multiplier of d / 8, 1 + 2 s_j (1..31).
IE_HD int iq2xxs_sub_scale(const uint8_t* blk, int j) { return 1 + 2 * static_cast<int>(iq2xxs_aux(blk, j) >> 28); }

IE_HD float iq2xxs_scale(const uint8_t* blk, int j) {
  return f16_to_f32(load_u16(blk)) * (0.5f + static_cast<float>(iq2xxs_aux(blk, j) >> 28)) * 0.25f;
}

// The 32 signed values (+-8, +-25, +-43) of sub-block j, one codebook word per eight.
IE_HD void iq2xxs_values(const uint8_t* blk, int j, int* out) {
  codebook_values<8>(iq2xxs_grid(), blk + kIq2xxsQs + 8 * j, even_signs(iq2xxs_aux(blk, j)), out);
}

// iq2_xs and iq2_s: eight-tuples of 8, 25, 43 from codebooks of 512 and
// 1024 entries (codebooks.h) under a 4-bit scale per 16 weights, w = d *
// (0.5 + s_h) * 0.25 * (+-g), the f32 product ggml forms; s_h is nibble h % 2
// of byte kScales + h / 2 (elements 16 h .. 16 h + 15). iq2_xs: per eight
// weights g a u16 at 2 + 2 g, bits 0..8 its index, bits 9..15 the signs of
// its first seven (the eighth's their parity, even_signs). iq2_s: index low
// bytes at 2 + g, sign bytes at 34 + g, the high index bits at bits
// 2 (g % 4) .. + 1 of byte 66 + g / 4.
constexpr int kIq2xsQs = 2, kIq2xsScales = 66;
constexpr int kIq2sQs = 2, kIq2sSigns = 34, kIq2sQh = 66, kIq2sScales = 74;

// Half-sub-block h's s_h (0..15) of type t (iq2_xs or iq2_s), its multiplier
// of d / 8 (1 + 2 s_h: the rows8 copy's sub-scale) and its scale.
IE_HD int iq2h_s(WType t, const uint8_t* blk, int h) {
  return (blk[(t == WType::IQ2_XS ? kIq2xsScales : kIq2sScales) + h / 2] >> (4 * (h % 2))) & 0xF;
}
IE_HD int iq2h_sub_scale(WType t, const uint8_t* blk, int h) { return 1 + 2 * iq2h_s(t, blk, h); }
IE_HD float iq2h_scale(WType t, const uint8_t* blk, int h) {
  return f16_to_f32(load_u16(blk)) * (0.5f + static_cast<float>(iq2h_s(t, blk, h))) * 0.25f;
}

// iq2_xs's sign bits of 32-block j (bit e: element e negative), in even_signs' form.
IE_HD uint32_t iq2xs_aux(const uint8_t* blk, int j) {
  uint32_t aux = 0;
  IE_UNROLL
  for (int m = 0; m < 4; ++m) aux |= static_cast<uint32_t>(load_u16(blk + kIq2xsQs + 8 * j + 2 * m) >> 9) << (7 * m);
  return aux;
}

// The codebook index of the eight weights m of 32-block j (codebook_values' idx[m]).
struct Iq2Index {
  const uint8_t* blk;
  int j;
  bool xs;  // iq2_xs (else iq2_s)
  IE_HD int operator[](int m) const {
    const int g = 4 * j + m;
    return xs ? load_u16(blk + kIq2xsQs + 2 * g) & 511 : blk[kIq2sQs + g] | (((blk[kIq2sQh + g / 4] >> (2 * (g % 4))) & 3) << 8);
  }
};

// The two types with 16-element sub-scales: 32-block j's 32 signed values
// into v and the scales of its halves into sc[0], sc[1].
IE_HD void iq2h_sub(WType t, const uint8_t* blk, int j, int* v, float* sc) {
  const bool xs = t == WType::IQ2_XS;
  codebook_values<8>(xs ? iq2xs_grid() : iq2s_grid(), Iq2Index{blk, j, xs},
                     xs ? even_signs(iq2xs_aux(blk, j)) : load_u32(blk + kIq2sSigns + 4 * j), v);
  sc[0] = iq2h_scale(t, blk, 2 * j);
  sc[1] = iq2h_scale(t, blk, 2 * j + 1);
}

// iq1_s and iq1_m: eight-tuples of -1, 0, 1 from a 2048-entry codebook
// (codebooks.h iq1s_grid: int8 bytes) shifted by +-1/8, w = d * (1 + 2 s)
// * (g +- 1/8), the f32 product ggml forms. Held as the integers 8 g +- 1
// (-9, -7, -1, 1, 7, 9) under d / 8 * (1 + 2 s), the same exact products.
// iq1_s: d at 0, index low bytes at 2 + g (eight weights g), per 32-block j
// a u16 at 34 + 2 j: bits 3 m .. 3 m + 2 the high index bits of its eight
// weights m, bits 12..14 s_j, bit 15 its shift's sign (set: -1/8). iq1_m:
// index low bytes at g, nibble g % 2 of byte 32 + g / 2 the high bits (0..2)
// and shift sign (3) of eight weights g, four u16 at 48 + 2 k whose bits
// 3 m .. 3 m + 2 are s of the sixteen weights h = 4 k + m and whose bits
// 12..15 are bits 4 k .. 4 k + 3 of d (f16).
constexpr int kIq1sQs = 2, kIq1sQh = 34;
constexpr int kIq1mQs = 0, kIq1mQh = 32, kIq1mScales = 48;

// d's f16 bits.
IE_HD uint16_t iq1_d_bits(WType t, const uint8_t* blk) {
  if (t == WType::IQ1_S) return load_u16(blk);
  uint16_t d = 0;
  IE_UNROLL
  for (int k = 0; k < 4; ++k) d = static_cast<uint16_t>(d | (load_u16(blk + kIq1mScales + 2 * k) >> 12) << (4 * k));
  return d;
}

// Half-sub-block h's s (0..7): iq1_s's is its 32-block's; its multiplier of d / 8 is 1 + 2 s.
IE_HD int iq1h_s(WType t, const uint8_t* blk, int h) {
  return t == WType::IQ1_S ? (load_u16(blk + kIq1sQh + 2 * (h / 2)) >> 12) & 7
                           : (load_u16(blk + kIq1mScales + 2 * (h / 4)) >> (3 * (h % 4))) & 7;
}
IE_HD int iq1h_sub_scale(WType t, const uint8_t* blk, int h) { return 1 + 2 * iq1h_s(t, blk, h); }

// The codebook index of eight weights g (0..31) and whether their shift is -1/8.
IE_HD int iq1_index(WType t, const uint8_t* blk, int g) {
  return t == WType::IQ1_S ? blk[kIq1sQs + g] | ((load_u16(blk + kIq1sQh + 2 * (g / 4)) >> (3 * (g % 4))) & 7) << 8
                           : blk[kIq1mQs + g] | ((blk[kIq1mQh + g / 2] >> (4 * (g % 2))) & 7) << 8;
}
IE_HD bool iq1_neg(WType t, const uint8_t* blk, int g) {
  return t == WType::IQ1_S ? load_u16(blk + kIq1sQh + 2 * (g / 4)) >> 15 : (blk[kIq1mQh + g / 2] >> (4 * (g % 2) + 3)) & 1;
}

// 32-block j's values 8 g +- 1 into v and the scales d / 8 * (1 + 2 s) of its halves into sc[0], sc[1].
IE_HD void iq1_sub(WType t, const uint8_t* blk, int j, int* v, float* sc) {
  IE_UNROLL
  for (int m = 0; m < 4; ++m) {
    const uint64_t word = iq1s_grid()[iq1_index(t, blk, 4 * j + m)];
    const int shift = iq1_neg(t, blk, 4 * j + m) ? -1 : 1;
    for (int k = 0; k < 8; ++k) v[8 * m + k] = 8 * static_cast<int8_t>((word >> (8 * k)) & 0xFF) + shift;
  }
  const float d8 = f16_to_f32(iq1_d_bits(t, blk)) * 0.125f;
  sc[0] = d8 * static_cast<float>(iq1h_sub_scale(t, blk, 2 * j));
  sc[1] = d8 * static_cast<float>(iq1h_sub_scale(t, blk, 2 * j + 1));
}

// half_scaled_book's types: 32-block j's signed values into v, its halves' scales into sc;
// d's f16 bits, and half-sub-block h's multiplier 1 + 2 s of d / 8 (what the rows8 header holds).
IE_HD void half_sub(WType t, const uint8_t* blk, int j, int* v, float* sc) {
  if (iq1_values(t)) iq1_sub(t, blk, j, v, sc);
  else iq2h_sub(t, blk, j, v, sc);
}
IE_HD uint16_t half_d_bits(WType t, const uint8_t* blk) { return iq1_values(t) ? iq1_d_bits(t, blk) : load_u16(blk); }
IE_HD int half_sub_scale(WType t, const uint8_t* blk, int h) {
  return iq1_values(t) ? iq1h_sub_scale(t, blk, h) : iq2h_sub_scale(t, blk, h);
}

// The codebook types (iq3_s, iq3_xxs, iq2_xxs): sub-block j's scale, its 32
// signed values into v; its multiplier 1 + 2 s_j of d (iq3_xxs: of d / 4,
// iq2_xxs: of d / 8).
IE_HD float codebook_sub(WType t, const uint8_t* blk, int j, int* v) {
  if (t == WType::IQ3_S) {
    iq3s_values(blk, j, v);
    return iq3s_scale(blk, j);
  }
  if (t == WType::IQ3_XXS) {
    iq3xxs_values(blk, j, v);
    return iq3xxs_scale(blk, j);
  }
  iq2xxs_values(blk, j, v);
  return iq2xxs_scale(blk, j);
}
IE_HD int codebook_sub_scale(WType t, const uint8_t* blk, int j) {
  return t == WType::IQ3_S ? iq3s_sub_scale(blk, j) : t == WType::IQ3_XXS ? iq3xxs_sub_scale(blk, j)
                                                                          : iq2xxs_sub_scale(blk, j);
}

// iq3_xxs's and iq2_xxs's magnitudes by level l (0..7; 0..2), and the rows8
// copy's nibble of a signed value v (grid_value's inverse): iq3_s's odd
// -15..15 as (v + 15) / 2; the XXS types' levels 0..7 of the negative values
// (largest first) as 0..7, of the positive ones as 8..15 (iq2_xxs: only
// 5..10 used, the rest 0).
IE_HD constexpr int iq3xxs_level_value(int l) { return l == 7 ? 62 : 4 + 8 * l; }
IE_HD constexpr int iq2xxs_level_value(int l) { return l == 0 ? 8 : l == 1 ? 25 : l == 2 ? 43 : 0; }
IE_HD constexpr int iq3xxs_level(int a) { return a == 62 ? 7 : (a - 4) / 8; }
IE_HD constexpr int iq2xxs_level(int a) { return a == 8 ? 0 : a == 25 ? 1 : 2; }
IE_HD constexpr bool iq2_values(WType t) { return t == WType::IQ2_XXS || t == WType::IQ2_XS || t == WType::IQ2_S; }
// iq1's |8 g +- 1| by level (0..2: 1, 7, 9), and back.
IE_HD constexpr int iq1_level_value(int l) { return l == 0 ? 1 : l == 1 ? 7 : l == 2 ? 9 : 0; }
IE_HD constexpr int iq1_level(int a) { return a == 1 ? 0 : a == 7 ? 1 : 2; }
IE_HD constexpr int codebook_nibble(WType t, int v) {
  if (t == WType::IQ3_S) return (v + 15) / 2;
  const int a = v < 0 ? -v : v;
  const int l = iq1_values(t) ? iq1_level(a) : iq2_values(t) ? iq2xxs_level(a) : iq3xxs_level(a);
  return v > 0 ? 8 + l : 7 - l;
}

// iq4_nl / iq4_xs: each code indexes ggml's non-linear grid kvalues_iq4nl;
// a 32-element (sub-)block is w = scale * iq4_value(q), its codes the low
// nibbles (elements 0..15) and high nibbles (16..31) of 16 bytes. iq4_xs
// super-blocks (d: f16, scales_h: u16, scales_l: 4 bytes, 128 code bytes)
// give sub-block j the scale d * (l_j - 32), the f32 product ggml forms.
// The 16-entry tables are two u64 words of int8 values, little-endian, so
// that device code reads them from registers: an array indexed at run time
// would be a per-thread copy in local memory on the GPU.
IE_HD constexpr int table16(uint64_t lo, uint64_t hi, int q) {
  return static_cast<int8_t>(((q < 8 ? lo : hi) >> (8 * (q & 7))) & 0xFF);
}

// kvalues_iq4nl: -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
IE_HD constexpr int iq4_value(int q) { return table16(0xF6EADDCFBFAD9881ull, 0x7159453526190D01ull, q); }
static_assert(iq4_value(0) == -127 && iq4_value(7) == -10 && iq4_value(8) == 1 && iq4_value(15) == 113);

IE_HD float iq4xs_scale(const uint8_t* blk, int j) {
  const int l = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((load_u16(blk + 2) >> (2 * j)) & 3) << 4);
  return f16_to_f32(load_u16(blk)) * static_cast<float>(l - 32);
}

// iq4_xsh: iq4_xs's 136 bytes, then a byte whose bit j shifts sub-block j's
// grid up by kIq4ShiftStep (its values iq4_value(q) + 4: a second grid that
// falls between the first's points near zero).
constexpr int kIq4xshShifts = 136, kIq4ShiftStep = 4;
IE_HD int iq4xsh_shift(const uint8_t* blk, int j) { return ((blk[kIq4xshShifts] >> j) & 1) * kIq4ShiftStep; }

// mxfp4 (OCP MX v1.0 FP4, ggml's block_mxfp4): an E8M0 scale byte e, then
// 16 bytes of e2m1 codes in iq4_nl's nibble order; w = e8m0_half(e) *
// mxfp4_value(q), the e2m1 values doubled so they are int8 (ggml's
// kvalues_mxfp4) and the scale 2^(e - 127) halved to match: 2^(e - 128),
// the subnormals 2^-128, 2^-127 for e = 0, 1.
// kvalues_mxfp4: 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
IE_HD constexpr int mxfp4_value(int q) { return table16(0x0C08060403020100ull, 0xF4F8FAFCFDFEFF00ull, q); }
static_assert(mxfp4_value(7) == 12 && mxfp4_value(8) == 0 && mxfp4_value(9) == -1 && mxfp4_value(15) == -12);

IE_HD float e8m0_half(uint8_t e) {
  return f32_from_bits(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

// nvfp4 (NVIDIA's FP4, ggml's block_nvfp4): 64 weights as four UE4M3 scale
// bytes (one per 16, unsigned E4M3: 4 exponent bits biased 7, 3 mantissa
// bits), then 32 bytes of e2m1 codes, sub-block s's 8 bytes at 4 + 8 s, byte
// j holding element 16 s + j (low nibble) and 16 s + j + 8 (high);
// w = ue4m3_half(d_s) * mxfp4_value(q) * tensor scale (WeightSpec::scale).
// ue4m3_half is ggml's ggml_ue4m3_to_fp32 (halved, as e8m0_half, for the
// doubled values): (8 + m) 2^(e - 11), subnormals m 2^-10; bit 7 is not
// read, and 0x7F (E4M3's NaN) is 0, as there (the import and `validate
// --deep` refuse both: formats/finite.py).
// constexpr, so that the SIMD kernels' table of all 256 (gemv/kernels.h
// kUe4m3) is this function's values: (8 + m) << e is an integer below 2^19,
// exact in float32, as is its product with 2^-11.
constexpr int kNvfp4Qs = 4;
IE_HD constexpr float ue4m3_half(uint8_t x) {
  const int e = (x >> 3) & 0xF, m = x & 7;
  return x == 0x7F ? 0.f : e == 0 ? static_cast<float>(m) * 0x1p-10f : static_cast<float>((8 + m) << e) * 0x1p-11f;
}

// The types whose codes index a table of int8 values (iq4_nl, iq4_xs,
// mxfp4; iq3_s's rows8 nibbles): value q of the table; and for the one-scale-per-block ones
// (iq4_nl, mxfp4) the scale of the block at blk.
// iq3_s's rows8 copy (gemv/rows8.h) re-codes each signed value v (odd,
// -15..15) as the nibble (v + 15) / 2, whose value is 2 q - 15.
// iq3_xxs's and iq2_xxs's re-code v as codebook_nibble(v).
IE_HD constexpr int grid_value(WType t, int q) {
  return t == WType::MXFP4 || t == WType::NVFP4 ? mxfp4_value(q)
         : t == WType::IQ3_S                    ? 2 * q - 15
         : t == WType::IQ3_XXS ? (q >= 8 ? iq3xxs_level_value(q - 8) : -iq3xxs_level_value(7 - q))
         : iq2_values(t)       ? (q >= 8 ? iq2xxs_level_value(q - 8) : -iq2xxs_level_value(7 - q))
         : iq1_values(t)       ? (q >= 8 ? iq1_level_value(q - 8) : -iq1_level_value(7 - q))
                               : iq4_value(q);
}
static_assert(grid_value(WType::IQ3_XXS, codebook_nibble(WType::IQ3_XXS, -62)) == -62 &&
              grid_value(WType::IQ3_XXS, codebook_nibble(WType::IQ3_XXS, 4)) == 4 &&
              grid_value(WType::IQ3_XXS, codebook_nibble(WType::IQ3_XXS, -4)) == -4 &&
              grid_value(WType::IQ3_XXS, codebook_nibble(WType::IQ3_XXS, 52)) == 52 &&
              grid_value(WType::IQ2_XXS, codebook_nibble(WType::IQ2_XXS, -43)) == -43 &&
              grid_value(WType::IQ2_XXS, codebook_nibble(WType::IQ2_XXS, 25)) == 25 &&
              grid_value(WType::IQ2_XXS, codebook_nibble(WType::IQ2_XXS, -8)) == -8 &&
              grid_value(WType::IQ3_S, codebook_nibble(WType::IQ3_S, -15)) == -15 &&
              grid_value(WType::IQ3_S, codebook_nibble(WType::IQ3_S, 13)) == 13 &&
              grid_value(WType::IQ1_M, codebook_nibble(WType::IQ1_M, -9)) == -9 &&
              grid_value(WType::IQ1_S, codebook_nibble(WType::IQ1_S, 7)) == 7 &&
              grid_value(WType::IQ1_S, codebook_nibble(WType::IQ1_S, -1)) == -1);
IE_HD float grid_scale(WType t, const uint8_t* blk) {
  return t == WType::MXFP4 ? e8m0_half(blk[0]) : f16_to_f32(load_u16(blk));
}
// Of the table types' 32-block j of the stored block at blk: its scale
// (iq4_xs, iq4_xsh: d * (l_j - 32); else the block's one scale) and the
// shift its values take (iq4_xsh's grid bit; 0 for the others).
IE_HD float grid_sub_scale(WType t, const uint8_t* blk, int j) {
  return t == WType::IQ4_XS || t == WType::IQ4_XSH ? iq4xs_scale(blk, j) : grid_scale(t, blk);
}
IE_HD int grid_shift(WType t, const uint8_t* blk, int j) { return t == WType::IQ4_XSH ? iq4xsh_shift(blk, j) : 0; }

// 32 weights of a 4-bit block whose 16 code bytes hold elements j (low
// nibble) and j + 16 (high), q4_0's order, shared by int4w's planar groups
// and q4_0/q4_1: symmetric d (q - 8), or affine d q + m.
IE_HD void nibbles32(const uint8_t* qs, float d, float* out) {
  IE_UNROLL
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
    out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

IE_HD void nibbles32(const uint8_t* qs, float d, float m, float* out) {
  IE_UNROLL
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>(qs[j] & 0xF) + m;
    out[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// W[r][c0 .. c0 + n) of the stored matrix w into out: c0 a multiple of 32,
// n = 32 for the block formats (n <= 32 for floats, the row's tail).
IE_HD void decode_span(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t c0, int n,
                       float* out) {
  const uint8_t* row = w + static_cast<size_t>(r) * lay.row_bytes;
  switch (s.type) {
    case WType::F32:
      for (int j = 0; j < n; ++j) out[j] = load_f32(row + (c0 + j) * 4);
      return;
    case WType::F16:
      for (int j = 0; j < n; ++j) out[j] = f16_to_f32(load_u16(row + (c0 + j) * 2));
      return;
    case WType::BF16:
      for (int j = 0; j < n; ++j) out[j] = bf16_to_f32(load_u16(row + (c0 + j) * 2));
      return;
    case WType::Int4w: {
      const uint8_t* qs = row + c0 / 2;
      const size_t gi = static_cast<size_t>(r) * lay.groups + c0 / s.group_size;
      const uint8_t* sp = w + lay.scales_off + gi * lay.scale_bytes;
      const uint8_t* mp = w + lay.mins_off + gi * lay.scale_bytes;
      const float sc = s.scale_f32 ? load_f32(sp) : f16_to_f32(load_u16(sp));
      if (s.symmetric)
        nibbles32(qs, sc, out);
      else
        nibbles32(qs, sc, s.scale_f32 ? load_f32(mp) : f16_to_f32(load_u16(mp)), out);
      return;
    }
    case WType::Q4_0:
    case WType::Q4_1: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const uint8_t* qs = blk + lay.block_qs;
      const float d = f16_to_f32(load_u16(blk));
      if (s.type == WType::Q4_0)
        nibbles32(qs, d, out);
      else
        nibbles32(qs, d, f16_to_f32(load_u16(blk + 2)), out);
      return;
    }
    case WType::Q5_0:
    case WType::Q5_1: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const float d = f16_to_f32(load_u16(blk));
      if (s.type == WType::Q5_0) {
        IE_UNROLL
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(q5_code(blk, 2, e) - 16) * d;
      } else {
        const float m = f16_to_f32(load_u16(blk + 2));
        IE_UNROLL
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(q5_code(blk, 4, e)) * d + m;
      }
      return;
    }
    case WType::Q8_0: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const float d = f16_to_f32(load_u16(blk));
      IE_UNROLL
      for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(blk[lay.block_qs + j]));
      return;
    }
    case WType::IQ4_NL:
    case WType::IQ4_XS:
    case WType::IQ4_XSH:
    case WType::MXFP4: {
      const uint8_t* blk = row + c0 / s.group_size * lay.block_bytes;
      const int j = static_cast<int>(c0 % s.group_size / 32);
      const float d = grid_sub_scale(s.type, blk, j);
      const int shift = grid_shift(s.type, blk, j);
      const uint8_t* qs = blk + lay.block_qs + 16 * j;
      IE_UNROLL
      for (int e = 0; e < 16; ++e) {
        out[e] = d * static_cast<float>(grid_value(s.type, qs[e] & 0xF) + shift);
        out[e + 16] = d * static_cast<float>(grid_value(s.type, qs[e] >> 4) + shift);
      }
      return;
    }
    case WType::NVFP4: {  // the span's two sub-blocks 2h, 2h + 1 of its 64-block
      const uint8_t* blk = row + c0 / 64 * lay.block_bytes;
      const int h = static_cast<int>(c0 % 64 / 32);
      IE_UNROLL
      for (int t = 0; t < 2; ++t) {
        const float d = ue4m3_half(blk[2 * h + t]);
        const uint8_t* qs = blk + kNvfp4Qs + 8 * (2 * h + t);
        IE_UNROLL
        for (int j = 0; j < 8; ++j) {
          out[16 * t + j] = d * static_cast<float>(mxfp4_value(qs[j] & 0xF)) * s.scale;
          out[16 * t + j + 8] = d * static_cast<float>(mxfp4_value(qs[j] >> 4)) * s.scale;
        }
      }
      return;
    }
    case WType::Q1_0: {  // the span's 32 sign bits of its 128-block: +d where set, -d where clear
      const uint8_t* blk = row + c0 / 128 * lay.block_bytes;
      const float d = f16_to_f32(load_u16(blk));
      const uint32_t bits = q1_signs(blk, static_cast<int>(c0 % 128 / 32));
      IE_UNROLL
      for (int e = 0; e < 32; ++e) out[e] = (bits >> e & 1u) ? d : -d;
      return;
    }
    case WType::Q4_K:
    case WType::Q5_K: {  // the same header; q5_k's codes have a fifth bit
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      const int j = static_cast<int>(c0 % 256 / 32);
      const Q4kSub p = q4k_sub(blk, j);
      IE_UNROLL
      for (int e = 0; e < 32; ++e) {
        const int q = s.type == WType::Q4_K ? q4k_code(blk, j, e) : q5k_code(blk, j, e);
        out[e] = p.scale * static_cast<float>(q) - p.min;
      }
      return;
    }
    case WType::Q6_K:
    case WType::Q3_K: {  // symmetric codes under 16-element sub-scales, offset 32 or 4
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      const int i0 = static_cast<int>(c0 % 256);
      const bool q6 = s.type == WType::Q6_K;
      const int j = i0 / 16;  // the span's two sub-blocks: j, j + 1
      const float sc[2] = {q6 ? q6k_scale(blk, j) : q3k_scale(blk, j), q6 ? q6k_scale(blk, j + 1) : q3k_scale(blk, j + 1)};
      IE_UNROLL
      for (int e = 0; e < 32; ++e) {
        const int i = i0 + e;
        out[e] = sc[e / 16] * static_cast<float>(q6 ? q6k_code(blk, i) - 32 : q3k_code(blk, i) - 4);
      }
      return;
    }
    case WType::IQ3_S:
    case WType::IQ3_XXS:
    case WType::IQ2_XXS: {
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      int v[32];
      const float d = codebook_sub(s.type, blk, static_cast<int>(c0 % 256 / 32), v);
      IE_UNROLL
      for (int e = 0; e < 32; ++e) out[e] = d * static_cast<float>(v[e]);
      return;
    }
    case WType::IQ2_XS:
    case WType::IQ2_S:
    case WType::IQ1_S:
    case WType::IQ1_M: {
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      int v[32];
      float sc[2];
      half_sub(s.type, blk, static_cast<int>(c0 % 256 / 32), v, sc);
      IE_UNROLL
      for (int e = 0; e < 32; ++e) out[e] = sc[e / 16] * static_cast<float>(v[e]);
      return;
    }
    case WType::Q2_K: {
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      const int i0 = static_cast<int>(c0 % 256);
      const Q4kSub p[2] = {q2k_sub(blk, i0 / 16), q2k_sub(blk, i0 / 16 + 1)};  // the span's two sub-blocks
      IE_UNROLL
      for (int e = 0; e < 32; ++e) out[e] = p[e / 16].scale * static_cast<float>(q2k_code(blk, i0 + e)) - p[e / 16].min;
      return;
    }
  }
}

}  // namespace
}  // namespace ie
