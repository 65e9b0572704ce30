// AMX prefill kernels over two rows8 tiles at once: the pair kernels'
// 16 rows (rows8_pairs.h), sixteen tokens per pass, the integer products
// of a 32-block made by one tile multiply (q6_k and q3_k: one per
// 16-element half, whose sub-scales differ). Included by rows8_tiles.h under
// IE_ROWS8_AMX only, inside its namespace, after rows8_pairs.h.
//
// Why: a pair kernel spends 8 vpdpbusd per block and token (128 for 16
// tokens), each with a broadcast load; one tdpbssd does the same 16 x 16 x
// 32 products (measured here: 1.6 T multiply-adds/s a thread against the
// VNNI peak's 0.24). What is left per block is what no int8 engine
// escapes with a scale per 32 activations: each token's sums converted and
// scaled into its accumulator (a tile store, then per token a load,
// convert, multiply and FMA).
//
// The layout is rows8's, unchanged: a pair's block, unpacked, is the B
// operand's VNNI form as it stands. Vector v of the 4-bit layout holds, in
// lane n (row n of the pair), the four codes of elements 8v .. 8v+3 in its
// low nibbles and of 8v+4 .. 8v+7 in its high ones, so its low and high
// values are rows 2v and 2v + 1 of B (4 consecutive k of each of 16
// columns); q8_0's vector v is row v. The tokens' blocks lie 32 bytes
// apart in the activations (Q8Nat), so A is loaded in place.
//
// Values go in signed (tdpbssd): symmetric codes minus their offset (8, 16
// for the five-bit types, 32 for q6_k, 4 for q3_k), affine and k-quant codes
// as they are, the tables' values, q8_0's bytes. The sums are the pair
// kernels' integers exactly (they take the offset's term off separately), and each token's
// float operations are the pair kernel's in the same order, so every
// output is the same float (tests/test_gemv.py compares the ISAs bit for
// bit).
#pragma once

constexpr int kAmxTokens = 16;

// Tile registers: C (int32 sums) in 0 and 1, A (activations) in 2 and 3, B
// (weights) in 4 and 5; a block of parity P uses C P, A 2 + P and B 4 + P,
// so two blocks' tile work and conversions overlap (AmxTileConfig:
// common/amx_tiles.h, which rows8_tiles.h includes at this level).

// Loads the kernels' tile shapes into this thread's tile configuration.
IE_INLINE void amx_configure() {
  AmxTileConfig c;
  for (int p = 0; p < 2; ++p) {
    c.rows[p] = kAmxTokens, c.colsb[p] = 64;      // C: 16 tokens x 16 rows of int32
    c.rows[2 + p] = kAmxTokens, c.colsb[2 + p] = 32;  // A: 16 tokens x 32 codes
    c.rows[4 + p] = 8, c.colsb[4 + p] = 64;       // B: 32 codes / 4 x 16 rows x 4
  }
  _tile_loadconfig(&c);
}

// A block of both tiles unpacked as B: eight 64-byte rows.
struct alignas(64) AmxBlock {
  __m512i b[8];
};

// The 4-bit layout's block at w of both tiles as signed values
// (pair_values' vectors), then OFF off each.
template <int HB, int OFF, class Values>
IE_INLINE void amx_unpack4(const uint8_t* w, size_t tb, Values&& values, AmxBlock* out) {
  const __m512i h = HB ? load_pair(w + 128, tb) : _mm512_setzero_si512(), off = _mm512_set1_epi8(OFF);
  for (int v = 0; v < 4; ++v) {
    __m512i lo, hi;
    pair_values<HB>(w, tb, h, v, values, &lo, &hi);
    if constexpr (OFF != 0) lo = _mm512_sub_epi8(lo, off), hi = _mm512_sub_epi8(hi, off);
    _mm512_store_si512(out->b + 2 * v, lo);
    _mm512_store_si512(out->b + 2 * v + 1, hi);
  }
}

