// The int8 peak through AVX-VNNI's vpdpbusd on 256-bit vectors: the
// yardstick of the AvxVnni level's rows8 kernels (gemv/rows8_avxvnni.cpp),
// whose CPUs (Alder Lake and later client cores) have 16 vector registers
// and no AVX-512. Same lanes and sums as int8_chains_avx2.
#include <immintrin.h>

#include "stream_read.h"

namespace ie {

int64_t int8_chains_avxvnni(int a, int b, int64_t iters) {
  constexpr int kChains = 8;
  static_assert(kInt8Lanes % (kChains * 8) == 0, "whole passes of 8 x 8 lanes");
  int64_t total = 0;
  for (int l0 = 0; l0 < kInt8Lanes; l0 += kChains * 8) {
    __m256i va = _mm256_set1_epi8(static_cast<char>(a));
    const __m256i vb = _mm256_set1_epi8(static_cast<char>(b));
    __m256i acc[kChains];
    for (auto& x : acc) x = _mm256_setzero_si256();
    for (int64_t i = 0; i < iters; ++i) {
      __asm__ volatile("" : "+x"(va));  // one opaque a per step, as in int8_chains_avx512
      for (auto& x : acc) x = _mm256_dpbusd_avx_epi32(x, va, vb);
    }
    alignas(32) int32_t lanes[8];
    for (auto& x : acc) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
      for (int32_t v : lanes) total += v;
    }
  }
  return total;
}

}  // namespace ie
