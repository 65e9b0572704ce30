// What the searches share: four blocks at a time in the lanes of a vector
// (GCC/Clang vector extensions; one SSE2 register in the default build,
// where wider vectors without AVX went through the stack), each block's
// sums left to right in its own lane, so every lane computes the C loop's
// floats. Included by the csrc/search files only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ie {
namespace search {

constexpr int kLanes = 4;
typedef float V __attribute__((vector_size(4 * kLanes)));
typedef int32_t VI __attribute__((vector_size(4 * kLanes)));

// 1.5 * 2^23: v + kRoundMagic rounds v half to even into the low mantissa
// bits (ggml's nearest_int), exact for |v| < 2^22.
constexpr float kRoundMagic = 12582912.f;

inline V as_float(VI l) { return __builtin_convertvector(l, V); }

inline V abs_lanes(V v) { return reinterpret_cast<V>(reinterpret_cast<VI>(v) & 0x7FFFFFFF); }

// Each lane's element of largest magnitude, sign kept (the first of equals,
// as the C loops' strict '>'), into max, and its magnitude into amax (both 0
// in an all-zero block).
inline void signed_max(const V* x, int k, V& amax, V& max) {
  V a{}, m{};
  for (int i = 0; i < k; ++i) {
    const V ax = abs_lanes(x[i]);
    const VI gt = ax > a;
    a = gt ? ax : a;
    m = gt ? x[i] : m;
  }
  amax = a;
  max = m;
}

// Blocks b0 .. b0 + kLanes of src (k floats each, n blocks in all) into
// dst[i][g] = element i of block b0 + g; a short last group repeats block b0
// in the lanes past n (their results are never written back). Returns the
// number of real blocks.
inline int load_group(const float* src, int64_t n, int64_t b0, int k, V* dst) {
  const int m = n - b0 < kLanes ? static_cast<int>(n - b0) : kLanes;
  for (int g = 0; g < kLanes; ++g) {
    const float* b = src + static_cast<size_t>(b0 + (g < m ? g : 0)) * static_cast<size_t>(k);
    for (int i = 0; i < k; ++i) dst[i][g] = b[i];
  }
  return m;
}

// fn(b0, m, x, w) for each group of kLanes blocks from b0 (m of them real):
// x and w loaded element-major (w: scratch of k vectors where not given).
// Every search's driver.
template <class Fn>
void for_each_group(const float* x, const float* w, int64_t n, int k, Fn&& fn) {
  std::vector<V> xt(static_cast<size_t>(k)), wt(static_cast<size_t>(k));
  for (int64_t b0 = 0; b0 < n; b0 += kLanes) {
    if (w) load_group(w, n, b0, k, wt.data());
    const int m = load_group(x, n, b0, k, xt.data());
    fn(b0, m, xt.data(), wt.data());
  }
}

// Lane g < m of v into out[b0 + g].
inline void store_lanes(V v, int64_t b0, int m, float* out) {
  for (int g = 0; g < m; ++g) out[b0 + g] = v[g];
}

// Lane g < m of codes l[i] into row b0 + g of codes [n, k].
inline void store_codes(const VI* l, int64_t b0, int m, int k, uint8_t* codes) {
  for (int g = 0; g < m; ++g) {
    uint8_t* c = codes + static_cast<size_t>(b0 + g) * static_cast<size_t>(k);
    for (int i = 0; i < k; ++i) c[i] = static_cast<uint8_t>(l[i][g]);
  }
}

}  // namespace search
}  // namespace ie
