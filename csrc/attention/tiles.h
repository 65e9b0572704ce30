// The attention loops on register tiles (attention.h), for the files that
// build them with their ISA's flags: avx2.cpp (16 vector registers) and
// avx512.cpp (AVX512VL's 32, on the same 256-bit vectors). Both products
// reuse each load across a tile:
// - scores: RQ queries against four keys (a key row and a query row loaded
//   once per 4 RQ FMAs), with each (query, key)'s eight partial-sum lanes
//   reduced by hadd in the scalar reference's order;
// - mix: RQ queries' output columns (8 W of them) in registers across the
//   whole run of values, each value row loaded once for the RQ queries.
// A wider tile changes how often a load is reused, never a score's or an
// output's operations, so every variant gives the same floats. Everything
// here has internal linkage (tests/cpp/check_isa_symbols.py).
#pragma once
#include <immintrin.h>

#include <algorithm>

#include "attention.h"
#include "common/exp_avx2.h"

namespace ie {
namespace {

// Eight cached elements as floats: an f32 cache's as they are, an f16
// cache's widened on the load (F16C, exact), so both caches run the same
// FMAs on the same floats.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// The cache rows a few positions ahead of `row` (bytes of them from
// there) asked into L1 while this one is multiplied. A decode step's three
// or so queries spend ~16 cycles on a position, too few for the hardware
// prefetchers alone to keep up: they kept the cache at ~10 GB/s per step
// whether it sat in L3 or DRAM, and a burst into L2 of the next block
// before each block changed nothing. 2 KiB ahead: 16 positions of
// SmolLM2's f16 rows. A prefetch never faults, so the rows past the cache's
// last one may be asked for too; the address is computed as an integer, as
// it may lie past the end of the cache's allocation.
constexpr size_t kCacheAhead = 2048;
inline void prefetch_ahead(const void* row, size_t bytes) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(row) + kCacheAhead;
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

// Lane u of the result: the sum of a[u]'s eight lanes, as
// ((0+1)+(2+3))+((4+5)+(6+7)).
__m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// e[u] += the products of q and key u's elements [body, d), in order.
template <class T>
__attribute__((noinline)) void add_tail(const float* q, const T* k, size_t stride, int body, int d, int nk, float* e) {
  for (int u = 0; u < nk; ++u)
    for (int i = body; i < d; ++i) e[u] += q[i] * cache_float(k[u * stride + i]);
}

// Scores of RQ queries against RK <= 4 consecutive keys. The loops over
// the tile are unrolled by pragma: GCC otherwise unrolls them only after
// deciding that the accumulator array lives on the stack, and stores every
// accumulator on every pass. Inlined: a call per twelve scores cost 8%.
template <int RQ, int RK, class T>
__attribute__((always_inline)) inline void scores_tile(const float* const* q, const T* k, size_t stride, int body,
                                                       int d, float scale, float* const* out, int t) {
  __m256 acc[RQ][4];
#pragma GCC unroll 8
  for (int r = 0; r < RQ; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[r][u] = _mm256_setzero_ps();
  // The smaller side of the tile held in registers, the other loaded a row
  // at a time: RQ * RK + min(RQ, RK) + 1 vectors (16 for 3 x 4, 29 for 6 x 4).
  for (int i = 0; i < body; i += 8) {
    if constexpr (RQ <= RK) {
      __m256 qv[RQ];
#pragma GCC unroll 8
      for (int r = 0; r < RQ; ++r) qv[r] = _mm256_loadu_ps(q[r] + i);
#pragma GCC unroll 4
      for (int u = 0; u < RK; ++u) {
        const __m256 kv = load8(k + u * stride + i);
#pragma GCC unroll 8
        for (int r = 0; r < RQ; ++r) acc[r][u] = _mm256_fmadd_ps(qv[r], kv, acc[r][u]);
      }
    } else {
      __m256 kv[RK];
#pragma GCC unroll 4
      for (int u = 0; u < RK; ++u) kv[u] = load8(k + u * stride + i);
#pragma GCC unroll 8
      for (int r = 0; r < RQ; ++r) {
        const __m256 qv = _mm256_loadu_ps(q[r] + i);
#pragma GCC unroll 4
        for (int u = 0; u < RK; ++u) acc[r][u] = _mm256_fmadd_ps(qv, kv[u], acc[r][u]);
      }
    }
  }
  // The rows' addresses before any store: a vector store may alias
  // anything, so each later read of out[] would wait for it.
  float* rows[RQ];
#pragma GCC unroll 8
  for (int r = 0; r < RQ; ++r) rows[r] = out[r] + t;
  const __m128 vscale = _mm_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < RQ; ++r) {
    const __m128 s = reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    float* o = rows[r];
    if (RK == 4 && body == d) {
      _mm_storeu_ps(o, _mm_mul_ps(s, vscale));
    } else {
      alignas(16) float e[4];
      _mm_store_ps(e, s);
      add_tail(q[r], k, stride, body, d, RK, e);
      for (int u = 0; u < RK; ++u) o[u] = e[u] * scale;
    }
  }
}

// Scores of RQ queries against keys [t, t + nk), nk <= 4.
template <int RQ, class T>
void scores_keys(const float* const* q, const T* k, size_t stride, int nk, int body, int d, float scale,
                 float* const* out, int t) {
  switch (nk) {
    case 4: scores_tile<RQ, 4>(q, k, stride, body, d, scale, out, t); break;
    case 3: scores_tile<RQ, 3>(q, k, stride, body, d, scale, out, t); break;
    case 2: scores_tile<RQ, 2>(q, k, stride, body, d, scale, out, t); break;
    default: scores_tile<RQ, 1>(q, k, stride, body, d, scale, out, t); break;
  }
}

// Scores of the last m < RQ queries (R = RQ - 1 first).
template <int R, class T>
void scores_rest(int m, const float* const* q, const T* k, size_t stride, int nk, int body, int d, float scale,
                 float* const* out, int t) {
  if constexpr (R > 0) {
    if (m == R) return scores_keys<R>(q, k, stride, nk, body, d, scale, out, t);
    scores_rest<R - 1>(m, q, k, stride, nk, body, d, scale, out, t);
  }
}

// Keys outermost: four keys (a few cache lines) stay in L1 while every
// query reads them; queries outermost read the whole block of keys from L2
// once per tile of queries. RQ: the queries of a full tile.
template <int RQ, class T>
void scores_tiles(const float* const* q, int nq, const T* k, size_t stride, int n, int d, float scale,
                  float* const* out) {
  static_assert(RQ >= 1 && RQ <= 6, "scores_tiles: RQ in 1..6");
  const int body = d - d % 8;
  for (int t = 0; t < n; t += 4) {
    const int nk = std::min(4, n - t);
    const T* kt = k + t * stride;
    prefetch_ahead(kt, 4 * stride * sizeof(T));
    int r = 0;
    for (; r + RQ <= nq; r += RQ) scores_keys<RQ>(q + r, kt, stride, nk, body, d, scale, out + r, t);
    scores_rest<RQ - 1, T>(nq - r, q + r, kt, stride, nk, body, d, scale, out + r, t);
  }
}

float max_simd(const float* p, int n) {
  __m256 m0 = _mm256_set1_ps(p[0]), m1 = m0;
  int t = 0;
  for (; t + 16 <= n; t += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p + t));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(p + t + 8));
  }
  alignas(32) float m8[8];
  _mm256_store_ps(m8, _mm256_max_ps(m0, m1));
  float m = m8[0];
  for (int u = 1; u < 8; ++u) m = std::max(m, m8[u]);
  for (; t < n; ++t) m = std::max(m, p[t]);
  return m;
}

