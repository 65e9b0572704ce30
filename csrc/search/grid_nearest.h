// The nearest codebook entry to each four-tuple of magnitudes under
// per-weight weights, among the candidates a table lists for its rounded
// tuple, and the scale fits built on it: the codebook types' searches
// (formats/codebooks.py builds the table; tests/test_quant_search.py holds
// the numpy they replaced).
#pragma once
#include <cstdint>

namespace ie {

// Candidates per tuple of levels (formats/codebooks.py's NEIGHBOURS): fixed,
// so that they are four vectors of errors with no loop bounds.
constexpr int kCandidates = 16;

// The two shapes of ggml's codebooks, by dims D, the magnitudes per entry:
// - D = 4 (iq3_s, iq3_xxs): levels 0..7 standing for 1, 3, .., 15 (iq3_xxs's
//   top 15.5), level_j = clamp(rint((u_j - 1) / 2), 0, 7) (NaN: 0), the
//   tuple's index sum level_j 8^j (4096 tuples);
// - D = 8 (iq2_xxs): levels 0..2 standing for 1, 3.125, 5.375 (ggml's 8, 25,
//   43 over 8), level_j the number of kIq2Edges below u_j (NaN: 0), the
//   tuple's index sum level_j 3^j (6561 tuples).
// - ternary (iq1_s, iq1_m: signed entries of -1, 0, 1, ggml's iq1s_grid):
//   D = 8, level_j the number of the edges -1/2, 1/2 below u_j (NaN: 0), the
//   tuple's index sum level_j 3^j (6561 tuples).
constexpr float kIq2Edges[2] = {2.0625f, 4.25f};  // midway between the levels
constexpr int grid_tuples(int dims) { return dims == 4 ? 4096 : 6561; }

// u, w: [m, dims]. cand_idx [tuples, kCandidates] (int16 entry numbers) and
// cand_val [tuples, dims, kCandidates] (their magnitudes, element-major) list
// the candidates of each tuple of levels. out[i]: the candidate of least
// sum_j w_j g_j (g_j - 2 u_j) (the weighted squared distance less the
// candidates' common sum w u^2), the first of equals.
void grid_nearest(int dims, bool ternary, const float* u, const float* w, int64_t m, const int16_t* cand_idx,
                  const float* cand_val, int32_t* out);

// a, w: [m, n] magnitudes and weights, n = 32, or 16 for dims 8 (iq2_xs's
// and iq2_s's 16-element sub-blocks). out[r]: the scale of row r,
// formats/codebooks.py's scales() in the same float32 operations (NaN and
// inf included: a weight can overflow where an importance matrix is huge): at each
// place p tried (starts, then the best so far moved by -d and +d for each d
// of moves), u = a / max(a) * p (1 for max(a) 0) takes each tuple's grid_nearest entry q and
// the weighted least-squares scale s = sum w q a / sum w q q; the first s of
// largest s * sum w q a (0 where none is above 0) is kept.
void grid_scales(int dims, int n, const float* a, const float* w, int64_t m, const float* cand_val,
                 const float* starts, int nstarts, const float* moves, int nmoves, float* out);

// x, w: [m, n] signed weights and their weights, n = 32 (iq1_s: one shift
// per row) or 16 (iq1_m: a shift per 8). The ternary codebook's scale
// search: at each place p tried (as grid_scales'), u = x / max|x| * p; each
// group's tuples take their grid_nearest entries g for u - delta and for
// u + delta, the group the shift s of the smaller sum w (u - s - g)^2
// (+delta of equals); the scale is sum w q x / sum w q q over q = g + s, the
// first of largest scale * sum w q x kept (0 where none is above 0).
void shifted_scales(int n, const float* x, const float* w, int64_t m, const float* cand_val, const float* starts,
                    int nstarts, const float* moves, int nmoves, float delta, float* out);

}  // namespace ie
