"""``ieconv dedup-pack``: a model directory whose grouped tensors live only
in the dedup store.

``dedup-extract`` writes the store beside an unchanged model, so the model
directory only grows. Packing writes a new directory instead: the store
(model.dedup.json + defaults / masks / exceptions) and an IEBIN model whose
``model.ie.bin`` holds only the ungrouped tensors; each grouped tensor's
entry keeps its name, dtype, shape, nbytes, digest and quant object and says
``"store": "dedup"`` in place of a file range (docs/formats/iebin.md).
Ungrouped payloads are copied in the kernel (fileio.copy_range) and
re-hashed as written; grouped ones stream through the extractor, which
checks every member's digest. Everything is staged and committed together;
a directory that already holds any of the files is refused without
``--overwrite``, and the source model is never written to.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.tensor_entries import expert_of
from iekit.formats.atomic import StagedFiles
from iekit.formats.errors import FormatError, IEError
from iekit.formats.fileio import copy_range, read_small

from .artifact_out import ArtifactOut
from .dedup_extract import TensorReader, output_names, write_groups

STEM = "model"  # the store's files are model.dedup.json etc., where the runtime looks
ENTRY_KEYS_KEPT = (iebin.QUANT_KEY, iebin.ERROR_KEY)


@dataclass
class PackResult:
    out_dir: Path
    groups: int
    members: int
    plain_bytes: int   # the source directory's files this artifact replaces (model.ie.bin + aux + json)
    packed_bytes: int  # the same files of the packed directory, store included
    store_bytes: int
    seconds: float


def dir_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def pack(model_dir: Path, out_dir: Path, tm: fmt.TensorMap, groups: list[fmt.GroupSpec], tensor_map_label: Path,
         overwrite: bool = False, progress: Callable[[int], None] | None = None) -> PackResult:
    """Write the packed model of ``model_dir`` to ``out_dir`` (groups from
    the plan ``tm`` + ``groups``, validated against the model first)."""
    t0 = time.perf_counter()
    model = iebin.load_model(model_dir)
    if model.in_store:
        raise IEError(f"{model.meta_path}: already packed ({len(model.in_store)} tensors live in the dedup store)")
    if not groups:
        raise IEError(f"{model.dir}: no group to pack: nothing written (dedup-plan found no group that pays, "
                      "so the plain model is already the smallest)")
    if tm.checksum != model.checksum:
        raise FormatError(tensor_map_label, "checksum", f"{tm.checksum!r}, but {model.meta_path.name} records "
                          f"{model.checksum!r} (the map is of another conversion of the model)")
    by_name = {t["name"]: t for t in model.tensors}
    for g in groups:
        for m in g.members:
            t, r = by_name.get(m), tm.tensors[m]
            if t is None and expert_of(m) and expert_of(m)[0] in by_name:
                raise FormatError(tensor_map_label, f"tensors.{m}", f"{m!r} is one expert of a stack; a packed "
                                  "model stores whole tensors (plan with `dedup-plan --whole-stacks`, or serve expert "
                                  "groups with dedup-extract + dedup-link + IE_DEDUP=1)")
            if t is None or (t["file"], t["file_data_offset"], t["nbytes"], t[model.checksum]) != \
                    (r.file, r.offset, r.nbytes, r.digest):
                raise FormatError(tensor_map_label, f"tensors.{m}", f"{m!r} is not where {model.meta_path} "
                                  "puts it, or has another digest (a map of another model; run dedup-plan again)")
    aux = [*(a["name"] for a in model.meta["aux_files"]), *output_names(STEM)]
    out = ArtifactOut(out_dir, overwrite, aux, src_dir=model.dir)
    out_dir, names = out.dir, [iebin.META_NAME, iebin.BIN_NAME, *aux]
    grouped = {m for g in groups for m in g.members}
    real = fmt.check_tensor_ranges(tm.tensors, sorted(grouped), model.dir, tensor_map_label)
    reader = TensorReader(tm.tensors, real)
    try:
        with out.writing() as staged:
            dw = fmt.DedupWriter(staged, STEM, checksum=tm.checksum)
            write_groups(dw, reader, groups, tm, tensor_map_label, progress)
            dmeta = dw.finish()
            _write_model(staged, model, grouped, progress)
    finally:
        reader.close()
    src = [model.meta_path, *(model.dir / f["name"] for f in model.meta["files"]),
           *(model.dir / a["name"] for a in model.meta["aux_files"])]
    store = sum(dmeta["blobs"][k]["nbytes"] for k in fmt.BLOB_KEYS) + (out_dir / fmt.INDEX_NAME).stat().st_size
    return PackResult(out_dir, len(groups), len(grouped), dir_bytes(src), dir_bytes([out_dir / n for n in names]),
                      store, time.perf_counter() - t0)


def _write_model(staged: StagedFiles, model: iebin.IebinModel, grouped: set[str],
                 progress: Callable[[int], None] | None) -> None:
    """The packed model.ie.json + model.ie.bin: grouped tensors' entries point
    at the store, the others' payloads are copied from the source."""
    meta = model.meta
    w = iebin.IebinWriter(staged, alignment=meta["alignment"], checksum=model.checksum)
    fds: dict[Path, int] = {}
    try:
        for t in model.tensors:
            if t["name"] in grouped:
                w.add_in_store(t)
                continue
            path = model.path_of(t)
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

            def copy(fd: int, off: int, t=t, src=fds[path]) -> None:
                if copy_range(src, t["file_data_offset"], fd, off, t["nbytes"], progress) != t["nbytes"]:
                    raise FormatError(model.meta_path, t["name"], f"{t['file']} ended inside the tensor (changed while packing?)")

            w.add_copy(t["name"], t["dtype"], t["shape"], t["nbytes"], copy,
                       extra={k: t[k] for k in ENTRY_KEYS_KEPT if k in t})
    finally:
        for fd in fds.values():
            os.close(fd)
    aux = w.stage_aux({a["name"]: read_small(model.dir / a["name"]) for a in meta["aux_files"]})
    out = w.finish(config=meta["config"], source=meta["source"], tokenizer_files=meta["tokenizer"]["files"],
                   aux_files=aux, model=meta["model"])
    for old, new in zip(model.tensors, out["tensors"]):
        if old[model.checksum] != new[model.checksum]:
            raise FormatError(model.meta_path, f"tensors.{old['name']}", "the copied bytes hash differently from "
                              "the recorded digest (the model changed while packing?)")
