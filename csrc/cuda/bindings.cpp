// Python bindings of the CUDA kernels (`_native.cuda_*`; docs/cuda.md),
// built only with -DIE_ENABLE_CUDA=ON. Each call uploads its operands,
// runs on the default stream and copies the result back: the verification
// and benchmark entry points. (The decoder keeps its weights on the device
// across calls: decoder/bindings.cpp.) Every argument is checked as the CPU
// bindings check it (common/py_args.h) before anything reaches the device.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "bsr/bsr.h"
#include "common/py_args.h"
#include "cuda/bench.h"
#include "cuda/bsr.h"
#include "cuda/dedup.h"
#include "cuda/gemv.h"

namespace py = pybind11;

namespace {

using FArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

void require_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    throw std::runtime_error("CUDA: no CUDA device is visible to this process");
  }
}

// x and bias on the device, y allocated there, for one product call.
struct DeviceOperands {
  ie::cuda::DeviceBuffer x, bias, y;
};

DeviceOperands upload_operands(const ie::ProductOperands& o, int64_t rows, int64_t cols) {
  DeviceOperands d;
  d.x = ie::cuda::to_device(o.x, 4 * static_cast<size_t>(o.batch * cols));
  if (o.bias) d.bias = ie::cuda::to_device(o.bias, 4 * static_cast<size_t>(rows));
  d.y = ie::cuda::DeviceBuffer(4 * static_cast<size_t>(o.batch * rows));
  return d;
}

py::array_t<float> gemv_py(const py::buffer& w, const std::string& dtype, int64_t rows, int64_t cols, FArray x,
                           std::optional<FArray> bias, int64_t group_size, bool symmetric,
                           const std::string& scale_dtype, double tensor_scale) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const py::buffer_info wb = ie::weight_buffer(w, s);
  ie::ProductOperands o = ie::product_operands(x, bias, rows, cols, ie::cuda::kMaxBatch, 1);
  require_device();
  {
    py::gil_scoped_release nogil;
    const ie::cuda::DeviceMatrix m = ie::cuda::upload_matrix(s, static_cast<const uint8_t*>(wb.ptr));
    DeviceOperands d = upload_operands(o, rows, cols);
    ie::cuda::gemv(m, d.x.as<float>(), static_cast<int>(o.batch), o.bias ? d.bias.as<float>() : nullptr,
                   d.y.as<float>(), nullptr);
    d.y.download(o.yp, d.y.size());
  }
  return o.y;
}

py::array_t<float> dequantize_py(const py::buffer& w, const std::string& dtype, int64_t rows, int64_t cols,
                                 int64_t group_size, bool symmetric, const std::string& scale_dtype, double tensor_scale) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  const py::buffer_info wb = ie::weight_buffer(w, s);
  py::array_t<float> out({rows, cols});
  float* op = out.mutable_data();
  require_device();
  {
    py::gil_scoped_release nogil;
    const ie::cuda::DeviceMatrix m = ie::cuda::upload_matrix(s, static_cast<const uint8_t*>(wb.ptr));
    ie::cuda::DeviceBuffer d(4 * static_cast<size_t>(rows) * static_cast<size_t>(cols));
    ie::cuda::dequantize(m, d.as<float>(), nullptr);
    d.download(op, d.size());
  }
  return out;
}

py::dict bench_gemv_py(const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size, bool symmetric,
                       const std::string& scale_dtype, double tensor_scale, int batch, size_t min_bytes, int iters, int split,
                       int rows_per_group) {
  const ie::WeightSpec s = ie::make_weight_spec(dtype, rows, cols, group_size, symmetric, scale_dtype, tensor_scale);
  require_device();
  ie::cuda::GemvBench r;
  {
    py::gil_scoped_release nogil;
    r = ie::cuda::bench_gemv(s, batch, min_bytes, iters, ie::cuda::GemvTuning{split, rows_per_group});
  }
  py::dict out;
  out["kernel"] = r.kernel;
  out["group_size"] = s.group_size;
  out["symmetric"] = s.symmetric;
  out["scale_dtype"] = s.scale_f32 ? "f32" : "f16";
  out["ms_median"] = r.ms_median;
  out["ms_min"] = r.ms_min;
  out["weight_bytes"] = r.weight_bytes;
  out["copies"] = r.copies;
  out["iters"] = r.iters;
  out["split"] = split;
  out["rows_per_group"] = rows_per_group;
  out["checksum"] = r.checksum;
  out["times_ms"] = r.times_ms;
  return out;
}

