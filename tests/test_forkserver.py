"""The fork server (tests/forkserver.py) runs a command as the installed
console script does: same exit status, stdout and stderr, with the run's
own environment (read by Python and by the native library), working
directory and warnings."""

from __future__ import annotations

import os

import pytest

from conftest import GOLDEN_IEBIN, fork_server, run_tool

LLAMA = GOLDEN_IEBIN / "tiny-llama"

CASES = {
    "help": (("ierun", "--help"), {}),
    "generate": (("ierun", "generate", "--model-dir", LLAMA, "--ids", "1,2", "--max-new", "4", "--json"), {}),
    "error-exit-1": (("ierun", "bench", "--model-dir", "no/such/model"), {}),
    "usage-exit-2": (("ierun", "bench", "--device", "tpu", "--model-dir", LLAMA), {}),
    "native-reads-env": (("ierun", "info", "--json"), {"IE_ISA": "scalar"}),
    "native-env-error": (("ierun", "info", "--json"), {"IE_ISA": "bogus"}),
    "python-reads-env": (("ierun", "generate", "--model-dir", LLAMA, "--ids", "1", "--max-new", "2"),
                         {"IE_DEDUP": "yes"}),
    "one-line-warning": (("ierun", "generate", "--model-dir", LLAMA, "--ids", "1", "--max-new", "2", "--json"),
                         {"IE_DEDUP": "1"}),
    "relative-path": (("ieconv", "inspect", "tiny-llama"), {}),
}


@pytest.mark.parametrize("case", CASES)
def test_forked_run_equals_real_process(case, monkeypatch):
    argv, extra = CASES[case]
    monkeypatch.chdir(GOLDEN_IEBIN)
    env = {**os.environ, **extra}
    server = fork_server()
    before = server.runs if server else 0
    forked = run_tool(*argv, env=env)
    real = run_tool(*argv, env=env, real_process=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    if server is not None:
        assert server.runs == before + 1  # the first one really was forked
    if case == "native-reads-env":
        assert '"selected_isa": "scalar"' in real.stdout
    if case == "one-line-warning":
        assert real.stderr.startswith("warning: dedup artifact unusable") and real.stderr.count("\n") == 1


def test_runs_that_may_read_other_variables_get_a_real_process():
    server = fork_server()
    if server is None:
        pytest.skip("IEKIT_TEST_REAL_PROCESSES=1: every run is a real process")
    assert server.accepts("ierun", {**os.environ, "IE_DEDUP": "1", "AFFINITY": "compact"})
    assert not server.accepts("ierun", {**os.environ, "HF_HUB_OFFLINE": "1"})
    assert not server.accepts("ierun", {k: v for k, v in os.environ.items() if k != "PATH"})
    assert not server.accepts("python3", dict(os.environ))
