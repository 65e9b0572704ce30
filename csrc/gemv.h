// Matrix-vector products y = W x (+ bias) with the weights kept in their
// stored format (float or packed 4/8-bit, docs/formats/quant.md) and
// dequantized inside the dot product; plus the bit-exact dequantizers.
//
// W is [rows, cols]; x is [batch, cols] float32 with 1 <= batch <= 8 (each
// weight row is read once for all batch rows); y is [batch, rows] float32.
// Accumulation is float32. Rows are split over `threads` OpenMP threads in
// contiguous ranges.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "isa.h"

namespace ie {

enum class WType { F32, F16, BF16, Int4w, Q4_0, Q4_1, Q8_0 };

// act=F32: x is used as given (the precise default).
// act=Int8: x is first quantized per 32-element block to int8 with one float
// scale (d = max|x| / 127, q = round_half_away(x * (1/d))), then the products
// are integer dot products (quantized weight formats only).
enum class Act { F32, Int8 };

constexpr int kMaxBatch = 8;

struct WeightSpec {
  WType type = WType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  // int4w: elements per scale (multiple of 32 dividing cols); blocks: 32; floats: 0
  bool symmetric = true;   // int4w only
  bool scale_f32 = false;  // int4w only: scales (and mins) stored as f32 instead of f16
};

const char* wtype_name(WType t);
bool is_quantized(WType t);

// Parses and validates a weight description. Throws std::invalid_argument
// with a one-line message naming the offending parameter.
WeightSpec make_weight_spec(const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size,
                            bool symmetric, const std::string& scale_dtype);
Act parse_act(const std::string& act);
const char* act_name(Act act);

// Bytes of the stored matrix.
size_t weight_nbytes(const WeightSpec& s);

// y[b * rows + r] = sum_c W[r][c] * x[b * cols + c] (+ bias[r]).
// `w` must hold weight_nbytes(s) bytes (any alignment). Throws
// std::invalid_argument for act/dtype combinations that do not exist.
void gemv(const WeightSpec& s, const uint8_t* w, const float* x, int batch, const float* bias, float* y,
          Act act, int threads, Isa isa);

// out[r * cols + c] = W[r][c] exactly as docs/formats/quant.md defines it
// (float32 arithmetic, no fused multiply-add).
void dequantize(const WeightSpec& s, const uint8_t* w, float* out);

// The act=int8 activation quantizer (n % 32 == 0): q[n], d[n / 32].
void quantize_act_q8(const float* x, int64_t n, int8_t* q, float* d, Isa isa);

struct GemvBench {
  double ms_median = 0, ms_min = 0, ms_mean = 0;
  size_t weight_bytes = 0;
  int copies = 0;
  int iters = 0;
  double checksum = 0;  // sum of the last y (keeps the work observable)
  std::vector<double> times_ms;  // every timed call, in order
};

// Times `iters` GEMVs over `copies` random weight matrices whose total size
// exceeds `min_bytes`, rotating through them so every call streams its
// weights from DRAM. Weights are first-touched by the same thread layout.
GemvBench bench_gemv(const WeightSpec& s, Act act, int threads, int batch, size_t min_bytes, int iters,
                     Isa isa);

}  // namespace ie
