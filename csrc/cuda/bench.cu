// Device benchmarks (bench.h).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "cuda/bench.h"
#include "cuda/gemv.h"
#include "gemv/gemv.h"

namespace ie::cuda {
namespace {

// Two events around work on the default stream.
class Timer {
 public:
  Timer() {
    check(cudaEventCreate(&a_), "cudaEventCreate");
    const cudaError_t e = cudaEventCreate(&b_);
    if (e != cudaSuccess) {
      cudaEventDestroy(a_);
      throw_cuda(e, "cudaEventCreate");
    }
  }
  ~Timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start() { check(cudaEventRecord(a_), "cudaEventRecord"); }
  double stop_ms() {
    check(cudaEventRecord(b_), "cudaEventRecord");
    check(cudaEventSynchronize(b_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a_, b_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t a_, b_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

double copy_gbps(size_t nbytes, int iters) {
  if (nbytes < 1 || iters < 1) fail("copy_gbps: nbytes and iters must be >= 1");
  DeviceBuffer src(nbytes), dst(nbytes);
  check(cudaMemset(src.get(), 0x5a, nbytes), "cudaMemset");
  Timer t;
  std::vector<double> ms;
  for (int i = -2; i < iters; ++i) {  // two warm-up copies
    t.start();
    check(cudaMemcpyAsync(dst.get(), src.get(), nbytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
    const double m = t.stop_ms();
    if (i >= 0) ms.push_back(m);
  }
  return 2.0 * static_cast<double>(nbytes) / (median(ms) * 1e-3) / 1e9;
}

GemvBench bench_gemv(const WeightSpec& s, int batch, size_t min_bytes, int iters, const GemvTuning& tune) {
  if (batch < 1 || batch > kMaxBatch) fail("bench_gemv: batch must be 1.." + std::to_string(kMaxBatch));
  if (iters < 1) fail("bench_gemv: iters must be >= 1");
  GemvBench r;
  r.weight_bytes = weight_nbytes(s);
  r.copies = static_cast<int>(std::clamp<size_t>((min_bytes + r.weight_bytes - 1) / r.weight_bytes, 2, 64));
  r.iters = iters;
  std::vector<uint8_t> host(r.weight_bytes);
  std::vector<DeviceMatrix> mats;
  for (int c = 0; c < r.copies; ++c) {
    fill_random_weights(s, host.data(), 1000 + static_cast<uint64_t>(c));
    mats.push_back(upload_matrix(s, host.data()));
  }
  r.kernel = gemv_kernel_name(mats[0]);
  std::vector<float> xh(static_cast<size_t>(batch) * s.cols);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& v : xh) v = dist(rng);
  DeviceBuffer x = to_device(xh.data(), 4 * xh.size());
  DeviceBuffer y(4 * static_cast<size_t>(batch) * s.rows);
  auto pass = [&] {
    for (const DeviceMatrix& m : mats) gemv_tuned(m, x.as<float>(), batch, nullptr, y.as<float>(), nullptr, tune);
  };
  pass();  // warm-up: module load, first touch
  check(cudaDeviceSynchronize(), "gemv warm-up");
  Timer t;
  for (int i = 0; i < iters; ++i) {
    t.start();
    pass();
    r.times_ms.push_back(t.stop_ms() / r.copies);
  }
  r.ms_median = median(r.times_ms);
  r.ms_min = *std::min_element(r.times_ms.begin(), r.times_ms.end());
  std::vector<float> yh(static_cast<size_t>(batch) * s.rows);
  y.download(yh.data(), 4 * yh.size());
  for (float v : yh) r.checksum += v;
  return r;
}

}  // namespace ie::cuda
