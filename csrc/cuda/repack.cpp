// The q4_0 / q4_1 -> planar int4w repack (repack.h).
#include "cuda/repack.h"

#include <cstring>

#include "common/errors.h"

namespace ie::cuda {

bool planar_twin(const WeightSpec& s, WeightSpec* out) {
  if (s.type != WType::Q4_0 && s.type != WType::Q4_1) return false;
  WeightSpec t;
  t.type = WType::Int4w;
  t.rows = s.rows;
  t.cols = s.cols;
  t.group_size = 32;
  t.symmetric = s.type == WType::Q4_0;
  t.scale_f32 = false;
  *out = t;
  return true;
}

void repack_planar(const WeightSpec& s, const uint8_t* w, uint8_t* out) {
  WeightSpec t;
  if (!planar_twin(s, &t)) fail(std::string(wtype_info(s.type).name) + " has no planar twin");
  const WeightLayout from = weight_layout(s), to = weight_layout(t);
  const bool affine = s.type == WType::Q4_1;
  const size_t groups = static_cast<size_t>(to.groups);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (size_t b = 0; b < groups; ++b) {
      const uint8_t* blk = w + static_cast<size_t>(r) * from.row_bytes + b * from.block_bytes;
      const size_t g = static_cast<size_t>(r) * groups + b;
      std::memcpy(out + static_cast<size_t>(r) * to.row_bytes + b * 16, blk + from.block_qs, 16);
      std::memcpy(out + to.scales_off + 2 * g, blk, 2);
      if (affine) std::memcpy(out + to.mins_off + 2 * g, blk + 2, 2);
    }
  }
}

}  // namespace ie::cuda
