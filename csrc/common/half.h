// Scalar element conversions shared by the reference kernels, the
// dequantizers (CPU and CUDA: common/weight_decode.h) and the benchmark's
// weight generator. Portable C++ only (no F16C), so every ISA's build of
// these, and the device's, is bit-identical. Loads take any alignment
// (block formats put their fields at odd offsets); the device reads bytes.
#pragma once
#include <cstdint>
#include <cstring>

#include "common/hd.h"

namespace ie {

IE_HD float f32_from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

IE_HD uint16_t load_u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

IE_HD uint32_t load_u32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return p[0] | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

IE_HD float load_f32(const uint8_t* p) { return f32_from_bits(load_u32(p)); }

// IEEE binary16 -> binary32 (exact; NaN payloads kept).
IE_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// IEEE binary32 -> binary16, rounded to nearest even, as F16C's vcvtps2ph
// (imm 0) and CUDA's __float2half_rn: past the largest finite half (65504)
// infinity, NaN a quiet NaN keeping the payload's top bits, below half the
// smallest subnormal zero (the sign kept).
IE_HD uint16_t f32_to_f16(float f) {
  uint32_t x;
#ifdef __CUDA_ARCH__
  x = __float_as_uint(f);
#else
  std::memcpy(&x, &f, 4);
#endif
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds past 65504
  if (x >= 0x38800000u) {  // a normal half (2^-14 and up): rebias, round off 13 bits (a carry bumps the exponent)
    const uint32_t r = x - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  if (x <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: ties to the even zero
  // A subnormal half: the 24-bit significand in units of 2^-24, shifted 14..24 places.
  const uint32_t shift = 126u - (x >> 23), m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), tie = 1u << (shift - 1u);
  return static_cast<uint16_t>(sign | (q + (rem > tie || (rem == tie && (q & 1u)))));
}

IE_HD float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace ie
