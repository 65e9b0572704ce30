// act=int8 GEMVs over the stored layout of iq4_nl, mxfp4, q4_k and q1_0 with
// AVX-512 VNNI and VBMI: the kernels a decoder's experts run at one to
// eight tokens (a decoder copies no expert into rows8, and packing tiles
// costs more than it saves below kPackingMinTokens). Every other case is
// AVX2's (avx2.cpp). q4_k's kernel is described at its section below.
//
// Why a kernel of its own: AVX2's reads two blocks a step and turns each
// block's scale into a float with scalar code, ~12 vector uops per 17
// bytes; on gpt-oss-20b's experts it reached half the read bandwidth and
// took 40% of a decode step. Here one step reads four blocks (68 or 72
// bytes) as two loads, and one two-source byte permute (vpermt2b) gathers
// their 64 code bytes so that 128-bit lane j holds block j's 16 bytes;
// a second permute gathers the four scales into the same lanes. The codes'
// low nibbles are elements 0..15 of each block and the high ones 16..31,
// so the activation's four blocks are regrouped to match once per step for
// every row (two qword permutes).
//
// vpdpbusd multiplies unsigned bytes by signed ones, so a table value v is
// looked up as v + kOff (unsigned: iq4_nl's -127..113 as 1..241, mxfp4's
// -12..12 as 4..28) and the sum then less kOff times the block's code sum,
// which the prepared activation holds (Q8Nat's s8, as 8 times the sum): the dword sums start
// from -kOff / 8 * s8 (in one dword of each lane), so the integer dot product
// is exact, as AVX2's is. The float sums run in a different order from
// AVX2's (per lane, four blocks apart), within the same bound.
#include <immintrin.h>

#include "avx2_bits.h"
#include "kernels.h"
#include "kquant_avx2.h"

// GCC 12's 512-bit intrinsics pass _mm512_undefined_* as the merge operand of
// their unmasked builtins, which -O3 inlining reports as uninitialized reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ie {
namespace {

template <WType T>
struct Nib4 {
  static_assert(T == WType::IQ4_NL || T == WType::MXFP4, "iq4_nl and mxfp4 only");
  static constexpr int kBB = static_cast<int>(wtype_info(T).block_bytes);  // 18 or 17
  static constexpr int kCodes = wtype_info(T).code_offset;                  // after the f16 or E8M0 scale
  static constexpr int kOff = T == WType::MXFP4 ? 16 : 128;  // a multiple of 8: Q8Nat's s8 is 8 times the code sum
  // Bytes a four-block step reads past its first 64.
  static constexpr int kTail = 4 * kBB - 64;
};

// The byte tables a step reads, built at compile time:
//  * table: v + kOff for each code (loaded into every 128-bit lane);
//  * codes: vpermt2b indices, byte 16 j + i of the result = code byte i of
//    block j (an index >= 64 reads the second source, the bytes after the
//    first 64);
//  * scales: vpermb indices that put block j's scale in 128-bit lane j:
//    mxfp4's E8M0 byte as byte 0 of each of the lane's four dwords (the
//    other bytes are masked to zero), iq4_nl's f16 as halves 4j .. 4j + 3
//    of the low 256 bits (vcvtph2ps makes them the lane's four floats).
struct Nib4Tables {
  alignas(64) uint8_t codes[64];
  alignas(64) uint8_t scales[64];
  alignas(16) uint8_t table[16];
};

template <WType T>
constexpr Nib4Tables nib4_tables() {
  constexpr int BB = Nib4<T>::kBB;
  Nib4Tables t{};
  for (int q = 0; q < 16; ++q) t.table[q] = static_cast<uint8_t>(grid_values(T)[q] + Nib4<T>::kOff);
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 16; ++i) t.codes[16 * j + i] = static_cast<uint8_t>(j * BB + Nib4<T>::kCodes + i);
  for (int m = 0; m < 16; ++m) {
    const int j = m / 4;
    if constexpr (T == WType::MXFP4) {
      t.scales[4 * m] = static_cast<uint8_t>(j * BB);
    } else {
      t.scales[2 * m] = static_cast<uint8_t>(j * BB);
      t.scales[2 * m + 1] = static_cast<uint8_t>(j * BB + 1);
    }
  }
  return t;
}

template <WType T>
inline constexpr Nib4Tables kNib4Tables = nib4_tables<T>();

