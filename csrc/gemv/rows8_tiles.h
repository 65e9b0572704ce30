// The GEMV kernels with int8 activations over rows8 copies (rows8.h), one
// token or a prefill chunk of up to 64 (four tokens at a time per tile, eight
// under AVX-512: kWide; there eight tokens run over two tiles at once in
// 512-bit vectors, rows8_pairs.h), compiled once per ISA:
// rows8_avx2.cpp (-mavx2), rows8_avxvnni.cpp (IE_ROWS8_VNNI, -mavxvnni: the
// VEX vpdpbusd, 16 registers) and rows8_avx512.cpp (IE_ROWS8_VNNI and
// IE_ROWS8_ZMM, -mavx512vl -mavx512vnni: 32 registers and 512-bit pairs).
// rows8_amx.cpp builds the AVX-512 one again with IE_ROWS8_AMX: its pairs
// of tiles take sixteen tokens at a time through AMX tile multiplies
// (rows8_amx.h) where the type has such a kernel.
// Include only from those four files: everything here is internal to the
// including object.
// Every 32-bit lane is one of a tile's eight rows, so a tile ends with one
// vector store and no horizontal sums. Checked against the scalar reference
// (tests/test_gemv.py) at every ISA this CPU has.
//
// AVX2, 4-bit tiles, per 32-block: four 32-byte loads hold 8 rows x 32 codes. Lane
// i of vector v pairs its low nibbles with x[8v .. 8v+3] and its high ones
// with x[8v+4 .. 8v+7] (each a broadcast 4-byte load), maddubs sums pairs to
// int16, and the 16 products a 16-bit lane collects over the block stay
// below 16 * 15 * 127 < 2^15, so one madd per block widens them to int32
// (5-bit codes: one per two vectors). That madd multiplies by a vector of
// int16 pairs: ones, or the eight rows' integer sub-scales of q4_k, q5_k,
// q6_k, q3_k and iq4_xs, which so cost nothing per product.
// q8_0 and iq4 tiles (signed values): the sign moved from w to x
// (|w| x sign(x, w)) so maddubs can multiply, one madd per product vector
// (two products already reach 2 * 128 * 127). mxfp4's values (|v| <= 12)
// are read unsigned as v + 16, with no sign moves, and sum in int16 over
// half a block, one madd per half block; 16 sum x comes off per block
// (prefill tile 2048 x 2048 x 64 tokens, 1 thread: 4.37-4.46 -> 4.06-4.18
// ms); iq3_s's (|v| <= 15, its iq4_xs-layout copy) as v + 16 the same way
// (5.26-5.37 -> 4.29-4.40 ms). iq4's, iq3_s's and mxfp4's values come from
// their nibbles by a table shuffle.
// VNNI (IE_ROWS8_VNNI): vpdpbusd multiplies unsigned bytes by signed ones
// and adds each lane's four products into int32 with no int16 step, so the
// codes need neither the madd nor the int16 bounds: a block's sum is one
// dpbusd per vector and token, and a sub-scale multiplies it once per block
// (vpmulld). Signed values are read unsigned, offset by 128 (iq4 and mxfp4
// from a table of v + 128, q8_0's bytes with their top bit flipped), and
// 128 times the block's activation sum comes off once per block: the same
// integers as the AVX2 kernels', so the same floats. The 16-element
// sub-blocks of q6_k, q3_k and q2_k: each half's dpbusd sums times its
// sub-scale.
// Each token's running sum is kept in order (in_reg after its adds): GCC
// otherwise re-associates it into a tree of all 32 products of a block and
// spills them (batch-8 int4w 1.05 -> 0.81 ms).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "avx2_bits.h"
#if IE_ROWS8_AMX
#include "common/amx_tiles.h"
#endif
#include "common/exp_avx2.h"
#include "common/work_split.h"
#include "kernels.h"

namespace ie {
namespace {

IE_INLINE __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Eight scales of SB bytes each as floats: f32, f16, or E8M0 bytes
// (e8m0_half's bits: (e - 1) << 23, the subnormals for e < 2).
template <int SB>
IE_INLINE __m256 load8(const uint8_t* p) {
  if constexpr (SB == 4) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  if constexpr (SB == 1) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
  }
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Software prefetch this far ahead of the tile being read (the tiles are
// one sequential stream).
constexpr size_t kAhead = 4096;

IE_INLINE void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// Byte j (0..3) of each 32-bit lane of v, zero-extended: to int32 (PAIRS
// false), or to both int16 halves (PAIRS true: a madd multiplier for the
// whole lane). The shuffle's control is j plus a constant (its zeroing
// entries stay negative), folded where j is a constant.
template <bool PAIRS>
IE_INLINE __m256i lane_byte(__m256i v, int j) {
  constexpr char z = -128, b = PAIRS ? 0 : z;
  const __m256i base = _mm256_setr_epi8(0, z, b, z, 4, z, 4 + b, z, 8, z, 8 + b, z, 12, z, 12 + b, z,  //
                                        0, z, b, z, 4, z, 4 + b, z, 8, z, 8 + b, z, 12, z, 12 + b, z);
  return _mm256_shuffle_epi8(v, _mm256_add_epi8(base, _mm256_set1_epi8(static_cast<char>(j))));
}

// A sign-extended int32 per lane as the same value in both int16 halves.
IE_INLINE __m256i int16_pairs(__m256i v) { return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA); }

#ifndef IE_ROWS8_VNNI
#define IE_ROWS8_VNNI 0
#endif
#ifndef IE_ROWS8_ZMM
#define IE_ROWS8_ZMM 0
#endif
#ifndef IE_ROWS8_AMX
#define IE_ROWS8_AMX 0
#endif
static_assert(!IE_ROWS8_ZMM || IE_ROWS8_VNNI, "the AVX-512 build multiplies with VNNI");
static_assert(!IE_ROWS8_AMX || IE_ROWS8_ZMM, "the AMX build is the AVX-512 one with tile multiplies");

#if IE_ROWS8_VNNI
// Per 32-bit lane, r plus the four products of unsigned u and signed x
// bytes: the EVEX form under AVX-512, the VEX one (AVX-VNNI) otherwise.
IE_INLINE __m256i dpbusd(__m256i r, __m256i u, __m256i x) {
#if IE_ROWS8_ZMM
  return _mm256_dpbusd_epi32(r, u, x);
#else
  return _mm256_dpbusd_avx_epi32(r, u, x);
#endif
}
#endif

// A sub-scale multiplier of a block's sums from its sign-extended int32 per
// lane: int16 pairs for AVX2's madd, the int32 itself for VNNI's vpmulld.
IE_INLINE __m256i mult_of(__m256i v) {
#if IE_ROWS8_VNNI
  return v;
#else
  return int16_pairs(v);
#endif
}

// The same from byte j of each lane (zero-extended).
IE_INLINE __m256i mult_of_byte(__m256i v, int j) { return lane_byte<!IE_ROWS8_VNNI>(v, j); }

// fn(j) for the sub-blocks j = 0..7 of a super-block: unrolled (j a
// constant that the helpers fold) for one token and for AVX2's four, a loop
// for AVX-512's eight tokens per pass. Unrolled, those kernels were 2,000-3,500
// instructions each, more than the op cache holds beside the rest: as a loop
// iq4_xs at batch 32 went 2.53 -> 2.26 ms (AVX2's four tokens: 4.60 -> 4.74,
// so they stay unrolled).
template <int NB, class F>
IE_INLINE void for_sub_blocks(F&& fn) {
  if constexpr (IE_ROWS8_ZMM && NB > 4) {
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) fn(j);
  } else {
    static_for<8>([&](auto jj) __attribute__((always_inline)) { fn(static_cast<int>(decltype(jj)::value)); });
  }
}

#if IE_ROWS8_VNNI
// NB tokens' int32 sums of one block, added to by vpdpbusd (per lane, the
// four products of unsigned bytes u and signed bytes x). Under four tokens
// each has two chains (the low and the high nibbles' products), so that one
// token's dpbusds do not wait on one another; from four up the tokens are
// the chains, and eight tokens' second chains would not fit in AVX-512's 32
// registers (iq4_xs at eight tokens spilled: 2.87 -> 2.93 ms).
template <int NB>
struct VnniSums {
  static constexpr int kChains = NB < 4 ? 2 : 1;
  __m256i c[kChains][NB];
  IE_INLINE VnniSums() {
    for (auto& chain : c)
      for (auto& v : chain) v = _mm256_setzero_si256();
  }
  // Token b's products u * x, into chain `half` (0: low nibbles, 1: high).
  IE_INLINE void add(int half, int b, __m256i u, __m256i x) {
    __m256i& r = c[half % kChains][b];
    r = dpbusd(r, u, x);
    in_reg(r);
  }
  IE_INLINE __m256i sum(int b) const { return kChains == 2 ? _mm256_add_epi32(c[0][b], c[kChains - 1][b]) : c[0][b]; }
  // Vector v of a 4-bit layout's block for every token (token b's codes at
  // xq + 32 b): lo times elements 8v .. 8v+3, hi times 8v+4 .. 8v+7.
  IE_INLINE void add_vector(int v, __m256i lo, __m256i hi, const int8_t* xq) {
    for (int b = 0; b < NB; ++b) {
      add(0, b, lo, bcast4(xq + 32 * b + 8 * v));
      add(1, b, hi, bcast4(xq + 32 * b + 8 * v + 4));
    }
  }
  // s[b] += (token b's sums - Z S) times mult (a 16-element half's
  // sub-scales), S the half's activation sum (h16: token b's pair at h16 +
  // 2 b, 16 S in each int16; Z 0, 4, 32 or 128, so Z S = 16 S * Z / 16 exactly),
  // and the sums start again for the next half.
  template <int Z>
  IE_INLINE void flush_scaled(__m256i (&s)[NB], __m256i mult, const int32_t* h16) {
    for (int b = 0; b < NB; ++b) {
      __m256i v = sum(b);
      if constexpr (Z != 0)
        v = _mm256_sub_epi32(v, _mm256_set1_epi32(static_cast<int16_t>(h16[2 * b]) * Z / 16));
      s[b] = _mm256_add_epi32(s[b], _mm256_mullo_epi32(v, mult));
    }
    *this = VnniSums();
  }
};
#endif

// Prefetch part j of n of one group of a tile, kAhead bytes ahead (the
// first activation rows read the tile from memory; later ones from L1).
// Super-block groups spread their lines over their eight sub-blocks: a
// group's lines asked for at once were measured slower.
template <int N = 1>
IE_INLINE void prefetch_group(const Rows8& p, const uint8_t* w, int b0, int j = 0) {
  if (b0 != 0) return;
  const size_t o1 = (p.group_bytes * static_cast<size_t>(j + 1) / N + 63) & ~size_t(63);
  for (size_t o = (p.group_bytes * static_cast<size_t>(j) / N + 63) & ~size_t(63); o < o1; o += 64) prefetch(w + kAhead + o);
}

// int32 per row lane, for NB tokens whose blocks lie 32 bytes apart from
// xq: the 32-block's sum of unsigned code (nibbles, and for 5-bit codes the
// fifth bits at 128) times the activation code, times mult (mult_of: 1, or
// a sub-scale; SCALED false: 1, which VNNI then skips). AVX2: 4-bit codes'
// 16 products a 16-bit lane collects stay below 16 * 15 * 127 < 2^15, one
// madd per block; 5-bit codes (HB = 32) widen after every 8 products (8 * 31
// * 127 < 2^15). VNNI: int32 sums (VnniSums). Each vector of
// codes is loaded and unpacked once for all NB tokens (vector outer, tokens
// inner): a prefill chunk pays the unpacking once per four tokens.
template <int HB, int NB, bool SCALED = true>
IE_INLINE void block_dot_n(const uint8_t* w, const int8_t* xq, __m256i mult, __m256i (&s)[NB]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
#if IE_ROWS8_VNNI
  VnniSums<NB> vs;
#else
  __m256i s16[NB];
  for (auto& v : s16) v = _mm256_setzero_si256();
#endif
  static_for<4>([&](auto vv) __attribute__((always_inline)) {
    constexpr int v = decltype(vv)::value;
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * v));
    __m256i lo = _mm256_and_si256(wv, m4), hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4);
    if constexpr (HB > 0) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128));
      lo = _mm256_or_si256(lo, bits_to_4<v>(h));
      hi = _mm256_or_si256(hi, bits_to_4<4 + v>(h));
    }
