// CPU feature detection: what the running machine can execute, as opposed to
// what the build targeted. Kernel dispatch (isa.h) is decided from this.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ie {

struct CpuFeatures {
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512vbmi = false;
  bool avx512vbmi2 = false;
  bool avxvnni = false;
  bool amx_tile = false;  // AMX-TILE and AMX-INT8 with the OS's tile state (XCR0);
  bool amx_int8 = false;  // the process must still ask Linux for it (isa.cpp)
  int logical_cpus = 1;

  // (name, present) pairs in a fixed order, for reports.
  std::vector<std::pair<std::string, bool>> flags() const;
};

// Detected once per call; cheap (a few cpuid instructions), no cached state.
CpuFeatures detect_cpu_features();

}  // namespace ie
