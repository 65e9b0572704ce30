// The attention's inner loops over the KV cache: q . k_t for every cached
// position t, and o += p_t v_t. They are O(context) per token and head, so
// in a long prefill they cost as much as the matrices unless vectorised;
// the decoder (decoder/decoder.cpp) calls them through this table.
#pragma once
#include "common/dispatch.h"
#include "common/isa.h"

namespace ie {

struct AttnOps {
  // a . b over n floats: eight partial sums in a fixed order (lane u sums
  // the elements i with i % 8 == u), added pairwise, then the tail.
  float (*dot)(const float* a, const float* b, int n);
  // y[i] += a * x[i] for i < n.
  void (*axpy)(float a, const float* x, float* y, int n);
};
extern const AttnOps kAttnScalar;
#if IE_HAVE_X86
extern const AttnOps kAttnAvx2;
#endif
extern const IsaTable<AttnOps> kAttnTable;

// The attention variant that runs for a resolved `isa`.
Isa attention_kernel_isa(Isa isa);

}  // namespace ie
