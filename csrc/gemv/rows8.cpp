// pack_rows8: the stored layouts (docs/formats/quant.md) rewritten eight
// rows at a time (rows8.h). Portable code: only the kernels that read the
// copy are per ISA.
#include "rows8.h"

#include <omp.h>

#include <cstring>

#include "common/errors.h"

namespace ie {
namespace {

// Where block k of row r keeps its 32 codes (nibble pairs: byte j holds
// elements j and j + 16; q8_0: 32 int8) and its scale and min bytes.
struct BlockRef {
  const uint8_t* codes;
  const uint8_t* scale;
  const uint8_t* min;
};

BlockRef block_ref(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t k) {
  if (s.type == WType::Int4w) {
    const int64_t g = k * 32 / s.group_size;
    const size_t gi = static_cast<size_t>(r * lay.groups + g) * lay.scale_bytes;
    return {w + r * lay.row_bytes + k * 16, w + lay.scales_off + gi, s.symmetric ? nullptr : w + lay.mins_off + gi};
  }
  const uint8_t* blk = w + r * lay.row_bytes + k * lay.block_bytes;
  return {blk + lay.block_qs, blk, s.type == WType::Q4_1 ? blk + 2 : nullptr};
}

// Element e (0..31) of a 4-bit block's codes.
inline uint8_t nibble(const uint8_t* codes, int e) { return e < 16 ? codes[e] & 0xF : codes[e - 16] >> 4; }

void pack_tile(const Rows8& p, const WeightLayout& lay, const uint8_t* w, int64_t t, uint8_t* out) {
  const WeightSpec& s = p.spec;
  const int sb = p.scale_bytes;
  for (int64_t g = 0; g < p.groups; ++g) {
    uint8_t* o = out + g * p.group_bytes;
    for (int i = 0; i < 8; ++i) {
      const int64_t r = 8 * t + i;
      if (r >= s.rows) break;  // padding rows stay zero
      for (int kb = 0; kb < p.bpg; ++kb) {
        const BlockRef b = block_ref(s, lay, w, r, g * p.bpg + kb);
        if (s.type == WType::Q8_0) {
          for (int v = 0; v < 8; ++v) std::memcpy(o + v * 32 + 4 * i, b.codes + 4 * v, 4);
        } else {
          uint8_t* blk = o + kb * 128;
          for (int v = 0; v < 4; ++v)
            for (int j = 0; j < 4; ++j)
              blk[v * 32 + 4 * i + j] =
                  static_cast<uint8_t>(nibble(b.codes, 8 * v + j) | nibble(b.codes, 8 * v + 4 + j) << 4);
        }
        if (kb == 0) {
          uint8_t* sc = o + (s.type == WType::Q8_0 ? 256 : p.bpg * 128);
          std::memcpy(sc + i * sb, b.scale, static_cast<size_t>(sb));
          if (p.affine) std::memcpy(sc + 8 * sb + i * sb, b.min, static_cast<size_t>(sb));
        }
      }
    }
  }
}

}  // namespace

bool rows8_applies(const WeightSpec& s) {
  return s.type == WType::Int4w || s.type == WType::Q4_0 || s.type == WType::Q4_1 || s.type == WType::Q8_0 ||
         s.type == WType::IQ4_NL;
}

Rows8 pack_rows8(const WeightSpec& s, const uint8_t* w, int threads) {
  Rows8 p;
  if (!rows8_applies(s) || s.rows < 1 || s.cols < 1) return p;
  if (threads < 1) fail("threads must be >= 1, got " + std::to_string(threads));
  if (s.cols % 32 != 0) fail("rows8: columns must be a multiple of 32, got " + std::to_string(s.cols));
  const WeightLayout lay = weight_layout(s);
  p.spec = s;
  p.tiles = (s.rows + 7) / 8;
  if (s.type == WType::Int4w) {
    p.bpg = static_cast<int>(s.group_size / 32);
    p.groups = lay.groups;
    p.scale_bytes = static_cast<int>(lay.scale_bytes);
    p.affine = !s.symmetric;
  } else {
    p.bpg = 1;
    p.groups = s.cols / 32;
    p.scale_bytes = 2;
    p.affine = s.type == WType::Q4_1;
  }
  const size_t codes = s.type == WType::Q8_0 ? 256 : checked_mul(static_cast<size_t>(p.bpg), 128, "rows8 group");
  p.group_bytes = codes + static_cast<size_t>(8 * p.scale_bytes * (p.affine ? 2 : 1));
  p.tile_bytes = checked_mul(p.group_bytes, static_cast<size_t>(p.groups), "rows8 tile");
  p.bytes.resize(checked_mul(p.tile_bytes, static_cast<size_t>(p.tiles), "rows8 matrix"), /*zero=*/false);
  uint8_t* base = p.bytes.data();
  // Each thread zeroes and fills its own tiles (first touch where it will read them).
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < p.tiles; ++t) {
    std::memset(base + t * p.tile_bytes, 0, p.tile_bytes);
    pack_tile(p, lay, w, t, base + t * p.tile_bytes);
  }
  return p;
}

}  // namespace ie
