"""A llama.cpp GGUF file wherever ierun takes ``--model-dir``.

Chosen: import once into a cache keyed by the file's digest, rather than
reading its tensors in place. The decoder reads IEBIN: Hugging Face names,
q/k rows in HF order, gpt-oss's gate/up rows interleaved, a tokenizer.json;
a Llama-family GGUF has its q/k rows interleaved for llama.cpp's RoPE and
its vocabulary as key-values, so reading it in place would need a second
loader, tokenizer builder and RoPE layout in the runtime, all to be kept
equal to the importer's. The importer (``ieconv gguf-to-iebin``: the same
checks, the same bytes, blocks kept) already makes that artifact, and
copying is cheap (SmolLM2's 94 MB in ~0.6 s); the second run finds it by
digest (XXH3-128 of the whole file, ~20 GB/s) and starts as fast as from
a directory. A changed file has another digest, hence another import.

The import runs as ``ieconv gguf-to-iebin`` in a child process, since the
runtime never imports the converter (tests/test_layers.py); its one error
line becomes ierun's. Two ierun processes importing the same file at once
each import into their own temporary directory; the first rename wins and
the other uses it. A multimodal file (Ollama's blobs of Gemma 3, Mistral
Small 3.x, Llama 4 hold the vision tower beside the language model) is
imported ``--text-only``: ierun runs the language model alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from iekit.formats import checksums
from iekit.formats.errors import IEError
from iekit.formats.fileio import check_regular
from iekit.formats.gguf_file import is_gguf_file, shard_paths

from .env import ie_gguf_cache

DIGEST = "xxh3_128"


def imported(path: Path, env: dict[str, str] | None = None, say=None) -> Path:
    """The IEBIN directory of the GGUF file ``path``, importing it on first use."""
    env = dict(os.environ) if env is None else env
    root = Path(ie_gguf_cache(env))
    paths = shard_paths(path)
    digest = _digest(paths)
    final = root / digest
    if (final / "model.ie.json").is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise IEError(f"{root}: cannot create the GGUF cache ({e.strerror}); set IE_GGUF_CACHE") from None
    tmp = root / f".{digest}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # (--text-only: ierun runs the language model alone, so a multimodal blob's vision tower is not needed)
    argv = [sys.executable, "-c", "from iekit.convert.entry import main; main()", "gguf-to-iebin",
            "--gguf", os.fspath(path), "--out-dir", os.fspath(tmp), "-q", "--text-only"]
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        msg = lines[-1].removeprefix("error: ") if lines else f"ieconv gguf-to-iebin exited {res.returncode}"
        if res.returncode == 130:
            raise KeyboardInterrupt
        raise IEError(msg.replace(os.fspath(tmp), "(the cache)"))
    try:
        os.rename(tmp, final)
    except OSError:  # another process imported it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / "model.ie.json").is_file():
            raise IEError(f"{final}: the GGUF cache holds something else here; remove it") from None
    if say is not None:
        files = "the file's" if len(paths) == 1 else f"its {len(paths)} files'"
        say(f"imported {path} once into {final} (ierun reuses it while {files} {DIGEST} digest is the same)")
    return final


def _digest(paths: list[Path]) -> str:
    """The file's digest; a split model's (gguf-split's NAME-00001-of-0000N.gguf) over every file's, so that
    a changed shard is a new import too."""
    # check_regular: a shard missing (or not a file) is one line naming it
    digests = [checksums.digest_file_range(p, 0, check_regular(p).st_size, DIGEST) for p in paths]
    if len(digests) == 1:
        return digests[0]
    return checksums.digest(DIGEST, "\n".join(digests).encode())


def model_dir_flag(help: str, required: bool = True) -> Any:
    """ierun's ``-m/--model-dir`` (``-m`` as llama.cpp's tools spell it): a directory or a GGUF file."""
    import click

    return click.option("-m", "--model-dir", required=required, callback=model_dir_option,
                        type=click.Path(path_type=Path), help=help)


def model_dir_option(ctx: Any, param: Any, value: Any) -> Any:
    """click callback of every ``--model-dir``: a GGUF file becomes its imported directory."""
    if value is None or not is_gguf_file(value):
        return value
    from iekit.cli.support import stderr_console

    return imported(Path(value), say=lambda m: stderr_console().print(m, markup=False))
