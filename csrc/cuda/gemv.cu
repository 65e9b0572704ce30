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
// from global memory, each float4 load of a warp touches 32 cache lines. At
// batch 1 and 2 the CTA therefore first stages x, a tile of kTile4 / B units
// at a time, in shared memory as [b][k][unit] float4s (k: the block's 8
// float4s), so that lanes reading consecutive units read consecutive float4s
// (on an H100: 45% -> 48% of the copy bandwidth; docs/cuda.md says what was
// tried beyond that: deeper prefetch and other splits did not help).
constexpr int kTile4 = 256;  // units of x per staged tile at batch 1: 32 KiB

template <int B>
__device__ __forceinline__ float4 x_part(const Launch& a, const float4* xs, int64_t t0, int b, int64_t u, int k) {
  if (B <= 2) return xs[(b * 8 + k) * (kTile4 / B) + (u - t0)];
  return ldx(a.x + (b < a.batch ? b : 0) * a.g.s.cols + u * 32 + 4 * k);
}

template <int B, int R, bool SYM, bool SF32>
__global__ void __launch_bounds__(kThreads, R * B <= 2 ? 4 : R * B <= 4 ? 3 : 1) planar4_kernel(Launch a) {
  constexpr bool kStage = B <= 2;
  constexpr int kTile = kStage ? kTile4 / B : 1 << 30;
  __shared__ float4 xs[kStage ? B * 8 * kTile : 1];
  const int64_t rows = a.g.s.rows, cols = a.g.s.cols;
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
        const float4 lo = x_part<B>(a, xs, t0, b, u, k), hi = x_part<B>(a, xs, t0, b, u, k + 4);
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
    if (kStage) {
      __syncthreads();  // the previous tile's readers are done
      const int n = static_cast<int>(t1 - t0) * 8;
      for (int f = threadIdx.x; f < B * n; f += kThreads) {
        const int b = f / n, e = f % n;
        xs[(b * 8 + e % 8) * kTile + e / 8] = ldx(a.x + (b < a.batch ? b : 0) * cols + t0 * 32 + 4 * e);
      }
      __syncthreads();
    }
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

// Any type: unit = one 32-element span, decoded by the CPU's own decode_span
// (common/weight_decode.h).
template <int B>
__global__ void __launch_bounds__(kThreads) blocks_kernel(Launch a) {
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

enum class Kind { Planar4, Float, Blocks };

Kind kind_of(const WeightSpec& k) {
  if (k.type == WType::Int4w) return Kind::Planar4;  // cols % 32 == 0: 16-byte aligned rows
  const bool f = k.type == WType::F32 || k.type == WType::F16 || k.type == WType::BF16;
  if (f && weight_layout(k).row_bytes % 16 == 0) return Kind::Float;
  return Kind::Blocks;
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
    case Kind::Blocks:
      blocks_kernel<B><<<g, t, 0, st>>>(a);
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
  if (planar_twin(s, &m.kspec)) {
    std::vector<uint8_t> planar(weight_nbytes(m.kspec));
    repack_planar(s, host, planar.data());
    m.bytes = to_device(planar.data(), planar.size());
  } else {
    m.bytes = to_device(host, weight_nbytes(s));
  }
  return m;
}

const char* gemv_kernel_name(const DeviceMatrix& m) {
  switch (kind_of(m.kspec)) {
    case Kind::Planar4: return "planar4";
    case Kind::Float: return "float";
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
  a.split = split ? split : split_for(a.units);
  const int B = batch <= 1 ? 1 : batch <= 2 ? 2 : batch <= 4 ? 4 : 8;
  if (tune.rows != 0 && tune.rows != 1 && tune.rows != 2 && tune.rows != 4)
    fail("gemv: rows per group must be 0 (auto), 1, 2 or 4, got " + std::to_string(tune.rows));
  const int R = kind == Kind::Blocks ? 1 : kind == Kind::Planar4 && tune.rows ? tune.rows : rows_for(B);
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
