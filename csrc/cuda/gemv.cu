// The CUDA GEMV kernels and dequantizer (gemv.h, docs/cuda.md).
//
// Every kernel has the same shape: a CTA of 8 warps; W warps (1, 2, 4 or
// 8, from the row length) split one row group's columns, each lane taking
// every (32 W)-th unit of the row (a 16-byte load, or a 32-element block);
// a row group is R rows that share each load of x, so x is read from L1 R
// times less often (at batch 1, x is 8 bytes of L1 traffic per 4-bit
// weight byte; sharing it over 4 rows keeps L1 well under its ceiling). The
// partial sums are reduced over the warp with shuffles, then over the W
// warps through shared memory, and one thread stores y (+ bias).
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/gemv.h"
#include "cuda/reduce.cuh"
#include "cuda/repack.h"
#include "common/errors.h"
#include "common/weight_decode.h"

namespace ie::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;

// What a kernel needs of a matrix, passed by value.
struct Geometry {
  WeightSpec s;
  WeightLayout l;
};

struct Launch {
  const uint8_t* w;
  Geometry g;
  const float* x;
  int batch;
  const float* bias;
  float* y;
  int64_t units;  // units per row
  int split;      // W
};

// Rows per row group for a batch: R * B x values live in registers.
__host__ __device__ constexpr int rows_for(int B) { return B <= 2 ? 4 : B <= 4 ? 2 : 1; }

// Sums acc over the warp, then over the row group's W warps, and stores.
template <int R, int B>
__device__ __forceinline__ void reduce_store(float (&acc)[R][B], const Launch& a, int64_t row0) {
  __shared__ float part[kWarps][R * B];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int b = 0; b < B; ++b) acc[i][b] = warp_sum(acc[i][b]);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int b = 0; b < B; ++b) part[warp][i * B + b] = acc[i][b];
  __syncthreads();
  const int first = warp / a.split * a.split;
  if (warp == first && lane < R * B) {
    const int i = lane / B, b = lane % B;
    float s = 0.f;
    for (int w = 0; w < a.split; ++w) s += part[first + w][lane];
    const int64_t r = row0 + i, rows = a.g.s.rows;
    if (r < rows && b < a.batch) a.y[b * rows + r] = a.bias ? s + a.bias[r] : s;
  }
}

// This thread's row group (first row) and its lane index among the W * 32
// lanes that share it.
__device__ __forceinline__ void place(const Launch& a, int R, int64_t* row0, int* lane_in_group) {
  const int warp = threadIdx.x / 32;
  *row0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / a.split) + warp / a.split) * R;
  *lane_in_group = warp % a.split * 32 + threadIdx.x % 32;
}

__device__ __forceinline__ uint4 ld16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ float4 ldx(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// The 4 codes of bytes 0..3 of `w` (low nibbles if shift 0, high if 4) as
// floats, minus `zero`: 0x4B0000nn is the float 2^23 + nn, exact.
__device__ __forceinline__ void nibbles(uint32_t w, int shift, float zero, float (&q)[4]) {
  const uint32_t v = (w >> shift) & 0x0F0F0F0Fu;
  q[0] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540)) - zero;
  q[1] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7541)) - zero;
  q[2] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7542)) - zero;
  q[3] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7543)) - zero;
}

// Planar 4-bit (int4w layout): unit = one 32-element block, 16 code bytes;
// byte j holds elements j (low nibble) and j + 16 (high). Per block and
// row: p = sum (q - zero) x, then acc += scale * p (+ min * sum x). The
// next unit's codes and scales are loaded before this one is computed, so
// a lane always has a load in flight.
//
// A lane owns whole blocks, so the x it needs is 128 contiguous bytes: read
// from global memory, each float4 load of a warp touches 32 cache lines. The
// CTA therefore first stages x, a tile of U units at a time, in shared
// memory as [b][k][unit] float4s (k: the block's 8 float4s), so that lanes
// reading consecutive units read consecutive float4s (on an H100: 45% -> 48%
// of the copy bandwidth at batch 1; docs/cuda.md says what was tried beyond
// that: deeper prefetch and other splits did not help). U: 32 KiB of x for
// planar4, 16 KiB (32 KiB at batch 8) for the blocks kernel, which keeps
// shared memory for its weights too. The warps that share a row take 32
// units of a tile each (gemv_tuned caps W so).
__host__ __device__ constexpr int planar4_tile(int B) { return 256 / B; }
__host__ __device__ constexpr int blocks_tile(int B) { return 128 / B < 32 ? 32 : 128 / B; }

