// The fused dedup GEMV: y = W x where W is a dedup member (default + mask +
// exceptions, docs/formats/dedup.md) never rebuilt whole. Rows are taken a
// tile at a time: each thread rebuilds its tile's bytes into a buffer that
// stays in its L1/L2 (dedup::reconstruct_range) and runs the stored-format
// GEMV on that tile, so the member costs no memory beyond one tile per
// thread and its bytes are read once per product: the default, the mask
// (an eighth of the tensor) and the exceptions.
//
// A tile of rows [r0, r1) of a stored matrix is itself a matrix of r1 - r0
// rows: the same bytes per row for block and float types, and for int4w the
// tile's slice of each plane (codes, scales, mins) laid out as the smaller
// matrix's planes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/aligned.h"
#include "dedup/dedup.h"
#include "gemv.h"

namespace ie {

// Rows per tile: about kDedupTileBytes of stored bytes, a multiple of 8.
constexpr size_t kDedupTileBytes = size_t(128) << 10;

// A member seen as a matrix: its spec and, per tile and plane, where the
// tile's bytes are in the member and how many exceptions come before them.
struct DedupMatrix {
  WeightSpec spec;
  dedup::MemberView src;
  int64_t tile_rows = 0;
  struct Piece {
    size_t src_off, nbytes, dst_off;
    uint64_t k;  // set mask bits before src_off
  };
  std::vector<std::vector<Piece>> tiles;  // per tile, one piece per plane
  size_t tile_nbytes = 0;                 // the largest tile's bytes
  size_t read_bytes = 0;                  // blob bytes one product reads: default + mask + exceptions
};

// Plans the tiles of `src`, a member of weight_nbytes(s) bytes; throws
// std::invalid_argument when the sizes disagree.
DedupMatrix make_dedup_matrix(const WeightSpec& s, const dedup::MemberView& src);

// Per-thread tile buffers, GEMV scratch and tile outputs, kept across calls.
struct DedupGemvScratch {
  std::vector<AlignedArray<uint8_t>> tile;
  std::vector<GemvScratch> gemv;
  std::vector<AlignedArray<float>> y;
};

// y[b * rows + r] = sum_c W[r][c] x[b][c] (+ bias[r]) for the member W,
// equal to gemv() over its rebuilt bytes (the same kernel per row).
// Throws std::invalid_argument when the blobs disagree with the plan
// (never on a validated store).
void gemv_dedup(const DedupMatrix& m, PreparedAct& x, const float* bias, float* y, Act act, int threads, Isa isa,
                DedupGemvScratch& scratch);

}  // namespace ie
