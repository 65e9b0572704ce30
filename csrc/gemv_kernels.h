// Internal interface between the GEMV driver (gemv.cpp) and the per-ISA
// kernel files (gemv_scalar.cpp = reference, gemv_avx2.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemv.h"

namespace ie {

// Byte geometry of a stored weight matrix (docs/formats/quant.md).
struct WeightLayout {
  size_t row_bytes = 0;    // floats and llama.cpp blocks: one row; int4w: one row of the qs plane
  size_t block_bytes = 0;  // q4_0 18, q4_1 20, q8_0 34 (0 otherwise)
  size_t block_qs = 0;     // offset of the codes inside a block (2, 4, 2)
  int64_t groups = 0;      // int4w: groups per row (G)
  size_t scale_bytes = 0;  // int4w: 2 (f16) or 4 (f32)
  size_t scales_off = 0;   // int4w: offset of the scales plane
  size_t mins_off = 0;     // int4w affine: offset of the mins plane
  size_t nbytes = 0;
};

WeightLayout weight_layout(const WeightSpec& s);

struct GemvArgs {
  WeightSpec spec;
  WeightLayout lay;
  const uint8_t* w = nullptr;
  const float* x = nullptr;  // [batch, cols]
  int batch = 1;
  const float* bias = nullptr;  // [rows] or null
  float* y = nullptr;           // [batch, rows]
  Act act = Act::F32;
  int threads = 1;
};

// Thread t's rows [*r0, *r1) of nt: contiguous ranges whose boundaries are
// multiples of `align` rows, so each thread streams one run of every plane.
void thread_rows(int64_t rows, int align, int t, int nt, int64_t* r0, int64_t* r1);

// Decodes W[r][c0 .. c0 + n) into out exactly as dequantize() defines it.
// For quantized formats c0 % 32 == 0 and n == 32.
void dequant_span(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t c0,
                  int n, float* out);

// act=int8 activation quantizers; must agree bit for bit.
void quantize_q8_scalar(const float* x, int64_t n, int8_t* q, float* d);
void gemv_scalar(const GemvArgs& a);

#if IE_HAVE_X86
void quantize_q8_avx2(const float* x, int64_t n, int8_t* q, float* d);
void gemv_avx2(const GemvArgs& a);
#endif

}  // namespace ie
