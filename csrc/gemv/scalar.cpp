// Scalar reference GEMV kernels: the readable definition every SIMD variant
// is tested against. One row at a time; each 32-element span of the row is
// dequantized exactly as dequantize() does (into a 32-float buffer, never
// the whole matrix) and dotted with every activation row.

#include <algorithm>
#include <limits>
#include <cmath>

#include "common/errors.h"
#include "common/half.h"
#include "kernels.h"

namespace ie {

namespace {

// Non-finite activations (NaN weights upstream) are defined, not UB, and the
// same in every variant: amax skips NaN; a product x * (1/d) that is not
// finite (x NaN; x = +-inf where d is inf; any x where d is subnormal and
// 1/d overflows) codes as -128, what the SIMD conversion yields. The logits
// are then non-finite (or the block negligible), which the runtime reports.
// block: elements per scale (32, or 256: act_block); d holds each 32-block's.
void quantize_q8_scalar(const float* x, int64_t n, int8_t* q, float* d, int block) {
  for (int64_t s = 0; s < n; s += block) {
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < block; ++j) {
      amax = std::max(amax, std::fabs(x[s + j]));
      finite = finite && std::isfinite(x[s + j]);
    }
    // not finite: NaN scale, zero codes (the non-finite value reaches every product, never laundered)
    const float db = finite ? amax / 127.f : std::numeric_limits<float>::quiet_NaN();
    const float id = db != 0.f ? 1.f / db : 0.f;
    for (int64_t b = s / 32; b < (s + block) / 32; ++b) {
      d[b] = db;
      for (int j = 0; j < 32; ++j) {  // a subnormal d makes id inf: such v are not finite (AVX2's cvtt gives -128)
        const float v = x[b * 32 + j] * id;
        q[b * 32 + j] = !finite ? int8_t(0) : std::isfinite(v) ? static_cast<int8_t>(std::round(v)) : int8_t(-128);
      }
    }
  }
}

// act=f32: y[b] = sum over 32-element spans of (sum_j w_j x_j), float32.
void row_f32(const GemvArgs& a, int64_t r, float* acc) {
  const int64_t cols = a.spec.cols;
  float w[32];
  for (int64_t c0 = 0; c0 < cols; c0 += 32) {
    const int n = static_cast<int>(std::min<int64_t>(32, cols - c0));
    decode_span(a.spec, a.lay, a.w, r, c0, n, w);
    for (int b = 0; b < a.batch; ++b) {
      const float* xb = a.x + b * cols + c0;
      float p = 0.f;
      for (int j = 0; j < n; ++j) p += w[j] * xb[j];
      acc[b] += p;
    }
  }
}

// The integer codes of one 32-element block and its (scale, min):
// w_j = scale * (code_j - zero) + min, with zero = 8 for symmetric 4-bit
// (q6_k: 32, q3_k: 4; the 16-element sub-blocks of q6_k, q3_k and q2_k
// split the block: scale_hi and min_hi for elements 16..31).
struct Block {
  int code[32];
  int zero;
  float scale, min;
  bool split = false;
  float scale_hi = 0.f, min_hi = 0.f;
};

Block load_block(const GemvArgs& a, int64_t r, int64_t blk) {
  const WeightSpec& s = a.spec;
  const WeightLayout& l = a.lay;
  Block k{};
  const uint8_t* qs = nullptr;  // the nibble types' 16 code bytes, unpacked below
  switch (s.type) {
    case WType::Q4_K:
    case WType::Q5_K: {
      const uint8_t* p = a.w + r * l.row_bytes + blk / 8 * l.block_bytes;
      const int j = static_cast<int>(blk % 8);
      const Q4kSub sub = q4k_sub(p, j);
      k.scale = sub.scale;
      k.min = -sub.min;
      k.zero = 0;
      for (int e = 0; e < 32; ++e) k.code[e] = s.type == WType::Q4_K ? q4k_code(p, j, e) : q5k_code(p, j, e);
      return k;
    }
    case WType::Q6_K:
    case WType::Q3_K: {
      const uint8_t* p = a.w + r * l.row_bytes + blk / 8 * l.block_bytes;
      const int j = static_cast<int>(blk % 8);
      const bool q6 = s.type == WType::Q6_K;
      k.split = true;
      k.scale = q6 ? q6k_scale(p, 2 * j) : q3k_scale(p, 2 * j);
      k.scale_hi = q6 ? q6k_scale(p, 2 * j + 1) : q3k_scale(p, 2 * j + 1);
      k.zero = q6 ? 32 : 4;
      for (int e = 0; e < 32; ++e) k.code[e] = q6 ? q6k_code(p, 32 * j + e) : q3k_code(p, 32 * j + e);
      return k;
    }
    case WType::Q2_K: {
      const uint8_t* p = a.w + r * l.row_bytes + blk / 8 * l.block_bytes;
      const int j = static_cast<int>(blk % 8);
      const Q4kSub lo = q2k_sub(p, 2 * j), hi = q2k_sub(p, 2 * j + 1);
      k.split = true;
      k.scale = lo.scale;
      k.min = -lo.min;
      k.scale_hi = hi.scale;
      k.min_hi = -hi.min;
      k.zero = 0;
      for (int e = 0; e < 32; ++e) k.code[e] = q2k_code(p, 32 * j + e);
      return k;
    }
    case WType::IQ3_S:
    case WType::IQ3_XXS:
    case WType::IQ2_XXS: {  // the signed codebook values as codes: zero 0, min 0
      const uint8_t* p = a.w + r * l.row_bytes + blk / 8 * l.block_bytes;
      k.scale = codebook_sub(s.type, p, static_cast<int>(blk % 8), k.code);
      return k;
    }
    case WType::IQ2_XS:
    case WType::IQ2_S:
    case WType::IQ1_S:
    case WType::IQ1_M: {  // the same, a scale per half
      const uint8_t* p = a.w + r * l.row_bytes + blk / 8 * l.block_bytes;
      float sc[2];
      half_sub(s.type, p, static_cast<int>(blk % 8), k.code, sc);
      k.split = true;
      k.scale = sc[0];
      k.scale_hi = sc[1];
      return k;
    }
    case WType::NVFP4: {  // the table values as codes under the scales of the 32-block's two halves
      const uint8_t* p = a.w + r * l.row_bytes + blk / 2 * l.block_bytes;
      const int h = static_cast<int>(blk % 2);
      k.split = true;
      k.scale = ue4m3_half(p[2 * h]) * s.scale;
      k.scale_hi = ue4m3_half(p[2 * h + 1]) * s.scale;
      for (int t = 0; t < 2; ++t) {
        const uint8_t* q = p + kNvfp4Qs + 8 * (2 * h + t);
        for (int j = 0; j < 8; ++j) {
          k.code[16 * t + j] = mxfp4_value(q[j] & 0xF);
          k.code[16 * t + j + 8] = mxfp4_value(q[j] >> 4);
        }
      }
      return k;
    }
    case WType::IQ4_NL:
    case WType::IQ4_XS:
    case WType::IQ4_XSH:
    case WType::MXFP4: {
      // the table values (iq4_xsh: on its sub-block's grid) as codes: zero 0, min 0
      const int64_t per = s.group_size / 32;  // 32-blocks per stored block
      const uint8_t* p = a.w + r * l.row_bytes + blk / per * l.block_bytes;
      const int j = static_cast<int>(blk % per);
      k.scale = grid_sub_scale(s.type, p, j);
      const int shift = grid_shift(s.type, p, j);
      const int8_t* values = grid_values(s.type);
      qs = p + l.block_qs + 16 * j;
      for (int e = 0; e < 16; ++e) {
        k.code[e] = values[qs[e] & 0xF] + shift;
        k.code[e + 16] = values[qs[e] >> 4] + shift;
      }
      return k;
    }
    case WType::Q1_0: {  // the 32-block's signs as codes +-1 under its 128-block's d
      const uint8_t* p = a.w + r * l.row_bytes + blk / 4 * l.block_bytes;
      const uint32_t bits = q1_signs(p, static_cast<int>(blk % 4));
      k.scale = f16_to_f32(load_u16(p));
      for (int e = 0; e < 32; ++e) k.code[e] = (bits >> e & 1u) ? 1 : -1;
      return k;
    }
    case WType::Int4w: {
      qs = a.w + r * l.row_bytes + blk * 16;
      const size_t gi = static_cast<size_t>(r) * l.groups + blk * 32 / s.group_size;
      const uint8_t* sp = a.w + l.scales_off + gi * l.scale_bytes;
      const uint8_t* mp = a.w + l.mins_off + gi * l.scale_bytes;
      k.scale = s.scale_f32 ? load_f32(sp) : f16_to_f32(load_u16(sp));
      k.min = s.symmetric ? 0.f : (s.scale_f32 ? load_f32(mp) : f16_to_f32(load_u16(mp)));
      k.zero = s.symmetric ? 8 : 0;
      break;
    }
    case WType::Q4_0:
    case WType::Q4_1:
    case WType::Q5_0:
    case WType::Q5_1:
    case WType::Q8_0: {
      const uint8_t* p = a.w + r * l.row_bytes + blk * l.block_bytes;
      k.scale = f16_to_f32(load_u16(p));
      k.min = s.type == WType::Q4_1 || s.type == WType::Q5_1 ? f16_to_f32(load_u16(p + 2)) : 0.f;
      k.zero = s.type == WType::Q4_0 ? 8 : s.type == WType::Q5_0 ? 16 : 0;
      if (s.type == WType::Q5_0 || s.type == WType::Q5_1) {
        for (int j = 0; j < 32; ++j) k.code[j] = q5_code(p, static_cast<int>(l.block_qs), j);
        return k;
      }
      if (s.type == WType::Q8_0) {
        for (int j = 0; j < 32; ++j) k.code[j] = static_cast<int8_t>(p[l.block_qs + j]);
        return k;
      }
      qs = p + l.block_qs;
      break;
    }
    case WType::F32:
    case WType::F16:
    case WType::BF16: fail("gemv: a float type has no blocks");
  }
  for (int j = 0; j < 16; ++j) {
    k.code[j] = qs[j] & 0xF;
    k.code[j + 16] = qs[j] >> 4;
  }
  return k;
}

// act=int8: per block (per half of a split one), sum_j w_j x~_j = scale * dx * sum_j qx_j (code_j - zero) + min * dx * sum_j qx_j
// with the inner sums in int32 (x~ = dx * qx is the quantized activation).
void row_int8(const GemvArgs& a, int64_t r, const int8_t* qx, const float* dx, float* acc) {
  const int64_t cols = a.spec.cols, nblk = cols / 32;
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const Block k = load_block(a, r, blk);
    for (int b = 0; b < a.batch; ++b) {
      const int8_t* q = qx + b * cols + blk * 32;
      int dot = 0, qsum = 0, dot_hi = 0, qsum_hi = 0;
      for (int j = 0; j < 32; ++j) {
        const bool hi = k.split && j >= 16;
        (hi ? dot_hi : dot) += q[j] * (k.code[j] - k.zero);
        (hi ? qsum_hi : qsum) += q[j];
      }
      const float d = dx[b * nblk + blk];
      acc[b] += (k.scale * d) * static_cast<float>(dot);
      if (k.split) acc[b] += (k.scale_hi * d) * static_cast<float>(dot_hi);
      if (k.min != 0.f) acc[b] += (k.min * d) * static_cast<float>(qsum);
      if (k.min_hi != 0.f) acc[b] += (k.min_hi * d) * static_cast<float>(qsum_hi);
    }
  }
}