// The sum runs in eight lanes, t + 8 after t. Under AVX-512F the
// exponentials take sixteen at a time (the same operations per lane), and
// each half is added in that order: the same floats from both variants.
float softmax_exp_simd(float* p, int n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  int t = 0;
#if defined(__AVX512F__)
  for (const __m512 vmax16 = _mm512_set1_ps(max); t + 16 <= n; t += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p + t), vmax16));
    _mm512_storeu_ps(p + t, e);
    acc = _mm256_add_ps(acc, _mm256_loadu_ps(p + t));  // back from the store: no 512-bit extract
    acc = _mm256_add_ps(acc, _mm256_loadu_ps(p + t + 8));
  }
#endif
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(p + t), vmax));
    _mm256_storeu_ps(p + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float s8[8];
  _mm256_store_ps(s8, acc);
  float sum = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
  if (t < n) {
    alignas(32) float tail[8] = {};
    for (int u = 0; t + u < n; ++u) tail[u] = p[t + u] - max;
    _mm256_store_ps(tail, exp_nonpositive(_mm256_load_ps(tail)));
    for (int u = 0; t + u < n; ++u) {
      p[t + u] = tail[u];
      sum += tail[u];
    }
  }
  return sum;
}

// Columns [c0, c0 + 8 * W) of RQ queries' outputs plus all n values: the
// RQ * W accumulators stay in registers (unrolled by pragma, as in
// scores_tile), each value vector is loaded once for all RQ queries. pf:
// the first tile over the values, which prefetches their rows.
template <int RQ, int W, class T>
void mix_tile(const float* const* p, const T* v, size_t stride, int n, int c0, bool pf, float* const* o) {
  float* rows[RQ];  // read before any store (see scores_tile)
  __m256 acc[RQ][W];
#pragma GCC unroll 8
  for (int r = 0; r < RQ; ++r) rows[r] = o[r] + c0;
#pragma GCC unroll 8
  for (int r = 0; r < RQ; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) acc[r][w] = _mm256_loadu_ps(rows[r] + 8 * w);
  for (int t = 0; t < n; ++t) {
    const T* vt = v + static_cast<size_t>(t) * stride + c0;
    if (pf) prefetch_ahead(vt, stride * sizeof(T));
    __m256 vv[W];
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) vv[w] = load8(vt + 8 * w);
#pragma GCC unroll 8
    for (int r = 0; r < RQ; ++r) {
      const __m256 pt = _mm256_broadcast_ss(p[r] + t);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(pt, vv[w], acc[r][w]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RQ; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(rows[r] + 8 * w, acc[r][w]);
}

// Columns [c, c + 8 w) of RQ queries, w <= W.
template <int RQ, int W, class T>
void mix_cols(const float* const* p, const T* v, size_t stride, int n, int c, int w, bool pf, float* const* o) {
  if constexpr (W > 1)
    if (w < W) return mix_cols<RQ, W - 1>(p, v, stride, n, c, w, pf, o);
  mix_tile<RQ, W>(p, v, stride, n, c, pf, o);
}

// Columns [c, c + 8 w) of the last m < RQ queries (R = RQ - 1 first).
template <int R, int W, class T>
void mix_rest(int m, const float* const* p, const T* v, size_t stride, int n, int c, int w, bool pf,
              float* const* o) {
  if constexpr (R > 0) {
    if (m == R) return mix_cols<R, W>(p, v, stride, n, c, w, pf, o);
    mix_rest<R - 1, W>(m, p, v, stride, n, c, w, pf, o);
  }
}

// Columns outermost: a slice of 8 W columns of the values (one or two cache
// lines per position) stays in L1 while every query reads it. RQ, W: the
// queries and column vectors of a full tile.
template <int RQ, int W, class T>
void mix_tiles(const float* const* p, int nq, const T* v, size_t stride, int n, int d, float* const* o) {
  static_assert(RQ >= 1 && RQ <= 6 && W >= 1 && W <= 4, "mix_tiles: RQ in 1..6, W in 1..4");
  const int body = d - d % 8;
  for (int c = 0; c < body; c += 8 * W) {
    const int w = std::min(W, (body - c) / 8);
    int r = 0;
    for (; r + RQ <= nq; r += RQ) mix_cols<RQ, W>(p + r, v, stride, n, c, w, c == 0 && r == 0, o + r);
    mix_rest<RQ - 1, W, T>(nq - r, p + r, v, stride, n, c, w, c == 0 && r == 0, o + r);
  }
  for (int r = 0; r < nq; ++r)
    for (int c = body; c < d; ++c) {
      float s = o[r][c];
      for (int t = 0; t < n; ++t) s += p[r][t] * cache_float(v[static_cast<size_t>(t) * stride + c]);
      o[r][c] = s;
    }
}

// The f16 cache's rows written through F16C, eight elements at a time (the
// tail through the scalar conversion: the same halves, since both round as
// IEEE says).
void narrow_simd(const float* src, int n, uint16_t* dst) {
  const __m256 hi = _mm256_set1_ps(65504.f), lo = _mm256_set1_ps(-65504.f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    // min/max return their second operand where either is NaN: a NaN passes.
    const __m256 x = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_loadu_ps(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = f16_to_cache(src[i]);
}

}  // namespace

}  // namespace ie
