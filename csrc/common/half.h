// Scalar element conversions shared by the reference kernels, the
// dequantizers and the benchmark's weight generator. Portable C++ only
// (no F16C), so every ISA's build of these is bit-identical.
#pragma once
#include <cstdint>
#include <cstring>

namespace ie {

inline float f32_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// IEEE binary16 -> binary32 (exact; NaN payloads kept).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace ie
