// AVX-512 yardsticks: the streaming read in 16-lane vectors, the FMA peak
// of cores with 512-bit FMA units, which the AVX-512 GEMM (gemm/avx512.cpp)
// is reported against, and the int8 peak through VNNI's vpdpbusd, which the
// AVX-512 level's rows8 kernels (gemv/rows8_avx512.cpp) multiply with; the
// amx level's table row (kStreamAmx) takes these read and FMA loops.
#include <immintrin.h>

#include "stream_read.h"

namespace ie {

namespace {

// Lane sum through memory (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized).
float lane_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float total = 0.f;
  for (float x : lanes) total += x;
  return total;
}

float stream_sum_chunk_avx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
  }
  return lane_sum(_mm512_add_ps(a0, a1)) + stream_sum_chunk_scalar(p + i, n - i);
}

float fma_chains_avx512(float seed, float m, float c, int64_t iters) {
  constexpr int kChains = kFmaLanes / 16;
  __m512 v[kChains];
  const __m512 step = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int k = 0; k < kChains; ++k)
    v[k] = _mm512_add_ps(_mm512_set1_ps(seed), _mm512_mul_ps(_mm512_add_ps(step, _mm512_set1_ps(16.f * k)),
                                                             _mm512_set1_ps(1.f / 1024)));
  const __m512 vm = _mm512_set1_ps(m), vc = _mm512_set1_ps(c);
  for (int64_t i = 0; i < iters; ++i)
    for (auto& x : v) x = _mm512_fmadd_ps(x, vm, vc);
  __m512 s = v[0];
  for (int k = 1; k < kChains; ++k) s = _mm512_add_ps(s, v[k]);
  return lane_sum(s);
}

int64_t int8_chains_avx512(int a, int b, int64_t iters) {
  constexpr int kChains = kInt8Lanes / 16;
  __m512i va = _mm512_set1_epi8(static_cast<char>(a));
  const __m512i vb = _mm512_set1_epi8(static_cast<char>(b));
  __m512i acc[kChains];
  for (auto& x : acc) x = _mm512_setzero_si512();
  // VNNI: a lane's four products and their sum in one step. Each chain's
  // accumulator makes its step distinct, so one opaque a per step is enough
  // (an asm per chain on an array of inputs kept them in memory: 0.2x the peak).
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile("" : "+v"(va));
    for (auto& x : acc) x = _mm512_dpbusd_epi32(x, va, vb);
  }
  int64_t total = 0;
  alignas(64) int32_t lanes[16];
  for (auto& x : acc) {
    _mm512_store_si512(lanes, x);
    for (int32_t v : lanes) total += v;
  }
  return total;
}

}  // namespace

const StreamOps kStreamAvx512 = {stream_sum_chunk_avx512, fma_chains_avx512, int8_chains_avx512, 4.0 * kInt8Lanes};
const StreamOps kStreamAmx = {stream_sum_chunk_avx512, fma_chains_avx512, int8_chains_amx, kAmxInt8Macs};

}  // namespace ie
