// VNNI prefill kernels over two rows8 tiles at once: 16 rows in the lanes of
// one 512-bit vector (tile t's eight in lanes 0..7, tile t + 1's in 8..15),
// eight tokens per pass. Included by rows8_tiles.h under IE_ROWS8_ZMM only,
// inside its namespace, after the 256-bit kernels whose helpers it uses.
//
// Why: the 256-bit VNNI tiles broadcast four activation bytes for every
// vpdpbusd, and on Zen 4 that load, not the multiply, is the limit: one
// thread reached 234 G multiply-adds/s with register operands and 145-185
// with a broadcast load per 256-bit vpdpbusd, while a 512-bit vpdpbusd,
// twice the products per broadcast, kept 224-233 (the same core issues one
// 512-bit or two 256-bit vpdpbusd per cycle). The pair tiles also halve the
// per-token work after each block (offset, convert, scale), which now
// covers 16 rows.
//
// The layout is rows8's, unchanged: tile t + 1's bytes lie tile_bytes after
// tile t's, at the same offsets. Each lane sees the integers and then the
// float operations of the 256-bit kernel of its type in the same order, so
// every output is the same float (tests/test_gemv.py compares the ISAs bit
// for bit). Every quantized type has one; the float types have no rows8
// copy (pair_kernel returns nullptr).
#pragma once

// The 32 bytes at w in tile t (lanes 0..7) and in tile t + 1 (lanes 8..15).
IE_INLINE __m512i load_pair(const uint8_t* w, size_t tile_bytes) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + tile_bytes));
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// load8's eight scales of each tile as 16 floats.
template <int SB>
IE_INLINE __m512 load16(const uint8_t* p, size_t tile_bytes) {
  if constexpr (SB == 1) {  // E8M0 bytes e: 2^(e - 128) by vscalefps, exact down to the subnormals (load8's floats)
    int64_t e[2];
    std::memcpy(&e[0], p, 8);
    std::memcpy(&e[1], p + tile_bytes, 8);
    const __m512 ef = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e))));
    return _mm512_scalef_ps(_mm512_set1_ps(1.f), _mm512_sub_ps(ef, _mm512_set1_ps(128.f)));
  }
  const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(load8<SB>(p)));
  return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(load8<SB>(p + tile_bytes)), 1));
}

// Lanes 0..7 (h = 0: tile t's rows) or 8..15 (tile t + 1's).
IE_INLINE __m256 half_of(__m512 v, int h) {
  return h == 0 ? _mm512_castps512_ps256(v) : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// super_finish over a pair, for N tokens: acc += (d factor S) x
// (d: the f16s at hd, both tiles'; S: the tokens' integer sums over the
// super-block; xd: their activation scales, Q8Super's, one per token).
template <int N>
IE_INLINE void super_finish(const uint8_t* hd, size_t tb, float factor, const float* xd, const __m512i (&S)[N],
                            __m512 (&acc)[N]) {
  const __m512 d = _mm512_mul_ps(load16<2>(hd, tb), _mm512_set1_ps(factor));  // (exact: a power of two)
  for (int b = 0; b < N; ++b) acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(S[b])), _mm512_set1_ps(xd[b]), acc[b]);
}

IE_INLINE __m512i bcast4z(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Both tiles' group at w, prefetched as prefetch_group does one tile's.
template <int N = 1>
IE_INLINE void prefetch_pair(const Rows8& p, const uint8_t* w, int b0, int j = 0) {
  prefetch_group<N>(p, w, b0, j);
  prefetch_group<N>(p, w + p.tile_bytes, b0, j);
}

constexpr int kPairTokens = kWide;  // a pass's tokens, as over one tile

// s[b] += the 4-bit layout's 32-block at w of both tiles (lo, hi: each
// vector's nibbles, through VALUES: the codes themselves, or a table of
// values + 128; HB = 32: with the fifth bits of the vector at w + 128 at 16,
// as block_dot_n joins them) times token b's codes (its block at xq + 32 b),
// one chain per token as VnniSums<8> keeps them.
// Vector v (0..3) of the 4-bit layout's 32-block at w of both tiles: lo
// (elements 8v .. 8v+3 of each row), hi (8v+4 .. 8v+7), each nibble
// through VALUES; with HB = 32, the fifth bits (h: the vector at w + 128)
// joined at 16. The pair kernels multiply them in place; the AMX ones
// store them as the tile multiply's B (rows8_amx.h).
template <int HB, class Values>
IE_INLINE void pair_values(const uint8_t* w, size_t tb, __m512i h, int v, Values&& values, __m512i* lo, __m512i* hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
  const __m512i wv = load_pair(w + 32 * v, tb);
  *lo = values(_mm512_and_si512(wv, m4));
  *hi = values(_mm512_and_si512(_mm512_srli_epi32(wv, 4), m4));
  if constexpr (HB > 0) {  // element 8v + j's fifth bit at bit v of its byte, 8v + 4 + j's at bit 4 + v
    *lo = _mm512_ternarylogic_epi32(*lo, _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - v)), m10, 0xF8);
    *hi = _mm512_ternarylogic_epi32(*hi, _mm512_srl_epi32(h, _mm_cvtsi32_si128(v)), m10, 0xF8);
  }
}

