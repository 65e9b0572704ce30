// The .bsr loader on arbitrary file contents: every input is either refused
// with a named rule and a zeroed output, or loaded into a matrix whose
// product the kernels compute in bounds (scalar and every SIMD variant).
#include <cmath>
#include <vector>

#include "bsr/bsr.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = iefuzz::write_file("input.bsr", data, size);
  for (bool allow_nonfinite : {false, true}) {
    ie::BsrMatrix m;
    ie::BsrError err;
    const ie::BsrStatus st = ie::bsr_load(path, allow_nonfinite, &m, &err);
    if (st != ie::BsrStatus::Ok) {
      if (m.rows || m.cols || m.nnzb || m.values.size() || m.row_ptr.size() || err.field.empty()) std::abort();
      continue;
    }
    if (m.rows * m.cols > (uint64_t(1) << 22)) continue;  // products of huge sparse shapes: time, not coverage
    std::vector<float> x(2 * m.cols, 1.f), y(2 * m.rows);
    for (ie::Isa isa : ie::available_isas()) ie::bsr_gemv(m, x.data(), 2, nullptr, y.data(), 2, isa);
  }
  return 0;
}
