// What the SIMD variants of Mamba2's scan step (ssm.h) share, for the files
// that build them with their ISA's flags (avx2.cpp, avx512.cpp): the end of a
// state row, once its vector loop has updated the first `body` elements and
// left the read-out's partial sums in eight lanes. Everything here has
// internal linkage (tests/cpp/check_isa_symbols.py).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstddef>

#include "common/exp_avx2.h"

#include "ssm.h"

namespace ie {
namespace {

// The eight lanes of `acc` added pairwise, as the scalar reference adds its eight partial sums.
inline float lane_sum(__m256 acc) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}

// lane_sum(acc), then the row's tail (n from body to N) updated and read out
// in order, as the scalar reference does.
inline float finish_row(__m256 acc, float* s, int body, int N, float decay, float dx, const float* B, const float* C) {
  float out = lane_sum(acc);
  for (int n = body; n < N; ++n) {
    s[n] = s[n] * decay + dx * B[n];
    out += s[n] * C[n];
  }
  return out;
}

// Mamba 1's row end: lane_sum(acc), then the tail (n from body to N) updated by its own rates and read out in
// order.
inline float finish_channel(__m256 acc, float* h, int body, int N, float dt, float dx, const float* a,
                            const float* B, const float* C) {
  float out = lane_sum(acc);
  for (int n = body; n < N; ++n) {
    h[n] = std::exp(dt * a[n]) * h[n] + dx * B[n];
    out += h[n] * C[n];
  }
  return out;
}

}  // namespace
}  // namespace ie