// Stages units [t0, t1) of every batch row of x into xs (the whole CTA).
template <int B, int U>
__device__ __forceinline__ void stage_x(const Launch& a, float4* xs, int64_t t0, int64_t t1) {
  __syncthreads();  // the previous tile's readers are done
  const int n = static_cast<int>(t1 - t0) * 8;
  for (int f = threadIdx.x; f < B * n; f += kThreads) {
    const int b = f / n, e = f % n;
    xs[(b * 8 + e % 8) * U + e / 8] = ldx(a.x + (b < a.batch ? b : 0) * a.g.s.cols + t0 * 32 + 4 * e);
  }
  __syncthreads();
}

// float4 k of unit u's 32 x values of batch row b, from the tile at t0.
template <int U>
__device__ __forceinline__ float4 x_part(const float4* xs, int64_t t0, int b, int64_t u, int k) {
  return xs[(b * 8 + k) * U + (u - t0)];
}

template <int B, int R, bool SYM, bool SF32>
__global__ void __launch_bounds__(kThreads, R * B <= 2 ? 4 : R * B <= 4 ? 3 : 1) planar4_kernel(Launch a) {
  constexpr int kTile = planar4_tile(B);
  __shared__ float4 xs[B * 8 * kTile];
  const int64_t rows = a.g.s.rows;
  const WeightLayout& l = a.g.l;
  int64_t row0;
  int li;
  place(a, R, &row0, &li);
  const bool active = row0 < rows;
  const float zero = SYM ? 8388616.f : 8388608.f;  // 2^23 (+ 8)
  const int64_t gs = a.g.s.group_size / 32;         // units per scale group
  const uint8_t* rowp[R];
  int64_t g0[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = min(row0 + i, rows - 1);  // a short last group reads its last row again, stores nothing
    rowp[i] = a.w + r * l.row_bytes;
    g0[i] = r * l.groups;
  }
  uint4 qn[R];
  float sn[R], mnn[R];
  auto load = [&](int64_t u) {  // the next unit's codes and scales, into qn / sn / mnn
    const int64_t g = gs == 1 ? u : u / gs;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      qn[i] = ld16(rowp[i] + u * 16);
      if (SF32) {
        sn[i] = __ldg(reinterpret_cast<const float*>(a.w + l.scales_off) + g0[i] + g);
        mnn[i] = SYM ? 0.f : __ldg(reinterpret_cast<const float*>(a.w + l.mins_off) + g0[i] + g);
      } else {
        sn[i] = __half2float(__ldg(reinterpret_cast<const __half*>(a.w + l.scales_off) + g0[i] + g));
        mnn[i] = SYM ? 0.f : __half2float(__ldg(reinterpret_cast<const __half*>(a.w + l.mins_off) + g0[i] + g));
      }
    }
  };
  float acc[R][B] = {};
  auto compute = [&](const uint4 (&q)[R], const float (&sc)[R], const float (&mn)[R], int64_t t0, int64_t u) {
    float p[R][B] = {}, xsum[B] = {};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float xl[B][4], xh[B][4];
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float4 lo = x_part<kTile>(xs, t0, b, u, k), hi = x_part<kTile>(xs, t0, b, u, k + 4);
        xl[b][0] = lo.x, xl[b][1] = lo.y, xl[b][2] = lo.z, xl[b][3] = lo.w;
        xh[b][0] = hi.x, xh[b][1] = hi.y, xh[b][2] = hi.z, xh[b][3] = hi.w;
        if (!SYM) xsum[b] += (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const uint32_t w = k == 0 ? q[i].x : k == 1 ? q[i].y : k == 2 ? q[i].z : q[i].w;
        float ql[4], qh[4];
        nibbles(w, 0, zero, ql);
        nibbles(w, 4, zero, qh);
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
          for (int t = 0; t < 4; ++t) p[i][b] = fmaf(ql[t], xl[b][t], fmaf(qh[t], xh[b][t], p[i][b]));
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int b = 0; b < B; ++b) {
        acc[i][b] = fmaf(sc[i], p[i][b], acc[i][b]);
        if (!SYM) acc[i][b] = fmaf(mn[i], xsum[b], acc[i][b]);
      }
  };
  const int64_t step = 32 * a.split;
  for (int64_t t0 = 0; t0 < a.units; t0 += kTile) {
    const int64_t t1 = min(t0 + kTile, a.units);
    if (active && t0 + li < t1) load(t0 + li);  // in flight while x is staged
    stage_x<B, kTile>(a, xs, t0, t1);
    if (!active) continue;
    for (int64_t u = t0 + li; u < t1; u += step) {
      uint4 q[R];
      float sc[R], mn[R];
#pragma unroll
      for (int i = 0; i < R; ++i) q[i] = qn[i], sc[i] = sn[i], mn[i] = mnn[i];
      if (u + step < t1) load(u + step);
      compute(q, sc, mn, t0, u);
    }
  }
  reduce_store<R, B>(acc, a, row0);
}

