// Matrix-matrix products Y = X W^T (+ bias) for many activation rows at
// once: the prefill of a chunk of tokens (decoder) and of `ierun eval`.
//
// A GEMV reads each weight once per <= 8 activation rows and is bound by
// how many loads feed each multiply-add. Here a tile of kTileRows weight
// rows is converted to float32 once (exactly as dequantize() defines it)
// into a per-thread buffer, and a register-blocked micro-kernel multiplies
// it with panels of kPanel activation rows stored k-major: per column k,
// kTileRows weight broadcasts and kPanel/8 activation loads feed
// kTileRows * kPanel / 8 FMAs, so it runs near the FMA peak.
//
// Each output Y[t][r] is one float32 multiply-add chain over c = 0..cols-1
// in order, whatever n and wherever row t sits in its panel: results do not
// depend on how a sequence is cut into calls.
#pragma once
#include <cstdint>

#include "common/aligned.h"
#include "common/dispatch.h"
#include "common/isa.h"
#include "common/weight_types.h"

namespace ie {

constexpr int kTileRows = 6;  // weight rows per micro-kernel call
constexpr int kPanel = 16;    // activation rows per panel (two AVX2 vectors)

// Per-call buffers, owned by the caller and reused (grown, never shrunk).
struct GemmScratch {
  AlignedArray<float> panels;  // [ceil(n / kPanel)][cols][kPanel]
  AlignedArray<float> tiles;   // [threads][kTileRows][cols]
};

// y[t * rows + r] = sum_c W[r][c] * x[t * cols + c] (+ bias[r]) for t < n.
void gemm(const WeightSpec& s, const uint8_t* w, const float* x, int n, const float* bias, float* y, int threads,
          Isa isa, GemmScratch& scratch);

// One ISA's micro-kernel: out[r][j] = sum_{c < cols} wt[r * cols + c] * panel[c * kPanel + j]
// for r < kTileRows, j < kPanel (one chain per output, c in order).
struct GemmOps {
  void (*tile)(const float* wt, const float* panel, int64_t cols, float* out);
};
extern const GemmOps kGemmScalar;
#if IE_HAVE_X86
extern const GemmOps kGemmAvx2;
#endif
extern const IsaTable<GemmOps> kGemmTable;

// The GEMM variant that runs for a resolved `isa`.
Isa gemm_kernel_isa(Isa isa);

}  // namespace ie
