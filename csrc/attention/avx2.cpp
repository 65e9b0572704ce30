// AVX2/FMA attention loops (this file alone is built with -mavx2 -mfma):
// one 8-lane vector carries the scalar reference's eight partial sums.
#include <immintrin.h>

#include "attention.h"

namespace ie {
namespace {

float dot_avx2(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  alignas(32) float p[8];
  _mm256_store_ps(p, acc);
  float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_avx2(float a, const float* x, float* y, int n) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

const AttnOps kAttnAvx2 = {dot_avx2, axpy_avx2};

}  // namespace ie
