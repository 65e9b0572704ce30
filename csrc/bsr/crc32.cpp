// zlib's CRC-32 (slicing-by-8), for the .bsr payload checksum.
#include <cstring>

#include "bsr.h"

namespace ie {

namespace {

uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Slicing-by-8 tables for the reflected zlib polynomial 0xEDB88320.
struct CrcTables {
  uint32_t t[8][256];
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};

const CrcTables& crc_tables() {
  static const CrcTables tables;  // initialised once, thread-safe (C++11 magic static)
  return tables;
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& T = crc_tables().t;
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = rd32(p) ^ c, hi = rd32(p + 4);
    c = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^ T[3][hi & 0xFF] ^
        T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
  }
  for (; n; --n, ++p) c = T[0][(c ^ *p) & 0xFF] ^ (c >> 8);
  return ~c;
}

}  // namespace ie
