// Mamba2's scan step with AVX-512 (this file alone is built with the AVX-512
// flags): avx2.cpp's loop sixteen floats at a time, its sixteen lanes folded
// to eight for rows.h. Beside the same loop on pairs of 256-bit vectors, a
// Granite-4-shaped Q4_0 prefill ran 690-700 t/s against 605-640 (2 threads).
#include "rows.h"

namespace ie {
namespace {

void step_avx512(float* S, int P, int N, float decay, const float* dx, const float* B, const float* C, float* y) {
  const __m512 d = _mm512_set1_ps(decay);
  const int body = N - N % 16;
  for (int p = 0; p < P; ++p) {
    float* s = S + static_cast<size_t>(p) * static_cast<size_t>(N);
    const __m512 x = _mm512_set1_ps(dx[p]);
    __m512 acc = _mm512_setzero_ps();
    for (int n = 0; n < body; n += 16) {
      const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(s + n), d, _mm512_mul_ps(x, _mm512_loadu_ps(B + n)));
      _mm512_storeu_ps(s + n, v);
      acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(C + n), acc);
    }
    // (folded through memory: GCC 12's 512-to-256-bit casts warn of an uninitialised temporary)
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    y[p] = finish_row(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)), s, body, N, decay, dx[p], B, C);
  }
}

void channels_avx512(float* H, int channels, int N, const float* dt, const float* x, const float* A, const float* B,
                     const float* C, float* y) {
  const int body = N - N % 16;
  for (int ch = 0; ch < channels; ++ch) {
    float* h = H + static_cast<size_t>(ch) * static_cast<size_t>(N);
    const float* a = A + static_cast<size_t>(ch) * static_cast<size_t>(N);
    const __m512 t = _mm512_set1_ps(dt[ch]), dx = _mm512_set1_ps(dt[ch] * x[ch]);
    __m512 acc = _mm512_setzero_ps();
    for (int n = 0; n < body; n += 16) {
      const __m512 decay = exp_nonpositive(_mm512_mul_ps(t, _mm512_loadu_ps(a + n)));
      const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(h + n), decay, _mm512_mul_ps(dx, _mm512_loadu_ps(B + n)));
      _mm512_storeu_ps(h + n, v);
      acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(C + n), acc);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    y[ch] = finish_channel(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)), h, body, N, dt[ch],
                           dt[ch] * x[ch], a, B, C);
  }
}

}  // namespace

const SsmOps kSsmAvx512 = {step_avx512, channels_avx512};

}  // namespace ie
