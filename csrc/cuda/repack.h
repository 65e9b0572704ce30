// The load-time repack of the CUDA upload (docs/cuda.md, "Repack"): q4_0
// and q4_1 blocks interleave an f16 scale (and min) with 16 code bytes, 18
// or 20 bytes a block, so no block is 16-byte aligned; split into planes they
// are exactly int4w with group 32 and f16 scales (symmetric for q4_0,
// affine for q4_1): the same codes in the same nibble order, the same
// values (d * (q - 8), d * q + m), read by the 16-byte planar kernel.
// Portable C++ (built without CUDA too), so the CPU tests hold the repacked
// bytes to the stored ones through the CPU dequantizer.
#pragma once
#include <cstdint>

#include "common/weight_types.h"

namespace ie::cuda {

// The planar twin of s (true), or false when s is read as stored.
bool planar_twin(const WeightSpec& s, WeightSpec* out);

// Writes the planar twin's weight_nbytes(twin) bytes of the stored matrix
// w (weight_nbytes(s) bytes). Throws std::invalid_argument when s has no twin.
void repack_planar(const WeightSpec& s, const uint8_t* w, uint8_t* out);

}  // namespace ie::cuda
