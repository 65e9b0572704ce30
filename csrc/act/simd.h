// The activations' SIMD loops over one vector width's adapter (common/exp_avx2.h's F32x8 or F32x16): its lanes
// at a time, the tail through the scalar reference (act.h). Included by avx2.cpp and avx512.cpp alone, each built
// with its ISA's flags.
#pragma once
#include "act.h"
#include "common/exp_avx2.h"

namespace ie {
namespace {

template <class O, typename O::V (*body)(typename O::V, typename O::V)>
void rows(float* out, const float* g, const float* u, size_t n, void (*tail)(float*, const float*, const float*, size_t)) {
  const typename O::V one = O::set1(1.f);
  size_t i = 0;
  for (; i + O::kLanes <= n; i += O::kLanes) O::store(out + i, body(O::load(g + i), u ? O::load(u + i) : one));
  if (i < n) tail(out + i, g + i, u ? u + i : nullptr, n - i);
}

template <class O>
void silu_mul_simd(float* out, const float* g, const float* u, size_t n) {
  rows<O, silu_body<O>>(out, g, u, n, kActScalar.silu_mul);
}

template <class O>
void gelu_tanh_mul_simd(float* out, const float* g, const float* u, size_t n) {
  rows<O, gelu_tanh_body<O>>(out, g, u, n, kActScalar.gelu_tanh_mul);
}

template <class O>
void xielu_simd(float* x, size_t n, const Xielu& p) {
  const typename O::V ap = O::set1(p.alpha_p), an = O::set1(p.alpha_n), beta = O::set1(p.beta), eps = O::set1(p.eps);
  size_t i = 0;
  for (; i + O::kLanes <= n; i += O::kLanes) O::store(x + i, xielu_body<O>(O::load(x + i), ap, an, beta, eps));
  if (i < n) kActScalar.xielu(x + i, n - i, p);
}

}  // namespace
}  // namespace ie
