// Internal interface between the GEMV driver (driver.cpp) and the per-ISA
// kernel files (scalar.cpp = the reference, avx2.cpp). A per-ISA file only
// computes: every buffer it writes is sized and owned by the driver
// (prepared activations, per-call scratch), so no allocator or container
// code is ever compiled with SIMD flags.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dispatch.h"
#include "common/half.h"
#include "gemv.h"
#include "rows8.h"

namespace ie {

// The activation forms kernels read (ggml's vec_dot_type), cached per
// PreparedAct value. Which one a (type, act) needs is the variant's choice.
enum class Prep : int { None = 0, Q8Rows, NibF32, NibQ8, Q8Blocks };
constexpr int kPrepKinds = 5;

struct GemvArgs {
  WeightSpec spec;
  WeightLayout lay;
  const uint8_t* w = nullptr;
  const float* x = nullptr;     // [batch, cols]
  const uint8_t* prep = nullptr;  // the prepared form this (type, act) needs, or null
  uint8_t* scratch = nullptr;   // scratch_bytes() bytes, 64-byte aligned
  int batch = 1;
  const float* bias = nullptr;  // [rows] or null
  float* y = nullptr;           // [batch, rows]
  Act act = Act::F32;
  int threads = 1;
  const RowSource* src = nullptr;  // when set, w is null: rows come from src (run_from_source)
};

// One ISA's GEMV entry points (common/dispatch.h).
struct GemvOps {
  Prep (*prep_kind)(WType type, Act act);
  // Bytes of a prepared form for x [batch, cols] (its temporaries included), and the filling of it.
  size_t (*prep_bytes)(Prep kind, int batch, int64_t cols);
  void (*prepare)(Prep kind, const float* x, int batch, int64_t cols, uint8_t* out);
  size_t (*scratch_bytes)(const GemvArgs& a);
  void (*gemv)(const GemvArgs& a);
  // The act=int8 activation quantizer; every variant's must agree bit for bit.
  void (*quantize_q8)(const float* x, int64_t n, int8_t* q, float* d);
  // act=int8 over rows8 copies (rows8.h) of n matrices that read the same x
  // [batch, cols], in one parallel region; `prep` is x's Prep::Q8Blocks form.
  // Null where the ISA has no such kernel (the stored layout is used).
  void (*gemv_rows8)(const Rows8Job* jobs, int n, const uint8_t* prep, int batch, int threads);
};

extern const GemvOps kGemvScalar;
#if IE_HAVE_X86
extern const GemvOps kGemvAvx2;
void gemv_rows8_avx2(const Rows8Job* jobs, int n, const uint8_t* prep, int batch, int threads);
#endif
extern const IsaTable<GemvOps> kGemvTable;

// Internal linkage on purpose: these small helpers are used by files built
// with different ISA flags, and an inline function with external linkage
// would be one COMDAT symbol the linker may take from an AVX2 object for a
// scalar caller (tests/cpp checks the objects for such symbols).
namespace {

// Thread t's rows [*r0, *r1) of nt: contiguous ranges whose boundaries are
// multiples of `align` rows, so each thread streams one run of every plane.
inline void thread_rows(int64_t rows, int align, int t, int nt, int64_t* r0, int64_t* r1) {
  const int64_t units = (rows + align - 1) / align;
  *r0 = units * t / nt * align;
  *r1 = units * (t + 1) / nt * align;
  if (*r0 > rows) *r0 = rows;
  if (*r1 > rows) *r1 = rows;
}

// Thread t's rows [r, r1) of a matrix given by a.src, up to R rows a step:
// each step is fetched as an n-row matrix, `run(sub, n)` multiplies it into
// sub.y ([batch][n]) without bias, and the bias is added here as the kernels
// add it (after everything else), so y is bit-identical to the stored case.
template <int R, class Run>
inline void run_from_source(const GemvArgs& a, int t, int64_t r, int64_t r1, Run run) {
  static_assert(R >= 1 && R <= kMaxStepRows, "a step holds at most kMaxStepRows rows");
  float yb[R * kMaxBatch];
  GemvArgs sub = a;
  sub.src = nullptr;
  sub.bias = nullptr;
  sub.y = yb;
  WeightSpec one = a.spec, full = a.spec;
  one.rows = 1;
  full.rows = R;
  const WeightLayout lay_one = weight_layout(one), lay_full = weight_layout(full);
  const int64_t rows = a.spec.rows;
  while (r < r1) {
    const int n = r + R <= r1 ? R : 1;
    sub.w = a.src->rows(a.src->ctx, t, r, n);
    if (sub.w == nullptr) return;
    sub.spec.rows = n;
    sub.lay = n == R ? lay_full : lay_one;
    run(sub, n);
    for (int b = 0; b < a.batch; ++b)
      for (int i = 0; i < n; ++i) {
        const float v = yb[b * n + i];
        a.y[b * rows + r + i] = a.bias ? v + a.bias[r + i] : v;
      }
    r += n;
  }
}

// Carves 64-byte aligned arrays out of one buffer; the same walk sizes the
// buffer (base null) and hands out pointers, so the two always agree.
class Carve {
 public:
  explicit Carve(uint8_t* base) : base_(base) {}
  template <class T>
  T* take(size_t n) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += (n * sizeof(T) + 63) / 64 * 64;
    return p;
  }
  size_t used() const { return off_; }