// Sub-block k (of the whole row: super-block k / 8, sub-block k % 8) of
// the super-block types' 4-bit layout, unpacked as amx_unpack4 does, for
// amx_blocks; its group prefetched ahead as the pair kernels do.
template <int HB, int BLOCK, class Values>
IE_INLINE auto sub_block_unpacker(const Rows8& p, const uint8_t* w, int b0, Values values) {
  return [&p, w, b0, values](int64_t k, AmxBlock* out) __attribute__((always_inline)) {
    const uint8_t* wg = w + (k >> 3) * p.group_bytes;
    prefetch_pair<8>(p, wg, b0, static_cast<int>(k & 7));
    amx_unpack4<HB, 0>(wg + (k & 7) * BLOCK, p.tile_bytes, values, out);
  };
}

// The 16 tokens' sums of block blk (parity P) against the activations at
// xq, left in c (16 rows of 16 int32: token m's in row m). In assembly of
// our own: GCC's tile intrinsics are asm statements that clobber all
// memory, which made it keep the sixteen accumulators in memory, loaded and
// stored again around every block; here the statement names the memory it
// reads and writes.
#define IE_AMX_BLOCK(C, A, B)                                                                          \
  __asm__ volatile("tileloadd (%[b],%[r64],1), %%tmm" #B "\n\t"                                         \
                   "tileloadd (%[a],%[r32],1), %%tmm" #A "\n\t"                                         \
                   "tilezero %%tmm" #C "\n\t"                                                           \
                   "tdpbssd %%tmm" #B ", %%tmm" #A ", %%tmm" #C "\n\t"                                  \
                   "tilestored %%tmm" #C ", (%[c],%[r64],1)"                                            \
                   : "=m"(*reinterpret_cast<int32_t(*)[kAmxTokens * 16]>(c))                            \
                   : [b] "r"(blk.b), [a] "r"(xq), [c] "r"(c), [r64] "r"(64L), [r32] "r"(32L), "m"(blk), \
                     "m"(*reinterpret_cast<const int8_t(*)[kAmxTokens * 32]>(xq)))
template <int P>
IE_INLINE void amx_block(const AmxBlock& blk, const int8_t* xq, int32_t* c) {
  if constexpr (P == 0) {
    IE_AMX_BLOCK(0, 2, 4);
  } else {
    IE_AMX_BLOCK(1, 3, 5);
  }
}
#undef IE_AMX_BLOCK

// The n blocks of a pair for tokens b0 .. b0 + 16, in three stages: block
// k + 3 unpacked into B form (unpack), block k + 2's tile multiply, block
// k's sums into the accumulators (finish). A tile load of bytes just
// stored by vector stores, and vector loads of a tile store's bytes, wait
// for those stores to complete (in a one-stage loop those waits took most
// of the time), so each stage reads what the one before wrote a block or
// two earlier. unpack(k, out) and finish(k, sums) are called with k in
// order, so they may keep running pointers. HALVES = 2: the blocks are the
// 16-element halves of the 32-blocks (the sym16 types' sub-scales), half k
// against 32-block k / 2 of the activations; its unpack fills B's rows of
// that half only (rows 4 (k % 2) .. +3), the other four stay zero, so one
// tile multiply of the usual shape sums the half alone. Block k's sums stay
// in place until finish(k + 1) returns.
template <int HALVES = 1, class Unpack, class Finish>
IE_INLINE void amx_blocks(int64_t n, const Q8Nat& x, int B, int b0, Unpack&& unpack, Finish&& finish) {
  // leads in blocks, ring sizes: a half is half a block's work, so the
  // stages stay as far apart in time with twice the blocks between them
  constexpr int64_t kMul = 2 * HALVES, kUnpack = 3 * HALVES, kRing = 4 * HALVES;
  AmxBlock buf[kRing];
  if constexpr (HALVES == 2)  // buf[i] always holds half i % 2
    for (auto& blk : buf)
      for (auto& v : blk.b) v = _mm512_setzero_si512();
  alignas(64) int32_t c[kRing][kAmxTokens * 16];
  auto xq = [&](int64_t k) { return x.q + (k / HALVES * B + b0) * 32; };
  for (int64_t k = 0; k < kUnpack && k < n; ++k) unpack(k, &buf[k]);
  for (int64_t k = 0; k < kMul && k < n; k += 2) {
    amx_block<0>(buf[k], xq(k), c[k]);
    if (k + 1 < n) amx_block<1>(buf[k + 1], xq(k + 1), c[k + 1]);
  }
  for (int64_t k = 0; k < n; k += 2) {  // tile registers by parity: the block numbers stay literal
    if (k + kUnpack < n) unpack(k + kUnpack, &buf[(k + kUnpack) % kRing]);
    if (k + kMul < n) amx_block<0>(buf[(k + kMul) % kRing], xq(k + kMul), c[(k + kMul) % kRing]);
    finish(k, c[k % kRing]);
    if (k + 1 == n) break;
    if (k + kUnpack + 1 < n) unpack(k + kUnpack + 1, &buf[(k + kUnpack + 1) % kRing]);
    if (k + kMul + 1 < n) amx_block<1>(buf[(k + kMul + 1) % kRing], xq(k + kMul + 1), c[(k + kMul + 1) % kRing]);
    finish(k + 1, c[(k + 1) % kRing]);
  }
}

