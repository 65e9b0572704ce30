// The dedup loader (DedupStore) on a fuzzed index and fuzzed blob files:
// every input is refused with a "FILE: FIELD: message" line, or every
// member it serves is rebuilt in bounds, by every variant, whole and from a
// cursor in the middle (the fused GEMV's ranges), the two agreeing.
//
// Input encoding (little-endian; fuzz/make_seeds.py writes the golden
// artifact this way):
//   u32 alignment, u8 G, u8 M,
//   G x {i64 nbytes, i64 default_offset},
//   M x {u8 group, i64 mask_offset, i64 mask_nbytes, i64 exc_offset, i64 exc_count},
//   3 x i64 declared blob size, 3 x u32 blob length, then the three blobs.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "dedup/dedup.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace dd = ie::dedup;
  iefuzz::Reader r(data, size);
  dd::StoreSpec s;
  s.model_dir = iefuzz::scratch_dir();
  s.blob_names = {"model.defaults.bin", "model.masks.bin", "model.exceptions.bin"};
  s.alignment = r.get<uint32_t>();
  const int G = r.get<uint8_t>() % 16, M = r.get<uint8_t>() % 32;
  for (int g = 0; g < G; ++g) {
    s.group_nbytes.push_back(r.get<int64_t>());
    s.group_default_offset.push_back(r.get<int64_t>());
  }
  for (int i = 0; i < M; ++i) {
    s.names.push_back("t" + std::to_string(i));
    s.member_group.push_back(r.get<uint8_t>());
    s.mask_offset.push_back(r.get<int64_t>());
    s.mask_nbytes.push_back(r.get<int64_t>());
    s.exc_offset.push_back(r.get<int64_t>());
    s.exc_count.push_back(r.get<int64_t>());
  }
  for (int b = 0; b < 3; ++b) s.blob_sizes[b] = r.get<int64_t>();
  uint32_t len[3];
  for (uint32_t& l : len) l = r.get<uint32_t>();
  for (int b = 0; b < 3; ++b) {
    const size_t n = std::min<size_t>(len[b], r.rest_size());
    iefuzz::write_file(s.blob_names[b], r.rest(), n);
    r.skip(n);
  }
  for (ie::Isa isa : ie::available_isas()) {
    try {
      dd::DedupStore store(s, size_t(1) << 20, 2, false, isa);
      for (const std::string& name : store.names()) {
        dd::BufferPtr buf = store.get(name);
        if (buf->size != store.nbytes(name)) std::abort();
        const dd::MemberView v = store.view(name);
        const size_t a = v.nbytes / 3 + (v.nbytes > 7 ? 5 : 0);
        std::vector<uint8_t> part(v.nbytes - std::min(a, v.nbytes));
        dd::Cursor c = dd::cursor_at(v, std::min(a, v.nbytes));
        if (!dd::reconstruct_range(v, c, std::min(a, v.nbytes), v.nbytes, part.data(), isa) ||
            !std::equal(part.begin(), part.end(), buf->data + std::min(a, v.nbytes)))
          std::abort();
      }
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      if (m.find(": ") == std::string::npos) std::abort();  // not a FILE: FIELD: message line
      return 0;
    }
  }
  return 0;
}
