// ggml's symmetric scale search (make_qx_quants with rmse_type 1 and
// weights) for many blocks at once: q6_k's and q3_k's sub-block scales,
// q3_k's super-block scale under an importance matrix, q4_0/q5_0's and
// int4w's scales under one (formats/quant_search.py qx).
#pragma once
#include <cstdint>

namespace ie {

// Blocks b < n of k elements, x and w at b * k, codes -nmax..nmax-1:
// scale[b] (x ~ scale * code) and iscale[b], the inverse scale whose codes
// that scale was fitted to (both 0 for a block whose largest magnitude is
// under 1e-15). The first fit at -nmax / max (max: the element of largest
// magnitude, sign kept, the first of equals), then -(nmax + 0.1 s) / max for
// s = -9..9 (not 0), each refit by weighted least squares and kept where
// sumlx^2 / suml2 grows. Bit for bit ggml-quants.c's float32 arithmetic:
// every sum left to right from 0, every product in the C source's order.
void qx_search(const float* x, const float* w, int64_t n, int k, int nmax, float* scale, float* iscale);

}  // namespace ie