 private:
  uint8_t* base_;
  size_t off_ = 0;
};

// q4_k: sub-block j (0..7) of a 144-byte super-block (d, dmin: f16; 12
// bytes of 6-bit sub-scales and sub-mins; 128 bytes of codes) decodes as
// w = scale * q - min, both the f32 products d * sc_j and dmin * m_j that
// ggml's dequantize_row_q4_K forms. Its codes are the low nibbles (j even)
// or high nibbles (j odd) of code bytes 32 * (j / 2) .. 32 * (j / 2) + 31.
constexpr int kQ4kBytes = wtype_info(WType::Q4_K).block_bytes;
constexpr int kQ4kCodes = wtype_info(WType::Q4_K).code_offset;

struct Q4kSub {
  float scale, min;
};

inline Q4kSub q4k_sub(const uint8_t* blk, int j) {
  const uint8_t* sc = blk + 4;
  int ls, lm;
  if (j < 4) {
    ls = sc[j] & 63;
    lm = sc[j + 4] & 63;
  } else {
    ls = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
    lm = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
  return {f16_to_f32(load_u16(blk)) * static_cast<float>(ls), f16_to_f32(load_u16(blk + 2)) * static_cast<float>(lm)};
}

// The nibble of element e (0..31) of sub-block j, for 128 code bytes at `at`.
inline int kq_nibble(const uint8_t* blk, int at, int j, int e) { return (blk[at + 32 * (j / 2) + e] >> (4 * (j % 2))) & 0xF; }

// Code e of sub-block j.
inline int q4k_code(const uint8_t* blk, int j, int e) { return kq_nibble(blk, kQ4kCodes, j, e); }

// q5_k: q4_k's super-block (the same d, dmin and 12 scale bytes, so q4k_sub
// gives its sub-blocks' scale and min) with 5-bit codes: the low nibbles as
// q4_k stores them but at 48, the fifth bits in the 32 bytes at 16 (bit j of
// byte e: element e of sub-block j).
constexpr int kQ5kBytes = wtype_info(WType::Q5_K).block_bytes;
constexpr int kQ5kCodes = wtype_info(WType::Q5_K).code_offset;
constexpr int kQ5kHigh = 16;

inline int q5k_code(const uint8_t* blk, int j, int e) {
  return kq_nibble(blk, kQ5kCodes, j, e) | (((blk[kQ5kHigh + e] >> j) & 1) << 4);
}

// q5_0 / q5_1: 32-element blocks whose codes (0..31) keep their fifth bits
// in a little-endian u32 at `at` (bit e: element e) and their low nibbles
// in the 16 bytes after it, in q4_0's order (byte e: elements e and e + 16).
inline int q5_code(const uint8_t* blk, int at, int e) {
  uint32_t qh;
  std::memcpy(&qh, blk + at, 4);
  return ((blk[at + 4 + e % 16] >> (4 * (e / 16))) & 0xF) | static_cast<int>(((qh >> e) & 1u) << 4);
}

// q6_k: 256-element super-blocks of sixteen 16-element sub-blocks, w =
// (d * sc_j) * (q - 32): 6-bit codes q, int8 sub-scales sc_j at 192, f16 d
// at 208. Element i = 128 h + 32 k + l (half h, quarter k) has its low
// nibble in byte 64 h + 32 (k % 2) + l (high nibble for k >= 2) and its high
// two bits at bit 2 k of byte 128 + 32 h + l.
constexpr int kQ6kBytes = wtype_info(WType::Q6_K).block_bytes;
constexpr int kQ6kHigh = 128, kQ6kScales = 192, kQ6kD = 208;

inline float q6k_scale(const uint8_t* blk, int j) {
  return f16_to_f32(load_u16(blk + kQ6kD)) * static_cast<float>(static_cast<int8_t>(blk[kQ6kScales + j]));
}

inline int q6k_code(const uint8_t* blk, int i) {
  const int h = i / 128, k = i % 128 / 32, l = i % 32;
  const int lo = (blk[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
  return lo | (((blk[kQ6kHigh + 32 * h + l] >> (2 * k)) & 3) << 4);
}

// iq4_nl / iq4_xs: each code indexes ggml's non-linear grid kvalues_iq4nl;
// a 32-element (sub-)block is w = scale * kIq4Values[q], its codes the low
// nibbles (elements 0..15) and high nibbles (16..31) of 16 bytes. iq4_xs
// super-blocks (d: f16, scales_h: u16, scales_l: 4 bytes, 128 code bytes)
// give sub-block j the scale d * (l_j - 32), the f32 product ggml forms.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline float iq4xs_scale(const uint8_t* blk, int j) {
  const int l = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((load_u16(blk + 2) >> (2 * j)) & 3) << 4);
  return f16_to_f32(load_u16(blk)) * static_cast<float>(l - 32);
}

// mxfp4 (OCP MX v1.0 FP4, ggml's block_mxfp4): an E8M0 scale byte e, then
// 16 bytes of e2m1 codes in iq4_nl's nibble order; w = e8m0_half(e) *
// kMxfp4Values[q], the e2m1 values doubled so they are int8 (ggml's
// kvalues_mxfp4) and the scale 2^(e - 127) halved to match: 2^(e - 128),
// the subnormals 2^-128, 2^-127 for e = 0, 1.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline float e8m0_half(uint8_t e) {
  return f32_from_bits(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

// The types whose codes index a table of int8 values (iq4_nl, iq4_xs,
// mxfp4): the table; and for the one-scale-per-block ones (iq4_nl, mxfp4)
// the scale of the block at blk.
constexpr const int8_t* grid_values(WType t) { return t == WType::MXFP4 ? kMxfp4Values : kIq4Values; }
inline float grid_scale(WType t, const uint8_t* blk) {
  return t == WType::MXFP4 ? e8m0_half(blk[0]) : f16_to_f32(load_u16(blk));
}

// act=int8 in natural element order, block-major (q8_0's form, and rows8's):
// per 32-block and activation row, the codes, their scale d, and the code
// sum as the zero-point term of symmetric 4-bit codes (8 * sum) and as the
// min term of affine ones (d * sum); and 16 times the sums of the block's
// halves (elements 0..15, 16..31) as int16 pairs, q6_k's offset term (its
// sub-scales change at the half, so the offset 32 meets them per half).
struct Q8Nat {
  int8_t* q = nullptr;      // [nblk][B][32]
  float* d = nullptr;       // [nblk][B]
  int32_t* s8 = nullptr;    // [nblk][B]
  float* ds = nullptr;      // [nblk][B]
  int32_t* h16 = nullptr;   // [nblk][B][2]: (16 sum_h, 16 sum_h) as two int16 (|16 sum_h| <= 16 * 16 * 127 < 2^15)
  int8_t* qt = nullptr;   // temporary: one quantized row [cols]
  float* dt = nullptr;    // temporary: its scales [nblk]
};

inline Q8Nat carve_q8_nat(uint8_t* base, int B, int64_t cols, size_t* used = nullptr) {
  Carve c(base);
  Q8Nat o;
  const size_t nb = static_cast<size_t>(B * (cols / 32));
  o.q = c.take<int8_t>(static_cast<size_t>(B * cols));
  o.d = c.take<float>(nb);
  o.s8 = c.take<int32_t>(nb);
  o.ds = c.take<float>(nb);
  o.h16 = c.take<int32_t>(2 * nb);
  o.qt = c.take<int8_t>(static_cast<size_t>(cols));
  o.dt = c.take<float>(static_cast<size_t>(cols / 32));
  if (used) *used = c.used();
  return o;
}

}  // namespace

// Decodes W[r][c0 .. c0 + n) into out exactly as dequantize() defines it.
// For quantized formats c0 % 32 == 0 and n == 32.
void dequant_span(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, int64_t c0,
                  int n, float* out);

}  // namespace ie