#if IE_ROWS8_VNNI
    vs.add_vector(v, lo, hi, xq);
#else
    for (int b = 0; b < NB; ++b) {
      const int8_t* xb = xq + 32 * b + 8 * v;
      s16[b] = _mm256_add_epi16(s16[b], _mm256_maddubs_epi16(lo, bcast4(xb)));
      s16[b] = _mm256_add_epi16(s16[b], _mm256_maddubs_epi16(hi, bcast4(xb + 4)));
      in_reg(s16[b]);
    }
    if constexpr (HB > 0 && v == 1) {  // 5-bit codes: widen after every 8 products
      for (int b = 0; b < NB; ++b) {
        s[b] = _mm256_madd_epi16(s16[b], mult);
        s16[b] = _mm256_setzero_si256();
      }
    }
#endif
  });
#if IE_ROWS8_VNNI
  for (int b = 0; b < NB; ++b) s[b] = SCALED ? _mm256_mullo_epi32(vs.sum(b), mult) : vs.sum(b);
#else
  for (int b = 0; b < NB; ++b)
    s[b] = HB > 0 ? _mm256_add_epi32(s[b], _mm256_madd_epi16(s16[b], mult)) : _mm256_madd_epi16(s16[b], mult);
#endif
}

// block_dot_n for one token.
template <int HB, bool SCALED = true>
IE_INLINE __m256i block_dot(const uint8_t* w, const int8_t* xq, __m256i mult) {
  __m256i s[1];
  block_dot_n<HB, 1, SCALED>(w, xq, mult, s);
  return s[0];
}

// One token against one tile of int4w: BPG blocks per group (0: p.bpg at run time),
// SB scale bytes, AFFINE (mins follow the scales; else codes are offset by 8).
template <int BPG, int SB, bool AFFINE>
IE_INLINE __m256 nib_tile(const Rows8& p, const uint8_t* w, const Q8Nat& x) {
  const int bpg = BPG > 0 ? BPG : p.bpg;
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (int64_t g = 0; g < p.groups; ++g) {
    __m256 P = _mm256_setzero_ps(), M = _mm256_setzero_ps();
    for (int kb = 0; kb < bpg; ++kb, ++k, w += 128) {
      prefetch(w + kAhead);
      prefetch(w + kAhead + 64);
      __m256i s = block_dot<0, false>(w, x.q + 32 * k, _mm256_set1_epi16(1));
      if constexpr (!AFFINE) s = _mm256_sub_epi32(s, _mm256_set1_epi32(x.s8[k]));
      P = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(x.d + k), P);
      if constexpr (AFFINE) M = _mm256_add_ps(M, _mm256_broadcast_ss(x.ds + k));
    }
    acc = _mm256_fmadd_ps(P, load8<SB>(w), acc);
    w += 8 * SB;
    if constexpr (AFFINE) {
      acc = _mm256_fmadd_ps(M, load8<SB>(w), acc);
      w += 8 * SB;
    }
  }
  return acc;
}

// Several tokens (a prefill chunk; NB = 1 for a single one): NB <= kWide
// activation rows b0 .. b0+NB of B against one tile of a type with one
// scale (and min) per group, whose bytes are read from L1 again for the
// next NB. The scales multiply per block (no per-group partial sums), which
// keeps 2 NB + 5 vectors live. HB: 32 for 5-bit codes (q5_0, q5_1), whose
// symmetric offset is 16, not 8.
template <int BPG, int SB, bool AFFINE, int HB, int NB>
IE_INLINE void nib_tile_n(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int bpg = BPG > 0 ? BPG : p.bpg;
  int64_t k = 0;
  for (int64_t g = 0; g < p.groups; ++g) {
    prefetch_group(p, w, b0);
    const uint8_t* sc = w + static_cast<size_t>(bpg) * (128 + HB);
    const __m256 scale = load8<SB>(sc);
    for (int kb = 0; kb < bpg; ++kb, ++k, w += 128 + HB) {
      const int64_t kx = k * B + b0;
      __m256i sb[NB];
      block_dot_n<HB, NB, false>(w, x.q + kx * 32, ones, sb);
      for (int b = 0; b < NB; ++b) {
        __m256i s = sb[b];
        if constexpr (!AFFINE) s = _mm256_sub_epi32(s, _mm256_set1_epi32(x.s8[kx + b] * (HB ? 2 : 1)));
        acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(scale, _mm256_broadcast_ss(x.d + kx + b)), acc[b]);
        if constexpr (AFFINE) acc[b] = _mm256_fmadd_ps(load8<SB>(sc + 8 * SB), _mm256_broadcast_ss(x.ds + kx + b), acc[b]);
      }
    }
    w += 8 * SB * (AFFINE ? 2 : 1);
  }
}

// A super-block's floats for NB tokens under Q8Super activations (one
// scale per super-block): acc += (d factor S) xd, d the eight rows' f16s at
// hd, S the tokens' integer sums over the super-block (each sub-block's
// under its sub-scale), xd their scales (the super-block's first block's).
template <int NB>
IE_INLINE void super_finish(const uint8_t* hd, float factor, const float* xd, const __m256i (&S)[NB], __m256 (&acc)[NB]) {
  const __m256 d = _mm256_mul_ps(load8<2>(hd), _mm256_set1_ps(factor));  // (exact: a power of two)
  for (int b = 0; b < NB; ++b)
    acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(S[b])), _mm256_broadcast_ss(xd + b), acc[b]);
}

// The mins of q4_k and q5_k (one super-block of eight rows, MINS' bytes:
// sub-blocks 0..3 in lo, 4..7 in hi) against a token's eight activation
// code sums (Q8Nat::p16 at p), as integers: the sum of min j times sum j,
// by madd over the pairs (0, 2), (1, 3), (4, 6), (5, 7).
IE_INLINE __m256i kq_min_sum(__m256i lo, __m256i hi, const int32_t* p) {
  const __m256i m = _mm256_set1_epi32(0x00FF00FF);
  auto pairs = [&](__m256i v, int odd) { return _mm256_and_si256(odd ? _mm256_srli_epi32(v, 8) : v, m); };
  __m256i n = _mm256_madd_epi16(pairs(lo, 0), _mm256_set1_epi32(p[0]));
  n = _mm256_add_epi32(n, _mm256_madd_epi16(pairs(lo, 1), _mm256_set1_epi32(p[1])));
  n = _mm256_add_epi32(n, _mm256_madd_epi16(pairs(hi, 0), _mm256_set1_epi32(p[2])));
  return _mm256_add_epi32(n, _mm256_madd_epi16(pairs(hi, 1), _mm256_set1_epi32(p[3])));
}

