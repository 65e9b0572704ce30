"""No function compiled with SIMD flags may be picked by the linker for a
caller compiled without them.

Inline functions and template instances (std::vector<float> methods,
helpers in shared headers) are emitted as weak/COMDAT symbols in every
object that does not inline them, and the linker keeps ONE copy. If that
copy comes from an AVX2 object, a scalar caller on a CPU without AVX2
executes AVX2 code. So: every weak symbol an ISA object defines must not
be defined or referenced by any object built with other flags.

Usage: check_isa_symbols.py OBJECTS_LIST_FILE (one object path a line), or
object paths as arguments. Exit 1 and one line per clash.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ISA_OBJECT = re.compile(r"(avx2|avxvnni|avx512|amx)\.cpp\.o$")
# Compiler-generated helpers with no ISA-dependent code: clang's
# __clang_call_terminate is a call to __cxa_begin_catch and std::terminate.
COMPILER_HELPERS = {"__clang_call_terminate"}


def symbols(obj: str) -> tuple[set[str], set[str]]:
    """(weak code symbols defined, symbols referenced) of one object file.
    Weak objects (V: e.g. DW.ref.__gxx_personality_v0) hold data, which no ISA flag changes."""
    out = subprocess.run(["nm", "--defined-only", obj], capture_output=True, text=True, check=True).stdout
    weak = {ln.split()[-1] for ln in out.splitlines() if len(ln.split()) == 3 and ln.split()[1] in "Wu"}
    out = subprocess.run(["nm", "--undefined-only", obj], capture_output=True, text=True, check=True).stdout
    undef = {ln.split()[-1] for ln in out.splitlines() if ln.split()}
    return weak, undef


def main(argv: list[str]) -> int:
    objs = argv[1:]
    if len(objs) == 1 and not objs[0].endswith(".o"):
        objs = [ln for ln in Path(objs[0]).read_text().splitlines() if ln.strip()]
    isa_objs = [o for o in objs if ISA_OBJECT.search(o)]
    if not isa_objs:
        print("check_isa_symbols: no ISA objects given", file=sys.stderr)
        return 1
    users: dict[str, list[str]] = defaultdict(list)
    for o in objs:
        weak, undef = symbols(o)
        for s in weak | undef:
            users[s].append(o)
    clashes = []
    for o in isa_objs:
        flavour = ISA_OBJECT.search(o).group(1)
        for s in symbols(o)[0] - COMPILER_HELPERS:
            others = [u for u in users[s] if u != o and not (ISA_OBJECT.search(u) and ISA_OBJECT.search(u).group(1) == flavour)]
            if others:
                clashes.append(f"{Path(o).name}: weak symbol {s} is also in {', '.join(Path(u).name for u in others)}")
    for c in clashes:
        print(c)
    print(f"checked {len(isa_objs)} ISA objects against {len(objs)}: {len(clashes)} shared weak symbols")
    return 1 if clashes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