// act=int8 reads x quantized row by row: codes [batch][cols], then scales [batch][cols / 32] (Q8RowsSuper: one
// per 256 elements, repeated).
Prep prep_kind_scalar(WType type, Act act) {
  if (act != Act::Int8 || !wtype_info(type).int8_act) return Prep::None;
  return wtype_info(type).act_block == 256 ? Prep::Q8RowsSuper : Prep::Q8Rows;
}

size_t prep_bytes_scalar(Prep kind, int batch, int64_t cols) {
  if (kind != Prep::Q8Rows && kind != Prep::Q8RowsSuper) return 0;
  Carve c(nullptr);
  c.take<int8_t>(static_cast<size_t>(batch * cols));
  c.take<float>(static_cast<size_t>(batch * cols / 32));
  return c.used();
}

void prepare_scalar(Prep kind, const float* x, int batch, int64_t cols, uint8_t* out, ThreadPool&) {
  if (kind != Prep::Q8Rows && kind != Prep::Q8RowsSuper) return;
  Carve c(out);
  int8_t* q = c.take<int8_t>(static_cast<size_t>(batch * cols));
  float* d = c.take<float>(static_cast<size_t>(batch * cols / 32));
  const int block = kind == Prep::Q8RowsSuper ? 256 : 32;
  for (int b = 0; b < batch; ++b) quantize_q8_scalar(x + b * cols, cols, q + b * cols, d + b * cols / 32, block);
}