// q4_k and q5_k tiles (Q5: fifth bits) under Q8Super activations (one
// scale per super-block, as llama.cpp's q8_K): per super-block, the eight
// rows' packed 6-bit sub-scales and mins unpack as three word vectors (the
// formulas of q4k_sub, eight rows at once); sub-block j's scales multiply
// inside the madd that widens its products (int16 pairs), and the eight
// sub-blocks' sums add up as integers, as do the mins times the
// activation's code sums (kq_min_sum). The floats then come once per
// super-block and token: (d S - dmin N) times the activation's scale.
template <bool Q5, int NB>
IE_INLINE void kq_tile_n(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) {
  using H = Rows8KqHeader;
  constexpr int kBlock = 32 * rows8_code_bits(Q5 ? WType::Q5_K : WType::Q4_K);
  const __m256i m3f = _mm256_set1_epi8(0x3F), m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    auto word = [h](int k) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + H::words + 32 * k)); };
    const __m256i ls[2] = {_mm256_and_si256(word(0), m3f), _mm256_or_si256(_mm256_and_si256(word(2), m0f),
                                                                          _mm256_and_si256(_mm256_srli_epi32(word(0), 2), m30))};
    __m256i S[NB];
    for (auto& v : S) v = _mm256_setzero_si256();
    for_sub_blocks<NB>([&](int j) __attribute__((always_inline)) {
      prefetch_group<8>(p, w, b0, j);
      const __m256i sc16 = mult_of_byte(j < 4 ? ls[0] : ls[1], j % 4);
      const int64_t kx = (g * 8 + j) * B + b0;
      __m256i sb[NB];
      block_dot_n<Q5 ? 32 : 0, NB>(w + j * kBlock, x.q + kx * 32, sc16, sb);
      for (int b = 0; b < NB; ++b) {
        S[b] = _mm256_add_epi32(S[b], sb[b]);
        in_reg(S[b]);
      }
    });
    // The mins after the products, so that their words are not live beside the tokens' sums.
    const __m256i lm[2] = {_mm256_and_si256(word(1), m3f), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(word(2), 4), m0f),
                                                                          _mm256_and_si256(_mm256_srli_epi32(word(1), 2), m30))};
    const __m256 d = load8<2>(h + H::d), dmin = load8<2>(h + H::dmin);
    const int64_t kg = g * 8 * B + b0;  // the super-block's first block
    for (int b = 0; b < NB; ++b) {
      const __m256i n = kq_min_sum(lm[0], lm[1], x.p16 + 4 * (g * B + b0 + b));
      const __m256 t = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(n), _mm256_mul_ps(d, _mm256_cvtepi32_ps(S[b])));
      acc[b] = _mm256_fmadd_ps(t, _mm256_broadcast_ss(x.d + kg + b), acc[b]);
    }
  }
}

// int32 per row lane: s + the 4-element dot product of signed int8 values w
// (lane i = row i) with the activation bytes xq[0..3], times mult's int16
// pairs (1, or a sub-scale). maddubs multiplies unsigned by signed, so w's
// sign moves onto x (|w| <= 128 read unsigned); one pair of products
// already reaches 2 * 128 * 127, so each result is widened at once.
IE_INLINE __m256i dot4_signed16(__m256i w, const int8_t* xq) {
  return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(bcast4(xq), w));
}
IE_INLINE __m256i dot4_signed(__m256i s, __m256i w, const int8_t* xq, __m256i mult) {
  return _mm256_add_epi32(s, _mm256_madd_epi16(dot4_signed16(w, xq), mult));
}

// Table values of the 4-bit layout's vector at w: low and high nibbles
// through grid_values(T) (one in-lane shuffle each). VNNI: offset by 128 (a
// flipped top bit), read as unsigned bytes; the kernel takes 128 times the
// block's activation sum (16 s8) off.
// ADD: an offset added to every table value instead (AVX2's mxfp4 tiles: v + 16, read unsigned).
template <WType T, int ADD = 0>
IE_INLINE void table_values(const uint8_t* w, __m256i* lo, __m256i* hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grid_values(T))));
  if constexpr (ADD != 0) table = _mm256_add_epi8(table, _mm256_set1_epi8(static_cast<char>(ADD)));
  else if constexpr (IE_ROWS8_VNNI) table = _mm256_xor_si256(table, _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  *lo = _mm256_shuffle_epi8(table, _mm256_and_si256(wv, m4));
  *hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4));
}

// The offset AVX2's mxfp4 and iq3_s tiles read their values with (v + 16
// >= 1, below 2^15 after 8 products with x): a multiple of 8, as Q8Nat's
// s8 is 8 times a block's code sum, so the offset's share is kUnsignedOffset / 8 s8.
constexpr int kUnsignedOffset = 16;
constexpr bool unsigned_fits(const Grid16& g) { return 8 * (grid_abs_max(g) + kUnsignedOffset) * 127 < 32768; }

// Vector v (0..3) of a 32-block whose values table_values read unsigned
// (v + ADD), for NB tokens whose blocks lie 32 bytes apart from xq: the
// products of its low and high nibbles' values summed in int16 over each
// half block (half[b]: 8 per 16-bit lane, the callers bound them below
// 2^15), widened into s[b] by mult's int16 pairs as each half ends.
template <int NB>
IE_INLINE void add_unsigned_vector(int v, __m256i lo, __m256i hi, const int8_t* xq, __m256i mult, __m256i (&half)[NB],
                                   __m256i (&s)[NB]) {
  for (int b = 0; b < NB; ++b) {
    const int8_t* xb = xq + b * 32 + 8 * v;
    const __m256i q = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xb)), _mm256_maddubs_epi16(hi, bcast4(xb + 4)));
    half[b] = v % 2 == 0 ? q : _mm256_add_epi16(half[b], q);
    if (v % 2 == 1) s[b] = _mm256_add_epi32(s[b], _mm256_madd_epi16(half[b], mult));
    in_reg(s[b]);
  }
}

// Tiles whose values are signed int8 with one scale per 32-block: q8_0's
// as stored (eight vectors per block, vector v = elements 4v .. 4v+3),
// iq4_nl's and mxfp4's through their tables (the 4-bit layout: four
// vectors, each nibble an index). Then the eight rows' scales (f16; mxfp4:
// E8M0 bytes).
template <WType T, int NB>
IE_INLINE void signed_tile_n(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) {
  constexpr bool kTable = T != WType::Q8_0;
  constexpr int kCodes = kTable ? 128 : 256;
  // mxfp4's values (|v| <= 12) read unsigned as v + 16 (4..28), so maddubs
  // needs no sign moves: the 8 products a 16-bit lane collects over half a
  // block stay below 2^15, so they sum in int16 and one madd per half block
  // widens them; 16 sum x (2 s8) comes off per block. iq4_nl's values reach
  // 127: their sign moves onto x, one madd per product vector.
  constexpr bool kUnsigned = T == WType::MXFP4;
  static_assert(!kUnsigned || unsigned_fits(kMxfp4Grid), "mxfp4's half-block sums would wrap in int16");
#if IE_ROWS8_VNNI
  // the values read unsigned, v + 128 (table_values; q8_0's bytes with a flipped top bit), and 128 sum x
  // (16 s8) taken off per block
  for (int64_t k = 0; k < p.groups; ++k, w += p.group_bytes) {
    prefetch_group(p, w, b0);
    const int64_t kx = k * B + b0;
    VnniSums<NB> vs;
    __m256i s[NB];
    for (int v = 0; v < kCodes / 32; ++v) {
      if constexpr (kTable) {
        __m256i lo, hi;
        table_values<T>(w + 32 * v, &lo, &hi);
        vs.add_vector(v, lo, hi, x.q + kx * 32);
      } else {
        const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * v)),
                                           _mm256_set1_epi8(static_cast<char>(0x80)));
        for (int b = 0; b < NB; ++b) vs.add(v % 2, b, u, bcast4(x.q + (kx + b) * 32 + 4 * v));
      }
    }
    for (int b = 0; b < NB; ++b) s[b] = _mm256_sub_epi32(vs.sum(b), _mm256_set1_epi32(16 * x.s8[kx + b]));
#else
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < p.groups; ++k, w += p.group_bytes) {
    prefetch_group(p, w, b0);
    const int64_t kx = k * B + b0;
    __m256i s[NB];
    for (auto& v : s) v = _mm256_setzero_si256();
    __m256i h[NB] = {};  // kUnsigned: a half block's products
    for (int v = 0; v < kCodes / 32; ++v) {
      if constexpr (kUnsigned) {
        __m256i lo, hi;
        table_values<T, kUnsignedOffset>(w + 32 * v, &lo, &hi);
        add_unsigned_vector<NB>(v, lo, hi, x.q + kx * 32, ones, h, s);
      } else if constexpr (kTable) {
        __m256i lo, hi;
        table_values<T>(w + 32 * v, &lo, &hi);
        for (int b = 0; b < NB; ++b) {
          const int8_t* xq = x.q + (kx + b) * 32 + 8 * v;
          s[b] = dot4_signed(dot4_signed(s[b], lo, xq, ones), hi, xq + 4, ones);
          in_reg(s[b]);
        }
      } else {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * v));
        for (int b = 0; b < NB; ++b) {
          s[b] = dot4_signed(s[b], wv, x.q + (kx + b) * 32 + 4 * v, ones);
          in_reg(s[b]);
        }
      }
    }
    if constexpr (kUnsigned)
      for (int b = 0; b < NB; ++b)
        s[b] = _mm256_sub_epi32(s[b], _mm256_set1_epi32(kUnsignedOffset / 8 * x.s8[kx + b]));
#endif
    const __m256 d = load8<T == WType::MXFP4 ? 1 : 2>(w + kCodes);
    for (int b = 0; b < NB; ++b)
      acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[b]), _mm256_mul_ps(d, _mm256_broadcast_ss(x.d + kx + b)), acc[b]);
  }
}

