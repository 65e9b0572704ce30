// AVX-512 VBMI2 body of dedup reconstruction (compiled with AVX-512 flags
// only here), for range.h's walk. vpexpandb *is* the definition of the
// format: it writes the next popcount(k) source bytes, in order, to the
// lanes whose mask bit is set. Per line:
//   src = the next popcount(bits) exception bytes (a masked load: lanes past
//         the count are neither read nor able to fault, so the kernel never
//         reads beyond the member's exceptions, like the scalar reference)
//   out = expand(default, bits, src) for a line of a dense block; for a line
//         of a sparse block (already a copy of the default) expand(bits, src)
//         stored to the set lanes only (a masked store, so a line cut by the
//         range's ends needs no special case)
// Branch-free whatever the line's density.
#include <immintrin.h>

#include <cstring>

#include "dedup.h"
#include "range.h"

namespace ie::dedup {

namespace {

inline __mmask64 low_bits(size_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

// n bytes with non-temporal stores where dst is 64-byte aligned.
inline void stream64(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t i = 0;
  if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0)
    for (; i + 64 <= n; i += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  std::memcpy(dst + i, src + i, n - i);
}

struct Avx512Body {
  void stream(uint8_t* d, const uint8_t* s, size_t n) const { stream64(d, s, n); }
  // Any line, whole or cut: the store touches the set lanes only.
  void patch(uint64_t bits, const uint8_t* exc, uint8_t* out) const {
    const __m512i src = _mm512_maskz_loadu_epi8(low_bits(static_cast<size_t>(__builtin_popcountll(bits))), exc);
    _mm512_mask_storeu_epi8(out, bits, _mm512_maskz_expand_epi8(bits, src));
  }
  void line(const uint8_t* def, uint64_t word, const uint8_t* exc, uint8_t* out, bool nt) const {
    const __m512i src = _mm512_maskz_loadu_epi8(low_bits(static_cast<size_t>(__builtin_popcountll(word))), exc);
    const __m512i r = _mm512_mask_expand_epi8(_mm512_loadu_si512(def), word, src);
    if (nt && (reinterpret_cast<uintptr_t>(out) & 63) == 0)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out), r);
    else
      _mm512_storeu_si512(out, r);
  }
};

bool range_avx512(const MemberView& v, Cursor& c, size_t a, size_t b, uint8_t* out, bool nt) {
  const bool ok = rebuild_range(Avx512Body{}, v, c, a, b, out, nt);
  if (nt) _mm_sfence();
  return ok;
}

}  // namespace

const DedupOps kDedupAvx512 = {range_avx512};

}  // namespace ie::dedup
