// AVX2/FMA/F16C GEMV kernels (this file alone is built with -mavx2 -mfma
// -mf16c). scalar.cpp is the reference they are tested against.
//
// 4-bit rows (int4w, q4_0, q4_1) are processed in 32-byte chunks: two
// 16-byte blocks of 32 elements = 64 elements.
//  * act=f32: nibble k of each 32-bit lane is isolated with ONE AND (no
//    shift): (v & (0xF << 4k)) is q * 2^(4k), converted to float exactly
//    (k = 7: one shift instead). The activation it multiplies was scaled by
//    2^-4k (exact) and permuted into the matching lane order once per call,
//    so each 8 weights cost and + cvt + fma. This is compute-bound on Zen 3
//    (~8 weights/cycle/core).
//  * act=int8: llama.cpp style: maddubs(unsigned nibbles, int8 x) on the
//    permuted int8 activations, int32 per lane, one cvt + fma per chunk.
// Zero points and mins stay out of the inner loops: for int4w the
// symmetric -8 and the affine min become per-group sums of x computed once
// per call, dotted with the row's scales/mins in a per-row setup
// (sum_j x_j (s q_j + m) = s sum_j x_j q_j + m sum_j x_j); q4_0/q4_1 fold
// theirs per chunk (their scales live inside the blocks).
// Each kernel handles R rows at once (sharing activation loads), B <= 8
// activation rows, and prefetches the next row block.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "avx2_bits.h"
#include "common/half.h"
#include "kernels.h"
#include "kquant_avx2.h"

namespace ie {

// Everything here has internal linkage except the ops table at the end.
namespace {

// The act=int8 quantizer's scale of the n floats at x (n a multiple of 8):
// their largest magnitude / 127, or NaN where one of them is not finite
// (as in scalar: NaN scale, zero codes).
IE_INLINE float q8_scale(const float* x, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t u = 0; u < n; u += 8) {
    const __m256 v = _mm256_loadu_ps(x + u);
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, v), amax);
    const __m256 z = _mm256_mul_ps(v, _mm256_setzero_ps());  // NaN exactly where v is not finite
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(bad)) return std::numeric_limits<float>::quiet_NaN();
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m) / 127.f;
}

// The 32 floats at xb as int8 codes at q under the scale db (q8_scale's).
// Returns the codes' sums over elements 0..15 and 16..31 in int32 lanes 0
// and 1, from the integers before they are packed (prep_q8_blocks' offset
// terms; quantize_q8_avx2 drops them).
IE_INLINE __m128i quantize_q8_codes(const float* xb, float db, int8_t* q) {
  if (std::isnan(db)) {
    std::memset(q, 0, 32);
    return _mm_setzero_si128();
  }
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // round half away from zero = trunc(v + copysign(0.5 - 2^-25, v)), exact for |v| <= 127.
  const __m256 half = _mm256_set1_ps(0.49999997f);
  const __m256 mul = _mm256_set1_ps(db != 0.f ? 1.f / db : 0.f);
  __m256i i[4];
  for (int u = 0; u < 4; ++u) {
    const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * u), mul);
    i[u] = _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(t, sign), half)));
  }
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  // (i0 + i1, i2 + i3) pairwise within 128-bit lanes, the lanes added, then pairwise again: (h0, h1, h0, h1)
  const __m256i s = _mm256_hadd_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return _mm_hadd_epi32(s4, s4);
}

// block: elements per scale, 32 or 256 (a multiple of it in n); d holds one per 32 either way.
void quantize_q8_avx2(const float* x, int64_t n, int8_t* q, float* d, int block) {
  for (int64_t s = 0; s < n; s += block) {
    const float db = q8_scale(x + s, block);
    for (int64_t b = s / 32; b < (s + block) / 32; ++b) {
      d[b] = db;
      quantize_q8_codes(x + b * 32, db, q + b * 32);
    }
  }
}

// ---------------------------------------------------------------- helpers

IE_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Independent FMA chains per accumulator so that FMA latency (4 cycles)
// is hidden: ~8 chains in flight over all rows x batch.
constexpr int chains_for(int rb) { return rb >= 5 ? 1 : rb >= 3 ? 2 : 4; }

template <int NC>
IE_INLINE __m256 sum_chains(const __m256* p) {
  if constexpr (NC == 1) return p[0];
  else if constexpr (NC == 2) return _mm256_add_ps(p[0], p[1]);
  else return _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3]));
}

IE_INLINE __m256 f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// 64 nibbles, or at a row's odd tail 32 (upper 16 bytes zero).
IE_INLINE __m256i load_nibbles(const uint8_t* p, bool half) {
  if (half) return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Two 16-byte block payloads (q4_0/q4_1); the second may be absent (tail).
IE_INLINE __m256i load_two(const uint8_t* p0, const uint8_t* p1) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0));
  if (!p1) return _mm256_zextsi128_si256(lo);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
}

// Nibble k of every 32-bit lane, times 2^(4k), as float (exact); k = 7 is
// shifted down instead (q), since 0xF << 28 would set the sign bit.
alignas(32) const uint32_t kNibMask[8][8] = {
#define IE_M8(m) {m, m, m, m, m, m, m, m}
    IE_M8(0xFu),       IE_M8(0xF0u),       IE_M8(0xF00u),       IE_M8(0xF000u),
    IE_M8(0xF0000u),   IE_M8(0xF00000u),   IE_M8(0xF000000u),   IE_M8(0xF0000000u),
#undef IE_M8
};

IE_INLINE __m256 nib_scaled(__m256i v, int k) {
  if (k == 7) return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 28));
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kNibMask[k]))));
}

// Software prefetch of the weights one row block ahead (the rows the next
// iteration reads, at the same offset): +20..40% over the hardware
// prefetchers alone on Zen 3 (each row is a separate 4 KB-page stream). T1
// (into L2) measured slightly better than T0.
IE_INLINE void prefetch(const void* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

IE_INLINE int64_t prefetch_distance(int rows, const WeightLayout& l) { return rows * static_cast<int64_t>(l.row_bytes); }

// What every row kernel starts with: rows r0 .. r0 + R - 1's pointers, its
// R x B accumulators zeroed; returns the prefetch distance.
template <int R, int B>
IE_INLINE int64_t start_rows(const GemvArgs& a, int64_t r0, const uint8_t* (&row)[R], __m256 (&acc)[R][B]) {
  for (int rr = 0; rr < R; ++rr) row[rr] = a.w + (r0 + rr) * a.lay.row_bytes;
  for (auto& ra : acc)
    for (auto& v : ra) v = _mm256_setzero_ps();
  return prefetch_distance(R, a.lay);
}

// And what it ends with: out[rr * B + b] = the sum of acc[rr][b]'s lanes.
template <int R, int B>
IE_INLINE void store_sums(const __m256 (&acc)[R][B], float* out) {
  for (int rr = 0; rr < R; ++rr)
    for (int b = 0; b < B; ++b) out[rr * B + b] = hsum(acc[rr][b]);
}

// [p[0] x4, p[1] x4]
IE_INLINE __m256 pair_bcast(const float* p) {
  double pair;  // two floats, loaded as one 8-byte lane (memcpy: p need not be 8-byte aligned)
  std::memcpy(&pair, p, sizeof pair);
  const __m128 two = _mm_castpd_ps(_mm_set_sd(pair));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

// ------------------------------------------------ activation preparation

// The lane order: nibble k of 32-bit lane i of a 32-byte chunk is chunk
// element nib_elem(i, k) = (byte / 16) * 32 + byte % 16 + 16 * (k & 1) with
// byte = 4i + k/2 (lane i holds chunk bytes 4i..4i+3; byte j of a 16-byte
// block holds elements j (low nibble) and j+16 (high nibble)).

// Each form is an arena laid out by one walk (Carve): sized with a null
// base by prep_bytes_avx2, carved the same way by prepare and by the kernels.
// The per-call pieces that depend on the matrix (int4w group sums for its
// group size, the q4_0/q4_1 block-sum vectors) are derived into scratch.

struct NibF32 {  // act=f32, 4-bit weights
  int64_t nch = 0;
  float* xp = nullptr;    // [nch][B][64]: vector k of chunk c, lane i = x[64c + nib_elem(i,k)] * 2^-4k
  float* bsum = nullptr;  // [B][nblk]: sum of x over each 32-block
  float* xpad = nullptr;  // temporary: one zero-padded activation row [nch * 64]
  // Derived per call (scratch):
  const float* gsum = nullptr;  // int4w: [B][G] sum of x over each group
  const float* bsv = nullptr;   // q4_0/q4_1: [nch][B][8] lanes 0/4 = coef * sum of x over the chunk's blocks
};

NibF32 carve_nib_f32(uint8_t* base, int B, int64_t cols, size_t* used = nullptr) {
  Carve c(base);
  NibF32 o;
  o.nch = (cols + 63) / 64;
  o.xp = c.take<float>(static_cast<size_t>(B * o.nch * 64));
  o.bsum = c.take<float>(static_cast<size_t>(B * (cols / 32)));
  o.xpad = c.take<float>(static_cast<size_t>(o.nch * 64));
  if (used) *used = c.used();
  return o;
}

void prep_nib_f32(const float* x, int B, int64_t cols, uint8_t* arena) {
  // Matches nib_scaled: nibble k arrives as q * 2^(4k), except k = 7 (shifted down: q).
  static const float kPow[8] = {1.f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.f};
  NibF32 o = carve_nib_f32(arena, B, cols);
  const int64_t nch = o.nch, nblk = cols / 32;
  for (int b = 0; b < B; ++b) {
    std::memcpy(o.xpad, x + b * cols, static_cast<size_t>(cols) * sizeof(float));
    std::memset(o.xpad + cols, 0, static_cast<size_t>(nch * 64 - cols) * sizeof(float));
    for (int64_t c = 0; c < nch; ++c) {
      // Vector k = 2m + h, lane i: chunk element 16h + 4i + m (i < 4) or 32 + 16h + 4(i-4) + m:
      // a 4x4 transpose within each 128-bit half.
      const float* e = o.xpad + c * 64;
      for (int h = 0; h < 2; ++h) {
        __m256 r[4];
        for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu2_m128(e + 32 + 16 * h + 4 * i, e + 16 * h + 4 * i);
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 col[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                               _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE)};
        for (int m = 0; m < 4; ++m) {
          const int k = 2 * m + h;
          _mm256_storeu_ps(o.xp + (c * B + b) * 64 + k * 8, _mm256_mul_ps(col[m], _mm256_set1_ps(kPow[k])));
        }
      }
      for (int h = 0; h < 2 && 2 * c + h < nblk; ++h) {
        const float* q = e + 32 * h;
        const __m256 s4 = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8)),
                                        _mm256_add_ps(_mm256_loadu_ps(q + 16), _mm256_loadu_ps(q + 24)));
        o.bsum[b * nblk + 2 * c + h] = hsum(s4);
      }
    }
  }
}

struct NibQ8 {  // act=int8, 4-bit weights
  int64_t nch = 0;
  int8_t* q = nullptr;      // [nch][B][64]: per chunk 32 bytes matching the low nibbles, 32 the high
  float* dv = nullptr;      // [nch][B][8]: [d(block 2c) x4, d(block 2c+1) x4]
  int32_t* off8 = nullptr;  // [nch][B][8]: 8 * sum of the q feeding each int32 lane (q4_0 zero point)
  float* ms = nullptr;      // [nch][B][8] lanes 0/4 = d * sum(q) of the chunk's blocks (q4_1 min term)
  int8_t* qn = nullptr;     // temporary: one quantized row [nch * 64]
  float* dn = nullptr;      // temporary: its scales [nch * 2]
  // Derived per call (scratch):
  const float* gq = nullptr;  // int4w: [B][G] sum over the group's blocks of d * sum(q)
};

NibQ8 carve_nib_q8(uint8_t* base, int B, int64_t cols, size_t* used = nullptr) {
  Carve c(base);
  NibQ8 o;
  o.nch = (cols + 63) / 64;
  const size_t n8 = static_cast<size_t>(B * o.nch * 8);
  o.q = c.take<int8_t>(n8 * 8);
  o.dv = c.take<float>(n8);
  o.off8 = c.take<int32_t>(n8);
  o.ms = c.take<float>(n8);
  o.qn = c.take<int8_t>(static_cast<size_t>(o.nch * 64));
  o.dn = c.take<float>(static_cast<size_t>(o.nch * 2));
  if (used) *used = c.used();
  return o;
}

