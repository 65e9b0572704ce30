"""Builders shared by the dedup tests: IEBIN models from raw bytes, and dedup
artifacts written straight into a model directory (optionally with a
hand-chosen default, which the extractor itself never produces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from iekit.formats import checksums
from iekit.formats import dedup as fmt
from iekit.formats.atomic import StagedFiles
from iekit.formats.iebin import IebinWriter


def write_iebin(model_dir: Path, tensors: dict[str, tuple[str, list[int], bytes]],
                checksum: str = checksums.DEFAULT) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    with StagedFiles(model_dir) as staged:
        w = IebinWriter(staged, checksum=checksum)
        for name, (dtype, shape, data) in tensors.items():
            w.add_tensor(name, dtype, list(shape), [bytes(data)], len(data))
        w.finish(config={}, source={"kind": "hf_dir", "name": "test", "revision": None, "shards": []},
                 tokenizer_files=[], aux_files=[])
    return model_dir


def write_artifact(model_dir: Path, groups: list[dict], extra: dict[str, bytes] | None = None,
                   stem: str = "model") -> Path:
    """Model + artifact. Each group: {"members": {name: uint8 array}, optional
    "default": uint8 array (else the majority), optional "default_member"}.
    Tensors are u8 [n]; ``extra`` adds ungrouped u8 tensors."""
    tensors = {}
    for g in groups:
        for name, data in g["members"].items():
            tensors[name] = ("u8", [data.size], data.tobytes())
    for name, data in (extra or {}).items():
        tensors[name] = ("u8", [len(data)], bytes(data))
    write_iebin(model_dir, tensors)
    with StagedFiles(model_dir) as staged:
        w = fmt.DedupWriter(staged, stem)
        for g in groups:
            rows = list(g["members"].values())
            dm = g.get("default_member")
            default = g.get("default")
            if default is None:
                default = g["members"][dm] if dm else fmt.majority(np.stack(rows))
            d = w.add_default([default])
            entries = []
            for name, data in g["members"].items():
                entries.append(w.add_member(name, [data.size], [(*fmt.encode_lines(data, default), data)]))
            w.add_group("u8", rows[0].size, d, dm, entries)
        w.finish()
    return model_dir / (stem + fmt.INDEX_SUFFIX)


def near_copies(rng: np.random.Generator, k: int, n: int, frac: float) -> list[np.ndarray]:
    """``k`` copies of one random ``n``-byte tensor, each with ~``frac`` of its bytes replaced."""
    base = rng.integers(0, 256, n, dtype=np.uint8)
    out = []
    for _ in range(k):
        x = base.copy()
        idx = rng.choice(n, max(1, int(n * frac)), replace=False)
        x[idx] = rng.integers(0, 256, idx.size, dtype=np.uint8)
        out.append(x)
    return out
