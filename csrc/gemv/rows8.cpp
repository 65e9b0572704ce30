// pack_rows8: the stored layouts (docs/formats/quant.md) rewritten eight
// rows at a time (rows8.h). Portable code: only the kernels that read the
// copy are per ISA.
#include "rows8.h"


#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "kernels.h"

namespace ie {
namespace {

// The 32 codes of 32-block k of row r of the types put_block moves code by
// code (q8_0: its int8 values as bytes; q5_0, q5_1: 0..31).
void block_codes(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t k, uint8_t* q) {
  const uint8_t* blk = w + r * lay.row_bytes + k * lay.block_bytes;
  if (s.type == WType::Q8_0) {
    std::memcpy(q, blk + lay.block_qs, 32);
  } else if (s.type == WType::Q5_0 || s.type == WType::Q5_1) {
    for (int e = 0; e < 32; ++e) q[e] = static_cast<uint8_t>(q5_code(blk, static_cast<int>(lay.block_qs), e));
  } else {
    fail("rows8: no codes for " + std::string(wtype_info(s.type).name));
  }
}

// Row i's codes q of one 32-block into the tile block at o (rows8.h): q8_0's
// bytes, or q5_0's and q5_1's nibbles and fifth bits.
void put_codes(WType t, const uint8_t* q, int i, uint8_t* o) {
  if (t == WType::Q8_0) {
    for (int v = 0; v < 8; ++v) std::memcpy(o + v * 32 + 4 * i, q + 4 * v, 4);
    return;
  }
  for (int v = 0; v < 4; ++v)
    for (int j = 0; j < 4; ++j) {
      const int lo = q[8 * v + j], hi = q[8 * v + 4 + j];
      o[v * 32 + 4 * i + j] = static_cast<uint8_t>((lo & 0xF) | (hi & 0xF) << 4);
      o[128 + 4 * i + j] |= static_cast<uint8_t>((lo >> 4) << v | (hi >> 4) << (4 + v));
    }
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// Row i's four vectors of a 4-bit block (put_codes' layout) straight from
// q4_0's nibble order (16 bytes, byte e holding elements e and e + 16),
// four bytes at a time: vectors 0 and 1 are the bytes' low nibbles, 2 and
// 3 their high ones. The same bytes as block_codes then put_codes, at
// several GB/s instead of a half: what lets a prefill pack a mixture's
// experts per chunk (pack_rows8_tiles).
void put_nibbles_q40(const uint8_t* qs, int i, uint8_t* o) {
  const uint32_t a = load_u32(qs), b = load_u32(qs + 4), c = load_u32(qs + 8), d = load_u32(qs + 12);
  store_u32(o + 4 * i, (a & kLowNibbles) | (b & kLowNibbles) << 4);
  store_u32(o + 32 + 4 * i, (c & kLowNibbles) | (d & kLowNibbles) << 4);
  store_u32(o + 64 + 4 * i, (a >> 4 & kLowNibbles) | (b & ~kLowNibbles));
  store_u32(o + 96 + 4 * i, (c >> 4 & kLowNibbles) | (d & ~kLowNibbles));
}

// The same from q4_k's order: 32 bytes whose low (HIGH: high) nibble is
// element e's code.
template <bool HIGH>
void put_nibbles_kq(const uint8_t* q, int i, uint8_t* o) {
  for (int v = 0; v < 4; ++v) {
    const uint32_t a = load_u32(q + 8 * v), b = load_u32(q + 8 * v + 4);
    store_u32(o + 32 * v + 4 * i, HIGH ? (a >> 4 & kLowNibbles) | (b & ~kLowNibbles)
                                       : (a & kLowNibbles) | (b & kLowNibbles) << 4);
  }
}

// q5_k's fifth bits (q3_k's third bits) of 32-block j (bit j of the 32
// bytes at qh, byte e for element e) as row i's lane of the tile's
// fifth-bit vector at o (rows8.h: byte e' holds element 8v + e' at bit v,
// 8v + 4 + e' at bit 4 + v), four bytes at a time.
void put_bit_plane(const uint8_t* qh, int j, int i, uint8_t* o) {
  uint32_t out = 0;
  for (int v = 0; v < 4; ++v) {
    const uint32_t a = load_u32(qh + 8 * v) >> j & 0x01010101u, b = load_u32(qh + 8 * v + 4) >> j & 0x01010101u;
    out |= a << v | b << (4 + v);
  }
  store_u32(o + 4 * i, out);
}

// q6_k's high bit pairs (q3_k's and q2_k's low ones) of 32-block j (bits
// 2 (j % 4) of the 32 bytes at qh of its half, byte e for element
// 32 (j / 4 * 4) ... + e) as row i's lane of the tile's two bit-pair
// vectors at o (rows8.h), four bytes at a time.
void put_bit_pairs(const uint8_t* qh, int j, int i, uint8_t* o) {
  const int at = 2 * (j % 4);
  auto pairs = [&](int v) {  // bytes e' = 0..3: element 8v + e' at bits 0..1, 8v + 4 + e' at 2..3
    return (load_u32(qh + 8 * v) >> at & 0x03030303u) | (load_u32(qh + 8 * v + 4) >> at & 0x03030303u) << 2;
  };
  store_u32(o + 4 * i, pairs(0) | pairs(1) << 4);
  store_u32(o + 32 + 4 * i, pairs(2) | pairs(3) << 4);
}

// Byte k of entry s: 0x0F where bit k of s is set (an eight-tuple's signs
// as the nibbles they flip).
struct SignNibbles {
  uint64_t mask[256];
};
constexpr SignNibbles sign_nibble_table() {
  SignNibbles t{};
  for (uint32_t s = 0; s < 256; ++s) t.mask[s] = byte_mask(s, 0x0F);
  return t;
}
constexpr SignNibbles kSignNibbles = sign_nibble_table();

// Row i's lanes of an IQ2 type's 32-block j (blk: its super-block) in the
// tile block at o, four bytes a vector (vector m = eight-tuple m): each
// magnitude's nibble codebook_nibble(g) = 8 + (g > 8) + (g > 25) by byte
// arithmetic on the tuple's codebook word, a negative one's flipped
// (codebook_nibble(-g) = codebook_nibble(g) ^ 15). Code by code (block_codes,
// put_codes) packed 0.26 GB/s of iq2_xs, too slow for a prefill that packs
// the matrices whose copies did not fit.
void put_iq2_block(WType t, const uint8_t* blk, int j, int i, uint8_t* o) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  const uint32_t neg = t == WType::IQ2_XXS  ? even_signs(iq2xxs_aux(blk, j))
                       : t == WType::IQ2_XS ? even_signs(iq2xs_aux(blk, j))
                                            : load_u32(blk + kIq2sSigns + 4 * j);
  for (int m = 0; m < 4; ++m) {
    const uint64_t g = t == WType::IQ2_XXS  ? iq2xxs_grid()[blk[kIq2xxsQs + 8 * j + m]]
                       : t == WType::IQ2_XS ? iq2xs_grid()[Iq2Index{blk, j, true}[m]]
                                            : iq2s_grid()[Iq2Index{blk, j, false}[m]];
    // bit 7 of byte g + 119 (g + 102): g > 8 (g > 25); no byte carries (g <= 43)
    const uint64_t nib = (8 * kOnes + ((g + 119 * kOnes) >> 7 & kOnes) + ((g + 102 * kOnes) >> 7 & kOnes)) ^
                         kSignNibbles.mask[(neg >> (8 * m)) & 0xFF];
    store_u32(o + 32 * m + 4 * i, static_cast<uint32_t>(nib) | static_cast<uint32_t>(nib >> 32) << 4);
  }
}

// The same for iq3_s and iq3_xxs, a codebook word of four magnitudes g per
// tuple (tuples 2v and 2v + 1 the low and high nibbles of vector v): the
// nibble codebook_nibble(g) = 8 + level, the level iq3_s's (g - 1) / 2 = g >> 1
// (g odd, 1..15) or iq3_xxs's g >> 3 (4, 12, .., 52 and 62: 0..7), by byte
// arithmetic (no byte carries: g < 64 after the mask), a negative one's
// flipped (^ 15). Code by code (block_codes, put_codes) packed 0.3 GB/s.
void put_iq3_block(WType t, const uint8_t* blk, int j, int i, uint8_t* o) {
  const bool s = t == WType::IQ3_S;
  const uint32_t neg = s ? load_u32(blk + kIq3sSigns + 4 * j) : even_signs(iq3xxs_aux(blk, j));
  const int shift = s ? 1 : 3;
  auto nibbles = [&](int m) {  // tuple m's four nibbles, one a byte
    const uint32_t g = s ? iq3s_grid()[blk[kIq3sQs + 8 * j + m] | ((blk[kIq3sQh + j] >> m) & 1) << 8]
                         : iq3xxs_grid()[blk[kIq3xxsQs + 8 * j + m]];
    return ((g >> shift & 0x07070707u) + 0x08080808u) ^ static_cast<uint32_t>(kSignNibbles.mask[(neg >> (4 * m)) & 0xF]);
  };
  for (int v = 0; v < 4; ++v) store_u32(o + 32 * v + 4 * i, nibbles(2 * v) | nibbles(2 * v + 1) << 4);
}

// The same for iq1_s and iq1_m: the value 8 g +- 1 of each byte g (-1, 0,
// 1) of a codebook word has the nibble 8 + 2 g - (1 where the shift is
// negative), by byte arithmetic on the word's bits 0 (g != 0) and 7 (g < 0):
// 8 + 2 b0 - 4 b7 - neg, no byte borrowing (b7 only where b0).
void put_iq1_block(WType t, const uint8_t* blk, int j, int i, uint8_t* o) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  for (int m = 0; m < 4; ++m) {
    const uint64_t g = iq1s_grid()[iq1_index(t, blk, 4 * j + m)];
    const uint64_t b0 = g & kOnes, b7 = g >> 7 & kOnes;
    const uint64_t nib = ((iq1_neg(t, blk, 4 * j + m) ? 7 : 8) * kOnes + 2 * b0) - 4 * b7;
    store_u32(o + 32 * m + 4 * i, static_cast<uint32_t>(nib) | static_cast<uint32_t>(nib >> 32) << 4);
  }
}

// Row r's 32-block k as row i of the tile block at o (zeroed before):
// int4w's, iq4_xs's and the k-quants' 4-bit nibbles four bytes at a time,
// with q5_k's fifth bits and q6_k's bit pairs, q3_k's and q2_k's bit pairs
// and q3_k's third bits the same way, the codebook types' values by byte
// arithmetic on their words (the 32-block types in q4_0's order go through
// pack_q40_tile); q8_0, q5_0 and q5_1 code by code. q6_k's 0.2 GB/s code by
// code made a Qwen3-MoE Q4_K_M prefill pack its q6_k experts for 40% of its
// time.
void put_block(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t k, int i,
               uint8_t* o) {
  const uint8_t* row = w + r * lay.row_bytes;
  if (s.type == WType::Int4w) return put_nibbles_q40(row + k * 16, i, o);
  if (s.type == WType::IQ4_XS || s.type == WType::IQ4_XSH)
    return put_nibbles_q40(row + k / 8 * lay.block_bytes + lay.block_qs + 16 * (k % 8), i, o);
  const uint8_t* blk = row + k / 8 * lay.block_bytes;
  const int j = static_cast<int>(k % 8);
  if (s.type == WType::Q4_K || s.type == WType::Q5_K) {
    const uint8_t* q = blk + (s.type == WType::Q4_K ? kQ4kCodes : kQ5kCodes) + 32 * (j / 2);
    j % 2 ? put_nibbles_kq<true>(q, i, o) : put_nibbles_kq<false>(q, i, o);
    if (s.type == WType::Q5_K) put_bit_plane(blk + kQ5kHigh, j, i, o + 128);
    return;
  }
  if (s.type == WType::Q6_K) {  // element 128 h + 32 q + e: low nibble in byte 64 h + 32 (q % 2) + e, high for q >= 2
    const int h = j / 4, q = j % 4;
    const uint8_t* lo = blk + 64 * h + 32 * (q % 2);
    q >= 2 ? put_nibbles_kq<true>(lo, i, o) : put_nibbles_kq<false>(lo, i, o);
    return put_bit_pairs(blk + kQ6kHigh + 32 * h, j, i, o + 128);
  }
  if (s.type == WType::Q2_K) return put_bit_pairs(blk + kQ2kCodes + 32 * (j / 4), j, i, o);
  if (s.type == WType::Q3_K) {
    put_bit_pairs(blk + kQ3kLow + 32 * (j / 4), j, i, o);
    return put_bit_plane(blk, j, i, o + 64);
  }
  if (s.type == WType::IQ3_S || s.type == WType::IQ3_XXS) return put_iq3_block(s.type, blk, j, i, o);
  if (iq2_values(s.type)) return put_iq2_block(s.type, blk, j, i, o);
  if (iq1_values(s.type)) return put_iq1_block(s.type, blk, j, i, o);
  uint8_t q[32];
  block_codes(s, lay, w, r, k, q);
  put_codes(s.type, q, i, o);
}

// Row i's header fields of group g (its scales and mins) into the tile header at h.
void put_header(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t g, int i, uint8_t* h) {
  const WeightSpec& s = p.spec;
  const int sb = p.scale_bytes;
  if (s.type == WType::Int4w) {
    const size_t gi = static_cast<size_t>(r * lay.groups + g) * lay.scale_bytes;
    std::memcpy(h + i * sb, w + lay.scales_off + gi, static_cast<size_t>(sb));
    if (p.affine) std::memcpy(h + 8 * sb + i * sb, w + lay.mins_off + gi, static_cast<size_t>(sb));
    return;
  }
  const uint8_t* blk = w + r * lay.row_bytes + g * lay.block_bytes;
  switch (s.type) {
    case WType::Q4_K:
    case WType::Q5_K: {
      using H = Rows8KqHeader;
      for (int k = 0; k < 3; ++k) std::memcpy(h + H::words + 32 * k + 4 * i, blk + 4 + 4 * k, 4);
      std::memcpy(h + H::d + 2 * i, blk, 2);
      std::memcpy(h + H::dmin + 2 * i, blk + 2, 2);
      return;
    }
    case WType::IQ4_XS:
    case WType::IQ4_XSH: {
      using H = Rows8Iq4xsHeader;
      std::memcpy(h + H::scales_l + 4 * i, blk + 4, 4);
      std::memcpy(h + H::scales_h + 2 * i, blk + 2, 2);
      std::memcpy(h + H::d + 2 * i, blk, 2);
      if (s.type == WType::IQ4_XSH) h[H::shifts + i] = blk[kIq4xshShifts];
      return;
    }
    case WType::Q6_K: {
      using H = Rows8Q6kHeader;
      for (int b = 0; b < 8; ++b) {
        h[H::scales + 16 * b + i] = blk[kQ6kScales + 2 * b];
        h[H::scales + 16 * b + 8 + i] = blk[kQ6kScales + 2 * b + 1];
      }
      std::memcpy(h + H::d + 2 * i, blk + kQ6kD, 2);
      return;
    }
    case WType::IQ2_XS:  // q6_k's header: the multipliers 1 + 2 s_h of d / 8 (rows8_d_factor)
    case WType::IQ2_S:
    case WType::IQ1_S:
    case WType::IQ1_M: {
      using H = Rows8Q6kHeader;
      for (int half = 0; half < 16; ++half)
        h[H::scales + 16 * (half / 2) + 8 * (half % 2) + i] = static_cast<uint8_t>(half_sub_scale(s.type, blk, half));
      const uint16_t d = half_d_bits(s.type, blk);
      std::memcpy(h + H::d + 2 * i, &d, 2);
      return;
    }
    case WType::Q3_K: {
      using H = Rows8Q3kHeader;
      for (int k = 0; k < 3; ++k) std::memcpy(h + H::words + 32 * k + 4 * i, blk + kQ3kScales + 4 * k, 4);
      std::memcpy(h + H::d + 2 * i, blk + kQ3kD, 2);
      return;
    }
    case WType::IQ3_S:    // iq4_xs's header, l_j = 32 + (1 + 2 s_j) so that l_j - 32 is the sub-scale
    case WType::IQ3_XXS:  // the same (its d read as d / 4: rows8_d_factor)
    case WType::IQ2_XXS: {  // (d / 8)
      using H = Rows8Iq4xsHeader;
      uint16_t hi = 0;
      for (int j = 0; j < 8; ++j) {
        const int l = 32 + codebook_sub_scale(s.type, blk, j);
        h[H::scales_l + 4 * i + j / 2] |= static_cast<uint8_t>((l & 0xF) << (4 * (j % 2)));
        hi = static_cast<uint16_t>(hi | (l >> 4) << (2 * j));
      }
      std::memcpy(h + H::scales_h + 2 * i, &hi, 2);
      std::memcpy(h + H::d + 2 * i, blk, 2);
      return;
    }
    case WType::Q2_K: {
      using H = Rows8Q2kHeader;
      for (int k = 0; k < 4; ++k) std::memcpy(h + H::words + 32 * k + 4 * i, blk + 4 * k, 4);
      std::memcpy(h + H::d + 2 * i, blk + kQ2kD, 2);
      std::memcpy(h + H::dmin + 2 * i, blk + kQ2kDmin, 2);
      return;
    }
    case WType::Q4_0:  // d or e (and m) lead the block
    case WType::Q4_1:
    case WType::Q5_0:
    case WType::Q5_1:
    case WType::IQ4_NL:
    case WType::MXFP4:
    case WType::Q8_0:
      std::memcpy(h + i * sb, blk, static_cast<size_t>(sb));
      if (p.affine) std::memcpy(h + 8 * sb + i * sb, blk + sb, static_cast<size_t>(sb));
      return;
    case WType::Int4w:  // above
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:
    case WType::F16:
    case WType::BF16: break;
  }
  fail("rows8: no header for " + std::string(wtype_info(s.type).name));
}

size_t header_bytes(const Rows8& p) {
  switch (p.spec.type) {
    case WType::Q4_K:
    case WType::Q5_K: return Rows8KqHeader::bytes;
    case WType::IQ4_XS:
    case WType::IQ3_S:
    case WType::IQ3_XXS:
    case WType::IQ2_XXS: return Rows8Iq4xsHeader::bytes;
    case WType::IQ4_XSH: return Rows8Iq4xsHeader::xsh_bytes;
    case WType::Q6_K:
    case WType::IQ2_XS:
    case WType::IQ2_S:
    case WType::IQ1_S:
    case WType::IQ1_M: return Rows8Q6kHeader::bytes;
    case WType::Q3_K: return Rows8Q3kHeader::bytes;
    case WType::Q2_K: return Rows8Q2kHeader::bytes;
    case WType::Int4w:
    case WType::Q4_0:
    case WType::Q4_1:
    case WType::Q5_0:
    case WType::Q5_1:
    case WType::IQ4_NL:
    case WType::MXFP4:
    case WType::Q8_0: return static_cast<size_t>(8 * p.scale_bytes * (p.affine ? 2 : 1));
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:
    case WType::F16:
    case WType::BF16: break;
  }
  fail("rows8: no header for " + std::string(wtype_info(p.spec.type).name));
}

// pack_tile for the 32-block types in q4_0's nibble order (q4_0, q4_1,
// iq4_nl, mxfp4: a group is one block, led by its SB-byte scale and, AFFINE,
// its min): each row read in order, its codes and header bytes moved
// without a call per block (mxfp4's 17-byte blocks: 0.8 -> ~3 GB/s).
template <int SB, bool AFFINE>
void pack_q40_tile(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t t, uint8_t* out) {
  const int64_t rows = std::min<int64_t>(8, p.spec.rows - 8 * t);
  for (int i = 0; i < rows; ++i) {
    const uint8_t* blk = w + (8 * t + i) * lay.row_bytes;
    uint8_t* o = out;
    for (int64_t g = 0; g < p.groups; ++g, blk += lay.block_bytes, o += p.group_bytes) {
      put_nibbles_q40(blk + lay.block_qs, i, o);
      std::memcpy(o + 128 + SB * i, blk, SB);
      if constexpr (AFFINE) std::memcpy(o + 128 + 8 * SB + SB * i, blk + SB, SB);
    }
  }
}

// Whether a whole tile's bytes are all stored (not or-ed into zeros) by
// pack_tile: the 4-bit codes moved four bytes at a time and headers of
// whole fields. Those tiles need no zeroing first (packing per chunk).
bool stores_every_byte(WType t) {
  switch (t) {
    case WType::Int4w:
    case WType::Q4_0:
    case WType::Q4_1:
    case WType::IQ4_NL:
    case WType::MXFP4:
    case WType::Q4_K:
    case WType::Q5_K:
    case WType::Q6_K:
    case WType::IQ4_XS:
    case WType::IQ4_XSH:
    case WType::Q3_K:  // bit pairs and third bits four bytes a row, as q6_k's
    case WType::Q2_K:
    case WType::IQ2_XS:  // nibbles four bytes a row under q6_k's header
    case WType::IQ2_S:
    case WType::IQ1_S:
    case WType::IQ1_M: return true;
    case WType::Q8_0:  // q5_0's and q5_1's fifth bits, the iq4_xs header's scale nibbles (iq3_s, XXS): or-ed in
    case WType::Q5_0:
    case WType::Q5_1:
    case WType::IQ3_S:
    case WType::IQ3_XXS:
    case WType::IQ2_XXS:
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:
    case WType::F16:
    case WType::BF16: break;
  }
  return false;
}

// pack_tile for q1_0 (p.spec: its q4_0 view): each 32-block's 32 sign bits
// as q4_0's 16 code bytes (byte e: element e's code low, e + 16's high; 9
// where the bit is set, 7 where clear), then q4_0's nibble move; its
// 128-block's d in every 32-block's header slot.
void pack_q1_tile(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t t, uint8_t* out) {
  const int64_t rows = std::min<int64_t>(8, p.spec.rows - 8 * t);
  for (int i = 0; i < rows; ++i) {
    const uint8_t* row = w + (8 * t + i) * lay.row_bytes;
    uint8_t* o = out;
    for (int64_t g = 0; g < p.groups; ++g, o += p.group_bytes) {
      const uint8_t* blk = row + g / 4 * lay.block_bytes;
      const uint32_t bits = q1_signs(blk, static_cast<int>(g % 4));
      uint8_t q[16];
      for (int e = 0; e < 16; ++e)
        q[e] = static_cast<uint8_t>((7 + 2 * (bits >> e & 1u)) | (7 + 2 * (bits >> (e + 16) & 1u)) << 4);
      put_nibbles_q40(q, i, o);
      std::memcpy(o + 128 + 2 * i, blk, 2);
    }
  }
}

void pack_tile(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t t, uint8_t* out) {
  const WeightSpec& s = p.spec;
  if (8 * t + 8 > s.rows || !stores_every_byte(s.type)) std::memset(out, 0, p.tile_bytes);
  if (p.stored.type == WType::Q1_0) return pack_q1_tile(p, lay, w, t, out);
  switch (s.type) {
    case WType::Q4_0:
    case WType::IQ4_NL: return pack_q40_tile<2, false>(p, lay, w, t, out);
    case WType::Q4_1: return pack_q40_tile<2, true>(p, lay, w, t, out);
    case WType::MXFP4: return pack_q40_tile<1, false>(p, lay, w, t, out);
    case WType::Int4w:  // the rest: block by block (put_block, put_header)
    case WType::Q8_0:
    case WType::Q5_0:
    case WType::Q5_1:
    case WType::Q4_K:
    case WType::Q5_K:
    case WType::Q6_K:
    case WType::Q3_K:
    case WType::Q2_K:
    case WType::IQ4_XS:
    case WType::IQ4_XSH:
    case WType::IQ3_S:
    case WType::IQ3_XXS:
    case WType::IQ2_XXS:
    case WType::IQ2_XS:
    case WType::IQ2_S:
    case WType::IQ1_S:
    case WType::IQ1_M:
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:
    case WType::F16:
    case WType::BF16: break;
  }
  for (int64_t g = 0; g < p.groups; ++g) {
    uint8_t* o = out + g * p.group_bytes;
    for (int i = 0; i < 8; ++i) {
      const int64_t r = 8 * t + i;
      if (r >= s.rows) break;  // padding rows stay zero
      for (int kb = 0; kb < p.bpg; ++kb) put_block(s, lay, w, r, g * p.bpg + kb, i, o + kb * p.block_bytes);
      put_header(p, lay, w, r, g, i, o + static_cast<size_t>(p.bpg) * p.block_bytes);
    }
  }
}

}  // namespace

