"""Runs libFuzzer targets for a fixed time each, from their seed corpora,
--jobs of them at a time (default: one per CPU this process may use; each
target is one single-threaded process), and keeps what they find.

    python fuzz/run.py --build build/asan --corpus build/fuzz-corpus \\
        --findings fuzz/findings --seconds 60 fuzz_bsr_file fuzz_gemv ...

Each target's new inputs go to CORPUS/TARGET (kept between runs, so fuzzing
resumes), crashes and sanitizer reports to FINDINGS/TARGET/ (crash-*,
leak-*, timeout-*). Prints one line per target with its executions and
findings; exit 1 when any target found something.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_target(exe: Path, corpus: Path, findings: Path, seconds: int) -> tuple[int, int, str]:
    """(executions, findings, last lines of output) of one timed run. The
    target's scratch files (fuzz_util.h) go to a directory of this run's,
    removed when it ends: libFuzzer leaves with exit(), so the target
    cannot remove its own."""
    corpus.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    before = set(findings.iterdir())
    env = dict(os.environ, UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    env.pop("LD_PRELOAD", None)  # the targets link their own sanitizer runtime
    cmd = [str(exe), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=4096", "-print_final_stats=1",
           f"-artifact_prefix={findings}/", str(corpus)]
    regressions = REPO / "fuzz" / "regressions" / exe.name
    if regressions.is_dir():  # start from the inputs that once found bugs (libFuzzer only reads them)
        cmd.append(str(regressions))
    with tempfile.TemporaryDirectory(prefix=f"iefuzz-{exe.name}.") as scratch:
        res = subprocess.run(cmd, capture_output=True, text=True, env={**env, "TMPDIR": scratch},
                             timeout=seconds * 3 + 120)
    out = res.stdout + res.stderr
    runs = [int(m) for m in re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)]
    new = set(findings.iterdir()) - before
    bad = len(new) + (1 if res.returncode != 0 and not new else 0)
    return (runs[-1] if runs else 0), bad, "\n".join(out.strip().splitlines()[-25:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--findings", type=Path, required=True)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="targets run at once (default: the CPUs this process may use)")
    ap.add_argument("targets", nargs="+")
    a = ap.parse_args()
    for t in a.targets:
        if not (a.build / t).is_file():
            print(f"{t}: not built ({a.build / t}); run make san-build", file=sys.stderr)
            return 1
    failed = 0
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        results = pool.map(lambda t: run_target(a.build / t, a.corpus / t, a.findings / t, a.seconds), a.targets)
        for t, (runs, bad, tail) in zip(a.targets, results):  # in the targets' order, each once it has ended
            print(f"{t}: {runs} executions in {a.seconds} s, {bad} findings", flush=True)
            if bad:
                failed += 1
                print(tail, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
