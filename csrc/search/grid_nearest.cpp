// The codebook searches (grid_nearest.h): per tuple, its level index, then
// its kCandidates' weighted errors, D products each; per row of 32 (or 16)
// elements, the scale fits built on that.
#include "grid_nearest.h"

#include <cmath>
#include <cstring>

#include "lanes.h"

namespace ie {
namespace {

// The index of the tuple of levels nearest to ui (grid_nearest.h).
template <int D, bool Ternary = false>
inline int tuple_of(const float* ui) {
  int t = 0;
  if constexpr (Ternary) {  // iq1's -1, 0, 1: level 0..2 by the edges -1/2, 1/2 (NaN: 0)
    for (int j = 0, p = 1; j < 8; ++j, p *= 3) t += p * ((ui[j] > -0.5f) + (ui[j] > 0.5f));
  } else if constexpr (D == 4) {
    for (int j = 0; j < 4; ++j) {
      // Half to even as numpy's rint, by adding and taking off 1.5 * 2^23 (nearbyint is a libm call
      // below SSE4.1); exact where it matters, |l| < 2^22, and on the right side of 0..7 beyond.
      const float l = ((ui[j] - 1.f) * 0.5f + search::kRoundMagic) - search::kRoundMagic;
      t += (l > 0.f ? (l < 7.f ? static_cast<int>(l) : 7) : 0) << (3 * j);
    }
  } else {
    for (int j = 0, p = 1; j < 8; ++j, p *= 3)  // NaN: level 0 (both comparisons false)
      t += p * ((ui[j] > kIq2Edges[0]) + (ui[j] > kIq2Edges[1]));
  }
  return t;
}

// The candidate of least weighted error for the tuple ui under weights wi:
// its place among the kCandidates of the tuple's levels, *t_out their index.
// kLanes candidates per vector; the first of the least found as the lowest
// bit of a mask of the errors equal to their minimum: a scan keeping the
// first smaller one branches on the data (grid_nearest 1.2x the time, on a
// core shared with other work).
// Forced inline: called from two loops, GCC kept it out of line (1.2x).
template <int D, bool Ternary = false>
__attribute__((always_inline)) inline int nearest_one(const float* ui, const float* wi, const float* cand_val,
                                                      int* t_out) {
  using search::V;
  using search::VI;
  static_assert(kCandidates == 4 * search::kLanes, "four vectors of candidates");
  const int t = tuple_of<D, Ternary>(ui);
  *t_out = t;
  // The candidates side by side (cand_val is [tuples, D, kCandidates]): element j's term of
  // candidate 4v + l is lane l of vector v.
  const float* g = cand_val + static_cast<int64_t>(t) * D * kCandidates;
  V e[4];
  for (int j = 0; j < D; ++j) {
    const float u2 = 2.f * ui[j], wj = wi[j];
    for (int v = 0; v < 4; ++v) {
      V gj;
      std::memcpy(&gj, g + j * kCandidates + v * search::kLanes, sizeof gj);
      e[v] = j ? e[v] + gj * (gj - u2) * wj : gj * (gj - u2) * wj;
    }
  }
  V least = e[1] < e[0] ? e[1] : e[0];
  const V least23 = e[3] < e[2] ? e[3] : e[2];
  least = least23 < least ? least23 : least;
  V other = __builtin_shufflevector(least, least, 2, 3, 0, 1);
  least = other < least ? other : least;
  other = __builtin_shufflevector(least, least, 1, 0, 3, 2);
  least = other < least ? other : least;  // in every lane
  const VI bit = {1, 2, 4, 8};
  const VI nan = (e[0] != e[0]) | (e[1] != e[1]) | (e[2] != e[2]) | (e[3] != e[3]);
  const VI bits = ((e[0] == least) & bit) | (((e[1] == least) & bit) << 4) | (((e[2] == least) & bit) << 8) |
                  (((e[3] == least) & bit) << 12) | (nan & (1 << 16));
  const unsigned mask = static_cast<unsigned>(bits[0] | bits[1] | bits[2] | bits[3]);
  if (mask >> 16) {  // a NaN error: the scan's own answer (a NaN first is kept, later ones never chosen)
    const float* ef = reinterpret_cast<const float*>(e);
    int best = 0;
    for (int c = 1; c < kCandidates; ++c)
      if (ef[c] < ef[best]) best = c;
    return best;
  }
  return __builtin_ctz(mask);
}

// The float32 sum of N values (16 or 32) in numpy's order (its pairwise
// sum below 128 elements: eight running sums of every eighth value, then a
// tree), so that the fits are the bits of the numpy they replaced
// (tests/test_quant_search.py).
template <int N>
inline float numpy_sum(const float* v) {
  float r[8];
  for (int j = 0; j < 8; ++j) r[j] = v[j];
  for (int i = 8; i < N; i += 8)
    for (int j = 0; j < 8; ++j) r[j] += v[i + j];
  return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
}

// The search over places the scale fits share: fit(p) gives the weighted
// sums {sum w q x, sum w q q} of the entries chosen at place p; the scale is
// their least-squares one, sum w q x / sum w q q, the first of largest
// scale * sum w q x kept (0 where none is above 0), over starts, then the
// best place so far moved by -m and by +m for each m of moves.
struct Sums {
  float qx, qq;
};
template <class Fit>
float best_scale(Fit fit, const float* starts, int nstarts, const float* moves, int nmoves) {
  float best = 0.f, gain = 0.f, place = 0.f;
  auto at = [&](float p) {
    const Sums s = fit(p);
    const float scale = s.qx / (s.qq > 0.f ? s.qq : INFINITY);
    if (scale * s.qx > gain) {
      best = scale;
      gain = scale * s.qx;
      place = p;
    }
  };
  for (int s = 0; s < nstarts; ++s) at(starts[s]);
  for (int m = 0; m < nmoves; ++m) {
    const float around = place;
    at(around - moves[m]);
    at(around + moves[m]);
  }
  return best;
}

// The scale of one N-element row (grid_scales).
template <int D, int N>
float row_scale(const float* x, const float* w, const float* cand_val, const float* starts, int nstarts,
                const float* moves, int nmoves) {
  float amax = x[0];
  for (int i = 1; i < N; ++i) amax = x[i] > amax || x[i] != x[i] ? x[i] : amax;  // a NaN stays, as numpy's max
  const float div = amax > 0.f ? amax : 1.f;  // a division: 1 / a subnormal largest would overflow
  float unit[N];
  for (int i = 0; i < N; ++i) unit[i] = x[i] / div;
  auto fit = [&](float at) {
    float u[N], wqx[N], wqq[N];
    for (int i = 0; i < N; ++i) u[i] = unit[i] * at;
    for (int b = 0; b < N; b += D) {
      int t;
      const int c = nearest_one<D>(u + b, w + b, cand_val, &t);
      const float* g = cand_val + static_cast<int64_t>(t) * D * kCandidates + c;
      for (int j = 0; j < D; ++j) {
        const float q = g[j * kCandidates], wq = w[b + j] * q;
        wqx[b + j] = wq * x[b + j];
        wqq[b + j] = wq * q;
      }
    }
    return Sums{numpy_sum<N>(wqx), numpy_sum<N>(wqq)};
  };
  return best_scale(fit, starts, nstarts, moves, nmoves);
}

// The scale of one N-element row of signed x under the ternary codebook
// shifted by +-delta per G elements (shifted_scales): at each place, each
// G-group's tuples take their nearest entries for u - delta and for
// u + delta, the group the shift of the smaller weighted error (+delta of
// equals), then the weighted least-squares scale of the values g + shift.
template <int N, int G>
float shifted_row_scale(const float* x, const float* w, const float* cand_val, const float* starts, int nstarts,
                        const float* moves, int nmoves, float delta) {
  static_assert(N % G == 0 && G % 8 == 0, "whole groups of whole tuples");
  float amax = 0.f;
  for (int i = 0; i < N; ++i) amax = std::fabs(x[i]) > amax || x[i] != x[i] ? std::fabs(x[i]) : amax;
  const float div = amax > 0.f ? amax : 1.f;
  float unit[N];
  for (int i = 0; i < N; ++i) unit[i] = x[i] / div;
  auto fit = [&](float at) {
    float sumqx = 0.f, sumq2 = 0.f;
    for (int g0 = 0; g0 < N; g0 += G) {
      float q[2][G], err[2] = {0.f, 0.f};
      for (int side = 0; side < 2; ++side) {
        const float shift = side ? -delta : delta;
        for (int b = 0; b < G; b += 8) {
          float u[8];
          for (int j = 0; j < 8; ++j) u[j] = unit[g0 + b + j] * at - shift;
          int t;
          const int c = nearest_one<8, true>(u, w + g0 + b, cand_val, &t);
          const float* gv = cand_val + static_cast<int64_t>(t) * 8 * kCandidates + c;
          for (int j = 0; j < 8; ++j) {
            const float e = u[j] - gv[j * kCandidates];
            err[side] += w[g0 + b + j] * e * e;
            q[side][b + j] = gv[j * kCandidates] + shift;
          }
        }
      }
      const float* qs = q[err[1] < err[0] ? 1 : 0];
      for (int j = 0; j < G; ++j) {
        const float wq = w[g0 + j] * qs[j];
        sumqx += wq * x[g0 + j];
        sumq2 += wq * qs[j];
      }
    }
    return Sums{sumqx, sumq2};
  };
  return best_scale(fit, starts, nstarts, moves, nmoves);
}

}  // namespace

void grid_nearest(int dims, bool ternary, const float* u, const float* w, int64_t m, const int16_t* cand_idx,
                  const float* cand_val, int32_t* out) {
  for (int64_t i = 0; i < m; ++i) {
    int t;
    const int c = ternary     ? nearest_one<8, true>(u + 8 * i, w + 8 * i, cand_val, &t)
                  : dims == 4 ? nearest_one<4>(u + 4 * i, w + 4 * i, cand_val, &t)
                              : nearest_one<8>(u + 8 * i, w + 8 * i, cand_val, &t);
    out[i] = cand_idx[static_cast<int64_t>(t) * kCandidates + c];
  }
}

void shifted_scales(int n, const float* x, const float* w, int64_t m, const float* cand_val,
                    const float* starts, int nstarts, const float* moves, int nmoves, float delta, float* out) {
  using Fit = float (*)(const float*, const float*, const float*, const float*, int, const float*, int, float);
  const Fit fit = n == 32 ? shifted_row_scale<32, 32> : shifted_row_scale<16, 8>;
  for (int64_t r = 0; r < m; ++r)
    out[r] = fit(x + n * r, w + n * r, cand_val, starts, nstarts, moves, nmoves, delta);
}

void grid_scales(int dims, int n, const float* a, const float* w, int64_t m, const float* cand_val,
                 const float* starts, int nstarts, const float* moves, int nmoves, float* out) {
  using Fit = float (*)(const float*, const float*, const float*, const float*, int, const float*, int);
  const Fit fit = dims == 4 ? row_scale<4, 32> : n == 32 ? row_scale<8, 32> : row_scale<8, 16>;
  for (int64_t r = 0; r < m; ++r) out[r] = fit(a + n * r, w + n * r, cand_val, starts, nstarts, moves, nmoves);
}

}  // namespace ie
