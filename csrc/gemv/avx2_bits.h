// Bit moves shared by the AVX2 GEMV kernels (avx2.cpp: stored layouts;
// rows8_avx2.cpp: rows8 copies). Include only from files built with -mavx2.
#pragma once
#include <immintrin.h>

// The kernels' helpers take arrays of vectors by reference: they must be
// inlined so that those stay in registers.
#define IE_INLINE inline __attribute__((always_inline))

namespace ie {
namespace {

// Bits BIT .. BIT + N - 1 of each byte of v moved to bits 4 .. 4 + N - 1,
// the rest zero: the high bits of 5-bit (N = 1) and 6-bit (N = 2) codes
// joined to their nibbles. 16-bit shifts: what crosses a byte boundary
// lands outside the mask.
template <int BIT, int N = 1>
IE_INLINE __m256i bits_to_4(__m256i v) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(((1 << N) - 1) << 4));
  if constexpr (BIT <= 4) return _mm256_and_si256(_mm256_slli_epi16(v, 4 - BIT), m);
  else return _mm256_and_si256(_mm256_srli_epi16(v, BIT - 4), m);
}

}  // namespace
}  // namespace ie
