// GEMV driver: weight descriptions, byte layouts, ISA dispatch, and the
// bit-exact dequantizers (scalar; this file is built with -ffp-contract=off
// like the whole target, so a * b + c is never fused).
#include "gemv.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "gemv_kernels.h"
#include "half.h"

namespace ie {

namespace {

struct WTypeName {
  WType type;
  const char* name;
};
constexpr WTypeName kWTypes[] = {{WType::F32, "f32"},     {WType::F16, "f16"},   {WType::BF16, "bf16"},
                                 {WType::Int4w, "int4w"}, {WType::Q4_0, "q4_0"}, {WType::Q4_1, "q4_1"},
                                 {WType::Q8_0, "q8_0"}};

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

const char* wtype_name(WType t) {
  for (const auto& e : kWTypes)
    if (e.type == t) return e.name;
  return "?";
}

bool is_quantized(WType t) { return t == WType::Int4w || t == WType::Q4_0 || t == WType::Q4_1 || t == WType::Q8_0; }

WeightSpec make_weight_spec(const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size,
                            bool symmetric, const std::string& scale_dtype) {
  WeightSpec s;
  bool found = false;
  for (const auto& e : kWTypes) {
    if (dtype == e.name) {
      s.type = e.type;
      found = true;
    }
  }
  if (!found) fail("unknown weight dtype '" + dtype + "' (expected f32, f16, bf16, int4w, q4_0, q4_1 or q8_0)");
  if (rows < 1 || cols < 1)
    fail(dtype + ": rows and cols must be positive, got [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  s.rows = rows;
  s.cols = cols;
  if (is_quantized(s.type) && cols % 32 != 0)
    fail(dtype + ": cols must be a multiple of 32, got " + std::to_string(cols));
  switch (s.type) {
    case WType::F32:
    case WType::F16:
    case WType::BF16:
      if (group_size != 0) fail(dtype + ": group_size applies to int4w only, got " + std::to_string(group_size));
      break;
    case WType::Q4_0:
    case WType::Q4_1:
    case WType::Q8_0:
      if (group_size != 0 && group_size != 32)
        fail(dtype + " has fixed 32-element blocks; group_size must be 0 or 32, got " + std::to_string(group_size));
      s.group_size = 32;
      break;
    case WType::Int4w:
      // docs/formats/quant.md names 32, 64, 128 and cols; any multiple of 32 dividing cols works.
      if (group_size <= 0) fail("int4w needs group_size (32, 64, 128 or cols)");
      if (group_size % 32 != 0)
        fail("int4w group_size must be a multiple of 32, got " + std::to_string(group_size));
      if (cols % group_size != 0)
        fail("int4w group_size " + std::to_string(group_size) + " does not divide cols " + std::to_string(cols));
      s.group_size = group_size;
      s.symmetric = symmetric;
      if (scale_dtype == "f16") s.scale_f32 = false;
      else if (scale_dtype == "f32") s.scale_f32 = true;
      else fail("int4w scale_dtype must be 'f16' or 'f32', got '" + scale_dtype + "'");
      break;
  }
  return s;
}

Act parse_act(const std::string& act) {
  if (act == "f32" || act.empty()) return Act::F32;
  if (act == "int8") return Act::Int8;
  fail("act must be 'f32' or 'int8', got '" + act + "'");
}

const char* act_name(Act act) { return act == Act::Int8 ? "int8" : "f32"; }

WeightLayout weight_layout(const WeightSpec& s) {
  WeightLayout l;
  const size_t rows = static_cast<size_t>(s.rows), cols = static_cast<size_t>(s.cols);
  switch (s.type) {
    case WType::F32: l.row_bytes = cols * 4; break;
    case WType::F16:
    case WType::BF16: l.row_bytes = cols * 2; break;
    case WType::Q4_0: l.block_bytes = 18; l.block_qs = 2; break;
    case WType::Q4_1: l.block_bytes = 20; l.block_qs = 4; break;
    case WType::Q8_0: l.block_bytes = 34; l.block_qs = 2; break;
    case WType::Int4w:
      l.row_bytes = cols / 2;
      l.groups = s.cols / s.group_size;
      l.scale_bytes = s.scale_f32 ? 4 : 2;
      l.scales_off = rows * l.row_bytes;
      l.mins_off = l.scales_off + rows * static_cast<size_t>(l.groups) * l.scale_bytes;
      l.nbytes = l.mins_off + (s.symmetric ? 0 : rows * static_cast<size_t>(l.groups) * l.scale_bytes);
      return l;
  }
  if (l.block_bytes) l.row_bytes = cols / 32 * l.block_bytes;
  l.nbytes = rows * l.row_bytes;
  return l;
}

size_t weight_nbytes(const WeightSpec& s) { return weight_layout(s).nbytes; }

void thread_rows(int64_t rows, int align, int t, int nt, int64_t* r0, int64_t* r1) {
  const int64_t units = (rows + align - 1) / align;
  *r0 = std::min(rows, units * t / nt * align);
  *r1 = std::min(rows, units * (t + 1) / nt * align);
}

void dequant_span(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t c0, int n,
                  float* out) {
  const uint8_t* row = w + static_cast<size_t>(r) * lay.row_bytes;
  switch (s.type) {
    case WType::F32:
      std::memcpy(out, row + c0 * 4, static_cast<size_t>(n) * 4);
      return;
    case WType::F16:
      for (int j = 0; j < n; ++j) out[j] = f16_to_f32(load_u16(row + (c0 + j) * 2));
      return;
    case WType::BF16:
      for (int j = 0; j < n; ++j) out[j] = bf16_to_f32(load_u16(row + (c0 + j) * 2));
      return;
    case WType::Int4w: {
      const uint8_t* qs = row + c0 / 2;
      const size_t gi = static_cast<size_t>(r) * lay.groups + c0 / s.group_size;
      const uint8_t* sp = w + lay.scales_off + gi * lay.scale_bytes;
      const uint8_t* mp = w + lay.mins_off + gi * lay.scale_bytes;
      const float sc = s.scale_f32 ? load_f32(sp) : f16_to_f32(load_u16(sp));
      if (s.symmetric) {
        for (int j = 0; j < 16; ++j) {
          out[j] = sc * static_cast<float>((qs[j] & 0xF) - 8);
          out[j + 16] = sc * static_cast<float>((qs[j] >> 4) - 8);
        }
      } else {
        const float m = s.scale_f32 ? load_f32(mp) : f16_to_f32(load_u16(mp));
        for (int j = 0; j < 16; ++j) {
          out[j] = sc * static_cast<float>(qs[j] & 0xF) + m;
          out[j + 16] = sc * static_cast<float>(qs[j] >> 4) + m;
        }
      }
      return;
    }
    case WType::Q4_0:
    case WType::Q4_1: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const uint8_t* qs = blk + lay.block_qs;
      const float d = f16_to_f32(load_u16(blk));
      if (s.type == WType::Q4_0) {
        for (int j = 0; j < 16; ++j) {
          out[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
          out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
      } else {
        const float m = f16_to_f32(load_u16(blk + 2));
        for (int j = 0; j < 16; ++j) {
          out[j] = d * static_cast<float>(qs[j] & 0xF) + m;
          out[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
        }
      }
      return;
    }
    case WType::Q8_0: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const float d = f16_to_f32(load_u16(blk));
      for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      return;
    }
  }
}

void dequantize(const WeightSpec& s, const uint8_t* w, float* out) {
  const WeightLayout lay = weight_layout(s);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t c0 = 0; c0 < s.cols; c0 += 32) {
      const int n = static_cast<int>(std::min<int64_t>(32, s.cols - c0));
      dequant_span(s, lay, w, r, c0, n, out + r * s.cols + c0);
    }
  }
}

void quantize_act_q8(const float* x, int64_t n, int8_t* q, float* d, Isa isa) {
  if (n % 32 != 0) fail("int8 activation quantization needs a multiple of 32 elements, got " + std::to_string(n));
#if IE_HAVE_X86
  if (isa >= Isa::Avx2) return quantize_q8_avx2(x, n, q, d);
#endif
  (void)isa;
  quantize_q8_scalar(x, n, q, d);
}

void gemv(const WeightSpec& s, const uint8_t* w, const float* x, int batch, const float* bias, float* y, Act act,
          int threads, Isa isa) {
  if (batch < 1 || batch > kMaxBatch)
    fail("batch must be 1.." + std::to_string(kMaxBatch) + ", got " + std::to_string(batch));
  if (threads < 1) fail("threads must be >= 1, got " + std::to_string(threads));
  if (act == Act::Int8 && !is_quantized(s.type))
    fail(std::string("act='int8' applies to int4w, q4_0, q4_1 and q8_0 weights, not ") + wtype_name(s.type));
  GemvArgs a;
  a.spec = s;
  a.lay = weight_layout(s);
  a.w = w;
  a.x = x;
  a.batch = batch;
  a.bias = bias;
  a.y = y;
  a.act = act;
  a.threads = threads;
#if IE_HAVE_X86
  if (isa >= Isa::Avx2) return gemv_avx2(a);
#endif
  (void)isa;
  gemv_scalar(a);
}

}  // namespace ie
