"""benchmarks/vs_llamacpp.py's reading of llama-bench: llama.cpp's figures
are the faster of its default run and a --repack 0 one, and the table says
which came from where."""

from __future__ import annotations

import sys

import vs_llamacpp

# A stand-in llama-bench: logs its arguments, prints llama-bench's JSON for pp and tg. With --repack 0 its
# pp is faster and its tg slower; CRASH: its default dies of SIGSEGV (llama.cpp 0.3.36's AMX path); NOFLAG:
# it does not know --repack (ik_llama.cpp) and exits 1.
_TOOL = """import json, os, signal, sys
log, mode, args = sys.argv[1], sys.argv[2], sys.argv[3:]
open(log, 'a').write(' '.join(args) + '\\n')
plain = '--repack 0' in ' '.join(args)
if '--repack' in args and mode == 'NOFLAG':
    sys.exit(1)
if not plain and mode == 'CRASH':
    os.kill(os.getpid(), signal.SIGSEGV)
print(json.dumps([{'n_prompt': 512, 'n_gen': 0, 'avg_ts': 300.0 if plain else 200.0},
                  {'n_prompt': 0, 'n_gen': 128, 'avg_ts': 90.0 if plain else 100.0}]))
"""


def _bench(tmp_path, mode: str, extra=()):
    script, log = tmp_path / "llama_bench.py", tmp_path / f"{mode}.log"
    script.write_text(_TOOL)
    exe = tmp_path / f"llama-bench-{mode}"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} {log} {mode} \"$@\"\n")
    exe.chmod(0o755)
    out = vs_llamacpp.llama_bench(str(exe), tmp_path / "m.gguf", 512, 128, 2, 3, list(extra))
    return out, log.read_text().splitlines()


def test_each_figure_is_the_faster_of_default_and_no_repack(tmp_path):
    out, runs = _bench(tmp_path, "BOTH")
    assert out == {"pp": 300.0, "tg": 100.0, "note": "pp with --repack 0, faster than its default here"}
    assert len(runs) == 2 and "--repack" not in runs[0] and runs[1].endswith("--repack 0")


def test_a_crashing_default_counts_only_the_plain_run(tmp_path):
    out, runs = _bench(tmp_path, "CRASH")
    assert out == {"pp": 300.0, "tg": 90.0, "note": "--repack 0: its default crashed here"}
    assert len(runs) == 2


def test_a_build_without_the_flag_keeps_its_default(tmp_path):
    out, runs = _bench(tmp_path, "NOFLAG")
    assert out == {"pp": 200.0, "tg": 100.0, "note": None}
    # given --repack by the user (--llama-bench-args), it runs once, as asked
    out, runs = _bench(tmp_path, "BOTH", ["--repack", "1"])
    assert out == {"pp": 200.0, "tg": 100.0, "note": None} and len(runs) == 1
