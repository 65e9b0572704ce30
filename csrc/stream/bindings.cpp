// Python bindings of the streaming read: the bandwidth yardstick and its test hook.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "stream_read.h"

namespace py = pybind11;

namespace {

double stream_sum(py::array_t<float, py::array::c_style | py::array::forcecast> x, int threads,
                  const std::string& isa_name) {
  const ie::Isa isa = ie::resolve_isa(isa_name);
  const float* p = x.data();
  const size_t n = static_cast<size_t>(x.size());
  py::gil_scoped_release nogil;
  return ie::stream_sum_f32(p, n, threads, isa);
}

py::dict read_bandwidth(size_t bytes, int threads, int passes, const std::string& isa_name) {
  const ie::Isa isa = ie::resolve_isa(isa_name);
  ie::ReadBandwidth r{};
  {
    py::gil_scoped_release nogil;
    r = ie::measure_read_bandwidth(bytes, threads, passes, isa);
  }
  py::dict out;
  out["gbps"] = r.gbps_median;
  out["gbps_best"] = r.gbps_best;
  out["bytes"] = r.bytes;
  out["passes"] = r.passes;
  out["threads"] = r.threads;
  out["isa"] = ie::isa_name(ie::stream_kernel_isa(isa));
  return out;
}

// A peak measurement, GIL released, as {<unit>, <unit>_best, threads, isa}.
template <class Measure>
py::dict peak(const char* unit, int threads, int passes, const std::string& isa_name, Measure measure) {
  const ie::Isa isa = ie::resolve_isa(isa_name);
  decltype(measure(threads, passes, isa)) r{};
  {
    py::gil_scoped_release nogil;
    r = measure(threads, passes, isa);
  }
  py::dict out;
  out[unit] = r.median;
  out[(std::string(unit) + "_best").c_str()] = r.best;
  out["threads"] = r.threads;
  out["isa"] = ie::isa_name(ie::stream_kernel_isa(isa));
  return out;
}

py::dict fma_peak(int threads, int passes, const std::string& isa_name) {
  return peak("gflops", threads, passes, isa_name, ie::measure_fma_peak);
}

py::dict int8_peak(int threads, int passes, const std::string& isa_name) {
  return peak("gmacs", threads, passes, isa_name, ie::measure_int8_peak);
}

int64_t int8_chains(int a, int b, int64_t iters, const std::string& isa_name) {
  if (iters < 0) throw std::invalid_argument("int8_chains: iters must be >= 0");
  if (a < 0 || a > 255 || b < -128 || b > 127 || 2 * a * std::abs(b) > 32767)
    throw std::invalid_argument("int8_chains: a must be a byte 0..255 and b an int8 -128..127 with |2ab| <= 32767 "
                                "(vpmaddubsw saturates its int16 pair sums)");
  return ie::kStreamTable.ops(ie::resolve_isa(isa_name)).int8_chains(a, b, iters);
}

float fma_chains(float seed, float m, float c, int64_t iters, const std::string& isa_name) {
  if (iters < 0) throw std::invalid_argument("fma_chains: iters must be >= 0");
  return ie::kStreamTable.ops(ie::resolve_isa(isa_name)).fma_chains(seed, m, c, iters);
}

}  // namespace

void ie_register_stream(py::module_& m) {
  m.def("stream_sum", &stream_sum, py::arg("x"), py::arg("threads") = 1, py::arg("isa") = "",
        "Sum of a float32 array by the streaming-read kernel (test hook for the bandwidth yardstick).");
  m.def("read_bandwidth", &read_bandwidth, py::arg("bytes") = size_t(256) << 20, py::arg("threads") = 1,
        py::arg("passes") = 5, py::arg("isa") = "",
        "Measure this machine's memory read bandwidth (GB/s, median of passes).");
  m.def("fma_peak", &fma_peak, py::arg("threads") = 1, py::arg("passes") = 5, py::arg("isa") = "",
        "Measure this machine's multiply-add peak (GFLOPS of the chosen variant, median of passes).");
  m.def("int8_peak", &int8_peak, py::arg("threads") = 1, py::arg("passes") = 5, py::arg("isa") = "",
        "Measure this machine's int8 multiply-add peak (10^9 per second through the chosen variant's int8 dot "
        "product, AVX2: vpmaddubsw + vpmaddwd; median of passes).");
  m.def("int8_chains", &int8_chains, py::arg("a"), py::arg("b"), py::arg("iters"), py::arg("isa") = "",
        "The int8 yardstick's loop (test hook): the sum of its int32 lanes after iters steps of += 4ab.");
  m.def("fma_chains", &fma_chains, py::arg("seed"), py::arg("m"), py::arg("c"), py::arg("iters"), py::arg("isa") = "",
        "The FMA yardstick's loop (test hook): the sum of its chains after iters steps.");
}
