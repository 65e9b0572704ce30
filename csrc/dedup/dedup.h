// Lossless dedup (docs/formats/dedup.md): a grouped tensor is rebuilt from
// its group's default payload, its mask (which bytes differ from the
// default) and its exceptions (the differing bytes in ascending position):
//
//     out[i] = mask bit i ? exc[k++] : def[i]
//
// The mask is stored sparse, as a line mask: one 64-bit word per 64-byte
// line that holds a differing byte (bit j: byte 64 l + j, LSB first), then
// one bit per line saying which lines have a word. A range is rebuilt 64
// lines at a time (range.h): a block with few lines that have a word is a
// copy of the default plus a patch of those lines, any other block a
// branch-free step per line; the per-ISA bodies (DedupOps) supply the
// patch, the step and non-temporal copies.
//
// The JSON index is parsed and validated by the Python side
// (formats/dedup.py); DedupStore receives plain arrays and re-validates every
// number against the blob files it maps, because a loader must not trust its
// caller to have caught a malformed artifact. No global mutable state: every
// cache and counter lives in a DedupStore object.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/aligned.h"
#include "common/dispatch.h"
#include "common/isa.h"

namespace ie::dedup {

// Parallel split unit: reconstruction runs chunk by chunk, each chunk
// starting at a known cursor (the prefix table). A multiple of kBlock.
constexpr size_t kChunk = size_t(64) << 10;
constexpr size_t kLine = 64;              // tensor bytes per mask word
constexpr size_t kBlock = 64 * kLine;     // tensor bytes per 64 line bits
static_assert(kChunk % kBlock == 0, "chunks hold whole blocks");

// The reconstruction variant that runs for a resolved `isa`.
Isa kernel_isa(Isa isa);

// (static: included by files built with different ISA flags; see bsr.h)
static inline size_t line_count(size_t n) { return (n + kLine - 1) / kLine; }
static inline size_t line_bits_nbytes(size_t n) { return (line_count(n) + 7) / 8; }
static inline size_t chunk_count(size_t n) { return (n + kChunk - 1) / kChunk; }

// A member's mask region, split: `nwords` 8-byte words, then the line bits
// (line_bits_nbytes(n) bytes) of an n-byte tensor.
struct LineMask {
  const uint8_t* words = nullptr;
  size_t nwords = 0;
  const uint8_t* lines = nullptr;
  size_t n = 0;
};
// Splits a region of `region_nbytes` bytes; false when its size cannot be
// words + line bits (shorter than the line bits, or not whole words).
bool split_line_mask(const uint8_t* region, size_t region_nbytes, size_t n, LineMask* out);

// Where a walk through a member stands before some byte p: w = words of the
// lines before p's line (all words at p = n), k = exceptions before p.
struct Cursor {
  uint64_t w = 0, k = 0;
  bool operator==(const Cursor& o) const { return w == o.w && k == o.k; }
};

// Checks a line mask against an n-byte tensor with exc_count exceptions
// (docs/formats/dedup.md, "Definition": words = set line bits, no line bit
// past the last line, no zero word, no bit past byte n - 1, exceptions =
// set word bits) and fills prefix[c] = the cursor at chunk c's start, for c
// in [0, chunk_count(n)]. Returns {field, message} of the first broken rule
// (field "mask" or "exceptions.count"), or an empty message.
std::pair<std::string, std::string> check_line_mask(const LineMask& m, uint64_t exc_count,
                                                    std::vector<Cursor>* prefix);

// Set bits in `nbytes` bytes.
uint64_t popcount_bytes(const uint8_t* p, size_t nbytes);

// A member's regions inside the mapped blobs, valid while its store lives:
// what a kernel needs to rebuild any byte range where the member is used
// (fused_product.h) instead of a full copy.
struct MemberView {
  const uint8_t* def = nullptr;
  LineMask mask;
  const uint8_t* exc = nullptr;
  size_t exc_count = 0;
  size_t nbytes = 0;
  const std::vector<Cursor>* prefix = nullptr;  // check_line_mask's table
  // What one pass over the member reads: the default, the mask region and
  // the exceptions (a fused product's bytes, mb_per_token's count).
  size_t read_bytes() const { return nbytes + 8 * mask.nwords + line_bits_nbytes(nbytes) + exc_count; }
};

// The cursor at byte a <= nbytes (from the prefix table and the mask);
// never throws, so kernels call it inside parallel regions.
Cursor cursor_at(const MemberView& v, size_t a);

// One ISA's body of reconstruct_range (below) with `nt`: write `out` with
// non-temporal stores (the caller decides; the scalar reference copies).
// Each body is range.h's walk with the ISA's own line step, patch and
// stream (common/dispatch.h).
struct DedupOps {
  bool (*range)(const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, bool nt);
};
extern const DedupOps kDedupScalar;
#if IE_HAVE_X86
extern const DedupOps kDedupAvx2;    // AVX2
extern const DedupOps kDedupAvx512;  // AVX-512 VBMI2's vpexpandb
#endif
extern const IsaTable<DedupOps> kDedupTable;

// Bytes [a, b) of the member into `out` (b - a bytes), `c` the cursor at a;
// advances `c` to b. Returns false when the mask asks for more words or
// exceptions than the member has (never on validated input; nothing past
// them is read).
bool reconstruct_range(const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, Isa isa,
                       bool stream_stores = false);

// Whole-tensor reconstruction, split over `threads` (a ThreadPool) at chunk
// boundaries from the prefix table. Throws std::invalid_argument when mask
// and exceptions disagree (only possible on unvalidated input).
// `stream_stores` < 0: auto.
void reconstruct(const MemberView& v, uint8_t* out, int threads, Isa isa, int stream_stores = -1);

// A 64-byte aligned heap buffer shared between the cache and its readers:
// eviction drops the cache's reference, never memory a reader still holds.
struct Buffer {
  explicit Buffer(size_t n) : storage(n, /*zero=*/false), data(storage.data()), size(n) {}
  AlignedArray<uint8_t> storage;
  uint8_t* data;
  size_t size;
};
using BufferPtr = std::shared_ptr<Buffer>;

// Everything the loader is told; names and numbers straight from the index.
// Members are listed group by group (the index order), so error messages can
// name `groups[G].members[J]` exactly as the JSON does.
struct StoreSpec {
  std::string model_dir;
  std::string index_label = "model.dedup.json";  // prefix of error messages
  std::array<std::string, 3> blob_names;         // defaults, masks, exceptions
  std::array<int64_t, 3> blob_sizes{};
  int64_t alignment = 64;
  std::vector<std::string> names;
  std::vector<int64_t> member_group, mask_offset, mask_nbytes, exc_offset, exc_count;
  std::vector<int64_t> group_nbytes, group_default_offset;
};

struct StoreStats {
  uint64_t hits = 0, misses = 0, evictions = 0, bypasses = 0;
  uint64_t reconstructed_bytes = 0;
  // Products computed from the blobs where the member is used (fused GEMV,
  // nothing cached) and the blob bytes those calls read (default + mask +
  // exceptions, per call).
  uint64_t fused_calls = 0, fused_bytes = 0;
  size_t entries = 0, cached_bytes = 0, capacity_bytes = 0;
};

class MappedFile;

class DedupStore {
 public:
  // Maps the three blobs and validates everything before any use (see
  // docs/formats/dedup.md, "Loader rules"); throws std::invalid_argument
  // with a "FILE: FIELD: message" line on the first broken rule.
  DedupStore(const StoreSpec& spec, size_t cache_bytes, int threads, bool debug, Isa isa);
  ~DedupStore();
  DedupStore(const DedupStore&) = delete;
  DedupStore& operator=(const DedupStore&) = delete;

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  size_t nbytes(const std::string& name) const;  // throws std::out_of_range
  const std::vector<std::string>& names() const { return spec_.names; }
  size_t groups() const { return spec_.group_nbytes.size(); }
  Isa isa() const { return isa_; }
  int threads() const { return threads_; }

