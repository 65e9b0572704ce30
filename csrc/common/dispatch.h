// Kernel-variant selection: each kernel family keeps ONE table of its
// per-ISA entry points, indexed by Isa, with nullptr where it has no
// variant. The family's driver calls through table.ops(isa), and
// kernel_isa() (what benchmarks report) is table.pick(isa): the same
// lookup, so what is reported is what runs.
#pragma once
#include "isa.h"

namespace ie {

template <class Ops>
struct IsaTable {
  const Ops* by_isa[kIsaLevels];

  // The best level at or below `isa` that has a variant (scalar always
  // does), never AvxVnni's below Avx512 (a CPU with AVX-512 VNNI may lack
  // the VEX form: isa.h).
  constexpr Isa pick(Isa isa) const {
    int i = static_cast<int>(isa);
    const int vex = static_cast<int>(Isa::AvxVnni);
    while (i > 0 && (by_isa[i] == nullptr || (i == vex && isa > Isa::AvxVnni))) --i;
    return static_cast<Isa>(i);
  }
  const Ops& ops(Isa isa) const { return *by_isa[static_cast<int>(pick(isa))]; }
};

}  // namespace ie
