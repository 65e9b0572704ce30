"""A Hugging Face checkpoint directory: config.json and its safetensors shards.

``from_dir`` finds the shards (``model.safetensors``, or sharded files
listed by ``model.safetensors.index.json``) and ``collect_tensors`` opens
them, checking the index against the shards' own headers. Only safetensors
weights are read. The converter reads its input through here (a hub repo id
is resolved to a directory by convert/hf_hub.py); ``ierun verify int4
--hf-dir`` reads the source weights the same way.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import FormatError, IEError
from .jsonio import load_json
from .paths import resolve_inside
from .safetensors_reader import SafetensorsFile, SafetensorsTensor

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass
class HFSource:
    dir: Path
    kind: str  # "hf_dir" | "hf_hub"
    name: str  # directory name, or the repo id
    revision: str | None
    config: dict[str, Any]
    shards: list[str]  # file names relative to dir, sorted
    index: dict[str, str] | None  # tensor name -> shard, when sharded


def _discover(d: Path) -> tuple[list[str], dict[str, str] | None]:
    index_path = d / INDEX_NAME
    if index_path.is_file():
        idx = load_json(index_path)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise FormatError(index_path, "weight_map", "missing, empty or not an object")
        for name, shard in wm.items():
            resolve_inside(d, shard, index_path, f"weight_map[{name!r}]")
            if not (d / shard).is_file():
                raise FormatError(index_path, f"weight_map[{name!r}]", f"shard {shard!r} does not exist in {d}")
        return sorted(set(wm.values())), dict(wm)
    if (d / SINGLE_NAME).is_file():
        return [SINGLE_NAME], None
    present = sorted(p.name for p in d.glob("*.safetensors"))
    if present:
        raise IEError(f"{d}: found {', '.join(present[:3])}{'…' if len(present) > 3 else ''} but neither "
                      f"{SINGLE_NAME} nor {INDEX_NAME}; a sharded checkpoint needs its index")
    if any(d.glob("*.bin")) or any(d.glob("*.pt")):
        raise IEError(f"{d}: only PyTorch pickle weights (.bin/.pt) found; iekit reads safetensors only")
    raise IEError(f"{d}: no {SINGLE_NAME} or {INDEX_NAME} found")


def from_dir(path: str | os.PathLike, *, kind: str = "hf_dir", name: str | None = None,
             revision: str | None = None) -> HFSource:
    d = Path(path)
    if not d.is_dir():
        raise IEError(f"{d}: not a directory")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise IEError(f"{d}: no config.json (is this a Hugging Face model directory?)")
    config = load_json(cfg_path)
    if not isinstance(config, dict):
        raise FormatError(cfg_path, "(root)", "must be a JSON object")
    shards, index = _discover(d)
    return HFSource(d, kind, name or d.resolve().name, revision, config, shards, index)


def collect_tensors(src: HFSource, stack: ExitStack) -> dict[str, tuple[SafetensorsFile, SafetensorsTensor]]:
    """Open every shard (closed with ``stack``) and map tensor name -> (file, tensor),
    checking the index against the shards' own headers."""
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
    return found