bool rows8_applies(const WeightSpec& s) { return rows8_code_bits(s.type) != 0; }

Rows8 rows8_shape(const WeightSpec& s) {
  Rows8 p;
  if (!rows8_applies(s) || s.rows < 1 || s.cols < 1) return p;
  if (s.cols % 32 != 0) fail("rows8: columns must be a multiple of 32, got " + std::to_string(s.cols));
  const WeightLayout lay = weight_layout(s);
  p.stored = p.spec = s;
  if (s.type == WType::Q1_0) {  // a q4_0 matrix's copy (rows8.h)
    p.spec.type = WType::Q4_0;
    p.spec.group_size = 32;
  }
  p.tiles = (s.rows + 7) / 8;
  p.act_block = wtype_info(p.spec.type).act_block;
  p.block_bytes = 32 * rows8_code_bits(s.type);
  if (s.type == WType::Int4w) {
    p.bpg = static_cast<int>(s.group_size / 32);
    p.groups = lay.groups;
    p.scale_bytes = static_cast<int>(lay.scale_bytes);
    p.affine = !s.symmetric;
  } else {
    p.bpg = wtype_info(p.spec.type).block_elems / 32;
    p.groups = s.cols / (32 * p.bpg);
    p.scale_bytes = s.type == WType::MXFP4 ? 1 : 2;
    p.affine = s.type == WType::Q4_1 || s.type == WType::Q5_1;
  }
  p.group_bytes = checked_add(checked_mul(static_cast<size_t>(p.bpg), static_cast<size_t>(p.block_bytes), "rows8 group"),
                              header_bytes(p), "rows8 group");
  p.tile_bytes = checked_mul(p.group_bytes, static_cast<size_t>(p.groups), "rows8 tile");
  checked_mul(p.tile_bytes, static_cast<size_t>(p.tiles), "rows8 matrix");
  return p;
}

