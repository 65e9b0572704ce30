// Every weight type's GEMV and dequantizer on fuzzed parameters and bytes:
// make_weight_spec refuses what it cannot describe (overflowing sizes
// included); a described matrix is read in bounds by every variant, for
// both activation precisions, with a prepared activation reused across calls;
// and its rows8 copy (packing, then the int8 kernel over it) where one exists,
// and the same kernels over tiles packed as they run (gemv_packing), which
// must give that copy's output bit for bit.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/weight_types.h"
#include "fuzz_util.h"
#include "gemv/gemv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  iefuzz::Reader r(data, size);
  const ie::WTypeInfo& t = ie::kWeightTypes[r.get<uint8_t>() % ie::kNumWeightTypes];
  const int64_t rows = r.get<int64_t>(), cols = r.get<int64_t>(), group = r.get<int64_t>();
  const uint8_t flags = r.get<uint8_t>();
  const int batch = 1 + flags % 8, threads = 1 + (flags >> 3) % 3;
  ie::WeightSpec s;
  try {
    s = ie::make_weight_spec(t.name, rows, cols, group, flags & 0x40, flags & 0x80 ? "f32" : "f16");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const size_t nbytes = ie::weight_nbytes(s);
  // Small matrices reach every code path (tails, groups, batches) at a rate
  // that gets a target to a million executions.
  if (nbytes > (size_t(1) << 16) || s.rows * s.cols > (int64_t(1) << 13)) return 0;
  std::vector<uint8_t> w(nbytes);
  std::memcpy(w.data(), r.rest(), std::min(nbytes, r.rest_size()));  // any bytes, NaN scales included
  std::vector<float> x(static_cast<size_t>(batch * s.cols), 0.25f), y(static_cast<size_t>(batch * s.rows));
  std::vector<float> out(static_cast<size_t>(s.rows * s.cols));
  ie::dequantize(s, w.data(), out.data());
  ie::PreparedAct xa;
  ie::GemvScratch scratch;
  ie::ThreadPool pool(threads);
  xa.set(x.data(), batch, s.cols);
  for (ie::Isa isa : ie::available_isas())
    for (ie::Act act : {ie::Act::F32, ie::Act::Int8}) {
      if (act == ie::Act::Int8 && !t.int8_act) continue;
      ie::gemv(s, w.data(), xa, nullptr, y.data(), act, pool, isa, scratch);
      if (act == ie::Act::Int8 && ie::gemv_uses_rows8(s, act, isa)) {
        const ie::Rows8 packed = ie::pack_rows8(s, w.data(), pool);
        ie::gemv(s, w.data(), xa, nullptr, y.data(), act, pool, isa, scratch, &packed);
        std::vector<float> y2(y.size());
        if (!ie::gemv_packing(s, w.data(), xa, nullptr, y2.data(), pool, isa, scratch) ||
            std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) != 0)
          __builtin_trap();  // NaN scales included: the same bytes through the same kernels
      }
    }
  return 0;
}