// Plain floats: unit = 16 bytes of the row (4 f32 or 8 f16/bf16 values).
template <WType T, int B>
__global__ void __launch_bounds__(kThreads) float_kernel(Launch a) {
  constexpr int R = rows_for(B);
  constexpr int E = T == WType::F32 ? 4 : 8;
  const int64_t rows = a.g.s.rows, cols = a.g.s.cols;
  int64_t row0;
  int li;
  place(a, R, &row0, &li);
  float acc[R][B] = {};
  if (row0 < rows) {
    for (int64_t u = li; u < a.units; u += 32 * a.split) {
      float w[R][E];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t r = min(row0 + i, rows - 1);
        const uint4 v = ld16(a.w + r * a.g.l.row_bytes + u * 16);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          if (T == WType::F32) {
            w[i][t] = __uint_as_float(words[t]);
          } else if (T == WType::BF16) {
            w[i][2 * t] = __uint_as_float(words[t] << 16);
            w[i][2 * t + 1] = __uint_as_float(words[t] & 0xFFFF0000u);
          } else {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[t]));
            w[i][2 * t] = f.x;
            w[i][2 * t + 1] = f.y;
          }
        }
      }
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float* xb = a.x + (b < a.batch ? b : 0) * cols + u * E;
        float xv[E];
#pragma unroll
        for (int h = 0; h < E / 4; ++h) {
          const float4 f = ldx(xb + 4 * h);
          xv[4 * h] = f.x, xv[4 * h + 1] = f.y, xv[4 * h + 2] = f.z, xv[4 * h + 3] = f.w;
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int t = 0; t < E; ++t) acc[i][b] = fmaf(w[i][t], xv[t], acc[i][b]);
      }
    }
  }
  reduce_store<R, B>(acc, a, row0);
}