// acc[m] += (sums of token m) * (d * x.d of its block k), signed_pair's
// and nib_pair's float operations in their order.
IE_INLINE void amx_scale_add(const int32_t* c, __m512 d, const float* xd, __m512 (&acc)[kAmxTokens]) {
  for (int m = 0; m < kAmxTokens; ++m)
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), _mm512_mul_ps(d, _mm512_set1_ps(xd[m])),
                             acc[m]);
}

// Signed-value types (iq4_nl, mxfp4 through their tables; q8_0 as stored):
// signed_pair's floats per token.
template <WType T>
IE_INLINE void signed_amx(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kAmxTokens]) {
  constexpr bool kTable = T != WType::Q8_0;
  constexpr int kCodes = kTable ? 128 : 256;
  const size_t tb = p.tile_bytes;
  const TableOf<T, false> table;
  const uint8_t* wu = w;
  amx_blocks(
      p.groups, x, B, b0,
      [&](int64_t, AmxBlock* out) __attribute__((always_inline)) {
        prefetch_pair(p, wu, b0);
        if constexpr (kTable) {
          amx_unpack4<0, 0>(wu, tb, table, out);
        } else {
          for (int v = 0; v < 8; ++v) _mm512_store_si512(out->b + v, load_pair(wu + 32 * v, tb));
        }
        wu += p.group_bytes;
      },
      [&](int64_t k, const int32_t* c) __attribute__((always_inline)) {
        const uint8_t* wk = w + k * p.group_bytes;
        amx_scale_add(c, load16<T == WType::MXFP4 ? 1 : 2>(wk + kCodes, tb), x.d + k * B + b0, acc);
      });
}

