// Row-interleaved ("rows8") copies of quantized matrices for the decoder's
// GEMVs with int8 activations (decode steps, and prefill 8 tokens at a time).
//
// Why: in the stored layouts a row is contiguous, so a kernel keeps one
// accumulator per row and ends every row with a horizontal sum, a scale
// setup and a scalar store. For the short rows of small models (hidden 576:
// 9 groups of 64) those per-row costs are as large as the dot product
// itself, and the batch-1 GEMV ran at a third of the read bandwidth; the
// super-block types (q4_k, q5_k, q6_k, iq4_xs) also unpack their sub-scales
// per row, and q5_0/q5_1 spread their fifth bits per row. Here eight rows are
// interleaved so that one 32-byte load holds 4 bytes of each of them: every
// 32-bit lane is one row, the accumulator is the eight rows' results, the
// scales of the eight rows are one vector (packed sub-scales unpack eight
// rows at a time), and nothing is reduced horizontally (the layout of ggml's
// repacked q4_0 8x8, built here for every quantized type).
//
// The copy is made once when a decoder loads (pack_rows8) and lives beside
// the mapped file, which int8 GEMVs then no longer read (its pages were
// touched once, by the packing; f32 prefill's GEMM still reads it). Packing is
// lossless and the same size as the stored matrix (tail tiles aside): codes,
// scales and mins are copied bit for bit, only moved, so the product is the
// stored matrix's, summed in a different order.
//
// Layout, tile t = rows 8t .. 8t+7 (rows past the end are zero), tiles one
// after another, each tile_bytes long, made of the row's groups g in order
// (a group: int4w's scale group, one 32-block for q4_0, q4_1, q5_0, q5_1,
// iq4_nl, mxfp4 and q8_0, one 256-element super-block for q4_k, q5_k, q6_k,
// q3_k, q2_k, iq4_xs, iq4_xsh and the codebook types). A group is its
// 32-blocks (bpg of them, block_bytes each), then a header.
//  * A 32-block of codes: four 32-byte vectors v = 0..3; in vector v, bytes
//    4i .. 4i+3 belong to row i, and byte j of them holds the low nibble of
//    element 8v + j of the block (low nibble) and of element 8v + 4 + j
//    (high). q5_0, q5_1 and q5_k follow with one vector of fifth bits: byte j
//    of row i's lane has bit v = element 8v + j's, bit 4 + v = element
//    8v + 4 + j's. q6_k follows with two vectors of bit pairs: vector v / 2,
//    byte j of row i, bits 4 (v % 2) .. +1 = element 8v + j's bits 4..5 and
//    bits 4 (v % 2) + 2 .. +3 = element 8v + 4 + j's.
//    q3_k and q2_k instead: two vectors u = 0..1 of bit pairs, byte j of
//    row i holding the low bit pairs of elements 8v + j (bits 4 (v % 2) ..
//    +1) and 8v + 4 + j (bits 4 (v % 2) + 2 .. +3) for v = 2u, 2u + 1; q3_k
//    follows with one vector of third bits laid out as the fifth bits above.
//    q8_0 instead: eight 32-byte vectors v = 0..7, bytes 4i .. 4i+3 of
//    vector v = elements 4v .. 4v+3 of row i.
//  * The header, per row i (lane order), each field a vector of 8 values:
//    - int4w, q4_0, q4_1, q5_0, q5_1, iq4_nl, q8_0: the eight rows' scales
//      (f16, or f32 for int4w scale_dtype f32), then their mins (affine
//      int4w, q4_1, q5_1), same width; mxfp4: the eight rows' E8M0 bytes;
//    - q4_k, q5_k: the 12 scale bytes as three u32 words (word 0 of the eight
//      rows, then word 1, then word 2), then d (f16) and dmin (f16);
//    - iq4_xs: scales_l (u32), scales_h (u16), d (f16); iq3_s the same, its
//      sub-scales 1 + 2 s_j written as iq4_xs's l_j - 32 (l_j = 33 + 2 s_j);
//      iq3_xxs and iq2_xxs as iq3_s, their d standing for d / 4 and d / 8
//      (rows8_d_factor);
//      iq4_xsh the same, then its grid shift byte (u8: bit j for sub-block j);
//    - q6_k: per 32-block b, 8 bytes sc[2b] then 8 bytes sc[2b + 1] (int8
//      sub-scales of its two 16-element halves), then d (f16); iq2_xs and
//      iq2_s the same, sc the multipliers 1 + 2 s_h of their 16-element
//      halves, d standing for d / 8;
//    - q3_k: the 12 scale bytes as three u32 words (as q4_k's), then d (f16);
//    - q2_k: the 16 scale/min bytes as four u32 words, then d and dmin (f16).
//    Codes keep their stored meaning: q4_0 and int4w subtract 8, q5_0 16,
//    q6_k 32, q3_k 4; iq4_nl's and mxfp4's index their tables (grid_values).
//    iq3_s is the one type whose copy is not its stored size: its codebook
//    words would need a gather per four weights of each row (a tile that
//    gathered ran at 0.15 of the read bandwidth, 16384 x 8192, 2 threads),
//    so each weight is re-coded as a nibble, (v + 15) / 2 for its signed
//    value v, and the tile is iq4_xs's with that table: 4.25 bits per weight
//    in the copy for 3.44 stored, the same products. iq3_xxs's and iq2_xxs's
//    copies are the same (4.25 bits for 3.06 and 2.06), each signed value v
//    (+-4 .. +-62; +-8, 25, 43) the nibble codebook_nibble(v), the four-fold
//    (eight-fold) scale d * (1 + 2 s_j) taken back by a factor 1/4 (1/8) on
//    the header's d where the kernels read it: d / 4 itself would not fit
//    f16 exactly where d is small. iq2_xs's and iq2_s's values are
//    iq2_xxs's, nibbles of the same table, but their 4-bit scales per 16
//    weights fit no iq4_xs header: theirs is q6_k's (int8 per half), 4.56
//    bits a weight in the copy (1.97x iq2_xs's stored bytes, 1.78x iq2_s's).
//    iq1_s's and iq1_m's are the same, their values 8 g +- 1 (-9, -7, -1,
//    1, 7, 9) nibbles of their table (codebook_nibble) and d / 8 under the
//    multipliers 1 + 2 s of each 16 weights (iq1_s's: its 32-block's, twice):
//    2.9x iq1_s's stored bytes, 2.6x iq1_m's.
//    q1_0's copy is a q4_0 matrix's (Rows8::spec says q4_0, Rows8::stored
//    q1_0): each sign bit the code 9 (+1) or 7 (-1), each 32-block under its
//    128-block's d, so every q4_0 kernel (tiles, pairs, AMX) runs it: 4.5
//    bits a weight in the copy for 1.125 stored (4x, made where memory allows).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/aligned.h"
#include "common/thread_pool.h"
#include "common/weight_types.h"

