// Dedup reconstruction: the scalar reference body, the ISA table and the
// portable driver (chunk prefix table, chunks shared by a ThreadPool).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/thread_pool.h"
#include "dedup.h"
#include "range.h"

namespace ie::dedup {

namespace {

// The reference: the definition one set bit at a time, and no
// non-temporal store in portable C++ (a stream is a plain copy).
struct ScalarBody {
  void stream(uint8_t* d, const uint8_t* s, size_t n) const { std::memcpy(d, s, n); }
  void patch(uint64_t bits, const uint8_t* exc, uint8_t* out) const { patch_bits(bits, exc, out); }
  void line(const uint8_t* def, uint64_t word, const uint8_t* exc, uint8_t* out, bool /*nt*/) const {
    std::memcpy(out, def, kLine);
    patch_bits(word, exc, out);
  }
};

bool range_scalar(const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, bool nt) {
  return rebuild_range(ScalarBody{}, v, c, a, b, out, nt);
}

}  // namespace

const DedupOps kDedupScalar = {range_scalar};

const IsaTable<DedupOps> kDedupTable = {{&kDedupScalar,
#if IE_HAVE_X86
                                         &kDedupAvx2, nullptr, &kDedupAvx512
#else
                                         nullptr, nullptr, nullptr
#endif
}};

Isa kernel_isa(Isa isa) { return kDedupTable.pick(isa); }

uint64_t popcount_bytes(const uint8_t* p, size_t nbytes) {
  uint64_t total = 0;
  size_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    total += static_cast<uint64_t>(__builtin_popcountll(w));
  }
  for (; i < nbytes; ++i) total += static_cast<uint64_t>(__builtin_popcount(p[i]));
  return total;
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "mask words and line bits are little-endian");

bool split_line_mask(const uint8_t* region, size_t region_nbytes, size_t n, LineMask* out) {
  const size_t lb = line_bits_nbytes(n);
  if (region_nbytes < lb || (region_nbytes - lb) % 8 != 0) return false;
  out->words = region;
  out->nwords = (region_nbytes - lb) / 8;
  out->lines = region + (region_nbytes - lb);
  out->n = n;
  return true;
}

std::pair<std::string, std::string> check_line_mask(const LineMask& m, uint64_t exc_count,
                                                    std::vector<Cursor>* prefix) {
  const size_t n = m.n, lines = line_count(n), lb = line_bits_nbytes(n);
  if (lines % 8 && (m.lines[lb - 1] >> (lines % 8)) != 0)
    return {"mask", "line bits past the tensor's last line are set"};
  const uint64_t set = popcount_bytes(m.lines, lb);
  if (set != m.nwords)
    return {"mask", "the line bits name " + std::to_string(set) + " lines but the region holds " +
                        std::to_string(m.nwords) + " words"};
  const size_t chunks = chunk_count(n);
  prefix->assign(chunks + 1, Cursor{});
  Cursor c;
  for (size_t ch = 0; ch < chunks; ++ch) {
    (*prefix)[ch] = c;
    for (size_t blk = ch * (kChunk / kBlock); blk < (ch + 1) * (kChunk / kBlock) && blk * kBlock < n; ++blk) {
      for (uint64_t t = block_lines(m, blk); t; t &= t - 1) {
        const size_t line = blk * 64 + static_cast<size_t>(__builtin_ctzll(t));
        const uint64_t word = load_u64(m.words + 8 * c.w);
        if (word == 0)
          return {"mask", "word " + std::to_string(c.w) + " (line " + std::to_string(line) + ") is zero: a line without a differing byte has no word"};
        if (line == lines - 1 && n % kLine && (word >> (n % kLine)) != 0)
          return {"mask", "bits past the tensor's last byte are set"};
        c.k += static_cast<uint64_t>(__builtin_popcountll(word));
        ++c.w;
      }
    }
  }
  (*prefix)[chunks] = c;
  if (c.k != exc_count)
    return {"exceptions.count", "mask has " + std::to_string(c.k) + " set bits but the index records " +
                                    std::to_string(exc_count) + " exceptions"};
  return {};
}

Cursor cursor_at(const MemberView& v, size_t a) {
  const LineMask& m = v.mask;
  const size_t ch = a / kChunk, la = a / kLine;
  Cursor c = (*v.prefix)[ch];
  for (size_t line = ch * (kChunk / kLine); line < la;) {  // whole lines, a block of line bits at a time
    const size_t blk = line / 64;
    const unsigned lo = static_cast<unsigned>(line % 64), hi = static_cast<unsigned>(std::min<size_t>(64, la - blk * 64));
    for (uint64_t t = block_lines(m, blk) & bit_range(lo, hi); t && c.w < m.nwords; t &= t - 1)
      c.k += static_cast<uint64_t>(__builtin_popcountll(load_u64(m.words + 8 * c.w++)));
    line = (blk + 1) * 64;
  }
  if (a % kLine && (block_lines(m, la / 64) >> (la % 64) & 1u) && c.w < m.nwords)  // a's own line, below a
    c.k += static_cast<uint64_t>(__builtin_popcountll(load_u64(m.words + 8 * c.w) & ((uint64_t{1} << (a % kLine)) - 1)));
  return c;
}

bool reconstruct_range(const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, Isa isa, bool nt) {
  return kDedupTable.ops(isa).range(v, c, a, b, out, nt);
}

namespace {

// Below this, non-temporal stores cost more than they save: the output is
// likely read again soon and fits in the last-level cache.
constexpr size_t kStreamStoreMin = size_t(8) << 20;

}  // namespace

void reconstruct(const MemberView& v, uint8_t* out, int threads, Isa isa, int stream_stores) {
  const size_t n = v.nbytes, chunks = chunk_count(n);
  if (v.prefix == nullptr || v.prefix->size() != chunks + 1 || !((*v.prefix)[0] == Cursor{}) ||
      v.prefix->back().k != v.exc_count || v.prefix->back().w != v.mask.nwords)
    throw std::invalid_argument("dedup: chunk prefix table does not match the tensor");
  const bool aligned = (reinterpret_cast<uintptr_t>(out) & 31) == 0;
  const bool nt = aligned && (stream_stores < 0 ? n >= kStreamStoreMin : stream_stores > 0);
  const int workers = std::max(1, std::min<int>(threads, static_cast<int>(std::min<size_t>(chunks, 1 << 20))));
  std::atomic<bool> bad{false};
  ThreadPool pool(workers);
  parallel_for(pool, static_cast<int64_t>(chunks), 1, [&](int64_t c0, int64_t c1, int) {
    for (size_t ch = static_cast<size_t>(c0); ch < static_cast<size_t>(c1); ++ch) {
      const size_t a = ch * kChunk, b = std::min(n, a + kChunk);
      Cursor c = (*v.prefix)[ch];
      if (!reconstruct_range(v, c, a, b, out + a, isa, nt) || !(c == (*v.prefix)[ch + 1]))
        bad.store(true, std::memory_order_relaxed);
    }
  });
  if (bad.load()) throw std::invalid_argument("dedup: mask bits and exceptions disagree (malformed input)");
}

}  // namespace ie::dedup
