// The k-quant super-block pieces that the AVX2 stored-layout kernels
// (avx2.cpp) and the AVX-512 ones (avx512.cpp) both read: the q4_k / q5_k
// sub-block scales and mins, and an activation's per-32-block scales for
// one super-block. Include only from files built with -mavx2 -mf16c.
#pragma once
#include <immintrin.h>

#include "avx2_bits.h"
#include "kernels.h"

namespace ie {
namespace {

// The eight sub-blocks' scales d * sc_j and mins dmin * m_j of one
// super-block as vectors (lane j = sub-block j). The 12 packed bytes q at 4
// hold sc_0..3 and m_0..3 in the low 6 bits of q[0..3] and q[4..7]; sc_4..7
// and m_4..7 take their low 4 bits from q[8..11]'s nibbles and their high 2
// bits from the top bits of q[0..3] and q[4..7]. All sixteen come out of one
// 16-byte load by two byte shuffles and masks (sc_j in byte j, m_j in byte
// 8 + j): the scalar unpacking it replaced was a third of AVX2's stored-layout
// q4_k GEMV, the kernel a Q4_K_M MoE's experts decode with (docs/benchmarks.md).
IE_INLINE void q4k_params(const uint8_t* blk, __m256* sc, __m256* mn) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));  // d, dmin, then q at byte 4
  const __m128i low = _mm_shuffle_epi8(raw, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i top = _mm_shuffle_epi8(raw, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
  const __m128i six = _mm_and_si128(low, _mm_setr_epi8(0x3F, 0x3F, 0x3F, 0x3F, 0xF, 0xF, 0xF, 0xF,  //
                                                       0x3F, 0x3F, 0x3F, 0x3F, 0, 0, 0, 0));
  const __m128i nib = _mm_and_si128(_mm_srli_epi16(low, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xF, 0xF, 0xF, 0xF));
  const __m128i two = _mm_srli_epi16(_mm_and_si128(top, _mm_set1_epi8(static_cast<char>(0xC0))), 2);
  const __m128i v = _mm_or_si128(_mm_or_si128(six, nib), two);
  const __m128 dd = _mm_cvtph_ps(raw);  // d, dmin
  *sc = _mm256_mul_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
  *mn = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v))));
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