// nib_pair's types (int4w, q4_0, q4_1; q5_0, q5_1: HB = 32): codes minus
// their offset (none for affine codes), nib_pair's floats per token.
template <int BPG, int SB, bool AFFINE, int HB = 0>
IE_INLINE void nib_amx(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kAmxTokens]) {
  constexpr int kOff = AFFINE ? 0 : (HB ? 16 : 8);
  constexpr size_t kBlock = 128 + HB;
  const size_t tb = p.tile_bytes;
  const int bpg = BPG > 0 ? BPG : p.bpg;
  const size_t codes = static_cast<size_t>(bpg) * kBlock;  // a group's blocks, then its scales (and mins)
  const uint8_t* wu = w;  // unpack's block
  int ku = 0;             // its place in its group
  const uint8_t* wf = w;  // finish's group
  int kf = 0;
  __m512 scale = _mm512_setzero_ps(), mins = _mm512_setzero_ps();
  amx_blocks(
      p.groups * bpg, x, B, b0,
      [&](int64_t, AmxBlock* out) __attribute__((always_inline)) {
        if (ku == 0) prefetch_pair(p, wu, b0);
        amx_unpack4<HB, kOff>(wu, tb, codes_as_is, out);
        wu += kBlock;
        if (++ku == bpg) ku = 0, wu += 8 * SB * (AFFINE ? 2 : 1);
      },
      [&](int64_t k, const int32_t* c) __attribute__((always_inline)) {
        if (kf == 0) {
          scale = load16<SB>(wf + codes, tb);
          if constexpr (AFFINE) mins = load16<SB>(wf + codes + 8 * SB, tb);
        }
        const float* xd = x.d + k * B + b0;
        amx_scale_add(c, scale, xd, acc);
        if constexpr (AFFINE)
          for (int m = 0; m < kAmxTokens; ++m) acc[m] = _mm512_fmadd_ps(mins, _mm512_set1_ps(x.ds[k * B + b0 + m]), acc[m]);
        if (++kf == bpg) kf = 0, wf += p.group_bytes;
      });
}

// The super-block types below read Q8Super activations (one scale per
// super-block): sub-block j's sums times the 16 rows' integer sub-scales by
// vpmulld, added up as integers over the super-block, then super_finish's
// floats once per super-block and token, the pair kernels' integers and
// floats. (Under a scale per 32 elements these kernels multiplied each
// product as a float, one micro-op where vpmulld is two on Intel's port 0:
// q4_k, one thread, 128-167 -> 196-209 G multiply-adds/s; that float work
// per sub-block and token is what one scale per super-block takes away.)

// iq4xs_pair's types (iq4_xs and the codebook types: signed table values, 6-bit
// sub-scales l - 32; iq4_xsh: each sub-block's values shifted as its grid
// bit says), iq4xs_pair's floats per token.
template <WType T>
IE_INLINE void iq4xs_amx(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kAmxTokens]) {
  using H = Rows8Iq4xsHeader;
  constexpr int kBlock = 32 * rows8_code_bits(T);
  const size_t tb = p.tile_bytes;
  const TableOf<T, false> table;
  auto header = [&](int64_t k) { return w + (k >> 3) * p.group_bytes + 8 * kBlock; };
  Iq4xsSubScales ls;
  __m512i S[kAmxTokens];
  amx_blocks(
      p.groups * 8, x, B, b0,
      [&](int64_t k, AmxBlock* out) __attribute__((always_inline)) {
        const auto values = sub_block_table<T>(table, header(k), tb, static_cast<int>(k & 7));
        sub_block_unpacker<0, kBlock>(p, w, b0, values)(k, out);
      },
      [&](int64_t k, const int32_t* c) __attribute__((always_inline)) {
        const int j = static_cast<int>(k & 7);
        const uint8_t* h = header(k);
        if (j == 0) {
          ls = Iq4xsSubScales(h, tb);
          for (auto& v : S) v = _mm512_setzero_si512();
        }
        const __m512i mult = ls.mult(j);
        for (int m = 0; m < kAmxTokens; ++m) S[m] = _mm512_add_epi32(S[m], _mm512_mullo_epi32(_mm512_load_si512(c + 16 * m), mult));
        if (j == 7) super_finish(h + H::d, tb, rows8_d_factor(T), x.d + (k - 7) * B + b0, S, acc);
      });
}

