// Mamba2's selective scan, one token of one head (Granite 4's Mamba2 layers,
// decoder/decoder.cpp Decoder::mamba; Mamba 1's over a run of channels is
// `channels` below): the head's state S [P][N] decays by
// `decay` and takes the outer product dx Bᵀ, and the token's output is
// y[p] = S[p] · C. It is O(P N) per token and head, and a sequential scan
// (each token reads the state the one before wrote), so in a prefill it
// runs once per token: with the state update and the dot in separate passes
// the compiler's SSE2 loops took half of a Granite-4-shaped prefill. Fused,
// each state row is loaded once and stored once per token.
#pragma once
#include "common/dispatch.h"
#include "common/isa.h"

namespace ie {

struct SsmOps {
  // For p < P: S[p][n] = S[p][n] * decay + dx[p] * B[n] (n < N), then
  // y[p] = sum over n of S[p][n] * C[n] with the updated state. The scalar
  // reference rounds each product and sum (no fused multiply-add) and sums
  // the dot in eight partial sums (lane u: n % 8 == u below N - N % 8,
  // added ((0+1)+(2+3))+((4+5)+(6+7)), then the tail in order); the SIMD
  // variants fuse the update's multiply-add and sum in their vector width
  // (AVX-512's sixteen lanes folded to eight): within a few ulps of it.
  void (*step)(float* S, int P, int N, float decay, const float* dx, const float* B, const float* C, float* y);
  // Mamba 1's step (Decoder::mamba1), one token over `channels` channels, each its own state row H[ch] [N] and rates
  // A[ch] [N] (-exp(A_log), negative) beside its dt[ch] (positive) and x[ch]: for n < N,
  // H[ch][n] = exp(dt[ch] A[ch][n]) H[ch][n] + dt[ch] x[ch] B[n], then y[ch] = sum over n of H[ch][n] C[n]. Its
  // N exps per channel are most of a Mamba layer's time outside its matrices (Falcon Mamba 7B: 8192 channels of
  // 16); the scalar reference takes std::exp and sums as `step` does, the SIMD variants common/exp_avx2.h's exp
  // and their vector width: within a few ulps of it.
  void (*channels)(float* H, int channels, int N, const float* dt, const float* x, const float* A, const float* B,
                   const float* C, float* y);
};

extern const SsmOps kSsmScalar;
#if IE_HAVE_X86
extern const SsmOps kSsmAvx2;
extern const SsmOps kSsmAvx512;
#endif
extern const IsaTable<SsmOps> kSsmTable;

}  // namespace ie