// Floats whose rows are not 16-byte aligned: unit = one span of up to 32
// elements, read by the CPU's own decode_span (common/weight_decode.h).
template <int B>
__global__ void __launch_bounds__(kThreads) span_kernel(Launch a) {
  const int64_t rows = a.g.s.rows, cols = a.g.s.cols;
  int64_t row0;
  int li;
  place(a, 1, &row0, &li);
  float acc[1][B] = {};
  if (row0 < rows) {
    for (int64_t u = li; u < a.units; u += 32 * a.split) {
      const int64_t c0 = u * 32;
      const int n = cols - c0 < 32 ? static_cast<int>(cols - c0) : 32;
      float w[32];
      decode_span(a.g.s, a.g.l, a.w, row0, c0, n, w);
#pragma unroll
      for (int b = 0; b < B; ++b) {
        if (b >= a.batch) break;
        const float* xb = a.x + b * cols + c0;
        float p = 0.f;
        for (int j = 0; j < n; ++j) p = fmaf(w[j], __ldg(xb + j), p);
        acc[0][b] += p;
      }
    }
  }
  reduce_store<1, B>(acc, a, row0);
}

// Block types (q8_0, q5_0/1, the k-quants, the i-quants, mxfp4): unit = one
// 32-element span. A warp's step is 32 consecutive units of its row, 1024
// elements: whole blocks and super-blocks, contiguous bytes at any
// alignment. The warp copies them into a shared-memory slot with coalesced
// 16-byte cp.async copies, the next step's in flight while this one is
// computed (two slots; one where shared memory allows no second), then each
// lane decodes its span from the slot with the CPU's own decode_span, the
// type fixed at compile time so the switch folds and the 32 values stay in
// registers. Reading the blocks straight from global memory a byte at a
// time, lanes 18 to 210 bytes apart, cost one L1 wavefront per byte and
// lane group: 3.5-7% of the copy bandwidth on an H100 (docs/cuda.md).
constexpr int kStepUnits = 32;

// A block type's geometry as constants device code can read: elements per
// block, and the 16-byte words that cover one step's bytes at any alignment.
template <WType T>
struct StepOf {
  static constexpr int kElems = wtype_info(T).block_elems;
  static constexpr int kWords = (kStepUnits * 32 / kElems * wtype_info(T).block_bytes + 15) / 16 + 1;
};

// cp.async is sm_80 and up; built for an older GPU (CMAKE_CUDA_ARCHITECTURES=75:
// a T4) the copy is a plain 16-byte load and store, done when it returns, and
// the group calls have nothing to do.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = ld16(static_cast<const uint8_t*>(gmem));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

template <WType T, int B>
__global__ void __launch_bounds__(kThreads, 2) blocks_kernel(Launch a) {
  constexpr int V = StepOf<T>::kWords, L = (V + 31) / 32;  // words per step, per lane
  constexpr int64_t kBlockElems = StepOf<T>::kElems;
  constexpr int kTile = blocks_tile(B);
  constexpr int kXBytes = B * 8 * kTile * 16, kSlotBytes = kWarps * V * 16;
  constexpr int S = kXBytes + 2 * kSlotBytes <= 46 * 1024 ? 2 : 1;  // slots per warp (48 KiB static)
  __shared__ float4 xs[B * 8 * kTile];
  __shared__ uint4 ws[kWarps][S][V];
  WeightSpec s = a.g.s;
  s.type = T;
  const WeightLayout& l = a.g.l;
  const int64_t rows = s.rows;
  int64_t row0;
  int li;
  place(a, 1, &row0, &li);
  const bool active = row0 < rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t first = li - lane, step = kStepUnits * a.split;  // this warp's first unit in a tile; its stride
  const uint8_t* row = a.w + (active ? row0 : 0) * l.row_bytes;
  auto at = [&](int64_t u0) { return row + u0 * 32 / kBlockElems * l.block_bytes; };  // step u0's first byte
  auto skew = [&](int64_t u0) { return static_cast<int>(reinterpret_cast<uintptr_t>(at(u0)) & 15); };
  auto issue = [&](int64_t u0, int slot) {  // step u0's words into the slot: one commit group
    const int64_t n = min(static_cast<int64_t>(kStepUnits), a.units - u0);
    const uint8_t* p0 = at(u0) - skew(u0);
    const int words = static_cast<int>((skew(u0) + n * 32 / kBlockElems * l.block_bytes + 15) / 16);
#pragma unroll
    for (int k = 0; k < L; ++k)
      if (lane + 32 * k < words) cp_async16(&ws[warp][slot][lane + 32 * k], p0 + 16 * (lane + 32 * k));
    cp_async_commit();
  };
  float acc[1][B] = {};
  for (int64_t t0 = 0; t0 < a.units; t0 += kTile) {
    const int64_t t1 = min(t0 + kTile, a.units);
    if (active && t0 + first < t1) issue(t0 + first, 0);  // in flight while x is staged
    stage_x<B, kTile>(a, xs, t0, t1);
    if (!active) continue;
    int it = 0;
    for (int64_t u0 = t0 + first; u0 < t1; u0 += step, ++it) {
      const int slot = S == 2 ? it & 1 : 0;
      if (S == 1 && it > 0) issue(u0, 0);
      if (S == 2) {
        if (u0 + step < t1) issue(u0 + step, slot ^ 1);
        else cp_async_commit();  // an empty group keeps the count
      }
      cp_async_wait<S - 1>();  // this lane's words of step u0 are in
      __syncwarp();            // and every lane's
      const int64_t u = u0 + lane;
      if (u < t1) {
        float w[32];
        decode_span(s, l, reinterpret_cast<const uint8_t*>(ws[warp][slot]) + skew(u0), 0, (u - u0) * 32, 32, w);
#pragma unroll
        for (int b = 0; b < B; ++b) {
          float p = 0.f;
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const float4 xv = x_part<kTile>(xs, t0, b, u, k);
            p = fmaf(w[4 * k], xv.x, fmaf(w[4 * k + 1], xv.y, fmaf(w[4 * k + 2], xv.z, fmaf(w[4 * k + 3], xv.w, p))));
          }
          acc[0][b] += p;
        }
      }
      __syncwarp();  // the slot's readers are done before it is filled again
    }
  }
  reduce_store<1, B>(acc, a, row0);
}