// iq4_xsh's grid shifts of sub-block j of the eight rows whose header is at
// h: all ones in the lanes of the rows whose bit j is set.
IE_INLINE __m256i xsh_lanes(const uint8_t* h, int j) {
  const __m256i bits = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h + Rows8Iq4xsHeader::shifts)));
  const __m256i bit = _mm256_set1_epi32(1 << j);
  return _mm256_cmpeq_epi32(_mm256_and_si256(bits, bit), bit);
}

// iq4_xs tiles (and iq3_xxs's and iq2_xxs's, the same with their tables and d / 4, d / 8; iq3_s's, on AVX2
// read unsigned as v + 16; iq4_xsh's, each sub-block's values shifted by
// xsh_shifts): per sub-block j, the eight rows' 6-bit sub-scales l - 32
// unpacked at once from scales_l and scales_h, multiplied inside the madds
// that widen the products; the sub-blocks' sums added as integers, the
// floats once per super-block (super_finish).
template <WType T, int NB>
IE_INLINE void iq4xs_tile_n(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) {
  using H = Rows8Iq4xsHeader;
  constexpr int kBlock = 32 * rows8_code_bits(T);
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    const __m256i ls_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + H::scales_l));
    const __m256i ls_hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + H::scales_h)));
    __m256i S[NB];
    for (auto& v : S) v = _mm256_setzero_si256();
    for_sub_blocks<NB>([&](int j) __attribute__((always_inline)) {
      prefetch_group<8>(p, w, b0, j);
      const __m256i lo4 = _mm256_and_si256(_mm256_srl_epi32(ls_lo, _mm_cvtsi32_si128(4 * j)), _mm256_set1_epi32(0xF));
      const __m256i hi2 = _mm256_and_si256(_mm256_srl_epi32(ls_hi, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi32(3));
      const __m256i mult = mult_of(_mm256_sub_epi32(_mm256_or_si256(lo4, _mm256_slli_epi32(hi2, 4)), _mm256_set1_epi32(32)));
      const int64_t kx = (g * 8 + j) * B + b0;
      // iq4_xsh: the shifted rows' lanes, and kIq4ShiftStep in each of their bytes
      const __m256i shifted = T == WType::IQ4_XSH ? xsh_lanes(h, j) : _mm256_setzero_si256();
      const __m256i sh = _mm256_and_si256(shifted, _mm256_set1_epi8(kIq4ShiftStep));
      __m256i s[NB];
      for (auto& v : s) v = _mm256_setzero_si256();
#if IE_ROWS8_VNNI  // the values offset by 128 (table_values), 128 sum x (16 s8) taken off per block
      // iq4_xsh with one or two tokens: the shift as (v + 4) x = v x + 4 sum x, 4 sum x = s8 / 2 added in
      // the shifted lanes per token, fewer operations than 8 byte adds per block (decode: iq4_xsh's GEMV
      // 16384 x 8192 at 2 threads 3.5-3.9 -> 3.2-3.3 ms, iq4_xs's 3.1-3.2); from three tokens the adds.
      constexpr bool kFold = T == WType::IQ4_XSH && NB <= 2;
      VnniSums<NB> vs;
      for (int v = 0; v < 4; ++v) {
        __m256i lo, hi;
        table_values<T>(w + j * kBlock + 32 * v, &lo, &hi);
        if constexpr (T == WType::IQ4_XSH && !kFold) lo = _mm256_add_epi8(lo, sh), hi = _mm256_add_epi8(hi, sh);
        vs.add_vector(v, lo, hi, x.q + kx * 32);
      }
      for (int b = 0; b < NB; ++b) {
        __m256i t = _mm256_sub_epi32(vs.sum(b), _mm256_set1_epi32(16 * x.s8[kx + b]));
        if constexpr (kFold) t = _mm256_add_epi32(t, _mm256_and_si256(shifted, _mm256_set1_epi32(x.s8[kx + b] / 2)));
        s[b] = _mm256_mullo_epi32(t, mult);
      }
#else
      if constexpr (T == WType::IQ3_S) {
        // iq3_s's values (|v| <= 15) read unsigned as v + 16, as mxfp4's (signed_tile_n): no sign moves, the
        // products summed in int16 over half a block, one madd by the sub-scales per half; sc 16 sum x comes
        // off per block, as a madd of the sub-scale pairs by (s8, s8) (s8 = 8 sum x fits int16).
        static_assert(unsigned_fits(kIq3sGrid), "iq3_s's half-block sums would wrap in int16");
        static_assert(kUnsignedOffset == 16, "the madd by (s8, s8) below takes off 2 s8 = 16 sum x");
        __m256i half[NB] = {};
        for (int b = 0; b < NB; ++b)
          s[b] = _mm256_sub_epi32(s[b], _mm256_madd_epi16(mult, _mm256_set1_epi16(static_cast<int16_t>(x.s8[kx + b]))));
        for (int v = 0; v < 4; ++v) {
          __m256i lo, hi;
          table_values<T, kUnsignedOffset>(w + j * kBlock + 32 * v, &lo, &hi);
          add_unsigned_vector<NB>(v, lo, hi, x.q + kx * 32, mult, half, s);
        }
      } else {
        for (int v = 0; v < 4; ++v) {
          __m256i lo, hi;
          table_values<T>(w + j * kBlock + 32 * v, &lo, &hi);
          if constexpr (T == WType::IQ4_XSH) lo = _mm256_add_epi8(lo, sh), hi = _mm256_add_epi8(hi, sh);
          for (int b = 0; b < NB; ++b) {
            const int8_t* xq = x.q + (kx + b) * 32 + 8 * v;
            s[b] = dot4_signed(dot4_signed(s[b], lo, xq, mult), hi, xq + 4, mult);
            in_reg(s[b]);
          }
        }
      }
#endif
      for (int b = 0; b < NB; ++b) {
        S[b] = _mm256_add_epi32(S[b], s[b]);
        in_reg(S[b]);
      }
    });
    super_finish<NB>(h + H::d, rows8_d_factor(T), x.d + g * 8 * B + b0, S, acc);
  }
}

// int32 per row lane, for NB tokens whose blocks lie 32 bytes apart from
// xq: a 32-block of q2_k's bit-pair codes (0..3) or, with THIRD, q3_k's
// (0..7: the third bits in the vector at 64) times the activation codes.
// Each 16-element half's products sum in int16 (8 per lane: at most 8 * 7
// * 127 < 2^15), then one madd widens them by the half's sub-scales
// mult[half] (mult_of: int16 pairs); VNNI: in int32 by dpbusd, times
// mult[half] by one vpmulld.
template <bool THIRD, int NB>
IE_INLINE void pairs_block_dot_n(const uint8_t* blk, const int8_t* xq, const __m256i (&mult)[2], __m256i (&s)[NB],
                                 [[maybe_unused]] const int32_t* h16) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i hb = THIRD ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64)) : _mm256_setzero_si256();
  for (auto& v : s) v = _mm256_setzero_si256();
#if IE_ROWS8_VNNI
  VnniSums<NB> vs;
#else
  __m256i s16[NB];
  for (auto& v : s16) v = _mm256_setzero_si256();
#endif
  static_for<4>([&](auto vv) __attribute__((always_inline)) {
    constexpr int v = decltype(vv)::value;
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * (v / 2)));
    __m256i lo = _mm256_and_si256(_mm256_srli_epi16(wv, 4 * (v % 2)), m3);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4 * (v % 2) + 2), m3);
    if constexpr (THIRD) {
      lo = _mm256_or_si256(lo, bits_to<v, 2>(hb));
      hi = _mm256_or_si256(hi, bits_to<4 + v, 2>(hb));
    }
#if IE_ROWS8_VNNI
    vs.add_vector(v, lo, hi, xq);
    if constexpr (v % 2 == 1) vs.template flush_scaled<THIRD ? 4 : 0>(s, mult[v / 2], h16 + v / 2);  // a half done
#else
    for (int b = 0; b < NB; ++b) {
      const int8_t* xb = xq + 32 * b + 8 * v;
      s16[b] = _mm256_add_epi16(s16[b], _mm256_maddubs_epi16(lo, bcast4(xb)));
      s16[b] = _mm256_add_epi16(s16[b], _mm256_maddubs_epi16(hi, bcast4(xb + 4)));
      in_reg(s16[b]);
    }
    if constexpr (v % 2 == 1) {  // a 16-element half done: widen by its sub-scales
      for (int b = 0; b < NB; ++b) {
        s[b] = _mm256_add_epi32(s[b], _mm256_madd_epi16(s16[b], mult[v / 2]));
        s16[b] = _mm256_setzero_si256();
      }
    }
#endif
  });
}

// The int32 sums of a q6_k 32-block (codes 0..63: a nibble and a bit pair)
// or a half_scaled_book one (its nibbles' table values: iq2_xs's, iq2_s's
// +-8, 25, 43, iq1_s's and iq1_m's -9, -7, -1, 1, 7, 9:
// table_values) times x, each half's times its sub-scales mult[half]
// (mult_of). AVX2: q6_k's codes by maddubs (the four products a 16-bit lane
// collects per vector stay below 4 * 63 * 127 < 2^15), the table values with
// their signs moved onto x (dot4_signed16), widened per vector by a madd
// with mult (int16 pairs); VNNI: each half's dpbusd sums, less Z times its
// activation sum (q6_k 32, the table types' offset 128), times mult by
// one vpmulld.
template <WType T, int NB>
IE_INLINE void sym16_block_dot_n(const uint8_t* blk, const int8_t* xq, const __m256i (&mult)[2], __m256i (&s)[NB],
                                 [[maybe_unused]] const int32_t* h16) {
  constexpr bool kBook = half_scaled_book(T);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (auto& v : s) v = _mm256_setzero_si256();
#if IE_ROWS8_VNNI
  VnniSums<NB> vs;
#endif
  static_for<4>([&](auto vv) __attribute__((always_inline)) {
    constexpr int v = decltype(vv)::value;
    __m256i lo, hi;
    if constexpr (kBook) {
      table_values<T>(blk + 32 * v, &lo, &hi);
    } else {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * v));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * (v / 2)));
      lo = _mm256_or_si256(_mm256_and_si256(wv, m4), bits_to_4<4 * (v % 2), 2>(hb));
      hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(wv, 4), m4), bits_to_4<4 * (v % 2) + 2, 2>(hb));
    }
