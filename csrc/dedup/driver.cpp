// Dedup reconstruction: the scalar reference body, the ISA table and the
// portable driver (chunk prefix table, OpenMP split).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dedup.h"

namespace ie::dedup {

size_t reconstruct_chunk_scalar(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_avail,
                                uint8_t* out, size_t n, bool /*stream_stores*/) {
  // The definition, one mask byte (8 output bytes) at a time; a zero mask
  // byte is a plain copy, which is the only shortcut taken.
  size_t k = 0;
  for (size_t i = 0; i < n; i += 8) {
    const size_t len = std::min<size_t>(8, n - i);
    const unsigned m = mask[i >> 3];
    if (m == 0) {
      std::memcpy(out + i, def + i, len);
      continue;
    }
    for (size_t j = 0; j < len; ++j) {
      if (m >> j & 1u) {
        if (k == exc_avail) return kOverrun;
        out[i + j] = exc[k++];
      } else {
        out[i + j] = def[i + j];
      }
    }
  }
  return k;
}

const DedupOps kDedupScalar = {reconstruct_chunk_scalar};

const IsaTable<DedupOps> kDedupTable = {{&kDedupScalar,
#if IE_HAVE_X86
                                         &kDedupAvx2, &kDedupAvx512
#else
                                         nullptr, nullptr
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

namespace {

inline uint64_t load_u64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Bits [lo, hi) of a word, 0 <= lo <= hi <= 64.
inline uint64_t bit_range(unsigned lo, unsigned hi) {
  const uint64_t below_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return below_hi & ~((uint64_t{1} << lo) - 1);
}

// The 64 line bits of block `blk` (lines [64 blk, 64 blk + 64)), reading
// only line-bit bytes that exist.
inline uint64_t block_lines(const LineMask& m, size_t blk) {
  const size_t nb = line_bits_nbytes(m.n), at = blk * 8;
  if (at >= nb) return 0;
  uint64_t w = 0;
  std::memcpy(&w, m.lines + at, std::min<size_t>(8, nb - at));
  return w;
}

// Bytes [a, b) of a block under its byte mask (positions from the block's
// start): a scalar head up to a whole mask byte, then the ISA's body.
// Returns the exceptions consumed, or kOverrun.
size_t byte_range(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_avail, size_t a, size_t b,
                  uint8_t* out, Isa isa, bool nt) {
  size_t k = 0, i = a;
  for (; i < b && i % 8; ++i) {
    if (mask[i / 8] >> (i % 8) & 1u) {
      if (k == exc_avail) return kOverrun;
      out[i - a] = exc[k++];
    } else {
      out[i - a] = def[i];
    }
  }
  if (i < b) {
    const size_t got = kDedupTable.ops(isa).chunk(def + i, mask + i / 8, exc + k, exc_avail - k, out + (i - a), b - i, nt);
    if (got == kOverrun) return kOverrun;
    k += got;
  }
  return k;
}

}  // namespace

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
  const LineMask& m = v.mask;
  if (c.k > v.exc_count || c.w > m.nwords || b > v.nbytes || a > b) return false;
  alignas(64) uint8_t bits[kBlock / 8];
  for (size_t blk = a / kBlock; a < b && blk * kBlock < b; ++blk) {
    const size_t base = blk * kBlock, s = std::max(a, base), e = std::min(b, base + kBlock);
    const unsigned l0 = static_cast<unsigned>((s - base) / kLine), l1 = static_cast<unsigned>((e - base + kLine - 1) / kLine);
    const uint64_t lw = block_lines(m, blk) & bit_range(l0, l1);
    if (lw == 0) {
      std::memcpy(out + (s - a), v.def + s, e - s);
      continue;
    }
    if (static_cast<uint64_t>(__builtin_popcountll(lw)) > m.nwords - c.w) return false;
    std::memset(bits + 8 * l0, 0, 8 * (l1 - l0));
    uint64_t w = c.w;
    for (uint64_t t = lw; t; t &= t - 1) std::memcpy(bits + 8 * __builtin_ctzll(t), m.words + 8 * w++, 8);
    const size_t got = byte_range(v.def + base, bits, v.exc + c.k, v.exc_count - c.k, s - base, e - base, out + (s - a),
                                  isa, nt);
    if (got == kOverrun) return false;
    c.k += got;
    // The cursor passes the lines wholly before e (all of them at the
    // tensor's end); a line e cuts keeps its word for the next range.
    const unsigned passed = e == v.nbytes ? l1 : static_cast<unsigned>((e - base) / kLine);
    c.w += static_cast<uint64_t>(__builtin_popcountll(lw & bit_range(l0, passed)));
  }
  return true;
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
#pragma omp parallel for num_threads(workers) schedule(static) if (workers > 1)
  for (long long ch = 0; ch < static_cast<long long>(chunks); ++ch) {
    const size_t a = static_cast<size_t>(ch) * kChunk, b = std::min(n, a + kChunk);
    Cursor c = (*v.prefix)[ch];
    if (!reconstruct_range(v, c, a, b, out + a, isa, nt) || !(c == (*v.prefix)[ch + 1]))
      bad.store(true, std::memory_order_relaxed);
  }
  if (bad.load()) throw std::invalid_argument("dedup: mask bits and exceptions disagree (malformed input)");
}

}  // namespace ie::dedup
