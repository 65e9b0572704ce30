// Device decoding of stored weight bytes (docs/formats/quant.md): a port of
// the CPU dequant_span (csrc/gemv/driver.cpp) and its helpers
// (csrc/gemv/kernels.h) for any byte alignment (byte loads only: block
// formats place their u16 and u32 fields at any even offset). Built with
// -fmad=false, so every value is the same float32 the CPU computes; the
// tests hold dequantize() on the device to the CPU's bit for bit.
#pragma once
#include <cstdint>

#include "common/weight_types.h"

namespace ie::cuda {

// What a kernel needs of a matrix, passed by value.
struct Geometry {
  WeightSpec s;
  WeightLayout l;
};

namespace dev {

__device__ __forceinline__ uint32_t u16(const uint8_t* p) { return p[0] | (uint32_t(p[1]) << 8); }
__device__ __forceinline__ uint32_t u32(const uint8_t* p) { return u16(p) | (u16(p + 2) << 16); }

// IEEE binary16 -> binary32, exactly as ie::f16_to_f32 (NaN payloads kept).
__device__ __forceinline__ float f16(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
__device__ __forceinline__ float bf16(uint32_t h) { return __uint_as_float(h << 16); }

// ggml's kvalues_iq4nl.
__device__ __forceinline__ int iq4_value(int q) {
  constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return kValues[q];
}

// ggml's kvalues_mxfp4 (e2m1 doubled) and the E8M0 scale halved, as ie::e8m0_half.
__device__ __forceinline__ int mxfp4_value(int q) {
  constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  return kValues[q];
}
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// q4_k / q5_k sub-block j: (d * sc_j, dmin * m_j).
__device__ __forceinline__ void q4k_sub(const uint8_t* blk, int j, float* scale, float* min) {
  const uint8_t* sc = blk + 4;
  int ls, lm;
  if (j < 4) {
    ls = sc[j] & 63;
    lm = sc[j + 4] & 63;
  } else {
    ls = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
    lm = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
  *scale = f16(u16(blk)) * static_cast<float>(ls);
  *min = f16(u16(blk + 2)) * static_cast<float>(lm);
}

__device__ __forceinline__ int kq_nibble(const uint8_t* blk, int at, int j, int e) {
  return (blk[at + 32 * (j / 2) + e] >> (4 * (j % 2))) & 0xF;
}

__device__ __forceinline__ float q6k_scale(const uint8_t* blk, int j) {
  return f16(u16(blk + 208)) * static_cast<float>(static_cast<int8_t>(blk[192 + j]));
}

__device__ __forceinline__ int q6k_code(const uint8_t* blk, int i) {
  const int h = i / 128, k = i % 128 / 32, l = i % 32;
  const int lo = (blk[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
  return lo | (((blk[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
}

__device__ __forceinline__ int q5_code(const uint8_t* blk, int at, int e) {
  const uint32_t qh = u32(blk + at);
  return ((blk[at + 4 + e % 16] >> (4 * (e / 16))) & 0xF) | static_cast<int>(((qh >> e) & 1u) << 4);
}

// W[r][c0 .. c0 + n) into out, as dequant_span: c0 % 32 == 0, n == 32 for
// the block formats, n <= 32 for floats.
__device__ inline void decode_span(const Geometry& g, const uint8_t* w, int64_t r, int64_t c0, int n, float* out) {
  const WeightSpec& s = g.s;
  const WeightLayout& lay = g.l;
  const uint8_t* row = w + static_cast<size_t>(r) * lay.row_bytes;
  switch (s.type) {
    case WType::F32:
      for (int j = 0; j < n; ++j) out[j] = __uint_as_float(u32(row + (c0 + j) * 4));
      return;
    case WType::F16:
      for (int j = 0; j < n; ++j) out[j] = f16(u16(row + (c0 + j) * 2));
      return;
    case WType::BF16:
      for (int j = 0; j < n; ++j) out[j] = bf16(u16(row + (c0 + j) * 2));
      return;
    case WType::Int4w: {
      const uint8_t* qs = row + c0 / 2;
      const size_t gi = static_cast<size_t>(r) * lay.groups + c0 / s.group_size;
      const uint8_t* sp = w + lay.scales_off + gi * lay.scale_bytes;
      const uint8_t* mp = w + lay.mins_off + gi * lay.scale_bytes;
      const float sc = s.scale_f32 ? __uint_as_float(u32(sp)) : f16(u16(sp));
      const float m = s.symmetric ? 0.f : (s.scale_f32 ? __uint_as_float(u32(mp)) : f16(u16(mp)));
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (s.symmetric) {
          out[j] = sc * static_cast<float>((qs[j] & 0xF) - 8);
          out[j + 16] = sc * static_cast<float>((qs[j] >> 4) - 8);
        } else {
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
      const float d = f16(u16(blk));
      const bool q41 = s.type == WType::Q4_1;
      const float m = q41 ? f16(u16(blk + 2)) : 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (q41) {
          out[j] = d * static_cast<float>(qs[j] & 0xF) + m;
          out[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
        } else {
          out[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
          out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case WType::Q5_0:
    case WType::Q5_1: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const float d = f16(u16(blk));
      if (s.type == WType::Q5_0) {
#pragma unroll
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(q5_code(blk, 2, e) - 16) * d;
      } else {
        const float m = f16(u16(blk + 2));
#pragma unroll
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(q5_code(blk, 4, e)) * d + m;
      }
      return;
    }
    case WType::Q8_0: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const float d = f16(u16(blk));
#pragma unroll
      for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(blk[lay.block_qs + j]));
      return;
    }
    case WType::IQ4_NL:
    case WType::IQ4_XS: {
      const uint8_t* blk = row + c0 / s.group_size * lay.block_bytes;
      const int j = static_cast<int>(c0 % s.group_size / 32);
      float d;
      if (s.type == WType::IQ4_XS) {
        const int l = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((u16(blk + 2) >> (2 * j)) & 3) << 4);
        d = f16(u16(blk)) * static_cast<float>(l - 32);
      } else {
        d = f16(u16(blk));
      }
      const uint8_t* qs = blk + lay.block_qs + 16 * j;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        out[e] = d * static_cast<float>(iq4_value(qs[e] & 0xF));
        out[e + 16] = d * static_cast<float>(iq4_value(qs[e] >> 4));
      }
      return;
    }
    case WType::MXFP4: {
      const uint8_t* blk = row + c0 / 32 * lay.block_bytes;
      const float d = e8m0_half(blk[0]);
      const uint8_t* qs = blk + lay.block_qs;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        out[e] = d * static_cast<float>(mxfp4_value(qs[e] & 0xF));
        out[e + 16] = d * static_cast<float>(mxfp4_value(qs[e] >> 4));
      }
      return;
    }
    case WType::Q4_K:
    case WType::Q5_K: {
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      const int j = static_cast<int>(c0 % 256 / 32);
      float scale, min;
      q4k_sub(blk, j, &scale, &min);
      const bool q5 = s.type == WType::Q5_K;
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int q = q5 ? kq_nibble(blk, 48, j, e) | (((blk[16 + e] >> j) & 1) << 4) : kq_nibble(blk, 16, j, e);
        out[e] = scale * static_cast<float>(q) - min;
      }
      return;
    }
    case WType::Q6_K: {
      const uint8_t* blk = row + c0 / 256 * lay.block_bytes;
      const int i0 = static_cast<int>(c0 % 256);
#pragma unroll
      for (int e = 0; e < 32; ++e) out[e] = q6k_scale(blk, (i0 + e) / 16) * static_cast<float>(q6k_code(blk, i0 + e) - 32);
      return;
    }
  }
}

}  // namespace dev
}  // namespace ie::cuda
