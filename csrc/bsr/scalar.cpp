// The scalar reference BSR kernel (every SIMD variant is tested against it)
// and the row store the kernels share.
#include <algorithm>

#include "bsr.h"

namespace ie {

void bsr_store_rows(const BsrRowsArgs& a, uint64_t br) {
  const BsrMatrix& m = *a.m;
  const uint64_t r0 = br * m.block_rows;
  const size_t n = bsr_rows_in(m, br), stride = bsr_acc_rows(m);
  for (int b = 0; b < a.batch; ++b) {
    const float* acc = a.acc + b * stride;
    float* y = a.y + b * m.rows + r0;
    if (a.bias) {
      for (size_t i = 0; i < n; ++i) y[i] = acc[i] + a.bias[r0 + i];
    } else {
      for (size_t i = 0; i < n; ++i) y[i] = acc[i];
    }
  }
}

namespace {

void bsr_rows_scalar(const BsrRowsArgs& a, uint64_t br0, uint64_t br1) {
  const BsrMatrix& m = *a.m;
  const size_t C = m.block_cols, W = bsr_width(m), bs = m.block_elems(), stride = bsr_acc_rows(m);
  for (uint64_t br = br0; br < br1; ++br) {
    const size_t n = bsr_rows_in(m, br);
    std::fill(a.acc, a.acc + a.batch * stride, 0.f);
    for (uint64_t k = m.row_ptr[br]; k < m.row_ptr[br + 1]; ++k) {
      const float* v = m.values.data() + k * bs;
      const float* xk = a.xpad + static_cast<size_t>(m.col_idx[k]) * C;
      for (int b = 0; b < a.batch; ++b) {
        const float* x = xk + b * a.xstride;
        float* acc = a.acc + b * stride;
        // One partial sum per block row segment, then added: two-level
        // summation keeps the float32 error near the SIMD kernel's.
        for (size_t i = 0; i < n; ++i) {
          const float* vi = v + i * C;
          float s = 0.f;
          for (size_t j = 0; j < W; ++j) s += vi[j] * x[j];
          acc[i] += s;
        }
      }
    }
    bsr_store_rows(a, br);
  }
}

}  // namespace

const BsrOps kBsrScalar = {bsr_rows_scalar};

}  // namespace ie
