// Row-interleaved ("rows8") copies of quantized matrices for the decoder's
// GEMVs with int8 activations (decode steps, and prefill 8 tokens at a time).
//
// Why: in the stored layouts a row is contiguous, so a kernel keeps one
// accumulator per row and ends every row with a horizontal sum, a scale
// setup and a scalar store. For the short rows of small models (hidden 576:
// 9 groups of 64) those per-row costs are as large as the dot product
// itself, and the batch-1 GEMV ran at a third of the read bandwidth. Here
// eight rows are interleaved so that one 32-byte load holds 4 bytes of each
// of them: every 32-bit lane is one row, the accumulator is the eight rows'
// results, the scales of the eight rows are one vector, and nothing is
// reduced horizontally (the layout of ggml's repacked q4_0 8x8, built here
// for every 4-bit type and q8_0).
//
// The copy is made once when a decoder loads (pack_rows8) and lives beside
// the mapped file, which int8 GEMVs then no longer read (its pages were
// touched once, by the packing; f32 prefill's GEMM still reads it). Packing is
// lossless: codes, scales and mins are copied bit for bit, so the product is
// the stored matrix's, only summed in a different order.
//
// Layout, tile t = rows 8t .. 8t+7 (rows past the end are zero), tiles one
// after another, each tile_bytes long:
//  * 4-bit types (int4w, q4_0, q4_1, iq4_nl), per group g of the row (q4_0,
//    q4_1, iq4_nl: a group is one 32-block) in order:
//      bpg blocks of 128 bytes: four 32-byte vectors v = 0..3; in vector v,
//        bytes 4i .. 4i+3 belong to row i, and byte j of them holds element
//        8v + j of the block (low nibble) and element 8v + 4 + j (high);
//      the eight rows' scales (f16, or f32 for int4w scale_dtype f32),
//      then their mins (affine int4w, q4_1), same width.
//    Codes keep their stored meaning: symmetric types subtract 8, iq4_nl's
//    index kIq4Values.
//  * q8_0, per 32-block: eight 32-byte vectors v = 0..7, bytes 4i .. 4i+3
//    of vector v = elements 4v .. 4v+3 of row i; then the rows' eight f16 d.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/aligned.h"
#include "common/weight_types.h"

namespace ie {

struct Rows8 {
  WeightSpec spec;
  int64_t tiles = 0;
  int64_t groups = 0;      // per row (4-bit types); blocks per row for q8_0
  int bpg = 0;             // 32-blocks per group
  int scale_bytes = 0;     // 2 (f16) or 4 (f32)
  bool affine = false;     // a mins vector follows the scales
  size_t group_bytes = 0;  // one group of one tile
  size_t tile_bytes = 0;
  AlignedArray<uint8_t> bytes;
  bool empty() const { return tiles == 0; }
};

// Whether rows8 exists for this matrix (int4w, q4_0, q4_1, iq4_nl and q8_0).
bool rows8_applies(const WeightSpec& s);

// The interleaved copy of w (weight_nbytes(s) bytes), packed with `threads`
// threads; an empty Rows8 where !rows8_applies(s). Throws std::bad_alloc.
Rows8 pack_rows8(const WeightSpec& s, const uint8_t* w, int threads);

}  // namespace ie
