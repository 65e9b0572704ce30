"""Shared fixtures: repository paths and the installed console scripts."""

from __future__ import annotations

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
