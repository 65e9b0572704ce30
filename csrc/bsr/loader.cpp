// BSR loader/validator (the file format, docs/formats/bsr.md).
// The rules and their order mirror formats/bsr.py line for line; a rule
// changed here must change there (tests/test_bsr_validator.py holds the two
// to the same code and field on every hostile input).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bsr.h"
#include "common/regular_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the BSR loader reads little-endian payloads in place; add byte swapping for this target"
#endif

namespace ie {

namespace {

constexpr char kMagic[8] = {'I', 'E', 'B', 'S', 'R', 0, 0, 0};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kHeaderBytes = 96;
constexpr uint32_t kDtypeF32 = 0;
constexpr uint64_t kU32Max = 0xFFFFFFFFull;

struct Header {
  uint32_t version, header_bytes;
  uint64_t rows, cols;
  uint32_t block_rows, block_cols;
  uint64_t n_block_rows, nnzb, row_ptr_bytes, col_idx_bytes, values_bytes;
  uint32_t value_dtype, flags, crc32, reserved;
};

template <class T>
T rd(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

Header decode_header(const uint8_t* b) {
  Header h;
  h.version = rd<uint32_t>(b + 8);
  h.header_bytes = rd<uint32_t>(b + 12);
  h.rows = rd<uint64_t>(b + 16);
  h.cols = rd<uint64_t>(b + 24);
  h.block_rows = rd<uint32_t>(b + 32);
  h.block_cols = rd<uint32_t>(b + 36);
  h.n_block_rows = rd<uint64_t>(b + 40);
  h.nnzb = rd<uint64_t>(b + 48);
  h.row_ptr_bytes = rd<uint64_t>(b + 56);
  h.col_idx_bytes = rd<uint64_t>(b + 64);
  h.values_bytes = rd<uint64_t>(b + 72);
  h.value_dtype = rd<uint32_t>(b + 80);
  h.flags = rd<uint32_t>(b + 84);
  h.crc32 = rd<uint32_t>(b + 88);
  h.reserved = rd<uint32_t>(b + 92);
  return h;
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// a * b, or false when it does not fit 64 bits.
bool mul(uint64_t a, uint64_t b, uint64_t* r) { return !__builtin_mul_overflow(a, b, r); }
bool add(uint64_t a, uint64_t b, uint64_t* r) { return !__builtin_add_overflow(a, b, r); }

// "0x1f" (like Python's f"{v:#x}"), or zero-padded to `width` digits without a prefix.
std::string hex(uint64_t v, int width = 0) {
  char buf[32];
  if (width) std::snprintf(buf, sizeof buf, "%0*llx", width, static_cast<unsigned long long>(v));
  else std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string fmt_float(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

BsrStatus fail(BsrError* err, BsrStatus s, std::string field, std::string message) {
  if (err) *err = {s, std::move(field), std::move(message)};
  return s;
}

// zero_dim and the block-column index range: shared by the file and the array paths.
BsrStatus check_dims(uint64_t rows, uint64_t cols, uint64_t br, uint64_t bc, BsrError* err) {
  const std::pair<const char*, uint64_t> dims[] = {{"rows", rows}, {"cols", cols}, {"block_rows", br}, {"block_cols", bc}};
  for (const auto& [name, v] : dims)
    if (v == 0) return fail(err, BsrStatus::ZeroDim, name, "must be > 0");
  const uint64_t nbc = ceil_div(cols, bc);
  if (nbc - 1 > kU32Max)
    return fail(err, BsrStatus::IndexRange, "cols",
                std::to_string(nbc) + " block columns (ceil(" + std::to_string(cols) + " / " + std::to_string(bc) +
                    ")) do not fit the u32 col_idx");
  return BsrStatus::Ok;
}

// The payload rules; the arrays have their declared lengths.
BsrStatus check_structure(const BsrMatrix& m, bool allow_nonfinite, BsrError* err) {
  const uint64_t nbr = m.n_block_rows, nbc = m.n_block_cols, nnzb = m.nnzb;
  const uint32_t* rp = m.row_ptr.data();
  const uint32_t* ci = m.col_idx.data();
  if (rp[0] != 0) return fail(err, BsrStatus::RowPtr, "row_ptr[0]", "must be 0, got " + std::to_string(rp[0]));
  for (uint64_t i = 1; i <= nbr; ++i)
    if (rp[i] < rp[i - 1])
      return fail(err, BsrStatus::RowPtr, "row_ptr[" + std::to_string(i) + "]",
                  std::to_string(rp[i]) + " < row_ptr[" + std::to_string(i - 1) + "] = " + std::to_string(rp[i - 1]) +
                      " (must not decrease)");
  if (rp[nbr] != nnzb)
    return fail(err, BsrStatus::RowPtr, "row_ptr[" + std::to_string(nbr) + "]",
                "must equal nnzb = " + std::to_string(nnzb) + ", got " + std::to_string(rp[nbr]));
  for (uint64_t k = 0; k < nnzb; ++k)
    if (ci[k] >= nbc)
      return fail(err, BsrStatus::ColIdx, "col_idx[" + std::to_string(k) + "]",
                  "block column " + std::to_string(ci[k]) + " is out of range (matrix has " + std::to_string(nbc) + ")");
  for (uint64_t br = 0; br < nbr; ++br)
    for (uint64_t k = uint64_t(rp[br]) + 1; k < rp[br + 1]; ++k)
      if (ci[k] <= ci[k - 1])
        return fail(err, BsrStatus::ColOrder, "col_idx[" + std::to_string(k) + "]",
                    "block row " + std::to_string(br) + ": block column " + std::to_string(ci[k]) +
                        " does not follow " + std::to_string(ci[k - 1]) + " (must strictly ascend)");
  const size_t bs = m.block_elems();
  const float* v = m.values.data();
  const size_t nv = m.values.size();
  if (!allow_nonfinite)
    for (size_t e = 0; e < nv; ++e)
      if (!std::isfinite(v[e]))
        return fail(err, BsrStatus::NonFinite, "values[" + std::to_string(e) + "]",
                    "non-finite value " + fmt_float(v[e]) + " (block " + std::to_string(e / bs) +
                        "); pass --allow-nonfinite to accept");
  const uint64_t tail_r = nbr * m.block_rows - m.rows;
  const uint64_t tail_c = nbc * m.block_cols - m.cols;
  if (tail_r || tail_c) {
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(v);
    for (uint64_t br = 0; br < nbr; ++br) {
      const bool last_r = tail_r && br == nbr - 1;
      for (uint64_t k = rp[br]; k < rp[br + 1]; ++k) {
        const bool last_c = tail_c && ci[k] == nbc - 1;
        if (!last_r && !last_c) continue;
        for (uint64_t i = 0; i < m.block_rows; ++i) {
          const bool row_out = last_r && i >= m.block_rows - tail_r;
          for (uint64_t j = 0; j < m.block_cols; ++j) {
            const size_t e = k * bs + i * m.block_cols + j;
            if ((row_out || (last_c && j >= m.block_cols - tail_c)) && bits[e] != 0)
              return fail(err, BsrStatus::Padding, "values[" + std::to_string(e) + "]",
                          "block (" + std::to_string(br) + ", " + std::to_string(ci[k]) + ") element (" +
                              std::to_string(i) + ", " + std::to_string(j) + ") lies outside the " +
                              std::to_string(m.rows) + "×" + std::to_string(m.cols) +
                              " matrix and must be +0.0, got " + fmt_float(v[e]));
          }
        }
      }
    }
  }
  return BsrStatus::Ok;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

bool read_all(std::FILE* f, void* dst, size_t n) { return n == 0 || std::fread(dst, 1, n, f) == n; }

BsrStatus load_impl(const std::string& path, bool allow_nonfinite, BsrMatrix* out, BsrError* err) {
  std::string why;
  struct stat st {};
  const int fd = ie::open_regular_file(path, &st, &why);
  if (fd < 0) return fail(err, BsrStatus::Io, "(file)", why);
  std::unique_ptr<std::FILE, FileCloser> f(::fdopen(fd, "rb"));
  if (!f) {
    ::close(fd);
    return fail(err, BsrStatus::Io, "(file)", std::strerror(errno));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);

  uint8_t hb[kHeaderBytes] = {};
  const size_t got = std::fread(hb, 1, kHeaderBytes, f.get());
  if (got < std::min<uint64_t>(size, kHeaderBytes)) return fail(err, BsrStatus::Io, "(file)", "read failed");
  if (size < sizeof kMagic || std::memcmp(hb, kMagic, sizeof kMagic) != 0) {
    std::string seen;
    for (size_t i = 0; i < std::min<uint64_t>(size, 8); ++i) seen += hex(hb[i], 2);
    return fail(err, BsrStatus::BadMagic, "magic", "not a BSR file (expected 'IEBSR\\0\\0\\0', got bytes " +
                                                       (seen.empty() ? std::string("(none)") : seen) + ")");
  }
  if (size < kHeaderBytes)
    return fail(err, BsrStatus::Truncated, "header",
                "file is " + std::to_string(size) + " bytes, shorter than the 96-byte header");
  const Header h = decode_header(hb);
  if (h.version != kVersion)
    return fail(err, BsrStatus::BadVersion, "version",
                "unsupported version " + std::to_string(h.version) + " (this build reads 1)");
  if (h.header_bytes != kHeaderBytes)
    return fail(err, BsrStatus::BadHeaderBytes, "header_bytes", "must be 96, got " + std::to_string(h.header_bytes));
  if (h.value_dtype != kDtypeF32)
    return fail(err, BsrStatus::BadDtype, "value_dtype",
                "unknown value dtype " + std::to_string(h.value_dtype) + " (0 = f32 is the only one defined)");
  if (h.flags != 0) return fail(err, BsrStatus::BadFlags, "flags", "must be 0, got " + hex(h.flags));
  if (h.reserved != 0) return fail(err, BsrStatus::BadReserved, "reserved", "must be 0, got " + hex(h.reserved));
  BsrStatus s = check_dims(h.rows, h.cols, h.block_rows, h.block_cols, err);
  if (s != BsrStatus::Ok) return s;
  const uint64_t nbr = ceil_div(h.rows, h.block_rows), nbc = ceil_div(h.cols, h.block_cols);
  if (h.n_block_rows != nbr)
    return fail(err, BsrStatus::SizeField, "n_block_rows",
                std::to_string(h.n_block_rows) + " disagrees with ceil(" + std::to_string(h.rows) + " / " +
                    std::to_string(h.block_rows) + ") = " + std::to_string(nbr));
  if (h.nnzb > kU32Max)
    return fail(err, BsrStatus::IndexRange, "nnzb", std::to_string(h.nnzb) + " does not fit the u32 row_ptr");
  uint64_t grid = 0;
  if (mul(nbr, nbc, &grid) && h.nnzb > grid)  // an overflowing grid holds any u32 nnzb
    return fail(err, BsrStatus::IndexRange, "nnzb",
                std::to_string(h.nnzb) + " exceeds the " + std::to_string(nbr) + "×" + std::to_string(nbc) + " = " +
                    std::to_string(grid) + " blocks of the grid");
  // Each expected size, or "does not fit 64 bits" (then no u64 field can equal it).
  uint64_t want_rp = 0, want_ci = 0, want_v = 0, tmp = 0;
  const bool ok_rp = add(nbr, 1, &tmp) && mul(tmp, 4, &want_rp);
  const bool ok_ci = mul(h.nnzb, 4, &want_ci);
  const bool ok_v = mul(h.nnzb, 4, &tmp) && mul(tmp, h.block_rows, &tmp) && mul(tmp, h.block_cols, &want_v);
  const struct {
    const char* field;
    uint64_t got, want;
    bool fits;
  } sizes[] = {{"row_ptr_bytes", h.row_ptr_bytes, want_rp, ok_rp},
               {"col_idx_bytes", h.col_idx_bytes, want_ci, ok_ci},
               {"values_bytes", h.values_bytes, want_v, ok_v}};
  for (const auto& z : sizes)
    if (!z.fits || z.got != z.want)
      return fail(err, BsrStatus::SizeField, z.field,
                  std::to_string(z.got) + " disagrees with the dimensions (" +
                      (z.fits ? std::to_string(z.want) : std::string("more than 2^64")) + ")");
  uint64_t expected = 0;
  const bool ok_total = add(kHeaderBytes, h.row_ptr_bytes, &expected) && add(expected, h.col_idx_bytes, &expected) &&
                        add(expected, h.values_bytes, &expected);
  if (!ok_total || size != expected)
    return fail(err, BsrStatus::FileSize, "(size)",
                "file is " + std::to_string(size) + " bytes, header says " +
                    (ok_total ? std::to_string(expected) : std::string("more than 2^64")) + " (" +
                    (ok_total && size > expected ? "trailing bytes" : "truncated") + ")");

  // Every size now matches the file's, so these allocations are bounded by it.
  BsrMatrix m;
  m.rows = h.rows;
  m.cols = h.cols;
  m.block_rows = h.block_rows;
  m.block_cols = h.block_cols;
  m.n_block_rows = nbr;
  m.n_block_cols = nbc;
  m.nnzb = h.nnzb;
  m.row_ptr = AlignedArray<uint32_t>(nbr + 1);
  m.col_idx = AlignedArray<uint32_t>(h.nnzb);
  m.values = AlignedArray<float>(h.values_bytes / 4);
  if (!read_all(f.get(), m.row_ptr.data(), h.row_ptr_bytes) || !read_all(f.get(), m.col_idx.data(), h.col_idx_bytes) ||
      !read_all(f.get(), m.values.data(), h.values_bytes))
    return fail(err, BsrStatus::Io, "(file)", "short read (file changed while loading?)");
  uint32_t crc = crc32_update(0, reinterpret_cast<const uint8_t*>(m.row_ptr.data()), h.row_ptr_bytes);
  crc = crc32_update(crc, reinterpret_cast<const uint8_t*>(m.col_idx.data()), h.col_idx_bytes);
  crc = crc32_update(crc, reinterpret_cast<const uint8_t*>(m.values.data()), h.values_bytes);
  if (crc != h.crc32)
    return fail(err, BsrStatus::Crc, "crc32",
                "payload checksum mismatch (stored " + hex(h.crc32, 8) + ", actual " + hex(crc, 8) + ")");
  s = check_structure(m, allow_nonfinite, err);
  if (s != BsrStatus::Ok) return s;
  *out = std::move(m);
  return BsrStatus::Ok;
}

}  // namespace

const char* bsr_status_name(BsrStatus s) {
  switch (s) {
    case BsrStatus::Ok: return "ok";
    case BsrStatus::Io: return "io";
    case BsrStatus::Alloc: return "alloc";
    case BsrStatus::BadMagic: return "bad_magic";
    case BsrStatus::Truncated: return "truncated";
    case BsrStatus::BadVersion: return "bad_version";
    case BsrStatus::BadHeaderBytes: return "bad_header_bytes";
    case BsrStatus::BadDtype: return "bad_dtype";
    case BsrStatus::BadFlags: return "bad_flags";
    case BsrStatus::BadReserved: return "bad_reserved";
    case BsrStatus::ZeroDim: return "zero_dim";
    case BsrStatus::SizeField: return "size_field";
    case BsrStatus::IndexRange: return "index_range";
    case BsrStatus::FileSize: return "file_size";
    case BsrStatus::Crc: return "crc";
    case BsrStatus::RowPtr: return "row_ptr";
    case BsrStatus::ColIdx: return "col_idx";
    case BsrStatus::ColOrder: return "col_order";
    case BsrStatus::NonFinite: return "nonfinite";
    case BsrStatus::Padding: return "padding";
  }
  return "unknown";
}

BsrStatus bsr_load(const std::string& path, bool allow_nonfinite, BsrMatrix* out, BsrError* err) {
  *out = BsrMatrix{};
  if (err) *err = BsrError{};
  try {
    return load_impl(path, allow_nonfinite, out, err);
  } catch (const std::bad_alloc&) {
    return fail(err, BsrStatus::Alloc, "(file)", "out of memory");
  }
}

BsrStatus bsr_from_arrays(uint64_t rows, uint64_t cols, uint64_t block_rows, uint64_t block_cols,
                          const uint32_t* row_ptr, size_t n_row_ptr, const uint32_t* col_idx, size_t n_col_idx,
                          const float* values, size_t n_values, bool allow_nonfinite, BsrMatrix* out,
                          BsrError* err) {
  *out = BsrMatrix{};
  if (err) *err = BsrError{};
  if (block_rows > kU32Max || block_cols > kU32Max)
    return fail(err, BsrStatus::SizeField, block_rows > kU32Max ? "block_rows" : "block_cols", "must fit u32");
  BsrStatus s = check_dims(rows, cols, block_rows, block_cols, err);
  if (s != BsrStatus::Ok) return s;
  const uint64_t nbr = ceil_div(rows, block_rows), nbc = ceil_div(cols, block_cols);
  if (n_row_ptr - 1 != nbr)
    return fail(err, BsrStatus::SizeField, "row_ptr",
                "must have " + std::to_string(nbr) + " + 1 entries, got " + std::to_string(n_row_ptr));
  if (n_col_idx > kU32Max)
    return fail(err, BsrStatus::IndexRange, "col_idx", "must have at most 2^32 - 1 entries");
  uint64_t want_v = 0;
  if (!mul(n_col_idx, block_rows, &want_v) || !mul(want_v, block_cols, &want_v) || n_values != want_v)
    return fail(err, BsrStatus::SizeField, "values",
                "must have nnzb × block_rows × block_cols = " + std::to_string(n_col_idx) + " × " +
                    std::to_string(block_rows) + " × " + std::to_string(block_cols) + " elements, got " +
                    std::to_string(n_values));
  try {
    BsrMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.block_rows = static_cast<uint32_t>(block_rows);
    m.block_cols = static_cast<uint32_t>(block_cols);
    m.n_block_rows = nbr;
    m.n_block_cols = nbc;
    m.nnzb = n_col_idx;
    m.row_ptr = AlignedArray<uint32_t>(n_row_ptr);
    m.col_idx = AlignedArray<uint32_t>(n_col_idx);
    m.values = AlignedArray<float>(n_values);
    std::memcpy(m.row_ptr.data(), row_ptr, 4 * n_row_ptr);
    if (n_col_idx) std::memcpy(m.col_idx.data(), col_idx, 4 * n_col_idx);
    if (n_values) std::memcpy(m.values.data(), values, 4 * n_values);
    s = check_structure(m, allow_nonfinite, err);
    if (s != BsrStatus::Ok) return s;
    *out = std::move(m);
    return BsrStatus::Ok;
  } catch (const std::bad_alloc&) {
    return fail(err, BsrStatus::Alloc, "(memory)", "out of memory");
  }
}

}  // namespace ie
