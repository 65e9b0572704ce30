// ggml's affine scale/min search (make_qkx2_quants, and make_qkx3_quants
// given weights) for many blocks at once: the hot loop of the k-quants',
// q4_1/q5_1's and int4w's importance-weighted quantizers
// (formats/quant_search.py calls it through iekit.formats._search).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ie {

struct QkxSearch {
  int nmax;      // codes 0..nmax
  float rmin;    // the fan of inverse scales: (rmin + rdelta * step + nmax) / (max - min)
  float rdelta;
  int nstep;     // steps 0..nstep
  bool mad;      // compare the weighted absolute error, not the squared one (q2_k)
};

// Blocks b < n of k elements: x and w at b * k. Writes scale[b], the_min[b]
// (>= 0: x ~ scale * code - the_min) and codes[b * k ...]. Bit for bit
// ggml-quants.c's float32 arithmetic: every sum left to right, every
// product in the C source's order, nearest_int's rounding (the file is
// built with -ffp-contract=off).
void qkx_search(const float* x, const float* w, int64_t n, int k, const QkxSearch& s, float* scale, float* the_min,
                uint8_t* codes);

}  // namespace ie
