"""Reading artifact files: regular files only, bounded sizes, one end-of-file rule.

``read_small`` is the one way a whole small file (every JSON file, tokenizer
and config files) is read: the path must be a regular file (checked before
opening, and again on the descriptor, which is opened non-blocking so that a
FIFO cannot block the open), and it may hold at most ``max_bytes``
(``SMALL_FILE_MAX``, 100 MiB, unless the caller names another cap), so a FIFO
never hangs a loader and a link to /dev/zero never reads until memory runs
out. ``check_regular`` is the same file-type rule for large files that are
opened by path elsewhere (model.ie.bin, blobs, .bsr files).

Three shapes of ranged access, each written once: a range streamed front to
back in bounded chunks (hashing, comparing, compressing a tensor without
holding it; ``pread_views`` is the same through one reused buffer, for a
consumer that keeps nothing, such as a hash), scattered preads through one descriptor per file (sampling
and extracting many tensors of the same files), and a range copied from one
descriptor to another (``copy_range``: the bytes a conversion keeps). A file
shorter than the range asked for is a FormatError naming the file, never a
short read passed on.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .errors import FormatError

READ_CHUNK = 8 * 1024 * 1024
COPY_CHUNK = 64 * 1024 * 1024  # per copy_file_range call: progress and Ctrl-C stay responsive
# copy_file_range refuses these pairs of files (another filesystem, a kernel
# or filesystem without it, special files): copy_range then reads and writes.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}
SMALL_FILE_MAX = 100 * 1024 * 1024  # JSON, config and tokenizer files (safetensors caps its header alike)

_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is ("a FIFO (named pipe)", "a symlink", ...), for messages."""
    return next((k for test, k in _KINDS if test(mode)), "not a plain file")


def _not_regular(path: str | os.PathLike, mode: int) -> FormatError:
    return FormatError(path, "(file)", f"is {file_kind(mode)}, expected a regular file")


def check_regular(path: str | os.PathLike) -> os.stat_result:
    """stat ``path`` (following links): a regular file, or a FormatError
    ("no such file", "is a FIFO ...")."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FormatError(path, "(file)", "no such file" + (" (broken symlink)" if os.path.islink(path) else "")) from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    return st


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def utf8(data: bytes, path: str | os.PathLike) -> str:
    """``data``, read from ``path``, as text; or one error naming the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(path, "(file)", f"not valid UTF-8 at byte {e.start}") from None


def read_small_text(path: str | os.PathLike, max_bytes: int = SMALL_FILE_MAX) -> str:
    """``read_small`` of a UTF-8 text file (a chat template, say)."""
    return utf8(read_small(path, max_bytes), path)


def read_small(path: str | os.PathLike, max_bytes: int = SMALL_FILE_MAX) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` bytes."""
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FormatError(path, "(file)", "no such file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise _not_regular(path, st.st_mode)
        if st.st_size > max_bytes:
            raise FormatError(path, "(size)", f"{st.st_size} bytes is more than the {_mib(max_bytes)} "
                                              "this kind of file may hold")
        parts, n = [], 0
        while True:
            buf = os.read(fd, min(READ_CHUNK, max_bytes + 1 - n))
            if not buf:
                break
            parts.append(buf)
            n += len(buf)
            if n > max_bytes:  # grew while being read
                raise FormatError(path, "(size)", f"more than the {_mib(max_bytes)} this kind of file may hold")
        return b"".join(parts)
    finally:
        os.close(fd)


def read_utf8(path: str | os.PathLike, max_bytes: int = SMALL_FILE_MAX) -> str:
    """A regular file of UTF-8 text (``read_small``'s checks: no FIFO,
    device or oversized file), or one line naming the first bad byte."""
    return utf8_text(read_small(path, max_bytes), path)


def utf8_text(data: bytes, where: str | os.PathLike) -> str:
    """``data`` as UTF-8 text, or one FormatError naming ``where`` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(where, "(text)", f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _short(path: str | os.PathLike, end: int) -> FormatError:
    return FormatError(path, "(size)", f"file ends before byte {end}")


def iter_range(f: BinaryIO, offset: int, nbytes: int, chunk: int = READ_CHUNK) -> Iterator[bytes]:
    """Bytes [offset, offset + nbytes) of an open file, at most ``chunk`` at a time."""
    f.seek(offset)
    left = nbytes
    while left:
        buf = f.read(min(chunk, left))
        if not buf:
            raise _short(f.name, offset + nbytes)
        left -= len(buf)
        yield buf


def copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, nbytes: int,
               advance: Callable[[int], None] | None = None) -> int:
    """Copy ``nbytes`` from ``src_fd`` at ``src_offset`` to ``dst_fd`` at
    ``dst_offset``; returns the bytes copied, fewer only where the source
    ends early (the caller names the file in its error).

    Why not read + write: every chunk then crosses user space twice, and a
    fresh buffer per chunk costs page faults that on this VM made the same
    copy take 0.4 to 1.7 s. ``copy_file_range`` copies inside the kernel (or
    shares blocks, where the filesystem can); where the kernel refuses the
    pair of files, one reused buffer goes through pread/pwrite instead."""
    done = 0
    kernel = hasattr(os, "copy_file_range")
    view = None
    while done < nbytes:
        want = min(COPY_CHUNK, nbytes - done)
        if kernel:
            try:
                k = os.copy_file_range(src_fd, dst_fd, want, src_offset + done, dst_offset + done)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
        else:
            if view is None:
                view = memoryview(bytearray(min(READ_CHUNK, nbytes)))
            k = os.preadv(src_fd, [view[:min(len(view), want)]], src_offset + done)
            w = 0
            while w < k:
                w += os.pwrite(dst_fd, view[w:k], dst_offset + done + w)
        if k == 0:
            break
        done += k
        if advance is not None:
            advance(k)
    return done


def pread_views(f: BinaryIO, offset: int, nbytes: int, chunk: int = READ_CHUNK) -> Iterator[memoryview]:
    """Bytes [offset, offset + nbytes) of an open file as views of one reused
    buffer, each valid until the next is read. A fresh ``bytes`` per chunk
    costs page faults (on this VM they made hashing a 537 MB checkpoint swing
    2x); pread leaves the file position alone, so another thread may write
    the same file meanwhile (IebinWriter hashes its staged payloads so)."""
    view = memoryview(bytearray(min(chunk, max(nbytes, 1))))
    done = 0
    while done < nbytes:
        k = os.preadv(f.fileno(), [view[:min(len(view), nbytes - done)]], offset + done)
        if k == 0:
            raise _short(f.name, offset + nbytes)
        yield view[:k]
        done += k


class PreadFiles:
    """``read(path, offset, n)`` by pread, one descriptor per file, closed on exit."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def read(self, path: Path, offset: int, n: int) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        buf = os.pread(fd, n, offset)
        if len(buf) != n:
            raise _short(path, offset + n)
        return buf

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "PreadFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def model_file(model_dir: str | os.PathLike, name: str, max_bytes: int = SMALL_FILE_MAX) -> Path | None:
    """``model_dir/name`` (e.g. tokenizer.json) for a reader that opens it by
    path: None when absent, else checked like ``read_small`` (regular, at
    most ``max_bytes``) and to resolve inside ``model_dir``."""
    from .paths import check_inside

    p = Path(model_dir) / name
    if not os.path.lexists(p):
        return None
    check_inside(model_dir, p)
    st = check_regular(p)
    if st.st_size > max_bytes:
        raise FormatError(p, "(size)", f"{st.st_size} bytes is more than the {_mib(max_bytes)} this kind of file may hold")
    return p
