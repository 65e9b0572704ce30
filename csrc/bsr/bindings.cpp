// Python bindings of the BSR loader and kernels: `_native.BsrMatrix`,
// `_native.bsr_check`, `_native.bsr_crc32`. Registered from module.cpp by
// ie_register_bsr(m). A rule broken by a file or by arrays raises
// ValueError("FILE: FIELD: message"), the project's one-line error;
// bsr_check returns the same as data (with the rule's code) instead.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/py_args.h"
#include "bsr.h"

namespace py = pybind11;

namespace {

constexpr const char* kArrays = "(arrays)";

struct PyBsr {
  ie::BsrMatrix m;
  std::string source;  // the file it was loaded from, or "(arrays)"
};

[[noreturn]] void raise_error(const ie::BsrError& e, const std::string& file) {
  if (e.status == ie::BsrStatus::Alloc) throw std::bad_alloc();  // MemoryError
  throw py::value_error(e.line(file));
}

std::unique_ptr<PyBsr> load(const std::string& path, bool allow_nonfinite) {
  auto out = std::make_unique<PyBsr>();
  ie::BsrError err;
  ie::BsrStatus s;
  {
    py::gil_scoped_release nogil;
    s = ie::bsr_load(path, allow_nonfinite, &out->m, &err);
  }
  if (s != ie::BsrStatus::Ok) raise_error(err, path);
  out->source = path;
  return out;
}

using U32Array = py::array_t<uint32_t, py::array::c_style>;
using F32Array = py::array_t<float, py::array::c_style>;
using FArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

std::unique_ptr<PyBsr> from_arrays(uint64_t rows, uint64_t cols, uint64_t block_rows, uint64_t block_cols,
                                   const U32Array& row_ptr, const U32Array& col_idx, const F32Array& values,
                                   bool allow_nonfinite) {
  if (row_ptr.ndim() != 1 || col_idx.ndim() != 1)
    throw std::invalid_argument("row_ptr and col_idx must be 1-D uint32 arrays");
  auto out = std::make_unique<PyBsr>();
  ie::BsrError err;
  const ie::BsrStatus s = ie::bsr_from_arrays(rows, cols, block_rows, block_cols, row_ptr.data(),
                                              static_cast<size_t>(row_ptr.size()), col_idx.data(),
                                              static_cast<size_t>(col_idx.size()), values.data(),
                                              static_cast<size_t>(values.size()), allow_nonfinite, &out->m, &err);
  if (s != ie::BsrStatus::Ok) raise_error(err, kArrays);
  out->source = kArrays;
  return out;
}

// A read-only numpy view of memory owned by `self` (kept alive as the base).
template <class T>
py::array view(py::handle self, const T* p, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape, p, self);
  a.attr("flags").attr("writeable") = false;
  return a;
}

py::array_t<float> gemv(const PyBsr& self, const FArray& x, const std::optional<FArray>& bias, int threads,
                        const std::string& isa_name) {
  const ie::Isa isa = ie::resolve_isa(isa_name);
  const ie::BsrMatrix& m = self.m;
  const auto cols = static_cast<py::ssize_t>(m.cols), rows = static_cast<py::ssize_t>(m.rows);
  ie::ProductOperands o = ie::product_operands(x, bias, rows, cols, ie::kBsrMaxBatch, threads);
  {
    py::gil_scoped_release nogil;
    ie::bsr_gemv(m, o.x, static_cast<int>(o.batch), o.bias, o.yp, threads, isa);
  }
  return o.y;
}

py::dict check(const std::string& path, bool allow_nonfinite) {
  ie::BsrMatrix m;
  ie::BsrError err;
  ie::BsrStatus s;
  {
    py::gil_scoped_release nogil;
    s = ie::bsr_load(path, allow_nonfinite, &m, &err);
  }
  py::dict out;
  out["ok"] = s == ie::BsrStatus::Ok;
  out["status"] = static_cast<int>(s);
  out["code"] = ie::bsr_status_name(s);
  out["field"] = err.field;
  out["message"] = err.message;
  out["error"] = s == ie::BsrStatus::Ok ? std::string() : err.line(path);
  return out;
}

}  // namespace