namespace ie {

// Bits per code in a tile's 32-blocks, so a block of one tile is 32 * bits
// bytes: the nibbles (128), then the fifth bits (5) or q6_k's bit pairs
// (6); q3_k's bit pairs (64) and third bits (3); q2_k's bit pairs (2);
// q8_0's 256 value bytes.
// Every switch on the weight type here, in rows8.cpp and rows8_tiles.h
// names each type (no `default:`): the build makes a missing case an
// error (-Werror=switch), so a new type cannot pass for a 4-bit one.
static_assert(kNumWeightTypes == 27, "a new weight type: give it its case in every switch of gemv/rows8*");

// 0: a float type, which has no row-interleaved copy (rows8_applies).
constexpr int rows8_code_bits(WType t) {
  switch (t) {
    case WType::Q8_0: return 8;
    case WType::Q6_K: return 6;
    case WType::Q3_K: return 3;
    case WType::Q2_K: return 2;
    case WType::Q5_0:
    case WType::Q5_1:
    case WType::Q5_K: return 5;
    case WType::Int4w:
    case WType::Q4_0:
    case WType::Q4_1:
    case WType::Q4_K:
    case WType::IQ4_NL:
    case WType::IQ4_XS:
    case WType::IQ4_XSH:
    case WType::IQ3_S:    // its signed values as nibbles (grid_value): 4 bits, not its stored 3.44
    case WType::IQ3_XXS:  // the same, for its stored 3.06
    case WType::IQ2_XXS:  // and 2.06
    case WType::IQ2_XS:   // the same values under q6_k's header: 4.56 bits for 2.31
    case WType::IQ2_S:    // and 2.56
    case WType::IQ1_S:    // and 1.56
    case WType::IQ1_M:    // and 1.75
    case WType::Q1_0:     // its signs as q4_0's codes 9 and 7 (rows8_shape): 4.5 bits for 1.125
    case WType::MXFP4: return 4;
    case WType::NVFP4:  // none: its scales per 16 weights are floats, which no header holds exactly
    case WType::F32:
    case WType::F16:
    case WType::BF16: return 0;
  }
  return 0;
}

// Whether a one-token product reads the copy rather than the stored bytes:
// every type's but q1_0's, whose stored kernel reads a quarter of its copy's
// bytes and decoded 10-15% faster (docs/benchmarks.md "Q1_0 beside
// llama.cpp"); its copy serves prefill, where the tiles run 2x its packing.
constexpr bool rows8_decodes(WType t) { return t != WType::Q1_0; }

// What the kernels multiply a rows8 header's d (f16) by: iq3_xxs's 1/4
// (its weights are d * (1 + 2 s_j) / 4 * v), iq2_xxs's and the half_scaled_book types' 1/8, 1 for
// every other type.
constexpr float rows8_d_factor(WType t) {
  return t == WType::IQ3_XXS ? 0.25f : t == WType::IQ2_XXS || half_scaled_book(t) ? 0.125f : 1.f;
}

// Byte offsets of the header fields of a super-block group (above), shared
// by the packer and the kernels.
struct Rows8KqHeader {  // q4_k, q5_k
  static constexpr int words = 0, d = 96, dmin = 112, bytes = 128;
};
struct Rows8Iq4xsHeader {  // iq4_xsh: 8 bytes more, each row's grid shift bits at `shifts`
  static constexpr int scales_l = 0, scales_h = 32, d = 48, bytes = 64, shifts = 64, xsh_bytes = 72;
};
struct Rows8Q6kHeader {
  static constexpr int scales = 0, d = 128, bytes = 144;
};
struct Rows8Q3kHeader {
  static constexpr int words = 0, d = 96, bytes = 112;
};
struct Rows8Q2kHeader {
  static constexpr int words = 0, d = 128, dmin = 144, bytes = 160;
};

struct Rows8 {
  WeightSpec spec;         // the copy's matrix, which its kernels read: stored's, but q4_0's for a q1_0 one
  WeightSpec stored;       // the matrix copied
  int64_t tiles = 0;
  int64_t groups = 0;      // per row
  int bpg = 0;             // 32-blocks per group
  int block_bytes = 0;     // one 32-block of one tile: 32 * rows8_code_bits
  int scale_bytes = 0;     // int4w and the 32-block types: 2 (f16), 4 (f32) or 1 (mxfp4's E8M0)
  bool affine = false;     // those types: a mins vector follows the scales
  int act_block = 32;      // spec's act_block (weight_types.h): which activation form its kernels read
  size_t group_bytes = 0;  // one group of one tile: bpg blocks, then the header
  size_t tile_bytes = 0;
  AlignedArray<uint8_t> bytes;
  bool empty() const { return tiles == 0; }
};

// Whether rows8 exists for this matrix (every quantized type).
bool rows8_applies(const WeightSpec& s);

// The interleaved copy of w (weight_nbytes(s) bytes), packed by the pool's
// threads, each first-touching the tiles its GEMV share starts on; an empty Rows8 where !rows8_applies(s). Throws std::bad_alloc.
Rows8 pack_rows8(const WeightSpec& s, const uint8_t* w, ThreadPool& pool);

// The copy's shape (every field but bytes, which stays empty): what a
// gemv_rows8 job over stored bytes describes its matrix by.
Rows8 rows8_shape(const WeightSpec& s);

// The copy's size in bytes (0 where !rows8_applies): the stored size (tail
// tiles aside), but 4.25 bits a weight for the codebook types.
size_t rows8_nbytes(const WeightSpec& s);

// Tiles t0 .. t0 + n of the copy of w (p: rows8_shape of w's spec) into out,
// n * p.tile_bytes bytes: the bytes pack_rows8 puts there. 4-bit codes in
// q4_0's or q4_k's nibble order, q5_k's fifth bits and q6_k's bit pairs
// move four bytes at a time (several GB/s a thread); the other types go
// through their 32 codes (about 0.5 GB/s).
void pack_rows8_tiles(const Rows8& p, const uint8_t* w, int64_t t0, int64_t n, uint8_t* out);

}  // namespace ie
