"""The frame every converter writes through: what an artifact directory
holds, what a run may do to it, and the staged writer's setup and teardown.

hf-to-iebin, gguf-to-iebin and gptq write an IEBIN directory; rotate and
gguf-to-hf an HF checkpoint directory (``HF_FILES``, ``checkpoint_out``);
iebin-to-gguf writes one file. All are checked before any work (a long run
must not fail at its end on a name), staged under temporary names and renamed at
commit (formats/atomic.py), and leave nothing behind when they fail.

The output directory's files: without ``overwrite`` nothing already there
that an artifact consists of (``ARTIFACT_FILES``) is touched: the run is
refused, naming the file. With ``overwrite`` the artifact is replaced as a
whole: the files the run writes replace their namesakes, and the other
``ARTIFACT_FILES`` (a previous model's vocab.txt, its dedup links...) are
removed at commit time and reported; any other file is left alone.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from iekit.formats import iebin, weight_types
from iekit.formats import dedup as dedup_fmt
from iekit.formats.atomic import StagedFiles, check_new_file, make_dirs, refuse_non_regular, remove_dirs
from iekit.formats.errors import IEError
from iekit.formats.hf_checkpoint import SINGLE_NAME
from iekit.formats.quant import QuantError

# The config and tokenizer files a converter writes next to the weights.
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")  # (transformers >= 4.50 saves the chat template there)
# Every file name an IEBIN artifact directory may hold that iekit writes
# (the converters) or links there (dedup-link): what --overwrite replaces as a whole.
ARTIFACT_FILES = (iebin.META_NAME, iebin.BIN_NAME, *CONFIG_FILES, *TOKENIZER_FILES, dedup_fmt.INDEX_NAME,
                  *("model" + dedup_fmt.BLOB_SUFFIXES[k] for k in dedup_fmt.BLOB_KEYS))
# What ieconv rotate and gguf-to-hf write: an HF checkpoint in one shard.
HF_FILES = (SINGLE_NAME, *CONFIG_FILES, *TOKENIZER_FILES)
CAST_TARGETS = weight_types.names(quantized=False)  # --dtype: the float weight types


@dataclass
class ConvertResult:
    out_dir: Path
    tensors: int
    bytes_in: int
    bytes_out: int
    seconds: float
    cast_tensors: int
    quantized_tensors: int = 0
    warnings: list[str] | None = None
    removed: list[str] | None = None  # files of a previous artifact removed (--overwrite)
    kept_blocks: int = 0  # gguf-to-iebin: quantized tensors whose blocks were copied as they are
    weighted_tensors: int = 0  # quantized with importance weights (--imatrix)
    errors: dict[str, QuantError] = field(default_factory=dict)  # per tensor quantized here: its predicted loss
    fp8_tensors: int = 0  # hf-to-iebin: FP8 weights read dequantized (formats/hf_fp8.py)
    read_as: str = ""  # gguf-to-iebin: how the file was read where not as llama.cpp's, whole (ollama_layout.Read)


@dataclass
class Progress:
    """Callbacks the CLI wires to a progress bar; no-ops by default."""

    start: Callable[[str, int], None] = lambda label, total: None
    advance: Callable[[int], None] = lambda n: None
    describe: Callable[[str], None] = lambda text: None


def natural_key(name: str) -> list:
    """'layers.10' sorts after 'layers.9': the order tensors are written in."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def check_dtype(dtype: str | None) -> None:
    """``--dtype``: None (keep) or one of the float weight types."""
    if dtype is not None and dtype not in CAST_TARGETS:
        raise IEError(f"--dtype {dtype!r}: expected one of {', '.join(CAST_TARGETS)}")


