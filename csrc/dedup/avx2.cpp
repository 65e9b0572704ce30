// AVX2 body of dedup reconstruction (compiled with -mavx2 only here).
//
// 256 output bytes per block, driven by their 32 mask bytes:
//  - an all-zero block (the common case for very sparse masks) is a copy;
//  - otherwise eight branch-free 32-byte steps. In a step each group of 8
//    output bytes expands its exceptions into place: its source is the 8
//    exception bytes starting at its first exception (four 8-byte loads at
//    the prefix popcounts of the step's mask bytes), and one pshufb puts
//    them where the mask bits are, with a control that is a table entry
//    indexed by the group's mask byte (rank of each set bit, +8 for the odd
//    group of a lane; 0x80 elsewhere). The same control then selects between
//    the expanded exceptions (high bit clear) and the default bytes (high bit
//    set) with one blend. ~25 instructions per 32 bytes, no data-dependent
//    branch.
// Branching per 32 or 64 bytes instead mispredicts constantly at ~1% density
// (a third to a half of the words are non-zero, at random). A step reads up
// to 32 exception bytes, so a block runs unchecked only while 256 exceptions
// remain readable; nearer the end of a tensor's exceptions each step checks,
// and falls back to the scalar reference (which checks every read).
#include <immintrin.h>

#include <cstring>
#include <memory>

#include "dedup.h"

namespace ie::dedup {

namespace {

// Control for one 128-bit lane, indexed by its 16 mask bits: byte j = rank
// of bit j among the set bits, or 0x80 where the bit is clear. 1 MiB,
// built once on first use and read-only after; sparse masks touch only the
// few entries with low popcounts, so the hot part stays in L1.
struct LaneTable {
  alignas(64) uint8_t ctl[65536][16];
  LaneTable() {
    for (unsigned m = 0; m < 65536; ++m) {
      unsigned r = 0;
      for (unsigned j = 0; j < 16; ++j) ctl[m][j] = (m >> j & 1u) ? static_cast<uint8_t>(r++) : 0x80;
    }
  }
};

const LaneTable& lane_table() {
  static const std::unique_ptr<const LaneTable> t = std::make_unique<const LaneTable>();
  return *t;
}

template <bool NT>
inline void put(uint8_t* p, __m256i v) {
  if constexpr (NT)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// One 32-byte step with mask word m: each lane loads the 16 exception bytes
// starting at its first exception and one pshufb puts them where the mask
// bits are; the same control selects default bytes (high bit set) in the
// blend. Reads exc[0, 32) at most; returns the exceptions consumed.
template <bool NT>
inline unsigned step_unchecked(const LaneTable& t, const uint8_t* def, const uint8_t* exc, uint8_t* out, uint32_t m) {
  const unsigned lo = m & 0xffffu, hi = m >> 16;
  const unsigned k1 = static_cast<unsigned>(__builtin_popcount(lo));
  const __m256i src = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(exc + k1),
                                          reinterpret_cast<const __m128i*>(exc));
  const __m256i ctl = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(t.ctl[hi]),
                                          reinterpret_cast<const __m128i*>(t.ctl[lo]));
  const __m256i x = _mm256_shuffle_epi8(src, ctl);
  const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(def));
  put<NT>(out, _mm256_blendv_epi8(x, d, ctl));
  return k1 + static_cast<unsigned>(__builtin_popcount(hi));
}

// The same with a bounds check: near the end of the exceptions, through the
// scalar reference (into a temporary, so the store stays one vector store).
template <bool NT>
size_t step_checked(const LaneTable& t, const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t avail,
                    uint8_t* out, uint32_t m) {
  if (avail >= 32) return step_unchecked<NT>(t, def, exc, out, m);
  alignas(32) uint8_t tmp[32];
  const size_t got = reconstruct_chunk_scalar(def, mask, exc, avail, tmp, 32);
  if (got != kOverrun) put<NT>(out, _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp)));
  return got;
}

template <bool NT>
size_t chunk(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_avail, uint8_t* out, size_t n) {
  const LaneTable& t = lane_table();
  size_t k = 0, i = 0;
  for (; i + 256 <= n; i += 256) {
    uint64_t w[4];
    std::memcpy(w, mask + i / 8, 32);
    if ((w[0] | w[1] | w[2] | w[3]) == 0) {
      for (size_t j = 0; j < 256; j += 32)
        put<NT>(out + i + j, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(def + i + j)));
      continue;
    }
    if (k + 256 <= exc_avail) {
      for (size_t j = 0; j < 8; ++j)
        k += step_unchecked<NT>(t, def + i + 32 * j, exc + k, out + i + 32 * j,
                                static_cast<uint32_t>(w[j / 2] >> (32 * (j % 2))));
      continue;
    }
    for (size_t j = 0; j < 8; ++j) {
      const size_t got = step_checked<NT>(t, def + i + 32 * j, mask + (i + 32 * j) / 8, exc + k, exc_avail - k,
                                          out + i + 32 * j, static_cast<uint32_t>(w[j / 2] >> (32 * (j % 2))));
      if (got == kOverrun) return kOverrun;
      k += got;
    }
  }
  for (; i + 32 <= n; i += 32) {
    uint32_t m;
    std::memcpy(&m, mask + i / 8, 4);
    const size_t got = step_checked<NT>(t, def + i, mask + i / 8, exc + k, exc_avail - k, out + i, m);
    if (got == kOverrun) return kOverrun;
    k += got;
  }
  if constexpr (NT) _mm_sfence();
  if (i < n) {
    const size_t got = reconstruct_chunk_scalar(def + i, mask + i / 8, exc + k, exc_avail - k, out + i, n - i);
    if (got == kOverrun) return kOverrun;
    k += got;
  }
  return k;
}

size_t reconstruct_chunk_avx2(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_avail,
                              uint8_t* out, size_t n, bool nt) {
  return nt ? chunk<true>(def, mask, exc, exc_avail, out, n) : chunk<false>(def, mask, exc, exc_avail, out, n);
}

}  // namespace

const DedupOps kDedupAvx2 = {reconstruct_chunk_avx2};

}  // namespace ie::dedup