#if IE_ROWS8_VNNI
    vs.add_vector(v, lo, hi, xq);
    if constexpr (v % 2 == 1) vs.template flush_scaled<kBook ? 128 : 32>(s, mult[v / 2], h16 + v / 2);  // a half done
#else
    for (int b = 0; b < NB; ++b) {
      const int8_t* xb = xq + 32 * b + 8 * v;
      const __m256i s16 = kBook ? _mm256_add_epi16(dot4_signed16(lo, xb), dot4_signed16(hi, xb + 4))
                               : _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xb)), _mm256_maddubs_epi16(hi, bcast4(xb + 4)));
      s[b] = _mm256_add_epi32(s[b], _mm256_madd_epi16(s16, mult[v / 2]));
      in_reg(s[b]);
    }
#endif
  });
}

// Sub-scales l_j (0..63) of q3_k's sub-blocks 4Q .. 4Q + 3 of the eight
// rows (byte j % 4 of each lane), from the three scale words: their low
// nibbles from word Q % 2 (shifted by 4 for Q >= 2), their high bit pairs
// from bits 2Q of word 2's bytes.
IE_INLINE __m256i q3k_scale_word(__m256i w0, __m256i w1, __m256i w2, int q) {
  const __m256i lo =
      _mm256_and_si256(_mm256_srl_epi32(q % 2 ? w1 : w0, _mm_cvtsi32_si128(4 * (q / 2))), _mm256_set1_epi8(0x0F));
  const __m256i hi = _mm256_and_si256(_mm256_srl_epi32(w2, _mm_cvtsi32_si128(2 * q)), _mm256_set1_epi8(3));
  return _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4));
}

// q6_k and q3_k tiles (symmetric codes under 16-element sub-blocks, w =
// d * sc_j * (q - Z), Z = 32 or 4): per 32-block the eight rows' two
// sub-scales (mult_of: int16 pairs on AVX2; q6_k: its int8 ones from the header; q3_k:
// unpacked from its three scale words, less 32), the block's sums
// (sym16_block_dot_n, pairs_block_dot_n with the third bits), less the
// offset: Z (sc_a sum x[0..15] + sc_b sum x[16..31]), two madds of the
// activation's h16 pairs (32 sc sum per half; q3_k takes an eighth,
// exactly); VNNI takes Z sum off each half's sums before its sub-scale
// multiplies them (VnniSums::flush_scaled), one subtraction per half and
// token instead of two madds. The blocks' sums add up as integers, the
// floats come once per super-block (super_finish). The half_scaled_book
// types' (iq2_xs, iq2_s, iq1_s, iq1_m)
// tiles are q6_k's with signed table values for codes (sym16_block_dot_n: no
// offset on AVX2) and d read as d / 8.
template <WType T, int NB>
IE_INLINE void sym16_tile_n(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) {
  constexpr int kBlock = 32 * rows8_code_bits(T);
  constexpr bool kBook = half_scaled_book(T);  // q6_k's header, table values
  constexpr int kD = T == WType::Q3_K ? Rows8Q3kHeader::d : Rows8Q6kHeader::d;
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    __m256i words[3];  // q3_k's scale words, once per super-block
    if constexpr (T == WType::Q3_K)
      for (int k = 0; k < 3; ++k)
        words[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + Rows8Q3kHeader::words + 32 * k));
    __m256i S[NB];
    for (auto& v : S) v = _mm256_setzero_si256();
    for_sub_blocks<NB>([&](int j) __attribute__((always_inline)) {
      prefetch_group<8>(p, w, b0, j);
      const uint8_t* blk = w + j * kBlock;
      __m256i mult[2];  // elements 0..15 and 16..31 of the block (mult_of)
      if constexpr (T != WType::Q3_K) {
        for (int half = 0; half < 2; ++half)
          mult[half] = mult_of(_mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(h + Rows8Q6kHeader::scales + 16 * j + 8 * half))));
      } else {
        const __m256i sc = q3k_scale_word(words[0], words[1], words[2], j / 2);
        const __m256i k32 = _mm256_set1_epi32(32);
        mult[0] = mult_of(_mm256_sub_epi32(lane_byte<false>(sc, (2 * j) % 4), k32));
        mult[1] = mult_of(_mm256_sub_epi32(lane_byte<false>(sc, (2 * j + 1) % 4), k32));
      }
      const int64_t kx = (g * 8 + j) * B + b0;
      __m256i s[NB];
      if constexpr (T == WType::Q3_K) pairs_block_dot_n<true, NB>(blk, x.q + kx * 32, mult, s, x.h16 + 2 * kx);
      else sym16_block_dot_n<T, NB>(blk, x.q + kx * 32, mult, s, x.h16 + 2 * kx);
      for (int b = 0; b < NB; ++b) {
        // VNNI took the offsets off per half, before the sub-scales; the table types' signed values have none
        if constexpr (!IE_ROWS8_VNNI && !kBook) {
          const int32_t* h16 = x.h16 + 2 * (kx + b);
          const __m256i off32 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_set1_epi32(h16[0]), mult[0]),
                                                 _mm256_madd_epi16(_mm256_set1_epi32(h16[1]), mult[1]));
          s[b] = _mm256_sub_epi32(s[b], T == WType::Q6_K ? off32 : _mm256_srai_epi32(off32, 3));
        }
        S[b] = _mm256_add_epi32(S[b], s[b]);
        in_reg(S[b]);
      }
    });
    super_finish<NB>(h + kD, rows8_d_factor(T), x.d + g * 8 * B + b0, S, acc);
  }
}

// q2_k tiles: codes 0..3 (bit pairs) times x by maddubs; a 16-element
// half's two vectors sum in int16 before one madd with its 4-bit sub-scales
// (int16 pairs from the four scale words, eight rows at once). The mins
// meet the activation's h16 pairs (32 m sum per half) in one madd per half;
// both sums add up as integers over the super-block, then (d S - dmin / 32
// M) (dmin / 32 exact) times x's scale, once per super-block and token.
template <int NB>
IE_INLINE void q2k_tile_n(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) {
  using H = Rows8Q2kHeader;
  constexpr int kBlock = 32 * rows8_code_bits(WType::Q2_K);
  const __m256i m0f = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    __m256i S[NB], M[NB];
    for (auto& v : S) v = _mm256_setzero_si256();
    for (auto& v : M) v = _mm256_setzero_si256();
    for_sub_blocks<NB>([&](int j) __attribute__((always_inline)) {
      prefetch_group<8>(p, w, b0, j);
      const uint8_t* blk = w + j * kBlock;
      // word j / 2: the bytes of sub-blocks 4 (j / 2) .. +3, of which 2j % 4 and 2j % 4 + 1 are this block's
      const __m256i word = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + H::words + 32 * (j / 2)));
      const __m256i sc = _mm256_and_si256(word, m0f), mn = _mm256_and_si256(_mm256_srli_epi32(word, 4), m0f);
      const __m256i mult[2] = {mult_of_byte(sc, (2 * j) % 4), mult_of_byte(sc, (2 * j + 1) % 4)};
      const __m256i mins[2] = {lane_byte<true>(mn, (2 * j) % 4), lane_byte<true>(mn, (2 * j + 1) % 4)};
      const int64_t kx = (g * 8 + j) * B + b0;
      __m256i s[NB];
      pairs_block_dot_n<false, NB>(blk, x.q + kx * 32, mult, s, x.h16 + 2 * kx);
      for (int b = 0; b < NB; ++b) {
        const int32_t* h16 = x.h16 + 2 * (kx + b);
        M[b] = _mm256_add_epi32(M[b], _mm256_add_epi32(_mm256_madd_epi16(_mm256_set1_epi32(h16[0]), mins[0]),
                                                        _mm256_madd_epi16(_mm256_set1_epi32(h16[1]), mins[1])));
        S[b] = _mm256_add_epi32(S[b], s[b]);
      }
    });
    const __m256 d = load8<2>(h + H::d);
    const __m256 dmin32 = _mm256_mul_ps(load8<2>(h + H::dmin), _mm256_set1_ps(1.f / 32.f));
    const int64_t kg = g * 8 * B + b0;  // the super-block's first block: its activation scale (Q8Super)
    for (int b = 0; b < NB; ++b) {
      const __m256 t = _mm256_fnmadd_ps(dmin32, _mm256_cvtepi32_ps(M[b]), _mm256_mul_ps(d, _mm256_cvtepi32_ps(S[b])));
      acc[b] = _mm256_fmadd_ps(t, _mm256_broadcast_ss(x.d + kg + b), acc[b]);
    }
  }
}

// fn(SB, AFFINE) as compile-time constants for a 4-bit copy's scale width and zero point.
template <class Fn>
IE_INLINE auto with_nib_params(const Rows8& p, Fn&& fn) {
  using F = std::false_type;
  using T = std::true_type;
  using S2 = std::integral_constant<int, 2>;
  using S4 = std::integral_constant<int, 4>;
  if (p.scale_bytes == 4) return p.affine ? fn(S4{}, T{}) : fn(S4{}, F{});
  return p.affine ? fn(S2{}, T{}) : fn(S2{}, F{});
}

