// Block-sparse GEMV on a CUDA device (docs/formats/bsr.md, docs/cuda.md):
// y = A x (+ bias) over a validated BsrMatrix uploaded as its three arrays.
#pragma once
#include <cuda_runtime.h>

#include "bsr/bsr.h"
#include "cuda/buffer.h"

namespace ie::cuda {

struct DeviceBsr {
  uint64_t rows = 0, cols = 0;
  uint32_t block_rows = 0, block_cols = 0;
  uint64_t n_block_rows = 0;
  DeviceBuffer row_ptr, col_idx, values;
};

DeviceBsr upload_bsr(const BsrMatrix& m);

// x [batch, cols], bias [rows] or null, y [batch, rows]: device pointers,
// 1 <= batch <= kBsrMaxBatch; float32 accumulation. Asynchronous.
void bsr_gemv(const DeviceBsr& m, const float* x, int batch, const float* bias, float* y, cudaStream_t stream);

}  // namespace ie::cuda
