// Scalar reference of Mamba2's scan step and Mamba 1's (ssm.h), and the table.
#include <cmath>
#include <cstddef>

#include "ssm.h"

namespace ie {
namespace {

// s . C over N, in eight partial sums added pairwise, then the tail in order (ssm.h).
float read_out(const float* s, const float* C, int N) {
  const int body = N - N % 8;
  float part[8] = {};
  for (int n = 0; n < body; n += 8)
    for (int u = 0; u < 8; ++u) part[u] += s[n + u] * C[n + u];
  float acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (int n = body; n < N; ++n) acc += s[n] * C[n];
  return acc;
}

void step_scalar(float* S, int P, int N, float decay, const float* dx, const float* B, const float* C, float* y) {
  for (int p = 0; p < P; ++p) {
    float* s = S + static_cast<size_t>(p) * static_cast<size_t>(N);
    for (int n = 0; n < N; ++n) s[n] = s[n] * decay + dx[p] * B[n];
    y[p] = read_out(s, C, N);
  }
}

void channels_scalar(float* H, int channels, int N, const float* dt, const float* x, const float* A, const float* B,
                     const float* C, float* y) {
  for (int ch = 0; ch < channels; ++ch) {
    float* h = H + static_cast<size_t>(ch) * static_cast<size_t>(N);
    const float* a = A + static_cast<size_t>(ch) * static_cast<size_t>(N);
    const float dx = dt[ch] * x[ch];
    for (int n = 0; n < N; ++n) h[n] = std::exp(dt[ch] * a[n]) * h[n] + dx * B[n];
    y[ch] = read_out(h, C, N);
  }
}

}  // namespace

const SsmOps kSsmScalar = {step_scalar, channels_scalar};

const IsaTable<SsmOps> kSsmTable = {{&kSsmScalar,
#if IE_HAVE_X86
                                     &kSsmAvx2, nullptr, &kSsmAvx512
#else
                                     nullptr, nullptr, nullptr
#endif
                                    }};

}  // namespace ie
