"""golden/gguf/llamacpp/*.gguf: golden Hugging Face checkpoints as llama.cpp's
own converter (``convert_hf_to_gguf.py``, ``--outtype auto``) writes them.

The reference for both directions of the GGUF bridge on the files users
actually download (tests/test_llamacpp_converter.py): gguf-to-iebin of each
must be hf-to-iebin of its checkpoint, value for value, and iebin-to-gguf of
that checkpoint must write the same tensors, byte for byte. The converter is
the one llama-cpp-python 0.3.36 vendors (``make llamacpp`` unpacks it); it
needs torch and transformers, so this runs in the golden environment:

    .venv-golden/bin/pip install sentencepiece   # the converter imports it
    .venv-golden/bin/python golden/gguf/make_llamacpp_converted.py [NAME ...]   # all of MODELS by default

Four things are set for the toys, none of which touches a tensor:

- ``tokenizer.ggml.pre`` is ``gpt-2``: the converter names a split by
  hashing what a known real vocabulary makes of a test text, which a toy
  vocabulary cannot match; the toys' tokenizer is GPT-2's split;
- the tokenizer is loaded as ``PreTrainedTokenizerFast``: transformers 5's
  ``Qwen2Tokenizer`` adds an ``<|endoftext|>`` the toy vocabulary lacks, which
  the converter's vocabulary-size check refuses;
- gpt-oss's ``swiglu_limit`` is 7.0, llama.cpp's constant (the toy's 1.5,
  chosen so that the clamp binds, is what iebin-to-gguf refuses to export);
- Cohere 2's ``rotary_pct`` is 1.0, as Command R7B's config states it (the
  converter requires it; transformers 5's Cohere2Config has no such key).
"""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "llamacpp"
# golden/hf model -> config.json changes (see the docstring)
MODELS = {"tiny-qwen2": {}, "tiny-qwen3": {}, "tiny-mixtral": {}, "tiny-gpt-oss-mxfp4": {"swiglu_limit": 7.0},
          "tiny-phi3": {}, "tiny-gemma3": {}, "tiny-smollm3": {},
          "tiny-granite": {}, "tiny-olmo2": {},
          "tiny-olmo3": {}, "tiny-ministral3": {}, "tiny-exaone4": {}, "tiny-olmoe": {},
          "tiny-seed-oss": {}, "tiny-glm4": {},
          "tiny-cohere2": {"rotary_pct": 1.0}, "tiny-cohere": {}}


def source_dir(name: str, work: Path) -> Path:
    """The checkpoint the converter reads: golden/hf's, with MODELS' config changes."""
    src = ROOT / "golden/hf" / name
    if not MODELS[name]:
        return src
    dst = work / name
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(MODELS[name])
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def convert(llama_cpp: Path, src: Path, out: Path) -> None:
    """Run in a child: the converter's module state is per process."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import conversion.base as base
    import transformers

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    transformers.AutoTokenizer.from_pretrained = transformers.PreTrainedTokenizerFast.from_pretrained
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), str(src), "--outfile", str(out), "--outtype", "auto"]
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    if len(sys.argv) == 4 and Path(sys.argv[1]).is_dir():  # the child
        convert(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
        return
    llama_cpp = next((ROOT / "build/llamacpp-src").glob("llama_cpp_python-*/vendor/llama.cpp"))
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name in sys.argv[1:] or MODELS:
            out = OUT / f"{name}.gguf"
            subprocess.run([sys.executable, __file__, str(llama_cpp), str(source_dir(name, Path(d))), str(out)],
                           check=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
