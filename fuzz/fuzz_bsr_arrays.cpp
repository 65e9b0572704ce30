// bsr_from_arrays (the binding-facing constructor) on fuzzed dimensions and
// arrays: refused with a zeroed output, or a matrix the kernels read in bounds.
#include <vector>

#include "bsr/bsr.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  iefuzz::Reader r(data, size);
  const uint64_t rows = r.get<uint16_t>(), cols = r.get<uint16_t>();
  const uint64_t br = r.get<uint8_t>(), bc = r.get<uint8_t>();
  const size_t n_rp = r.get<uint8_t>(), n_ci = r.get<uint8_t>();
  std::vector<uint32_t> rp(n_rp), ci(n_ci);
  for (auto& v : rp) v = r.get<uint16_t>();
  for (auto& v : ci) v = r.get<uint16_t>();
  std::vector<float> values(r.rest_size() / 4);
  if (!values.empty()) std::memcpy(values.data(), r.rest(), values.size() * 4);
  ie::BsrMatrix m;
  ie::BsrError err;
  const ie::BsrStatus st = ie::bsr_from_arrays(rows, cols, br, bc, rp.data(), rp.size(), ci.data(), ci.size(),
                                               values.data(), values.size(), true, &m, &err);
  if (st != ie::BsrStatus::Ok) {
    if (m.rows || m.values.size() || err.field.empty()) std::abort();
    return 0;
  }
  std::vector<float> x(3 * m.cols, 0.5f), bias(m.rows, 1.f), y(3 * m.rows);
  for (ie::Isa isa : ie::available_isas()) ie::bsr_gemv(m, x.data(), 3, bias.data(), y.data(), 3, isa);
  return 0;
}
