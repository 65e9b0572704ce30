// The Python module `iekit.formats._search`: the quantizers' hot searches in
// C++ (formats may not import iekit.runtime, where _native lives:
// tests/test_layers.py), each the same arithmetic as the numpy it replaced.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "grid_nearest.h"
#include "iq4_scales.h"
#include "move_codes.h"
#include "qkx.h"
#include "qx.h"

namespace py = pybind11;

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// x [blocks, k] (and w of its shape where the search takes weights), k in
// 1..2^20 (only k_only where given): the shape checks every search shares.
void check_blocks(const char* what, const F32Array& x, const F32Array* w, int k_only = 0) {
  const std::string at = what;
  if (x.ndim() != 2 || (w && (w->ndim() != 2 || w->shape(0) != x.shape(0) || w->shape(1) != x.shape(1))))
    throw std::invalid_argument(at + ": x" + (w ? " and w" : "") + " must be [blocks, k] arrays" + (w ? " of one shape" : ""));
  if (k_only ? x.shape(1) != k_only : x.shape(1) < 1 || x.shape(1) > (1 << 20))
    throw std::invalid_argument(at + ": k must be " + (k_only ? std::to_string(k_only) : "1..2^20") + ", got " +
                                std::to_string(x.shape(1)));
}

// An integer argument within [lo, hi].
void check_range(const char* what, const char* name, int v, int lo, int hi) {
  if (v < lo || v > hi)
    throw std::invalid_argument(std::string(what) + ": " + name + " must be " + std::to_string(lo) + ".." +
                                std::to_string(hi) + ", got " + std::to_string(v));
}

// cand_val [tuples, dims, kCandidates]: a codebook's candidate table (formats/codebooks.py); its dims.
int check_candidates(const char* what, const F32Array& cand_val) {
  const int dims = cand_val.ndim() == 3 ? static_cast<int>(cand_val.shape(1)) : 0;
  if ((dims != 4 && dims != 8) || cand_val.shape(0) != ie::grid_tuples(dims) || cand_val.shape(2) != ie::kCandidates)
    throw std::invalid_argument(std::string(what) + ": cand_val must be [4096, 4, " + std::to_string(ie::kCandidates) +
                                "] or [6561, 8, " + std::to_string(ie::kCandidates) + "]");
  return dims;
}

py::tuple qkx(const F32Array& x, const F32Array& w, int nmax, float rmin, float rdelta, int nstep, bool mad) {
  check_blocks("qkx", x, &w);
  check_range("qkx", "nmax", nmax, 1, 255);
  check_range("qkx", "nstep", nstep, 0, 1000);
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

py::tuple qx(const F32Array& x, const F32Array& w, int nmax) {
  check_blocks("qx", x, &w);
  check_range("qx", "nmax", nmax, 1, 127);
  const int64_t n = x.shape(0);
  const int k = static_cast<int>(x.shape(1));
  py::array_t<float> scale(n), iscale(n);
  const float *xp = x.data(), *wp = w.data();
  float *sp = scale.mutable_data(), *ip = iscale.mutable_data();
  {
    py::gil_scoped_release release;
    ie::qx_search(xp, wp, n, k, nmax, sp, ip);
  }
  return py::make_tuple(scale, iscale);
}

py::tuple q3(const F32Array& x, int nmax) {
  check_blocks("q3", x, nullptr);
  check_range("q3", "nmax", nmax, 1, 127);
  const int64_t n = x.shape(0);
  const int k = static_cast<int>(x.shape(1));
  py::array_t<float> scale(n);
  py::array_t<uint8_t> codes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(k)});
  const float* xp = x.data();
  float* sp = scale.mutable_data();
  uint8_t* cp = codes.mutable_data();
  {
    py::gil_scoped_release release;
    ie::q3_search(xp, n, k, nmax, sp, cp);
  }
  return py::make_tuple(scale, codes);
}

py::tuple qp(const F32Array& x, const F32Array& w, int nmax) {
  check_blocks("qp", x, &w);
  check_range("qp", "nmax", nmax, 1, 255);
  const int64_t n = x.shape(0);
  const int k = static_cast<int>(x.shape(1));
  py::array_t<float> scale(n);
  py::array_t<uint8_t> codes({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(k)});
  const float *xp = x.data(), *wp = w.data();
  float* sp = scale.mutable_data();
  uint8_t* cp = codes.mutable_data();
  {
    py::gil_scoped_release release;
    ie::qp_search(xp, wp, n, k, nmax, sp, cp);
  }
  return py::make_tuple(scale, codes);
}

