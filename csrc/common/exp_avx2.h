// exp of non-positive floats and SiLU(g) * u, eight (or sixteen, under
// AVX-512F) at a time, for the SIMD files that need them (attention's
// softmax, the fused SwiGLU of the rows8 kernels). Include it only
// from files built with -mavx2 -mfma: everything here has internal linkage,
// so no object built without those flags can link to it
// (tests/cpp/check_isa_symbols.py).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ie {
namespace {

// exp(x) for x <= 0 (Cephes' single-precision method: x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial for e^r, then 2^n in the exponent
// bits); within 2 ulp of std::exp. Below -87 the result is clamped to
// ~2^-126 instead of going subnormal; NaN stays NaN.
//
// One body per function (exp_body, silu_body) over a width's adapter
// (F32x8, and F32x16 in files built with AVX-512F), so a lane gets the
// same float from either width.
struct F32x8 {
  using V = __m256;
  static constexpr int kLanes = 8;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
  static __m256 set1(float x) { return _mm256_set1_ps(x); }
  static __m256 max(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
  static __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
  static __m256 min(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
  static __m256 if_positive(__m256 g, __m256 a, __m256 b) {  // a where g > 0, else b (NaN: b)
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GT_OQ));
  }
  static __m256 fmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256 fnmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fnmadd_ps(a, b, c); }
  static __m256 round(__m256 a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m256 pow2(__m256 n) {  // 2^n for integer-valued n in the normal range
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
  static __m256 neg_abs(__m256 a) { return _mm256_or_ps(a, _mm256_set1_ps(-0.f)); }
  static __m256 if_negative(__m256 g, __m256 a, __m256 b) {  // a where g < 0, else b
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
  }
};

#if defined(__AVX512F__)
// GCC 12's 512-bit intrinsics pass _mm512_undefined_* as the merge operand of
// their unmasked builtins, which -O3 inlining reports as uninitialized reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
struct F32x16 {
  using V = __m512;
  static constexpr int kLanes = 16;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static __m512 set1(float x) { return _mm512_set1_ps(x); }
  static __m512 max(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
  static __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512 sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
  static __m512 min(__m512 a, __m512 b) { return _mm512_min_ps(a, b); }
  static __m512 if_positive(__m512 g, __m512 a, __m512 b) {  // a where g > 0, else b (NaN: b)
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GT_OQ), b, a);
  }
  static __m512 fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  static __m512 fnmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }
  static __m512 round(__m512 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m512 pow2(__m512 n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  static __m512 neg_abs(__m512 a) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  static __m512 if_negative(__m512 g, __m512 a, __m512 b) {  // a where g < 0, else b
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ), b, a);
  }
};
#pragma GCC diagnostic pop
#endif

// x = n ln2 + r (x clamped to -87 first; NaN stays NaN), and p(r), with e^r = 1 + r + p(r) r^2.
template <class O>
struct ExpParts {
  typename O::V n, r, p;
};

template <class O>
inline ExpParts<O> exp_parts(typename O::V x) {
  using V = typename O::V;
  x = O::max(O::set1(-87.f), x);  // NaN in x is returned as is
  const V n = O::round(O::mul(x, O::set1(1.44269504088896341f)));
  V r = O::fnmadd(n, O::set1(0.693359375f), x);
  r = O::fnmadd(n, O::set1(-2.12194440e-4f), r);
  V p = O::set1(1.9875691500e-4f);
  p = O::fmadd(p, r, O::set1(1.3981999507e-3f));
  p = O::fmadd(p, r, O::set1(8.3334519073e-3f));
  p = O::fmadd(p, r, O::set1(4.1665795894e-2f));
  p = O::fmadd(p, r, O::set1(1.6666665459e-1f));
  p = O::fmadd(p, r, O::set1(5.0000001201e-1f));
  return {n, r, p};
}

template <class O>
inline typename O::V exp_body(typename O::V x) {
  const ExpParts<O> e = exp_parts<O>(x);
  return O::mul(O::fmadd(O::mul(e.p, e.r), e.r, O::add(e.r, O::set1(1.f))), O::pow2(e.n));
}

// e^x - 1 for x <= 0 without exp's cancellation near 0: 2^n (e^r - 1) + (2^n - 1), e^r - 1 = r + p r^2
// (n = 0 for |x| <= ln2 / 2: the polynomial's own accuracy there, where exp(x) - 1 would lose the low bits).
template <class O>
inline typename O::V expm1_body(typename O::V x) {
  const ExpParts<O> e = exp_parts<O>(x);
  const typename O::V t = O::pow2(e.n);
  return O::fmadd(t, O::fmadd(O::mul(e.p, e.r), e.r, e.r), O::sub(t, O::set1(1.f)));
}

// SiLU(g) * u = g * sigmoid(g) * u, with sigmoid from e = exp(-|g|) <= 1:
// 1 / (1 + e) for g >= 0, e / (1 + e) below (no overflow either way).
template <class O>
inline typename O::V silu_body(typename O::V g, typename O::V u) {
  using V = typename O::V;
  const V one = O::set1(1.f), e = exp_body<O>(O::neg_abs(g));
  return O::mul(O::mul(g, O::div(O::if_negative(g, e, one), O::add(one, e))), u);
}

// xIELU (Apertus's unit, act.h's Xielu): alpha_p x^2 + beta x for x > 0, else
// (expm1(min(x, eps)) - x) alpha_n + beta x: expm1's argument is <= x <= 0 where the lane keeps it.
template <class O>
inline typename O::V xielu_body(typename O::V x, typename O::V ap, typename O::V an, typename O::V beta,
                                typename O::V eps) {
  const typename O::V bx = O::mul(beta, x);
  const typename O::V neg = O::fmadd(O::sub(expm1_body<O>(O::min(x, eps)), x), an, bx);
  return O::if_positive(x, O::fmadd(O::mul(ap, x), x, bx), neg);
}

// GELU(g) * u with tanh's approximation (Gemma's gelu_pytorch_tanh):
// 0.5 (1 + tanh(z)) = sigmoid(2z), z = sqrt(2/pi) (g + 0.044715 g^3), so
// g * sigmoid(2z) * u, the sigmoid as silu_body takes it.
template <class O>
inline typename O::V gelu_tanh_body(typename O::V g, typename O::V u) {
  using V = typename O::V;
  const V g2 = O::mul(g, g);
  const V z = O::mul(O::set1(2.f * 0.7978845608028654f), O::fmadd(O::mul(O::set1(0.044715f), g2), g, g));
  const V one = O::set1(1.f), e = exp_body<O>(O::neg_abs(z));
  return O::mul(O::mul(g, O::div(O::if_negative(z, e, one), O::add(one, e))), u);
}

inline __m256 exp_nonpositive(__m256 x) { return exp_body<F32x8>(x); }
inline __m256 silu_mul(__m256 g, __m256 u) { return silu_body<F32x8>(g, u); }
inline __m256 gelu_tanh_mul(__m256 g, __m256 u) { return gelu_tanh_body<F32x8>(g, u); }
#if defined(__AVX512F__)
inline __m512 exp_nonpositive(__m512 x) { return exp_body<F32x16>(x); }
inline __m512 silu_mul(__m512 g, __m512 u) { return silu_body<F32x16>(g, u); }
inline __m512 gelu_tanh_mul(__m512 g, __m512 u) { return gelu_tanh_body<F32x16>(g, u); }
#endif

}  // namespace
}  // namespace ie
