// The rows8 kernels (rows8_tiles.h) of the AVX-512 build, with AMX tile
// multiplies for the prefill chunks' sixteen-token passes over pairs of
// tiles (rows8_amx.h); everything else is rows8_avx512.cpp's code.
#define IE_ROWS8_VNNI 1
#define IE_ROWS8_ZMM 1
#define IE_ROWS8_AMX 1
#include "rows8_tiles.h"

namespace ie {

void gemv_rows8_amx(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                    size_t pack_bytes) {
  gemv_rows8_tiles(jobs, n, prep, batch, pool, pack, pack_bytes);
}

}  // namespace ie
