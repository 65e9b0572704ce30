// Scalar reference of the attention loops (attention.h), and the table.
#include "attention.h"

namespace ie {
namespace {

float dot_scalar(const float* a, const float* b, int n) {
  float p[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) p[u] += a[i + u] * b[i + u];
  float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_scalar(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

const AttnOps kAttnScalar = {dot_scalar, axpy_scalar};

const IsaTable<AttnOps> kAttnTable = {{&kAttnScalar,
#if IE_HAVE_X86
                                       &kAttnAvx2,
#else
                                       nullptr,
#endif
                                       nullptr}};

Isa attention_kernel_isa(Isa isa) { return kAttnTable.pick(isa); }

}  // namespace ie