__global__ void dequant_kernel(const uint8_t* w, Geometry g, float* out) {
  const int64_t spans = (g.s.cols + 31) / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= g.s.rows * spans) return;
  const int64_t r = i / spans, c0 = i % spans * 32;
  const int n = g.s.cols - c0 < 32 ? static_cast<int>(g.s.cols - c0) : 32;
  float v[32];
  decode_span(g.s, g.l, w, r, c0, n, v);
  for (int j = 0; j < n; ++j) out[r * g.s.cols + c0 + j] = v[j];
}

enum class Kind { Planar4, Float, Span, Blocks };

Kind kind_of(const WeightSpec& k) {
  if (k.type == WType::Int4w) return Kind::Planar4;  // cols % 32 == 0: 16-byte aligned rows
  if (k.type == WType::F32 || k.type == WType::F16 || k.type == WType::BF16)
    return weight_layout(k).row_bytes % 16 == 0 ? Kind::Float : Kind::Span;
  return Kind::Blocks;
}

// The blocks kernel of the matrix's type.
template <int B>
void launch_blocks(const Launch& a, dim3 g, dim3 t, cudaStream_t st) {
  switch (a.g.s.type) {
    case WType::Q8_0: blocks_kernel<WType::Q8_0, B><<<g, t, 0, st>>>(a); break;
    case WType::Q5_0: blocks_kernel<WType::Q5_0, B><<<g, t, 0, st>>>(a); break;
    case WType::Q5_1: blocks_kernel<WType::Q5_1, B><<<g, t, 0, st>>>(a); break;
    case WType::Q4_K: blocks_kernel<WType::Q4_K, B><<<g, t, 0, st>>>(a); break;
    case WType::Q5_K: blocks_kernel<WType::Q5_K, B><<<g, t, 0, st>>>(a); break;
    case WType::Q6_K: blocks_kernel<WType::Q6_K, B><<<g, t, 0, st>>>(a); break;
    case WType::Q3_K: blocks_kernel<WType::Q3_K, B><<<g, t, 0, st>>>(a); break;
    case WType::Q2_K: blocks_kernel<WType::Q2_K, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ4_NL: blocks_kernel<WType::IQ4_NL, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ4_XS: blocks_kernel<WType::IQ4_XS, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ4_XSH: blocks_kernel<WType::IQ4_XSH, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ3_S: blocks_kernel<WType::IQ3_S, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ3_XXS: blocks_kernel<WType::IQ3_XXS, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ2_XXS: blocks_kernel<WType::IQ2_XXS, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ2_XS: blocks_kernel<WType::IQ2_XS, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ2_S: blocks_kernel<WType::IQ2_S, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ1_S: blocks_kernel<WType::IQ1_S, B><<<g, t, 0, st>>>(a); break;
    case WType::IQ1_M: blocks_kernel<WType::IQ1_M, B><<<g, t, 0, st>>>(a); break;
    case WType::MXFP4: blocks_kernel<WType::MXFP4, B><<<g, t, 0, st>>>(a); break;
    case WType::NVFP4: blocks_kernel<WType::NVFP4, B><<<g, t, 0, st>>>(a); break;
    case WType::Q1_0: blocks_kernel<WType::Q1_0, B><<<g, t, 0, st>>>(a); break;
    default: fail(std::string("gemv: no blocks kernel for ") + wtype_info(a.g.s.type).name);
  }
}