void prep_nib_q8(const float* x, int B, int64_t cols, uint8_t* arena) {
  NibQ8 o = carve_nib_q8(arena, B, cols);
  const int64_t nch = o.nch;
  const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
  for (int b = 0; b < B; ++b) {
    std::memset(o.qn, 0, static_cast<size_t>(nch * 64));  // the tail block (if any) stays 0
    std::memset(o.dn, 0, static_cast<size_t>(nch * 2) * sizeof(float));
    quantize_q8_avx2(x + b * cols, cols, o.qn, o.dn, 32);
    for (int64_t c = 0; c < nch; ++c) {
      const int8_t* e = o.qn + c * 64;
      // low-nibble partner bytes: [block 2c elems 0..15 | block 2c+1 elems 0..15]; high: elems 16..31
      const __m256i lo = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(e + 32), reinterpret_cast<const __m128i*>(e));
      const __m256i hi = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(e + 48), reinterpret_cast<const __m128i*>(e + 16));
      const size_t o8 = static_cast<size_t>((c * B + b) * 8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q + o8 * 8), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q + o8 * 8 + 32), hi);
      const __m256i s = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(one8, lo), _mm256_maddubs_epi16(one8, hi)), one16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.off8 + o8), _mm256_slli_epi32(s, 3));
      alignas(32) int32_t ls[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(ls), s);
      for (int h = 0; h < 2; ++h) {
        const float d = o.dn[2 * c + h];
        for (int l = 0; l < 4; ++l) o.dv[o8 + 4 * h + l] = d;
        o.ms[o8 + 4 * h] = d * static_cast<float>(ls[4 * h] + ls[4 * h + 1] + ls[4 * h + 2] + ls[4 * h + 3]);
        o.ms[o8 + 4 * h + 1] = o.ms[o8 + 4 * h + 2] = o.ms[o8 + 4 * h + 3] = 0.f;
      }
    }
  }
}

// Block k of token b, its codes under the scale db (its own: Q8Blocks; its
// super-block's: Q8Super) and its sums; returns the code sum.
IE_INLINE int32_t prep_q8_block(const Q8Nat& o, const float* x, int B, int64_t cols, int64_t k, int b, float db) {
  const int64_t kb = k * B + b;
  o.d[kb] = db;
  const __m128i halves = quantize_q8_codes(x + b * cols + k * 32, db, o.q + kb * 32);
  const int32_t half[2] = {_mm_cvtsi128_si32(halves), _mm_extract_epi32(halves, 1)};
  const int32_t sum = half[0] + half[1];
  o.s8[kb] = 8 * sum;
  o.ds[kb] = db * static_cast<float>(sum);
  for (int h = 0; h < 2; ++h) {
    const uint32_t v = static_cast<uint16_t>(static_cast<int16_t>(16 * half[h]));
    o.h16[2 * kb + h] = static_cast<int32_t>(v | v << 16);
  }
  return sum;
}

// Blocks [k0, k1) of every token into Q8Nat (x: [B][cols]), each quantized
// into its place: a piece's stores are one contiguous run of each array,
// which no other piece touches. (Split by tokens instead, neighbouring
// tokens' scales share cache lines, and two threads writing them took 2.4x
// the time of one.)
void prep_q8_blocks(const Q8Nat& o, const float* x, int B, int64_t cols, int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; ++k)
    for (int b = 0; b < B; ++b) prep_q8_block(o, x, B, cols, k, b, q8_scale(x + b * cols + k * 32, 32));
}

// Super-blocks [s0, s1) (256 elements) of every token into Q8Nat under one
// scale each (Q8Super), and their code sums as Q8Nat::p16's int16 pairs.
void prep_q8_super(const Q8Nat& o, const float* x, int B, int64_t cols, int64_t s0, int64_t s1) {
  for (int64_t s = s0; s < s1; ++s)
    for (int b = 0; b < B; ++b) {
      const float db = q8_scale(x + b * cols + s * 256, 256);
      int32_t sum[8];
      for (int j = 0; j < 8; ++j) sum[j] = prep_q8_block(o, x, B, cols, 8 * s + j, b, db);
      auto pair = [&](int i, int k) {
        return static_cast<int32_t>(static_cast<uint16_t>(sum[i]) | static_cast<uint32_t>(static_cast<uint16_t>(sum[k])) << 16);
      };
      int32_t* p = o.p16 + 4 * (s * B + b);
      p[0] = pair(0, 2);
      p[1] = pair(1, 3);
      p[2] = pair(4, 6);
      p[3] = pair(5, 7);
    }
}

// Over the pool, about 128 blocks a piece: a 64-token prefill chunk's
// quantization on one thread was 3% of a SmolLM2 prefill, with the other
// threads waiting for it; a decode step's one token stays on this thread.
// SUPER: Q8Super's form (cols a multiple of 256), by super-blocks.
void prep_q8_nat(const float* x, int B, int64_t cols, uint8_t* arena, ThreadPool& pool, bool super) {
  const Q8Nat o = carve_q8_nat(arena, B, cols);
  if (super)
    parallel_for(pool, cols / 256, (16 + B - 1) / B,
                 [&](int64_t s0, int64_t s1, int) { prep_q8_super(o, x, B, cols, s0, s1); });
  else
    parallel_for(pool, cols / 32, (128 + B - 1) / B,
                 [&](int64_t k0, int64_t k1, int) { prep_q8_blocks(o, x, B, cols, k0, k1); });
}

// ----------------------------------------------------------- float weights

template <WType T>
inline __m256 load_w8(const uint8_t* p) {
  if constexpr (T == WType::F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  else if constexpr (T == WType::F16) return f16x8(p);
  else
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

template <WType T>
inline float load_w1(const uint8_t* p) {
  if constexpr (T == WType::F32) return load_f32(p);
  else if constexpr (T == WType::F16) return f16_to_f32(load_u16(p));
  else return bf16_to_f32(load_u16(p));
}

template <WType T, int R, int B>
void float_rows(const GemvArgs& a, int64_t r0, float* out) {
  constexpr int NC = chains_for(R * B);
  constexpr int64_t E = T == WType::F32 ? 4 : 2;
  const int64_t cols = a.spec.cols;
  const uint8_t* row[R];
  for (int rr = 0; rr < R; ++rr) row[rr] = a.w + (r0 + rr) * a.lay.row_bytes;
  __m256 acc[R][B][NC];
  for (auto& ra : acc)
    for (auto& ba : ra)
      for (auto& c : ba) c = _mm256_setzero_ps();
  const int64_t pf = prefetch_distance(R, a.lay);
  int64_t j = 0;
  for (; j + 8 * NC <= cols; j += 8 * NC) {
    for (int rr = 0; rr < R; ++rr)
      for (int64_t o = 0; o < 8 * NC * E; o += 64)
        prefetch(row[rr] + j * E + o + pf);
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) {
      __m256 xk[B];
      for (int b = 0; b < B; ++b) xk[b] = _mm256_loadu_ps(a.x + b * cols + j + 8 * u);
      for (int rr = 0; rr < R; ++rr) {
        const __m256 w = load_w8<T>(row[rr] + (j + 8 * u) * E);
        for (int b = 0; b < B; ++b) acc[rr][b][u] = _mm256_fmadd_ps(w, xk[b], acc[rr][b][u]);
      }
    }
  }
  for (; j + 8 <= cols; j += 8) {
    for (int rr = 0; rr < R; ++rr) {
      const __m256 w = load_w8<T>(row[rr] + j * E);
      for (int b = 0; b < B; ++b) acc[rr][b][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(a.x + b * cols + j), acc[rr][b][0]);
    }
  }
  for (int rr = 0; rr < R; ++rr)
    for (int b = 0; b < B; ++b) {
      float t = 0.f;
      for (int64_t jj = j; jj < cols; ++jj) t += load_w1<T>(row[rr] + jj * E) * a.x[b * cols + jj];
      out[rr * B + b] = hsum(sum_chains<NC>(acc[rr][b])) + t;
    }
}

// ------------------------------------------------------------------ int4w

// Chunks per group, as a template argument: 1 = group_size 64, 2 = 128,
// -1 = one group per row (any length), 0 = per-block scales (group_size 32:
// one chunk holds two groups; other sizes: scales expanded per block).
inline int int4w_cpg(const WeightSpec& s) {
  if (s.group_size == s.cols) return -1;
  if (s.group_size == 64) return 1;
  if (s.group_size == 128) return 2;
  return 0;
}

// Per-row setup: the row's scales as f32 in sf[0..G) (per block in pair
// mode; plus a 0 pad for the odd-tail chunk), and the zero-point/min term
//   off[b] = coef * sum_g v_g c[b][g],  v = scales (coef -8) or mins (coef 1).
template <int B>
void int4w_setup_row(const GemvArgs& a, int64_t r, const float* c, float* sf, float* off) {
  const int64_t G = a.lay.groups;
  const size_t sb = a.lay.scale_bytes;
  const uint8_t* sp = a.w + a.lay.scales_off + r * G * sb;
  const uint8_t* mp = a.w + a.lay.mins_off + r * G * sb;
  const bool sym = a.spec.symmetric, f32 = a.spec.scale_f32;
  __m256 o[B];
  for (auto& v : o) v = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) {
    const __m256 s = f32 ? _mm256_loadu_ps(reinterpret_cast<const float*>(sp) + g) : f16x8(sp + g * 2);
    _mm256_storeu_ps(sf + g, s);
    if (c) {
      const __m256 v = sym ? s : (f32 ? _mm256_loadu_ps(reinterpret_cast<const float*>(mp) + g) : f16x8(mp + g * 2));
      for (int b = 0; b < B; ++b) o[b] = _mm256_fmadd_ps(v, _mm256_loadu_ps(c + b * G + g), o[b]);
    }
  }
  float ot[B];
  for (int b = 0; b < B; ++b) ot[b] = hsum(o[b]);
  for (; g < G; ++g) {
    const float s = f32 ? load_f32(sp + g * 4) : f16_to_f32(load_u16(sp + g * 2));
    sf[g] = s;
    if (c) {
      const float v = sym ? s : (f32 ? load_f32(mp + g * 4) : f16_to_f32(load_u16(mp + g * 2)));
      for (int b = 0; b < B; ++b) ot[b] += v * c[b * G + g];
    }
  }
  for (int b = 0; b < B; ++b) off[b] = c ? (sym ? -8.f * ot[b] : ot[b]) : 0.f;
  // Per-block scales for the kernels' pair mode (int4w_cpg == 0), expanded in
  // place from the back (block i reads group i / bpg <= i).
  const int64_t nblk = a.spec.cols / 32, bpg = a.spec.group_size / 32;
  if (int4w_cpg(a.spec) == 0 && bpg > 1) {
    for (int64_t i = nblk - 1; i >= 0; --i) sf[i] = sf[i / bpg];
    sf[nblk] = 0.f;
  } else {
    sf[G] = 0.f;
  }
}

// One chunk of R rows, act=f32: P[rr][b][k % NC] += nibble_k * xp_k.
// FIRST: the chains start here (multiply instead of fma); HALF: 16-byte tail.
template <int R, int B, int NC, bool FIRST, bool HALF>
IE_INLINE void f32_chunk(const uint8_t* const* qs, int64_t ch, const float* xp, int64_t pf, __m256 (&P)[R][B][NC]) {
  __m256i v[R];
  for (int rr = 0; rr < R; ++rr) {
    v[rr] = load_nibbles(qs[rr] + ch * 32, HALF);
    prefetch(qs[rr] + ch * 32 + pf);
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    __m256 xk[B];
    for (int b = 0; b < B; ++b) {
      xk[b] = _mm256_loadu_ps(xp + (ch * B + b) * 64 + k * 8);
    }
    for (int rr = 0; rr < R; ++rr) {
      const __m256 w = nib_scaled(v[rr], k);
      for (int b = 0; b < B; ++b)
        P[rr][b][k % NC] = (FIRST && k < NC) ? _mm256_mul_ps(w, xk[b]) : _mm256_fmadd_ps(w, xk[b], P[rr][b][k % NC]);
    }
  }
}

