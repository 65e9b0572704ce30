// Scalar reference of the attention loops (attention.h), and the table.
#include <algorithm>
#include <cmath>

#include "attention.h"

namespace ie {
namespace {

template <class T>
void scores_scalar(const float* const* q, int nq, const T* k, size_t stride, int n, int d, float scale,
                   float* const* out) {
  const int body = d - d % 8;
  for (int r = 0; r < nq; ++r)
    for (int t = 0; t < n; ++t) {
      const T* kt = k + static_cast<size_t>(t) * stride;
      float p[8] = {};
      for (int i = 0; i < body; i += 8)
        for (int u = 0; u < 8; ++u) p[u] += q[r][i + u] * cache_float(kt[i + u]);
      float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
      for (int i = body; i < d; ++i) s += q[r][i] * cache_float(kt[i]);
      out[r][t] = s * scale;
    }
}

float max_scalar(const float* p, int n) {
  float m = p[0];
  for (int t = 1; t < n; ++t) m = std::max(m, p[t]);
  return m;
}

float softmax_exp_scalar(float* p, int n, float max) {
  float sum = 0.f;
  for (int t = 0; t < n; ++t) {
    p[t] = std::exp(p[t] - max);
    sum += p[t];
  }
  return sum;
}

template <class T>
void mix_scalar(const float* const* p, int nq, const T* v, size_t stride, int n, int d, float* const* o) {
  for (int r = 0; r < nq; ++r)
    for (int t = 0; t < n; ++t) {
      const float pt = p[r][t];
      const T* vt = v + static_cast<size_t>(t) * stride;
      for (int i = 0; i < d; ++i) o[r][i] += pt * cache_float(vt[i]);
    }
}

void narrow_scalar(const float* src, int n, uint16_t* dst) {
  for (int i = 0; i < n; ++i) dst[i] = f16_to_cache(src[i]);
}

}  // namespace

uint16_t f16_to_cache(float x) { return f32_to_f16(x > 65504.f ? 65504.f : x < -65504.f ? -65504.f : x); }

const AttnOps kAttnScalar = {scores_scalar<float>, max_scalar,           softmax_exp_scalar,
                             mix_scalar<float>,    scores_scalar<uint16_t>, mix_scalar<uint16_t>,
                             narrow_scalar};

const IsaTable<AttnOps> kAttnTable = {{&kAttnScalar,
#if IE_HAVE_X86
                                       &kAttnAvx2, nullptr, &kAttnAvx512
#else
                                       nullptr, nullptr, nullptr
#endif
                                      }};

Isa attention_kernel_isa(Isa isa) { return kAttnTable.pick(isa); }

}  // namespace ie
