// The Python module `iekit.runtime._native`: what belongs to no one kernel
// family (CPU features, ISA levels, the weight-type table and its typed
// WeightSpec) plus each family's registration.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "attention/attention.h"
#include "bsr/bsr.h"
#include "common/cpu_features.h"
#include "common/isa.h"
#include "common/sigbus_report.h"
#include "common/weight_types.h"
#include "dedup/dedup.h"
#include "gemm/gemm.h"
#include "gemv/gemv.h"
#include "gemv/rows8.h"
#include "stream/stream_read.h"

#if IE_HAVE_CUDA
#include "cuda/device_info.h"
#endif

namespace py = pybind11;

void ie_register_gemv(py::module_&);     // gemv/bindings.cpp
void ie_register_gemm(py::module_&);     // gemm/bindings.cpp
void ie_register_stream(py::module_&);   // stream/bindings.cpp
void ie_register_dedup(py::module_&);    // dedup/bindings.cpp
void ie_register_bsr(py::module_&);      // bsr/bindings.cpp
void ie_register_decoder(py::module_&);  // decoder/bindings.cpp
#if IE_HAVE_CUDA
void ie_register_cuda(py::module_&);     // cuda/bindings.cpp
#endif

namespace {

// Each kernel family's variant choice: the same table lookup its driver makes.
struct FamilyIsa {
  const char* name;
  ie::Isa (*pick)(ie::Isa);
};
constexpr FamilyIsa kFamilies[] = {{"gemv", ie::gemv_kernel_isa},
                                   {"gemm", ie::gemm_kernel_isa},
                                   {"attention", ie::attention_kernel_isa},
                                   {"bsr", ie::bsr_kernel_isa},
                                   {"stream_read", ie::stream_kernel_isa},
                                   {"dedup", ie::dedup::kernel_isa}};

const FamilyIsa& family(const std::string& name) {
  std::string names;
  for (const FamilyIsa& f : kFamilies) {
    if (name == f.name) return f;
    names += (names.empty() ? "" : ", ") + std::string(f.name);
  }
  throw std::invalid_argument("unknown kernel family '" + name + "' (" + names + ")");
}

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

py::list weight_types() {
  py::list out;
  for (const ie::WTypeInfo& t : ie::kWeightTypes) {
    py::dict d;
    d["name"] = t.name;
    d["block_elems"] = t.block_elems;
    d["block_bytes"] = t.block_bytes;
    d["quantized"] = t.quantized;
    d["gemv"] = t.gemv;
    d["int8_act"] = t.int8_act;
    d["act_block"] = t.act_block;
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "iekit native runtime: CPU-dispatched kernels (scalar reference + AVX2/FMA, AVX-512)";
  py::register_exception<std::invalid_argument>(m, "NativeValueError", PyExc_ValueError);

  m.def("report_sigbus_as", &ie::report_sigbus_as, py::arg("line"),
        "From now on, a SIGBUS from a mapped file that shrank (BUS_ADRERR) prints LINE on stderr and exits 1 "
        "instead of killing the process silently (common/sigbus_report.h).");
  m.def("cpu_features", &cpu_features_dict,
        "CPU flags, the kernel ISAs this build can run here, and the one selected "
        "(IE_ISA=scalar|avx2|avxvnni|avx512|auto overrides).");
  m.def(
      "kernel_isa",
      [](const std::string& name, const std::string& isa) {
        return std::string(ie::isa_name(family(name).pick(ie::resolve_isa(isa))));
      },
      py::arg("family"), py::arg("isa") = "",
      "The ISA variant a kernel family (gemv, bsr, stream_read, dedup) really runs for `isa` "
      "(default: the selected one): the best it has at or below it, from the table its driver dispatches through.");
  m.def(
      "kernel_variants",
      [] {
        py::dict out;
        for (const FamilyIsa& f : kFamilies) {
          py::list levels;
          for (int i = 0; i < ie::kIsaLevels; ++i)
            if (f.pick(static_cast<ie::Isa>(i)) == static_cast<ie::Isa>(i)) levels.append(ie::isa_name(static_cast<ie::Isa>(i)));
          out[f.name] = levels;
        }
        return out;
      },
      "Per kernel family, the ISA levels this build has a variant for (available on this CPU or not).");
  m.def("weight_types", &weight_types,
        "The weight-type table (csrc/common/weight_types.h): name, block_elems, block_bytes, quantized, gemv, int8_act, act_block.");

  py::class_<ie::WeightSpec>(m, "WeightSpec",
                             "A stored matrix's type, shape and int4w parameters, validated once "
                             "(csrc/common/weight_types.h).")
      .def(py::init(&ie::make_weight_spec), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
           py::arg("group_size") = 0, py::arg("symmetric") = true, py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0)
      .def_property_readonly("dtype", [](const ie::WeightSpec& s) { return ie::wtype_info(s.type).name; })
      .def_readonly("rows", &ie::WeightSpec::rows)
      .def_readonly("cols", &ie::WeightSpec::cols)
      .def_readonly("group_size", &ie::WeightSpec::group_size)
      .def_readonly("symmetric", &ie::WeightSpec::symmetric)
      .def_readonly("tensor_scale", &ie::WeightSpec::scale)
      .def_property_readonly("scale_dtype", [](const ie::WeightSpec& s) { return s.scale_f32 ? "f32" : "f16"; })
      .def_property_readonly("nbytes", &ie::weight_nbytes)
      .def_property_readonly(
          "rows8_nbytes", &ie::rows8_nbytes,
          "Bytes of the decoder's row-interleaved copy (gemv/rows8.h; 0 for a float type): the stored size, "
          "but 4.25 bits a weight for the codebook types (iq3_s, iq3_xxs, iq2_xxs).")
      .def("__repr__", [](const ie::WeightSpec& s) {
        return "WeightSpec(" + std::string(ie::wtype_info(s.type).name) + ", [" + std::to_string(s.rows) + ", " +
               std::to_string(s.cols) + "], group_size=" + std::to_string(s.group_size) + ")";
      });
  m.def("expected_nbytes",
        [](const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size, bool symmetric,
           const std::string& scale_dtype, double tensor_scale) {
          return ie::weight_nbytes(ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale));
        },
        py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("group_size") = 0, py::arg("symmetric") = true,
        py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0, "Bytes of a stored [rows, cols] weight matrix (docs/formats/quant.md).");
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
  ie_register_gemv(m);
  ie_register_gemm(m);
  ie_register_stream(m);
  ie_register_dedup(m);
  ie_register_bsr(m);
  ie_register_decoder(m);
#if IE_HAVE_CUDA
  ie_register_cuda(m);
#endif
}