// act=f32: out[rr*B+b] = sum_g s_g sum_{j in g} q_j x_j (zero point/min are the caller's off).
template <int R, int B, int CPG>
void int4w_f32_rows(const GemvArgs& a, const NibF32& xa, int64_t r0, const float* sf, float* out) {
  constexpr int NC = R * B <= 4 ? 2 : 1;  // measured: 2 rows x 2 chains beats 4 chains (fold cost)
  const int64_t cols = a.spec.cols, nfull = cols / 64, sfs = cols / 32 + 1;
  const bool odd = cols % 64 != 0;
  const int64_t pf = prefetch_distance(R, a.lay);
  const uint8_t* qs[R];
  for (int rr = 0; rr < R; ++rr) qs[rr] = a.w + (r0 + rr) * a.lay.row_bytes;
  const float* xp = xa.xp;
  __m256 acc[R][B], P[R][B][NC];
  for (auto& ra : acc)
    for (auto& v : ra) v = _mm256_setzero_ps();
  // acc += sum of the chains * scale vector s(rr)
  auto fold = [&](auto scale) __attribute__((always_inline)) {
    for (int rr = 0; rr < R; ++rr) {
      const __m256 s = scale(rr);
      for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(sum_chains<NC>(P[rr][b]), s, acc[rr][b]);
    }
  };
  if constexpr (CPG == 0) {  // [s_2c x4, s_2c+1 x4]
    for (int64_t ch = 0; ch < nfull; ++ch) {
      f32_chunk<R, B, NC, true, false>(qs, ch, xp, pf, P);
      fold([&](int rr) { return pair_bcast(sf + rr * sfs + 2 * ch); });
    }
    if (odd) {
      f32_chunk<R, B, NC, true, true>(qs, nfull, xp, pf, P);
      fold([&](int rr) { return pair_bcast(sf + rr * sfs + 2 * nfull); });
    }
  } else if constexpr (CPG > 0) {
    for (int64_t g = 0; g < nfull / CPG; ++g) {
      f32_chunk<R, B, NC, true, false>(qs, g * CPG, xp, pf, P);
      for (int c = 1; c < CPG; ++c) f32_chunk<R, B, NC, false, false>(qs, g * CPG + c, xp, pf, P);
      fold([&](int rr) { return _mm256_broadcast_ss(sf + rr * sfs + g); });
    }
  } else {  // whole row
    if (nfull > 0) f32_chunk<R, B, NC, true, false>(qs, 0, xp, pf, P);
    else for (auto& ra : P) for (auto& ba : ra) for (auto& c : ba) c = _mm256_setzero_ps();
    for (int64_t ch = 1; ch < nfull; ++ch) f32_chunk<R, B, NC, false, false>(qs, ch, xp, pf, P);
    if (odd) f32_chunk<R, B, NC, false, true>(qs, nfull, xp, pf, P);
    fold([&](int rr) { return _mm256_broadcast_ss(sf + rr * sfs); });
  }
  store_sums(acc, out);
}

// The activation side of one chunk for act=int8, loaded once for all rows.
template <int B>
struct Q8Chunk {
  __m256i lo[B], hi[B], off[B];
  __m256 dv[B];
};

template <int B, bool SYM>
IE_INLINE void q8_load(const NibQ8& xa, int64_t ch, Q8Chunk<B>& x) {
  for (int b = 0; b < B; ++b) {
    const size_t o = static_cast<size_t>(ch * B + b);
    x.lo[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + o * 64));
    x.hi[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + o * 64 + 32));
    if constexpr (SYM) x.off[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.off8 + o * 8));
    x.dv[b] = _mm256_loadu_ps(xa.dv + o * 8);
    in_reg(x.lo[b]);
    in_reg(x.hi[b]);
  }
}

// One chunk of one row: f[b] = per-lane int32 sum_j qx_j (q_j - zero), as float.
template <int B, bool SYM, bool HALF>
IE_INLINE void q8_dot(const uint8_t* p, int64_t pf, const Q8Chunk<B>& x, __m256 (&f)[B]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i v = load_nibbles(p, HALF);
  prefetch(p + pf);
  const __m256i lo = _mm256_and_si256(v, m4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  for (int b = 0; b < B; ++b) {
    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x.lo[b]), _mm256_maddubs_epi16(hi, x.hi[b]));
    __m256i s = _mm256_madd_epi16(s16, ones);
    if constexpr (SYM) s = _mm256_sub_epi32(s, x.off[b]);
    f[b] = _mm256_cvtepi32_ps(s);
  }
}

// act=int8: out = sum_g s_g sum_{blocks in g} dx_blk * int32 sum_j qx_j q_j; the zero point
// (-8 s) or min (m) term is the caller's off: sum_g v_g sum_{blocks in g} dx_blk sum_j qx_j.
template <int R, int B, int CPG>
void int4w_q8_rows(const GemvArgs& a, const NibQ8& xa, int64_t r0, const float* sf, float* out) {
  const int64_t cols = a.spec.cols, nfull = cols / 64, sfs = cols / 32 + 1;
  const bool odd = cols % 64 != 0;
  const int64_t pf = prefetch_distance(R, a.lay);
  const uint8_t* qs[R];
  for (int rr = 0; rr < R; ++rr) qs[rr] = a.w + (r0 + rr) * a.lay.row_bytes;
  __m256 acc[R][B];
  for (auto& ra : acc)
    for (auto& v : ra) v = _mm256_setzero_ps();
  Q8Chunk<B> x;
  if constexpr (CPG == 0) {  // per-block scales [s_2c x4, s_2c+1 x4]
    auto step = [&](int64_t ch, auto half) __attribute__((always_inline)) {
      q8_load<B, false>(xa, ch, x);
      for (int rr = 0; rr < R; ++rr) {
        __m256 f[B];
        q8_dot<B, false, decltype(half)::value>(qs[rr] + ch * 32, pf, x, f);
        const __m256 s = pair_bcast(sf + rr * sfs + 2 * ch);
        for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(_mm256_mul_ps(f[b], x.dv[b]), s, acc[rr][b]);
      }
    };
    for (int64_t ch = 0; ch < nfull; ++ch) step(ch, std::false_type{});
    if (odd) step(nfull, std::true_type{});
  } else if constexpr (CPG > 0) {
    for (int64_t g = 0; g < nfull / CPG; ++g) {
      __m256 P[R][B];
      for (int c = 0; c < CPG; ++c) {
        const int64_t ch = g * CPG + c;
        q8_load<B, false>(xa, ch, x);
        for (int rr = 0; rr < R; ++rr) {
          __m256 f[B];
          q8_dot<B, false, false>(qs[rr] + ch * 32, pf, x, f);
          for (int b = 0; b < B; ++b)
            P[rr][b] = c == 0 ? _mm256_mul_ps(f[b], x.dv[b]) : _mm256_fmadd_ps(f[b], x.dv[b], P[rr][b]);
        }
      }
      for (int rr = 0; rr < R; ++rr) {
        const __m256 s = _mm256_broadcast_ss(sf + rr * sfs + g);
        for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(P[rr][b], s, acc[rr][b]);
      }
    }
  } else {  // whole row: one scale, applied at the end
    auto step = [&](int64_t ch, auto half) __attribute__((always_inline)) {
      q8_load<B, false>(xa, ch, x);
      for (int rr = 0; rr < R; ++rr) {
        __m256 f[B];
        q8_dot<B, false, decltype(half)::value>(qs[rr] + ch * 32, pf, x, f);
        for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(f[b], x.dv[b], acc[rr][b]);
      }
    };
    for (int64_t ch = 0; ch < nfull; ++ch) step(ch, std::false_type{});
    if (odd) step(nfull, std::true_type{});
    for (int rr = 0; rr < R; ++rr)
      for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_mul_ps(acc[rr][b], _mm256_broadcast_ss(sf + rr * sfs));
  }
  store_sums(acc, out);
}

// ------------------------------------------------------------ q4_0 / q4_1

// Scales of blocks 2c and 2c+1 of a row: dv = [d0 x4, d1 x4], mv likewise
// for mins (q4_1); p1 = null at an odd tail (zeros).
template <bool Q41>
IE_INLINE void q4_scales(const uint8_t* p0, const uint8_t* p1, __m256* dv, __m256* mv) {
  uint64_t h = load_u16(p0);
  if (p1) h |= static_cast<uint64_t>(load_u16(p1)) << 16;
  if constexpr (Q41) {
    h |= static_cast<uint64_t>(load_u16(p0 + 2)) << 32;
    if (p1) h |= static_cast<uint64_t>(load_u16(p1 + 2)) << 48;
  }
  const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(h))));
  *dv = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  if constexpr (Q41) *mv = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
}

// act=f32. q4_0: chain 0 starts at -8 * (block sums) so the zero point costs
// nothing; q4_1: the min term is one fma per chunk with the block sums.
template <int R, int B, bool Q41>
void q4_f32_rows(const GemvArgs& a, const NibF32& xa, int64_t r0, float* out) {
  constexpr int NC = R * B <= 4 ? 2 : 1;
  const int64_t nblk = a.spec.cols / 32;
  const size_t bb = a.lay.block_bytes, qo = a.lay.block_qs;
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  const float* xp = xa.xp;
  auto chunk = [&](int64_t ch, auto half) __attribute__((always_inline)) {
    constexpr bool HALF = decltype(half)::value;
    __m256i v[R];
    __m256 dv[R], mv[R];
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* p0 = row[rr] + 2 * ch * bb;
      v[rr] = load_two(p0 + qo, HALF ? nullptr : p0 + bb + qo);
      prefetch(p0 + pf);
      q4_scales<Q41>(p0, HALF ? nullptr : p0 + bb, &dv[rr], &mv[rr]);
    }
    __m256 P[R][B][NC];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m256 xk[B];
      for (int b = 0; b < B; ++b) xk[b] = _mm256_loadu_ps(xp + (ch * B + b) * 64 + k * 8);
      for (int rr = 0; rr < R; ++rr) {
        const __m256 w = nib_scaled(v[rr], k);
        for (int b = 0; b < B; ++b) {
          __m256& c = P[rr][b][k % NC];
          if (k >= NC) c = _mm256_fmadd_ps(w, xk[b], c);
          else if (!Q41 && k == 0) c = _mm256_fmadd_ps(w, xk[b], _mm256_loadu_ps(xa.bsv + (ch * B + b) * 8));
          else c = _mm256_mul_ps(w, xk[b]);
        }
      }
    }
    for (int rr = 0; rr < R; ++rr)
      for (int b = 0; b < B; ++b) {
        acc[rr][b] = _mm256_fmadd_ps(sum_chains<NC>(P[rr][b]), dv[rr], acc[rr][b]);
        if constexpr (Q41)
          acc[rr][b] = _mm256_fmadd_ps(mv[rr], _mm256_loadu_ps(xa.bsv + (ch * B + b) * 8), acc[rr][b]);
      }
  };
  for (int64_t ch = 0; ch < nblk / 2; ++ch) chunk(ch, std::false_type{});
  if (nblk % 2) chunk(nblk / 2, std::true_type{});
  store_sums(acc, out);
}

template <int R, int B, bool Q41>
void q4_q8_rows(const GemvArgs& a, const NibQ8& xa, int64_t r0, float* out) {
  const int64_t nblk = a.spec.cols / 32;
  const size_t bb = a.lay.block_bytes, qo = a.lay.block_qs;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  auto chunk = [&](int64_t ch, auto half) __attribute__((always_inline)) {
    constexpr bool HALF = decltype(half)::value;
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* p0 = row[rr] + 2 * ch * bb;
      const __m256i v = load_two(p0 + qo, HALF ? nullptr : p0 + bb + qo);
      prefetch(p0 + pf);
      __m256 dv, mv;
      q4_scales<Q41>(p0, HALF ? nullptr : p0 + bb, &dv, &mv);
      const __m256i lo = _mm256_and_si256(v, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      for (int b = 0; b < B; ++b) {
        const size_t o = static_cast<size_t>(ch * B + b);
        const int8_t* q = xa.q + o * 64;
        const __m256i p = _mm256_add_epi16(
            _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32))));
        __m256i s = _mm256_madd_epi16(p, ones);
        if constexpr (!Q41)
          s = _mm256_sub_epi32(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.off8 + o * 8)));
        const __m256 dd = _mm256_mul_ps(dv, _mm256_loadu_ps(xa.dv + o * 8));
        acc[rr][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[rr][b]);
        if constexpr (Q41) acc[rr][b] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xa.ms + o * 8), acc[rr][b]);
      }
    }
  };
  for (int64_t ch = 0; ch < nblk / 2; ++ch) chunk(ch, std::false_type{});
  if (nblk % 2) chunk(nblk / 2, std::true_type{});
  store_sums(acc, out);
}