template <int HB = 0, class Values>
IE_INLINE void pair_block(const uint8_t* w, size_t tb, const int8_t* xq, Values&& values, __m512i (&s)[kPairTokens]) {
  const __m512i h = HB ? load_pair(w + 128, tb) : _mm512_setzero_si512();
  for (int v = 0; v < 4; ++v) {
    __m512i lo, hi;
    pair_values<HB>(w, tb, h, v, values, &lo, &hi);
    for (int b = 0; b < kPairTokens; ++b) {
      s[b] = _mm512_dpbusd_epi32(s[b], lo, bcast4z(xq + 32 * b + 8 * v));
      s[b] = _mm512_dpbusd_epi32(s[b], hi, bcast4z(xq + 32 * b + 8 * v + 4));
      in_reg(s[b]);
    }
  }
}

IE_INLINE __m512i codes_as_is(__m512i c) { return c; }

// grid_values(T) + 128 by nibble (table_values' table in each 128-bit
// lane), for vpdpbusd's unsigned bytes; OFFSET false: the values as they
// are (the AMX kernels' signed tdpbssd).
template <WType T, bool OFFSET = true>
struct TableOf {
  __m512i table;
  TableOf()
      : table(_mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grid_values(T)))),
            _mm512_set1_epi8(static_cast<char>(OFFSET ? 0x80 : 0)))) {}
  IE_INLINE __m512i operator()(__m512i c) const { return _mm512_shuffle_epi8(table, c); }
};

// nib_tile_n over a pair (int4w, q4_0, q4_1: 4-bit codes, one scale and
// min per group; q5_0, q5_1: HB = 32, their fifth bits, offset 16).
template <int BPG, int SB, bool AFFINE, int HB = 0>
IE_INLINE void nib_pair(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kPairTokens]) {
  const size_t tb = p.tile_bytes;
  const int bpg = BPG > 0 ? BPG : p.bpg;
  int64_t k = 0;
  for (int64_t g = 0; g < p.groups; ++g) {
    prefetch_pair(p, w, b0);
    const uint8_t* sc = w + static_cast<size_t>(bpg) * (128 + HB);
    const __m512 scale = load16<SB>(sc, tb);
    const __m512 mins = AFFINE ? load16<SB>(sc + 8 * SB, tb) : _mm512_setzero_ps();
    for (int kb = 0; kb < bpg; ++kb, ++k, w += 128 + HB) {
      const int64_t kx = k * B + b0;
      __m512i s[kPairTokens];  // from the codes' offset: 8 (16) sum x off (s8), or nothing for affine codes
      for (int b = 0; b < kPairTokens; ++b) s[b] = _mm512_set1_epi32(AFFINE ? 0 : -x.s8[kx + b] * (HB ? 2 : 1));
      pair_block<HB>(w, tb, x.q + kx * 32, codes_as_is, s);
      for (int b = 0; b < kPairTokens; ++b) {
        acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[b]), _mm512_mul_ps(scale, _mm512_set1_ps(x.d[kx + b])), acc[b]);
        if constexpr (AFFINE) acc[b] = _mm512_fmadd_ps(mins, _mm512_set1_ps(x.ds[kx + b]), acc[b]);
      }
    }
    w += 8 * SB * (AFFINE ? 2 : 1);
  }
}

