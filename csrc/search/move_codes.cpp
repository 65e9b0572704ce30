// make_q3_quants and make_qp_quants (move_codes.h), four blocks at a time
// (lanes.h): the sweeps run element by element in every lane, a lane's
// sweep ending (its "active" bit cleared) after a pass that moved nothing,
// as the C loop breaks.
#include "move_codes.h"

#include <vector>

#include "lanes.h"

namespace ie {
namespace {

using namespace search;

// ggml's nearest_int of each lane (round half to even by adding 1.5 * 2^23;
// outside |v| < 2^22, inf and NaN, what the C code returns).
inline VI nearest(V v) {
  const VI bits = reinterpret_cast<VI>(v + kRoundMagic);
  return (bits & 0x007FFFFF) - 0x00400000;
}

inline VI min_i(VI a, int b) { return a < b ? a : VI{} + b; }
inline VI max_i(VI a, int b) { return a > b ? a : VI{} + b; }

// The sweeps (formats/quant_search.py _move_codes): codes l[i] in lo..hi
// (LOWER false: only hi), sums updated in place. REMOVED_SL2: make_qp_quants
// asks the sums without the element to be positive; make_q3_quants asks it
// of the sums with the new code.
template <bool LOWER, bool REMOVED_SL2>
void move_codes(const V* x, const V* w, int k, int lo, int hi, VI active, VI* l, V& sumlx, V& suml2) {
  for (int itry = 0; itry < 5; ++itry) {
    VI changed{};
    for (int i = 0; i < k; ++i) {
      const V li = as_float(l[i]);
      V slx = sumlx - w[i] * x[i] * li;
      V sl2 = suml2 - w[i] * li * li;
      VI nl = nearest(x[i] * sl2 / slx);
      nl = min_i(nl, hi);
      if (LOWER) nl = max_i(nl, lo);
      const V nf = as_float(nl);
      VI ok = active & (slx > 0.f) & (nl != l[i]);
      if (REMOVED_SL2) ok &= sl2 > 0.f;
      slx = slx + w[i] * x[i] * nf;
      sl2 = sl2 + w[i] * nf * nf;
      if (!REMOVED_SL2) ok &= sl2 > 0.f;
      ok &= slx * slx * suml2 > sumlx * sumlx * sl2;
      l[i] = ok ? nl : l[i];
      sumlx = ok ? slx : sumlx;
      suml2 = ok ? sl2 : suml2;
      changed |= ok;
    }
    active &= changed;
    bool any = false;
    for (int g = 0; g < kLanes; ++g) any |= active[g] != 0;
    if (!any) break;
  }
}

// Each lane's Σ w x l and Σ w l l over codes l, left to right from the
// first element.
void sums(const V* x, const V* w, int k, const VI* l, V& sumlx, V& suml2) {
  V lf = as_float(l[0]);
  V slx = w[0] * x[0] * lf, sl2 = w[0] * lf * lf;
  for (int i = 1; i < k; ++i) {
    lf = as_float(l[i]);
    slx += w[i] * x[i] * lf;
    sl2 += w[i] * lf * lf;
  }
  sumlx = slx;
  suml2 = sl2;
}

void q3_group(const V* x, V* w, int k, int nmax, VI* l, V& scale) {
  V amax, max;
  signed_max(x, k, amax, max);
  const VI zero = amax < 1e-15f;
  const V iscale = static_cast<float>(-nmax) / max;
  for (int i = 0; i < k; ++i) {
    w[i] = x[i] * x[i];
    l[i] = max_i(min_i(nearest(iscale * x[i]), nmax - 1), -nmax);
  }
  V sumlx, suml2;
  sums(x, w, k, l, sumlx, suml2);
  move_codes<true, false>(x, w, k, -nmax, nmax - 1, ~zero, l, sumlx, suml2);
  scale = suml2 > 0.f ? sumlx / suml2 : V{};
  scale = zero ? V{} : scale;
  for (int i = 0; i < k; ++i) l[i] = zero ? VI{} : l[i] + nmax;
}

// Σ w (x - scale l)² of each lane, left to right from the first element.
V weighted_error(const V* x, const V* w, int k, const VI* l, V scale) {
  V diff = x[0] - scale * as_float(l[0]);
  V e = w[0] * diff * diff;
  for (int i = 1; i < k; ++i) {
    diff = x[i] - scale * as_float(l[i]);
    e += w[i] * diff * diff;
  }
  return e;
}

void qp_group(const V* x, const V* w, int k, int nmax, VI* l, VI* aux, V& scale) {
  const float fmax = static_cast<float>(nmax);
  V mx = x[0];
  for (int i = 1; i < k; ++i) mx = x[i] > mx ? x[i] : mx;
  mx = mx > 0.f ? mx : V{};
  const VI zero = mx < 1e-15f;
  V iscale = fmax / mx;
  for (int i = 0; i < k; ++i) l[i] = nearest(iscale * x[i]);  // unclamped, as the C code's first fit
  V best = weighted_error(x, w, k, l, 1.f / iscale);
  for (int s = -4; s <= 4; ++s) {
    if (s == 0) continue;
    const V is = (0.1f * static_cast<float>(s) + fmax) / mx;
    for (int i = 0; i < k; ++i) aux[i] = min_i(nearest(is * x[i]), nmax);
    const V mse = weighted_error(x, w, k, aux, 1.f / is);
    const VI better = mse < best;
    best = better ? mse : best;
    iscale = better ? is : iscale;
  }
  for (int i = 0; i < k; ++i) l[i] = min_i(nearest(iscale * x[i]), nmax);
  V sumlx, suml2;
  sums(x, w, k, l, sumlx, suml2);
  move_codes<false, true>(x, w, k, 0, nmax, ~VI{}, l, sumlx, suml2);
  scale = suml2 > 0.f ? sumlx / suml2 : V{};
  scale = zero ? V{} : scale;
  for (int i = 0; i < k; ++i) l[i] = zero ? VI{} : l[i];
}

}  // namespace

void q3_search(const float* x, int64_t n, int k, int nmax, float* scale, uint8_t* codes) {
  std::vector<VI> l(static_cast<size_t>(k));
  for_each_group(x, nullptr, n, k, [&](int64_t b0, int m, const V* xt, V* wt) {
    V sc;
    q3_group(xt, wt, k, nmax, l.data(), sc);  // wt: its scratch for the weights x²
    store_lanes(sc, b0, m, scale);
    store_codes(l.data(), b0, m, k, codes);
  });
}

void qp_search(const float* x, const float* w, int64_t n, int k, int nmax, float* scale, uint8_t* codes) {
  std::vector<VI> l(static_cast<size_t>(k)), aux(static_cast<size_t>(k));
  for_each_group(x, w, n, k, [&](int64_t b0, int m, const V* xt, const V* wt) {
    V sc;
    qp_group(xt, wt, k, nmax, l.data(), aux.data(), sc);
    store_lanes(sc, b0, m, scale);
    store_codes(l.data(), b0, m, k, codes);
  });
}

}  // namespace ie
