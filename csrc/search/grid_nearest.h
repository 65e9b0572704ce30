// The nearest codebook entry to each four-tuple of magnitudes under
// per-weight weights, among the candidates a table lists for its rounded
// tuple, and the scale fits built on it: iq3_s's and iq3_xxs's searches
// (formats/codebooks.py builds the table; tests/test_quant_search.py holds
// the numpy they replaced).
#pragma once
#include <cstdint>

namespace ie {

// Candidates per tuple of levels (formats/codebooks.py's NEIGHBOURS): fixed,
// so that they are four vectors of errors with no loop bounds.
constexpr int kCandidates = 16;

// u, w: [m, 4]. cand_idx [4096, kCandidates] (int16 entry numbers) and
// cand_val [4096, 4, kCandidates] (their magnitudes, element-major) list the candidates of each tuple of
// levels 0..7 (index sum level_j 8^j), level_j = clamp(rint((u_j - 1) / 2),
// 0, 7) (NaN: 0). out[i]: the candidate of least sum_j w_j g_j (g_j - 2 u_j)
// (the weighted squared distance less the candidates' common sum w u^2), the
// first of equals.
void grid_nearest(const float* u, const float* w, int64_t m, const int16_t* cand_idx, const float* cand_val,
                  int32_t* out);

// a, w: [m, 32] magnitudes and weights. out[r]: the scale of row r,
// formats/codebooks.py's scales() in the same float32 operations (NaN and
// inf included: a weight can overflow where an importance matrix is huge): at each
// place p tried (starts, then the best so far moved by -d and +d for each d
// of moves), u = a / max(a) * p (1 for max(a) 0) takes each tuple's grid_nearest entry q and
// the weighted least-squares scale s = sum w q a / sum w q q; the first s of
// largest s * sum w q a (0 where none is above 0) is kept.
void grid_scales(const float* a, const float* w, int64_t m, const float* cand_val, const float* starts, int nstarts,
                 const float* moves, int nmoves, float* out);

}  // namespace ie