py::array_t<uint8_t> dedup_reconstruct_py(ie::dedup::DedupStore& store, const std::string& name) {
  if (!store.contains(name)) throw py::key_error(name);
  const ie::dedup::MemberView v = store.view(name);
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(v.nbytes));
  uint8_t* op = out.mutable_data();
  require_device();
  {
    py::gil_scoped_release nogil;
    const ie::cuda::DeviceMember m = ie::cuda::upload_member(v);
    ie::cuda::DeviceBuffer d(v.nbytes);
    ie::cuda::reconstruct(m, d.as<uint8_t>(), nullptr);
    d.download(op, v.nbytes);
  }
  return out;
}

using U32Array = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;

py::array_t<float> bsr_gemv_py(uint64_t rows, uint64_t cols, uint64_t block_rows, uint64_t block_cols, U32Array row_ptr,
                               U32Array col_idx, FArray values, FArray x, std::optional<FArray> bias) {
  ie::BsrMatrix h;
  ie::BsrError err;
  // Re-checked by the same rules as a file (non-finite values were the
  // caller's choice when it loaded the matrix, so they pass here).
  if (ie::bsr_from_arrays(rows, cols, block_rows, block_cols, row_ptr.data(), row_ptr.size(), col_idx.data(),
                          col_idx.size(), values.data(), values.size(), true, &h, &err) != ie::BsrStatus::Ok)
    throw std::invalid_argument("bsr: " + err.field + ": " + err.message);
  ie::ProductOperands o = ie::product_operands(x, bias, static_cast<int64_t>(rows), static_cast<int64_t>(cols),
                                               ie::kBsrMaxBatch, 1);
  require_device();
  {
    py::gil_scoped_release nogil;
    const ie::cuda::DeviceBsr m = ie::cuda::upload_bsr(h);
    DeviceOperands d = upload_operands(o, static_cast<int64_t>(rows), static_cast<int64_t>(cols));
    ie::cuda::bsr_gemv(m, d.x.as<float>(), static_cast<int>(o.batch), o.bias ? d.bias.as<float>() : nullptr,
                       d.y.as<float>(), nullptr);
    d.y.download(o.yp, d.y.size());
  }
  return o.y;
}

}  // namespace

void ie_register_cuda(py::module_& m) {
  m.def(
      "cuda_copy_gbps",
      [](size_t nbytes, int iters) {
        require_device();
        py::gil_scoped_release nogil;
        return ie::cuda::copy_gbps(nbytes, iters);
      },
      py::arg("nbytes") = size_t(1) << 30, py::arg("iters") = 20,
      "Device-to-device copy bandwidth, GB/s of bytes read + written (median of `iters` copies of `nbytes`).");
  m.def("cuda_gemv", &gemv_py, py::arg("w"), py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("x"),
        py::arg("bias") = py::none(), py::arg("group_size") = 0, py::arg("symmetric") = true,
        py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0,
        "gemv() on the CUDA device: W uploaded (q4_0/q4_1 repacked to planes), y = W x (+ bias), float32 "
        "accumulation; x [cols] or [b <= 8, cols].");
  m.def("cuda_dequantize", &dequantize_py, py::arg("w"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        py::arg("group_size") = 0, py::arg("symmetric") = true, py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0,
        "dequantize() on the CUDA device: bit-exact with docs/formats/quant.md.");
  m.def("cuda_bench_gemv", &bench_gemv_py, py::arg("dtype"), py::arg("rows"), py::arg("cols"),
        py::arg("group_size") = 0, py::arg("symmetric") = true, py::arg("scale_dtype") = "f16", py::arg("tensor_scale") = 1.0, py::arg("batch") = 1,
        py::arg("min_bytes") = size_t(512) << 20, py::arg("iters") = 20, py::arg("split") = 0,
        py::arg("rows_per_group") = 0,
        "Time device GEMVs over enough weight copies (> min_bytes) that no call finds its weights in L2; "
        "split (warps per row group) and rows_per_group are tuning knobs, 0 = the kernel's default.");
  m.def("cuda_dedup_reconstruct", &dedup_reconstruct_py, py::arg("store"), py::arg("name"),
        "Member `name` of `store` rebuilt on the CUDA device from its uploaded blobs (uint8 [nbytes]).");
  m.def("cuda_bsr_gemv", &bsr_gemv_py, py::arg("rows"), py::arg("cols"), py::arg("block_rows"), py::arg("block_cols"),
        py::arg("row_ptr"), py::arg("col_idx"), py::arg("values"), py::arg("x"), py::arg("bias") = py::none(),
        "BSR y = A x (+ bias) on the CUDA device, from a BsrMatrix's arrays (checked again here).");
}
