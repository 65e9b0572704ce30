#include "cpu_features.h"

#include <thread>

#if IE_HAVE_X86
#include <cpuid.h>
#endif

namespace ie {

std::vector<std::pair<std::string, bool>> CpuFeatures::flags() const {
  return {{"sse4.2", sse42},       {"avx", avx},           {"avx2", avx2},
          {"fma", fma},            {"f16c", f16c},         {"avx512f", avx512f},
          {"avx512bw", avx512bw},  {"avx512vl", avx512vl}, {"avx512vnni", avx512vnni},
          {"avx512vbmi", avx512vbmi}, {"avx512vbmi2", avx512vbmi2}, {"avxvnni", avxvnni}, {"amx_tile", amx_tile},
          {"amx_int8", amx_int8}};
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if IE_HAVE_X86
  // libgcc's __builtin_cpu_supports also checks XCR0, i.e. that the OS saves
  // the wide registers, so a "true" here is safe to execute.
  __builtin_cpu_init();
  f.sse42 = __builtin_cpu_supports("sse4.2");
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // Not every compiler's __builtin_cpu_supports knows f16c and avxvnni
  // (clang 14 does not): read their CPUID bits, valid once AVX (and so the
  // OS's YMM state) is known to be usable.
  unsigned a = 0, b = 0, c = 0, d = 0;
  f.f16c = f.avx && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
  f.avx512vbmi2 = __builtin_cpu_supports("avx512vbmi2");
  f.avxvnni = f.avx && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
  // AMX: CPUID.7.0 EDX bits 24 (tile) and 25 (int8), and XCR0 bits 17-18
  // (the OS saves the tile configuration and data).
  if (f.avx512f && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    const bool tile = d >> 24 & 1, int8 = d >> 25 & 1;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const bool os = (lo >> 17 & 3) == 3;
    f.amx_tile = tile && os;
    f.amx_int8 = tile && int8 && os;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  f.logical_cpus = n ? static_cast<int>(n) : 1;
  return f;
}

}  // namespace ie
