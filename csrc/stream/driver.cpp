// The streaming read: scalar body, ISA table, threaded driver, bandwidth measurement.
#include "stream_read.h"

#include "common/aligned.h"
#include "common/thread_pool.h"


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

int64_t int8_chains_scalar(int a, int b, int64_t iters) {
  uint32_t v[kInt8Lanes] = {};
  const uint32_t step = static_cast<uint32_t>(4 * a * b);
  for (int64_t i = 0; i < iters; ++i)
    for (uint32_t& x : v) x += step;  // unsigned: wraps as the SIMD lanes do
  int64_t total = 0;
  for (uint32_t x : v) total += static_cast<int32_t>(x);
  return total;
}

const StreamOps kStreamScalar = {stream_sum_chunk_scalar, fma_chains_scalar, int8_chains_scalar};

const IsaTable<StreamOps> kStreamTable = {{&kStreamScalar,
#if IE_HAVE_X86
                                           &kStreamAvx2, &kStreamAvx512
#else
                                           nullptr, nullptr
#endif
                                           }};

Isa stream_kernel_isa(Isa isa) { return kStreamTable.pick(isa); }

namespace {

// Thread t's floats [*i0, *i1) of n: chunk boundaries on 16-float (64-byte)
// multiples keep SIMD loads aligned when the base pointer is.
void share(size_t n, int t, int nt, size_t* i0, size_t* i1) {
  const size_t blocks = (n + 15) / 16;
  *i0 = std::min(n, blocks * t / nt * 16);
  *i1 = std::min(n, blocks * (t + 1) / nt * 16);
}

// Every thread of the pool reads its share (each, not run: a bandwidth
// measurement needs them all reading at once).
double sum_on(ThreadPool& pool, const float* p, size_t n, Isa isa) {
  const auto sum_chunk = kStreamTable.ops(isa).sum_chunk;
  std::vector<double> part(static_cast<size_t>(pool.size()), 0.0);
  pool.each([&](int t) {
    size_t i0, i1;
    share(n, t, pool.size(), &i0, &i1);
    if (i1 > i0) part[static_cast<size_t>(t)] = sum_chunk(p + i0, i1 - i0);
  });
  double total = 0.0;
  for (double v : part) total += v;
  return total;
}

}  // namespace

double stream_sum_f32(const float* p, size_t n, int threads, Isa isa) {
  ThreadPool pool(threads < 1 ? 1 : threads);
  return sum_on(pool, p, n, isa);
}

ReadBandwidth measure_read_bandwidth(size_t bytes, int threads, int passes, Isa isa) {
  if (threads < 1) threads = 1;
  if (passes < 1) passes = 1;
  bytes = (bytes + 63) / 64 * 64;
  if (bytes == 0) throw std::invalid_argument("read bandwidth: buffer size must be > 0");
  const size_t n = bytes / sizeof(float);
  AlignedArray<float> buf(n, /*zero=*/false);
  float* p = buf.data();
  ThreadPool pool(threads);
  // First touch with the same split as the reads (NUMA locality).
  pool.each([&](int t) {
    size_t i0, i1;
    share(n, t, pool.size(), &i0, &i1);
    for (size_t i = i0; i < i1; ++i) p[i] = static_cast<float>(i & 1023) * (1.0f / 1024.0f);
  });
  std::vector<double> gbps;
  volatile double sink = 0.0;
  sum_on(pool, p, n, isa);  // warm-up pass (page tables, clocks)
  for (int k = 0; k < passes; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + sum_on(pool, p, n, isa);
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
  ThreadPool pool(threads);
  std::vector<float> part(static_cast<size_t>(threads), 0.f);
  auto timed = [&](int64_t iters, volatile float* sum) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.each([&](int t) { part[static_cast<size_t>(t)] = chains(0.5f + static_cast<float>(t), 0.999f, 1e-3f, iters); });
    float total = 0.f;
    for (float v : part) total += v;
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

Int8Peak measure_int8_peak(int threads, int passes, Isa isa) {
  if (threads < 1) throw std::invalid_argument("int8 peak: threads must be >= 1, got " + std::to_string(threads));
  if (passes < 1) throw std::invalid_argument("int8 peak: passes must be >= 1, got " + std::to_string(passes));
  const auto chains = kStreamTable.ops(isa).int8_chains;
  ThreadPool pool(threads);
  std::vector<int64_t> part(static_cast<size_t>(threads), 0);
  auto timed = [&](int64_t iters, volatile int64_t* sum) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.each([&](int t) { part[static_cast<size_t>(t)] = chains(3 + t, -7, iters); });
    int64_t total = 0;
    for (int64_t v : part) total += v;
    *sum = *sum + total;  // keeps the loop from being optimised away
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  volatile int64_t sink = 0;
  const int64_t probe = 1'000'000;
  const double t_probe = std::max(timed(probe, &sink), 1e-6);
  const int64_t iters = std::max<int64_t>(probe, static_cast<int64_t>(static_cast<double>(probe) * 0.1 / t_probe));
  std::vector<double> gmacs;
  for (int k = 0; k < passes; ++k) {
    const double s = timed(iters, &sink);
    gmacs.push_back(4.0 * kInt8Lanes * static_cast<double>(iters) * threads / s / 1e9);
  }
  std::sort(gmacs.begin(), gmacs.end());
  return {gmacs[gmacs.size() / 2], gmacs.back(), threads};
}

}  // namespace ie
