"""A Hugging Face checkpoint directory: config.json and its safetensors shards.

``from_dir`` finds the shards (``model.safetensors``, or sharded files
listed by ``model.safetensors.index.json``) and ``collect_tensors`` opens
them, checking the index against the shards' own headers. Only safetensors
weights are read. The converter reads its input through here (a hub repo id
is resolved to a directory by convert/hf_hub.py); ``ierun verify quant
--hf-dir`` reads the source weights the same way.

Every file read from the checkpoint (config.json, the index, the shards, the
config and tokenizer files the converter copies: ``read_aux``) must be a
regular file that resolves inside ``HFSource.root``: the directory itself,
or for a hub snapshot the repo's cache folder, whose ``blobs/`` the
snapshot's symlinks point into.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fused_tensors, hf_fp8
from .errors import FormatError, IEError
from .fileio import check_regular, read_small
from .jsonio import aux_json_check, load_json
from .paths import check_inside, resolve_inside
from .safetensors_reader import SafetensorsFile, SafetensorsTensor

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# A checkpoint's prefix read under the one transformers 5 loads it as (its conversion mapping's WeightRenaming), by
# architecture: NemotronH's checkpoints name their model backbone (and Mamba2's, whose module transformers still
# calls so: read as model. all the same, the names every layer part here has). Every tool here then sees those names;
# a checkpoint written again (gguf-to-hf) takes the Hub's (checkpoint_name), which llama.cpp's converter reads.
PREFIXES = {"NemotronHForCausalLM": ("backbone.", "model."), "Mamba2ForCausalLM": ("backbone.", "model."),
            "MambaForCausalLM": ("backbone.", "model."), "FalconMambaForCausalLM": ("backbone.", "model.")}


def _prefix(config: Any) -> tuple[str, str] | None:
    archs = config.get("architectures") if isinstance(config, dict) else None
    return next((PREFIXES[a] for a in archs if a in PREFIXES), None) if isinstance(archs, list) else None


def checkpoint_name(config: Any, name: str) -> str:
    """A tensor name as the architecture's checkpoints on the Hub spell it (PREFIXES)."""
    pre = _prefix(config)
    return pre[0] + name[len(pre[1]):] if pre is not None and name.startswith(pre[1]) else name


@dataclass
class HFSource:
    dir: Path
    kind: str  # "hf_dir" | "hf_hub"
    name: str  # directory name, or the repo id
    revision: str | None
    config: dict[str, Any]
    shards: list[str]  # file names relative to dir, sorted
    index: dict[str, str] | None  # tensor name -> shard, when sharded
    root: Path | None = None  # files must resolve inside it (default: dir)

    @property
    def containment_root(self) -> Path:
        return self.root if self.root is not None else self.dir


def _present(p: Path) -> bool:
    """There is something at ``p`` (a dangling symlink counts: it is an error to read, not an absence)."""
    return os.path.lexists(p)


def _discover(d: Path, root: Path) -> tuple[list[str], dict[str, str] | None]:
    index_path = d / INDEX_NAME
    if _present(index_path):
        idx = load_json(index_path, inside=root)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise FormatError(index_path, "weight_map", "missing, empty or not an object")
        for name, shard in wm.items():
            resolve_inside(d, shard, index_path, f"weight_map[{name!r}]", root=root)
            if not _present(d / shard):
                raise FormatError(index_path, f"weight_map[{name!r}]", f"shard {shard!r} does not exist in {d}")
            check_regular(d / shard)
        return sorted(set(wm.values())), dict(wm)
    if _present(d / SINGLE_NAME):
        check_inside(root, d / SINGLE_NAME)
        check_regular(d / SINGLE_NAME)
        return [SINGLE_NAME], None
    present = sorted(p.name for p in d.glob("*.safetensors"))
    if present:
        raise IEError(f"{d}: found {', '.join(present[:3])}{'…' if len(present) > 3 else ''} but neither "
                      f"{SINGLE_NAME} nor {INDEX_NAME}; a sharded checkpoint needs its index")
    if any(d.glob("*.bin")) or any(d.glob("*.pt")):
        raise IEError(f"{d}: only PyTorch pickle weights (.bin/.pt) found; iekit reads safetensors only")
    raise IEError(f"{d}: no {SINGLE_NAME} or {INDEX_NAME} found")


def from_dir(path: str | os.PathLike, *, kind: str = "hf_dir", name: str | None = None,
             revision: str | None = None, root: str | os.PathLike | None = None) -> HFSource:
    """The checkpoint in directory ``path``; ``root`` (default ``path``) is
    the directory every file read must resolve inside."""
    d = Path(path)
    if not d.is_dir():
        raise IEError(f"{d}: not a directory")
    r = Path(root) if root is not None else d
    cfg_path = d / "config.json"
    if not _present(cfg_path):
        raise IEError(f"{d}: no config.json (is this a Hugging Face model directory?)")
    config = load_json(cfg_path, inside=r)
    if not isinstance(config, dict):
        raise FormatError(cfg_path, "(root)", "must be a JSON object")
    shards, index = _discover(d, r)
    return HFSource(d, kind, name or d.resolve().name, revision, config, shards, index, r if root is not None else None)


def read_aux(src: HFSource, name: str) -> bytes | None:
    """The bytes of the checkpoint's file ``name`` (config or tokenizer file),
    or None when there is none; a file that is not regular, too large, or
    resolves outside the checkpoint is a FormatError, and so is a ``.json``
    one that is not a JSON object (``aux_json_check``)."""
    p = src.dir / name
    if not _present(p):
        return None
    check_inside(src.containment_root, p)
    data = read_small(p)
    aux_json_check(data, p)
    return data



def collect_tensors(src: HFSource, stack: ExitStack) -> dict[str, tuple[SafetensorsFile, SafetensorsTensor]]:
    """Open every shard (closed with ``stack``) and map tensor name -> (file, tensor),
    checking the index against the shards' own headers; FP8 weights are
    listed as the float matrices they stand for (hf_fp8.py), Phi-3's fused
    matrices as the matrices they hold (fused_tensors.py)."""
    found: dict[str, tuple[SafetensorsFile, SafetensorsTensor]] = {}
    index_path = src.dir / INDEX_NAME
    for shard in src.shards:
        sf = stack.enter_context(SafetensorsFile(src.dir / shard))
        for name, t in sf.tensors.items():
            if name in found:
                raise IEError(f"{src.dir}: duplicate tensor {name!r} in {found[name][0].path.name} and {shard}")
            if src.index is not None and src.index.get(name) != shard:
                where = f"lists it in {src.index[name]!r}" if name in src.index else "does not list it"
                raise FormatError(index_path, f"weight_map[{name!r}]", f"tensor is in {shard} but the index {where}")
            found[name] = (sf, t)
    if src.index is not None:
        for name, shard in src.index.items():
            if name not in found:
                raise FormatError(index_path, f"weight_map[{name!r}]", f"names shard {shard!r} but that shard has no such tensor")
    pre = _prefix(src.config)
    if pre is not None:
        renamed = {pre[1] + n[len(pre[0]):] if n.startswith(pre[0]) else n: v for n, v in found.items()}
        if len(renamed) != len(found):
            twice = next(n for n in found if n.startswith(pre[1]) and pre[0] + n[len(pre[1]):] in found)
            raise IEError(f"{src.dir}: tensor {twice!r} is stored under both {pre[0]!r} and {pre[1]!r}")
        found = renamed
    return fused_tensors.split(src.config, hf_fp8.read_as_floats(src.config, found, str(src.dir)), str(src.dir))
