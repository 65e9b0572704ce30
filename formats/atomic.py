"""Writers never leave a half-written artifact.

Each output is written under a hidden temporary name in the destination
directory (same filesystem, so rename is atomic), fsynced, and renamed into
place only when everything succeeded. Multi-file artifacts commit their
"index" file last, so a reader never sees an index that points at missing
or stale payloads from this run.

A run killed outright (SIGKILL, power loss) cannot remove its temporary
files; they are named ``.NAME.PID.TAG.tmp`` so that the next writer into the
same directory recognises them and removes those whose process is gone
(``clean_stale_temps``; reported as a ``StaleTempWarning``, which the CLIs
print as one ``warning:`` line). Directories a run creates for its output
are removed again when it fails (``make_dirs`` / ``remove_dirs``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import re
import secrets
import stat
import warnings
from pathlib import Path
from typing import BinaryIO

from .errors import IEError
from .fileio import file_kind

# .NAME.PID.TAG.tmp, TAG = 8 lowercase hex digits (StagedFiles, dedup-link's symlinks)
TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]{1,10})\.(?P<tag>[0-9a-f]{8})\.tmp$")


class StaleTempWarning(UserWarning):
    """Temporary files of an interrupted run were removed."""


def temp_name(name: str, tag: str) -> str:
    """The hidden name ``name`` is staged under (``tag`` = ``PID.HEX8``)."""
    return f".{name}.{tag}.tmp"


def new_tag() -> str:
    return f"{os.getpid()}.{secrets.token_hex(4)}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but is not ours
    except (OverflowError, ValueError):
        return False  # a pid no process can have
    return True


def clean_stale_temps(directory: str | os.PathLike) -> list[tuple[Path, int]]:
    """Remove ``directory``'s temporary files (our naming only, plain files or
    symlinks) whose writing process no longer exists; a live writer's files
    are kept. Returns (path, bytes) of each removed file and warns once."""
    directory = Path(directory)
    removed: list[tuple[Path, int]] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = TEMP_NAME.match(e.name)
        if not m or _alive(int(m["pid"])):
            continue
        try:
            if not (e.is_symlink() or e.is_file(follow_symlinks=False)):
                continue
            size = e.stat(follow_symlinks=False).st_size if not e.is_symlink() else 0
            os.unlink(e.path)
        except OSError:
            continue
        removed.append((Path(e.path), size))
    if removed:
        total = sum(s for _, s in removed)
        names = ", ".join(p.name for p, _ in removed[:3]) + (", …" if len(removed) > 3 else "")
        warnings.warn(StaleTempWarning(
            f"{directory}: removed {len(removed)} temporary file{'s' if len(removed) > 1 else ''} "
            f"({total} bytes) left by an interrupted run: {names}"), stacklevel=2)
    return removed


def make_dirs(path: str | os.PathLike) -> list[Path]:
    """``mkdir -p path``; returns the directories this call created, outermost
    first, so that a failed run can remove them (``remove_dirs``)."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists() and not p.is_symlink():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
    except FileExistsError:
        if not path.is_dir():
            remove_dirs(created)
            raise IEError(f"{path}: exists and is not a directory") from None
    except BaseException:
        remove_dirs(created)
        raise
    return created


def remove_dirs(created: list[Path]) -> None:
    """Remove directories ``make_dirs`` created, innermost first, each only if empty."""
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def _sync_file_range():
    """libc's sync_file_range (Linux), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError, TypeError):  # no such call, or no C library to ask
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing ``[offset, offset + nbytes)`` of ``fd`` to disk now,
    without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; a
    no-op elsewhere). Why: a staged file is fsynced once, at commit, and
    below the kernel's background-writeback threshold nothing reaches the
    disk before that, so a conversion's disk writes all came after its work;
    started as each payload lands, they overlap it. A hint: errors are
    ignored (the commit's fsync reports any that matter)."""
    fn = _sync_file_range()
    if fn is not None and nbytes > 0:
        fn(fd, offset, nbytes, 2)  # SYNC_FILE_RANGE_WRITE


def _write_error(final: Path, e: OSError) -> IEError:
    """An OS error about one of our temporary names, told about the user's path."""
    if isinstance(e, FileNotFoundError) and not final.parent.is_dir():
        return IEError(f"{final}: cannot write: directory {final.parent} does not exist")
    return IEError(f"{final}: cannot write: {e.strerror or e}")


def refuse_non_regular(path: Path) -> None:
    """Refuse to write over ``path`` when it exists and is not a regular
    file (a symlink, FIFO, device node, socket or directory), whatever the
    user asked: replacing it would swap a device or a link for a plain file
    (as root, ``--overwrite`` onto /dev/full replaced the device)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise IEError(f"{path}: cannot inspect: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise IEError(f"{path}: exists and is not a regular file ({file_kind(st.st_mode)}); "
                      "refusing to replace it, even with --overwrite")


def lock_directory(directory: Path) -> int:
    """Take ``directory``'s exclusive writer lock (flock on the directory
    itself, so nothing is added to it) and return its descriptor; refused
    at once when another writer holds it. Why: two conversions into one
    new --out-dir both passed the up-front check and committed over each
    other, leaving one model's weights beside another's tokenizer. The
    lock is advisory (our writers take it); file systems without flock
    are written unlocked, the commit's no-replace rename still guarding."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise IEError(f"{directory}: cannot open the output directory: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise IEError(f"{directory}: another ieconv run is writing into this directory; "
                      "wait for it, or choose another output directory") from None
    except OSError:
        pass  # no flock here (some network file systems)
    return fd