// ------------- q8_0, q5_0, q5_1, iq4_nl, iq4_xs, iq4_xsh, mxfp4, iq3_s, iq3_xxs, iq2_xxs, q1_0

// Blocks whose 32 weights are a scale times int8 values (q5_1: plus a min):
// q8_0 stores the values, q5_0 / q5_1 nibbles and fifth bits (codes, less
// 16 for q5_0), iq4_nl / iq4_xs / mxfp4 nibbles indexing a table of values
// (grid_values: one in-lane byte shuffle turns 32 of them into the values;
// mxfp4's scale is an E8M0 byte, not an f16; iq3_s's values are codebook
// words, gathered, with their signs, iq3_xxs's and iq2_xxs's too; iq4_xsh's
// are iq4_xs's plus each sub-block's grid shift; q1_0's are +-1 by its sign
// bits). A stored block holds S such 32-blocks (iq4_xs, iq4_xsh and the
// codebook types: 8 under one f16 d and sub-scales; q1_0: 4 under one d;
// else 1).
// act=f32 is one kernel for all (stored blocks, and inside them their
// 32-blocks j); act=int8 has one for the 32-element blocks with values and
// one for the iq4 types (block pairs).
template <WType T>
constexpr int kSubs = wtype_info(T).block_elems / 32;
template <WType T>
constexpr int64_t kBlockBytes = wtype_info(T).block_bytes;

IE_INLINE __m256 f16_bcast(const uint8_t* p) { return _mm256_set1_ps(_cvtsh_ss(load_u16(p))); }

template <WType T>
constexpr bool kHasMin = T == WType::Q5_1;

// Byte e's own bit (bit e % 8) in each of eight bytes.
constexpr long long kByteBits = static_cast<long long>(0x8040201008040201ull);

// Byte e of the result: bit e of `bits` in its place within the byte
// (in-lane shuffle of its bytes, then one mask), 0 where it is clear.
IE_INLINE __m256i bits_in_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  return _mm256_and_si256(spread, _mm256_set1_epi64x(kByteBits));
}

// Byte e of the result: 0xFF where bit e of the u32 at p is set.
IE_INLINE __m256i bit_mask32(const uint8_t* p) {
  return _mm256_cmpeq_epi8(bits_in_bytes(load_u32(p)), _mm256_set1_epi64x(kByteBits));
}

// q1_0: byte e of the result 0xFF where bit e of 32-block j's signs is clear
// (the weight is -d), 0 where it is set (+d).
IE_INLINE __m256i q1_negated(const uint8_t* p, int j) {
  return _mm256_cmpeq_epi8(bits_in_bytes(q1_signs(p, j)), _mm256_setzero_si256());
}

// q1_0: byte e of the result 1 where bit e of 32-block j's signs is set (+d), 0 where it is clear.
IE_INLINE __m256i q1_set(const uint8_t* p, int j) {
  return _mm256_min_epu8(bits_in_bytes(q1_signs(p, j)), _mm256_set1_epi8(1));
}

// iq3_xxs's and iq2_xxs's signs: for each seven stored bits s, eight bytes
// 0xFF where even_signs makes the element negative.
struct EvenSigns {
  uint64_t mask[128];
};
constexpr EvenSigns even_sign_table() {
  EvenSigns t{};
  for (uint32_t s = 0; s < 128; ++s) t.mask[s] = byte_mask(even_signs(s), 0xFF);
  return t;
}
constexpr EvenSigns kEvenSigns = even_sign_table();

// The 32 magnitudes g negated where the sign/scale word aux says, four
// table words (kEvenSigns: the bit-by-bit parity took twice as long).
IE_INLINE __m256i even_signed(__m256i g, uint32_t aux) {
  const __m256i neg = _mm256_setr_epi64x(static_cast<long long>(kEvenSigns.mask[aux & 0x7F]),
                                         static_cast<long long>(kEvenSigns.mask[(aux >> 7) & 0x7F]),
                                         static_cast<long long>(kEvenSigns.mask[(aux >> 14) & 0x7F]),
                                         static_cast<long long>(kEvenSigns.mask[(aux >> 21) & 0x7F]));
  return _mm256_sub_epi8(_mm256_xor_si256(g, neg), neg);
}

// Byte e of the result: 0x10 where bit e of the u32 at p is set.
IE_INLINE __m256i fifth_bits(const uint8_t* p) { return _mm256_and_si256(bit_mask32(p), _mm256_set1_epi8(0x10)); }

// The values of 32-block j of stored block p, in element order.
template <WType T>
IE_INLINE __m256i block_values(const uint8_t* p, int j) {
  constexpr int codes = wtype_info(T).code_offset;
  if constexpr (T == WType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + codes));
  } else if constexpr (T == WType::Q5_0 || T == WType::Q5_1) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + codes + 4));
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m256i q = _mm256_or_si256(
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4)), fifth_bits(p + codes));
    if constexpr (T == WType::Q5_0) return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    else return q;
  } else if constexpr (T == WType::IQ3_S) {
    // eight codebook words (four magnitudes each), then each byte negated where its sign bit is set
    const uint8_t* qs = p + kIq3sQs + 8 * j;
    const __m256i high = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(p[kIq3sQh + j] << 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
        _mm256_set1_epi32(0x100));
    const __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs))), high);
    const __m256i g = _mm256_i32gather_epi32(reinterpret_cast<const int*>(iq3s_grid()), idx, 4);
    const __m256i neg = bit_mask32(p + kIq3sSigns + 4 * j);
    return _mm256_sub_epi8(_mm256_xor_si256(g, neg), neg);
  } else if constexpr (T == WType::IQ3_XXS) {
    // the same with 8-bit indices, each eight signs from their seven stored bits (even_signed: the
    // bit-by-bit parity took twice as long, 16384 x 8192, 2 threads, 12.9 -> 6.3 ms)
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kIq3xxsQs + 8 * j)));
    const __m256i g = _mm256_i32gather_epi32(reinterpret_cast<const int*>(iq3xxs_grid()), idx, 4);
    return even_signed(g, iq3xxs_aux(p, j));
  } else if constexpr (T == WType::Q1_0) {  // +1 where the sign bit is set, -1 (0xFF) where it is clear
    return _mm256_or_si256(q1_negated(p, j), _mm256_set1_epi8(1));
  } else if constexpr (T == WType::IQ2_XXS) {  // four words of eight magnitudes, iq3_xxs's signs
    const __m128i idx = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(load_u32(p + kIq2xxsQs + 8 * j))));
    const __m256i g = _mm256_i32gather_epi64(reinterpret_cast<const long long*>(iq2xxs_grid()), idx, 8);
    return even_signed(g, iq2xxs_aux(p, j));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + codes + 16 * j));
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grid_values(T))));
    const __m256i q = _mm256_shuffle_epi8(table, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4)));
    if constexpr (T == WType::IQ4_XSH) return _mm256_add_epi8(q, _mm256_set1_epi8(static_cast<char>(iq4xsh_shift(p, j))));
    else return q;
  }
}

// The scales of stored block p's 32-blocks: lane j = 32-block j (iq4_xs:
// d * (l_j - 32), l_j's low 4 bits from the nibbles of bytes 4..7, its high
// 2 from bits 2j of the u16 at 2); every lane the one scale otherwise.
template <WType T>
IE_INLINE __m256 block_scales(const uint8_t* p) {
  if constexpr (T == WType::IQ4_XS || T == WType::IQ4_XSH) {
    uint32_t lo;
    std::memcpy(&lo, p + 4, 4);
    const __m128i nib = _mm_unpacklo_epi8(_mm_cvtsi32_si128(static_cast<int>(lo & 0x0F0F0F0Fu)),
                                          _mm_cvtsi32_si128(static_cast<int>((lo >> 4) & 0x0F0F0F0Fu)));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(load_u16(p + 2)),
                                                          _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i l = _mm256_add_epi32(_mm256_cvtepu8_epi32(nib), _mm256_slli_epi32(hi, 4));
    return _mm256_mul_ps(f16_bcast(p), _mm256_cvtepi32_ps(_mm256_sub_epi32(l, _mm256_set1_epi32(32))));
  } else if constexpr (T == WType::IQ3_S) {
    uint32_t sc;
    std::memcpy(&sc, p + kIq3sScales, 4);
    const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sc)),
                                                         _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(0xF));
    const __m256i l = _mm256_add_epi32(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1));
    return _mm256_mul_ps(f16_bcast(p), _mm256_cvtepi32_ps(l));
  } else if constexpr (T == WType::IQ3_XXS || T == WType::IQ2_XXS) {
    // d * (0.5 + s_j) * 0.5 (iq2_xxs: * 0.25), s_j the top nibble of sub-block j's word (iq2_xxs's 8 bytes apart)
    const __m256i aux = T == WType::IQ3_XXS
                            ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kIq3xxsAux))
                            : _mm256_i32gather_epi32(reinterpret_cast<const int*>(p + kIq2xxsQs + 4),
                                                     _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), 4);
    const __m256i s = _mm256_srli_epi32(aux, 28);
    return _mm256_mul_ps(_mm256_mul_ps(f16_bcast(p), _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_cvtepi32_ps(s))),
                         _mm256_set1_ps(T == WType::IQ3_XXS ? 0.5f : 0.25f));
  } else if constexpr (T == WType::MXFP4) {
    return _mm256_set1_ps(e8m0_half(p[0]));
  } else {
    return f16_bcast(p);
  }
}

// Lane j of v in every lane (S = 1: v already is).
template <int S>
IE_INLINE __m256 lane(__m256 v, int j) {
  if constexpr (S == 1) return v;
  else return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j));
}

IE_INLINE void prefetch_block(const uint8_t* p, int64_t bytes, int64_t pf) {
  for (int64_t o = 0; o < bytes; o += 64) prefetch(p + o + pf);
}

// act=f32: per 32-block, scale * sum_j v_j x_j, the inner sum in FMA chains
// (q5_1: plus min * sum_j x_j).
template <WType T, int R, int B>
void i8_blocks_f32_rows(const GemvArgs& a, int64_t r0, float* out) {
  constexpr int NC = chains_for(R * B), S = kSubs<T>;
  constexpr int64_t BB = kBlockBytes<T>;
  const int64_t cols = a.spec.cols, nsb = cols / (32 * S);
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256 sc[R];
    for (int rr = 0; rr < R; ++rr) {
      prefetch_block(row[rr] + sb * BB, BB, pf);
      sc[rr] = block_scales<T>(row[rr] + sb * BB);
    }
    for (int j = 0; j < S; ++j) {
      const int64_t c0 = (sb * S + j) * 32;
      __m256 P[R][B][NC];
      for (auto& ra : P)
        for (auto& ba : ra)
          for (auto& c : ba) c = _mm256_setzero_ps();
      __m256i v[R];
      for (int rr = 0; rr < R; ++rr) v[rr] = block_values<T>(row[rr] + sb * BB, j);
      __m256 xsum[B];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        __m256 xk[B];
        for (int b = 0; b < B; ++b) {
          xk[b] = _mm256_loadu_ps(a.x + b * cols + c0 + 8 * u);
          if constexpr (kHasMin<T>) xsum[b] = u ? _mm256_add_ps(xsum[b], xk[b]) : xk[b];
        }
        for (int rr = 0; rr < R; ++rr) {
          const __m128i h = u < 2 ? _mm256_castsi256_si128(v[rr]) : _mm256_extracti128_si256(v[rr], 1);
          const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(u % 2 ? _mm_srli_si128(h, 8) : h));
          for (int b = 0; b < B; ++b) P[rr][b][u % NC] = _mm256_fmadd_ps(w, xk[b], P[rr][b][u % NC]);
        }
      }
      for (int rr = 0; rr < R; ++rr) {
        const __m256 d = lane<S>(sc[rr], j);
        for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(sum_chains<NC>(P[rr][b]), d, acc[rr][b]);
        if constexpr (kHasMin<T>) {
          const __m256 m = f16_bcast(row[rr] + sb * BB + 2);
          for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(xsum[b], m, acc[rr][b]);
        }
      }
    }
  }
  store_sums(acc, out);
}

