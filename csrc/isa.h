// The one place where a kernel variant is chosen. Every kernel family takes
// an Isa argument; callers obtain it from resolve_isa() so that the
// IE_ISA override and the CPU checks apply uniformly.
#pragma once
#include <string>
#include <vector>

namespace ie {

// Ordered: a kernel family without a variant for a level uses the best
// lower one (`isa >= Isa::Avx2`). Avx512 = AVX2 + AVX-512 F/BW/VBMI2; only
// the dedup kernel has an AVX-512 body so far.
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

const char* isa_name(Isa isa);

// ISAs this build contains AND this CPU can run, best last.
std::vector<Isa> available_isas();

// "auto" (or "") picks the best available; a named ISA must be available.
// When `requested` is empty the IE_ISA environment variable is consulted.
// Throws std::invalid_argument with a one-line reason otherwise.
Isa resolve_isa(const std::string& requested);

// Kernel families and the ISA their best variant needs.
enum class Family { Gemv, Bsr, StreamRead, Dedup };

// The variant a family really runs for a resolved `isa`: the best one it has
// at or below it (what benchmarks must report). Throws for an unknown name.
Isa kernel_isa(Family family, Isa isa);
Family parse_family(const std::string& name);

}  // namespace ie
