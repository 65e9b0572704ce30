"""llama.cpp itself loads and runs what ``ieconv iebin-to-gguf`` writes, for
every architecture (skipped unless ``make llamacpp`` built its tools, or
they are on PATH): ``llama-bench`` processes a prompt and generates tokens
with each exported model, which fails on any tensor name, shape, type or
hyperparameter llama.cpp does not accept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_gguf_export import ARCH_OF, _export, models  # noqa: F401  (the fixture)

sys.path.insert(0, str(REPO / "benchmarks"))
from llamacpp import tool  # noqa: E402

BENCH = tool("llama-bench")


@pytest.mark.skipif(BENCH is None, reason="llama.cpp's llama-bench is not built (make llamacpp)")
@pytest.mark.parametrize("name", sorted(ARCH_OF))
def test_llamacpp_runs_the_export(tmp_path, models, name):  # noqa: F811
    out = tmp_path / f"{name}.gguf"
    assert _export(models[name], out).returncode == 0
    res = subprocess.run([BENCH, "-m", str(out), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert '"n_gen": 4' in res.stdout and '"avg_ts"' in res.stdout, res.stdout[-2000:]