// act=int8 for q8_0, q5_0, q5_1 and the codebook types (x as Q8Nat): per 32-block,
// (scale * dx) * int32 sum_j v_j qx_j; maddubs takes |v| unsigned and moves
// v's sign onto qx (|v| <= 127, so the pair sums fit int16). q5_1's codes
// are unsigned already, and its min meets dx * sum qx (the prepared ds).
// The codebook types' scales are their super-block's (block_scales, once per super-block).
template <WType T, int R, int B>
void i8_q8_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int S = kSubs<T>;
  constexpr int64_t BB = kBlockBytes<T>;
  const int64_t nblk = a.spec.cols / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* row[R];
  __m256 acc[R][B];
  __m256 sc[R] = {};  // S > 1: the super-block's, set at its first 32-block
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int j = static_cast<int>(blk % S);
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* p = row[rr] + blk / S * BB;
      __m256 d;
      if constexpr (S == 1) {
        prefetch(p + pf);
        d = f16_bcast(p);
      } else {
        if (j == 0) {
          prefetch_block(p, BB, pf);
          sc[rr] = block_scales<T>(p);
        }
        d = lane<S>(sc[rr], j);
      }
      const __m256i v = block_values<T>(p, j);
      const __m256i av = kHasMin<T> ? v : _mm256_sign_epi8(v, v);
      // q5_1's min in lane 0 only (the lanes are summed at the end)
      const __m256 m = kHasMin<T> ? _mm256_zextps128_ps256(_mm_set_ss(_cvtsh_ss(load_u16(p + 2)))) : __m256{};
      for (int b = 0; b < B; ++b) {
        __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (blk * B + b) * 32));
        if constexpr (!kHasMin<T>) xq = _mm256_sign_epi8(xq, v);
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(av, xq), ones);
        acc[rr][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_broadcast_ss(xa.d + blk * B + b)),
                                     acc[rr][b]);
        if constexpr (kHasMin<T>) acc[rr][b] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(xa.ds + blk * B + b), acc[rr][b]);
      }
    }
  }
  store_sums(acc, out);
}

// act=int8 for q1_0, a 128-block at a time. A set sign bit is +d and a clear one -d, so a row's dot with a
// 32-block x is d (2 (the sum of x where the bit is set) - (the sum of x)): each 32-block's activation (loaded
// once for all rows) summed by maddubs against the row's set bits as 0/1 bytes, and the activation's own sums
// (Q8Nat's ds, its scale times its codes' sum, the same for every row) taken off once, in lane 0, where the
// block's accumulator meets d.
template <int R, int B>
void q1_q8_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int64_t BB = kBlockBytes<WType::Q1_0>;
  const int64_t nsb = a.spec.cols / 128;
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256 two = _mm256_set1_ps(2.f);
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256 blk[R][B], sums[B];
    for (auto& r : blk)
      for (auto& v : r) v = _mm256_setzero_ps();
    for (int b = 0; b < B; ++b) sums[b] = _mm256_zextps128_ps256(_mm_set_ss(q8_ds128(xa, sb, B, b)));
    for (int rr = 0; rr < R; ++rr) prefetch(row[rr] + sb * BB + pf);
    for (int k = 0; k < 4; ++k) {
      const int64_t xb = sb * 4 + k;  // the activation's 32-block
      __m256i xq[B];
      __m256 xd[B];
      for (int b = 0; b < B; ++b) {
        xq[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (xb * B + b) * 32));
        xd[b] = _mm256_broadcast_ss(xa.d + xb * B + b);
      }
      for (int rr = 0; rr < R; ++rr) {
        const __m256i set = q1_set(row[rr] + sb * BB, k);
        for (int b = 0; b < B; ++b) {
          const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(set, xq[b]), ones16);
          blk[rr][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), xd[b], blk[rr][b]);
        }
      }
    }
    for (int rr = 0; rr < R; ++rr) {
      const __m256 d = f16_bcast(row[rr] + sb * BB);
      for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(_mm256_fmsub_ps(blk[rr][b], two, sums[b]), d, acc[rr][b]);
    }
  }
  store_sums(acc, out);
}

// 32 code bytes v whose low and high nibbles index table (values plus sh),
// dotted with an activation regrouped to match (xl, xh: each row b's), into
// acc[b] at d times the activation's scales xd[b]; maddubs takes |value|
// unsigned and moves its sign onto x (|value| <= 127: the pair sums fit int16).
template <int B>
IE_INLINE void nibble_pair_dots(__m256i table, __m256i v, __m256i sh, const __m256i (&xl)[B], const __m256i (&xh)[B],
                                __m256 d, const __m256 (&xd)[B], __m256 (&acc)[B]) {
  const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
  const __m256i wl = _mm256_add_epi8(_mm256_shuffle_epi8(table, _mm256_and_si256(v, m4)), sh);
  const __m256i wh = _mm256_add_epi8(_mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)), sh);
  const __m256i al = _mm256_sign_epi8(wl, wl), ah = _mm256_sign_epi8(wh, wh);
  for (int b = 0; b < B; ++b) {
    const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(al, _mm256_sign_epi8(xl[b], wl)), ones),
                                       _mm256_madd_epi16(_mm256_maddubs_epi16(ah, _mm256_sign_epi8(xh[b], wh)), ones));
    acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, xd[b]), acc[b]);
  }
}

// act=int8 for iq4_nl / iq4_xs / mxfp4, two 32-blocks at a time: their 32 code bytes
// make one vector whose low nibbles are elements 0..15 of both blocks (one
// block per 128-bit lane) and whose high nibbles are elements 16..31; the
// activation's two blocks are regrouped to match by two lane permutes shared
// by all rows. A pair then costs two shuffles, two maddubs and one float FMA
// per row. iq4_xs pairs never straddle a super-block (8 sub-blocks); an
// iq4_nl or mxfp4 row with an odd number of blocks ends on a lone block
// (zeros beside).
template <WType T, int R, int B>
void iq4_q8_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int S = kSubs<T>, kCodes = wtype_info(T).code_offset;
  constexpr int64_t BB = kBlockBytes<T>;
  const int64_t nblk = a.spec.cols / 32;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grid_values(T))));
  const uint8_t* row[R];
  __m256 acc[R][B];
  __m256 sc[R] = {};  // iq4_xs: set at each super-block's first pair (k % S == 0, k starts at 0)
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t k = 0; k < nblk; k += 2) {
    const bool pair = k + 1 < nblk;
    __m256i xl[B], xh[B];
    __m256 xd[B];
    for (int b = 0; b < B; ++b) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (k * B + b) * 32));
      const __m256i x1 =
          pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + ((k + 1) * B + b) * 32)) : _mm256_setzero_si256();
      xl[b] = _mm256_permute2x128_si256(x0, x1, 0x20);
      xh[b] = _mm256_permute2x128_si256(x0, x1, 0x31);
      xd[b] = _mm256_set_m128(_mm_set1_ps(pair ? xa.d[(k + 1) * B + b] : 0.f), _mm_set1_ps(xa.d[k * B + b]));
    }
    for (int rr = 0; rr < R; ++rr) {
      __m256i v, sh = _mm256_setzero_si256();  // sh: iq4_xsh's shifts of the pair's two sub-blocks
      __m256 d;
      if constexpr (S == 1) {
        const uint8_t* p = row[rr] + k * BB;
        prefetch(p + pf);
        const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kCodes));
        const __m128i c1 = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + BB + kCodes)) : _mm_setzero_si128();
        v = _mm256_set_m128i(c1, c0);
        d = _mm256_set_m128(_mm_set1_ps(pair ? grid_scale(T, p + BB) : 0.f), _mm_set1_ps(grid_scale(T, p)));
      } else {
        const int j = static_cast<int>(k % S);
        const uint8_t* p = row[rr] + k / S * BB;
        if (j == 0) {
          prefetch_block(p, BB, pf);
          sc[rr] = block_scales<T>(p);
        }
        v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kCodes + 16 * j));
        d = _mm256_permutevar8x32_ps(sc[rr], _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1));
        if constexpr (T == WType::IQ4_XSH)  // each sub-block's values on its grid (|v| <= 127 still)
          sh = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(iq4xsh_shift(p, j + 1))),
                                _mm_set1_epi8(static_cast<char>(iq4xsh_shift(p, j))));
      }
      nibble_pair_dots<B>(table, v, sh, xl, xh, d, xd, acc[rr]);
    }
  }
  store_sums(acc, out);
}

// ------------------------------------------------------------------ nvfp4

// Two 64-blocks' scales (their four bytes each, at p and q) times the
// tensor scale, by one gather from kUe4m3, each in the two lanes of its
// sub-block: [d0, d0, d1, d1, d2, d2, d3, d3] of p's in d[0], of q's in d[1].
// One gather per block instead: 3.45 ms where this takes 3.0 (16384 x 8192,
// 2 threads); integer steps to the float's fields, 3.8.
IE_INLINE void nvfp4_scales(const uint8_t* p, const uint8_t* q, float tensor_scale, __m256 (&d)[2]) {
  const __m128i b = _mm_insert_epi32(_mm_cvtsi32_si128(static_cast<int>(load_u32(p))), static_cast<int>(load_u32(q)), 1);
  const __m256 both = _mm256_mul_ps(_mm256_i32gather_ps(kUe4m3.v, _mm256_cvtepu8_epi32(b), 4), _mm256_set1_ps(tensor_scale));
  d[0] = _mm256_permutevar8x32_ps(both, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  d[1] = _mm256_permutevar8x32_ps(both, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
}

// act=int8, a 64-block (two activation blocks) at a time, blocks in pairs
// (their scales one gather; a row's odd last block pairs with itself): its
// 32 code bytes are one vector whose low nibbles are elements 0..7 of each
// 16-element sub-block and whose high nibbles 8..15 (sub-blocks 0, 1 in the
// low lane, 2, 3 in the high); the activation's two blocks are regrouped to
// match by two lane permutes and two 64-bit unpacks shared by all rows.
// maddubs and madd leave each sub-block's sum in two int32 lanes, which meet
// its scale there and the activation block's (low lanes x0's, high x1's).
template <int R, int B>
void nvfp4_q8_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int64_t BB = kBlockBytes<WType::NVFP4>;
  const int64_t nsb = a.spec.cols / 64;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Grid.v)));
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb0 = 0; sb0 < nsb; sb0 += 2) {
    const int pair = sb0 + 1 < nsb ? 2 : 1;
    __m256 d[R][2];
    for (int rr = 0; rr < R; ++rr)
      nvfp4_scales(row[rr] + sb0 * BB, row[rr] + (sb0 + pair - 1) * BB, a.spec.scale, d[rr]);
    for (int h = 0; h < pair; ++h) {
      const int64_t sb = sb0 + h, k = 2 * sb;  // k: the activation's first 32-block
      __m256i xl[B], xh[B];
      __m256 xd[B];
      for (int b = 0; b < B; ++b) {
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (k * B + b) * 32));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + ((k + 1) * B + b) * 32));
        const __m256i lo = _mm256_permute2x128_si256(x0, x1, 0x20), hi = _mm256_permute2x128_si256(x0, x1, 0x31);
        xl[b] = _mm256_unpacklo_epi64(lo, hi);
        xh[b] = _mm256_unpackhi_epi64(lo, hi);
        xd[b] = _mm256_set_m128(_mm_set1_ps(xa.d[(k + 1) * B + b]), _mm_set1_ps(xa.d[k * B + b]));
      }
      for (int rr = 0; rr < R; ++rr) {
        const uint8_t* p = row[rr] + sb * BB;
        prefetch(p + pf);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kNvfp4Qs));
        nibble_pair_dots<B>(table, v, _mm256_setzero_si256(), xl, xh, d[rr][h], xd, acc[rr]);
      }
    }
  }
  store_sums(acc, out);
}

// act=f32: each sub-block's 16 values (its 8 bytes' low nibbles, then the
// high ones: element order) times its scale, two FMAs per activation row.
template <int R, int B>
void nvfp4_f32_rows(const GemvArgs& a, int64_t r0, float* out) {
  constexpr int64_t BB = kBlockBytes<WType::NVFP4>;
  const int64_t cols = a.spec.cols, nsb = cols / 64;
  const __m128i m4 = _mm_set1_epi8(0xF), table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Grid.v));
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* p = row[rr] + sb * BB;
      prefetch(p + pf);
      for (int t = 0; t < 4; ++t) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kNvfp4Qs + 8 * t));
        const __m128i vals = _mm_shuffle_epi8(
            table, _mm_unpacklo_epi64(_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
        const __m256 d = _mm256_set1_ps(kUe4m3.v[p[t]] * a.spec.scale);
        const __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(vals)), d);
        const __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(vals, 8))), d);
        const float* x = a.x + sb * 64 + 16 * t;
        for (int b = 0; b < B; ++b) {
          acc[rr][b] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + b * cols), acc[rr][b]);
          acc[rr][b] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + b * cols + 8), acc[rr][b]);
        }
      }
    }
  }
  store_sums(acc, out);
}