// signed_tile_n over a pair (iq4_nl, mxfp4 through their tables; q8_0's
// bytes with a flipped top bit), 128 sum x taken off per block.
template <WType T>
IE_INLINE void signed_pair(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kPairTokens]) {
  constexpr bool kTable = T != WType::Q8_0;
  constexpr int kCodes = kTable ? 128 : 256;
  const size_t tb = p.tile_bytes;
  for (int64_t k = 0; k < p.groups; ++k, w += p.group_bytes) {
    prefetch_pair(p, w, b0);
    const int64_t kx = k * B + b0;
    __m512i s[kPairTokens];  // from the values' offset: 128 sum x off (16 s8)
    for (int b = 0; b < kPairTokens; ++b) s[b] = _mm512_set1_epi32(-16 * x.s8[kx + b]);
    if constexpr (kTable) {
      pair_block(w, tb, x.q + kx * 32, TableOf<T>(), s);
    } else {
      for (int v = 0; v < 8; ++v) {
        const __m512i u = _mm512_xor_si512(load_pair(w + 32 * v, tb), _mm512_set1_epi8(static_cast<char>(0x80)));
        for (int b = 0; b < kPairTokens; ++b) {
          s[b] = _mm512_dpbusd_epi32(s[b], u, bcast4z(x.q + (kx + b) * 32 + 4 * v));
          in_reg(s[b]);
        }
      }
    }
    const __m512 d = load16<T == WType::MXFP4 ? 1 : 2>(w + kCodes, tb);
    for (int b = 0; b < kPairTokens; ++b)
      acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[b]), _mm512_mul_ps(d, _mm512_set1_ps(x.d[kx + b])), acc[b]);
  }
}

// xsh_shifts of both tiles' 16 rows (h: tile t's header).
IE_INLINE __m512i xsh_shifts_pair(const uint8_t* h, size_t tb, int j) {
  int64_t bits[2];
  std::memcpy(&bits[0], h + Rows8Iq4xsHeader::shifts, 8);
  std::memcpy(&bits[1], h + tb + Rows8Iq4xsHeader::shifts, 8);
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
  return _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(b, _mm512_set1_epi32(1 << j)), _mm512_set1_epi8(kIq4ShiftStep));
}

// A table functor whose values are shifted by sh (iq4_xsh's sub-block grids).
template <class Table>
struct ShiftedTable {
  Table table;
  __m512i sh;
  IE_INLINE __m512i operator()(__m512i c) const { return _mm512_add_epi8(table(c), sh); }
};

// The table for sub-block j of iq4xs_pair's types (h: tile t's header):
// iq4_xsh's shifted by its rows' grid bits, the others' as it is.
template <WType T, class Table>
IE_INLINE auto sub_block_table(const Table& table, const uint8_t* h, size_t tb, int j) {
  if constexpr (T == WType::IQ4_XSH) return ShiftedTable<Table>{table, xsh_shifts_pair(h, tb, j)};
  else return table;
}

// The 6-bit sub-scales of iq4_xs's rows8 header (iq3_s's and iq4_xsh's
// too) for both tiles' 16 rows, unpacked per sub-block: l_j - 32 per lane.
struct Iq4xsSubScales {
  __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();  // scales_l words, scales_h as int32
  Iq4xsSubScales() = default;
  IE_INLINE Iq4xsSubScales(const uint8_t* h, size_t tb) {
    const __m128i hs0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + Rows8Iq4xsHeader::scales_h));
    const __m128i hs1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + tb + Rows8Iq4xsHeader::scales_h));
    lo = load_pair(h + Rows8Iq4xsHeader::scales_l, tb);
    hi = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(_mm256_castsi128_si256(hs0), hs1, 1));
  }
  IE_INLINE __m512i mult(int j) const {
    const __m512i lo4 = _mm512_and_si512(_mm512_srl_epi32(lo, _mm_cvtsi32_si128(4 * j)), _mm512_set1_epi32(0xF));
    const __m512i hi2 = _mm512_and_si512(_mm512_srl_epi32(hi, _mm_cvtsi32_si128(2 * j)), _mm512_set1_epi32(3));
    return _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32(hi2, 4)), _mm512_set1_epi32(32));
  }
};

