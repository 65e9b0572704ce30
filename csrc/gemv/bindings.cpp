// Python bindings of the GEMV family: gemv, dequantize, the int8 activation
// quantizer and the DRAM-streaming benchmark. Every binding that touches
// bulk memory releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "common/py_args.h"
#include "cuda/repack.h"
#include "gemv.h"

namespace py = pybind11;

namespace {

using FArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

py::array_t<float> gemv_py(const py::buffer& w, const std::string& dtype, int64_t rows, int64_t cols, FArray x,
                           std::optional<FArray> bias, int64_t group_size, bool symmetric,
                           const std::string& scale_dtype, double tensor_scale, const std::string& act, int threads,
                           const std::string& isa_name, const std::string& layout) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const ie::Act a = ie::parse_act(act);
  const ie::Isa isa = ie::resolve_isa(isa_name);
  const ie::Layout l = ie::parse_layout(layout, s, a, isa);
  const py::buffer_info wb = ie::weight_buffer(w, s);
  ie::ProductOperands o = ie::product_operands(x, bias, rows, cols, ie::max_batch(l != ie::Layout::Stored), threads);
  const uint8_t* wp = static_cast<const uint8_t*>(wb.ptr);
  {
    py::gil_scoped_release nogil;
    ie::ThreadPool pool(threads);
    const ie::Rows8 packed = l == ie::Layout::Rows8 ? ie::pack_rows8(s, wp, pool) : ie::Rows8();
    ie::PreparedAct xa;
    xa.set(o.x, static_cast<int>(o.batch), s.cols);
    ie::GemvScratch scratch;
    if (l == ie::Layout::Packing)
      ie::gemv_packing(s, wp, xa, o.bias, o.yp, pool, isa, scratch);
    else
      ie::gemv(s, wp, xa, o.bias, o.yp, a, pool, isa, scratch, l == ie::Layout::Rows8 ? &packed : nullptr);
  }
  return o.y;
}

py::array_t<float> dequantize_py(const py::buffer& w, const std::string& dtype, int64_t rows, int64_t cols,
                                 int64_t group_size, bool symmetric, const std::string& scale_dtype, double tensor_scale) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const py::buffer_info wb = ie::weight_buffer(w, s);
  py::array_t<float> out({rows, cols});
  const uint8_t* wp = static_cast<const uint8_t*>(wb.ptr);
  float* op = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    ie::dequantize(s, wp, op);
  }
  return out;
}

py::tuple quantize_act_q8_py(FArray x, const std::string& isa_name, int block) {
  const ie::Isa isa = ie::resolve_isa(isa_name);
  if (x.ndim() != 1) throw std::invalid_argument("x must be 1-D");
  const int64_t n = x.shape(0);
  if (block != 32 && block != 256) throw std::invalid_argument("block must be 32 or 256, got " + std::to_string(block));
  if (n % block != 0)
    throw std::invalid_argument("x length must be a multiple of " + std::to_string(block) + ", got " + std::to_string(n));
  py::array_t<int8_t> q({n});
  py::array_t<float> d({n / 32});
  const float* xp = x.data();
  int8_t* qp = q.mutable_data();
  float* dp = d.mutable_data();
  {
    py::gil_scoped_release nogil;
    ie::quantize_act_q8(xp, n, qp, dp, isa, block);
  }
  return py::make_tuple(q, d);
}