// ------------------------------------------------------------- q4_k, q5_k

// q5_k is q4_k with a fifth code bit: the same super-block header, its
// nibbles at 48, and bit j of byte e of the 32 bytes at 16 the fifth bit of
// element e of sub-block j. One kernel per activation type serves both.
template <WType T>
constexpr int64_t kKBytes = T == WType::Q5_K ? kQ5kBytes : kQ4kBytes;
template <WType T>
constexpr int kKCodes = T == WType::Q5_K ? kQ5kCodes : kQ4kCodes;

// act=f32: per sub-block j, scale_j * sum q x - min_j * sum x. A 32-byte code
// chunk holds sub-blocks 2c (low nibbles) and 2c + 1 (high), both in element
// order, so x is read as it is; the per-sub-block sums land in lane j of a
// vector (q.x sums, reduced per chunk) and meet the scale vectors once per
// super-block.
template <WType T, int R, int B>
void k_f32_rows(const GemvArgs& a, int64_t r0, float* out) {
  constexpr int64_t BB = kKBytes<T>;
  constexpr int kCodes = kKCodes<T>;
  constexpr bool q5 = T == WType::Q5_K;
  const int64_t cols = a.spec.cols, nsb = cols / 256;
  const __m256i m4 = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    alignas(32) float qx[R][B][8], xs[B][8];
    for (int rr = 0; rr < R; ++rr) prefetch_block(row[rr] + sb * BB, BB, pf);
    for (int c = 0; c < 4; ++c) {
      __m256 plo[R][B], phi[R][B], xlo[B], xhi[B];
      for (int b = 0; b < B; ++b) xlo[b] = xhi[b] = _mm256_setzero_ps();
      for (auto& ra : plo)
        for (auto& v : ra) v = _mm256_setzero_ps();
      for (auto& ra : phi)
        for (auto& v : ra) v = _mm256_setzero_ps();
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        __m256 x0[B], x1[B];
        for (int b = 0; b < B; ++b) {
          const float* xp = a.x + b * cols + sb * 256 + 64 * c + 8 * u;
          x0[b] = _mm256_loadu_ps(xp);
          x1[b] = _mm256_loadu_ps(xp + 32);
          xlo[b] = _mm256_add_ps(xlo[b], x0[b]);
          xhi[b] = _mm256_add_ps(xhi[b], x1[b]);
        }
        for (int rr = 0; rr < R; ++rr) {
          const uint8_t* blk = row[rr] + sb * BB;
          const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + kCodes + 32 * c + 8 * u)));
          __m256i ql = _mm256_and_si256(q, m4), qh = _mm256_srli_epi32(q, 4);
          if constexpr (q5) {
            const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + kQ5kHigh + 8 * u)));
            ql = _mm256_or_si256(ql, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * c), one), 4));
            qh = _mm256_or_si256(qh, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * c + 1), one), 4));
          }
          const __m256 lo = _mm256_cvtepi32_ps(ql), hi = _mm256_cvtepi32_ps(qh);
          for (int b = 0; b < B; ++b) {
            plo[rr][b] = _mm256_fmadd_ps(lo, x0[b], plo[rr][b]);
            phi[rr][b] = _mm256_fmadd_ps(hi, x1[b], phi[rr][b]);
          }
        }
      }
      for (int b = 0; b < B; ++b) {
        xs[b][2 * c] = hsum(xlo[b]);
        xs[b][2 * c + 1] = hsum(xhi[b]);
      }
      for (int rr = 0; rr < R; ++rr)
        for (int b = 0; b < B; ++b) {
          qx[rr][b][2 * c] = hsum(plo[rr][b]);
          qx[rr][b][2 * c + 1] = hsum(phi[rr][b]);
        }
    }
    for (int rr = 0; rr < R; ++rr) {
      __m256 sc, mn;
      q4k_params(row[rr] + sb * BB, &sc, &mn);
      for (int b = 0; b < B; ++b) {
        acc[rr][b] = _mm256_fmadd_ps(sc, _mm256_load_ps(qx[rr][b]), acc[rr][b]);
        acc[rr][b] = _mm256_fnmadd_ps(mn, _mm256_load_ps(xs[b]), acc[rr][b]);
      }
    }
  }
  store_sums(acc, out);
}

// act=int8 (x as Q8Nat: per 32-block codes, scale d and d * sum of codes):
// per sub-block j, (scale_j d_j) * int32 sum q qx - min_j * (d_j sum qx). The
// eight products scale_j d_j are one vector multiply per super-block; the
// min terms accumulate as a vector too. q5_k's fifth bits join the nibbles
// by two shifts and masks per chunk (codes 0..31: maddubs' pair sums stay
// far inside int16).
template <WType T, int R, int B>
void k_q8_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int64_t BB = kKBytes<T>;
  constexpr int kCodes = kKCodes<T>;
  const int64_t nsb = a.spec.cols / 256;
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0xF);
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256 xd[B], xds[B];  // lane j: d and d * sum of sub-block j's activation codes
    for (int b = 0; b < B; ++b) xd_xds<B>(xa, sb, b, &xd[b], &xds[b]);
    __m256 f[R][B];  // lane j: scale_j * d_j
    __m256i hb[R];   // q5_k: the fifth bits
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* blk = row[rr] + sb * BB;
      prefetch_block(blk, BB, pf);
      __m256 sc, mn;
      q4k_params(blk, &sc, &mn);
      if constexpr (T == WType::Q5_K) hb[rr] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ5kHigh));
      for (int b = 0; b < B; ++b) {
        f[rr][b] = _mm256_mul_ps(sc, xd[b]);
        acc[rr][b] = _mm256_fnmadd_ps(mn, xds[b], acc[rr][b]);
      }
    }
    auto chunk = [&](auto cc) {
      constexpr int c = decltype(cc)::value;
      // hadd below leaves sub-block 2c in lanes 0, 1, 4, 5 and 2c + 1 in 2, 3, 6, 7.
      const __m256i pick = _mm256_setr_epi32(2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1);
      const int64_t k0 = sb * 8 + 2 * c;
      __m256i xq0[B], xq1[B];
      for (int b = 0; b < B; ++b) {
        xq0[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (k0 * B + b) * 32));
        xq1[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + ((k0 + 1) * B + b) * 32));
      }
      for (int rr = 0; rr < R; ++rr) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[rr] + sb * BB + kCodes + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if constexpr (T == WType::Q5_K) {
          lo = _mm256_or_si256(lo, bits_to_4<2 * c>(hb[rr]));
          hi = _mm256_or_si256(hi, bits_to_4<2 * c + 1>(hb[rr]));
        }
        for (int b = 0; b < B; ++b) {
          const __m256i s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xq0[b]), ones);
          const __m256i s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xq1[b]), ones);
          const __m256 s = _mm256_cvtepi32_ps(_mm256_hadd_epi32(s0, s1));
          acc[rr][b] = _mm256_fmadd_ps(s, _mm256_permutevar8x32_ps(f[rr][b], pick), acc[rr][b]);
        }
      }
    };
    chunk(std::integral_constant<int, 0>{});
    chunk(std::integral_constant<int, 1>{});
    chunk(std::integral_constant<int, 2>{});
    chunk(std::integral_constant<int, 3>{});
  }
  store_sums(acc, out);
}

// ------------------------- q6_k, q3_k, q2_k, iq2_xs, iq2_s, iq1_s, iq1_m

// The types of sixteen 16-element sub-blocks per super-block, w =
// (d * sc_j) * (q - Z) - (dmin * m_j): q6_k (6-bit codes, Z = 32, int8
// sub-scales), q3_k (3-bit codes, Z = 4, 6-bit sub-scales less 32), the
// affine q2_k (2-bit codes, Z = 0, 4-bit sub-scales and sub-mins under d and
// dmin), and the codebook types iq2_xs, iq2_s, iq1_s and iq1_m (their
// signed values +-8, 25, 43 or 8 g +- 1 as codes v + 43, Z = 43, so that
// maddubs takes them unsigned and the pair sums stay below 2^15; sub-scales
// 1 + 2 s_j under d / 8). One kernel per activation type serves all seven;
// what differs is below.
template <WType T>
constexpr bool kSub16Affine = T == WType::Q2_K;
template <WType T>
constexpr bool kSub16Book = half_scaled_book(T);
template <WType T>
constexpr int kSub16Zero = T == WType::Q6_K ? 32 : T == WType::Q3_K ? 4 : kSub16Book<T> ? 43 : 0;
template <WType T>
constexpr int kSub16D = T == WType::Q6_K ? kQ6kD : T == WType::Q3_K ? kQ3kD : kQ2kD;  // the k-quants' d

// d of the super-block at blk (the codebook types' d / 8: d * (0.5 + s_j) * 0.25 * g = d / 8 * (1 + 2 s_j) * g).
template <WType T>
IE_INLINE __m256 sub16_d(const uint8_t* blk) {
  if constexpr (kSub16Book<T>) return _mm256_set1_ps(f16_to_f32(half_d_bits(T, blk)) * 0.125f);
  return f16_bcast(blk + kSub16D<T>);
}

// The 32 codes of quarter K of half H, in element order (16-bit shifts:
// what crosses a byte boundary is masked off). q6_k: a nibble from the 64
// bytes of the half, bits 4..5 from bit pair K of the half's 32 high bytes.
// q3_k: bit pair K of the half's 32 low bytes, bit 2 from bit 4 H + K of
// the 32 hmask bytes. q2_k: bit pair K of the half's 32 code bytes.
// iq2_xs, iq2_s: 32-block 4 H + K's four codebook words (four loads: a
// gather took 1.15x the time for iq2_s, 16384 x 8192, 2 threads), their
// signs (iq2_xs: seven stored per eight, kEvenSigns; iq2_s: a bit each), +43.
// iq1_s, iq1_m: the four words of -1, 0, 1 times 8, each eight's shift
// (+-1) added with the 43.
template <WType T, int H, int K>
IE_INLINE __m256i sub16_quarter(const uint8_t* blk) {
  if constexpr (iq1_values(T)) {
    constexpr int j = 4 * H + K;
    const uint64_t* grid = iq1s_grid();
    const __m256i g = _mm256_setr_epi64x(
        static_cast<long long>(grid[iq1_index(T, blk, 4 * j)]), static_cast<long long>(grid[iq1_index(T, blk, 4 * j + 1)]),
        static_cast<long long>(grid[iq1_index(T, blk, 4 * j + 2)]), static_cast<long long>(grid[iq1_index(T, blk, 4 * j + 3)]));
    constexpr long long kUp = 0x2C2C2C2C2C2C2C2C, kDown = 0x2A2A2A2A2A2A2A2A;  // 43 + 1, 43 - 1 in each byte
    const __m256i shift = _mm256_setr_epi64x(iq1_neg(T, blk, 4 * j) ? kDown : kUp, iq1_neg(T, blk, 4 * j + 1) ? kDown : kUp,
                                             iq1_neg(T, blk, 4 * j + 2) ? kDown : kUp, iq1_neg(T, blk, 4 * j + 3) ? kDown : kUp);
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift);
  } else if constexpr (kSub16Book<T>) {
    constexpr bool xs = T == WType::IQ2_XS;
    const uint64_t* grid = xs ? iq2xs_grid() : iq2s_grid();
    const Iq2Index idx{blk, 4 * H + K, xs};
    const __m256i g = _mm256_setr_epi64x(static_cast<long long>(grid[idx[0]]), static_cast<long long>(grid[idx[1]]),
                                         static_cast<long long>(grid[idx[2]]), static_cast<long long>(grid[idx[3]]));
    __m256i v;
    if constexpr (xs) {
      v = even_signed(g, iq2xs_aux(blk, 4 * H + K));
    } else {
      const __m256i neg = bit_mask32(blk + kIq2sSigns + 4 * (4 * H + K));
      v = _mm256_sub_epi8(_mm256_xor_si256(g, neg), neg);
    }
    return _mm256_add_epi8(v, _mm256_set1_epi8(43));
  } else if constexpr (T == WType::Q6_K) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * H + 32 * (K % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6kHigh + 32 * H));
    const __m256i lo = K < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    return _mm256_or_si256(lo, bits_to<2 * K, 4, 2>(qh));
  } else if constexpr (T == WType::Q3_K) {
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ3kLow + 32 * H));
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 2 * K), _mm256_set1_epi8(3)), bits_to<4 * H + K, 2>(hm));
  } else {
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ2kCodes + 32 * H));
    return _mm256_and_si256(_mm256_srli_epi16(ql, 2 * K), _mm256_set1_epi8(3));
  }
}

