"""Rules for file names that artifacts use to point at other files.

An artifact is a directory; its JSON may name backing files only *inside*
that directory. Anything else (absolute paths, ``..``, a symlink that leads
out) would let a downloaded model read arbitrary files, so it is rejected.
The same rule holds for every file read from a model or checkpoint
directory by its fixed name (config.json, tokenizer files, model.ie.json,
model.dedup.json): ``check_inside``.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from .errors import FormatError


def check_relpath(rel: object, file: str | os.PathLike, field: str) -> PurePosixPath:
    """The rules that need no file system: relative, no '..', no backslash."""
    if not isinstance(rel, str) or not rel:
        raise FormatError(file, field, f"must be a non-empty relative path string, got {rel!r}")
    if "\\" in rel or "\0" in rel:
        raise FormatError(file, field, f"{rel!r}: backslashes and NUL are not allowed in paths")
    p = PurePosixPath(rel)
    if p.is_absolute():
        raise FormatError(file, field, f"{rel!r} is absolute; paths must be relative to the model directory")
    if ".." in p.parts:
        raise FormatError(file, field, f"{rel!r} contains '..' and would escape the model directory")
    return p


def resolve_inside(model_dir: Path, rel: object, file: str | os.PathLike, field: str,
                   root: str | os.PathLike | None = None) -> Path:
    """Resolve ``rel`` against ``model_dir`` (symlinks included) or raise a
    FormatError. The result must lie inside ``root`` (default: ``model_dir``;
    a hub snapshot's files link into its repo's cache folder)."""
    p = check_relpath(rel, file, field)
    root = Path(os.path.realpath(model_dir if root is None else root))
    target = Path(os.path.realpath(Path(model_dir) / p))
    if os.path.commonpath([root, target]) != str(root):
        raise FormatError(file, field, f"{rel!r} resolves outside the model directory (symlink to {target})")
    return target


def real_path(path: str | os.PathLike) -> Path:
    """``Path(path).resolve()`` without its RuntimeError on a loop of
    symlinks (Python before 3.13 raises one; an internal error, exit 3): the
    loop is left in the path, and the open that follows fails with ELOOP,
    which every command reports as one line naming the path."""
    return Path(os.path.realpath(path))


def check_inside(model_dir: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` (a file of ``model_dir``, e.g. ``model_dir/config.json``) must
    resolve inside ``model_dir`` (the rule ``resolve_inside`` applies to the
    names an artifact records); returns the resolved path. The error names
    ``path``."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(model_dir))
    return resolve_inside(Path(model_dir), Path(rel).as_posix(), path, "(file)")