// iq4xs_tile_n over a pair (iq4_xs and the codebook types; iq4_xsh, its values shifted):
// per sub-block the 16 rows' sub-scales l - 32 from scales_l and scales_h,
// times the block's offset sums by vpmulld; d once per super-block.
template <WType T>
IE_INLINE void iq4xs_pair(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kPairTokens]) {
  using H = Rows8Iq4xsHeader;
  constexpr int kBlock = 32 * rows8_code_bits(T);
  const size_t tb = p.tile_bytes;
  const TableOf<T> table;
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    const Iq4xsSubScales ls(h, tb);
    __m512i S[kPairTokens];
    for (auto& v : S) v = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_pair<8>(p, w, b0, j);
      const __m512i mult = ls.mult(j);
      const int64_t kx = (g * 8 + j) * B + b0;
      __m512i s[kPairTokens];  // from the values' offset: 128 sum x off (16 s8)
      for (int b = 0; b < kPairTokens; ++b) s[b] = _mm512_set1_epi32(-16 * x.s8[kx + b]);
      pair_block(w + j * kBlock, tb, x.q + kx * 32, sub_block_table<T>(table, h, tb, j), s);
      for (int b = 0; b < kPairTokens; ++b) {
        S[b] = _mm512_add_epi32(S[b], _mm512_mullo_epi32(s[b], mult));
        in_reg(S[b]);
      }
    }
    super_finish(h + H::d, tb, rows8_d_factor(T), x.d + g * 8 * B + b0, S, acc);
  }
}

// lane_byte of 16 lanes: byte j (0..3) of each, zero-extended to int32
// (PAIRS false) or to both int16 halves (true).
template <bool PAIRS = false>
IE_INLINE __m512i lane_byte_z(__m512i v, int j) {
  constexpr char z = -128, b = PAIRS ? 0 : z;
  const __m512i base = _mm512_broadcast_i32x4(_mm_setr_epi8(0, z, b, z, 4, z, 4 + b, z, 8, z, 8 + b, z, 12, z, 12 + b, z));
  return _mm512_shuffle_epi8(v, _mm512_add_epi8(base, _mm512_set1_epi8(static_cast<char>(j))));
}

// q4_k's (q5_k's) packed 6-bit sub-scales (MINS false) or mins (true) of
// both tiles' 16 rows, from the three scale words of the header at h (the
// formulas of q4k_sub, 16 rows at once); of(j): sub-block j's per lane.
template <bool MINS>
struct KqSixBits {
  __m512i half[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};  // sub-blocks 0..3, 4..7: a byte each
  KqSixBits() = default;
  IE_INLINE KqSixBits(const uint8_t* h, size_t tb) {
    auto word = [h, tb](int k) { return load_pair(h + Rows8KqHeader::words + 32 * k, tb); };
    const __m512i low = word(MINS ? 1 : 0), w2 = word(2);
    half[0] = _mm512_and_si512(low, _mm512_set1_epi8(0x3F));
    half[1] = _mm512_or_si512(_mm512_and_si512(MINS ? _mm512_srli_epi32(w2, 4) : w2, _mm512_set1_epi8(0x0F)),
                              _mm512_and_si512(_mm512_srli_epi32(low, 2), _mm512_set1_epi8(0x30)));
  }
  IE_INLINE __m512i of(int j) const { return lane_byte_z(half[j < 4 ? 0 : 1], j % 4); }
};

// kq_min_sum of both tiles' 16 rows (lm: KqSixBits<true>), by vpdpwssd.
IE_INLINE __m512i kq_min_sum_pair(const __m512i (&half)[2], const int32_t* p) {
  const __m512i m = _mm512_set1_epi32(0x00FF00FF);
  auto pairs = [&](__m512i v, int odd) { return _mm512_and_si512(odd ? _mm512_srli_epi32(v, 8) : v, m); };
  __m512i n = _mm512_dpwssd_epi32(_mm512_setzero_si512(), pairs(half[0], 0), _mm512_set1_epi32(p[0]));
  n = _mm512_dpwssd_epi32(n, pairs(half[0], 1), _mm512_set1_epi32(p[1]));
  n = _mm512_dpwssd_epi32(n, pairs(half[1], 0), _mm512_set1_epi32(p[2]));
  return _mm512_dpwssd_epi32(n, pairs(half[1], 1), _mm512_set1_epi32(p[3]));
}

