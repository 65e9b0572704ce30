// Scalar reference of the decoder's activations (act.h), and the table.
#include <cmath>

#include "act.h"

namespace ie {
namespace {

void silu_mul_scalar(float* out, const float* g, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = g[i] / (1.f + std::exp(-g[i])) * (u ? u[i] : 1.f);
}

// torch's gelu(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in float32.
void gelu_tanh_mul_scalar(float* out, const float* g, const float* u, size_t n) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (size_t i = 0; i < n; ++i) {
    const float x = g[i];
    out[i] = 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x))) * (u ? u[i] : 1.f);
  }
}

void xielu_scalar(float* x, size_t n, const Xielu& p) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = v > 0.f ? p.alpha_p * v * v + p.beta * v : (std::expm1(std::fmin(v, p.eps)) - v) * p.alpha_n + p.beta * v;
  }
}

// softplus as torch's (threshold 20: x itself above it), in float32.
float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace

Xielu Xielu::from_raw(float alpha_p, float alpha_n, float beta, float eps) {
  return {softplus(alpha_p), beta + softplus(alpha_n), beta, eps};
}

const ActOps kActScalar = {silu_mul_scalar, gelu_tanh_mul_scalar, xielu_scalar};

const IsaTable<ActOps> kActTable = {{&kActScalar,
#if IE_HAVE_X86
                                     &kActAvx2, nullptr, &kActAvx512
#else
                                     nullptr, nullptr, nullptr
#endif
                                    }};

}  // namespace ie
