// The decoder's elementwise activations over a row of floats: SiLU(g) * u
// (SwiGLU's unit; u absent: SiLU alone, the causal convolutions of Mamba2
// and gated DeltaNet; g the gate z and u the output: their gated outputs)
// and GELU(g) * u with tanh's approximation (Gemma's unit). A prefill with
// float activations runs them over every token's intermediate channels
// (SmolLM2: 1536 per layer and token), where libm's expf one float at a
// time took a tenth of the time; the SIMD variants take common/exp_avx2.h's
// exp, eight or sixteen lanes at a time. And xIELU (Apertus's MLP unit),
// whose negative half is expm1's.
#pragma once
#include <cstddef>

#include "common/dispatch.h"
#include "common/isa.h"

namespace ie {

// xIELU's four parameters as it multiplies by them (transformers' XIELUActivation; arXiv 2411.13010):
// alpha_p = softplus(raw alpha_p), alpha_n = beta + softplus(raw alpha_n), as ggml_xielu derives them from
// the checkpoint's raw values (from_raw). The Hub's models have beta 0.5 and eps -1e-6.
struct Xielu {
  float alpha_p, alpha_n, beta, eps;
  static Xielu from_raw(float alpha_p, float alpha_n, float beta, float eps);
};

struct ActOps {
  // out[i] = SiLU(g[i]) * u[i] and GELU_tanh(g[i]) * u[i] (u null: * 1) for
  // i < n; out may be g or u (each element is written after it is read).
  // The scalar reference computes g / (1 + exp(-g)) with std::exp; the SIMD
  // variants g * sigmoid(g) from exp(-|g|), within a few ulps of it.
  void (*silu_mul)(float* out, const float* g, const float* u, size_t n);
  void (*gelu_tanh_mul)(float* out, const float* g, const float* u, size_t n);
  // x[i] = xIELU(x[i]) for i < n, in place: alpha_p x^2 + beta x where x > 0, else
  // (expm1(min(x, eps)) - x) alpha_n + beta x. The scalar reference takes std::expm1 (ggml's op_xielu, the
  // float32 of transformers' torch.where), the SIMD variants common/exp_avx2.h's expm1, within a few ulps.
  void (*xielu)(float* x, size_t n, const Xielu& p);
};

extern const ActOps kActScalar;
#if IE_HAVE_X86
extern const ActOps kActAvx2;
extern const ActOps kActAvx512;
#endif
extern const IsaTable<ActOps> kActTable;

}  // namespace ie