// Tokens per pass over a tile when a chunk has them: AVX-512's 32 vector
// registers hold eight tokens' sums (AVX2's and AVX-VNNI's 16: four).
constexpr int kWide = IE_ROWS8_ZMM ? 8 : 4;

#if IE_ROWS8_ZMM
// GCC 12's 512-bit intrinsics pass _mm512_undefined_* as the merge operand of
// their unmasked builtins, which -O3 inlining reports as uninitialized reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "rows8_pairs.h"
#if IE_ROWS8_AMX
#include "rows8_amx.h"
#endif
#pragma GCC diagnostic pop
#endif

// A tile kernel: activation rows b0 .. b0+NB (of B) against the tile at w.
template <int NB>
using TileKernel = void (*)(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]);

// Kernel K as a function of its own, chosen once per call (TileKernels):
// its accumulators are local and live in registers. One function whose
// switch over the types inlined every kernel kept them in memory for all
// (zeroed by a rep stos per call, stored after every block), and `out`,
// the caller's memory, may alias the activation's float scales, so adding
// into it made the compiler store every accumulator after every block and
// reload x's pointers. So the kernel adds into a local array, copied out once.
template <int NB, TileKernel<NB> K>
void tile_fn(const Rows8& p, const uint8_t* w, const Q8Nat& xr, int B, int b0, __m256 (&out)[NB]) {
  const Q8Nat x = xr;
  __m256 acc[NB];
  for (auto& v : acc) {  // zeroed in registers: GCC zeroes a spilled array with a rep stos, slow to start
    v = _mm256_setzero_ps();
    in_reg(v);
  }
  K(p, w, x, B, b0, acc);
  for (int b = 0; b < NB; ++b) out[b] = acc[b];
}

// One token against an int4w tile whose groups hold several blocks:
// nib_tile sums a group's blocks first and applies the scale once (one
// multiply per group, measured faster on int4w g64 than nib_tile_n).
template <int BPG, int SB, bool AFFINE>
void nib_tile_fn(const Rows8& p, const uint8_t* w, const Q8Nat& x, int, int, __m256 (&out)[1]) {
  out[0] = nib_tile<BPG, SB, AFFINE>(p, w, x);
}

// The kernel of p's type for NB activation rows (SINGLE: one token, B = 1).
template <int NB, bool SINGLE = false>
TileKernel<NB> tile_kernel(const Rows8& p) {
  switch (p.spec.type) {
    case WType::Q8_0: return tile_fn<NB, signed_tile_n<WType::Q8_0, NB>>;
    case WType::IQ4_NL: return tile_fn<NB, signed_tile_n<WType::IQ4_NL, NB>>;
    case WType::MXFP4: return tile_fn<NB, signed_tile_n<WType::MXFP4, NB>>;
    case WType::Q5_0: return tile_fn<NB, nib_tile_n<1, 2, false, 32, NB>>;
    case WType::Q5_1: return tile_fn<NB, nib_tile_n<1, 2, true, 32, NB>>;
    case WType::Q4_K: return tile_fn<NB, kq_tile_n<false, NB>>;
    case WType::Q5_K: return tile_fn<NB, kq_tile_n<true, NB>>;
    case WType::IQ4_XS: return tile_fn<NB, iq4xs_tile_n<WType::IQ4_XS, NB>>;
    case WType::Q6_K: return tile_fn<NB, sym16_tile_n<WType::Q6_K, NB>>;
    case WType::Q3_K: return tile_fn<NB, sym16_tile_n<WType::Q3_K, NB>>;
    case WType::IQ2_XS: return tile_fn<NB, sym16_tile_n<WType::IQ2_XS, NB>>;
    case WType::IQ2_S: return tile_fn<NB, sym16_tile_n<WType::IQ2_S, NB>>;
    case WType::IQ1_S: return tile_fn<NB, sym16_tile_n<WType::IQ1_S, NB>>;
    case WType::IQ1_M: return tile_fn<NB, sym16_tile_n<WType::IQ1_M, NB>>;
    case WType::Q2_K: return tile_fn<NB, q2k_tile_n<NB>>;
    case WType::IQ3_S: return tile_fn<NB, iq4xs_tile_n<WType::IQ3_S, NB>>;
    case WType::IQ3_XXS: return tile_fn<NB, iq4xs_tile_n<WType::IQ3_XXS, NB>>;
    case WType::IQ2_XXS: return tile_fn<NB, iq4xs_tile_n<WType::IQ2_XXS, NB>>;
    case WType::IQ4_XSH: return tile_fn<NB, iq4xs_tile_n<WType::IQ4_XSH, NB>>;
    case WType::Int4w:  // scale width and affinity chosen at run time
    case WType::Q4_0:
    case WType::Q4_1:
      return with_nib_params(p, [&](auto sb, auto aff) -> TileKernel<NB> {
        constexpr int SB = decltype(sb)::value;
        constexpr bool AFF = decltype(aff)::value;
        if constexpr (SINGLE) {
          if (p.spec.type == WType::Int4w && p.bpg >= 2) {
            if (p.bpg == 2) return nib_tile_fn<2, SB, AFF>;
            if (p.bpg == 4) return nib_tile_fn<4, SB, AFF>;
            return nib_tile_fn<0, SB, AFF>;
          }
        }
        if (p.bpg == 1) return tile_fn<NB, nib_tile_n<1, SB, AFF, 0, NB>>;
        if (p.bpg == 2) return tile_fn<NB, nib_tile_n<2, SB, AFF, 0, NB>>;
        return tile_fn<NB, nib_tile_n<0, SB, AFF, 0, NB>>;
      });
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:  // no row-interleaved copy (rows8_applies): a float Rows8 has no tiles to run
    case WType::F16:
    case WType::BF16: break;
  }
  return nullptr;
}

// The kernels of one matrix: one token alone, 1..4 of a batch, and kWide
// (all null for no matrix).
struct TileKernels {
  TileKernel<1> single = nullptr, n1 = nullptr;
  TileKernel<2> n2 = nullptr;
  TileKernel<3> n3 = nullptr;
  TileKernel<4> n4 = nullptr;
  TileKernel<kWide> wide = nullptr;
#if IE_ROWS8_ZMM
  PairKernel pair = nullptr;  // two tiles, eight tokens (rows8_pairs.h)
#endif
#if IE_ROWS8_AMX
  AmxKernel amx = nullptr;  // two tiles, sixteen tokens (rows8_amx.h); null: the pair kernel runs them
#endif
  TileKernels() = default;
  explicit TileKernels(const Rows8& p)
      : single(tile_kernel<1, true>(p)), n1(tile_kernel<1>(p)), n2(tile_kernel<2>(p)), n3(tile_kernel<3>(p)),
        n4(tile_kernel<4>(p)), wide(kWide > 4 ? tile_kernel<kWide>(p) : nullptr)
#if IE_ROWS8_ZMM
        , pair(pair_kernel(p))
#endif
#if IE_ROWS8_AMX
        , amx(amx_kernel(p))
#endif
  {}
  // Activation rows b0 .. b0+NB (of B) against p's tile at w.
  template <int NB>
  void run(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m256 (&acc)[NB]) const {
    if constexpr (NB == 1) (B == 1 ? single : n1)(p, w, x, B, b0, acc);
    if constexpr (NB == 2) n2(p, w, x, B, b0, acc);
    if constexpr (NB == 3) n3(p, w, x, B, b0, acc);
    if constexpr (NB == 4) n4(p, w, x, B, b0, acc);
    if constexpr (NB == kWide && kWide > 4) wide(p, w, x, B, b0, acc);
  }
};

// Rows r0 .. r0 + n (n <= 8) of y from one tile's vector.
void store_tile(__m256 acc, const float* bias, float* y, int64_t r0, int64_t n) {
  if (bias) {
    alignas(32) float b8[8] = {};
    std::memcpy(b8, bias + r0, static_cast<size_t>(n) * sizeof(float));
    acc = _mm256_add_ps(acc, _mm256_load_ps(b8));
  }
  if (n == 8) {
    _mm256_storeu_ps(y + r0, acc);
    return;
  }
  alignas(32) float o8[8];
  _mm256_store_ps(o8, acc);
  std::memcpy(y + r0, o8, static_cast<size_t>(n) * sizeof(float));
}

// A 4 x 4 transpose of 32-bit words per lane: r[i]'s lanes are rows i and
// i + 4, each its four words of a tile block; vector v of the block gets
// word v of rows 0..7 (rows8.h).
IE_INLINE void transpose4(const __m256i (&r)[4], __m256i (&v)[4]) {
  const __m256i a = _mm256_unpacklo_epi32(r[0], r[1]), b = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i c = _mm256_unpacklo_epi32(r[2], r[3]), d = _mm256_unpackhi_epi32(r[2], r[3]);
  v[0] = _mm256_unpacklo_epi64(a, c);
  v[1] = _mm256_unpackhi_epi64(a, c);
  v[2] = _mm256_unpacklo_epi64(b, d);
  v[3] = _mm256_unpackhi_epi64(b, d);
}

IE_INLINE void store_transposed(const __m256i (&r)[4], uint8_t* o) {
  __m256i v[4];
  transpose4(r, v);
  for (int k = 0; k < 4; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32 * k), v[k]);
}

// Word k (0..7) of the 32 bytes at row[i] + at, rows 0..7 in t[k]'s lanes:
// the k-quants' high bits of eight rows, ready to be shifted into rows8's
// vectors (pack_kq_sides_vec).
IE_INLINE void load_transposed8(const uint8_t* const (&row)[8], size_t at, __m256i (&t)[8]) {
  __m256i r[4][2];  // rows i (lane 0) and i + 4 (lane 1) as words 0..3 | 4..7
  for (int i = 0; i < 4; ++i) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[i] + at));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[i + 4] + at));
    r[i][0] = _mm256_permute2x128_si256(a, b, 0x20);
    r[i][1] = _mm256_permute2x128_si256(a, b, 0x31);
  }
  for (int h = 0; h < 2; ++h) {
    __m256i v[4];
    transpose4({r[0][h], r[1][h], r[2][h], r[3][h]}, v);
    for (int k = 0; k < 4; ++k) t[4 * h + k] = v[k];
  }
}

