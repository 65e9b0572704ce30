// The GEMM micro-kernel's scalar reference (gemm.h): the same chains as the
// SIMD variant, a*b+c rounded twice where the SIMD variant fuses it.
#include "gemm.h"

namespace ie {
namespace {

void tile_scalar(const float* wt, const float* panel, int64_t cols, float* out) {
  float acc[kTileRows][kPanel] = {};
  for (int64_t c = 0; c < cols; ++c)
    for (int r = 0; r < kTileRows; ++r) {
      const float w = wt[r * cols + c];
      for (int j = 0; j < kPanel; ++j) acc[r][j] += w * panel[c * kPanel + j];
    }
  for (int r = 0; r < kTileRows; ++r)
    for (int j = 0; j < kPanel; ++j) out[r * kPanel + j] = acc[r][j];
}

}  // namespace

const GemmOps kGemmScalar = {tile_scalar};

}  // namespace ie
