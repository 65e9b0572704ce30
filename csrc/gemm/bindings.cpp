// Python binding of the GEMM family (the test hook: Y = X W^T in one call).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/py_args.h"
#include "gemm.h"

namespace py = pybind11;

namespace {

using FArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

py::array_t<float> gemm_py(const py::buffer& w, const std::string& dtype, int64_t rows, int64_t cols, FArray x,
                           std::optional<FArray> bias, int64_t group_size, bool symmetric,
                           const std::string& scale_dtype, double tensor_scale, int threads, const std::string& isa_name) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const ie::Isa isa = ie::resolve_isa(isa_name);
  const py::buffer_info wb = ie::weight_buffer(w, s);
  ie::ProductOperands o = ie::product_operands(x, bias, rows, cols, INT_MAX, threads);
  const uint8_t* wp = static_cast<const uint8_t*>(wb.ptr);
  ie::GemmScratch scratch;
  {
    py::gil_scoped_release nogil;
    ie::ThreadPool pool(threads);
    ie::gemm(s, wp, o.x, static_cast<int>(o.batch), o.bias, o.yp, pool, isa, scratch);
  }
  return o.y;
}

}  // namespace

void ie_register_gemm(py::module_& m) {
  m.def("gemm", &gemm_py, py::arg("w"), py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("x"),
        py::arg("bias") = py::none(), py::arg("group_size") = 0, py::arg("symmetric") = true,
        py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0, py::arg("threads") = 1, py::arg("isa") = "",
        "y [n, rows] = x [n, cols] @ W.T (+ bias): the prefill GEMM (weights converted to float32 per tile).");
}