// kq_tile_n's floats over a pair, for N tokens: the super-block at h (its
// mins and scales), the tokens' integer sums S, their p16 from s and their
// scales from x.d + k (the super-block's first block).
template <int N>
IE_INLINE void kq_finish_pair(const uint8_t* h, size_t tb, const Q8Nat& x, int64_t s, int64_t k, const __m512i (&S)[N],
                              __m512 (&acc)[N]) {
  using H = Rows8KqHeader;
  const KqSixBits<true> lm(h, tb);
  const __m512 d = load16<2>(h + H::d, tb), dmin = load16<2>(h + H::dmin, tb);
  for (int b = 0; b < N; ++b) {
    const __m512i n = kq_min_sum_pair(lm.half, x.p16 + 4 * (s + b));
    const __m512 t = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(n), _mm512_mul_ps(d, _mm512_cvtepi32_ps(S[b])));
    acc[b] = _mm512_fmadd_ps(t, _mm512_set1_ps(x.d[k + b]), acc[b]);
  }
}

// kq_tile_n over a pair (q4_k, q5_k: Q5, fifth bits): the 16 rows' 6-bit
// sub-scales and mins from the three scale words; sub-block j's sums times
// its sub-scale by vpmulld, added up as integers over the super-block, then
// kq_tile_n's floats once per super-block and token. (Summed in floats per
// 32-block, under an activation scale each, this kernel ran 2.43-2.57 ms on
// 2048 x 5632 x 64 tokens, one Zen 5 thread; as integers 2.08-2.18.)
template <bool Q5>
IE_INLINE void kq_pair(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kPairTokens]) {
  constexpr int kBlock = 32 * rows8_code_bits(Q5 ? WType::Q5_K : WType::Q4_K);
  const size_t tb = p.tile_bytes;
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    const KqSixBits<false> ls(h, tb);
    __m512i S[kPairTokens];
    for (auto& v : S) v = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_pair<8>(p, w, b0, j);
      const __m512i mult = ls.of(j);
      const int64_t kx = (g * 8 + j) * B + b0;
      __m512i s[kPairTokens];
      for (auto& v : s) v = _mm512_setzero_si512();
      pair_block<Q5 ? 32 : 0>(w + j * kBlock, tb, x.q + kx * 32, codes_as_is, s);
      for (int b = 0; b < kPairTokens; ++b) {
        S[b] = _mm512_add_epi32(S[b], _mm512_mullo_epi32(s[b], mult));
        in_reg(S[b]);
      }
    }
    kq_finish_pair(h, tb, x, g * B + b0, g * 8 * B + b0, S, acc);
  }
}

// Vector v (0..3) of a 32-block of q6_k (codes 0..63: a nibble and a bit
// pair), q3_k (0..7: a bit pair and a third bit), q2_k (0..3: a bit pair)
// or the half_scaled_book types (their nibbles' table values + 128) of both tiles, as
// unsigned bytes: lo times elements 8v .. 8v+3, hi times 8v+4 .. 8v+7 (the
// bits sym16_block_dot_n and pairs_block_dot_n join).
template <WType T>
IE_INLINE void sym16_codes(const uint8_t* blk, size_t tb, int v, __m512i* lo, __m512i* hi) {
  auto sh = [](__m512i x, int n) {  // x shifted left by n, right by -n
    return n >= 0 ? _mm512_sll_epi32(x, _mm_cvtsi32_si128(n)) : _mm512_srl_epi32(x, _mm_cvtsi32_si128(-n));
  };
  if constexpr (half_scaled_book(T)) {
    const TableOf<T> table;
    const __m512i m4 = _mm512_set1_epi8(0x0F), wv = load_pair(blk + 32 * v, tb);
    *lo = table(_mm512_and_si512(wv, m4));
    *hi = table(_mm512_and_si512(_mm512_srli_epi32(wv, 4), m4));
  } else if constexpr (T == WType::Q6_K) {  // bit pairs at bits 4 (v % 2) (lo's) and 4 (v % 2) + 2 (hi's), moved to 4..5
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i wv = load_pair(blk + 32 * v, tb), hb = load_pair(blk + 128 + 32 * (v / 2), tb);
    *lo = _mm512_ternarylogic_epi32(_mm512_and_si512(wv, m4), sh(hb, 4 - 4 * (v % 2)), m30, 0xF8);  // a | (b & c)
    *hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(wv, 4), m4), sh(hb, 2 - 4 * (v % 2)), m30, 0xF8);
  } else {  // bit pairs at 4 (v % 2) and 4 (v % 2) + 2 of vector v / 2; q3_k's third bits v and 4 + v moved to 2
    const __m512i m3 = _mm512_set1_epi8(3), m04 = _mm512_set1_epi8(4);
    const __m512i wv = load_pair(blk + 32 * (v / 2), tb);
    *lo = _mm512_and_si512(sh(wv, -4 * (v % 2)), m3);
    *hi = _mm512_and_si512(sh(wv, -4 * (v % 2) - 2), m3);
    if constexpr (T == WType::Q3_K) {
      const __m512i hb = load_pair(blk + 64, tb);
      *lo = _mm512_ternarylogic_epi32(*lo, sh(hb, 2 - v), m04, 0xF8);  // a | (b & c)
      *hi = _mm512_ternarylogic_epi32(*hi, sh(hb, -2 - v), m04, 0xF8);
    }
  }
}

