// Block-sparse (BSR) float32 matrices: the .bsr loader/validator and
// y = A x (+ bias).
//
// The file format is docs/formats/bsr.md; formats/bsr.py is its reference.
// The C++ loader applies the same rules in the same order and reports the
// same code (bsr_status_name == the Python BsrFormatError.code) and the same
// field for each, so the tests can hold the two loaders to each other on
// every hostile input. Every header rule is checked, with overflow-checked
// 64-bit arithmetic, before anything is allocated, and the file size must
// match the header exactly: a lying header cannot make the loader allocate
// more than the file holds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/aligned.h"
#include "common/dispatch.h"
#include "common/isa.h"

namespace ie {

enum class BsrStatus : int {
  Ok = 0,
  Io,              // open/read failed (the Python reader raises OSError)
  Alloc,           // out of memory
  BadMagic,
  Truncated,       // shorter than the header
  BadVersion,
  BadHeaderBytes,
  BadDtype,
  BadFlags,
  BadReserved,
  ZeroDim,
  SizeField,       // a size field or array length disagrees with the dimensions
  IndexRange,      // nnzb / block columns do not fit the u32 indices, or nnzb exceeds the grid
  FileSize,
  Crc,
  RowPtr,
  ColIdx,          // a block column out of range
  ColOrder,        // block columns not strictly ascending within a block row
  NonFinite,
  Padding,         // a tail block's out-of-range element is not +0.0
};

// "ok", "io", "alloc", "bad_magic", ... (the Python codes).
const char* bsr_status_name(BsrStatus s);

struct BsrError {
  BsrStatus status = BsrStatus::Ok;
  std::string field;
  std::string message;
  // "FILE: FIELD: message", the project's one-line error.
  std::string line(const std::string& file) const { return file + ": " + field + ": " + message; }
};

struct BsrMatrix {
  uint64_t rows = 0, cols = 0;
  uint32_t block_rows = 0, block_cols = 0;
  uint64_t n_block_rows = 0, n_block_cols = 0, nnzb = 0;
  AlignedArray<uint32_t> row_ptr;  // [n_block_rows + 1]
  AlignedArray<uint32_t> col_idx;  // [nnzb]
  AlignedArray<float> values;      // [nnzb][block_rows][block_cols]

  size_t block_elems() const { return static_cast<size_t>(block_rows) * block_cols; }
  size_t payload_bytes() const { return 4 * (row_ptr.size() + col_idx.size() + values.size()); }
};

// Loads and validates a .bsr file. On success *out owns the arrays and
// BsrStatus::Ok is returned; on any error *out is an empty (zeroed)
// BsrMatrix, nothing stays allocated, and *err says which rule broke.
BsrStatus bsr_load(const std::string& path, bool allow_nonfinite, BsrMatrix* out, BsrError* err);

// Builds a matrix from arrays (copied), with every rule that does not
// concern the file: dimensions, array lengths, row_ptr, col_idx, values.
BsrStatus bsr_from_arrays(uint64_t rows, uint64_t cols, uint64_t block_rows, uint64_t block_cols,
                          const uint32_t* row_ptr, size_t n_row_ptr, const uint32_t* col_idx, size_t n_col_idx,
                          const float* values, size_t n_values, bool allow_nonfinite, BsrMatrix* out,
                          BsrError* err);

// zlib's CRC-32, chainable like zlib's crc32(crc, buf, len) (start with 0).
uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n);

constexpr int kBsrMaxBatch = 8;

// y[b * rows + r] = sum_c A[r][c] x[b * cols + c] (+ bias[r]), 1 <= batch <= 8,
// float32 accumulation. Block rows are split over `threads` pool threads
// in contiguous ranges of about equal work (blocks + rows). Throws
// std::invalid_argument for a bad batch/threads, std::bad_alloc.
void bsr_gemv(const BsrMatrix& m, const float* x, int batch, const float* bias, float* y, int threads, Isa isa);

// Internal: what the per-ISA kernels get. `xpad` holds each batch row of x
// zero-extended to n_block_cols * block_cols floats (stride `xstride`), so a
// tail block never reads past x; `acc` (batch * bsr_acc_rows floats) and
// `lanes` (8 × that, 32-byte aligned, for SIMD partial sums) are scratch
// owned by the calling thread.
struct BsrRowsArgs {
  const BsrMatrix* m = nullptr;
  const float* xpad = nullptr;
  size_t xstride = 0;
  int batch = 1;
  const float* bias = nullptr;
  float* y = nullptr;
  float* acc = nullptr;
  float* lanes = nullptr;
};

// Padding is never computed: block row br has bsr_rows_in(m, br) rows inside
// the matrix, and a block wider than the whole matrix (block_cols > cols) only
// bsr_width(m) columns. The per-batch-row stride of `acc` is bsr_acc_rows(m).
// (static: files built with different ISA flags include this header, and an
// inline function with external linkage is one symbol the linker may take
// from either object.)
static inline size_t bsr_min(uint64_t a, uint64_t b) { return static_cast<size_t>(a < b ? a : b); }
static inline size_t bsr_rows_in(const BsrMatrix& m, uint64_t br) { return bsr_min(m.block_rows, m.rows - br * m.block_rows); }
static inline size_t bsr_width(const BsrMatrix& m) { return bsr_min(m.block_cols, m.cols); }
static inline size_t bsr_acc_rows(const BsrMatrix& m) { return bsr_min(m.block_rows, m.rows); }

// One ISA's kernel: block rows [br0, br1) (common/dispatch.h). Scalar is the reference.
struct BsrOps {
  void (*rows)(const BsrRowsArgs& a, uint64_t br0, uint64_t br1);
};
extern const BsrOps kBsrScalar;
#if IE_HAVE_X86
extern const BsrOps kBsrAvx2;
#endif
extern const IsaTable<BsrOps> kBsrTable;

// The BSR variant that runs for a resolved `isa` (what benchmarks report).
Isa bsr_kernel_isa(Isa isa);

// Writes block row br's sums (acc[b * bsr_acc_rows + i]) plus bias into y.
// Shared by the kernels.
void bsr_store_rows(const BsrRowsArgs& a, uint64_t br);

}  // namespace ie