  // The tensor's bytes, from the LRU cache or reconstructed into it. A
  // tensor larger than the whole cache is returned uncached (a bypass).
  BufferPtr get(const std::string& name);
  // Whether get(name) keeps what it rebuilds (the member fits in the cache).
  bool cacheable(const std::string& name) const { return nbytes(name) <= capacity_; }
  // The member's regions, for kernels that rebuild it piecewise.
  MemberView view(const std::string& name) const;
  // Counts one fused product that read `bytes` of the blobs.
  void count_fused(size_t bytes);
  StoreStats stats() const;
  void clear_cache();

 private:
  void validate_and_index();
  MemberView view_at(size_t member) const;
  void log(const char* fmt, ...) const;

  StoreSpec spec_;
  size_t capacity_;
  int threads_;
  bool debug_;
  Isa isa_;
  std::array<std::unique_ptr<MappedFile>, 3> blobs_;
  std::unordered_map<std::string, size_t> index_;    // name -> member
  std::vector<std::vector<Cursor>> prefix_;          // per member, check_line_mask's table

  mutable std::mutex mu_;  // guards everything below
  std::list<size_t> lru_;  // member indices, most recent first
  struct Entry {
    BufferPtr buf;
    std::list<size_t>::iterator pos;
  };
  std::unordered_map<size_t, Entry> cache_;
  StoreStats st_;
};

}  // namespace ie::dedup