// One 16-element half (vectors 2 half and 2 half + 1) of a 32-block of
// sym16_codes' types for the eight tokens: sums (started by the caller
// from the codes' offset) += codes times the tokens' codes at xq + 32 b,
// then times mult by vpmulld into the super-block's integer sums S (one
// activation scale per super-block: Q8Super). (Summed as floats per
// 32-block, the first half's products had to wait in memory beside the
// second's sums and P.)
template <WType T>
IE_INLINE void half_products(const uint8_t* blk, size_t tb, int half, const int8_t* xq, __m512i mult,
                             __m512i (&sums)[kPairTokens], __m512i (&S)[kPairTokens]) {
  for (int v = 2 * half; v < 2 * half + 2; ++v) {
    __m512i lo, hi;
    sym16_codes<T>(blk, tb, v, &lo, &hi);
    for (int b = 0; b < kPairTokens; ++b) {
      sums[b] = _mm512_dpbusd_epi32(sums[b], lo, bcast4z(xq + 32 * b + 8 * v));
      sums[b] = _mm512_dpbusd_epi32(sums[b], hi, bcast4z(xq + 32 * b + 8 * v + 4));
      in_reg(sums[b]);
    }
  }
  for (int b = 0; b < kPairTokens; ++b) {
    S[b] = _mm512_add_epi32(S[b], _mm512_mullo_epi32(sums[b], mult));
    in_reg(S[b]);
  }
}

// q3_k's three scale words of both tiles (h: tile t's header), read once per super-block.
IE_INLINE void q3k_words(const uint8_t* h, size_t tb, __m512i (&words)[3]) {
  for (int k = 0; k < 3; ++k) words[k] = load_pair(h + Rows8Q3kHeader::words + 32 * k, tb);
}

// The offset sym16_codes' bytes carry: q6_k's 32, q3_k's 4, the table types' 128 (q2_k: its mins instead, 0).
constexpr int sym16_zero(WType t) { return t == WType::Q6_K ? 32 : t == WType::Q3_K ? 4 : t == WType::Q2_K ? 0 : 128; }

// The 16 rows' integer sub-scale of half `half` of sub-block j of a
// sym16_pair super-block (h: tile t's header): q6_k's int8 one (and the
// half_scaled_book types' 1 + 2 s, in q6_k's header); q3_k's 6-bit
// one less 32 from its scale words (q3k_words), as q3k_scale_word unpacks it
// (sub-blocks 4q .. 4q+3, q = j / 2, byte (2j + half) % 4). Shared by the
// pair and AMX kernels.
template <WType T>
IE_INLINE __m512i sym16_mult(const uint8_t* h, size_t tb, const __m512i (&words)[3], int j, int half) {
  if constexpr (T != WType::Q3_K) {
    const uint8_t* sc = h + Rows8Q6kHeader::scales + 16 * j + 8 * half;
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)),
                                                   _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + tb))));
  } else {
    const int q = j / 2;
    const __m512i lo = _mm512_and_si512(_mm512_srl_epi32(q % 2 ? words[1] : words[0], _mm_cvtsi32_si128(4 * (q / 2))),
                                        _mm512_set1_epi8(0x0F));
    const __m512i hi = _mm512_and_si512(_mm512_srl_epi32(words[2], _mm_cvtsi32_si128(2 * q)), _mm512_set1_epi8(3));
    return _mm512_sub_epi32(lane_byte_z(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), (2 * j + half) % 4),
                            _mm512_set1_epi32(32));
  }
}

