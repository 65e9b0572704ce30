// Bit moves shared by the AVX2 GEMV kernels (avx2.cpp: stored layouts;
// rows8_tiles.h: rows8 copies). Include only from files built with -mavx2.
#pragma once
#include <immintrin.h>

#include <utility>

// The kernels' helpers take arrays of vectors by reference: they must be
// inlined so that those stay in registers.
#define IE_INLINE inline __attribute__((always_inline))

namespace ie {
namespace {

// Bits BIT .. BIT + N - 1 of each byte of v moved to bits TO .. TO + N - 1,
// the rest zero: the high bits of 3-bit (TO = 2), 5-bit (TO = 4, N = 1) and
// 6-bit (TO = 4, N = 2) codes joined to their low bits. 16-bit shifts: what
// crosses a byte boundary lands outside the mask.
template <int BIT, int TO, int N = 1>
IE_INLINE __m256i bits_to(__m256i v) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(((1 << N) - 1) << TO));
  if constexpr (BIT <= TO) return _mm256_and_si256(_mm256_slli_epi16(v, TO - BIT), m);
  else return _mm256_and_si256(_mm256_srli_epi16(v, BIT - TO), m);
}

template <int BIT, int N = 1>
IE_INLINE __m256i bits_to_4(__m256i v) { return bits_to<BIT, 4, N>(v); }

// Keeps a value in a register as it is at this point: stops the compiler
// from re-loading shared activation vectors once per row as memory operands
// (avx2.cpp), and from re-associating a running sum into a tree whose
// leaves all live at once (rows8_tiles.h, rows8_pairs.h). "v": any vector
// register the target has (all 32 under AVX-512, where "x" would confine
// it to the first 16), of any width.
template <class V>
IE_INLINE void in_reg(V& v) {
  __asm__("" : "+v"(v));
}

// fn(integral_constant<int, 0>) .. fn(integral_constant<int, N - 1>): loop
// indices that shifts and shuffle controls need as compile-time constants.
template <class Fn, int... I>
IE_INLINE void static_for_impl(Fn&& fn, std::integer_sequence<int, I...>) {
  (fn(std::integral_constant<int, I>{}), ...);
}
template <int N, class Fn>
IE_INLINE void static_for(Fn&& fn) {
  static_for_impl(fn, std::make_integer_sequence<int, N>{});
}

}  // namespace
}  // namespace ie
