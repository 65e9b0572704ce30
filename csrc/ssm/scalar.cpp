// Scalar reference of Mamba2's scan step (ssm.h), and the table.
#include <cstddef>

#include "ssm.h"

namespace ie {
namespace {

void step_scalar(float* S, int P, int N, float decay, const float* dx, const float* B, const float* C, float* y) {
  const int body = N - N % 8;
  for (int p = 0; p < P; ++p) {
    float* s = S + static_cast<size_t>(p) * static_cast<size_t>(N);
    for (int n = 0; n < N; ++n) s[n] = s[n] * decay + dx[p] * B[n];
    float part[8] = {};
    for (int n = 0; n < body; n += 8)
      for (int u = 0; u < 8; ++u) part[u] += s[n + u] * C[n + u];
    float acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (int n = body; n < N; ++n) acc += s[n] * C[n];
    y[p] = acc;
  }
}

}  // namespace

const SsmOps kSsmScalar = {step_scalar};

const IsaTable<SsmOps> kSsmTable = {{&kSsmScalar,
#if IE_HAVE_X86
                                     &kSsmAvx2, nullptr, &kSsmAvx512
#else
                                     nullptr, nullptr, nullptr
#endif
                                    }};

}  // namespace ie