// kq_pair's types (q4_k; q5_k: Q5, the fifth bits): codes as they are, the
// 6-bit sub-scales by vpmulld, the sums added up as integers over the
// super-block, then kq_pair's floats per token (kq_finish_pair).
template <bool Q5>
IE_INLINE void kq_amx(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kAmxTokens]) {
  constexpr int kBlock = 32 * rows8_code_bits(Q5 ? WType::Q5_K : WType::Q4_K);
  const size_t tb = p.tile_bytes;
  KqSixBits<false> ls;
  __m512i S[kAmxTokens];
  amx_blocks(
      p.groups * 8, x, B, b0,
      sub_block_unpacker<Q5 ? 32 : 0, kBlock>(p, w, b0, codes_as_is),
      [&](int64_t k, const int32_t* c) __attribute__((always_inline)) {
        const int j = static_cast<int>(k & 7);
        const uint8_t* h = w + (k >> 3) * p.group_bytes + 8 * kBlock;
        if (j == 0) {
          ls = KqSixBits<false>(h, tb);
          for (auto& v : S) v = _mm512_setzero_si512();
        }
        const __m512i mult = ls.of(j);
        for (int m = 0; m < kAmxTokens; ++m) S[m] = _mm512_add_epi32(S[m], _mm512_mullo_epi32(_mm512_load_si512(c + 16 * m), mult));
        if (j == 7) kq_finish_pair(h, tb, x, (k >> 3) * B + b0, (k - 7) * B + b0, S, acc);
      });
}

// Half k % 2 of 32-block k / 2 of the sym16 types (q6_k, q3_k: codes less
// their offset Z) as rows 4 (k % 2) .. +3 of B, for
// amx_blocks<2>; its group prefetched ahead as the pair kernels do.
template <WType T>
IE_INLINE auto half_unpacker(const Rows8& p, const uint8_t* w, int b0) {
  constexpr int kBlock = 32 * rows8_code_bits(T);
  constexpr int kZ = sym16_zero(T);
  return [&p, w, b0](int64_t k, AmxBlock* out) __attribute__((always_inline)) {
    const int64_t blk = k >> 1;
    const int half = static_cast<int>(k & 1);
    const uint8_t* wg = w + (blk >> 3) * p.group_bytes;
    if (half == 0) prefetch_pair<8>(p, wg, b0, static_cast<int>(blk & 7));
    for (int v = 2 * half; v < 2 * half + 2; ++v) {
      __m512i lo, hi;
      sym16_codes<T>(wg + (blk & 7) * kBlock, p.tile_bytes, v, &lo, &hi);
      _mm512_store_si512(out->b + 2 * v, _mm512_sub_epi8(lo, _mm512_set1_epi8(static_cast<char>(kZ))));
      _mm512_store_si512(out->b + 2 * v + 1, _mm512_sub_epi8(hi, _mm512_set1_epi8(static_cast<char>(kZ))));
    }
  };
}

// sym16_pair's types (q6_k, q3_k and the half_scaled_book types): each half's sums by its own tile
// multiply, then sym16_pair's integers per half and floats per super-block and token (sym16_finish).
template <WType T>
IE_INLINE void sym16_amx(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0, __m512 (&acc)[kAmxTokens]) {
  constexpr int kBlock = 32 * rows8_code_bits(T);
  constexpr int kD = T == WType::Q3_K ? Rows8Q3kHeader::d : Rows8Q6kHeader::d;
  const size_t tb = p.tile_bytes;
  __m512i words[3] = {};
  __m512i S[kAmxTokens];
  amx_blocks<2>(
      p.groups * 16, x, B, b0, half_unpacker<T>(p, w, b0),
      [&](int64_t k, const int32_t* c) __attribute__((always_inline)) {
        const int64_t blk = k >> 1;
        const int j = static_cast<int>(blk & 7), half = static_cast<int>(k & 1);
        const uint8_t* h = w + (blk >> 3) * p.group_bytes + 8 * kBlock;
        if (k % 16 == 0) {
          if constexpr (T == WType::Q3_K) q3k_words(h, tb, words);
          for (auto& v : S) v = _mm512_setzero_si512();
        }
        const __m512i mult = sym16_mult<T>(h, tb, words, j, half);
        for (int m = 0; m < kAmxTokens; ++m) S[m] = _mm512_add_epi32(S[m], _mm512_mullo_epi32(_mm512_load_si512(c + 16 * m), mult));
        if (j == 7 && half == 1) super_finish(h + kD, tb, rows8_d_factor(T), x.d + (blk - 7) * B + b0, S, acc);
      });
}

