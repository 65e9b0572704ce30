// AVX-512 GEMM micro-kernel (this file alone is built with -mavx512f):
// 12 weight rows x two panels of 16 activation rows = 24 zmm accumulators;
// per column: two panel loads, twelve broadcasts, each feeding two FMAs.
// With one panel the twelve broadcast loads plus the panel load per twelve
// FMAs saturate the load ports first (~110 of 165 GFLOPS per core in L1).
#include <immintrin.h>

#include "gemm.h"

namespace ie {
namespace {

static_assert(kTileRows == 12 && kPanel == 16, "the register blocking below is 12 x (2 x 16)");

// GCC keeps this array of vectors in registers only because every index is
// a constant after full unrolling (checked in the object: no spills in the
// loop); see avx2.cpp for why the AVX2 kernel names its accumulators.
void tile_avx512(const float* wt, int64_t ld, const float* panel, int64_t pstride, int64_t k, float* acc,
                 bool first) {
  __m512 a[kTileRows][2];
#pragma GCC unroll 12
  for (int r = 0; r < kTileRows; ++r) {
    a[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * kPanel);
    a[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (kTileRows + r) * kPanel);
  }
  const float* p1 = panel + pstride;
  for (int64_t c = 0; c < k; ++c) {
    const __m512 x0 = _mm512_load_ps(panel + c * kPanel), x1 = _mm512_load_ps(p1 + c * kPanel);
#pragma GCC unroll 12
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 b = _mm512_set1_ps(wt[r * ld + c]);
      a[r][0] = _mm512_fmadd_ps(b, x0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(b, x1, a[r][1]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < kTileRows; ++r) {
    _mm512_storeu_ps(acc + r * kPanel, a[r][0]);
    _mm512_storeu_ps(acc + (kTileRows + r) * kPanel, a[r][1]);
  }
}

}  // namespace

const GemmOps kGemmAvx512 = {tile_avx512, 2};

}  // namespace ie
