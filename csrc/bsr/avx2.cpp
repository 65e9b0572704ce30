// AVX2/FMA BSR kernel (compiled with -mavx2 -mfma only here).
//
// Each block is read once, front to back, as soon as it is reached: a block
// row's blocks are contiguous in the file, so DRAM sees one sequential stream
// per thread, which the hardware prefetchers keep full. (Register
// accumulators per matrix row do not fit 16-row blocks in AVX2's 16
// registers; taking a block row 8 rows at a time instead, revisiting each
// block, measured 11 GB/s against this kernel's 17-19 GB/s on one core of the
// dev machine, 4096², 16×16. Software prefetch did not help.)
//
// Every row of a block adds its 8-lane partial dot product into that row's
// 8-lane sum in `lanes` (L1-resident scratch); the lanes are folded into row
// sums only once per block row, by a horizontal-add tree that turns eight
// rows' lanes into one vector of eight sums. When the block width is not 16,
// the segment runs in whole vectors plus one masked load, of the values and
// of x alike: a plain load of x could run past the buffer, and 0 × inf in a
// dead lane would be NaN. A batch of b > 1 re-reads each block from L1.
#include <immintrin.h>

#include "bsr.h"

namespace ie {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 h = _mm_movehdup_ps(s);
  s = _mm_add_ps(s, h);
  h = _mm_movehl_ps(h, s);
  return _mm_cvtss_f32(_mm_add_ss(s, h));
}

// {sum(p[0]), ..., sum(p[7])}.
inline __m256 reduce8(const __m256 p[8]) {
  const __m256 t0 = _mm256_hadd_ps(p[0], p[1]), t1 = _mm256_hadd_ps(p[2], p[3]);
  const __m256 t2 = _mm256_hadd_ps(p[4], p[5]), t3 = _mm256_hadd_ps(p[6], p[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline __m256i tail_mask(size_t rem) {
  alignas(32) static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 8 - rem));
}

// 8-lane partial dot product of one block row segment v[0, W) with x[0, W).
inline __m256 dot(const float* v, const float* x, size_t whole, size_t W, __m256i mask) {
  __m256 s = _mm256_setzero_ps();
  size_t j = 0;
  for (; j < whole; j += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(v + j), _mm256_loadu_ps(x + j), s);
  if (j < W) s = _mm256_fmadd_ps(_mm256_maskload_ps(v + j, mask), _mm256_maskload_ps(x + j, mask), s);
  return s;
}

// The usual 16-wide block: two vectors per segment, x held in registers.
inline __m256 dot16(const float* v, __m256 xa, __m256 xb) {
  return _mm256_fmadd_ps(_mm256_loadu_ps(v + 8), xb, _mm256_mul_ps(_mm256_loadu_ps(v), xa));
}

template <bool k16>
void block_row(const BsrRowsArgs& a, uint64_t br) {
  const BsrMatrix& m = *a.m;
  const size_t C = m.block_cols, W = bsr_width(m), bs = m.block_elems(), stride = bsr_acc_rows(m);
  const size_t n = bsr_rows_in(m, br), whole = W / 8 * 8;
  const __m256i mask = tail_mask(W % 8);
  for (int b = 0; b < a.batch; ++b)
    for (size_t i = 0; i < n; ++i) _mm256_store_ps(a.lanes + (b * stride + i) * 8, _mm256_setzero_ps());
  for (uint64_t k = m.row_ptr[br], k1 = m.row_ptr[br + 1]; k < k1; ++k) {
    const float* v = m.values.data() + k * bs;
    const float* xk = a.xpad + static_cast<size_t>(m.col_idx[k]) * C;
    for (int b = 0; b < a.batch; ++b) {
      const float* x = xk + b * a.xstride;
      float* lanes = a.lanes + b * stride * 8;
      __m256 xa = _mm256_setzero_ps(), xb = _mm256_setzero_ps();
      if constexpr (k16) {
        xa = _mm256_loadu_ps(x);
        xb = _mm256_loadu_ps(x + 8);
      }
      for (size_t i = 0; i < n; ++i) {
        const float* vr = v + i * C;
        const __m256 p = k16 ? dot16(vr, xa, xb) : dot(vr, x, whole, W, mask);
        _mm256_store_ps(lanes + i * 8, _mm256_add_ps(_mm256_load_ps(lanes + i * 8), p));
      }
    }
  }
  for (int b = 0; b < a.batch; ++b) {
    const float* lanes = a.lanes + b * stride * 8;
    float* acc = a.acc + b * stride;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 p[8];
      for (int r = 0; r < 8; ++r) p[r] = _mm256_load_ps(lanes + (i + r) * 8);
      _mm256_storeu_ps(acc + i, reduce8(p));
    }
    for (; i < n; ++i) acc[i] = hsum(_mm256_load_ps(lanes + i * 8));
  }
}

void bsr_rows_avx2(const BsrRowsArgs& a, uint64_t br0, uint64_t br1) {
  const bool w16 = bsr_width(*a.m) == 16;
  for (uint64_t br = br0; br < br1; ++br) {
    if (w16) block_row<true>(a, br);
    else block_row<false>(a, br);
    bsr_store_rows(a, br);
  }
}

}  // namespace

const BsrOps kBsrAvx2 = {bsr_rows_avx2};

}  // namespace ie
