// BSR GEMV kernel (bsr.h): one CTA per block row, one warp per row of it
// (rows beyond the CTA's 8 warps loop); the warp's lanes stride over the
// columns of each stored block, so a block's row is one coalesced read.
// Padding is never computed (as in the CPU kernels): a tail block row has
// fewer rows inside the matrix, a tail block fewer columns.
#include <string>

#include "common/errors.h"
#include "cuda/bsr.h"
#include "cuda/reduce.cuh"

namespace ie::cuda {
namespace {

constexpr int kWarps = 8;

struct Args {
  const uint32_t* row_ptr;
  const uint32_t* col_idx;
  const float* values;
  uint64_t rows, cols;
  uint32_t br, bc;
  const float* x;
  int batch;
  const float* bias;
  float* y;
};

template <int B>
__global__ void __launch_bounds__(32 * kWarps) bsr_kernel(Args a) {
  const uint64_t brow = blockIdx.x, r0 = brow * a.br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t k0 = a.row_ptr[brow], k1 = a.row_ptr[brow + 1];
  const size_t bs = static_cast<size_t>(a.br) * a.bc;
  for (uint32_t i = warp; i < a.br && r0 + i < a.rows; i += kWarps) {
    float acc[B] = {};
    for (uint32_t k = k0; k < k1; ++k) {
      const uint64_t c0 = static_cast<uint64_t>(a.col_idx[k]) * a.bc;
      const float* v = a.values + k * bs + static_cast<size_t>(i) * a.bc;
      for (uint32_t j = lane; j < a.bc && c0 + j < a.cols; j += 32) {
        const float w = __ldg(v + j);
#pragma unroll
        for (int b = 0; b < B; ++b)
          if (b < a.batch) acc[b] = fmaf(w, __ldg(a.x + b * a.cols + c0 + j), acc[b]);
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      acc[b] = warp_sum(acc[b]);
      if (lane == 0 && b < a.batch) a.y[b * a.rows + r0 + i] = a.bias ? acc[b] + a.bias[r0 + i] : acc[b];
    }
  }
}

}  // namespace

DeviceBsr upload_bsr(const BsrMatrix& m) {
  DeviceBsr d;
  d.rows = m.rows;
  d.cols = m.cols;
  d.block_rows = m.block_rows;
  d.block_cols = m.block_cols;
  d.n_block_rows = m.n_block_rows;
  d.row_ptr = to_device(m.row_ptr.data(), 4 * m.row_ptr.size());
  d.col_idx = to_device(m.col_idx.data(), 4 * m.col_idx.size());
  d.values = to_device(m.values.data(), 4 * m.values.size());
  return d;
}

void bsr_gemv(const DeviceBsr& m, const float* x, int batch, const float* bias, float* y, cudaStream_t stream) {
  if (batch < 1 || batch > kBsrMaxBatch)
    fail("bsr_gemv: batch must be 1.." + std::to_string(kBsrMaxBatch) + ", got " + std::to_string(batch));
  if (x == nullptr || y == nullptr || m.row_ptr.get() == nullptr) fail("bsr_gemv: null device pointer");
  if (m.n_block_rows == 0) return;
  if (m.n_block_rows > 0x7fffffff) fail("bsr_gemv: too many block rows for one launch");
  const Args a{m.row_ptr.as<uint32_t>(), m.col_idx.as<uint32_t>(), m.values.as<float>(), m.rows, m.cols,
               m.block_rows, m.block_cols, x, batch, bias, y};
  const dim3 grid(static_cast<unsigned>(m.n_block_rows)), threads(32 * kWarps);
  if (batch == 1) bsr_kernel<1><<<grid, threads, 0, stream>>>(a);
  else bsr_kernel<kBsrMaxBatch><<<grid, threads, 0, stream>>>(a);
  check_launch("bsr gemv kernel");
}

}  // namespace ie::cuda
