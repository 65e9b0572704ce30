// The Python module `iekit.formats._search`: the quantizers' hot searches in
// C++ (formats may not import iekit.runtime, where _native lives:
// tests/test_layers.py), each the same arithmetic as the numpy it replaced.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "grid_nearest.h"
#include "iq4_scales.h"
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

py::array_t<int32_t> grid_nearest(const F32Array& u, const F32Array& w,
                                 const py::array_t<int16_t, py::array::c_style | py::array::forcecast>& cand_idx,
                                 const F32Array& cand_val) {
  if (u.ndim() != 2 || u.shape(1) != 4 || w.ndim() != 2 || w.shape(0) != u.shape(0) || w.shape(1) != 4)
    throw std::invalid_argument("grid_nearest: u and w must be [m, 4] arrays of one shape");
  if (cand_idx.ndim() != 2 || cand_idx.shape(0) != 4096 || cand_idx.shape(1) < 1 ||
      cand_idx.shape(1) > ie::kMaxCandidates)
    throw std::invalid_argument("grid_nearest: cand_idx must be [4096, k], k 1.." + std::to_string(ie::kMaxCandidates));
  const int k = static_cast<int>(cand_idx.shape(1));
  if (cand_val.ndim() != 3 || cand_val.shape(0) != 4096 || cand_val.shape(1) != 4 || cand_val.shape(2) != k)
    throw std::invalid_argument("grid_nearest: cand_val must be [4096, 4, k] beside cand_idx [4096, k]");
  const int64_t m = u.shape(0);
  py::array_t<int32_t> out(m);
  const float *up = u.data(), *wp = w.data(), *vp = cand_val.data();
  const int16_t* ip = cand_idx.data();
  int32_t* op = out.mutable_data();
  {
    py::gil_scoped_release release;
    ie::grid_nearest(up, wp, m, ip, vp, k, op);
  }
  return out;
}

py::array_t<float> iq4_scales(const F32Array& x, const F32Array& w, int ntry) {
  if (x.ndim() != 2 || x.shape(1) != 32 || w.ndim() != 2 || w.shape(0) != x.shape(0) || w.shape(1) != 32)
    throw std::invalid_argument("iq4_scales: x and w must be [n, 32] arrays of one shape");
  if (ntry < 0 || ntry > 127) throw std::invalid_argument("iq4_scales: ntry must be 0..127, got " + std::to_string(ntry));
  const int64_t n = x.shape(0);
  py::array_t<float> scale(n);
  const float *xp = x.data(), *wp = w.data();
  float* sp = scale.mutable_data();
  {
    py::gil_scoped_release release;
    ie::iq4_scales(xp, wp, n, ntry, sp);
  }
  return scale;
}

}  // namespace

PYBIND11_MODULE(_search, m) {
  m.doc() = "The quantizers' searches in C++ (formats/quant_search.py).";
  m.def("qkx", &qkx, py::arg("x"), py::arg("w"), py::arg("nmax"), py::arg("rmin"), py::arg("rdelta"),
        py::arg("nstep"), py::arg("mad") = false,
        "ggml's make_qkx2_quants over blocks x, w [n, k] (float32): (scale [n], the_min [n], codes [n, k] uint8), "
        "x ~ scale * code - the_min.");
  m.def("iq4_scales", &iq4_scales, py::arg("x"), py::arg("w"), py::arg("ntry") = 7,
        "The scale search of ggml's quantize_row_iq4_nl_impl over 32-element blocks x, w [n, 32]: float32 [n].");
  m.def("grid_nearest", &grid_nearest, py::arg("u"), py::arg("w"), py::arg("cand_idx"), py::arg("cand_val"),
        "iq3_s's search: for each magnitude four-tuple u [m, 4] under weights w [m, 4], the candidate of its "
        "rounded tuple (cand_idx [4096, k], cand_val [4096, 4, k]) of least weighted squared error: int32 [m].");
}