// The four blocks' scales, lane j = block j's. mxfp4: 2^(e - 127) as the
// float whose exponent field is e, and 2^-127 (the subnormal 1 << 22) for
// e = 0, which has none; e8m0_half's 2^(e - 128) is half that, and the
// half is taken with the activation's scales (an exact power of two).
template <WType T>
IE_INLINE __m512 block_scales4(__m512i l0, __m512i sidx) {
  if constexpr (T == WType::MXFP4) {
    const __m512i e = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, sidx, l0);
    return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_slli_epi32(e, 23), _mm512_set1_epi32(1 << 22)));
  } else {
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(sidx, l0)));
  }
}

// Token b's side of one four-block step (blocks k .. k + n - 1, n <= 4;
// absent blocks are zeros): the codes regrouped as the weights' nibbles
// are, lane j's scale (halved for mxfp4), and -kOff times the code sums
// in dword 0 of each lane.
struct X4 {
  __m512i lo, hi, corr;
  __m512 d;
};

// Token b's activation codes of blocks k .. k + 3 (the first n; the others
// zeros): blocks k, k + 1 in *a and k + 2, k + 3 in *c. Token b's blocks are
// B apart in Q8Nat; one token's four are 128 contiguous bytes.
template <int B>
IE_INLINE void load_blocks4(const Q8Nat& xa, int64_t k, int n, int b, __m512i* a, __m512i* c) {
  if constexpr (B == 1) {
    *a = _mm512_maskz_loadu_epi8(n >= 2 ? ~0ull : 0xFFFFFFFFull, xa.q + k * 32);
    *c = _mm512_maskz_loadu_epi8(n == 4 ? ~0ull : n == 3 ? 0xFFFFFFFFull : 0, xa.q + k * 32 + 64);
  } else {
    auto q = [&](int j) { return _mm256_maskz_loadu_epi8(j < n ? ~0u : 0u, xa.q + ((k + j) * B + b) * 32); };
    *a = _mm512_inserti64x4(_mm512_castsi256_si512(q(0)), q(1), 1);
    *c = _mm512_inserti64x4(_mm512_castsi256_si512(q(2)), q(3), 1);
  }
}

// Loaded as vectors, never through arrays on the stack (a store of scalars
// read back as one vector stalls on store forwarding: it cost a third of
// the kernel's time).
template <WType T, int B>
IE_INLINE X4 load_x4(const Q8Nat& xa, int64_t k, int n, int b) {
  const __mmask8 in = static_cast<__mmask8>((1u << n) - 1);
  __m512i a, c;
  load_blocks4<B>(xa, k, n, b, &a, &c);
  __m128 d;
  __m128i s;
  if constexpr (B == 1) {
    d = _mm_maskz_loadu_ps(in, xa.d + k);
    s = _mm_maskz_loadu_epi32(in, xa.s8 + k);
  } else {
    const __m128i at = _mm_setr_epi32(0, B, 2 * B, 3 * B);
    d = _mm_mmask_i32gather_ps(_mm_setzero_ps(), in, at, xa.d + k * B + b, 4);
    s = _mm_mmask_i32gather_epi32(_mm_setzero_si128(), in, at, xa.s8 + k * B + b, 4);
  }
  X4 x;
  x.lo = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), c);
  x.hi = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), c);
  const __m512i lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const float half = T == WType::MXFP4 ? 0.5f : 1.f;
  x.d = _mm512_permutexvar_ps(lane, _mm512_castps128_ps512(_mm_mul_ps(d, _mm_set1_ps(half))));
  x.corr = _mm512_maskz_permutexvar_epi32(0x1111, lane,
                                          _mm512_castsi128_si512(_mm_mullo_epi32(s, _mm_set1_epi32(-Nib4<T>::kOff / 8))));
  return x;
}

// One row's four blocks: the unsigned values of elements 0..15 (lo) and
// 16..31 (hi) of block j in lane j, and the blocks' scales.
struct W4 {
  __m512i lo, hi;
  __m512 d;
};

template <WType T>
IE_INLINE W4 load_w4(const uint8_t* p, __mmask64 m0, __mmask64 m1, int64_t pf, __m512i table, __m512i cidx,
                     __m512i sidx) {
  // the next row block's bytes at this offset (as avx2.cpp does); two lines, since a step reads 68 or
  // 72 bytes and one line a step left every 16th or 9th line to the hardware (2 threads: +15%)
  _mm_prefetch(reinterpret_cast<const char*>(p + pf), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(p + pf + 64), _MM_HINT_T1);
  const __m512i m4 = _mm512_set1_epi8(0xF);
  const __m512i l0 = _mm512_maskz_loadu_epi8(m0, p), l1 = _mm512_maskz_loadu_epi8(m1, p + 64);
  const __m512i codes = _mm512_permutex2var_epi8(l0, cidx, l1);
  return {_mm512_shuffle_epi8(table, _mm512_and_si512(codes, m4)),
          _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4)), block_scales4<T>(l0, sidx)};
}

