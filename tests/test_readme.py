"""The README's quick start works as written: its marked blocks run, in the
layout `make demo` leaves (the GGUF and the texts in out/demo/), through
benchmarks/quickstart.py, the runner `make demo` uses too."""

from __future__ import annotations

import os

import quickstart
from conftest import BIN_DIR, REPO, needs_smollm2


def test_the_readme_marks_a_gguf_and_an_hf_quick_start():
    blocks = quickstart.blocks()
    assert len(blocks) == 2
    assert "--hf-dir" in blocks[0] and "--gguf" in blocks[1]
    assert ". .venv/bin/activate" in (REPO / "README.md").read_text()


@needs_smollm2
def test_the_quick_start_runs_as_written(tmp_path):
    import gguf

    quickstart.prepare(tmp_path)
    quickstart.run(tmp_path, BIN_DIR)
    q = tmp_path / "out" / "quickstart"
    reader = gguf.GGUFReader(str(q / "q.gguf"))  # llama.cpp's own reader takes the export
    assert len(reader.tensors) == 272
    assert os.path.getsize(q / "q" / "model.ie.bin") < 0.3 * os.path.getsize(q / "ref" / "model.ie.bin")
