// The rows8 kernels (rows8_tiles.h) with AVX-512 VNNI's vpdpbusd, on 256-bit
// vectors (AVX512VL): the layout's tiles are 32 bytes wide. Its 32 registers
// hold eight tokens' sums, and pairs of tiles run in 512-bit vectors.
#define IE_ROWS8_VNNI 1
#define IE_ROWS8_ZMM 1
#include "rows8_tiles.h"

namespace ie {

void gemv_rows8_avx512(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                       size_t pack_bytes) {
  gemv_rows8_tiles(jobs, n, prep, batch, pool, pack, pack_bytes);
}

}  // namespace ie
