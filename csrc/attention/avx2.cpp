// AVX2/FMA attention loops (this file alone is built with -mavx2 -mfma).
// scores: eight keys at a time, q reloaded once per eight FMAs, and the
// eight keys' partial-sum vectors reduced together (hadd, hadd, then the
// two halves), which is the scalar reference's order. mix: the output row
// loaded into eight-lane accumulators, carried across all n values, stored
// once.
#include <immintrin.h>

#include "attention.h"
#include "common/exp_avx2.h"

namespace ie {
namespace {

// Lane u of the result: the sum of a[u]'s eight lanes, as
// ((0+1)+(2+3))+((4+5)+(6+7)).
__m256 reduce8(const __m256 a[8]) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

float dot1(const float* q, const float* k, int body, int d) {
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < body; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
  alignas(32) float p[8];
  _mm256_store_ps(p, acc);
  float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  for (int i = body; i < d; ++i) s += q[i] * k[i];
  return s;
}

void scores_avx2(const float* q, const float* k, size_t stride, int n, int d, float scale, float* out) {
  const int body = d - d % 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  int t = 0;
  for (; t + 8 <= n; t += 8) {
    const float* kt = k + static_cast<size_t>(t) * stride;
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
    for (int i = 0; i < body; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt + u * stride + i), acc[u]);
    }
    __m256 s = reduce8(acc);
    if (body < d) {
      alignas(32) float tail[8];
      _mm256_store_ps(tail, s);
      for (int u = 0; u < 8; ++u)
        for (int i = body; i < d; ++i) tail[u] += q[i] * kt[u * stride + i];
      s = _mm256_load_ps(tail);
    }
    _mm256_storeu_ps(out + t, _mm256_mul_ps(s, vscale));
  }
  for (; t < n; ++t) out[t] = dot1(q, k + static_cast<size_t>(t) * stride, body, d) * scale;
}

float softmax_exp_avx2(float* p, int n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  int t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(p + t), vmax));
    _mm256_storeu_ps(p + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float s8[8];
  _mm256_store_ps(s8, acc);
  float sum = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
  if (t < n) {
    alignas(32) float tail[8] = {};
    for (int u = 0; t + u < n; ++u) tail[u] = p[t + u] - max;
    _mm256_store_ps(tail, exp_nonpositive(_mm256_load_ps(tail)));
    for (int u = 0; t + u < n; ++u) {
      p[t + u] = tail[u];
      sum += tail[u];
    }
  }
  return sum;
}

// o[c0, c0 + 8 * W) plus all n values: W accumulators stay in registers.
template <int W>
void mix_cols(const float* p, const float* v, size_t stride, int n, int c0, float* o) {
  __m256 acc[W];
  for (int w = 0; w < W; ++w) acc[w] = _mm256_loadu_ps(o + c0 + 8 * w);
  for (int t = 0; t < n; ++t) {
    const __m256 pt = _mm256_broadcast_ss(p + t);
    const float* vt = v + static_cast<size_t>(t) * stride + c0;
    for (int w = 0; w < W; ++w) acc[w] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * w), acc[w]);
  }
  for (int w = 0; w < W; ++w) _mm256_storeu_ps(o + c0 + 8 * w, acc[w]);
}

void mix_avx2(const float* p, const float* v, size_t stride, int n, int d, float* o) {
  int c = 0;
  for (; c + 64 <= d; c += 64) mix_cols<8>(p, v, stride, n, c, o);
  for (; c + 32 <= d; c += 32) mix_cols<4>(p, v, stride, n, c, o);
  for (; c + 8 <= d; c += 8) mix_cols<1>(p, v, stride, n, c, o);
  for (; c < d; ++c) {
    float s = o[c];
    for (int t = 0; t < n; ++t) s += p[t] * v[static_cast<size_t>(t) * stride + c];
    o[c] = s;
  }
}

}  // namespace

const AttnOps kAttnAvx2 = {scores_avx2, softmax_exp_avx2, mix_avx2};

}  // namespace ie
