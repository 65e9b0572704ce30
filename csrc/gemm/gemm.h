// Matrix-matrix products Y = X W^T (+ bias) for many activation rows at
// once: the prefill of a chunk of tokens (decoder) and of `ierun eval`.
//
// A GEMV reads each weight once per <= 8 activation rows and is bound by
// how many loads feed each multiply-add. Here a tile of kTileRows weight
// rows is converted to float32 once (exactly as dequantize() defines it)
// into a per-thread buffer, and a register-blocked micro-kernel multiplies
// it with panels of kPanel activation rows stored k-major: per column k,
// kTileRows weight broadcasts and one panel row feed kTileRows * kPanel
// FMAs, so it runs near the FMA peak. The columns are taken kKBlock at a
// time, each block against up to kPanelBlock panels, so the weight slice
// and the panel slice it meets stay in L1 (a 1536-column panel alone is
// 96 KiB); the accumulators are stored between blocks and reloaded.
//
// Each output Y[t][r] is one float32 multiply-add chain over c = 0..cols-1
// in order, whatever n and wherever row t sits in its panel (storing and
// reloading a float32 accumulator is exact): results do not depend on how
// a sequence is cut into calls.
#pragma once
#include <cstdint>

#include "common/aligned.h"
#include "common/dispatch.h"
#include "common/isa.h"
#include "common/weight_types.h"
#include "gemv/gemv.h"

namespace ie {

constexpr int kTileRows = 12;     // weight rows per micro-kernel call
constexpr int kPanel = 16;        // activation rows per panel (one AVX-512 vector, two AVX2 vectors)
constexpr int64_t kKBlock = 256;  // columns per micro-kernel call
constexpr int kPanelBlock = 16;   // panels that meet one weight slice before the next slice

// Per-call buffers, owned by the caller and reused (grown, never shrunk).
struct GemmScratch {
  AlignedArray<float> panels;  // [ceil(n / kPanel), rounded up to kMaxPanelsPerCall][cols][kPanel]
  AlignedArray<float> tiles;   // [threads][kTileRows][cols]
  AlignedArray<float> acc;     // [threads][kPanelBlock][kTileRows][kPanel]
};

// y[t * rows + r] = sum_c W[r][c] * x[t * cols + c] (+ bias[r]) for t < n.
void gemm(const WeightSpec& s, const uint8_t* w, const float* x, int n, const float* bias, float* y, ThreadPool& pool,
          Isa isa, GemmScratch& scratch);
// The same over a RowSource (gemv/gemv.h, a dedup member): each weight tile
// is converted from the source's steps, so the matrix is never held whole;
// the same values, so the same y.
void gemm(const WeightSpec& s, const RowSource& src, const float* x, int n, const float* bias, float* y, ThreadPool& pool,
          Isa isa, GemmScratch& scratch);

// One ISA's micro-kernel covers kTileRows weight rows and `panels`
// consecutive panels (1 or 2: AVX-512's 32 registers hold two panels'
// accumulators, so each weight broadcast feeds two FMAs). For r <
// kTileRows, q < panels, j < kPanel, with P = panel + q * pstride and
// A = acc + q * kTileRows * kPanel:
//   A[r * kPanel + j] = (first ? 0 : A[r * kPanel + j]) + sum_{c < k} wt[r * ld + c] * P[c * kPanel + j]
// one chain per output, c in order.
struct GemmOps {
  void (*tile)(const float* wt, int64_t ld, const float* panel, int64_t pstride, int64_t k, float* acc, bool first);
  int panels;
};
constexpr int kMaxPanelsPerCall = 2;
static_assert(kPanelBlock % kMaxPanelsPerCall == 0, "a panel block holds whole micro-kernel calls");
extern const GemmOps kGemmScalar;
#if IE_HAVE_X86
extern const GemmOps kGemmAvx2;
extern const GemmOps kGemmAvx512;
#endif
extern const IsaTable<GemmOps> kGemmTable;

// The GEMM variant that runs for a resolved `isa`.
Isa gemm_kernel_isa(Isa isa);

}  // namespace ie
