// AVX2/FMA GEMM micro-kernel (this file alone is built with -mavx2 -mfma).
// The 12-row tile runs as two halves of 6 weight rows x 16 activation rows
// = 12 accumulators each; per column: two panel loads, six broadcasts,
// twelve FMAs (FMA-bound: 2 per cycle).
#include <immintrin.h>

#include "gemm.h"

namespace ie {
namespace {

static_assert(kTileRows == 12 && kPanel == 16, "the register blocking below is 2 x 6 x (2 x 8)");

// The twelve accumulators are named values, not an array: GCC keeps an
// array of vectors in memory too and stores it back on every column.
void half_tile(const float* wt, int64_t ld, const float* panel, int64_t k, float* acc, bool first) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  if (!first) {
    a00 = _mm256_loadu_ps(acc), a01 = _mm256_loadu_ps(acc + 8);
    a10 = _mm256_loadu_ps(acc + 16), a11 = _mm256_loadu_ps(acc + 24);
    a20 = _mm256_loadu_ps(acc + 32), a21 = _mm256_loadu_ps(acc + 40);
    a30 = _mm256_loadu_ps(acc + 48), a31 = _mm256_loadu_ps(acc + 56);
    a40 = _mm256_loadu_ps(acc + 64), a41 = _mm256_loadu_ps(acc + 72);
    a50 = _mm256_loadu_ps(acc + 80), a51 = _mm256_loadu_ps(acc + 88);
  }
  const float *w0 = wt, *w1 = wt + ld, *w2 = wt + 2 * ld, *w3 = wt + 3 * ld, *w4 = wt + 4 * ld, *w5 = wt + 5 * ld;
  for (int64_t c = 0; c < k; ++c) {
    const __m256 x0 = _mm256_load_ps(panel + c * kPanel), x1 = _mm256_load_ps(panel + c * kPanel + 8);
    __m256 b = _mm256_broadcast_ss(w0 + c);
    a00 = _mm256_fmadd_ps(b, x0, a00);
    a01 = _mm256_fmadd_ps(b, x1, a01);
    b = _mm256_broadcast_ss(w1 + c);
    a10 = _mm256_fmadd_ps(b, x0, a10);
    a11 = _mm256_fmadd_ps(b, x1, a11);
    b = _mm256_broadcast_ss(w2 + c);
    a20 = _mm256_fmadd_ps(b, x0, a20);
    a21 = _mm256_fmadd_ps(b, x1, a21);
    b = _mm256_broadcast_ss(w3 + c);
    a30 = _mm256_fmadd_ps(b, x0, a30);
    a31 = _mm256_fmadd_ps(b, x1, a31);
    b = _mm256_broadcast_ss(w4 + c);
    a40 = _mm256_fmadd_ps(b, x0, a40);
    a41 = _mm256_fmadd_ps(b, x1, a41);
    b = _mm256_broadcast_ss(w5 + c);
    a50 = _mm256_fmadd_ps(b, x0, a50);
    a51 = _mm256_fmadd_ps(b, x1, a51);
  }
  const __m256 out[6][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}, {a50, a51}};
  for (int r = 0; r < 6; ++r) {
    _mm256_storeu_ps(acc + r * kPanel, out[r][0]);
    _mm256_storeu_ps(acc + r * kPanel + 8, out[r][1]);
  }
}

void tile_avx2(const float* wt, int64_t ld, const float* panel, int64_t /*pstride*/, int64_t k, float* acc, bool first) {
  half_tile(wt, ld, panel, k, acc, first);
  half_tile(wt + 6 * ld, ld, panel, k, acc + 6 * kPanel, first);
}

}  // namespace

const GemmOps kGemmAvx2 = {tile_avx2, 1};

}  // namespace ie
