// The attention's inner loops over the KV cache, for a tile of query rows
// that share one KV head: their scores against a run of cached keys, the
// softmax's exponentials, and the probability-weighted sums of a run of
// cached values. They are O(context) per token and head, so in a long
// prefill they cost as much as the matrices unless each keeps its running
// sums in registers and reuses every key and value it loads for several
// queries; the decoder (decoder/decoder.cpp) calls them through this table,
// a block of keys at a time for all the queries of a work item.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dispatch.h"
#include "common/half.h"
#include "common/isa.h"

namespace ie {

struct AttnOps {
  // out[r][t] = scale * (q[r] . k_t) for r < nq, t < n, with
  // k_t = k + t * stride (d floats each). Each dot sums in eight partial
  // sums in a fixed order (lane u sums the elements i < d - d % 8 with
  // i % 8 == u), added pairwise as ((0+1)+(2+3))+((4+5)+(6+7)), then the
  // tail in order: a score does not depend on nq, n or the other rows.
  void (*scores)(const float* const* q, int nq, const float* k, size_t stride, int n, int d, float scale,
                 float* const* out);
  // The largest of p[t] for t < n >= 1 (the softmax's shift; std::max_element
  // went one float per cycle).
  float (*max)(const float* p, int n);
  // p[t] = exp(p[t] - max) for t < n; returns their sum. max is at least
  // the largest p[t] (an attention sink's logit may exceed them all), so
  // every exponential is in [0, 1].
  float (*softmax_exp)(float* p, int n, float max);
  // o[r][i] += sum over t < n of p[r][t] * v_t[i] for r < nq, i < d,
  // v_t = v + t * stride: added onto o[r][i] in order of t, so consecutive
  // runs of t continue one chain (bit-identical to a single call over their
  // union), and a zero p adds nothing.
  void (*mix)(const float* const* p, int nq, const float* v, size_t stride, int n, int d, float* const* o);
  // scores and mix over an f16 KV cache (DecoderConfig::k_cache, v_cache):
  // each cached half widened to float as it is loaded (exact), then the
  // same operations, so they give what scores and mix give over the
  // widened floats, bit for bit.
  void (*scores_f16)(const float* const* q, int nq, const uint16_t* k, size_t stride, int n, int d, float scale,
                     float* const* out);
  void (*mix_f16)(const float* const* p, int nq, const uint16_t* v, size_t stride, int n, int d, float* const* o);
  // The f16 cache written a token's row at a time: dst[i] = f16_to_cache(src[i]), i < n.
  void (*narrow)(const float* src, int n, uint16_t* dst);
};

// A float as the f16 cache keeps it: |x| past 65504 (the largest finite
// half) saturated to +-65504, then rounded to nearest even (f32_to_f16);
// NaN stays NaN. A key or value that overflowed to infinity would make its
// scores or the weighted sum inf - inf = NaN for every later token, where
// saturating it costs only that element's excess.
uint16_t f16_to_cache(float x);
// A cached element as a float, for the scalar reference and the SIMD tails:
// an f32 cache's as it is, an f16 cache's widened (exact).
inline float cache_float(float x) { return x; }
inline float cache_float(uint16_t h) { return f16_to_f32(h); }
extern const AttnOps kAttnScalar;
#if IE_HAVE_X86
extern const AttnOps kAttnAvx2;
extern const AttnOps kAttnAvx512;
#endif
extern const IsaTable<AttnOps> kAttnTable;

// The attention variant that runs for a resolved `isa`.
Isa attention_kernel_isa(Isa isa);

}  // namespace ie
