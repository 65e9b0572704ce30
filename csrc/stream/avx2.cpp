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

// kFmaLanes / 96 passes of 12 chains of 8 lanes (12 vectors: as many as
// two FMA ports of latency 4 need, with registers to spare).
float fma_chains_avx2(float seed, float m, float c, int64_t iters) {
  constexpr int kChains = 12;
  static_assert(kFmaLanes % (kChains * 8) == 0, "whole passes of 12 x 8 lanes");
  const __m256 step = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 vm = _mm256_set1_ps(m), vc = _mm256_set1_ps(c);
  float total = 0.f;
  for (int l0 = 0; l0 < kFmaLanes; l0 += kChains * 8) {
    __m256 v[kChains];
    for (int k = 0; k < kChains; ++k)
      v[k] = _mm256_add_ps(_mm256_set1_ps(seed), _mm256_mul_ps(_mm256_add_ps(step, _mm256_set1_ps(static_cast<float>(l0 + 8 * k))),
                                                               _mm256_set1_ps(1.f / 1024)));
    for (int64_t i = 0; i < iters; ++i)
      for (auto& x : v) x = _mm256_fmadd_ps(x, vm, vc);
    __m256 s = v[0];
    for (int k = 1; k < kChains; ++k) s = _mm256_add_ps(s, v[k]);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, s);
    for (float x : lanes) total += x;
  }
  return total;
}

// Four passes of 4 chains of 8 lanes: the products do not wait on the
// chains (only the vpaddd does, 1 cycle), so 4 chains keep both multiply
// ports busy and fit in 16 registers. a is made opaque by an empty asm at
// each step (no product hoisted out of the loop), and each chain multiplies
// it by its own copy of b, made opaque once (no product shared between
// chains). An asm per chain and step on an array of inputs kept the arrays
// in memory, and the loads and stores around every product measured 0.6x
// the peak (73 against 117 G multiply-adds/s per Zen 4 thread).
int64_t int8_chains_avx2(int a, int b, int64_t iters) {
  constexpr int kChains = 4;
  static_assert(kInt8Lanes % (kChains * 8) == 0, "whole passes of 4 x 8 lanes");
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t total = 0;
  for (int l0 = 0; l0 < kInt8Lanes; l0 += kChains * 8) {
    __m256i va = _mm256_set1_epi8(static_cast<char>(a));
    __m256i vb[kChains], acc[kChains];
    for (int k = 0; k < kChains; ++k) {
      vb[k] = _mm256_set1_epi8(static_cast<char>(b));
      __asm__ volatile("" : "+x"(vb[k]));  // volatile: not merged into one value
      acc[k] = _mm256_setzero_si256();
    }
    for (int64_t i = 0; i < iters; ++i) {
      __asm__ volatile("" : "+x"(va));
      for (int k = 0; k < kChains; ++k)
        acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(va, vb[k]), ones));
    }
    alignas(32) int32_t lanes[8];
    for (auto& x : acc) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
      for (int32_t v : lanes) total += v;
    }
  }
  return total;
}

}  // namespace

const StreamOps kStreamAvx2 = {stream_sum_chunk_avx2, fma_chains_avx2, int8_chains_avx2, 4.0 * kInt8Lanes};
const StreamOps kStreamAvxVnni = {stream_sum_chunk_avx2, fma_chains_avx2, int8_chains_avxvnni, 4.0 * kInt8Lanes};

}  // namespace ie
