// Warp and block reductions shared by the CUDA kernels: xor butterflies, so
// every lane ends with the same value, summed in the same order everywhere.
#pragma once
#include <cmath>

namespace ie::cuda {
namespace {

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The warp's reduction of v, returned to every lane.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum{}); }

// The block's reduction of every thread's v (`identity` fills the missing
// warps), returned to every thread; `red` is 32 floats of shared memory,
// free again on return.
template <class Op>
__device__ inline float block_reduce(float v, float* red, float identity, Op op) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < warps ? red[lane] : identity;
  v = warp_reduce(v, op);
  __syncthreads();
  return v;
}
__device__ inline float block_sum(float v, float* red) { return block_reduce(v, red, 0.f, Sum{}); }
__device__ inline float block_max(float v, float* red) { return block_reduce(v, red, -INFINITY, Max{}); }

}  // namespace
}  // namespace ie::cuda