// sym16_tile_n over a pair (q6_k, q3_k and the half_scaled_book types): each 16-element
// half's sums, less Z times its activation sum (h16; Z = 32, 4 or 128),
// times its sub-scales (sym16_mult; half_products), added up as integers;
// the floats once per super-block (super_finish).
template <WType T>
IE_INLINE void sym16_pair(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kPairTokens]) {
  constexpr int kBlock = 32 * rows8_code_bits(T);
  constexpr int kD = T == WType::Q3_K ? Rows8Q3kHeader::d : Rows8Q6kHeader::d;
  constexpr int kZ = sym16_zero(T);
  const size_t tb = p.tile_bytes;
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    __m512i words[3] = {};  // q3_k's scale words, once per super-block
    if constexpr (T == WType::Q3_K) q3k_words(h, tb, words);
    __m512i S[kPairTokens];
    for (auto& v : S) v = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_pair<8>(p, w, b0, j);
      const uint8_t* blk = w + j * kBlock;
      const int64_t kx = (g * 8 + j) * B + b0;
#pragma GCC unroll 1
      for (int half = 0; half < 2; ++half) {
        const __m512i mult = sym16_mult<T>(h, tb, words, j, half);
        __m512i sums[kPairTokens];  // from the codes' offset: Z times the half's activation sum off
        for (int b = 0; b < kPairTokens; ++b)
          sums[b] = _mm512_set1_epi32(-(static_cast<int16_t>(x.h16[2 * (kx + b) + half]) * kZ / 16));
        half_products<T>(blk, tb, half, x.q + kx * 32, mult, sums, S);
      }
    }
    super_finish(h + kD, tb, rows8_d_factor(T), x.d + g * 8 * B + b0, S, acc);
  }
}

// q2k_tile_n over a pair: codes 0..3, each half's sums times its 4-bit
// sub-scale (half_products), its mins against the activation's h16 pairs
// (32 m sum per half, one madd each), both added up as integers over the
// super-block; the floats once per super-block and token, as q2k_tile_n's.
// (With a float FMA per block and token for the mins, and one for the
// products, it ran at 0.45 of the int8 peak: 2048 x 5632 x 64 tokens, one
// Zen 5 thread, 3.03-3.07 -> 2.62-2.72 ms as integers.)
IE_INLINE void q2k_pair(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kPairTokens]) {
  using H = Rows8Q2kHeader;
  constexpr int kBlock = 32 * rows8_code_bits(WType::Q2_K);
  const size_t tb = p.tile_bytes;
  const __m512i m0f = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < p.groups; ++g, w += p.group_bytes) {
    const uint8_t* h = w + 8 * kBlock;
    __m512i S[kPairTokens], M[kPairTokens];
    for (auto& v : S) v = _mm512_setzero_si512();
    for (auto& v : M) v = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_pair<8>(p, w, b0, j);
      const uint8_t* blk = w + j * kBlock;
      // word j / 2: the bytes of sub-blocks 4 (j / 2) .. +3, of which 2j % 4 and 2j % 4 + 1 are this block's
      const __m512i word = load_pair(h + H::words + 32 * (j / 2), tb);
      const __m512i sc = _mm512_and_si512(word, m0f), mn = _mm512_and_si512(_mm512_srli_epi32(word, 4), m0f);
      const int64_t kx = (g * 8 + j) * B + b0;
#pragma GCC unroll 1
      for (int half = 0; half < 2; ++half) {
        __m512i sums[kPairTokens];
        for (auto& v : sums) v = _mm512_setzero_si512();
        half_products<WType::Q2_K>(blk, tb, half, x.q + kx * 32, lane_byte_z(sc, (2 * j + half) % 4), sums, S);
      }
      const __m512i mins[2] = {lane_byte_z<true>(mn, (2 * j) % 4), lane_byte_z<true>(mn, (2 * j + 1) % 4)};
      for (int b = 0; b < kPairTokens; ++b) {
        const int32_t* h16 = x.h16 + 2 * (kx + b);
        M[b] = _mm512_add_epi32(M[b], _mm512_add_epi32(_mm512_madd_epi16(_mm512_set1_epi32(h16[0]), mins[0]),
                                                        _mm512_madd_epi16(_mm512_set1_epi32(h16[1]), mins[1])));
      }
    }
    const __m512 d = load16<2>(h + H::d, tb);
    const __m512 dmin32 = _mm512_mul_ps(load16<2>(h + H::dmin, tb), _mm512_set1_ps(1.f / 32.f));
    const int64_t kg = g * 8 * B + b0;  // the super-block's first block: its activation scale (Q8Super)
    for (int b = 0; b < kPairTokens; ++b) {
      const __m512 t = _mm512_fnmadd_ps(dmin32, _mm512_cvtepi32_ps(M[b]), _mm512_mul_ps(d, _mm512_cvtepi32_ps(S[b])));
      acc[b] = _mm512_fmadd_ps(t, _mm512_set1_ps(x.d[kg + b]), acc[b]);
    }
  }
}

