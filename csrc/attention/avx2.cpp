// AVX2/FMA attention loops (this file alone is built with -mavx2 -mfma):
// tiles.h's kernels at the sizes that fit 16 vector registers. Scores: three
// queries against four keys (12 accumulators, three query rows and a key
// row), a key row and a query row loaded once per twelve FMAs, where one
// query against eight keys needed nine loads for eight. Mix: six queries'
// 16 output columns (12 accumulators, two value vectors and a probability).
#include "tiles.h"

namespace ie {

const AttnOps kAttnAvx2 = {scores_tiles<3, float>,    max_simd, softmax_exp_simd, mix_tiles<6, 2, float>,
                           scores_tiles<3, uint16_t>, mix_tiles<6, 2, uint16_t>, narrow_simd};

}  // namespace ie
