// The rows8 kernels (rows8_tiles.h) with AVX2's maddubs.
#include "rows8_tiles.h"

namespace ie {

void gemv_rows8_avx2(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                     size_t pack_bytes) {
  gemv_rows8_tiles(jobs, n, prep, batch, pool, pack, pack_bytes);
}

}  // namespace ie
