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

IE_HD float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace ie