IE_INLINE void dot4(const W4& w, const X4& x, __m512& acc) {
  const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x.corr, w.lo, x.lo), w.hi, x.hi);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w.d, x.d), acc);
}

// Rows r0 .. r0 + R - 1 for all B tokens: out[rr * B + b]. One token:
// its four blocks first, then each row's (the fewest live registers);
// several: the rows' blocks first, then each token's.
template <WType T, int R, int B>
void nib4_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int BB = Nib4<T>::kBB;
  const int64_t nblk = a.spec.cols / 32, rb = a.lay.row_bytes, pf = R * rb;
  const Nib4Tables& tb = kNib4Tables<T>;
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tb.table)));
  const __m512i cidx = _mm512_load_si512(tb.codes), sidx = _mm512_load_si512(tb.scales);
  const uint8_t* w0 = a.w + r0 * rb;
  __m512 acc[R][B];
  for (auto& ra : acc)
    for (auto& v : ra) v = _mm512_setzero_ps();
  for (int64_t k = 0; k < nblk; k += 4) {
    const int n = nblk - k < 4 ? static_cast<int>(nblk - k) : 4;
    // a step's bytes: 64 then kTail more; a row's last step may have fewer blocks
    const __mmask64 m0 = n == 4 ? ~0ull : (1ull << (n * BB)) - 1;
    const __mmask64 m1 = n == 4 ? (1ull << Nib4<T>::kTail) - 1 : 0;
    const uint8_t* p = w0 + k * BB;
    if constexpr (B == 1) {
      const X4 x = load_x4<T, 1>(xa, k, n, 0);
      for (int rr = 0; rr < R; ++rr) dot4(load_w4<T>(p + rr * rb, m0, m1, pf, table, cidx, sidx), x, acc[rr][0]);
    } else {
      W4 w[R];
      for (int rr = 0; rr < R; ++rr) w[rr] = load_w4<T>(p + rr * rb, m0, m1, pf, table, cidx, sidx);
      for (int b = 0; b < B; ++b) {
        const X4 x = load_x4<T, B>(xa, k, n, b);
        for (int rr = 0; rr < R; ++rr) dot4(w[rr], x, acc[rr][b]);
      }
    }
  }
  for (int rr = 0; rr < R; ++rr)
    for (int b = 0; b < B; ++b) out[rr * B + b] = _mm512_reduce_add_ps(acc[rr][b]);
}

// ------------------------------------------------------------------ q4_k
//
// A super-block is 8 sub-blocks of 32 (one activation block each) whose
// codes are 4 chunks of 32 bytes, chunk c's low nibbles sub-block 2c and its
// high ones 2c + 1. One 64-byte load is chunks 2h, 2h + 1: its low nibbles
// are sub-blocks 4h and 4h + 2 (a 256-bit half each), its high ones 4h + 1
// and 4h + 3, so the activation's four blocks are regrouped to match (two
// qword permutes, once for all rows) and each half's integer sum is scaled
// by its sub-block's d * sc_j * dx_j, permuted from the eight of the
// super-block. The mins meet d_x * the block's code sum (Q8Nat's ds) in
// lanes 0..7 of the same accumulator. AVX2's reads 32 bytes a step with
// maddubs, pair sums and a horizontal add: ~7.5 GB/s a thread from L3.

// Token b's blocks 4h .. 4h + 3 of super-block sb: [4h, 4h + 2] and [4h + 1, 4h + 3].
template <int B>
IE_INLINE void q4k_x(const Q8Nat& xa, int64_t sb, int h, int b, __m512i* lo, __m512i* hi) {
  __m512i a, c;
  load_blocks4<B>(xa, sb * 8 + 4 * h, 4, b, &a, &c);
  *lo = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), c);
  *hi = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15), c);
}