def link_no_replace(tmp: Path, final: Path) -> None:
    """Put ``tmp`` in place as ``final`` only if ``final`` does not exist
    (atomically where the file system has hard links); FileExistsError otherwise."""
    try:
        os.link(tmp, final, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # no hard links here: check, then rename (not atomic against a racing writer)
        if final.exists() or final.is_symlink():
            raise FileExistsError(errno.EEXIST, "File exists", os.fspath(final)) from None
        os.replace(tmp, final)
        return
    os.unlink(tmp)


# What a write into a staged file fails with that no read does: such an error
# without a file name is reported as the staged file's (StagedFiles.__exit__).
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StagedFiles:
    """A set of files written under temporary names and committed together.

    Use as a context manager: on an exception (including KeyboardInterrupt)
    every staged file is removed and nothing in the directory changes.
    Creating one first removes stale temporary files of dead writers from
    ``directory`` (``clean_stale_temps``).

    ``replace=False``: committing refuses (FileExistsError naming the file,
    nothing left renamed) when a destination already exists, including one
    that appeared while the files were being written. ``replace=True`` still
    refuses a destination that is not a regular file (``refuse_non_regular``).
    ``exclusive=True``: the directory is one artifact, and this run its only
    writer (``lock_directory``) from construction to commit or abort.
    ``remove_on_commit(name)``
    removes ``directory/name`` at commit time, before anything is renamed:
    the files of a previous artifact that the new one does not write.
    """

    def __init__(self, directory: Path, *, replace: bool = True, exclusive: bool = False):
        self.directory = Path(directory)
        self.replace = replace
        self._staged: list[tuple[Path, Path, BinaryIO | None]] = []
        self._remove: list[Path] = []
        self._tag = new_tag()
        self._lock = lock_directory(self.directory) if exclusive else None
        clean_stale_temps(self.directory)

    def open(self, name: str) -> BinaryIO:
        """Open a staged binary file that will become ``directory/name``."""
        final = self.directory / name
        tmp = self.directory / temp_name(name, self._tag)
        try:
            f = open(tmp, "x+b")  # readable too: a writer may hash what it wrote (IebinWriter.add_copy)
        except OSError as e:
            raise _write_error(final, e) from None
        self._staged.append((tmp, final, f))
        return f

    def write_bytes(self, name: str, data: bytes) -> None:
        f = self.open(name)
        f.write(data)

    def remove_on_commit(self, name: str) -> None:
        self._remove.append(self.directory / name)

    def commit(self) -> None:
        """fsync every staged file, remove what ``remove_on_commit`` named,
        then rename the staged files in staging order."""
        for tmp, final, f in self._staged:
            if f is not None and not f.closed:
                try:
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                except OSError as e:
                    raise _write_error(final, e) from None
        for _tmp, final, _f in self._staged:
            if not self.replace and (final.exists() or final.is_symlink()):
                raise FileExistsError(errno.EEXIST, "exists; pass --overwrite to replace it", os.fspath(final))
            refuse_non_regular(final)
        for p in self._remove:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        placed: list[Path] = []
        for tmp, final, _f in self._staged:
            try:
                if self.replace:
                    os.replace(tmp, final)
                else:
                    link_no_replace(tmp, final)
                    placed.append(final)
            except OSError as e:
                # A writer racing outside the lock: take back what this commit placed, so
                # the directory never holds a mix of two runs' files.
                for p in placed:
                    p.unlink(missing_ok=True)
                if isinstance(e, FileExistsError):
                    raise FileExistsError(errno.EEXIST, "exists; pass --overwrite to replace it",
                                          os.fspath(final)) from None
                raise _write_error(final, e) from None
        fsync_dir(self.directory)
        self._staged.clear()
        self._remove.clear()
        self._unlock()

    def abort(self) -> None:
        """Remove every staged file. Closing one may fail (its buffer is
        flushed again on a full disk); the file is removed all the same."""
        for tmp, _final, f in self._staged:
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        self._staged.clear()
        self._remove.clear()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the last descriptor releases the flock
            self._lock = None

    def _writing(self) -> Path:
        """The file a failed write was most likely writing: the last opened."""
        return self._staged[-1][1] if self._staged else self.directory

    def __enter__(self) -> "StagedFiles":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            writing = self._writing()
            self.abort()
            if isinstance(exc, OSError) and exc.filename is None and exc.errno in _WRITE_ERRNOS:
                # A write into a staged file failed (a full disk, a quota, a file size limit):
                # told about the user's path, and said after the staged files are gone.
                raise _write_error(writing, exc) from None
            return
        if self._staged:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        self._unlock()


def check_new_file(path: str | os.PathLike, overwrite: bool) -> None:
    """Refuse, before any work is done, to write ``path`` over an existing
    file (a dangling symlink counts) without ``overwrite``, or into a folder
    that does not exist, or over anything but a regular file even with
    ``overwrite`` (``refuse_non_regular``). The commit re-checks
    (``write_file_atomic``'s ``replace``); this makes a long command fail
    at once, not at its end."""
    path = Path(path)
    refuse_non_regular(path)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise IEError(f"{path}: exists; pass --overwrite to replace it")
    if not path.parent.is_dir():
        raise IEError(f"{path}: cannot write: directory {path.parent} does not exist")


def write_file_atomic(path: Path, data: bytes, *, replace: bool = True) -> None:
    """Write one file atomically; ``replace=False`` refuses an existing file
    (FileExistsError naming ``path``) instead of replacing it."""
    path = Path(path)
    with StagedFiles(path.parent, replace=replace) as staged:
        staged.write_bytes(path.name, data)
