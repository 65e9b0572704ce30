// The Python module `iekit.formats._search`: the quantizers' hot searches in
// C++ (formats may not import iekit.runtime, where _native lives:
// tests/test_layers.py), each the same arithmetic as the numpy it replaced.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "qkx.h"

namespace py = pybind11;

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

py::tuple qkx(const F32Array& x, const F32Array& w, int nmax, float rmin, float rdelta, int nstep, bool mad) {
  if (x.ndim() != 2 || w.ndim() != 2 || x.shape(0) != w.shape(0) || x.shape(1) != w.shape(1))
    throw std::invalid_argument("qkx: x and w must be [blocks, k] arrays of one shape");
  if (x.shape(1) < 1 || x.shape(1) > (1 << 20))
    throw std::invalid_argument("qkx: k must be 1..2^20, got " + std::to_string(x.shape(1)));
  if (nmax < 1 || nmax > 255) throw std::invalid_argument("qkx: nmax must be 1..255, got " + std::to_string(nmax));
  if (nstep < 0 || nstep > 1000) throw std::invalid_argument("qkx: nstep must be 0..1000, got " + std::to_string(nstep));
  const int64_t n = x.shape(0);
  const int k = static_cast<int>(x.shape(1));
  py::array_t<float> scale(n), the_min(n);
  py::array_t<uint8_t> codes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(k)});
  const ie::QkxSearch s{nmax, rmin, rdelta, nstep, mad};
  const float *xp = x.data(), *wp = w.data();
  float *sp = scale.mutable_data(), *mp = the_min.mutable_data();
  uint8_t* cp = codes.mutable_data();
  {
    py::gil_scoped_release release;  // callers run blocks on several threads (formats/workers.py)
    ie::qkx_search(xp, wp, n, k, s, sp, mp, cp);
  }
  return py::make_tuple(scale, the_min, codes);
}

}  // namespace

PYBIND11_MODULE(_search, m) {
  m.doc() = "The quantizers' searches in C++ (formats/quant_search.py).";
  m.def("qkx", &qkx, py::arg("x"), py::arg("w"), py::arg("nmax"), py::arg("rmin"), py::arg("rdelta"),
        py::arg("nstep"), py::arg("mad") = false,
        "ggml's make_qkx2_quants over blocks x, w [n, k] (float32): (scale [n], the_min [n], codes [n, k] uint8), "
        "x ~ scale * code - the_min.");
}
