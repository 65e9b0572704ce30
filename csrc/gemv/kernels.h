// Internal interface between the GEMV driver (driver.cpp) and the per-ISA
// kernel files (scalar.cpp = the reference, avx2.cpp). A per-ISA file only
// computes: every buffer it writes is sized and owned by the driver
// (prepared activations, per-call scratch), so no allocator or container
// code is ever compiled with SIMD flags.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dispatch.h"
#include "common/half.h"
#include "common/work_split.h"
#include "common/weight_decode.h"
#include "gemv.h"
#include "rows8.h"

namespace ie {

// The activation forms kernels read (ggml's vec_dot_type), cached per
// PreparedAct value. Which one a (type, act) needs is the variant's choice.
// Q8RowsSuper and Q8Super are Q8Rows and Q8Blocks with one scale per 256
// elements (per 32 in the arrays, repeated), for the types whose act_block
// is 256 (weight_types.h).
enum class Prep : int { None = 0, Q8Rows, NibF32, NibQ8, Q8Blocks, Q8RowsSuper, Q8Super };
constexpr int kPrepKinds = 7;

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
  ThreadPool* pool = nullptr;
  const RowSource* src = nullptr;  // when set, w is null: rows come from src (run_from_source)
};

// x's int8 forms for gemv_rows8: per-32 scales (Prep::Q8Blocks) and one per
// 256 (Prep::Q8Super), each null where no matrix of the call reads it.
struct Rows8Prep {
  const uint8_t* blocks = nullptr;
  const uint8_t* super = nullptr;
};

// One ISA's GEMV entry points (common/dispatch.h).
struct GemvOps {
  Prep (*prep_kind)(WType type, Act act);
  // Bytes of a prepared form for x [batch, cols] (its temporaries included), and the filling of it
  // (a prefill chunk's Q8Blocks over the pool: on one thread it left the others waiting).
  size_t (*prep_bytes)(Prep kind, int batch, int64_t cols);
  void (*prepare)(Prep kind, const float* x, int batch, int64_t cols, uint8_t* out, ThreadPool& pool);
  size_t (*scratch_bytes)(const GemvArgs& a);
  void (*gemv)(const GemvArgs& a);
  // The act=int8 activation quantizer; every variant's must agree bit for bit.
  // block: elements per scale, 32 or 256 (act_block); d has one per 32 elements either way.
  void (*quantize_q8)(const float* x, int64_t n, int8_t* q, float* d, int block);
  // act=int8 over rows8 copies (rows8.h) of n matrices that read the same x
  // [batch, cols], in one parallel region; `prep` holds x's Prep::Q8Blocks
  // and Prep::Q8Super forms, each where a job's type reads it.
  // Jobs over stored bytes pack their tiles into `pack`, pack_bytes per
  // thread (rows8_pack_bytes). Null where the ISA has no such kernel (the
  // stored layout is used).
  void (*gemv_rows8)(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                     size_t pack_bytes);
};

extern const GemvOps kGemvScalar;
#if IE_HAVE_X86
extern const GemvOps kGemvAvx2;
// AVX2's kernels with the rows8 kernels built for AVX-VNNI (VEX vpdpbusd,
// 16 registers) and for AVX-512 VNNI (EVEX vpdpbusd, 32 registers).
extern const GemvOps kGemvAvxVnni;
extern const GemvOps kGemvAvx512;
// Avx512's, with AMX tile multiplies in the rows8 prefill kernels.
extern const GemvOps kGemvAmx;
// AVX-512 VNNI + VBMI kernels for some stored layouts (avx512.cpp), AVX2's
// for the rest.
void gemv_avx512(const GemvArgs& a);
void gemv_rows8_avx2(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                     size_t pack_bytes);
void gemv_rows8_avxvnni(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                        size_t pack_bytes);
void gemv_rows8_avx512(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                       size_t pack_bytes);
void gemv_rows8_amx(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                    size_t pack_bytes);
#endif
extern const IsaTable<GemvOps> kGemvTable;

// Internal linkage on purpose: these small helpers are used by files built
// with different ISA flags, and an inline function with external linkage
// would be one COMDAT symbol the linker may take from an AVX2 object for a
// scalar caller (tests/cpp checks the objects for such symbols).
namespace {

// Thread t's rows [*r0, *r1) of nt: contiguous ranges whose boundaries are
// multiples of `align` rows, so each thread streams one run of every plane.
// With align 4, the share a RowSplit starts thread t on (benchmarks
// first-touch their weights with it).
inline void thread_rows(int64_t rows, int align, int t, int nt, int64_t* r0, int64_t* r1) {
  const int64_t units = (rows + align - 1) / align;
  *r0 = units * t / nt * align;
  *r1 = units * (t + 1) / nt * align;
  if (*r0 > rows) *r0 = rows;
  if (*r1 > rows) *r1 = rows;
}

// How a GEMV's rows are shared by its threads (work_split.h): each starts
// on its thread_rows(rows, 4, ...) share and takes 16 rows at a time; a
// thread done early takes over half of another's remaining rows.
class RowSplit {
 public:
  RowSplit(int64_t rows, int threads) : rows_(rows), split_((rows + 3) / 4, threads, 4) {}
  bool next(int t, int64_t* r0, int64_t* r1) {
    int64_t u0, u1;
    if (!split_.next(t, &u0, &u1)) return false;
    *r0 = u0 * 4;
    *r1 = u1 * 4 < rows_ ? u1 * 4 : rows_;
    return true;
  }

