#include "isa.h"

#include <cstdlib>
#include <stdexcept>

#include "cpu_features.h"

#if IE_HAVE_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ie {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::AvxVnni: return "avxvnni";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
  }
  return "unknown";
}

// Linux hands a process the AMX tile data only once asked
// (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA): without it the first tile
// instruction is a SIGILL. The grant is the process's for good, for every
// thread, and asking again is harmless, so the probe below asks once.
static bool amx_granted() {
#if IE_HAVE_X86 && defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

static std::vector<Isa> probe_isas() {
  std::vector<Isa> out{Isa::Scalar};
#if IE_HAVE_X86
  const CpuFeatures f = detect_cpu_features();
  if (f.avx2 && f.fma && f.f16c) {
    out.push_back(Isa::Avx2);
    if (f.avxvnni) out.push_back(Isa::AvxVnni);
    if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512vbmi && f.avx512vbmi2 && f.avx512vnni) {
      out.push_back(Isa::Avx512);
      if (f.amx_tile && f.amx_int8 && amx_granted()) out.push_back(Isa::Amx);
    }
  }
#endif
  return out;
}

std::vector<Isa> available_isas() {
  // CPUID is slow under virtualisation (~10 us a call here) and every kernel
  // call resolves its ISA, so probe once. A function-local const: initialised
  // thread-safely on first use and never modified, so not mutable state.
  static const std::vector<Isa> isas = probe_isas();
  return isas;
}

Isa resolve_isa(const std::string& requested) {
  std::string name = requested;
  if (name.empty()) {
    const char* env = std::getenv("IE_ISA");
    name = env ? env : "auto";
  }
  const std::vector<Isa> avail = available_isas();
  if (name == "auto") return avail.back();
  for (Isa isa : avail) {
    if (name == isa_name(isa)) return isa;
  }
  std::string have;
  for (Isa isa : avail) have += std::string(have.empty() ? "" : ", ") + isa_name(isa);
  throw std::invalid_argument("ISA '" + name + "' is not available on this CPU/build (available: " +
                              have + ")");
}

}  // namespace ie