def check_out_dir(out_dir: Path, overwrite: bool, writes: list[str], src_dir: Path | None = None,
                  owned: tuple[str, ...] = ARTIFACT_FILES) -> list[str]:
    """Refuse what must not happen to ``out_dir`` (a source checkpoint
    directory ``src_dir`` is never one); returns the names of a previous
    artifact's files to remove (``overwrite`` only). ``owned``: the names
    an artifact of this kind consists of."""
    if out_dir.exists() and not out_dir.is_dir():
        raise IEError(f"{out_dir}: exists and is not a directory")
    if src_dir is not None and out_dir.is_dir() and os.path.realpath(out_dir) == os.path.realpath(src_dir):
        raise IEError(f"{out_dir}: output directory is the source directory (its checkpoint or model); choose another")
    if not out_dir.is_dir():
        return []
    present = [n for n in owned if os.path.lexists(out_dir / n)]
    for n in present:
        if (out_dir / n).is_dir() and not (out_dir / n).is_symlink():
            raise IEError(f"{out_dir / n}: is a directory where the artifact has a file; move it away")
        if n in writes or not (out_dir / n).is_symlink():  # a previous artifact's links may go, nothing else odd
            refuse_non_regular(out_dir / n)
    if not overwrite:
        for n in sorted(present, key=lambda n: n not in writes):
            if n in writes:
                raise IEError(f"{out_dir / n}: exists; pass --overwrite to replace it")
            raise IEError(f"{out_dir / n}: exists and is not a file of the new artifact (another model's?); "
                          "pass --overwrite to remove it, or choose an empty --out-dir")
    return [n for n in present if n not in writes]


class ArtifactOut:
    """An IEBIN directory a converter is about to write (or, with ``weights``
    and ``owned`` given, another kind: rotate's HF checkpoint, ``HF_FILES``):
    checked when made (``check_out_dir``: before the conversion's work),
    written inside ``writing()``. ``aux``: the files written beside the
    ``weights`` (config, tokenizer, dedup store), by name; ``stale``: a previous artifact's files the commit
    removes (``overwrite`` only), for the result to report."""

    def __init__(self, out_dir: str | os.PathLike, overwrite: bool, aux: list[str], src_dir: Path | None = None,
                 weights: tuple[str, ...] = (iebin.META_NAME, iebin.BIN_NAME), owned: tuple[str, ...] = ARTIFACT_FILES):
        self.dir = Path(out_dir)
        self.overwrite = overwrite
        self.tokenizer_files = [n for n in aux if n in TOKENIZER_FILES]  # what model.ie.json lists as the tokenizer
        self.stale = check_out_dir(self.dir, overwrite, [*weights, *aux], src_dir, owned)

    @contextmanager
    def writing(self) -> Iterator[StagedFiles]:
        """The directory made (``mkdir -p``) and staged into under an
        exclusive lock (writers: iebin.IebinWriter, dedup.DedupWriter); on
        leaving: committed (the stale files removed with it), or, on any
        error, nothing left behind, directories this run created included."""
        created = make_dirs(self.dir)
        try:
            with StagedFiles(self.dir, replace=self.overwrite, exclusive=True) as staged:
                for n in self.stale:
                    staged.remove_on_commit(n)
                yield staged
        except BaseException:
            remove_dirs(created)
            raise


def checkpoint_out(out_dir: str | os.PathLike, overwrite: bool, aux: list[str],
                   src_dir: Path | None = None) -> ArtifactOut:
    """The directory an HF checkpoint is about to be written into
    (model.safetensors and ``aux``: rotate, gguf-to-hf): ArtifactOut's
    rules, and no other checkpoint's shards or index beside it, which a
    reader would take instead of, or beside, the new file."""
    out = ArtifactOut(out_dir, overwrite, aux, src_dir, weights=(SINGLE_NAME,), owned=HF_FILES)
    others = sorted(p.name for p in out.dir.iterdir() if p.name != SINGLE_NAME
                    and p.name.endswith((".safetensors", ".index.json"))) if out.dir.is_dir() else []
    if others:
        raise IEError(f"{out.dir / others[0]}: another checkpoint's weights are here; choose an empty --out-dir")
    return out


def check_out_file(out_path: Path, overwrite: bool, what: str) -> None:
    """A one-file output (``what``: "the .gguf file"): not a directory, not
    replaced without ``overwrite``, never anything but a regular file."""
    if out_path.is_dir():
        raise IEError(f"{out_path}: is a directory; give {what} to write")
    check_new_file(out_path, overwrite)
