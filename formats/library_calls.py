"""Calls into compiled libraries that may panic (Hugging Face ``tokenizers``).

A Rust panic inside ``tokenizers`` (a truncation stride above max_length, a
garbage Precompiled normalizer, an empty Replace pattern, FixedLength 0 in a
hostile tokenizer.json) reaches Python as pyo3's ``PanicException``, a
``BaseException`` that nothing catches, after Rust's panic hook has already
printed its message and a backtrace on stderr: a user saw 38 lines. Every
call into such a library goes through ``guarded``, which turns a failure of
any kind into one IEError naming the file, and keeps the hook's output off
the terminal (the exception carries the same message).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .errors import IEError


@contextmanager
def _stderr_to_null() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null for the block (the panic hook writes
    there directly, not through sys.stderr)."""
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def guarded(label: str | os.PathLike, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; any failure but Ctrl-C (and our own IEError,
    which already names its file) becomes ``IEError("LABEL: WHAT failed: ...")``."""
    with _stderr_to_null():
        try:
            return fn(*args, **kwargs)
        except (IEError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # pyo3's PanicException is not an Exception
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise IEError(f"{os.fspath(label)}: {what} failed: {first}") from None
