// make_qx_quants as ggml-quants.c writes it with weights and rmse_type 1
// (qx.h), four blocks at a time (lanes.h).
#include "qx.h"

#include "lanes.h"

namespace ie {
namespace {

using namespace search;

// Each lane's weighted sums of the codes of x under iscale: Σ w x l and
// Σ w l l, left to right from 0. A code is nearest_int(iscale * x) clamped
// to -nmax..nmax-1; |iscale * x| <= nmax + 1, where adding and taking away
// 1.5 * 2^23 rounds half to even as nearest_int does.
void fit(const V* x, const V* w, int k, float nmax, V iscale, V& sumlx, V& suml2) {
  V slx{}, sl2{};
  for (int i = 0; i < k; ++i) {
    V l = (iscale * x[i] + kRoundMagic) - kRoundMagic;
    l = l < -nmax ? V{} - nmax : l;
    l = l > nmax - 1.f ? V{} + (nmax - 1.f) : l;
    slx += w[i] * x[i] * l;
    sl2 += w[i] * l * l;
  }
  sumlx = slx;
  suml2 = sl2;
}

// One group of kLanes blocks, element-major (x[i][g]: element i of block g).
void group(const V* x, const V* w, int k, int nmax, V& scale_out, V& iscale_out) {
  const float fmax = static_cast<float>(nmax);
  V amax, max;
  signed_max(x, k, amax, max);
  const VI zero = amax < 1e-15f;  // GROUP_MAX_EPS
  V iscale = -fmax / max, sumlx, suml2;
  fit(x, w, k, fmax, iscale, sumlx, suml2);
  V scale = suml2 != 0.f ? sumlx / suml2 : V{};
  V best = scale * sumlx;
  for (int s = -9; s <= 9; ++s) {
    if (s == 0) continue;
    const V cand = -(fmax + 0.1f * static_cast<float>(s)) / max;
    fit(x, w, k, fmax, cand, sumlx, suml2);
    const VI better = (suml2 > 0.f) & (sumlx * sumlx > best * suml2);
    scale = better ? sumlx / suml2 : scale;
    best = better ? scale * sumlx : best;
    iscale = better ? cand : iscale;
  }
  scale_out = zero ? V{} : scale;
  iscale_out = zero ? V{} : iscale;
}

}  // namespace

void qx_search(const float* x, const float* w, int64_t n, int k, int nmax, float* scale, float* iscale) {
  for_each_group(x, w, n, k, [&](int64_t b0, int m, const V* xt, const V* wt) {
    V sc, is;
    group(xt, wt, k, nmax, sc, is);
    store_lanes(sc, b0, m, scale);
    store_lanes(is, b0, m, iscale);
  });
}

}  // namespace ie
