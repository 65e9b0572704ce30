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
#include <utility>
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

const StreamOps kStreamScalar = {stream_sum_chunk_scalar, fma_chains_scalar, int8_chains_scalar, 4.0 * kInt8Lanes};

const IsaTable<StreamOps> kStreamTable = {{&kStreamScalar,
#if IE_HAVE_X86
                                           &kStreamAvx2, &kStreamAvxVnni, &kStreamAvx512, &kStreamAmx
#else
                                           nullptr, nullptr, nullptr, nullptr
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

namespace {

// Median and best rate of `passes` timed runs of chains(t, iters) on every
// thread at once, in units of 1e9 * ops_per_iter per thread and iteration;
// iters is calibrated so that a pass lasts about 0.1 s whatever the
// variant's speed (the calibration also warms the clocks up). chains'
// results are summed into a volatile so no loop is optimised away.
template <class Chains>
std::pair<double, double> peak_rate(int threads, int passes, double ops_per_iter, Chains chains) {
  ThreadPool pool(threads);
  std::vector<double> part(static_cast<size_t>(threads), 0.0);
  volatile double sink = 0.0;
  auto timed = [&](int64_t iters) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.each([&](int t) { part[static_cast<size_t>(t)] = chains(t, iters); });
    double total = 0.0;
    for (double v : part) total += v;
    sink = sink + total;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const int64_t probe = 1'000'000;
  const double t_probe = std::max(timed(probe), 1e-6);
  const int64_t iters = std::max<int64_t>(probe, static_cast<int64_t>(static_cast<double>(probe) * 0.1 / t_probe));
  std::vector<double> rate;
  for (int k = 0; k < passes; ++k)
    rate.push_back(ops_per_iter * static_cast<double>(iters) * threads / timed(iters) / 1e9);
  std::sort(rate.begin(), rate.end());
  return {rate[rate.size() / 2], rate.back()};
}

void check_peak_args(const char* what, int threads, int passes) {
  if (threads < 1) throw std::invalid_argument(std::string(what) + ": threads must be >= 1, got " + std::to_string(threads));
  if (passes < 1) throw std::invalid_argument(std::string(what) + ": passes must be >= 1, got " + std::to_string(passes));
}

}  // namespace

FmaPeak measure_fma_peak(int threads, int passes, Isa isa) {
  check_peak_args("fma peak", threads, passes);
  const auto chains = kStreamTable.ops(isa).fma_chains;  // m < 1 keeps every chain finite
  const auto r = peak_rate(threads, passes, 2.0 * kFmaLanes, [&](int t, int64_t iters) {
    return static_cast<double>(chains(0.5f + static_cast<float>(t), 0.999f, 1e-3f, iters));
  });
  return {r.first, r.second, threads};
}

Int8Peak measure_int8_peak(int threads, int passes, Isa isa) {
  check_peak_args("int8 peak", threads, passes);
  const StreamOps& ops = kStreamTable.ops(isa);
  const auto chains = ops.int8_chains;
  const auto r = peak_rate(threads, passes, ops.int8_macs,
                           [&](int t, int64_t iters) { return static_cast<double>(chains(3 + t, -7, iters)); });
  return {r.first, r.second, threads};
}

}  // namespace ie
