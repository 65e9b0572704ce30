// The int8 yardstick at the amx level: four tile multiplies per step,
// what one core's tile unit makes when nothing waits on it. Why a level of
// its own: prefill at amx runs its products through tdpbssd
// (gemv/rows8_amx.h), so reporting it against the VNNI peak would give
// fractions of the wrong machine (above 60% where the tiles' own peak is
// eight to nine times VNNI's on this Xeon).
#include <immintrin.h>

#include <cstring>

#include "common/amx_tiles.h"
#include "stream_read.h"

namespace ie {

// C tiles 0..3 += A tiles 4, 5 (every byte a, unsigned) times B tiles 6, 7
// (every byte b, signed): four independent accumulators, 2 x 2, so no
// multiply waits on the one before. The caller's process has the tile
// state granted (the amx level exists only then: common/isa.cpp).
int64_t int8_chains_amx(int a, int b, int64_t iters) {
  AmxTileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
  alignas(64) uint8_t ua[16 * 64];
  alignas(64) int8_t sb[16 * 64];
  std::memset(ua, a, sizeof ua);
  std::memset(sb, b, sizeof sb);
  _tile_loadd(4, ua, 64);
  _tile_loadd(5, ua, 64);
  _tile_loadd(6, sb, 64);
  _tile_loadd(7, sb, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) int32_t lanes[4][16 * 16];
  _tile_stored(0, lanes[0], 64);
  _tile_stored(1, lanes[1], 64);
  _tile_stored(2, lanes[2], 64);
  _tile_stored(3, lanes[3], 64);
  _tile_release();
  int64_t total = 0;
  for (const auto& tile : lanes)
    for (int32_t v : tile) total += v;
  return total;
}

}  // namespace ie
