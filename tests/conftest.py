"""Shared fixtures: repository paths and the installed console scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden"
GOLDEN_HF = GOLDEN / "hf"
GOLDEN_IEBIN = GOLDEN / "iebin"
GOLDEN_REF = GOLDEN / "ref"
BIN_DIR = Path(sys.executable).parent


def run_tool(tool: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run an installed console script (ieconv/ierun) as a user would."""
    return subprocess.run([str(BIN_DIR / tool), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    """The error contract: non-zero exit, one stderr line, no traceback."""
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def _tree(d: Path) -> dict[str, str]:
    """Every entry under ``d``: a file's sha256, a symlink's target."""
    import hashlib

    return {str(p.relative_to(d)): os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_symlink() or p.is_file()}


def shared_artifact(tmp_path_factory, name: str, build) -> Path:
    """Build an artifact once per session in a tmp_path_factory dir; the tests
    that use it only read it (a test that changes one works on copy_model's
    copy), which the teardown checks."""
    d = build(tmp_path_factory.mktemp(name))
    before = _tree(d)
    yield d
    assert _tree(d) == before, f"a test modified the shared artifact {d}; copy it first (copy_model)"


def copy_model(src: Path, dst: Path) -> Path:
    """A private copy of a model directory; the dedup links are relative, so
    they point into the copy."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="session")
def nearcopy_f32(tmp_path_factory) -> Path:
    """tests/nearcopy.py's model, kept f32, with its dedup artifact linked."""
    from nearcopy import nearcopy_llama

    yield from shared_artifact(tmp_path_factory, "nearcopy-f32", nearcopy_llama)


@pytest.fixture(scope="session")
def nearcopy_int4w(tmp_path_factory) -> Path:
    """tests/nearcopy.py's model quantized with the default int4w policy."""
    from nearcopy import nearcopy_llama

    yield from shared_artifact(tmp_path_factory, "nearcopy-int4w", lambda d: nearcopy_llama(d, "int4w"))


@pytest.fixture
def tiny_llama() -> Path:
    return GOLDEN_HF / "tiny-llama"


@pytest.fixture
def tiny_qwen2() -> Path:
    return GOLDEN_HF / "tiny-qwen2"


# safetensors' own writer is the independent reference for test inputs.
_ST_SPEC_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                  "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                  "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "U32": "uint32"}


def st_write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict | None = None) -> None:
    """Write {name: (SAFETENSORS_DTYPE, shape, raw bytes)} with the safetensors library."""
    import numpy as np
    import safetensors

    keep = []
    specs = {}
    for name, (dtype, shape, data) in tensors.items():
        buf = np.frombuffer(bytes(data) or b"\0", dtype=np.uint8)
        keep.append(buf)
        specs[name] = safetensors.TensorSpec(dtype=_ST_SPEC_NAMES[dtype], shape=list(shape),
                                             data_ptr=buf.ctypes.data, data_len=len(data))
    safetensors.serialize_file(specs, str(path), metadata=metadata)