// The sixteen signed sub-scales sc_j of the super-block at blk as int8, in
// sub-block order. q3_k's: a low nibble of bytes 96..103 (j < 8) or their
// high one, the bit pair 2 (j / 4) of byte 104 + j % 4 above it, less 32.
// q2_k's: the low nibbles of its 16 scale bytes. iq2_xs's and iq2_s's:
// 1 + 2 s_j, s_j nibble j % 2 of scale byte j / 2.
template <WType T>
IE_INLINE __m128i sub16_scales(const uint8_t* blk) {
  if constexpr (T == WType::IQ1_S) {  // bits 12..14 of the eight u16 at 34, each twice
    const __m128i s = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kIq1sQh)), 12),
                                    _mm_set1_epi16(7));
    const __m128i b = _mm_packus_epi16(_mm_add_epi16(_mm_add_epi16(s, s), _mm_set1_epi16(1)), s);
    return _mm_unpacklo_epi8(b, b);
  } else if constexpr (T == WType::IQ1_M) {  // bits 3 m .. 3 m + 2 of u16 h / 4, by 32-bit lane shifts
    const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25), m7 = _mm256_set1_epi32(7);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(load_u32(blk + kIq1mScales))), sh), m7);
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(load_u32(blk + kIq1mScales + 4))), sh), m7);
    const __m256i s16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);  // s_0 .. s_15 as int16
    const __m128i s = _mm_packs_epi16(_mm256_castsi256_si128(s16), _mm256_extracti128_si256(s16, 1));
    return _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
  } else if constexpr (kSub16Book<T>) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + (T == WType::IQ2_XS ? kIq2xsScales : kIq2sScales)));
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    return _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
  } else if constexpr (T == WType::Q6_K) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ6kScales));
  } else if constexpr (T == WType::Q3_K) {
    // the 16 bytes that end with d (inside the block), moved down to start at the scales
    const __m128i v = _mm_srli_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ3kD + 2 - 16)), 2);
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    const __m128i rep = _mm_shuffle_epi8(v, _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11));
    const __m128i high = _mm_and_si128(_mm_srlv_epi32(rep, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
  } else {
    return _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)), _mm_set1_epi8(0xF));
  }
}

// q2_k's sixteen sub-mins m_j (the high nibbles of its scale bytes) as int8.
IE_INLINE __m128i q2k_mins(const uint8_t* blk) {
  return _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)), 4), _mm_set1_epi8(0xF));
}

// act=int8, per 32-element quarter (one activation block k, two 16-element
// sub-blocks): the codes, maddubs with qx, minus maddubs(Z, qx) (the
// offset, shared by all rows), then madd with the two sub-scales as int16
// lanes (|sum| < 2^22), so each quarter costs one float FMA by d_k; the
// row's f16 d multiplies once per super-block. q2_k's mins meet
// maddubs(1, qx) the same way, under dmin.
template <WType T, int R, int B>
void sub16_q8_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  const int64_t nsb = a.spec.cols / 256;
  constexpr int64_t kBytes = wtype_info(T).block_bytes;
  const __m256i zero = _mm256_set1_epi8(kSub16Zero<T>);
  // bytes 0,1 of the low 128-bit lane's dword, bytes 2,3 of the high lane's: sc_2i, sc_2i+1 as int16 x 8 each
  const __m256i bcast = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                         2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256 part[R][B], mpart[R][B];  // mpart: q2_k's sum of m_j * x per row
    __m256i sc16[R], mc16[R];
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* blk = row[rr] + sb * kBytes;
      prefetch_block(blk, kBytes, pf);
      sc16[rr] = _mm256_cvtepi8_epi16(sub16_scales<T>(blk));
      if constexpr (kSub16Affine<T>) mc16[rr] = _mm256_cvtepi8_epi16(q2k_mins(blk));
      for (int b = 0; b < B; ++b) part[rr][b] = mpart[rr][b] = _mm256_setzero_ps();
    }
    static_for<8>([&](auto hk) __attribute__((always_inline)) {
      constexpr int h = decltype(hk)::value / 4, k = decltype(hk)::value % 4;
      {
        const int64_t kb = sb * 8 + 4 * h + k;
        __m256i xq[B], off[B];
        __m256 xd[B];
        for (int b = 0; b < B; ++b) {
          xq[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (kb * B + b) * 32));
          off[b] = _mm256_maddubs_epi16(kSub16Affine<T> ? _mm256_set1_epi8(1) : zero, xq[b]);  // q2_k: the pair sums of x
          xd[b] = _mm256_broadcast_ss(xa.d + kb * B + b);
        }
        for (int rr = 0; rr < R; ++rr) {
          const __m256i q = sub16_quarter<T, h, k>(row[rr] + sb * kBytes);
          const __m256i s2 = _mm256_shuffle_epi8(
              _mm256_permutevar8x32_epi32(sc16[rr], _mm256_set1_epi32(4 * h + k)), bcast);
          for (int b = 0; b < B; ++b) {
            const __m256i p = kSub16Affine<T> ? _mm256_maddubs_epi16(q, xq[b])
                                              : _mm256_sub_epi16(_mm256_maddubs_epi16(q, xq[b]), off[b]);
            const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, s2));
            part[rr][b] = _mm256_fmadd_ps(s, xd[b], part[rr][b]);
          }
          if constexpr (kSub16Affine<T>) {
            const __m256i m2 = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(mc16[rr], _mm256_set1_epi32(4 * h + k)), bcast);
            for (int b = 0; b < B; ++b)
              mpart[rr][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(off[b], m2)), xd[b], mpart[rr][b]);
          }
        }
      }
    });
    for (int rr = 0; rr < R; ++rr) {
      const __m256 d = sub16_d<T>(row[rr] + sb * kBytes);
      for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fmadd_ps(part[rr][b], d, acc[rr][b]);
      if constexpr (kSub16Affine<T>) {
        const __m256 dmin = f16_bcast(row[rr] + sb * kBytes + kQ2kDmin);
        for (int b = 0; b < B; ++b) acc[rr][b] = _mm256_fnmadd_ps(mpart[rr][b], dmin, acc[rr][b]);
      }
    }
  }
  store_sums(acc, out);
}

// act=f32: per quarter the codes as in the int8 kernel, less Z, widened to
// float and FMA'd with x; the two 16-element halves meet their scales
// d * sc_j (one vector of eight per half super-block) per quarter.
template <WType T, int R, int B>
void sub16_f32_rows(const GemvArgs& a, int64_t r0, float* out) {
  const int64_t cols = a.spec.cols, nsb = cols / 256;
  constexpr int64_t kBytes = wtype_info(T).block_bytes;
  const uint8_t* row[R];
  __m256 acc[R][B];
  const int64_t pf = start_rows(a, r0, row, acc);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256 sf[R][2], mf[R][2];  // lane j of sf[.][h]: d * sc_{8h + j}; of mf (q2_k): dmin * m_{8h + j}
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* blk = row[rr] + sb * kBytes;
      prefetch_block(blk, kBytes, pf);
      const __m256 d = sub16_d<T>(blk);
      const __m128i sc = sub16_scales<T>(blk);
      sf[rr][0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
      sf[rr][1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
      if constexpr (kSub16Affine<T>) {
        const __m256 dmin = f16_bcast(blk + kQ2kDmin);
        const __m128i mc = q2k_mins(blk);
        mf[rr][0] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(mc)));
        mf[rr][1] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(mc, 8))));
      }
    }
    static_for<8>([&](auto hk) __attribute__((always_inline)) {
      constexpr int h = decltype(hk)::value / 4, k = decltype(hk)::value % 4;
      {
        __m256 x[B][4];
        for (int b = 0; b < B; ++b)
          for (int u = 0; u < 4; ++u) x[b][u] = _mm256_loadu_ps(a.x + b * cols + sb * 256 + 128 * h + 32 * k + 8 * u);
        for (int rr = 0; rr < R; ++rr) {
          const __m256i q = _mm256_sub_epi8(sub16_quarter<T, h, k>(row[rr] + sb * kBytes), _mm256_set1_epi8(kSub16Zero<T>));
          __m256 w[4];
          for (int u = 0; u < 4; ++u) {
            const __m128i half = u < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
            w[u] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(u % 2 ? _mm_srli_si128(half, 8) : half));
          }
          const __m256 s0 = _mm256_permutevar8x32_ps(sf[rr][h], _mm256_set1_epi32(2 * k));
          const __m256 s1 = _mm256_permutevar8x32_ps(sf[rr][h], _mm256_set1_epi32(2 * k + 1));
          for (int b = 0; b < B; ++b) {
            const __m256 p0 = _mm256_fmadd_ps(w[1], x[b][1], _mm256_mul_ps(w[0], x[b][0]));
            const __m256 p1 = _mm256_fmadd_ps(w[3], x[b][3], _mm256_mul_ps(w[2], x[b][2]));
            acc[rr][b] = _mm256_fmadd_ps(p1, s1, _mm256_fmadd_ps(p0, s0, acc[rr][b]));
          }
          if constexpr (kSub16Affine<T>) {  // less m_j * (the half's x), lane by lane
            const __m256 m0 = _mm256_permutevar8x32_ps(mf[rr][h], _mm256_set1_epi32(2 * k));
            const __m256 m1 = _mm256_permutevar8x32_ps(mf[rr][h], _mm256_set1_epi32(2 * k + 1));
            for (int b = 0; b < B; ++b)
              acc[rr][b] = _mm256_fnmadd_ps(m1, _mm256_add_ps(x[b][2], x[b][3]),
                                            _mm256_fnmadd_ps(m0, _mm256_add_ps(x[b][0], x[b][1]), acc[rr][b]));
          }
        }
      }
    });
  }
  store_sums(acc, out);
}

// ----------------------------------------------------------------- driver

struct Prepared {  // views of the activation's form and of the per-call derived pieces
  NibF32 nf;
  NibQ8 nq;
  Q8Nat q8;
};

template <WType T, int R, int B>
void i8_blocks_rows(const GemvArgs& a, const Prepared& p, int64_t r0, float* out) {
  if (a.act == Act::F32) i8_blocks_f32_rows<T, R, B>(a, r0, out);
  else if constexpr (T == WType::IQ4_NL || T == WType::IQ4_XS || T == WType::IQ4_XSH || T == WType::MXFP4)
    iq4_q8_rows<T, R, B>(a, p.q8, r0, out);
  else i8_q8_rows<T, R, B>(a, p.q8, r0, out);
}

