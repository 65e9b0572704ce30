// AVX-512 VBMI2 body of dedup reconstruction (compiled with AVX-512 flags
// only here). vpexpandb *is* the definition of the format: it writes the
// next popcount(k) source bytes, in order, to the lanes whose mask bit is
// set and keeps the default elsewhere. Per 64 output bytes:
//   k   = their 64 mask bits (one 8-byte load; LSB-first matches lane order)
//   src = the next popcount(k) exception bytes (a masked load: lanes past
//         the count are neither read nor able to fault, so the kernel never
//         reads beyond the member's exceptions, like the scalar reference)
//   out = expand(default, k, src)
// Branch-free: an all-zero k costs the same as any other (at ~1% density
// about half of the 64-byte words hold a set bit, at random).
#include <immintrin.h>

#include <cstring>

#include "dedup.h"

namespace ie::dedup {

namespace {

inline __mmask64 low_bits(size_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

size_t reconstruct_chunk_avx512(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_avail,
                                uint8_t* out, size_t n, bool stream_stores) {
  size_t k = 0;
  size_t i = 0;
  const bool nt = stream_stores && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t m;
    std::memcpy(&m, mask + i / 8, 8);
    const size_t c = static_cast<size_t>(__builtin_popcountll(m));
    if (c > exc_avail - k) return kOverrun;
    const __m512i d = _mm512_loadu_si512(def + i);
    const __m512i src = _mm512_maskz_loadu_epi8(low_bits(c), exc + k);
    const __m512i r = _mm512_mask_expand_epi8(d, m, src);
    if (nt)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i), r);
    else
      _mm512_storeu_si512(out + i, r);
    k += c;
  }
  if (i < n) {  // the tail: fewer than 64 bytes, masked loads and store
    const size_t rem = n - i;
    uint64_t m = 0;
    std::memcpy(&m, mask + i / 8, (rem + 7) / 8);
    m &= low_bits(rem);
    const size_t c = static_cast<size_t>(__builtin_popcountll(m));
    if (c > exc_avail - k) return kOverrun;
    const __mmask64 t = low_bits(rem);
    const __m512i d = _mm512_maskz_loadu_epi8(t, def + i);
    const __m512i src = _mm512_maskz_loadu_epi8(low_bits(c), exc + k);
    _mm512_mask_storeu_epi8(out + i, t, _mm512_mask_expand_epi8(d, m, src));
    k += c;
  }
  if (nt) _mm_sfence();
  return k;
}

}  // namespace

const DedupOps kDedupAvx512 = {reconstruct_chunk_avx512};

}  // namespace ie::dedup