// Sixteen activation rows b0 .. b0 + 16 (of B) against the tiles at w and w
// + tile_bytes; the tile configuration must be amx_configure's.
using AmxKernel = void (*)(const Rows8& p, const uint8_t* w, const Q8Nat& x, int B, int b0,
                           __m512 (&acc)[kAmxTokens]);

template <void (*K)(const Rows8&, const uint8_t*, const Q8Nat&, int, int, __m512 (&)[kAmxTokens])>
void amx_fn(const Rows8& p, const uint8_t* w, const Q8Nat& xr, int B, int b0, __m512 (&out)[kAmxTokens]) {
  const Q8Nat x = xr;
  __m512 acc[kAmxTokens];
  for (auto& v : acc) v = _mm512_setzero_ps();
  K(p, w, x, B, b0, acc);
  for (int b = 0; b < kAmxTokens; ++b) out[b] = acc[b];
}

// The AMX kernel of p's type; nullptr where it has none (q2_k, and the
// float types, which have no rows8 copy): the pair kernels run those.
AmxKernel amx_kernel(const Rows8& p) {
  switch (p.spec.type) {
    case WType::Q8_0: return amx_fn<signed_amx<WType::Q8_0>>;
    case WType::IQ4_NL: return amx_fn<signed_amx<WType::IQ4_NL>>;
    case WType::MXFP4: return amx_fn<signed_amx<WType::MXFP4>>;
    case WType::Q5_0: return amx_fn<nib_amx<1, 2, false, 32>>;
    case WType::Q5_1: return amx_fn<nib_amx<1, 2, true, 32>>;
    case WType::Int4w:
    case WType::Q4_0:
    case WType::Q4_1:
      return with_nib_params(p, [&](auto sb, auto aff) -> AmxKernel {
        constexpr int SB = decltype(sb)::value;
        constexpr bool AFF = decltype(aff)::value;
        if (p.bpg == 1) return amx_fn<nib_amx<1, SB, AFF>>;
        if (p.bpg == 2) return amx_fn<nib_amx<2, SB, AFF>>;
        return amx_fn<nib_amx<0, SB, AFF>>;
      });
    case WType::IQ4_XS: return amx_fn<iq4xs_amx<WType::IQ4_XS>>;
    case WType::IQ3_S: return amx_fn<iq4xs_amx<WType::IQ3_S>>;
    case WType::IQ3_XXS: return amx_fn<iq4xs_amx<WType::IQ3_XXS>>;
    case WType::IQ2_XXS: return amx_fn<iq4xs_amx<WType::IQ2_XXS>>;
    case WType::IQ4_XSH: return amx_fn<iq4xs_amx<WType::IQ4_XSH>>;
    case WType::Q4_K: return amx_fn<kq_amx<false>>;
    case WType::Q5_K: return amx_fn<kq_amx<true>>;
    case WType::Q6_K: return amx_fn<sym16_amx<WType::Q6_K>>;
    case WType::Q3_K: return amx_fn<sym16_amx<WType::Q3_K>>;
    case WType::IQ2_XS: return amx_fn<sym16_amx<WType::IQ2_XS>>;
    case WType::IQ2_S: return amx_fn<sym16_amx<WType::IQ2_S>>;
    case WType::IQ1_S: return amx_fn<sym16_amx<WType::IQ1_S>>;
    case WType::IQ1_M: return amx_fn<sym16_amx<WType::IQ1_M>>;
    case WType::Q2_K:  // its mins' sums beside P and acc do not fit the registers at 16 tokens: no faster than its pair kernel
    case WType::NVFP4:  // (no copy: rows8_code_bits)
    case WType::Q1_0:   // (copied as q4_0: rows8_shape)
    case WType::F32:
    case WType::F16:
    case WType::BF16: break;
  }
  return nullptr;
}
