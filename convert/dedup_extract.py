"""``ieconv dedup-extract``: stream groups into defaults, masks and exceptions.

Two passes per group, chunk by chunk:
  1. the default: the named member's bytes, or the byte-wise majority of
     one chunk of every member at a time (formats.dedup.majority);
  2. each member against the default: its mask and exceptions stream into
     their blobs while its bytes are hashed and checked against the tensor
     map's digest (a stale map fails here, before anything is committed).
Memory: the group's default (one tensor) plus one chunk per member during
pass 1, with chunks sized so that all members' chunks fit CHUNK_BUDGET;
never the model. Outputs are staged and renamed together, index last.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from iekit.formats.fileio import PreadFiles
from iekit.formats import dedup as fmt
from iekit.formats.atomic import StagedFiles, make_dirs, remove_dirs
from iekit.formats.errors import FormatError, IEError

CHUNK_BUDGET = 64 << 20
MIN_CHUNK = 64 << 10
MAX_CHUNK = 4 << 20


def chunk_size(members: int) -> int:
    """Bytes per member per step: a multiple of 512 (8 mask lines, whole
    bytes of line bits), so the pieces' encodings concatenate."""
    c = min(MAX_CHUNK, max(MIN_CHUNK, CHUNK_BUDGET // max(1, members)))
    return c // 512 * 512


class TensorReader(PreadFiles):
    """Tensor ranges by name: bytes [start, start + n) of the tensor."""

    def __init__(self, tmap: dict[str, fmt.TensorRange], real: dict[str, Path]):
        super().__init__()
        self.tmap, self.real = tmap, real

    def tensor(self, name: str, start: int, n: int) -> np.ndarray:
        return np.frombuffer(self.read(self.real[name], self.tmap[name].offset + start, n), np.uint8)


@dataclass
class ExtractResult:
    index_path: Path
    groups: int
    members: int
    original_bytes: int
    blob_bytes: dict[str, int]
    seconds: float

    @property
    def dedup_bytes(self) -> int:
        return sum(self.blob_bytes.values())


def output_names(stem: str) -> list[str]:
    return [stem + fmt.BLOB_SUFFIXES[k] for k in fmt.BLOB_KEYS] + [stem + fmt.INDEX_SUFFIX]


def write_groups(w: fmt.DedupWriter, reader: TensorReader, groups: list[fmt.GroupSpec], tm: fmt.TensorMap,
                 tensor_map_path: Path, progress: Callable[[int], None] | None = None) -> int:
    """Stream every group into ``w`` (the two passes of the module
    docstring); returns the original bytes of the grouped tensors. Each
    member's bytes must hash to the map's digest: a stale map fails here,
    before anything is committed."""
    tmap = tm.tensors
    original = 0
    for g in groups:
        n = tmap[g.members[0]].nbytes
        C = chunk_size(len(g.members))
        default = np.empty(n, np.uint8)
        for a in range(0, n, C):
            c = min(C, n - a)
            if g.default_member is not None:
                default[a:a + c] = reader.tensor(g.default_member, a, c)
            else:
                default[a:a + c] = fmt.majority(np.stack([reader.tensor(m, a, c) for m in g.members]))
        dentry = w.add_default(default[a:a + C] for a in range(0, n, C))
        entries = []
        for m in g.members:
            def encoded(m: str = m) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
                for a in range(0, n, C):
                    raw = reader.tensor(m, a, min(C, n - a))
                    yield *fmt.encode_lines(raw, default[a:a + raw.size]), raw
                    if progress:
                        progress(raw.size)
            e = w.add_member(m, tmap[m].shape, encoded())
            if e[tm.checksum] != tmap[m].digest:
                raise FormatError(tensor_map_path, f"tensors.{m}.{tm.checksum}",
                                  f"the bytes of {m!r} hash to {e[tm.checksum][:12]}… but the map "
                                  f"records {tmap[m].digest[:12]}… (stale map, or the model changed)")
            entries.append(e)
            original += n
        w.add_group(tmap[g.members[0]].dtype, n, dentry, g.default_member, entries)
    return original


def extract(model_dir: Path, tensor_map_path: Path, groups_path: Path, out_prefix: Path,
            overwrite: bool = False, progress: Callable[[int], None] | None = None) -> ExtractResult:
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise IEError(f"{model_dir}: not a directory")
    tm = fmt.load_tensor_map(tensor_map_path)
    tmap = tm.tensors
    groups = fmt.load_groups(groups_path, tmap)
    names = [m for g in groups for m in g.members]
    real = fmt.check_tensor_ranges(tmap, names, model_dir, tensor_map_path)
    out_prefix = Path(out_prefix)
    stem, out_dir = out_prefix.name, out_prefix.parent
    if not stem or stem in (".", ".."):
        raise IEError(f"{out_prefix}: --out-prefix must end in a file name stem (e.g. out/dedup_out/model)")
    created = make_dirs(out_dir)  # removed again if the run fails
    try:
        outs = [out_dir / n for n in output_names(stem)]
        clash = [p.name for p in outs if p.exists() or p.is_symlink()]
        if clash and not overwrite:
            raise IEError(f"{out_dir}: already holds {', '.join(clash)}; pass --overwrite to replace")
        sources = {Path(os.path.realpath(p)) for p in real.values()}
        for p in outs:
            if Path(os.path.realpath(p)) in sources:
                raise IEError(f"{p}: is a source of the tensors being extracted; choose another --out-prefix")

        reader = TensorReader(tmap, real)
        try:
            with StagedFiles(out_dir, replace=overwrite, exclusive=True) as staged:
                # The artifact's digests are the map's (the model's) algorithm.
                w = fmt.DedupWriter(staged, stem, checksum=tm.checksum)
                original = write_groups(w, reader, groups, tm, tensor_map_path, progress)
                meta = w.finish()
        finally:
            reader.close()
    except BaseException:
        remove_dirs(created)
        raise
    return ExtractResult(out_dir / (stem + fmt.INDEX_SUFFIX), len(groups), len(names), original,
                         {k: meta["blobs"][k]["nbytes"] for k in fmt.BLOB_KEYS}, time.perf_counter() - t0)
