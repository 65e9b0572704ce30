// The yardsticks every benchmark reports against, measured in the same run:
// a plain streaming read (memory bandwidth) and an FMA loop (compute peak).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dispatch.h"
#include "common/isa.h"

namespace ie {

// Sum of n floats, read once, front to back, split across `threads`
// (a ThreadPool's each(), static contiguous chunks). The sum is returned so the reads
// cannot be optimised away; it is also what the tests check.
double stream_sum_f32(const float* p, size_t n, int threads, Isa isa);

// One ISA's body over one contiguous chunk (common/dispatch.h); scalar is the reference.
struct StreamOps {
  float (*sum_chunk)(const float* p, size_t n);
  // kFmaLanes independent chains v = v * m + c, `iters` times each, from
  // v[l] = seed + l / 1024; returns the sum of the chains (kFmaLanes * iters FMAs).
  float (*fma_chains)(float seed, float m, float c, int64_t iters);
  // kInt8Lanes independent int32 lanes, each `iters` times acc += 4 a b,
  // computed as the int8 kernels compute a dot product (AVX2: vpmaddubsw of
  // unsigned a and signed b bytes, |2ab| <= 32767 as it saturates, vpmaddwd
  // with ones, vpaddd; AVX-VNNI and AVX-512: vpdpbusd, one instruction for
  // the three, as the rows8 kernels at those levels multiply); returns the
  // lanes' sum, each lane wrapping modulo 2^32 (int8_macs * iters int8
  // multiplies). AMX: four 16 x 16 int32 tiles, each lane += 64 a b per
  // step (tdpbusd, as the rows8 AMX kernels' tdpbssd).
  int64_t (*int8_chains)(int a, int b, int64_t iters);
  double int8_macs;  // multiply-adds per step of int8_chains: 4 * kInt8Lanes, AMX's kAmxInt8Macs
};
// 12 chains of 16 lanes (AVX-512; AVX2 runs them as two passes of 12 x 8):
// enough independent FMAs in flight (latency 4 x 2 ports) for any x86 core.
constexpr int kFmaLanes = 192;
// 8 chains of 16 int32 lanes (AVX-512; AVX2 runs them as four passes of 4 x 8).
constexpr int kInt8Lanes = 128;
// Four tile multiplies of 16 x 16 lanes x 64 products per step.
constexpr int kAmxInt8Macs = 4 * 16 * 16 * 64;
extern const StreamOps kStreamScalar;
#if IE_HAVE_X86
extern const StreamOps kStreamAvx2;
// AVX2's read and FMA loop with AVX-VNNI's int8 loop (stream/avxvnni.cpp).
extern const StreamOps kStreamAvxVnni;
extern const StreamOps kStreamAvx512;
// AVX-512's read and FMA loops with the tile unit's int8 loop (stream/amx.cpp).
extern const StreamOps kStreamAmx;
int64_t int8_chains_avxvnni(int a, int b, int64_t iters);
int64_t int8_chains_amx(int a, int b, int64_t iters);
#endif
extern const IsaTable<StreamOps> kStreamTable;

float fma_chains_scalar(float seed, float m, float c, int64_t iters);
int64_t int8_chains_scalar(int a, int b, int64_t iters);

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

struct FmaPeak {
  double median;  // GFLOPS (2 per multiply-add lane), all threads
  double best;
  int threads;
};

// Peak multiply-add throughput of the `isa` variant with `threads` threads
// (2 flops per FMA lane), median and best of `passes` timed runs: what a
// compute-bound kernel's GFLOPS are reported as a fraction of.
FmaPeak measure_fma_peak(int threads, int passes, Isa isa);

struct Int8Peak {
  double median;  // 10^9 int8 multiply-adds per second, all threads
  double best;
  int threads;
};

// The same for int8 dot products (int8_chains): what prefill, whose
// act=int8 kernels are built from them, is reported as a fraction of.
Int8Peak measure_int8_peak(int threads, int passes, Isa isa);

}  // namespace ie
