// exp of non-positive floats, eight at a time, for the AVX2 files that need
// it (attention's softmax, the decode step's fused SwiGLU). Include it only
// from files built with -mavx2 -mfma: everything here has internal linkage,
// so no object built without those flags can link to it
// (tests/cpp/check_isa_symbols.py).
#pragma once
#include <immintrin.h>

namespace ie {
namespace {

// exp(x) for x <= 0 (Cephes' single-precision method: x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial for e^r, then 2^n in the exponent
// bits); within 2 ulp of std::exp. Below -87 the result is clamped to
// ~2^-126 instead of going subnormal; NaN stays NaN.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.f), x);  // NaN in x is returned as is
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace
}  // namespace ie
