// The nearest codebook entry to each four-tuple of magnitudes under
// per-weight weights, among the candidates a table lists for its rounded
// tuple: iq3_s's search (formats/iq3s_grid.py builds the table).
#pragma once
#include <cstdint>

namespace ie {

constexpr int kMaxCandidates = 512;

// u, w: [m, 4]. cand_idx [4096, k] (int16 entry numbers, k <= kMaxCandidates)
// and cand_val [4096, 4, k] (their magnitudes, element-major) list the candidates of each tuple of
// levels 0..7 (index sum level_j 8^j), level_j = clamp(rint((u_j - 1) / 2),
// 0, 7) (NaN: 0). out[i]: the candidate of least sum_j w_j g_j (g_j - 2 u_j)
// (the weighted squared distance less the candidates' common sum w u^2), the
// first of equals.
void grid_nearest(const float* u, const float* w, int64_t m, const int16_t* cand_idx, const float* cand_val, int k,
                  int32_t* out);

}  // namespace ie
