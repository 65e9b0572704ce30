// The AMX tile configuration (palette 1: rows and bytes per row of each of
// the eight tile registers), as _tile_loadconfig reads it: one definition for
// the rows8 AMX kernels (gemv/rows8_amx.h) and the int8 yardstick
// (stream/amx.cpp). Only the layout lives here; the files that load it are
// built with -mamx-tile.
#pragma once
#include <cstdint>

namespace ie {

struct AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64, "the tile configuration is a 64-byte block");

}  // namespace ie
