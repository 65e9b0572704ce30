// AVX2 body of dedup reconstruction (compiled with -mavx2 only here), for
// range.h's walk.
//
// A line of a dense block is two branch-free 32-byte steps: each 128-bit
// lane loads the 16 exception bytes starting at its first exception, and one
// pshufb puts them where the mask bits are, with a control that is a table
// entry indexed by the lane's 16 mask bits (rank of each set bit; 0x80 where
// the bit is clear); the same control then keeps the default bytes (high bit
// set) in a blend. A clean line (word 0) is the same steps: all default.
// A line of a sparse block is patched one set bit at a time, like the
// reference: most hold a few differing bytes (a redrawn float is up to 4),
// and their table entries would be scattered over the 1 MiB table.
#include <immintrin.h>

#include <cstring>
#include <memory>

#include "dedup.h"
#include "range.h"

namespace ie::dedup {

namespace {

// Control for one 128-bit lane, indexed by its 16 mask bits: byte j = rank
// of bit j among the set bits, or 0x80 where the bit is clear. 1 MiB,
// built once on first use and read-only after.
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

// One 32-byte step with mask word m: each lane loads the 16 exception bytes
// starting at its first exception and one pshufb puts them where the mask
// bits are; the same control selects the default bytes (high bit set) in
// the blend. Reads exc[0, 32) at most; returns the exceptions consumed.
template <bool NT>
inline unsigned step(const LaneTable& t, const uint8_t* def, const uint8_t* exc, uint8_t* out, uint32_t m) {
  const unsigned lo = m & 0xffffu, hi = m >> 16;
  const unsigned k1 = static_cast<unsigned>(__builtin_popcount(lo));
  const __m256i src = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(exc + k1),
                                          reinterpret_cast<const __m128i*>(exc));
  const __m256i ctl = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(t.ctl[hi]),
                                          reinterpret_cast<const __m128i*>(t.ctl[lo]));
  const __m256i x = _mm256_shuffle_epi8(src, ctl);
  const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(def));
  if constexpr (NT)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), _mm256_blendv_epi8(x, d, ctl));
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_blendv_epi8(x, d, ctl));
  return k1 + static_cast<unsigned>(__builtin_popcount(hi));
}

// n bytes with non-temporal stores where dst is 32-byte aligned.
inline void stream32(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t i = 0;
  if ((reinterpret_cast<uintptr_t>(dst) & 31) == 0)
    for (; i + 32 <= n; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  std::memcpy(dst + i, src + i, n - i);
}

struct Avx2Body {
  void stream(uint8_t* d, const uint8_t* s, size_t n) const { stream32(d, s, n); }
  void patch(uint64_t bits, const uint8_t* exc, uint8_t* out) const { patch_bits(bits, exc, out); }
  const LaneTable& t = lane_table();
  void line(const uint8_t* def, uint64_t word, const uint8_t* exc, uint8_t* out, bool nt) const {
    const uint32_t lo = static_cast<uint32_t>(word), hi = static_cast<uint32_t>(word >> 32);
    if (nt && (reinterpret_cast<uintptr_t>(out) & 31) == 0) {
      step<true>(t, def + 32, exc + step<true>(t, def, exc, out, lo), out + 32, hi);
    } else {
      step<false>(t, def + 32, exc + step<false>(t, def, exc, out, lo), out + 32, hi);
    }
  }
};

bool range_avx2(const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, bool nt) {
  const bool ok = rebuild_range(Avx2Body{}, v, c, a, b, out, nt);
  if (nt) _mm_sfence();
  return ok;
}

}  // namespace

const DedupOps kDedupAvx2 = {range_avx2};

}  // namespace ie::dedup
