// The GEMM driver (gemm.h): packs the activations into k-major panels,
// converts each thread's weight tiles to float32, runs the micro-kernel.
#include "gemm.h"


#include <algorithm>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "common/weight_decode.h"

namespace ie {

const IsaTable<GemmOps> kGemmTable = {{&kGemmScalar,
#if IE_HAVE_X86
                                       &kGemmAvx2, nullptr, &kGemmAvx512
#else
                                       nullptr, nullptr, nullptr
#endif
                                       }};

Isa gemm_kernel_isa(Isa isa) { return kGemmTable.pick(isa); }

namespace {

void dequant_row(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, float* row) {
  for (int64_t c0 = 0; c0 < s.cols; c0 += 32)
    decode_span(s, lay, w, r, c0, static_cast<int>(std::min<int64_t>(32, s.cols - c0)), row + c0);
}

// Rows [r0, r0 + nr) of W as float32, zero rows after nr: exactly
// dequantize()'s values; from `src` (thread t's steps of up to
// kMaxStepRows rows) when given, else from w. False when the source failed.
bool tile_rows(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, const RowSource* src, int t,
               int64_t r0, int nr, float* wt) {
  std::memset(wt + static_cast<size_t>(nr) * s.cols, 0, static_cast<size_t>(kTileRows - nr) * s.cols * sizeof(float));
  if (src == nullptr) {
    for (int r = 0; r < nr; ++r) dequant_row(s, lay, w, r0 + r, wt + static_cast<size_t>(r) * s.cols);
    return true;
  }
  for (int r = 0; r < nr;) {
    const int step = std::min(kMaxStepRows, nr - r);
    const uint8_t* p = src->rows(src->ctx, t, r0 + r, step);
    if (p == nullptr) return false;
    WeightSpec sub = s;
    sub.rows = step;
    const WeightLayout sl = weight_layout(sub);
    for (int i = 0; i < step; ++i) dequant_row(sub, sl, p, i, wt + static_cast<size_t>(r + i) * s.cols);
    r += step;
  }
  return true;
}

void run_gemm(const WeightSpec& s, const uint8_t* w, const RowSource* src, const float* x, int n, const float* bias,
              float* y, ThreadPool& pool, Isa isa, GemmScratch& scratch) {
  if (x == nullptr || y == nullptr) fail("gemm: null activations or output");
  if (n < 1) fail("gemm: need at least one activation row, got " + std::to_string(n));
  const int threads = pool.size();
  const int64_t cols = s.cols, rows = s.rows;
  const GemmOps& ops = kGemmTable.ops(isa);
  const int64_t np = (n + kPanel - 1) / kPanel;
  const int64_t np_padded = (np + kMaxPanelsPerCall - 1) / kMaxPanelsPerCall * kMaxPanelsPerCall;
  scratch.panels.resize(checked_mul(checked_mul(static_cast<size_t>(np_padded), static_cast<size_t>(cols), "gemm panels"),
                                    static_cast<size_t>(kPanel), "gemm panels"), false);
  scratch.tiles.resize(checked_mul(checked_mul(static_cast<size_t>(threads), static_cast<size_t>(kTileRows), "gemm tiles"),
                                   static_cast<size_t>(cols), "gemm tiles"), false);
  scratch.acc.resize(static_cast<size_t>(threads) * kPanelBlock * kTileRows * kPanel, false);
  float* panels = scratch.panels.data();
  const WeightLayout lay = weight_layout(s);
  const int64_t ntiles = (rows + kTileRows - 1) / kTileRows;
  // float32 rows are read in place (4-byte aligned: the mapped file's
  // tensors are); other types, and a last tile of fewer rows, are converted.
  const bool in_place = src == nullptr && s.type == WType::F32 && reinterpret_cast<uintptr_t>(w) % alignof(float) == 0;
  // Two passes, each over items claimed by whoever is free (thread_pool.h):
  // the panels are complete before any tile reads them.
  parallel_for(pool, np_padded * cols, 1024, [&](int64_t pc0, int64_t pc1, int) {
    for (int64_t pc = pc0; pc < pc1; ++pc) {
      const int64_t p = pc / cols, c = pc % cols;
      for (int j = 0; j < kPanel; ++j) {
        const int64_t t = p * kPanel + j;
        panels[pc * kPanel + j] = t < n ? x[t * cols + c] : 0.f;
      }
    }
  });
  parallel_for(pool, ntiles, 1, [&](int64_t t0, int64_t t1, int slot) {
    const size_t me = static_cast<size_t>(slot);
    float* buf = scratch.tiles.data() + me * kTileRows * cols;
    float* acc = scratch.acc.data() + me * kPanelBlock * kTileRows * kPanel;
    for (int64_t ti = t0; ti < t1; ++ti) {
      const int64_t r0 = ti * kTileRows;
      const int nr = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
      const float* wt = buf;
      if (in_place && nr == kTileRows)
        wt = reinterpret_cast<const float*>(w + r0 * lay.row_bytes);
      else if (!tile_rows(s, lay, w, src, static_cast<int>(me), r0, nr, buf))
        continue;  // the source recorded why; its caller reports it
      for (int64_t p0 = 0; p0 < np; p0 += kPanelBlock) {
        const int64_t p1 = std::min<int64_t>(np_padded, p0 + kPanelBlock);
        for (int64_t k0 = 0; k0 < cols; k0 += kKBlock) {
          const int64_t k = std::min(kKBlock, cols - k0);
          for (int64_t p = p0; p < p1; p += ops.panels)
            ops.tile(wt + k0, cols, panels + (p * cols + k0) * kPanel, cols * kPanel, k,
                     acc + (p - p0) * kTileRows * kPanel, k0 == 0);
        }
        for (int64_t p = p0; p < std::min(p1, np); ++p) {
          const float* out = acc + (p - p0) * kTileRows * kPanel;
          const int nj = static_cast<int>(std::min<int64_t>(kPanel, n - p * kPanel));
          for (int j = 0; j < nj; ++j) {  // a run of nr adjacent outputs per activation row
            float* yj = y + (p * kPanel + j) * rows + r0;
            for (int r = 0; r < nr; ++r) yj[r] = out[r * kPanel + j] + (bias ? bias[r0 + r] : 0.f);
          }
        }
      }
    }
  });
}

}  // namespace

void gemm(const WeightSpec& s, const uint8_t* w, const float* x, int n, const float* bias, float* y, ThreadPool& pool,
          Isa isa, GemmScratch& scratch) {
  if (w == nullptr) fail("gemm: null weights");
  run_gemm(s, w, nullptr, x, n, bias, y, pool, isa, scratch);
}

void gemm(const WeightSpec& s, const RowSource& src, const float* x, int n, const float* bias, float* y, ThreadPool& pool,
          Isa isa, GemmScratch& scratch) {
  if (src.rows == nullptr) fail("gemm: the row source has no rows function");
  run_gemm(s, nullptr, &src, x, n, bias, y, pool, isa, scratch);
}

}  // namespace ie