// Rows [r0, r0 + R) for all B activation rows: kernel, then zero-point/min
// term, bias, store.
template <int R, int B>
void run_rows(const GemvArgs& a, const Prepared& p, int64_t r0, float* sf) {
  float out[R * B] = {}, off[R * B] = {};
  const WType t = a.spec.type;
  const bool q8 = a.act == Act::Int8;
  switch (t) {
    case WType::F32: float_rows<WType::F32, R, B>(a, r0, out); break;
    case WType::F16: float_rows<WType::F16, R, B>(a, r0, out); break;
    case WType::BF16: float_rows<WType::BF16, R, B>(a, r0, out); break;
    case WType::Q8_0: i8_blocks_rows<WType::Q8_0, R, B>(a, p, r0, out); break;
    case WType::Q5_0: i8_blocks_rows<WType::Q5_0, R, B>(a, p, r0, out); break;
    case WType::Q5_1: i8_blocks_rows<WType::Q5_1, R, B>(a, p, r0, out); break;
    case WType::IQ4_NL: i8_blocks_rows<WType::IQ4_NL, R, B>(a, p, r0, out); break;
    case WType::IQ4_XS: i8_blocks_rows<WType::IQ4_XS, R, B>(a, p, r0, out); break;
    case WType::IQ4_XSH: i8_blocks_rows<WType::IQ4_XSH, R, B>(a, p, r0, out); break;
    case WType::MXFP4: i8_blocks_rows<WType::MXFP4, R, B>(a, p, r0, out); break;
    case WType::IQ3_S: i8_blocks_rows<WType::IQ3_S, R, B>(a, p, r0, out); break;
    case WType::IQ3_XXS: i8_blocks_rows<WType::IQ3_XXS, R, B>(a, p, r0, out); break;
    case WType::IQ2_XXS: i8_blocks_rows<WType::IQ2_XXS, R, B>(a, p, r0, out); break;
    case WType::Q1_0:
      if (q8) q1_q8_rows<R, B>(a, p.q8, r0, out);
      else i8_blocks_f32_rows<WType::Q1_0, R, B>(a, r0, out);
      break;
    case WType::NVFP4:
      if (q8) nvfp4_q8_rows<R, B>(a, p.q8, r0, out);
      else nvfp4_f32_rows<R, B>(a, r0, out);
      break;
    case WType::Q4_K:
      if (q8) k_q8_rows<WType::Q4_K, R, B>(a, p.q8, r0, out);
      else k_f32_rows<WType::Q4_K, R, B>(a, r0, out);
      break;
    case WType::Q5_K:
      if (q8) k_q8_rows<WType::Q5_K, R, B>(a, p.q8, r0, out);
      else k_f32_rows<WType::Q5_K, R, B>(a, r0, out);
      break;
    case WType::Q6_K:
      if (q8) sub16_q8_rows<WType::Q6_K, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::Q6_K, R, B>(a, r0, out);
      break;
    case WType::Q3_K:
      if (q8) sub16_q8_rows<WType::Q3_K, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::Q3_K, R, B>(a, r0, out);
      break;
    case WType::Q2_K:
      if (q8) sub16_q8_rows<WType::Q2_K, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::Q2_K, R, B>(a, r0, out);
      break;
    case WType::IQ2_XS:
      if (q8) sub16_q8_rows<WType::IQ2_XS, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::IQ2_XS, R, B>(a, r0, out);
      break;
    case WType::IQ2_S:
      if (q8) sub16_q8_rows<WType::IQ2_S, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::IQ2_S, R, B>(a, r0, out);
      break;
    case WType::IQ1_S:
      if (q8) sub16_q8_rows<WType::IQ1_S, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::IQ1_S, R, B>(a, r0, out);
      break;
    case WType::IQ1_M:
      if (q8) sub16_q8_rows<WType::IQ1_M, R, B>(a, p.q8, r0, out);
      else sub16_f32_rows<WType::IQ1_M, R, B>(a, r0, out);
      break;
    case WType::Q4_0:
      if (q8) q4_q8_rows<R, B, false>(a, p.nq, r0, out);
      else q4_f32_rows<R, B, false>(a, p.nf, r0, out);
      break;
    case WType::Q4_1:
      if (q8) q4_q8_rows<R, B, true>(a, p.nq, r0, out);
      else q4_f32_rows<R, B, true>(a, p.nf, r0, out);
      break;
    case WType::Int4w: {
      const int64_t sfs = a.spec.cols / 32 + 1;
            // Zero point / min: per-row dot of the scales (x -8) or mins with the group sums of x.
      const float* c = q8 ? p.nq.gq : p.nf.gsum;
      for (int rr = 0; rr < R; ++rr) int4w_setup_row<B>(a, r0 + rr, c, sf + rr * sfs, off + rr * B);
      const int cpg = int4w_cpg(a.spec);
      auto go = [&](auto cp) {
        constexpr int CPG = decltype(cp)::value;
        if (!q8) int4w_f32_rows<R, B, CPG>(a, p.nf, r0, sf, out);
        else int4w_q8_rows<R, B, CPG>(a, p.nq, r0, sf, out);
      };
      if (cpg == 0) go(std::integral_constant<int, 0>{});
      else if (cpg == 1) go(std::integral_constant<int, 1>{});
      else if (cpg == 2) go(std::integral_constant<int, 2>{});
      else go(std::integral_constant<int, -1>{});
      break;
    }
  }
  const int64_t rows = a.spec.rows;
  for (int rr = 0; rr < R; ++rr)
    for (int b = 0; b < B; ++b) {
      float v = out[rr * B + b] + off[rr * B + b];
      if (a.bias) v += a.bias[r0 + rr];
      a.y[b * rows + r0 + rr] = v;
    }
}

// Rows processed together (sharing activation loads and keeping enough
// independent FMA chains in flight); 1 for large batches (register pressure).
int rows_per_step(const GemvArgs& a) {
  if (a.batch > 2) return 1;
  if (a.batch == 2) return 2;
  if (a.act == Act::Int8) return 4;
  return 2;
}

template <int R, int B>
void run_range(const GemvArgs& a, const Prepared& p, int64_t r, int64_t r1, float* sf, int t) {
  if (a.src) {
    run_from_source<R>(a, t, r, r1, [&](const GemvArgs& sub, int n) {
      if (n == R) run_rows<R, B>(sub, p, 0, sf);
      else run_rows<1, B>(sub, p, 0, sf);
    });
    return;
  }
  for (; r + R <= r1; r += R) run_rows<R, B>(a, p, r, sf);
  for (; r < r1; ++r) run_rows<1, B>(a, p, r, sf);
}

bool nibbles(WType t) { return t == WType::Int4w || t == WType::Q4_0 || t == WType::Q4_1; }

Prep prep_kind_avx2(WType t, Act act) {
  if (nibbles(t)) return act == Act::Int8 ? Prep::NibQ8 : Prep::NibF32;
  // every other packed type reads x quantized in element order (Q8Nat), per its act_block
  if (act == Act::Int8 && t != WType::F32 && t != WType::F16 && t != WType::BF16)
    return wtype_act_block(t) == 256 ? Prep::Q8Super : Prep::Q8Blocks;
  return Prep::None;
}

size_t prep_bytes_avx2(Prep kind, int B, int64_t cols) {
  size_t used = 0;
  if (kind == Prep::NibF32) carve_nib_f32(nullptr, B, cols, &used);
  else if (kind == Prep::NibQ8) carve_nib_q8(nullptr, B, cols, &used);
  else if (kind == Prep::Q8Blocks || kind == Prep::Q8Super) carve_q8_nat(nullptr, B, cols, &used);
  return used;
}

void prepare_avx2(Prep kind, const float* x, int B, int64_t cols, uint8_t* out, ThreadPool& pool) {
  if (kind == Prep::NibF32) prep_nib_f32(x, B, cols, out);
  else if (kind == Prep::NibQ8) prep_nib_q8(x, B, cols, out);
  else if (kind == Prep::Q8Blocks || kind == Prep::Q8Super) prep_q8_nat(x, B, cols, out, pool, kind == Prep::Q8Super);
}

// Scratch: the derived activation pieces, then one int4w scale row per thread.
struct Scratch {
  float* derived = nullptr;  // int4w: [B][G]; q4_0/q4_1 act=f32: [nch][B][8]
  float* sf = nullptr;       // int4w: [threads][sf_stride]
  int64_t sf_stride = 0;
};

Scratch carve_scratch(const GemvArgs& a, uint8_t* base, size_t* used = nullptr) {
  Carve c(base);
  Scratch s;
  const WType t = a.spec.type;
  if (t == WType::Int4w) {
    s.derived = c.take<float>(static_cast<size_t>(a.batch * a.lay.groups));
    s.sf_stride = 4 * (a.spec.cols / 32 + 1);
    s.sf = c.take<float>(static_cast<size_t>(a.pool->size() * s.sf_stride));
  } else if ((t == WType::Q4_0 || t == WType::Q4_1) && a.act == Act::F32) {
    s.derived = c.take<float>(static_cast<size_t>(a.batch * ((a.spec.cols + 63) / 64) * 8));
  }
  if (used) *used = c.used();
  return s;
}

size_t scratch_bytes_avx2(const GemvArgs& a) {
  size_t used = 0;
  carve_scratch(a, nullptr, &used);
  return used;
}

// The views of a.prep, plus what depends on this matrix, derived into scratch
// in the order the one-shot preparation used to sum them (bit-identical).
Prepared derive(const GemvArgs& a, const Scratch& sc) {
  Prepared p;
  const WType t = a.spec.type;
  const int B = a.batch;
  const int64_t cols = a.spec.cols, nblk = cols / 32;
  uint8_t* arena = const_cast<uint8_t*>(a.prep);
  if (!nibbles(t)) {
    const Prep kind = prep_kind_avx2(t, a.act);
    if (kind == Prep::Q8Blocks || kind == Prep::Q8Super) p.q8 = carve_q8_nat(arena, B, cols);
    return p;
  }
  if (a.act == Act::F32) {
    p.nf = carve_nib_f32(arena, B, cols);
    if (t == WType::Int4w) {
      const int64_t G = a.lay.groups, bpg = a.spec.group_size / 32;
      for (int b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g) {
          double s = 0;
          for (int64_t k = 0; k < bpg; ++k) s += p.nf.bsum[b * nblk + g * bpg + k];
          sc.derived[b * G + g] = static_cast<float>(s);
        }
      p.nf.gsum = sc.derived;
    } else {
      const float coef = t == WType::Q4_0 ? -8.f : 1.f;
      std::memset(sc.derived, 0, static_cast<size_t>(B * p.nf.nch * 8) * sizeof(float));
      for (int b = 0; b < B; ++b)
        for (int64_t blk = 0; blk < nblk; ++blk)
          sc.derived[((blk / 2) * B + b) * 8 + (blk % 2) * 4] = coef * p.nf.bsum[b * nblk + blk];
      p.nf.bsv = sc.derived;
    }
  } else {
    p.nq = carve_nib_q8(arena, B, cols);
    if (t == WType::Int4w) {
      const int64_t G = a.lay.groups;
      for (int b = 0; b < B; ++b) {
        for (int64_t g = 0; g < G; ++g) {
          double s = 0;
          for (int64_t blk = g * a.spec.group_size / 32; blk < (g + 1) * a.spec.group_size / 32; ++blk)
            s += p.nq.ms[((blk / 2) * B + b) * 8 + (blk % 2) * 4];
          sc.derived[b * G + g] = static_cast<float>(s);
        }
      }
      p.nq.gq = sc.derived;
    }
  }
  return p;
}

void gemv_avx2(const GemvArgs& a) {
  const Scratch sc = carve_scratch(a, a.scratch);
  const Prepared p = derive(a, sc);
  const int64_t rows = a.spec.rows;
  const int R = rows_per_step(a);
  with_batch(a.batch, [&](auto bc) {
    constexpr int B = decltype(bc)::value;
    RowSplit split(rows, a.pool->size());
    a.pool->run([&](int t) {
      float* sf = sc.sf ? sc.sf + t * sc.sf_stride : nullptr;
      int64_t r0, r1;
      while (split.next(t, &r0, &r1)) {
        if (R == 4 && B == 1) run_range<4, 1>(a, p, r0, r1, sf, t);
        else if (R == 2 && B <= 2) run_range<2, B>(a, p, r0, r1, sf, t);
        else run_range<1, B>(a, p, r0, r1, sf, t);
      }
    });
  });
}

}  // namespace

const GemvOps kGemvAvx2 = {prep_kind_avx2, prep_bytes_avx2, prepare_avx2, scratch_bytes_avx2, gemv_avx2,
                           quantize_q8_avx2, gemv_rows8_avx2};
// The stored layouts' kernels and the activation quantizer are AVX2's (so
// the prepared forms are the same bytes); only the rows8 kernels differ.
const GemvOps kGemvAvxVnni = {prep_kind_avx2, prep_bytes_avx2, prepare_avx2, scratch_bytes_avx2, gemv_avx2,
                              quantize_q8_avx2, gemv_rows8_avxvnni};
// AVX-512's and AMX's own stored-layout kernels (avx512.cpp) take what
// they cover and hand the rest to AVX2's.
const GemvOps kGemvAvx512 = {prep_kind_avx2, prep_bytes_avx2, prepare_avx2, scratch_bytes_avx2, gemv_avx512,
                             quantize_q8_avx2, gemv_rows8_avx512};
const GemvOps kGemvAmx = {prep_kind_avx2, prep_bytes_avx2, prepare_avx2, scratch_bytes_avx2, gemv_avx512,
                          quantize_q8_avx2, gemv_rows8_amx};

}  // namespace ie
