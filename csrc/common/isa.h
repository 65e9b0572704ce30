// The ISA level a call runs at: resolve_isa() is the one place where the
// IE_ISA override (its only reader) and the CPU checks apply. Each kernel
// family then picks its variant for that level from its table (dispatch.h).
#pragma once
#include <string>
#include <vector>

namespace ie {

// Ordered: a kernel family without a variant for a level uses the best
// lower one (common/dispatch.h), except that Avx512 never falls back to
// AvxVnni. AvxVnni = AVX2 + AVX-VNNI, vpdpbusd on VEX-encoded 256-bit
// vectors (Intel's client cores from Alder Lake on, which lack AVX-512;
// also Sapphire Rapids and Zen 5). Avx512 = AVX2 + AVX-512 F/BW/VL/VBMI/VBMI2/VNNI
// (Ice Lake, Zen 4 and later: every CPU with VBMI2 has VBMI, VL and VNNI); Zen 4
// has it without AVX-VNNI, hence the exception. Amx = Avx512 + AMX-TILE +
// AMX-INT8, granted to the process by the OS (Sapphire Rapids and later
// Xeons): only the prefill GEMVs have a variant; every other family runs
// its Avx512 one.
enum class Isa { Scalar = 0, Avx2 = 1, AvxVnni = 2, Avx512 = 3, Amx = 4 };
constexpr int kIsaLevels = 5;

const char* isa_name(Isa isa);

// ISAs this build contains AND this CPU can run, best last.
std::vector<Isa> available_isas();

// "auto" (or "") picks the best available; a named ISA must be available.
// When `requested` is empty the IE_ISA environment variable is consulted.
// Throws std::invalid_argument with a one-line reason otherwise.
Isa resolve_isa(const std::string& requested);

}  // namespace ie
