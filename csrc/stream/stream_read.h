// Plain streaming read: the bandwidth yardstick every benchmark reports its
// kernels against ("fraction of memory bandwidth measured in the same run").
#pragma once
#include <cstddef>

#include "common/dispatch.h"
#include "common/isa.h"

namespace ie {

// Sum of n floats, read once, front to back, split across `threads`
// (OpenMP, static contiguous chunks). The sum is returned so the reads
// cannot be optimised away; it is also what the tests check.
double stream_sum_f32(const float* p, size_t n, int threads, Isa isa);

// One ISA's body over one contiguous chunk (common/dispatch.h); scalar is the reference.
struct StreamOps {
  float (*sum_chunk)(const float* p, size_t n);
};
extern const StreamOps kStreamScalar;
#if IE_HAVE_X86
extern const StreamOps kStreamAvx2;
#endif
extern const IsaTable<StreamOps> kStreamTable;

// The streaming-read variant that runs for a resolved `isa`.
Isa stream_kernel_isa(Isa isa);
// The scalar body, also the AVX2 body's tail.
float stream_sum_chunk_scalar(const float* p, size_t n);

struct ReadBandwidth {
  double gbps_median;
  double gbps_best;
  size_t bytes;
  int passes;
  int threads;
};

// Allocates `bytes` (rounded to 64), first-touches it with the same thread
// layout as the reads, then times `passes` full reads. Use a size well
// beyond the last-level cache to measure DRAM.
ReadBandwidth measure_read_bandwidth(size_t bytes, int threads, int passes, Isa isa);

}  // namespace ie