py::array_t<int32_t> grid_nearest(const F32Array& u, const F32Array& w,
                                 const py::array_t<int16_t, py::array::c_style | py::array::forcecast>& cand_idx,
                                 const F32Array& cand_val, bool ternary) {
  const int dims = check_candidates("grid_nearest", cand_val);
  if (ternary && dims != 8) throw std::invalid_argument("grid_nearest: a ternary codebook's tuples are of 8");
  if (u.ndim() != 2 || u.shape(1) != dims || w.ndim() != 2 || w.shape(0) != u.shape(0) || w.shape(1) != dims)
    throw std::invalid_argument("grid_nearest: u and w must be [m, " + std::to_string(dims) + "] arrays of one shape");
  if (cand_idx.ndim() != 2 || cand_idx.shape(0) != ie::grid_tuples(dims) || cand_idx.shape(1) != ie::kCandidates)
    throw std::invalid_argument("grid_nearest: cand_idx must be [" + std::to_string(ie::grid_tuples(dims)) + ", " +
                                std::to_string(ie::kCandidates) + "]");
  const int64_t m = u.shape(0);
  py::array_t<int32_t> out(m);
  const float *up = u.data(), *wp = w.data(), *vp = cand_val.data();
  const int16_t* ip = cand_idx.data();
  int32_t* op = out.mutable_data();
  {
    py::gil_scoped_release release;
    ie::grid_nearest(dims, ternary, up, wp, m, ip, vp, op);
  }
  return out;
}

py::array_t<float> grid_scales(const F32Array& a, const F32Array& w, const F32Array& cand_val, const F32Array& starts,
                               const F32Array& moves) {
  check_blocks("grid_scales", a, &w);
  const int dims = check_candidates("grid_scales", cand_val);
  if (a.shape(1) != 32 && !(dims == 8 && a.shape(1) == 16))
    throw std::invalid_argument("grid_scales: k must be 32 (or 16 for tuples of 8), got " + std::to_string(a.shape(1)));
  const int n = static_cast<int>(a.shape(1));
  if (starts.ndim() != 1 || moves.ndim() != 1 || starts.shape(0) < 1 || starts.shape(0) > 64 || moves.shape(0) > 64)
    throw std::invalid_argument("grid_scales: starts (1..64) and moves (0..64) must be 1-d arrays");
  const int64_t m = a.shape(0);
  const float *ap = a.data(), *wp = w.data();
  py::array_t<float> out(m);
  const float *vp = cand_val.data(), *sp = starts.data(), *mp = moves.data();
  const int ns = static_cast<int>(starts.shape(0)), nm = static_cast<int>(moves.shape(0));
  float* op = out.mutable_data();
  {
    py::gil_scoped_release release;
    ie::grid_scales(dims, n, ap, wp, m, vp, sp, ns, mp, nm, op);
  }
  return out;
}

py::array_t<float> shifted_scales(const F32Array& x, const F32Array& w, const F32Array& cand_val,
                                  const F32Array& starts, const F32Array& moves, float delta) {
  check_blocks("shifted_scales", x, &w);
  if (check_candidates("shifted_scales", cand_val) != 8 || (x.shape(1) != 32 && x.shape(1) != 16))
    throw std::invalid_argument("shifted_scales: tuples of 8 (cand_val [6561, 8, 16]) and k 32 or 16, got k " +
                                std::to_string(x.shape(1)));
  if (starts.ndim() != 1 || moves.ndim() != 1 || starts.shape(0) < 1 || starts.shape(0) > 64 || moves.shape(0) > 64)
    throw std::invalid_argument("shifted_scales: starts (1..64) and moves (0..64) must be 1-d arrays");
  if (!(delta >= 0.f && delta < 0.5f)) throw std::invalid_argument("shifted_scales: delta must be in [0, 0.5)");
  const int n = static_cast<int>(x.shape(1));
  const int64_t m = x.shape(0);
  py::array_t<float> out(m);
  const float *xp = x.data(), *wp = w.data(), *vp = cand_val.data(), *sp = starts.data(), *mp = moves.data();
  const int ns = static_cast<int>(starts.shape(0)), nm = static_cast<int>(moves.shape(0));
  float* op = out.mutable_data();
  {
    py::gil_scoped_release release;
    ie::shifted_scales(n, xp, wp, m, vp, sp, ns, mp, nm, delta, op);
  }
  return out;
}