// Eight activation rows b0 .. b0 + 8 (of B) against the tiles at w and w +
// tile_bytes.
using PairKernel = void (*)(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0,
                            __m512 (&acc)[kPairTokens]);

// K as a function of its own with local accumulators (tile_fn's reasons).
template <void (*K)(const Rows8&, const uint8_t*, const Q8Nat&, int, int, __m512 (&)[kPairTokens])>
void pair_fn(const Rows8& p, const uint8_t* w, const Q8Nat& xr, int B, int b0, __m512 (&out)[kPairTokens]) {
  const Q8Nat x = xr;
  __m512 acc[kPairTokens];
  for (auto& v : acc) v = _mm512_setzero_ps();
  K(p, w, x, B, b0, acc);
  for (int b = 0; b < kPairTokens; ++b) out[b] = acc[b];
}

// The pair kernel of p's type (nullptr: a float type, no rows8 copy).
PairKernel pair_kernel(const Rows8& p) {
  switch (p.spec.type) {
    case WType::Q8_0: return pair_fn<signed_pair<WType::Q8_0>>;
    case WType::IQ4_NL: return pair_fn<signed_pair<WType::IQ4_NL>>;
    case WType::MXFP4: return pair_fn<signed_pair<WType::MXFP4>>;
    case WType::IQ4_XS: return pair_fn<iq4xs_pair<WType::IQ4_XS>>;
    case WType::IQ3_S: return pair_fn<iq4xs_pair<WType::IQ3_S>>;
    case WType::IQ3_XXS: return pair_fn<iq4xs_pair<WType::IQ3_XXS>>;
    case WType::IQ2_XXS: return pair_fn<iq4xs_pair<WType::IQ2_XXS>>;
    case WType::IQ4_XSH: return pair_fn<iq4xs_pair<WType::IQ4_XSH>>;
    case WType::Q4_K: return pair_fn<kq_pair<false>>;
    case WType::Q5_K: return pair_fn<kq_pair<true>>;
    case WType::Q6_K: return pair_fn<sym16_pair<WType::Q6_K>>;
    case WType::Q3_K: return pair_fn<sym16_pair<WType::Q3_K>>;
    case WType::IQ2_XS: return pair_fn<sym16_pair<WType::IQ2_XS>>;
    case WType::IQ2_S: return pair_fn<sym16_pair<WType::IQ2_S>>;
    case WType::IQ1_S: return pair_fn<sym16_pair<WType::IQ1_S>>;
    case WType::IQ1_M: return pair_fn<sym16_pair<WType::IQ1_M>>;
    case WType::Q2_K: return pair_fn<q2k_pair>;
    case WType::Q5_0: return pair_fn<nib_pair<1, 2, false, 32>>;
    case WType::Q5_1: return pair_fn<nib_pair<1, 2, true, 32>>;
    case WType::Int4w:
    case WType::Q4_0:
    case WType::Q4_1:
      return with_nib_params(p, [&](auto sb, auto aff) -> PairKernel {
        constexpr int SB = decltype(sb)::value;
        constexpr bool AFF = decltype(aff)::value;
        if (p.bpg == 1) return pair_fn<nib_pair<1, SB, AFF>>;
        if (p.bpg == 2) return pair_fn<nib_pair<2, SB, AFF>>;
        return pair_fn<nib_pair<0, SB, AFF>>;
      });
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:
    case WType::F16:
    case WType::BF16: break;
  }
  return nullptr;
}