// W: the largest power of two <= 8 that leaves each lane at least four
// units (measured on an H100, docs/cuda.md: fewer, longer lanes keep more
// loads in flight than many lanes with one or two units each).
int split_for(int64_t units) {
  int w = 1;
  while (w < kWarps && units >= int64_t(32) * (2 * w) * 4) w *= 2;
  return w;
}

template <int B, int R>
void launch_planar4(const Launch& a, dim3 g, dim3 t, cudaStream_t st) {
  const bool sym = a.g.s.symmetric, f32 = a.g.s.scale_f32;
  if (sym && !f32) planar4_kernel<B, R, true, false><<<g, t, 0, st>>>(a);
  else if (sym) planar4_kernel<B, R, true, true><<<g, t, 0, st>>>(a);
  else if (!f32) planar4_kernel<B, R, false, false><<<g, t, 0, st>>>(a);
  else planar4_kernel<B, R, false, true><<<g, t, 0, st>>>(a);
}

template <int B>
void launch_b(const Launch& a, Kind kind, int R, cudaStream_t st) {
  const int64_t rows_per_cta = static_cast<int64_t>(kWarps / a.split) * R;
  const int64_t grid = (a.g.s.rows + rows_per_cta - 1) / rows_per_cta;
  if (grid > 0x7fffffff) fail("gemv: too many rows for one launch");
  const dim3 g(static_cast<unsigned>(grid)), t(kThreads);
  switch (kind) {
    case Kind::Planar4:
      if (R == 1) launch_planar4<B, 1>(a, g, t, st);
      else if (R == 2) launch_planar4<B, 2>(a, g, t, st);
      else launch_planar4<B, 4>(a, g, t, st);
      break;
    case Kind::Float:
      if (a.g.s.type == WType::F32) float_kernel<WType::F32, B><<<g, t, 0, st>>>(a);
      else if (a.g.s.type == WType::F16) float_kernel<WType::F16, B><<<g, t, 0, st>>>(a);
      else float_kernel<WType::BF16, B><<<g, t, 0, st>>>(a);
      break;
    case Kind::Span:
      span_kernel<B><<<g, t, 0, st>>>(a);
      break;
    case Kind::Blocks:
      launch_blocks<B>(a, g, t, st);
      break;
  }
  check_launch("gemv kernel");
}

}  // namespace

