// The scale search of ggml's quantize_row_iq4_nl_impl (iq4_nl, iq4_xs) for
// many 32-element blocks at once (formats/quant_search.py iq4_scales), and
// iq4_xsh's search over the same grid and its shifted copy.
#pragma once
#include <cstdint>

namespace ie {

// Blocks b < n of 32 elements, x and w at 32 b: scale[b] (x ~ scale *
// kIq4Values[code]; 0 for a block whose largest magnitude is under 1e-15):
// the first fit at -max/127, then 2 ntry + 1 more starts (itry - 127) / max,
// each refit by weighted least squares, the one of largest sumqx^2 / sumq2
// kept. Bit for bit the numpy search it replaced: a code is the nearest grid
// value (a tie to the upper, beyond the grid its end), every sum left to right.
void iq4_scales(const float* x, const float* w, int64_t n, int ntry, float* scale);

// iq4_xsh's search (formats/quant.py IQ4_XSH): per block the scale of least
// weighted squared error on either grid (the iq4 grid, or it plus
// kIq4ShiftStep), over scales that put the largest element near either end
// of each grid; 0 for a block whose largest magnitude is under 1e-15.
void iq4_shifted_scales(const float* x, const float* w, int64_t n, int ntry, float* scale);

}  // namespace ie