void ie_register_bsr(py::module_& m) {
  py::class_<PyBsr>(m, "BsrMatrix",
                    "A validated block-sparse float32 matrix (docs/formats/bsr.md) held by the native runtime.")
      .def(py::init(&from_arrays), py::arg("rows"), py::arg("cols"), py::arg("block_rows"), py::arg("block_cols"),
           py::arg("row_ptr"), py::arg("col_idx"), py::arg("values"), py::arg("allow_nonfinite") = false,
           "From uint32 row_ptr [n_block_rows + 1], uint32 col_idx [nnzb] and float32 values (nnzb × block_rows × "
           "block_cols elements, any shape), copied and checked by the same rules as a file.")
      .def_static("load", &load, py::arg("path"), py::arg("allow_nonfinite") = false,
                  "Load and validate a .bsr file (every rule, the crc32 included).")
      .def("gemv", &gemv, py::arg("x"), py::arg("bias") = py::none(), py::arg("threads") = 1, py::arg("isa") = "",
           "y = A x (+ bias). x [cols] -> y [rows]; x [b, cols] (b <= 8) -> y [b, rows]. float32 accumulation; "
           "block rows split over `threads`; isa '' follows IE_ISA / the best available.")
      .def_property_readonly("rows", [](const PyBsr& s) { return s.m.rows; })
      .def_property_readonly("cols", [](const PyBsr& s) { return s.m.cols; })
      .def_property_readonly("block_rows", [](const PyBsr& s) { return s.m.block_rows; })
      .def_property_readonly("block_cols", [](const PyBsr& s) { return s.m.block_cols; })
      .def_property_readonly("n_block_rows", [](const PyBsr& s) { return s.m.n_block_rows; })
      .def_property_readonly("n_block_cols", [](const PyBsr& s) { return s.m.n_block_cols; })
      .def_property_readonly("nnzb", [](const PyBsr& s) { return s.m.nnzb; })
      .def_property_readonly("density",
                             [](const PyBsr& s) {
                               return static_cast<double>(s.m.nnzb) /
                                      (static_cast<double>(s.m.n_block_rows) * static_cast<double>(s.m.n_block_cols));
                             })
      .def_property_readonly("payload_bytes", [](const PyBsr& s) { return s.m.payload_bytes(); },
                             "Bytes of row_ptr + col_idx + values: what one GEMV reads besides x.")
      .def_property_readonly("source", [](const PyBsr& s) { return s.source; })
      .def_property_readonly("row_ptr",
                             [](py::object self) {
                               const PyBsr& s = self.cast<const PyBsr&>();
                               return view(self, s.m.row_ptr.data(), {static_cast<py::ssize_t>(s.m.row_ptr.size())});
                             })
      .def_property_readonly("col_idx",
                             [](py::object self) {
                               const PyBsr& s = self.cast<const PyBsr&>();
                               return view(self, s.m.col_idx.data(), {static_cast<py::ssize_t>(s.m.col_idx.size())});
                             })
      .def_property_readonly("values", [](py::object self) {
        const PyBsr& s = self.cast<const PyBsr&>();
        return view(self, s.m.values.data(),
                    {static_cast<py::ssize_t>(s.m.nnzb), static_cast<py::ssize_t>(s.m.block_rows),
                     static_cast<py::ssize_t>(s.m.block_cols)});
      });
  m.def("bsr_check", &check, py::arg("path"), py::arg("allow_nonfinite") = false,
        "Validate a .bsr file with the C++ loader: {ok, status, code, field, message, error}; never raises for a "
        "broken file (the codes are formats/bsr.py's).");
  m.def(
      "bsr_crc32",
      [](py::bytes data) {
        const std::string s = data;
        return ie::crc32_update(0, reinterpret_cast<const uint8_t*>(s.data()), s.size());
      },
      py::arg("data"), "zlib's CRC-32 as the BSR loader computes it (test hook).");
}
