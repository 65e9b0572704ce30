// The walk that rebuilds bytes [a, b) of a dedup member (dedup.h), shared by
// the per-ISA bodies: each ISA file instantiates it with its own body, so the
// walk's popcounts and bit scans compile to that ISA's instructions (a
// baseline x86-64 build has no popcnt: __builtin_popcountll is a libgcc call
// there, and __popcountdi2 showed in the fused GEMV's profile).
//
// A block of 64 lines (4 KiB) takes one of two paths, by how many of its
// lines have a word:
//  - sparse (at most kSparseLines): a copy of the default, then each
//    line with a word is patched. In a group that pays most lines are clean
//    (a redrawn float touches one line), so this is a copy plus a few
//    patches.
//  - dense: every line in one branch-free step, body.line(def, word, ...),
//    with word = 0 for a clean line. Branching per line mispredicts when
//    about half the lines are dirty, at random (1% of bytes differing).
// A line the range cuts, and a line whose step could read past the member's
// exceptions, is copied and patched instead.
//
// Everything here has internal linkage (an anonymous namespace in a header):
// each ISA object gets its own copy, never one the linker could share with
// an object built with other flags (tests/cpp/check_isa_symbols.py).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dedup.h"

namespace ie::dedup {
namespace {

// The most lines with a word a block may have for the sparse path: at 1/8
// of the lines the patches cost about what the branch-free steps do.
constexpr unsigned kSparseLines = 8;

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

// The definition of a patch, one set bit at a time: out[j] = exc[r] for the
// r-th set bit j of `bits`, other bytes untouched. The caller has checked
// that popcount(bits) exceptions are readable.
inline void patch_bits(uint64_t bits, const uint8_t* exc, uint8_t* out) {
  for (size_t r = 0; bits; bits &= bits - 1) out[__builtin_ctzll(bits)] = exc[r++];
}

// Bytes [a, b) of the member into out, `c` the cursor at a (advanced to b).
// Default bytes are copied with memcpy (as fast here as a vector loop, for
// the fused GEMV's few-KiB ranges too). `body` supplies, for its ISA:
//   stream(dst, src, n)          n default bytes with non-temporal stores (used with nt)
//   patch(bits, exc, dst)        patch_bits' effect (bits of any line, cut or whole)
//   line(def, word, exc, dst, nt) one whole line: dst = def patched by word, with
//                                non-temporal stores if nt (and dst is aligned for
//                                them); may read exc[0, 64) whatever popcount(word) is
// With `nt` (non-temporal stores) no byte is written twice, since a copy
// then a patch would read the streamed lines back: a clean block is streamed
// from the default, any other block goes line by line, each line streamed
// as it is made (a sparse block's clean lines straight from the default).
// Returns false when the mask asks for more words or exceptions than the
// member has (nothing past them is read).
template <class Body>
bool rebuild_range(const Body& body, const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, bool nt) {
  // Locals, not v's and c's fields: the byte stores below may alias any
  // memory, so fields would be reloaded (and c stored) after every store.
  const uint8_t* const def = v.def;
  const uint8_t* const exc = v.exc;
  const uint8_t* const words = v.mask.words;
  const uint64_t nwords = v.mask.nwords, exc_count = v.exc_count;
  uint64_t w = c.w, k = c.k;
  if (k > exc_count || w > nwords || b > v.nbytes || a > b) return false;
  for (size_t blk = a / kBlock; a < b && blk * kBlock < b; ++blk) {
    const size_t base = blk * kBlock, s = std::max(a, base), e = std::min(b, base + kBlock);
    const unsigned l0 = static_cast<unsigned>((s - base) / kLine);
    const unsigned l1 = static_cast<unsigned>((e - base + kLine - 1) / kLine);
    const uint64_t lw = block_lines(v.mask, blk) & bit_range(l0, l1);
    const unsigned dirty = static_cast<unsigned>(__builtin_popcountll(lw));
    if (dirty > nwords - w) return false;
    uint8_t* const dst = out + (s - a);  // bytes [s, e)
    uint64_t wl = w;                     // the next line's word
    // Line l's bytes [lo, hi) (cut by s and e) patched by its word.
    const auto patch_line = [&](unsigned l, uint64_t word) {
      const size_t line = base + kLine * l, lo = std::max(line, s), hi = std::min(line + kLine, e);
      const uint64_t bits = word & bit_range(static_cast<unsigned>(lo - line), static_cast<unsigned>(hi - line));
      const uint64_t cnt = static_cast<uint64_t>(__builtin_popcountll(bits));
      if (cnt > exc_count - k) return false;
      body.patch(bits >> (lo - line), exc + k, dst + (lo - s));
      k += cnt;
      return true;
    };
    if (dirty == 0 && nt) {
      body.stream(dst, def + s, e - s);
    } else if (dirty <= kSparseLines && !nt) {
      std::memcpy(dst, def + s, e - s);
      for (uint64_t t = lw; t; t &= t - 1)
        if (!patch_line(static_cast<unsigned>(__builtin_ctzll(t)), load_u64(words + 8 * wl++))) return false;
    } else {
      // Every line through body.line, or with kSkipClean (nt, a sparse
      // block) the clean ones streamed from the default: a branch per line,
      // predictable in such a block. Two instances, so the dense loop
      // carries no code for the other case.
      const auto lines = [&](auto skip_clean) {
        constexpr bool kSkipClean = decltype(skip_clean)::value;
        for (unsigned l = l0; l < l1; ++l) {
          // The line's word, or 0 (dirty > 0, so nwords > 0 and the clamped
          // load stays inside the words).
          const uint64_t has = lw >> l & 1u;
          const uint64_t word = load_u64(words + 8 * std::min<uint64_t>(wl, nwords - 1)) & (0 - has);
          wl += has;
          const size_t line = base + kLine * l;
          if (line < s || line + kLine > e || exc_count - k < kLine) {
            const size_t lo = std::max(line, s), hi = std::min(line + kLine, e);
            std::memcpy(dst + (lo - s), def + lo, hi - lo);
            if (!patch_line(l, word)) return false;
          } else if (kSkipClean && word == 0) {
            body.stream(dst + (line - s), def + line, kLine);
          } else {
            body.line(def + line, word, exc + k, dst + (line - s), nt);
            k += static_cast<uint64_t>(__builtin_popcountll(word));
          }
        }
        return true;
      };
      const bool ok = dirty <= kSparseLines ? lines(std::true_type{}) : lines(std::false_type{});
      if (!ok) return false;
    }
    // The cursor passes the lines wholly before e (all of them at the
    // tensor's end); a line e cuts keeps its word for the next range.
    const unsigned passed = e == v.nbytes ? l1 : static_cast<unsigned>((e - base) / kLine);
    w += static_cast<uint64_t>(__builtin_popcountll(lw & bit_range(l0, passed)));
  }
  c = Cursor{w, k};
  return true;
}

}  // namespace
}  // namespace ie::dedup