// The bytes [at, at + len) of the next tile's eight rows (row[i]: this
// tile's), asked for a tile ahead: the vector packers read an expert's
// stored rows from DRAM at its latency otherwise (q6_k 2048 x 768, 8
// tokens, one thread: 0.46 -> 0.28 ms).
IE_INLINE void prefetch_next_tile(const uint8_t* const (&row)[8], const WeightLayout& lay, size_t at, size_t len) {
  for (int i = 0; i < 8; ++i)
    for (size_t b = 0; b < len + 63; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row[i] + 8 * lay.row_bytes + at + b), _MM_HINT_T0);
}

// pack_rows8_tiles for whole tiles of the 32-block types in q4_0's nibble
// order (q4_0, q4_1, iq4_nl, mxfp4: SB-byte scale, AFFINE: and min, before
// 16 code bytes), eight rows at a time in vectors: rows i and i + 4 share a
// register, whose 128-bit lanes each become that row's four output words
// (put_nibbles_q40's, from the low and high nibbles by two shuffles and a
// shift), and a 4 x 4 transpose per lane puts each word in its vector.
// About a third of the portable packer's time (docs/moe.md); the same bytes
// (test_packing_layout_is_rows8_bit_for_bit against pack_rows8's copy).
template <int SB, bool AFFINE>
void pack_q40_tiles_vec(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t t0, int64_t n,
                        uint8_t* out) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t k = 0; k < n; ++k) {
    const uint8_t* row[8];
    for (int i = 0; i < 8; ++i) row[i] = w + (8 * (t0 + k) + i) * lay.row_bytes;
    uint8_t* o = out + k * p.tile_bytes;
    for (int64_t g = 0; g < p.groups; ++g, o += p.group_bytes) {
      const size_t at = static_cast<size_t>(g) * lay.block_bytes;
      if (g % 4 == 0) prefetch_next_tile(row, lay, at, 4 * lay.block_bytes);
      __m256i r[4];
      for (int i = 0; i < 4; ++i) {
        const __m256i x = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(row[i + 4] + at + lay.block_qs),
                                              reinterpret_cast<const __m128i*>(row[i] + at + lay.block_qs));
        const __m256 lo = _mm256_castsi256_ps(_mm256_and_si256(x, low));
        const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srli_epi16(x, 4), low));
        const __m256i even = _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
        const __m256i odd = _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
        r[i] = _mm256_or_si256(even, _mm256_slli_epi32(odd, 4));  // lane: row's words v = 0..3
      }
      store_transposed(r, o);
      for (int i = 0; i < 8; ++i) {
        std::memcpy(o + 128 + SB * i, row[i] + at, SB);
        if constexpr (AFFINE) std::memcpy(o + 128 + 8 * SB + SB * i, row[i] + at + SB, SB);
      }
    }
  }
}

// The rest of a k-quant super-block of eight rows (row[i] + at: row i's
// block) as rows8's tile group at o, in vectors: the header (q4_k / q5_k:
// the three scale words and d, dmin; q6_k: the sixteen sub-scales, a byte
// transpose, and d), q5_k's fifth bits and q6_k's bit pairs (each output
// word is four of the row's words shifted into place: put_fifth_bits_q5k's
// and put_bit_pairs_q6k's bytes). Row by row these were ~20% of a
// Qwen3-MoE-shaped Q4_K_M prefill (put_header's call per row and group,
// q6_k's bit pairs per 32-block).
void pack_kq_sides_vec(const Rows8& p, const uint8_t* const (&row)[8], size_t at, uint8_t* o) {
  const WType ty = p.spec.type;
  uint8_t* h = o + static_cast<size_t>(p.bpg) * p.block_bytes;
  if (ty == WType::Q6_K) {
    using H = Rows8Q6kHeader;
    __m128i x[8];
    for (int i = 0; i < 8; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[i] + at + kQ6kScales));
    for (int u = 0; u < 2; ++u) {  // sub-scales 8u .. 8u + 7: byte s of row i to h[8 s + i]
      __m128i e[4];
      for (int i = 0; i < 4; ++i)
        e[i] = u ? _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]) : _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
      const __m128i lo01 = _mm_unpacklo_epi16(e[0], e[1]), hi01 = _mm_unpackhi_epi16(e[0], e[1]);
      const __m128i lo23 = _mm_unpacklo_epi16(e[2], e[3]), hi23 = _mm_unpackhi_epi16(e[2], e[3]);
      uint8_t* s = h + H::scales + 64 * u;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(s), _mm_unpacklo_epi32(lo01, lo23));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(s + 16), _mm_unpackhi_epi32(lo01, lo23));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(s + 32), _mm_unpacklo_epi32(hi01, hi23));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(s + 48), _mm_unpackhi_epi32(hi01, hi23));
    }
    for (int i = 0; i < 8; ++i) std::memcpy(h + H::d + 2 * i, row[i] + at + kQ6kD, 2);
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {  // 32-blocks 4 half + q: bits 2q of the half's 32 bytes
      __m256i t[8];
      load_transposed8(row, at + kQ6kHigh + 32 * half, t);
      for (int q = 0; q < 4; ++q)
        for (int v = 0; v < 2; ++v) {
          __m256i out = _mm256_setzero_si256();
          for (int k = 0; k < 4; ++k)
            out = _mm256_or_si256(out, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(t[4 * v + k], 2 * q), m2), 2 * k));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + (4 * half + q) * p.block_bytes + 128 + 32 * v), out);
        }
    }
    return;
  }
  using H = Rows8KqHeader;  // q4_k, q5_k: d, dmin and three scale words lead the block
  __m256i r[4], v[4];
  for (int i = 0; i < 4; ++i)
    r[i] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(row[i + 4] + at), reinterpret_cast<const __m128i*>(row[i] + at));
  transpose4(r, v);
  for (int k = 0; k < 3; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + H::words + 32 * k), v[k + 1]);
  const __m256i halves = _mm256_shuffle_epi8(  // per lane: the four d, then the four dmin
      v[0], _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
                             10, 11, 14, 15));
  static_assert(H::dmin == H::d + 16, "d and dmin are one store");
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + H::d), _mm256_permute4x64_epi64(halves, _MM_SHUFFLE(3, 1, 2, 0)));
  if (ty == WType::Q5_K) {
    const __m256i m1 = _mm256_set1_epi8(1);
    __m256i t[8];
    load_transposed8(row, at + kQ5kHigh, t);
    for (int j = 0; j < 8; ++j) {  // element 8v + e' at bit v, 8v + 4 + e' at bit 4 + v
      __m256i out = _mm256_setzero_si256();
      for (int u = 0; u < 4; ++u) {
        out = _mm256_or_si256(out, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(t[2 * u], j), m1), u));
        out = _mm256_or_si256(out, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(t[2 * u + 1], j), m1), 4 + u));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + j * p.block_bytes + 128), out);
    }
  }
}

IE_INLINE __m128i kq_words(__m256i nib) {  // 8 words of nibbles -> word 2v | word 2v + 1 << 4, v = 0..3
  const __m256i r = _mm256_or_si256(nib, _mm256_slli_epi32(_mm256_srli_epi64(nib, 32), 4));
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
}

// The k-quants' nibbles (q4_k, q5_k, q6_k) as pack_q40_tiles_vec packs:
// one 32-byte run per row holds two 32-blocks' codes, one in the low
// nibbles and one in the high ones (put_nibbles_kq's order: element e in byte e), so each
// row's load gives its four output words of both blocks (the odd words
// shifted onto the even ones, then gathered into the low lane), rows i and
// i + 4 share a register and the same transpose puts the words in place.
// The rest of the tile is pack_kq_sides_vec's. q4_k tiles took 33% of a
// Qwen3-MoE-shaped Q4_K_M prefill through the portable packer.
void pack_kq_tiles_vec(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t t0, int64_t n,
                       uint8_t* out) {
  const WType ty = p.spec.type;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t k = 0; k < n; ++k) {
    const uint8_t* row[8];
    for (int i = 0; i < 8; ++i) row[i] = w + (8 * (t0 + k) + i) * lay.row_bytes;
    uint8_t* o = out + k * p.tile_bytes;
    for (int64_t g = 0; g < p.groups; ++g, o += p.group_bytes) {
      prefetch_next_tile(row, lay, static_cast<size_t>(g) * lay.block_bytes, lay.block_bytes);
      pack_kq_sides_vec(p, row, static_cast<size_t>(g) * lay.block_bytes, o);
      const size_t at = static_cast<size_t>(g) * lay.block_bytes + lay.block_qs;
      for (int c = 0; c < 4; ++c) {  // the run at 32 c: 32-blocks 2c, 2c + 1 (q6_k: 4 (c / 2) + c % 2, + 2)
        const int jl = ty == WType::Q6_K ? 4 * (c / 2) + c % 2 : 2 * c, jh = ty == WType::Q6_K ? jl + 2 : jl + 1;
        __m256i rl[4], rh[4];
        for (int i = 0; i < 4; ++i) {
          __m128i l[2], h[2];
          for (int u = 0; u < 2; ++u) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[i + 4 * u] + at + 32 * c));
            l[u] = kq_words(_mm256_and_si256(x, low));
            h[u] = kq_words(_mm256_and_si256(_mm256_srli_epi16(x, 4), low));
          }
          rl[i] = _mm256_set_m128i(l[1], l[0]);
          rh[i] = _mm256_set_m128i(h[1], h[0]);
        }
        store_transposed(rl, o + jl * p.block_bytes);
        store_transposed(rh, o + jh * p.block_bytes);
      }
    }
  }
}