void pack_rows8_tiles(const Rows8& p, const uint8_t* w, int64_t t0, int64_t n, uint8_t* out) {
  if (p.empty() || t0 < 0 || n < 0 || n > p.tiles - t0) fail("pack_rows8_tiles: tiles outside the matrix");
  const WeightLayout lay = weight_layout(p.stored);
  for (int64_t k = 0; k < n; ++k) pack_tile(p, lay, w, t0 + k, out + k * p.tile_bytes);
}

size_t rows8_nbytes(const WeightSpec& s) {
  const Rows8 p = rows8_shape(s);
  return p.tile_bytes * static_cast<size_t>(p.tiles);  // (checked by rows8_shape)
}

Rows8 pack_rows8(const WeightSpec& s, const uint8_t* w, ThreadPool& pool) {
  Rows8 p = rows8_shape(s);
  if (p.empty()) return p;
  p.bytes.resize(rows8_nbytes(s), /*zero=*/false);
  uint8_t* base = p.bytes.data();
  // Each thread fills the tiles its GEMV share starts on (first touch
  // where they will be read: work_split.h's initial shares).
  pool.each([&](int t) {
    const int nt = pool.size();
    const int64_t k0 = p.tiles * t / nt, k1 = p.tiles * (t + 1) / nt;
    pack_rows8_tiles(p, w, k0, k1 - k0, base + k0 * p.tile_bytes);
  });
  return p;
}

}  // namespace ie
