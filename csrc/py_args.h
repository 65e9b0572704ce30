// Argument checks shared by the Python bindings of the matrix kernels.
#pragma once
#include <pybind11/numpy.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

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

}  // namespace ie
