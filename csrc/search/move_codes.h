// ggml's code-moving searches for many blocks at once: make_q3_quants
// (q3_k without an importance matrix) and make_qp_quants (the super-block
// scales and mins of q2_k and q4_k/q5_k under one; formats/quant_search.py
// q3 and qp). Both end with up to five sweeps over a block's elements, each
// moving one code to the one its neighbours' least-squares scale asks for
// where that raises the fit sumlx^2 / suml2.
#pragma once
#include <cstdint>

namespace ie {

// Blocks b < n of k elements at x + b * k, codes -nmax..nmax-1 under the
// weights x^2: scale[b] and codes[b * k ...] = code + nmax (0 and all 0 for
// a block whose largest magnitude is under 1e-15).
void q3_search(const float* x, int64_t n, int k, int nmax, float* scale, uint8_t* codes);

// Blocks b < n of k non-negative elements at x + b * k under weights w,
// codes 0..nmax: the best of nine starts nmax + 0.1 s (s = -4..4) by
// weighted squared error, then the sweeps: scale[b] and codes[b * k ...]
// (0 and all 0 for a block whose largest element is under 1e-15).
void qp_search(const float* x, const float* w, int64_t n, int k, int nmax, float* scale, uint8_t* codes);

// Both bit for bit ggml-quants.c's float32 arithmetic (as the numpy they
// replaced): every sum left to right, every product in the C source's
// order, nearest_int's rounding.

}  // namespace ie
