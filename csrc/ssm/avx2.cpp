// Mamba2's scan step with AVX2/FMA (this file alone is built with -mavx2
// -mfma): each state row eight floats at a time, loaded once, updated by one
// FMA (s decay + dx B), stored, and multiplied into the read-out's
// accumulator; rows.h ends the row.
#include "rows.h"

namespace ie {
namespace {

void step_avx2(float* S, int P, int N, float decay, const float* dx, const float* B, const float* C, float* y) {
  const __m256 d = _mm256_set1_ps(decay);
  const int body = N - N % 8;
  for (int p = 0; p < P; ++p) {
    float* s = S + static_cast<size_t>(p) * static_cast<size_t>(N);
    const __m256 x = _mm256_set1_ps(dx[p]);
    __m256 acc = _mm256_setzero_ps();
    for (int n = 0; n < body; n += 8) {
      const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(s + n), d, _mm256_mul_ps(x, _mm256_loadu_ps(B + n)));
      _mm256_storeu_ps(s + n, v);
      acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(C + n), acc);
    }
    y[p] = finish_row(acc, s, body, N, decay, dx[p], B, C);
  }
}

void channels_avx2(float* H, int channels, int N, const float* dt, const float* x, const float* A, const float* B,
                   const float* C, float* y) {
  const int body = N - N % 8;
  for (int ch = 0; ch < channels; ++ch) {
    float* h = H + static_cast<size_t>(ch) * static_cast<size_t>(N);
    const float* a = A + static_cast<size_t>(ch) * static_cast<size_t>(N);
    const __m256 t = _mm256_set1_ps(dt[ch]), dx = _mm256_set1_ps(dt[ch] * x[ch]);
    __m256 acc = _mm256_setzero_ps();
    for (int n = 0; n < body; n += 8) {
      const __m256 decay = exp_nonpositive(_mm256_mul_ps(t, _mm256_loadu_ps(a + n)));
      const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(h + n), decay, _mm256_mul_ps(dx, _mm256_loadu_ps(B + n)));
      _mm256_storeu_ps(h + n, v);
      acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(C + n), acc);
    }
    y[ch] = finish_channel(acc, h, body, N, dt[ch], dt[ch] * x[ch], a, B, C);
  }
}

}  // namespace

const SsmOps kSsmAvx2 = {step_avx2, channels_avx2};

}  // namespace ie