// A scale per 32-element block of x under weights w: one of the iq4 searches (SEARCH, named WHAT).
template <void (*SEARCH)(const float*, const float*, int64_t, int, float*)>
py::array_t<float> iq4_search(const char* what, const F32Array& x, const F32Array& w, int ntry) {
  check_blocks(what, x, &w, 32);
  check_range(what, "ntry", ntry, 0, 127);
  const int64_t n = x.shape(0);
  py::array_t<float> scale(n);
  const float *xp = x.data(), *wp = w.data();
  float* sp = scale.mutable_data();
  {
    py::gil_scoped_release release;
    SEARCH(xp, wp, n, ntry, sp);
  }
  return scale;
}

py::array_t<float> iq4_scales(const F32Array& x, const F32Array& w, int ntry) {
  return iq4_search<ie::iq4_scales>("iq4_scales", x, w, ntry);
}

py::array_t<float> iq4_shifted_scales(const F32Array& x, const F32Array& w, int ntry) {
  return iq4_search<ie::iq4_shifted_scales>("iq4_shifted_scales", x, w, ntry);
}

}  // namespace

PYBIND11_MODULE(_search, m) {
  m.doc() = "The quantizers' searches in C++ (formats/quant_search.py).";
  m.def("qkx", &qkx, py::arg("x"), py::arg("w"), py::arg("nmax"), py::arg("rmin"), py::arg("rdelta"),
        py::arg("nstep"), py::arg("mad") = false,
        "ggml's make_qkx2_quants over blocks x, w [n, k] (float32): (scale [n], the_min [n], codes [n, k] uint8), "
        "x ~ scale * code - the_min.");
  m.def("qx", &qx, py::arg("x"), py::arg("w"), py::arg("nmax"),
        "ggml's make_qx_quants (rmse_type 1, weights) over blocks x, w [n, k] (float32): (scale [n], iscale [n], "
        "the inverse scale whose codes -nmax..nmax-1 the scale was fitted to; both 0 in an all-zero block).");
  m.def("q3", &q3, py::arg("x"), py::arg("nmax"),
        "ggml's make_q3_quants (do_rmse) over blocks x [n, k] (float32): (scale [n], codes + nmax [n, k] uint8).");
  m.def("qp", &qp, py::arg("x"), py::arg("w"), py::arg("nmax"),
        "ggml's make_qp_quants over non-negative blocks x, w [n, k] (float32): (scale [n], codes 0..nmax [n, k] "
        "uint8).");
  m.def("iq4_scales", &iq4_scales, py::arg("x"), py::arg("w"), py::arg("ntry") = 7,
        "The scale search of ggml's quantize_row_iq4_nl_impl over 32-element blocks x, w [n, 32]: float32 [n].");
  m.def("iq4_shifted_scales", &iq4_shifted_scales, py::arg("x"), py::arg("w"), py::arg("ntry") = 7,
        "iq4_xsh's scale search over 32-element blocks x, w [n, 32], on the iq4 grid and its shifted copy: "
        "float32 [n].");
  m.def("grid_scales", &grid_scales, py::arg("a"), py::arg("w"), py::arg("cand_val"), py::arg("starts"),
        py::arg("moves"),
        "The codebook types' scale search (iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s): for each row of magnitudes a and weights w [m, k] "
        "(k = 32, or iq2_xs's and iq2_s's 16), the best weighted "
        "least-squares scale over the places tried (starts, then moves around the best): float32 [m].");
  m.def("shifted_scales", &shifted_scales, py::arg("x"), py::arg("w"), py::arg("cand_val"), py::arg("starts"),
        py::arg("moves"), py::arg("delta"),
        "The ternary codebook's scale search (iq1_s: k = 32, one shift per row; iq1_m: k = 16, one per 8): for each "
        "row of signed weights x and weights w [m, k], the best weighted least-squares scale of the values g +- delta "
        "over the places tried: float32 [m].");
  m.def("grid_nearest", &grid_nearest, py::arg("u"), py::arg("w"), py::arg("cand_idx"), py::arg("cand_val"),
        py::arg("ternary") = false,
        "The codebook types' search: for each magnitude tuple u [m, D] under weights w [m, D], "
        "the candidate of its rounded tuple (D = 4: cand_idx [4096, 16], cand_val [4096, 4, 16]; D = 8: [6561, 16] and "
        "[6561, 8, 16]; ternary: iq1's signed -1, 0, 1 levels) of least weighted squared error: int32 [m].");
}
