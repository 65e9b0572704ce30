"""``ieconv dedup-link``: put a dedup artifact where the runtime looks for it.

The runtime reads ``MODEL_DIR/model.dedup.json`` and resolves the blob names
it records against MODEL_DIR. Extraction usually writes into a subdirectory
(``MODEL_DIR/dedup_out/``), so this creates, in MODEL_DIR, relative symlinks
to the index (as ``model.dedup.json``) and to each blob under the name the
index records; blobs first, the index last, each link placed by an atomic
rename. Checked: the index validates, its members are tensors of the
model in MODEL_DIR (an artifact of another model, or a directory whose
model.ie.json is broken, was linked and reported OK), every target lies
inside MODEL_DIR, existing regular files and the IEBIN files are never
replaced (existing links are, or only with --overwrite for regular
files), and afterwards the index loads through the links and resolves to
the same files.
"""

from __future__ import annotations

import os
from pathlib import Path

from iekit.formats import dedup as fmt
from iekit.formats import iebin
from iekit.formats.atomic import clean_stale_temps, fsync_dir, new_tag, temp_name
from iekit.formats.errors import IEError
from iekit.formats.paths import resolve_inside

DEFAULT_SUBDIR = "dedup_out"


def find_index(model_dir: Path) -> Path:
    """The one ``*.dedup.json`` in an immediate subdirectory (dedup_out first)."""
    preferred = model_dir / DEFAULT_SUBDIR / fmt.INDEX_NAME
    if preferred.is_file():
        return preferred
    found = sorted(p for p in model_dir.glob("*/*" + fmt.INDEX_SUFFIX) if p.is_file())
    if len(found) != 1:
        raise IEError(f"{model_dir}: found {len(found)} *{fmt.INDEX_SUFFIX} files in its subdirectories"
                      f"{': ' + ', '.join(map(str, found)) if found else ''}; name one with --index")
    return found[0]


def _place_link(dest: Path, rel_target: str, overwrite: bool) -> None:
    if dest.exists() or dest.is_symlink():
        if dest.is_symlink():
            if os.readlink(dest) == rel_target:
                return
        elif not overwrite:
            raise IEError(f"{dest}: exists and is not a symlink; pass --overwrite to replace it with a link")
        elif dest.is_dir():
            raise IEError(f"{dest}: is a directory")
    tmp = dest.with_name(temp_name(dest.name, new_tag()))
    os.symlink(rel_target, tmp)
    try:
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def link(model_dir: Path, index: Path | None = None, overwrite: bool = False) -> list[tuple[Path, str]]:
    """Create the links; returns (link, relative target) pairs."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise IEError(f"{model_dir}: not a directory")
    index = Path(index) if index is not None else find_index(model_dir)
    root, real_index = os.path.realpath(model_dir), os.path.realpath(index)
    if os.path.commonpath([root, real_index]) != root:
        raise IEError(f"{index}: is outside {model_dir}; only an artifact inside the model directory can be linked")
    idx = fmt.load_index(index)
    model = iebin.load_model(model_dir)  # what the links serve: the artifact must be of this model
    fmt.cross_check(idx, model.tensors, model.meta_path, model.checksum)
    clean_stale_temps(model_dir)  # links of an interrupted run
    if Path(os.path.realpath(idx.dir)) == Path(os.path.realpath(model_dir)):
        raise IEError(f"{index}: is already in {model_dir}; nothing to link")
    plan: list[tuple[Path, Path]] = []
    for k in fmt.BLOB_KEYS:
        name = idx.meta["blobs"][k]["name"]
        if "/" in name:
            raise IEError(f"{index}: blobs.{k}.name {name!r} is not a plain file name; link it by hand")
        plan.append((model_dir / name, idx.dir / name))
    plan.append((model_dir / fmt.INDEX_NAME, Path(os.path.abspath(index))))
    protected = {iebin.META_NAME, iebin.BIN_NAME}
    out = []
    for dest, target in plan:
        if dest.name in protected:
            raise IEError(f"{dest}: refusing to replace an IEBIN file with a dedup link")
        rel = os.path.relpath(os.path.abspath(target), os.path.abspath(dest.parent))
        resolve_inside(model_dir, os.path.relpath(os.path.abspath(target), os.path.abspath(model_dir)), index, "(link target)")
        out.append((dest, rel))
    for dest, rel in out:
        _place_link(dest, rel, overwrite)
    fsync_dir(model_dir)
    linked = fmt.load_index(model_dir)
    for k in fmt.BLOB_KEYS:
        if os.path.realpath(linked.blob_path(k)) != os.path.realpath(idx.blob_path(k)):
            raise IEError(f"{linked.blob_path(k)}: link does not resolve to {idx.blob_path(k)}")
    return out
