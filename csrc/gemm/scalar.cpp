// The GEMM micro-kernel's scalar reference (gemm.h): the same chains as the
// SIMD variants, a*b+c rounded twice where they fuse it.
#include "gemm.h"

namespace ie {
namespace {

void tile_scalar(const float* wt, int64_t ld, const float* panel, int64_t /*pstride*/, int64_t k, float* acc,
                 bool first) {
  float a[kTileRows][kPanel];
  for (int r = 0; r < kTileRows; ++r)
    for (int j = 0; j < kPanel; ++j) a[r][j] = first ? 0.f : acc[r * kPanel + j];
  for (int64_t c = 0; c < k; ++c)
    for (int r = 0; r < kTileRows; ++r) {
      const float w = wt[r * ld + c];
      for (int j = 0; j < kPanel; ++j) a[r][j] += w * panel[c * kPanel + j];
    }
  for (int r = 0; r < kTileRows; ++r)
    for (int j = 0; j < kPanel; ++j) acc[r * kPanel + j] = a[r][j];
}

}  // namespace

const GemmOps kGemmScalar = {tile_scalar, 1};

}  // namespace ie