py::dict bench_gemv_py(const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size, bool symmetric,
                       const std::string& scale_dtype, double tensor_scale, const std::string& act, int threads, int batch,
                       size_t min_bytes, int iters, const std::string& isa_name, const std::string& layout) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const ie::Act a = ie::parse_act(act);
  const ie::Isa isa = ie::resolve_isa(isa_name);
  const ie::Layout l = ie::parse_layout(layout, s, a, isa);
  if (a == ie::Act::Int8 && !ie::wtype_info(s.type).int8_act)
    throw std::invalid_argument("act='int8' applies to " + ie::wtype_names(false, true, "and") + " weights, not " + dtype);
  ie::GemvBench r;
  {
    py::gil_scoped_release nogil;
    r = ie::bench_gemv(s, a, threads, batch, min_bytes, iters, isa, l);
  }
  py::dict out;
  out["dtype"] = dtype;
  out["rows"] = rows;
  out["cols"] = cols;
  out["group_size"] = s.group_size;
  out["symmetric"] = s.symmetric;
  out["scale_dtype"] = s.scale_f32 ? "f32" : "f16";
  out["act"] = ie::act_name(a);
  out["layout"] = layout;
  out["threads"] = threads;
  out["batch"] = batch;
  out["isa"] = ie::isa_name(ie::gemv_kernel_isa(isa));
  out["ms_median"] = r.ms_median;
  out["ms_min"] = r.ms_min;
  out["ms_mean"] = r.ms_mean;
  out["weight_bytes"] = r.weight_bytes;
  out["copies"] = r.copies;
  out["iters"] = r.iters;
  out["gbps"] = static_cast<double>(r.weight_bytes) / (r.ms_median * 1e-3) / 1e9;
  out["gbps_best"] = static_cast<double>(r.weight_bytes) / (r.ms_min * 1e-3) / 1e9;
  out["checksum"] = r.checksum;
  out["times_ms"] = r.times_ms;
  return out;
}

// The CUDA upload's repack (cuda/repack.h), portable so the CPU tests
// check it: (twin WeightSpec, its bytes), or None when s is read as stored.
py::object repack_planar_py(const py::buffer& w, const std::string& dtype, int64_t rows, int64_t cols) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, 0, true, "f16");
  const py::buffer_info wb = ie::weight_buffer(w, s);
  ie::WeightSpec twin;
  if (!ie::cuda::planar_twin(s, &twin)) return py::none();
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(ie::weight_nbytes(twin)));
  const uint8_t* wp = static_cast<const uint8_t*>(wb.ptr);
  uint8_t* op = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    ie::cuda::repack_planar(s, wp, op);
  }
  return py::make_tuple(twin, out);
}

}  // namespace

void ie_register_gemv(py::module_& m) {
  m.def("gemv", &gemv_py, py::arg("w"), py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("x"),
        py::arg("bias") = py::none(), py::arg("group_size") = 0, py::arg("symmetric") = true,
        py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0, py::arg("act") = "f32", py::arg("threads") = 1, py::arg("isa") = "",
        py::arg("layout") = "stored",
        "y = W x (+ bias) with W kept packed (w: 1-D uint8 buffer, not copied). x [cols] -> y [rows]; "
        "x [b, cols] (b <= MAX_BATCH; MAX_ROWS8_BATCH with layout='rows8' or 'packing') -> y [b, rows]. act='int8' quantizes x "
        "per 32 to int8 first (faster). layout='rows8' reads a row-interleaved copy (the decoder's int8 path; packed per call "
        "here); 'packing' runs the same kernels over the stored bytes, each thread packing the tiles it multiplies next "
        "(a decoder's experts in prefill): the same y bit for bit.");
  m.def("dequantize", &dequantize_py, py::arg("w"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        py::arg("group_size") = 0, py::arg("symmetric") = true, py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0,
        "W as float32 [rows, cols], bit-exact with docs/formats/quant.md.");
  m.def("repack_planar", &repack_planar_py, py::arg("w"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        "The CUDA upload's repack of q4_0 / q4_1 into int4w planes: (WeightSpec, uint8 bytes), or None for a "
        "type read as stored (docs/cuda.md).");
  m.def("quantize_act_q8", &quantize_act_q8_py, py::arg("x"), py::arg("isa") = "", py::arg("block") = 32,
        "The act='int8' activation quantizer, one scale per `block` (32 or 256: a weight type's act_block) "
        "elements: (q int8 [n], d float32 [n/32], each 32-block's).");
  // The most activation rows one call takes: the stored layout's, and rows8's (a decoder's int8 prefill chunk).
  m.attr("MAX_BATCH") = ie::max_batch(false);
  m.attr("MAX_ROWS8_BATCH") = ie::max_batch(true);
  m.def("bench_gemv", &bench_gemv_py, py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("group_size") = 0,
        py::arg("symmetric") = true, py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0, py::arg("act") = "f32", py::arg("threads") = 1,
        py::arg("batch") = 1, py::arg("min_bytes") = size_t(256) << 20, py::arg("iters") = 20, py::arg("isa") = "",
        py::arg("layout") = "stored",
        "Time GEMVs over enough random weight copies (> min_bytes) that each call streams from DRAM.");
}
