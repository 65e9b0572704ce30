// Python bindings of the native runtime (`iekit.runtime._native`).
// Every binding that touches bulk memory releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "cpu_features.h"
#include "isa.h"
#include "stream_read.h"

#if IE_HAVE_CUDA
#include "cuda/device_info.h"
#endif

namespace py = pybind11;

namespace {

py::dict cpu_features_dict() {
  const ie::CpuFeatures f = ie::detect_cpu_features();
  py::dict flags;
  for (const auto& [name, on] : f.flags()) flags[py::str(name)] = on;
  py::list isas;
  for (ie::Isa isa : ie::available_isas()) isas.append(ie::isa_name(isa));
  py::dict out;
  out["flags"] = flags;
  out["logical_cpus"] = f.logical_cpus;
  out["isas"] = isas;
  out["selected_isa"] = ie::isa_name(ie::resolve_isa(""));
  out["cuda_build"] = static_cast<bool>(IE_HAVE_CUDA);
  return out;
}

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
  out["isa"] = ie::isa_name(isa);
  return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "iekit native runtime: CPU-dispatched kernels (scalar reference + AVX2/FMA)";
  py::register_exception<std::invalid_argument>(m, "NativeValueError", PyExc_ValueError);

  m.def("cpu_features", &cpu_features_dict,
        "CPU flags, the kernel ISAs this build can run here, and the one selected "
        "(IE_ISA=scalar|avx2|auto overrides).");
  m.def("stream_sum", &stream_sum, py::arg("x"), py::arg("threads") = 1, py::arg("isa") = "",
        "Sum of a float32 array by the streaming-read kernel (test hook for the bandwidth yardstick).");
  m.def("read_bandwidth", &read_bandwidth, py::arg("bytes") = size_t(256) << 20,
        py::arg("threads") = 1, py::arg("passes") = 5, py::arg("isa") = "",
        "Measure this machine's memory read bandwidth (GB/s, median of passes).");
#if IE_HAVE_CUDA
  m.def(
      "cuda_devices",
      [] {
        py::list out;
        for (const auto& d : ie::cuda::device_list_raw()) {
          py::dict e;
          e["index"] = d.index;
          e["name"] = d.name;
          e["total_mem_bytes"] = d.total_mem_bytes;
          e["compute_capability"] = std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
          out.append(e);
        }
        return out;
      },
      "CUDA devices visible to this build (empty list when there is no GPU).");
#endif
}
