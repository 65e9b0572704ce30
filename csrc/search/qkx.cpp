// make_qkx2_quants as ggml-quants.c writes it (qkx.h), four blocks at a
// time (lanes.h; the numpy code this replaced ran across blocks the same
// way: a block's own sums are one chain no vector can split).
#include "qkx.h"

#include <vector>

#include "lanes.h"

namespace ie {
namespace {

using namespace search;

// ggml's nearest_int (round half to even by adding 1.5 * 2^23; what the C
// code returns outside |v| < 2^22, inf and NaN included), clamped to 0..nmax.
inline VI codes_of(V v, int nmax) {
  const VI bits = reinterpret_cast<VI>(v + kRoundMagic);
  VI l = (bits & 0x007FFFFF) - 0x00400000;  // in [-2^22, 2^22)
  l &= ~(l >> 31);                          // max(l, 0) by shifts and masks: SSE2 has no pmaxsd, and GCC
  const VI over = (nmax - l) >> 31;         // scalarized the selects
  return (l & ~over) | (nmax & over);
}

// Each lane's codes of x under iscale and min into l, and its sums
// Σ w l, Σ w l², Σ w l x, left to right from element 0.
void fit_sums(const V* x, const V* w, int k, int nmax, V iscale, V min, VI* l, V& sum_l, V& sum_l2, V& sum_xl) {
  VI c = codes_of(iscale * (x[0] - min), nmax);
  l[0] = c;
  V lf = as_float(c), wl = w[0] * lf;
  V s1 = wl, s2 = wl * lf, s3 = wl * x[0];
  for (int i = 1; i < k; ++i) {
    c = codes_of(iscale * (x[i] - min), nmax);
    l[i] = c;
    lf = as_float(c);
    wl = w[i] * lf;
    s1 += wl;
    s2 += wl * lf;
    s3 += wl * x[i];
  }
  sum_l = s1;
  sum_l2 = s2;
  sum_xl = s3;
}

// Each lane's weighted error of scale * l + min against x: squared, or
// absolute (MAD), left to right from element 0.
template <bool MAD>
V error_of(const V* x, const V* w, int k, const VI* l, V scale, V min) {
  auto term = [&](int i) {
    const V diff = scale * as_float(l[i]) + min - x[i];
    return w[i] * (MAD ? abs_lanes(diff) : diff * diff);
  };
  V e = term(0);
  for (int i = 1; i < k; ++i) e += term(i);
  return e;
}

// One group of kLanes blocks, element-major: x[i][g] is element i of block
// g. Writes each lane's scale, min and codes.
template <bool MAD>
void group(const V* x, const V* w, int k, const QkxSearch& s, V& scale_out, V& min_out, VI* L, VI* aux) {
  const float nmax = static_cast<float>(s.nmax);
  V min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < k; ++i) {
    min = x[i] < min ? x[i] : min;
    max = x[i] > max ? x[i] : max;
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  min = min > 0.f ? V{} : min;
  V iscale = nmax / (max - min);
  V scale = 1.f / iscale;
  V unused[3];
  fit_sums(x, w, k, s.nmax, iscale, min, L, unused[0], unused[1], unused[2]);
  V best = error_of<MAD>(x, w, k, L, scale, min);
  for (int step = 0; step <= s.nstep; ++step) {
    iscale = (s.rmin + s.rdelta * static_cast<float>(step) + nmax) / (max - min);
    V sum_l, sum_l2, sum_xl;
    fit_sums(x, w, k, s.nmax, iscale, min, aux, sum_l, sum_l2, sum_xl);
    const V D = sum_w * sum_l2 - sum_l * sum_l;
    V this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    V this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    const VI pos = this_min > 0.f;
    this_scale = pos ? sum_xl / sum_l2 : this_scale;
    this_min = pos ? V{} : this_min;
    const V cur = error_of<MAD>(x, w, k, aux, this_scale, this_min);
    const VI better = (D > 0.f) & (cur < best) & (max != min);
    for (int g = 0; g < kLanes; ++g) {
      if (!better[g]) continue;
      for (int i = 0; i < k; ++i) L[i][g] = aux[i][g];
    }
    best = better ? cur : best;
    scale = better ? this_scale : scale;
    min = better ? this_min : min;
  }
  const VI flat = max == min;
  scale_out = flat ? V{} : scale;
  min_out = -min;
  for (int i = 0; i < k; ++i) L[i] = flat ? VI{} : L[i];
}

}  // namespace

void qkx_search(const float* x, const float* w, int64_t n, int k, const QkxSearch& s, float* scale, float* the_min,
                uint8_t* codes) {
  std::vector<VI> L(static_cast<size_t>(k)), aux(static_cast<size_t>(k));
  for_each_group(x, w, n, k, [&](int64_t b0, int m, const V* xt, const V* wt) {
    V sc, mn;
    (s.mad ? group<true> : group<false>)(xt, wt, k, s, sc, mn, L.data(), aux.data());
    store_lanes(sc, b0, m, scale);
    store_lanes(mn, b0, m, the_min);
    store_codes(L.data(), b0, m, k, codes);
  });
}

}  // namespace ie
