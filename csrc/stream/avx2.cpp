// AVX2 body of the streaming read (compiled with -mavx2 -mfma only here).
#include <immintrin.h>

#include "stream_read.h"

namespace ie {

namespace {

float stream_sum_chunk_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = 0.f;
  for (float v : lanes) total += v;
  return total + stream_sum_chunk_scalar(p + i, n - i);
}

}  // namespace

const StreamOps kStreamAvx2 = {stream_sum_chunk_avx2};

}  // namespace ie
