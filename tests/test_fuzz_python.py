"""The Python fuzz targets (fuzz/fuzz_python.py) run in the ordinary suite:
each over its golden seeds and deterministic mutations of them, so a harness
that breaks, or an input class that regresses, fails here without atheris.
Refusals must be IEError; the differential targets must agree."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("fuzz_python", Path(__file__).resolve().parent.parent / "fuzz" / "fuzz_python.py")
fp = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fp)


@pytest.fixture(autouse=True)
def _scratch(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "SCRATCH", tmp_path)


def _mutations(seed: bytes, n: int, rng: random.Random):
    """Byte flips, truncations, insertions and splices, as libFuzzer makes."""
    for _ in range(n):
        b = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            if op == 0 and b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif op == 1 and b:
                del b[rng.randrange(len(b)):]
            elif op == 2:
                i = rng.randrange(len(b) + 1)
                b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            elif b:
                i, j = sorted(rng.randrange(len(b)) for _ in range(2))
                b[i:j] = b"" if rng.random() < 0.5 else b[i:j] * 2
        yield bytes(b)


@pytest.mark.parametrize("target", sorted(fp.TARGETS))
def test_target_on_seeds_and_mutations(target):
    rng = random.Random(target)
    fn = fp.TARGETS[target]
    n = 10 if target == "chat" else 40 if target in ("iebin", "safetensors", "dedup", "gguf") else 150
    for seed in fp.seeds(target):
        fn(seed)
        for data in _mutations(seed, n // max(1, len(fp.seeds(target))) + 1, rng):
            fn(data)


def test_runner_leaves_no_scratch_behind(tmp_path):
    """Each target's scratch directory is the runner's to remove: libFuzzer
    ends the target's process with exit(), so 119 of them once piled up in /tmp."""
    pytest.importorskip("atheris")
    import os
    import subprocess
    import sys

    (tmp_path / "tmp").mkdir()
    res = subprocess.run([sys.executable, fp.__file__, "--seconds", "1", "--target", "manifest", "--corpus",
                          str(tmp_path / "corpus")], env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "py_manifest:" in res.stdout and "no findings" in res.stdout
    assert list((tmp_path / "tmp").iterdir()) == []
