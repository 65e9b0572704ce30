// The attention loops with AVX512VL's 32 vector registers (this file alone
// is built with the AVX-512 flags): tiles.h's kernels on the same 256-bit
// vectors as avx2.cpp, with twice the tile. Scores: six queries against four
// keys (24 accumulators), ten loads per 24 FMAs where the AVX2 tile takes
// seven per 12; mix: six queries' 32 output columns (24 accumulators), ten
// loads per 24 FMAs where AVX2 takes eight per 12. One thread, head_dim 64,
// a 64-key block and 30 queries (a SmolLM2 prefill item): scores 43 -> 47,
// mix 54 -> 56 G multiply-adds/s. The same floats as avx2.cpp's (tiles.h).
#include "tiles.h"

namespace ie {

const AttnOps kAttnAvx512 = {scores_tiles<6, float>,    max_simd, softmax_exp_simd, mix_tiles<6, 4, float>,
                             scores_tiles<6, uint16_t>, mix_tiles<6, 4, uint16_t>, narrow_simd};

}  // namespace ie
