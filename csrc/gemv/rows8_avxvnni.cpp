// The rows8 kernels (rows8_tiles.h) with AVX-VNNI's vpdpbusd (VEX, 256-bit):
// Intel's client cores from Alder Lake on have it without AVX-512. One
// instruction does what AVX2's maddubs + madd (+ add) do, with no int16
// step; the 16 registers keep AVX2's four tokens per pass and no pairs.
#define IE_ROWS8_VNNI 1
#include "rows8_tiles.h"

namespace ie {

void gemv_rows8_avxvnni(const Rows8Job* jobs, int n, const Rows8Prep& prep, int batch, ThreadPool& pool, uint8_t* pack,
                        size_t pack_bytes) {
  gemv_rows8_tiles(jobs, n, prep, batch, pool, pack, pack_bytes);
}

}  // namespace ie
