// The k-quant super-block pieces that the AVX2 stored-layout kernels
// (avx2.cpp) and the AVX-512 ones (avx512.cpp) both read: the q4_k / q5_k
// sub-block scales and mins, and an activation's per-32-block scales for
// one super-block. Include only from files built with -mavx2 -mf16c.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "avx2_bits.h"
#include "common/half.h"
#include "kernels.h"

namespace ie {
namespace {

// The eight sub-blocks' scales d * sc_j and mins dmin * m_j of one
// super-block as vectors (lane j = sub-block j). The 12 packed bytes are
// three little-endian words: sc_0..3 and m_0..3 are the low 6 bits of the
// first two; sc_4..7 and m_4..7 take their low 4 bits from the third word's
// nibbles and their high 2 bits from the top bits of the first two.
IE_INLINE void q4k_params(const uint8_t* blk, __m256* sc, __m256* mn) {
  uint32_t w[3];
  std::memcpy(w, blk + 4, 12);
  const uint32_t ls_lo = w[0] & 0x3F3F3F3Fu, lm_lo = w[1] & 0x3F3F3F3Fu;
  const uint32_t ls_hi = (w[2] & 0x0F0F0F0Fu) | ((w[0] & 0xC0C0C0C0u) >> 2);
  const uint32_t lm_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] & 0xC0C0C0C0u) >> 2);
  const __m128i ls = _mm_cvtsi64_si128(static_cast<long long>(ls_lo | static_cast<uint64_t>(ls_hi) << 32));
  const __m128i lm = _mm_cvtsi64_si128(static_cast<long long>(lm_lo | static_cast<uint64_t>(lm_hi) << 32));
  *sc = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(blk))), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(ls)));
  *mn = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(blk + 2))), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lm)));
}

// Super-block sb's activation scales for row b: lane j = d and d * code sum of 32-block 8 sb + j.
template <int B>
IE_INLINE void xd_xds(const Q8Nat& xa, int64_t sb, int b, __m256* xd, __m256* xds) {
  if constexpr (B == 1) {
    *xd = _mm256_loadu_ps(xa.d + sb * 8);
    *xds = _mm256_loadu_ps(xa.ds + sb * 8);
  } else {
    const __m256i idx = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
    *xd = _mm256_i32gather_ps(xa.d + sb * 8 * B + b, idx, 4);
    *xds = _mm256_i32gather_ps(xa.ds + sb * 8 * B + b, idx, 4);
  }
}

}  // namespace
}  // namespace ie
