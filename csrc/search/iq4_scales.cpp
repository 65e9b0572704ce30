// iq4_scales.h, four blocks at a time (lanes.h).
// iq4_xsh's search shares the iq4 table: its shifted grid's nearest value
// to a is the plain grid's nearest to a - 4, plus 4.
#include "iq4_scales.h"

#include "common/weight_decode.h"
#include "lanes.h"

namespace ie {
namespace {

using namespace search;

// A code is chosen by floor(2 a), clamped to [kLo, kHi]: the midpoints of
// neighbouring values are half-integers, so a >= m iff floor(2a) >= 2m.
constexpr int kLo = -256, kHi = 228;

struct ValueTable {
  float v[kHi - kLo + 1];
  ValueTable() {
    for (int s = kLo; s <= kHi; ++s) {
      int code = 0;
      while (code < 15 && iq4_value(code) + iq4_value(code + 1) <= s) ++code;
      v[s - kLo] = static_cast<float>(iq4_value(code));
    }
  }
};

// The grid value nearest to each lane of a (NaN: the lowest).
inline V nearest_values(V a, const ValueTable& t) {
  V s = a * 2.f;
  s = s > static_cast<float>(kLo) ? s : static_cast<float>(kLo);  // NaN too
  s = s < static_cast<float>(kHi) ? s : static_cast<float>(kHi);
  VI f = __builtin_convertvector(s, VI);         // toward zero, then down where that was up: floor
  f += __builtin_convertvector(f, V) > s;        // (a true comparison is -1)
  // Built in registers: lanes written one by one went through the stack, and
  // the whole-vector load after four scalar stores missed store forwarding.
  static_assert(kLanes == 4, "one initializer per lane");
  return V{t.v[f[0] - kLo], t.v[f[1] - kLo], t.v[f[2] - kLo], t.v[f[3] - kLo]};
}

// Σ w q x and Σ w q q of each lane, left to right, q the values of iscale * x
// on the grid shifted by `shift` (0: the iq4 grid itself).
inline void fit(const V* x, const V* w, V iscale, const ValueTable& t, V& sumqx, V& sumq2, float shift = 0.f) {
  auto value = [&](V a) { return shift == 0.f ? nearest_values(a, t) : nearest_values(a - shift, t) + shift; };
  V q = value(iscale * x[0]), wq = w[0] * q;
  V sx = wq * x[0], s2 = wq * q;
  for (int i = 1; i < 32; ++i) {
    q = value(iscale * x[i]);
    wq = w[i] * q;
    sx += wq * x[i];
    s2 += wq * q;
  }
  sumqx = sx;
  sumq2 = s2;
}

// Each lane's element of largest magnitude, sign kept (the first of equals,
// as the C loop's strict '>'; a NaN counts as the largest, numpy's argmax).
V block_max(const V* x) {
  V mx = x[0], amax = abs_lanes(x[0]);
  for (int i = 1; i < 32; ++i) {
    const V a = abs_lanes(x[i]);
    const VI more = (a > amax) | ((a != a) & (amax == amax));
    amax = more ? a : amax;
    mx = more ? x[i] : mx;
  }
  return mx;
}

V group(const V* x, const V* w, int ntry, const ValueTable& t) {
  const V mx = block_max(x);
  V sumqx, sumq2;
  const V d0 = mx / 127.f;
  fit(x, w, 1.f / d0, t, sumqx, sumq2);
  V d = sumq2 > 0.f ? sumqx / sumq2 : V{};
  V best = d * sumqx;
  for (int itry = -ntry; itry <= ntry; ++itry) {
    fit(x, w, static_cast<float>(itry - 127) / mx, t, sumqx, sumq2);
    const VI better = (sumq2 > 0.f) & (sumqx * sumqx > best * sumq2);
    d = better ? sumqx / sumq2 : d;
    best = better ? d * sumqx : best;
  }
  const VI zero = abs_lanes(mx) < 1e-15f;
  return zero ? V{} : d;
}

// iq4_xsh: the scale of the best fit on either grid (shift 0 and
// kIq4ShiftStep), of scales that put the block's largest element near
// either end of the grid (ggml's search tries the low end only): 2 x 2 x
// (2 ntry + 1) fits, each refit by weighted least squares. best is each
// lane's largest sumqx^2 / sumq2 so far (the weighted error is Σ w x² less
// it). The grid itself is chosen again for the scale as stored.
V shifted_group(const V* x, const V* w, int ntry, const ValueTable& t) {
  const V mx = block_max(x);
  V best{}, d{};
  for (int s = 0; s < 2; ++s) {
    const float shift = s ? static_cast<float>(kIq4ShiftStep) : 0.f;
    for (const float end : {static_cast<float>(iq4_value(0)) + shift, static_cast<float>(iq4_value(15)) + shift}) {
      for (int itry = -ntry; itry <= ntry; ++itry) {
        V sumqx, sumq2;
        fit(x, w, (end + static_cast<float>(itry)) / mx, t, sumqx, sumq2, shift);
        const VI better = (sumq2 > 0.f) & (sumqx * sumqx > best * sumq2);
        const V ds = sumq2 > 0.f ? sumqx / sumq2 : V{};
        d = better ? ds : d;
        best = better ? ds * sumqx : best;
      }
    }
  }
  const VI zero = (abs_lanes(mx) < 1e-15f) | (best == 0.f);
  return zero ? V{} : d;
}

}  // namespace

void iq4_shifted_scales(const float* x, const float* w, int64_t n, int ntry, float* scale) {
  const ValueTable t;
  for_each_group(x, w, n, 32, [&](int64_t b0, int m, const V* xt, const V* wt) {
    store_lanes(shifted_group(xt, wt, ntry, t), b0, m, scale);
  });
}

void iq4_scales(const float* x, const float* w, int64_t n, int ntry, float* scale) {
  const ValueTable t;
  for_each_group(x, w, n, 32, [&](int64_t b0, int m, const V* xt, const V* wt) {
    store_lanes(group(xt, wt, ntry, t), b0, m, scale);
  });
}

}  // namespace ie