template <int R, int B>
void q4k_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int BB = wtype_info(WType::Q4_K).block_bytes, kCodes = wtype_info(WType::Q4_K).code_offset;
  const int64_t nsb = a.spec.cols / 256, rb = a.lay.row_bytes, pf = R * rb;
  const __m512i m4 = _mm512_set1_epi8(0xF);
  // lanes 0..7 take sub-block j0 of the eight, lanes 8..15 j0 + 2
  const __m512i pick[4] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                           _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3),
                           _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
                           _mm512_setr_epi32(5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7)};
  const uint8_t* w0 = a.w + r0 * rb;
  __m512 acc[R][B];
  for (auto& ra : acc)
    for (auto& v : ra) v = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256 sc[R], mn[R];
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* blk = w0 + rr * rb + sb * BB;
      for (int o = 0; o < BB; o += 64) _mm_prefetch(reinterpret_cast<const char*>(blk + pf + o), _MM_HINT_T1);
      q4k_params(blk, &sc[rr], &mn[rr]);
    }
    __m512 f[R][B];  // lanes 0..7: d * sc_j * dx_j
    for (int b = 0; b < B; ++b) {
      __m256 xd, xds;
      xd_xds<B>(xa, sb, b, &xd, &xds);
      for (int rr = 0; rr < R; ++rr) {
        f[rr][b] = _mm512_castps256_ps512(_mm256_mul_ps(sc[rr], xd));
        acc[rr][b] = _mm512_fnmadd_ps(_mm512_zextps256_ps512(mn[rr]), _mm512_zextps256_ps512(xds), acc[rr][b]);
      }
    }
    for (int h = 0; h < 2; ++h) {
      __m512i lo[R], hi[R];
      for (int rr = 0; rr < R; ++rr) {
        const __m512i v = _mm512_loadu_si512(w0 + rr * rb + sb * BB + kCodes + 64 * h);
        lo[rr] = _mm512_and_si512(v, m4);
        hi[rr] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      for (int b = 0; b < B; ++b) {
        __m512i xl, xh;
        q4k_x<B>(xa, sb, h, b, &xl, &xh);
        for (int rr = 0; rr < R; ++rr) {
          const __m512i sl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[rr], xl);
          const __m512i sh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[rr], xh);
          acc[rr][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), _mm512_permutexvar_ps(pick[2 * h], f[rr][b]), acc[rr][b]);
          acc[rr][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), _mm512_permutexvar_ps(pick[2 * h + 1], f[rr][b]), acc[rr][b]);
        }
      }
    }
  }
  for (int rr = 0; rr < R; ++rr)
    for (int b = 0; b < B; ++b) out[rr * B + b] = _mm512_reduce_add_ps(acc[rr][b]);
}

// ------------------------------------------------------------------ q1_0
//
// A 128-block is d (f16) and 128 sign bits, +d where a bit is set and -d where it is clear, so a row's dot with
// the activation is d (2 (its sum where the bits are set) - (its sum)), as AVX2's q1_q8_rows computes it. Here a
// mask register takes 64 bits at once as 0/1 bytes (one masked move), and vpdpbusd sums them against two
// activation blocks, whose two scales meet the lanes of each by a blend: three instructions a row for two
// blocks, where AVX2 spends four for one. The activation's own sums (Q8Nat's ds) come off in lane 0.

// Token b's activation blocks xb and xb + 1, one after the other.
template <int B>
IE_INLINE __m512i q1_x2(const Q8Nat& xa, int64_t xb, int b) {
  if constexpr (B == 1) return _mm512_loadu_si512(xa.q + xb * 32);
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + (xb * B + b) * 32));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.q + ((xb + 1) * B + b) * 32));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

template <int R, int B>
void q1_rows(const GemvArgs& a, const Q8Nat& xa, int64_t r0, float* out) {
  constexpr int BB = wtype_info(WType::Q1_0).block_bytes;
  const int64_t nsb = a.spec.cols / 128, rb = a.lay.row_bytes, pf = R * rb;
  const uint8_t* w0 = a.w + r0 * rb;
  const __m512 two = _mm512_set1_ps(2.f);
  const __m512i one8 = _mm512_set1_epi8(1);
  __m512 acc[R][B];
  for (auto& ra : acc)
    for (auto& v : ra) v = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m512i x[2][B];
    __m512 xd[2][B], sums[B];
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < 2; ++h) {
        const int64_t xb = sb * 4 + 2 * h;
        x[h][b] = q1_x2<B>(xa, xb, b);
        xd[h][b] = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(xa.d[xb * B + b]), _mm512_set1_ps(xa.d[(xb + 1) * B + b]));
      }
      sums[b] = _mm512_maskz_mov_ps(1, _mm512_set1_ps(q8_ds128(xa, sb, B, b)));
    }
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* p = w0 + rr * rb + sb * BB;
      _mm_prefetch(reinterpret_cast<const char*>(p + pf), _MM_HINT_T0);
      __m512 blk[B];
      for (auto& v : blk) v = _mm512_setzero_ps();
      for (int h = 0; h < 2; ++h) {
        const __mmask64 m = q1_signs(p, 2 * h) | static_cast<uint64_t>(q1_signs(p, 2 * h + 1)) << 32;
        const __m512i set = _mm512_maskz_mov_epi8(m, one8);
        for (int b = 0; b < B; ++b)
          blk[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), set, x[h][b])),
                                   xd[h][b], blk[b]);
      }
      const __m512 d = _mm512_set1_ps(f16_to_f32(load_u16(p)));
      for (int b = 0; b < B; ++b) acc[rr][b] = _mm512_fmadd_ps(_mm512_fmsub_ps(blk[b], two, sums[b]), d, acc[rr][b]);
    }
  }
  for (int rr = 0; rr < R; ++rr)
    for (int b = 0; b < B; ++b) out[rr * B + b] = _mm512_reduce_add_ps(acc[rr][b]);
}

