// Plain streaming read: the bandwidth yardstick every benchmark reports its
// kernels against ("fraction of memory bandwidth measured in the same run").
#pragma once
#include <cstddef>

#include "isa.h"

namespace ie {

// Sum of n floats, read once, front to back, split across `threads`
// (OpenMP, static contiguous chunks). The sum is returned so the reads
// cannot be optimised away; it is also what the tests check.
double stream_sum_f32(const float* p, size_t n, int threads, Isa isa);

// Per-ISA bodies over one contiguous chunk; scalar is the reference.
float stream_sum_chunk_scalar(const float* p, size_t n);
#if IE_HAVE_X86
float stream_sum_chunk_avx2(const float* p, size_t n);
#endif

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
