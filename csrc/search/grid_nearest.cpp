// iq3_s's nearest-entry search (grid_nearest.h): per tuple, its level index,
// then k candidates' weighted errors, four products each.
#include "grid_nearest.h"

#include "lanes.h"

namespace ie {

void grid_nearest(const float* u, const float* w, int64_t m, const int16_t* cand_idx, const float* cand_val, int k,
                  int32_t* out) {
  for (int64_t i = 0; i < m; ++i) {
    const float* ui = u + 4 * i;
    const float* wi = w + 4 * i;
    int t = 0;
    for (int j = 0; j < 4; ++j) {
      // Half to even as numpy's rint, by adding and taking off 1.5 * 2^23 (nearbyint is a libm call
      // below SSE4.1); exact where it matters, |l| < 2^22, and on the right side of 0..7 beyond.
      const float l = ((ui[j] - 1.f) * 0.5f + search::kRoundMagic) - search::kRoundMagic;
      t += (l > 0.f ? (l < 7.f ? static_cast<int>(l) : 7) : 0) << (3 * j);
    }
    // The candidates side by side (cand_val is [4096, 4, k]): each element's term is one pass of
    // vector lanes over them, four passes in all.
    const float* g = cand_val + static_cast<int64_t>(t) * 4 * k;
    float e[kMaxCandidates];
    for (int c = 0; c < k; ++c) e[c] = g[c] * (g[c] - 2.f * ui[0]) * wi[0];
    for (int j = 1; j < 4; ++j) {
      const float* gj = g + j * k;
      const float u2 = 2.f * ui[j], wj = wi[j];
      for (int c = 0; c < k; ++c) e[c] += gj[c] * (gj[c] - u2) * wj;
    }
    int best = 0;
    for (int c = 1; c < k; ++c)
      if (e[c] < e[best]) best = c;
    out[i] = cand_idx[static_cast<int64_t>(t) * k + best];
  }
}

}  // namespace ie