 private:
  int64_t rows_;
  WorkSplit split_;
};

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

// fn(std::integral_constant<int, B>) for a batch of b activation rows
// (1 <= b <= kMaxBatch): the kernels are compiled once per batch size.
template <class Fn>
void with_batch(int b, Fn&& fn) {
  switch (b) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    default: fn(std::integral_constant<int, 8>{}); break;
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

// The tables of weight_decode.h's grid_value as 16 bytes, for the SIMD
// kernels' byte shuffles.
struct Grid16 {
  int8_t v[16];
};
constexpr Grid16 grid_table(WType t) {
  Grid16 g{};
  for (int q = 0; q < 16; ++q) g.v[q] = static_cast<int8_t>(grid_value(t, q));
  return g;
}
constexpr Grid16 kIq4Grid = grid_table(WType::IQ4_NL), kMxfp4Grid = grid_table(WType::MXFP4),
                 kIq3sGrid = grid_table(WType::IQ3_S), kIq3xxsGrid = grid_table(WType::IQ3_XXS),
                 kIq2xxsGrid = grid_table(WType::IQ2_XXS), kIq1Grid = grid_table(WType::IQ1_S);
constexpr const int8_t* grid_values(WType t) {
  return t == WType::MXFP4 || t == WType::NVFP4 ? kMxfp4Grid.v
         : t == WType::IQ3_S   ? kIq3sGrid.v
         : t == WType::IQ3_XXS ? kIq3xxsGrid.v
         : iq2_values(t)       ? kIq2xxsGrid.v
         : iq1_values(t)       ? kIq1Grid.v
                               : kIq4Grid.v;
}
// ue4m3_half of every byte, for the nvfp4 kernels' gathers of a block's scales.
struct Ue4m3Table {
  float v[256];
};
constexpr Ue4m3Table ue4m3_table() {
  Ue4m3Table t{};
  for (int x = 0; x < 256; ++x) t.v[x] = ue4m3_half(static_cast<uint8_t>(x));
  return t;
}
constexpr Ue4m3Table kUe4m3 = ue4m3_table();
static_assert(kUe4m3.v[0x38] == 0.5f && kUe4m3.v[0x7E] == 224.f && kUe4m3.v[1] == 0x1p-10f && kUe4m3.v[0x08] == 0x1p-7f &&
                  kUe4m3.v[0xFF] == 240.f && kUe4m3.v[0x7F] == 0.f,
              "ue4m3_half: 1.0 halved, 448 halved, the least subnormal, the least normal; bit 7 unread; NaN as 0");

// The largest |value| of a table: how many products a kernel may sum in int16.
constexpr int grid_abs_max(const Grid16& g) {
  int m = 0;
  for (int8_t v : g.v) {
    const int a = v < 0 ? -v : v;
    if (a > m) m = a;
  }
  return m;
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
  // Q8Super's only: [nblk / 8][B][4], a super-block's eight code sums as
  // int16 pairs (sum 0, sum 2), (1, 3), (4, 6), (5, 7) (|sum| <= 32 * 128),
  // which q4_k's and q5_k's mins meet by vpdpwssd (kq_pair).
  int32_t* p16 = nullptr;
};

// Token b's activation over 128 elements, 32-blocks 4 sb .. 4 sb + 3 (of B tokens' interleaved ones): the sum of
// their ds, what q1_0's kernels take off twice the sum where a row's bits are set.
inline float q8_ds128(const Q8Nat& xa, int64_t sb, int B, int b) {
  const float* ds = xa.ds + sb * 4 * B + b;
  return ds[0] + ds[B] + ds[2 * B] + ds[3 * B];
}

inline Q8Nat carve_q8_nat(uint8_t* base, int B, int64_t cols, size_t* used = nullptr) {
  Carve c(base);
  Q8Nat o;
  const size_t nb = static_cast<size_t>(B * (cols / 32));
  o.q = c.take<int8_t>(static_cast<size_t>(B * cols));
  o.d = c.take<float>(nb);
  o.s8 = c.take<int32_t>(nb);
  o.ds = c.take<float>(nb);
  o.h16 = c.take<int32_t>(2 * nb);
  o.p16 = c.take<int32_t>(static_cast<size_t>(B * (cols / 256) * 4));
  if (used) *used = c.used();
  return o;
}

}  // namespace

}  // namespace ie