// Tiles t0 .. t0 + n of a job's stored matrix into out: whole tiles of the
// types above in vectors, the rest as pack_rows8_tiles packs them.
void pack_job_tiles(const Rows8& p, const uint8_t* w, int64_t t0, int64_t n, uint8_t* out) {
  const WType ty = p.stored.type;  // (the bytes w holds: q1_0's copy is a q4_0 matrix's, its bytes are not)
  const int64_t whole = std::min(n, p.spec.rows / 8 - t0);  // tiles with all eight rows
  const bool kq = ty == WType::Q4_K || ty == WType::Q5_K || ty == WType::Q6_K;
  if (whole > 0 && (kq || ty == WType::Q4_0 || ty == WType::IQ4_NL || ty == WType::Q4_1 || ty == WType::MXFP4)) {
    const WeightLayout lay = weight_layout(p.stored);
    if (kq)
      pack_kq_tiles_vec(p, lay, w, t0, whole, out);
    else if (ty == WType::Q4_1)
      pack_q40_tiles_vec<2, true>(p, lay, w, t0, whole, out);
    else if (ty == WType::MXFP4)
      pack_q40_tiles_vec<1, false>(p, lay, w, t0, whole, out);
    else
      pack_q40_tiles_vec<2, false>(p, lay, w, t0, whole, out);
    t0 += whole, n -= whole, out += whole * p.tile_bytes;
    if (n == 0) return;
  }
  pack_rows8_tiles(p, w, t0, n, out);
}

// The activation's int8 forms (Rows8Prep's, carved); each matrix reads the
// one its copy's act_block names.
struct Q8Forms {
  Q8Nat blocks, super;
  Q8Forms(const Rows8Prep& p, int B, int64_t cols) {
    if (p.blocks) blocks = carve_q8_nat(const_cast<uint8_t*>(p.blocks), B, cols);
    if (p.super) super = carve_q8_nat(const_cast<uint8_t*>(p.super), B, cols);
  }
  const Q8Nat& of(const Rows8& m) const { return m.act_block == 256 ? super : blocks; }
};

// Where a job's tile t is read: its copy's bytes, or (a job over stored
// bytes) the thread's packed tiles, tile t0 first.
struct TileBase {
  const uint8_t* w;
  const uint8_t* up;
  int64_t t0;
  const uint8_t* of(const Rows8& p, const uint8_t* base, int64_t t) const { return base + (t - t0) * p.tile_bytes; }
};

// Activation rows b0 .. b0+NB of tile t of one job (kw, ku: its matrices' kernels).
template <int NB>
void run_tile_n(const Rows8Job& j, const TileKernels& kw, const TileKernels& ku, const TileBase& tb, int64_t t,
                const Q8Forms& x, int B, int b0) {
  const int64_t rows = j.w->spec.rows, n = rows - 8 * t < 8 ? rows - 8 * t : 8;
  __m256 acc[NB];
  kw.run<NB>(*j.w, tb.of(*j.w, tb.w, t), x.of(*j.w), B, b0, acc);
  if (j.up) {
    __m256 u[NB];
    ku.run<NB>(*j.up, tb.of(*j.up, tb.up, t), x.of(*j.up), B, b0, u);
    for (int b = 0; b < NB; ++b) acc[b] = j.gelu ? gelu_tanh_mul(acc[b], u[b]) : silu_mul(acc[b], u[b]);
  }
  for (int b = 0; b < NB; ++b) store_tile(acc[b], j.up ? nullptr : j.bias, j.y + (b0 + b) * rows, 8 * t, n);
}

#if IE_ROWS8_ZMM
// The N tokens b0 .. b0+N of tiles t and t + 1 of one job (pw, pu: its
// matrices' pair kernels, N = 8, or AMX kernels, N = 16).
template <int N, class Kernel>
void run_pair(const Rows8Job& j, Kernel pw, Kernel pu, const TileBase& tb, int64_t t, const Q8Forms& x, int B, int b0) {
  const int64_t rows = j.w->spec.rows;
  __m512 acc[N], u[N];
  pw(*j.w, tb.of(*j.w, tb.w, t), x.of(*j.w), B, b0, acc);
  if (j.up) {
    pu(*j.up, tb.of(*j.up, tb.up, t), x.of(*j.up), B, b0, u);
    // on the pair's 16 rows at once: the exp and divide were most of run_pair's own time
    for (int b = 0; b < N; ++b) acc[b] = j.gelu ? gelu_tanh_mul(acc[b], u[b]) : silu_mul(acc[b], u[b]);
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t r0 = 8 * (t + h), n = rows - r0 < 8 ? rows - r0 : 8;
    for (int b = 0; b < N; ++b) store_tile(half_of(acc[b], h), j.up ? nullptr : j.bias, j.y + (b0 + b) * rows, r0, n);
  }
}
#endif

// Activation rows b0 .. B of tile t of one job.
void run_tile_rest(const Rows8Job& j, const TileKernels& kw, const TileKernels& ku, const TileBase& tb, int64_t t,
                   const Q8Forms& x, int B, int b0) {
  if constexpr (kWide > 4)
    for (; b0 + kWide <= B; b0 += kWide) run_tile_n<kWide>(j, kw, ku, tb, t, x, B, b0);
  for (; b0 < B; b0 += 4) {  // four rows at a time; the tile stays in L1 for the next four
    switch (B - b0 < 4 ? B - b0 : 4) {
      case 1: run_tile_n<1>(j, kw, ku, tb, t, x, B, b0); break;
      case 2: run_tile_n<2>(j, kw, ku, tb, t, x, B, b0); break;
      case 3: run_tile_n<3>(j, kw, ku, tb, t, x, B, b0); break;
      default: run_tile_n<4>(j, kw, ku, tb, t, x, B, b0); break;
    }
  }
}

// Tiles [t0, t1) of one job, for the B activation rows of x: under AVX-512 two
// tiles at a time (every quantized type has a pair kernel), then the
// tokens past the last eight per tile. A job over stored bytes packs each
// tile (or pair) into `pack` (two tiles) just before its kernels read it.
void run_job(const Rows8Job& j, const TileKernels& kw, const TileKernels& ku, int64_t t0, int64_t t1, const Q8Forms& x,
             int B, uint8_t* pack) {
  for (int64_t t = t0; t < t1; ++t) {
#if IE_ROWS8_ZMM
    const bool pair = t + 1 < t1 && B >= kPairTokens;
#else
    constexpr bool pair = false;
#endif
    TileBase tb{j.w->bytes.data(), j.up ? j.up->bytes.data() : nullptr, 0};
    if (j.stored) {
      uint8_t* up = j.up ? pack + packed_up_offset(j) : nullptr;
      tb = {pack, up, t};
      pack_job_tiles(*j.w, j.stored, t, pair ? 2 : 1, pack);
      if (up) pack_job_tiles(*j.up, j.stored_up, t, pair ? 2 : 1, up);
    }
#if IE_ROWS8_ZMM
    if (pair) {
      int b0 = 0;
#if IE_ROWS8_AMX
      if (kw.amx && (!j.up || ku.amx))
        for (; b0 + kAmxTokens <= B; b0 += kAmxTokens) run_pair<kAmxTokens>(j, kw.amx, ku.amx, tb, t, x, B, b0);
#endif
      for (; b0 + kPairTokens <= B; b0 += kPairTokens) run_pair<kPairTokens>(j, kw.pair, ku.pair, tb, t, x, B, b0);
      run_tile_rest(j, kw, ku, tb, t, x, B, b0);
      run_tile_rest(j, kw, ku, tb, ++t, x, B, b0);
      continue;
    }
#endif
    run_tile_rest(j, kw, ku, tb, t, x, B, 0);
  }
}

// The ISA's gemv_rows8 (kernels.h).
void gemv_rows8_tiles(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                      size_t pack_bytes) {
  const Q8Forms x(prep, batch, jobs[0].w->spec.cols);
  // The jobs' tiles are one sequence (job 0's, then job 1's, ...), shared
  // by the threads one tile at a time (work_split.h).
  int64_t first[kMaxRows8Jobs + 1] = {0};
  TileKernels kw[kMaxRows8Jobs], ku[kMaxRows8Jobs];  // picked once per call, not per piece of work
  for (int i = 0; i < n; ++i) {
    first[i + 1] = first[i] + jobs[i].w->tiles;
    kw[i] = TileKernels(*jobs[i].w);
    if (jobs[i].up) ku[i] = TileKernels(*jobs[i].up);
  }
  // Under AVX-512, chunks of a pair's tokens or more are claimed two tiles at a time (run_job's pairs).
  WorkSplit split(first[n], pool.size(), IE_ROWS8_ZMM && batch >= kWide ? 2 : 1);
  pool.run([&](int th) {
#if IE_ROWS8_AMX
    // tile state is each thread's: shaped here, released after (a thread
    // holding tile data makes every context switch save 8 KiB more)
    const bool tiles = batch >= kAmxTokens;
    if (tiles) amx_configure();
#endif
    int64_t k0, k1;
    while (split.next(th, &k0, &k1)) {
      int i = 0;
      while (k0 >= first[i + 1]) ++i;
      run_job(jobs[i], kw[i], ku[i], k0 - first[i], k1 - first[i], x, batch, pack + th * pack_bytes);
    }
#if IE_ROWS8_AMX
    if (tiles) _tile_release();
#endif
  });
}

}  // namespace
}  // namespace ie
