"""golden/gguf: a small GGUF file as llama.cpp writes one, and its import.

``tiny-llama.mixed.gguf`` is golden/hf/tiny-llama written by
tests/gguf_build.py (the ``gguf`` package's writer, llama.cpp's names and q/k
interleaving) with a mix of ggml types: attention Q8_0 but o_proj MXFP4 (no
iekit type: dequantized on import), gate/up Q4_0 and Q4_1, down Q5_1, the
output head F16, norms F32, the embedding Q8_0. ``tiny-llama-mixed/`` is what
``ieconv gguf-to-iebin`` makes of it; tests/test_gguf_import.py checks that
an import still gives exactly these bytes, and the fuzz target starts from
the file.

    .venv/bin/python golden/gguf/make_golden_gguf.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))

from gguf_build import gguf_from_hf  # noqa: E402

QUANT = {r"o_proj": "MXFP4", r"self_attn": "Q8_0", r"gate_proj": "Q4_0", r"up_proj": "Q4_1", r"down_proj": "Q5_1",
         r"embed_tokens": "Q8_0", r"lm_head": "F16"}


def main() -> None:
    gguf = gguf_from_hf(HERE.parent / "hf" / "tiny-llama", HERE / "tiny-llama.mixed.gguf", quant=QUANT)
    out = HERE / "tiny-llama-mixed"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([str(Path(sys.executable).parent / "ieconv"), "gguf-to-iebin", "--gguf", str(gguf),
                    "--out-dir", str(out), "-q"], check=True)
    print(f"{gguf.name}: {gguf.stat().st_size} bytes; {out.name}/ written")


if __name__ == "__main__":
    main()