DeviceMatrix upload_matrix(const WeightSpec& s, const uint8_t* host) {
  if (host == nullptr) fail("upload_matrix: no weights");
  DeviceMatrix m;
  m.spec = s;
  m.kspec = s;
  std::vector<uint8_t> planar;
  if (planar_twin(s, &m.kspec)) {
    planar.resize(weight_nbytes(m.kspec));
    repack_planar(s, host, planar.data());
    host = planar.data();
  }
  // The blocks kernel reads whole aligned 16-byte words, so the last one
  // may reach up to 15 bytes past the matrix: they exist, zeroed.
  const size_t n = weight_nbytes(m.kspec);
  m.bytes = DeviceBuffer(n + kReadSlack);
  m.bytes.upload(host, n);
  check(cudaMemset(m.bytes.as<uint8_t>() + n, 0, kReadSlack), "cudaMemset");
  return m;
}

const char* gemv_kernel_name(const DeviceMatrix& m) {
  switch (kind_of(m.kspec)) {
    case Kind::Planar4: return "planar4";
    case Kind::Float: return "float";
    case Kind::Span: return "span";
    default: return "blocks";
  }
}

void gemv_tuned(const DeviceMatrix& m, const float* x, int batch, const float* bias, float* y, cudaStream_t stream,
                const GemvTuning& tune) {
  const int split = tune.split;
  if (batch < 1 || batch > kMaxBatch)
    fail("gemv: batch must be 1.." + std::to_string(kMaxBatch) + ", got " + std::to_string(batch));
  if (x == nullptr || y == nullptr || m.bytes.get() == nullptr) fail("gemv: null device pointer");
  if (split != 0 && split != 1 && split != 2 && split != 4 && split != 8)
    fail("gemv: warps per row must be 0 (auto), 1, 2, 4 or 8, got " + std::to_string(split));
  const Kind kind = kind_of(m.kspec);
  Launch a{m.bytes.as<uint8_t>(), {m.kspec, weight_layout(m.kspec)}, x, batch, bias, y, 0, 1};
  const int64_t cols = m.kspec.cols;
  a.units = kind == Kind::Float ? static_cast<int64_t>(a.g.l.row_bytes / 16) : (cols + 31) / 32;
  const int B = batch <= 1 ? 1 : batch <= 2 ? 2 : batch <= 4 ? 4 : 8;
  a.split = split ? split : split_for(a.units);
  // The planar4 and blocks warps of a row group each take 32 units of an x
  // tile: at batch 2 and up, fewer of them share a row.
  if (kind == Kind::Planar4) a.split = std::min(a.split, planar4_tile(B) / 32);
  if (kind == Kind::Blocks) a.split = std::min(a.split, blocks_tile(B) / 32);
  if (tune.rows != 0 && tune.rows != 1 && tune.rows != 2 && tune.rows != 4)
    fail("gemv: rows per group must be 0 (auto), 1, 2 or 4, got " + std::to_string(tune.rows));
  const int R = kind == Kind::Blocks || kind == Kind::Span ? 1 : kind == Kind::Planar4 && tune.rows ? tune.rows : rows_for(B);
  switch (B) {
    case 1: launch_b<1>(a, kind, R, stream); break;
    case 2: launch_b<2>(a, kind, R, stream); break;
    case 4: launch_b<4>(a, kind, R, stream); break;
    default: launch_b<8>(a, kind, R, stream); break;
  }
}

void gemv(const DeviceMatrix& m, const float* x, int batch, const float* bias, float* y, cudaStream_t stream) {
  gemv_tuned(m, x, batch, bias, y, stream, GemvTuning{});
}

void dequantize(const DeviceMatrix& m, float* out, cudaStream_t stream) {
  if (out == nullptr || m.bytes.get() == nullptr) fail("dequantize: null device pointer");
  // The stored matrix's values: a repacked one decodes through its twin,
  // whose arithmetic is the same (repack.h).
  const Geometry g{m.kspec, weight_layout(m.kspec)};
  const int64_t n = m.kspec.rows * ((m.kspec.cols + 31) / 32);
  const int64_t blocks = (n + 255) / 256;
  if (blocks > 0x7fffffff) fail("dequantize: matrix too large for one launch");
  dequant_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(m.bytes.as<uint8_t>(), g, out);
  check_launch("dequantize kernel");
}

}  // namespace ie::cuda