// ---------------------------------------------------------------- driver

// Rows [r, r1) for all B tokens through kernel(std::integral_constant<int, N>, r0, out), which
// computes rows r0 .. r0 + N - 1: R rows at a time, then one at a time.
template <int R, int B, class Kernel>
void run_range(const GemvArgs& a, int64_t r, int64_t r1, Kernel kernel) {
  const int64_t rows = a.spec.rows;
  auto put = [&](int64_t r0, int n, const float* out) {
    for (int rr = 0; rr < n; ++rr)
      for (int b = 0; b < B; ++b) a.y[b * rows + r0 + rr] = a.bias ? out[rr * B + b] + a.bias[r0 + rr] : out[rr * B + b];
  };
  float out[R * B];
  for (; r + R <= r1; r += R) {
    kernel(std::integral_constant<int, R>{}, r, out);
    put(r, R, out);
  }
  for (; r < r1; ++r) {
    kernel(std::integral_constant<int, 1>{}, r, out);
    put(r, 1, out);
  }
}

bool avx512_applies(const GemvArgs& a) {
  const WType t = a.spec.type;
  return a.act == Act::Int8 && (t == WType::IQ4_NL || t == WType::MXFP4 || t == WType::Q4_K || t == WType::Q1_0);
}

template <WType T>
void gemv_type(const GemvArgs& a) {
  const Q8Nat xa = carve_q8_nat(const_cast<uint8_t*>(a.prep), a.batch, a.spec.cols);
  with_batch(a.batch, [&](auto bc) {
    // rows a step: q4_k holds R x B scale vectors besides the sums, so one row from 3 tokens on
    constexpr int B = decltype(bc)::value, R = B == 1 ? 4 : B == 2 || T != WType::Q4_K ? 2 : 1;
    RowSplit split(a.spec.rows, a.pool->size());
    // rows [r, r1) of g (a, or a step's rows fetched from a dedup member)
    auto range = [&](const GemvArgs& g, int64_t r, int64_t r1) {
      run_range<R, B>(g, r, r1, [&](auto n, int64_t r0, float* out) {
        if constexpr (T == WType::Q4_K) q4k_rows<decltype(n)::value, B>(g, xa, r0, out);
        else if constexpr (T == WType::Q1_0) q1_rows<decltype(n)::value, B>(g, xa, r0, out);
        else nib4_rows<T, decltype(n)::value, B>(g, xa, r0, out);
      });
    };
    a.pool->run([&](int t) {
      int64_t r0, r1;
      while (split.next(t, &r0, &r1)) {
        // a row's sums do not depend on the rows beside it: a member's fused GEMV is this one's bit for bit
        if (a.src) run_from_source<R>(a, t, r0, r1, [&](const GemvArgs& sub, int n) { range(sub, 0, n); });
        else range(a, r0, r1);
      }
    });
  });
}

}  // namespace

void gemv_avx512(const GemvArgs& a) {
  if (!avx512_applies(a)) return kGemvAvx2.gemv(a);
  if (a.spec.type == WType::MXFP4) gemv_type<WType::MXFP4>(a);
  else if (a.spec.type == WType::IQ4_NL) gemv_type<WType::IQ4_NL>(a);
  else if (a.spec.type == WType::Q1_0) gemv_type<WType::Q1_0>(a);
  else gemv_type<WType::Q4_K>(a);
}

}  // namespace ie

#pragma GCC diagnostic pop
