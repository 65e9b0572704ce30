// Device benchmarks (docs/cuda.md): the copy bandwidth every GPU figure is
// a fraction of, and the GEMV timing behind `ierun microbench --device cuda`.
// Timed with CUDA events, after a warm-up, median of repeats.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "common/weight_types.h"
#include "cuda/gemv.h"

namespace ie::cuda {

// Device-to-device cudaMemcpy of `nbytes` (bytes read + bytes written per
// second, GB/s), median of `iters` copies.
double copy_gbps(size_t nbytes, int iters);

struct GemvBench {
  double ms_median = 0, ms_min = 0;
  size_t weight_bytes = 0;  // the stored matrix's bytes (what a call must read)
  int copies = 0, iters = 0;
  std::string kernel;
  double checksum = 0;
  std::vector<double> times_ms;
};

// Times GEMVs of random matrices of spec s, rotating over enough copies
// (total > min_bytes) that no call finds its weights in L2; each timed
// repeat runs one call per copy back to back between two events, so a
// call's time is the repeat's over `copies`.
GemvBench bench_gemv(const WeightSpec& s, int batch, size_t min_bytes, int iters, const GemvTuning& tune);

}  // namespace ie::cuda
