// Argument checks shared by the Python bindings of the matrix kernels
// (bindings only: this header needs pybind11).
#pragma once
#include <pybind11/numpy.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/weight_types.h"

namespace ie {

// x is [cols] (batch 1) or [batch, cols] with 1 <= batch <= max_batch;
// returns the batch, or throws std::invalid_argument saying what is wrong.
inline int64_t activation_batch(const pybind11::array& x, int64_t cols, int64_t max_batch) {
  if (x.ndim() == 1) {
    if (x.shape(0) != cols)
      throw std::invalid_argument("x must have " + std::to_string(cols) + " elements, got " + std::to_string(x.shape(0)));
    return 1;
  }
  if (x.ndim() != 2)
    throw std::invalid_argument("x must be 1-D [cols] or 2-D [batch, cols], got " + std::to_string(x.ndim()) +
                                " dimensions");
  const int64_t batch = x.shape(0);
  if (x.shape(1) != cols)
    throw std::invalid_argument("x must be [batch, " + std::to_string(cols) + "], got [" + std::to_string(batch) +
                                ", " + std::to_string(x.shape(1)) + "]");
  if (batch < 1 || batch > max_batch)
    throw std::invalid_argument("x batch must be 1.." + std::to_string(max_batch) + ", got " + std::to_string(batch));
  return batch;
}

// The packed weights: any 1-D, contiguous buffer of bytes (a numpy uint8
// array, a slice of an np.memmap, bytes), never copied, holding exactly
// the bytes `s` needs. The returned buffer_info keeps the view alive while a
// kernel reads it. `what` names the tensor in the message.
inline pybind11::buffer_info weight_buffer(const pybind11::buffer& w, const WeightSpec& s,
                                           const std::string& what = "weights") {
  pybind11::buffer_info info = w.request();
  if (info.itemsize != 1 || (info.format != "B" && info.format != "b" && info.format != "c"))
    throw std::invalid_argument(what + " must be a 1-D uint8 array, got buffer format '" + info.format + "'");
  if (info.ndim != 1)
    throw std::invalid_argument(what + " must be a 1-D uint8 array, got " + std::to_string(info.ndim) + " dimensions");
  if (info.size > 1 && info.strides[0] != 1) throw std::invalid_argument(what + " must be a contiguous 1-D uint8 array");
  const size_t want = weight_nbytes(s);
  if (static_cast<size_t>(info.size) != want)
    throw std::invalid_argument(what + ": " + std::string(wtype_info(s.type).name) + " [" + std::to_string(s.rows) + ", " +
                                std::to_string(s.cols) + "] needs " + std::to_string(want) + " bytes, got " +
                                std::to_string(info.size));
  return info;
}

// The optional bias: null, or `rows` floats.
template <class FArray>
const float* bias_data(const std::optional<FArray>& bias, int64_t rows) {
  if (!bias) return nullptr;
  if (bias->ndim() != 1 || bias->shape(0) != rows)
    throw std::invalid_argument("bias must be 1-D with " + std::to_string(rows) + " elements");
  return bias->data();
}

// y shaped like x: [rows] for a 1-D x, else [batch, rows].
inline pybind11::array_t<float> gemv_output(const pybind11::array& x, int64_t batch, int64_t rows) {
  return x.ndim() == 1 ? pybind11::array_t<float>({rows}) : pybind11::array_t<float>({batch, rows});
}

// The checked operands of y = W x (+ bias) for a W of [rows, cols], as every
// product binding takes them: x [cols] or [batch <= max_batch, cols], the
// optional bias, threads >= 1; y allocated shaped like x. The raw pointers
// are for the kernel call with the GIL released.
struct ProductOperands {
  int64_t batch;
  const float* x;
  const float* bias;
  pybind11::array_t<float> y;
  float* yp;
};

template <class FArray>
ProductOperands product_operands(const FArray& x, const std::optional<FArray>& bias, int64_t rows, int64_t cols,
                                 int64_t max_batch, int threads) {
  const int64_t batch = activation_batch(x, cols, max_batch);
  const float* bp = bias_data(bias, rows);
  if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
  pybind11::array_t<float> y = gemv_output(x, batch, rows);
  float* yp = y.mutable_data();
  return {batch, x.data(), bp, std::move(y), yp};
}

}  // namespace ie
