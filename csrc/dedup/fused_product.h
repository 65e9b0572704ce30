// The fused dedup GEMV: y = W x where W is a dedup member (default + mask +
// exceptions, docs/formats/dedup.md) never rebuilt whole. The stored-format
// GEMV reads it through a RowSource (gemv.h): each kernel step's rows (a
// few KiB) are rebuilt by dedup::reconstruct_range into the thread's buffer,
// which stays in L1, and multiplied there at once. So the member costs no
// memory beyond that buffer, its bytes are read once per product (the
// default, the mask's words and line bits, and the exceptions), and the
// reads stay one sequential stream per blob, as a plain GEMV's are.
//
// Rows [r0, r0 + n) of a stored matrix are themselves a matrix of n rows:
// the same bytes per row for block and float types, and for int4w the rows'
// slice of each plane (codes, scales, mins) laid out as the smaller
// matrix's planes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/aligned.h"
#include "dedup.h"
#include "gemm/gemm.h"
#include "gemv/gemv.h"

namespace ie {

// A member seen as a matrix: its spec, its blobs and its planes (offset in
// the member, bytes per row).
struct DedupMatrix {
  WeightSpec spec;
  dedup::MemberView src;
  struct Plane {
    size_t off, per_row;
  };
  std::vector<Plane> planes;
};

// Plans the planes of `src`, a member of weight_nbytes(s) bytes; throws
// std::invalid_argument when the sizes disagree.
DedupMatrix make_dedup_matrix(const WeightSpec& s, const dedup::MemberView& src);

// Per-thread step buffers and exception cursors, and the GEMV scratch, kept
// across calls (a decoder shares one among all its members).
struct DedupGemvScratch {
  struct Thread {
    AlignedArray<uint8_t> buf;
    int64_t next_row = -1;  // the row after the last step, where the cursors stand
    dedup::Cursor c[3];     // per plane: where the walk stands at next_row
  };
  std::vector<Thread> threads;
  GemvScratch gemv;
};

// y[b * rows + r] = sum_c W[r][c] x[b][c] (+ bias[r]) for the member W,
// equal to gemv() over its rebuilt bytes (the same kernel per row).
// Throws std::invalid_argument when the blobs disagree with the plan
// (never on a validated store).
void gemv_dedup(const DedupMatrix& m, PreparedAct& x, const float* bias, float* y, Act act, ThreadPool& pool, Isa isa,
                DedupGemvScratch& scratch);

// The prefill GEMM (gemm/gemm.h) over the member for x [n, cols], its weight
// tiles converted from the same steps: equal to gemm() over the rebuilt
// bytes, never holding the member.
void gemm_dedup(const DedupMatrix& m, const float* x, int n, const float* bias, float* y, ThreadPool& pool, Isa isa,
                DedupGemvScratch& scratch, GemmScratch& gemm_scratch);

}  // namespace ie