size_t scratch_bytes_scalar(const GemvArgs&) { return 0; }

void gemv_scalar(const GemvArgs& a) {
  const int64_t rows = a.spec.rows, cols = a.spec.cols;
  Carve c(const_cast<uint8_t*>(a.prep));
  const int8_t* qx = a.prep ? c.take<int8_t>(static_cast<size_t>(a.batch * cols)) : nullptr;
  const float* dx = a.prep ? c.take<float>(static_cast<size_t>(a.batch * cols / 32)) : nullptr;
  RowSplit split(rows, a.pool->size());
  a.pool->run([&](int t) {
    auto row = [&](const GemvArgs& m, int64_t r) {  // m is a or a step of a.src
      float acc[kMaxBatch] = {};
      if (m.act == Act::Int8) row_int8(m, r, qx, dx, acc);
      else row_f32(m, r, acc);
      const int64_t n = m.spec.rows;
      for (int b = 0; b < m.batch; ++b) m.y[b * n + r] = m.bias ? acc[b] + m.bias[r] : acc[b];
    };
    int64_t r0, r1;
    while (split.next(t, &r0, &r1)) {
      if (a.src) run_from_source<1>(a, t, r0, r1, [&](const GemvArgs& sub, int) { row(sub, 0); });
      else
        for (int64_t r = r0; r < r1; ++r) row(a, r);
    }
  });
}

}  // namespace

const GemvOps kGemvScalar = {prep_kind_scalar, prep_bytes_scalar, prepare_scalar, scratch_bytes_scalar, gemv_scalar,
                             quantize_q8_scalar, nullptr};

}  // namespace ie
