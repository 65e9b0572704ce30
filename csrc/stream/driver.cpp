// The streaming read: scalar body, ISA table, threaded driver, bandwidth measurement.
#include "stream_read.h"

#include "common/aligned.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <stdexcept>
#include <vector>

namespace ie {

float stream_sum_chunk_scalar(const float* p, size_t n) {
  // Four partial sums, like the SIMD bodies, so both round similarly.
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    acc[0] += p[i];
    acc[1] += p[i + 1];
    acc[2] += p[i + 2];
    acc[3] += p[i + 3];
  }
  for (; i < n; ++i) acc[0] += p[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

float fma_chains_scalar(float seed, float m, float c, int64_t iters) {
  float v[kFmaLanes];
  for (int l = 0; l < kFmaLanes; ++l) v[l] = seed + static_cast<float>(l) / 1024;
  for (int64_t i = 0; i < iters; ++i)
    for (float& x : v) x = x * m + c;  // not std::fma: without an FMA unit that is a slow libm call
  float total = 0.f;
  for (float x : v) total += x;
  return total;
}

const StreamOps kStreamScalar = {stream_sum_chunk_scalar, fma_chains_scalar};

const IsaTable<StreamOps> kStreamTable = {{&kStreamScalar,
#if IE_HAVE_X86
                                           &kStreamAvx2, &kStreamAvx512
#else
                                           nullptr, nullptr
#endif
                                           }};

Isa stream_kernel_isa(Isa isa) { return kStreamTable.pick(isa); }

double stream_sum_f32(const float* p, size_t n, int threads, Isa isa) {
  if (threads < 1) threads = 1;
  const auto sum_chunk = kStreamTable.ops(isa).sum_chunk;
  double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    // Chunk boundaries on 16-float (64-byte) multiples keep SIMD loads aligned
    // when the base pointer is.
    const size_t blocks = (n + 15) / 16;
    const size_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    const size_t i0 = std::min(n, b0 * 16), i1 = std::min(n, b1 * 16);
    if (i1 > i0) total += sum_chunk(p + i0, i1 - i0);
  }
  return total;
}

ReadBandwidth measure_read_bandwidth(size_t bytes, int threads, int passes, Isa isa) {
  if (threads < 1) threads = 1;
  if (passes < 1) passes = 1;
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) throw std::invalid_argument("read bandwidth: buffer size must be > 0");
  const size_t n = bytes / sizeof(float);
  AlignedArray<float> buf(n, /*zero=*/false);
  float* p = buf.data();
  // First touch with the same static split as the reads (NUMA locality).
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t blocks = (n + 15) / 16;
    const size_t i0 = std::min(n, blocks * t / nt * 16), i1 = std::min(n, blocks * (t + 1) / nt * 16);
    for (size_t i = i0; i < i1; ++i) p[i] = static_cast<float>(i & 1023) * (1.0f / 1024.0f);
  }
  std::vector<double> gbps;
  volatile double sink = 0.0;
  stream_sum_f32(p, n, threads, isa);  // warm-up pass (page tables, clocks)
  for (int k = 0; k < passes; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + stream_sum_f32(p, n, threads, isa);
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  return {gbps[gbps.size() / 2], gbps.back(), bytes, passes, threads};
}

FmaPeak measure_fma_peak(int threads, int passes, Isa isa) {
  if (threads < 1) throw std::invalid_argument("fma peak: threads must be >= 1, got " + std::to_string(threads));
  if (passes < 1) throw std::invalid_argument("fma peak: passes must be >= 1, got " + std::to_string(passes));
  const auto chains = kStreamTable.ops(isa).fma_chains;
  auto timed = [&](int64_t iters, volatile float* sum) {
    float total = 0.f;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += chains(0.5f + static_cast<float>(omp_get_thread_num()), 0.999f, 1e-3f, iters);
    *sum = *sum + total;  // m < 1 keeps every chain finite; the sum keeps the loop from being optimised away
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Calibration (also warms the clocks up): passes of ~0.1 s whatever the variant's speed.
  volatile float sink = 0.f;
  const int64_t probe = 1'000'000;
  const double t_probe = std::max(timed(probe, &sink), 1e-6);
  const int64_t iters = std::max<int64_t>(probe, static_cast<int64_t>(static_cast<double>(probe) * 0.1 / t_probe));
  std::vector<double> gflops;
  for (int k = 0; k < passes; ++k) {
    const double s = timed(iters, &sink);
    gflops.push_back(2.0 * kFmaLanes * static_cast<double>(iters) * threads / s / 1e9);
  }
  std::sort(gflops.begin(), gflops.end());
  return {gflops[gflops.size() / 2], gflops.back(), threads};
}

}  // namespace ie
