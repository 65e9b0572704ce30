"""Error types whose str() is the one line a user sees.

Tools print ``str(err)`` and exit non-zero; they never show a traceback for
these. A format error always names the file and the field that broke a rule,
because "invalid file" alone sends the user digging.
"""

from __future__ import annotations

import os


class IEError(Exception):
    """Any failure caused by user input (files, flags, environment)."""


class UnsupportedError(IEError):
    """Valid input that this tool does not implement (an architecture or
    option the decoder does not run): a converter writes such a model, with
    a warning; the runtime refuses it."""


class FormatError(IEError):
    """An artifact or input file breaks a rule of its format."""

    def __init__(self, file: str | os.PathLike, field: str, message: str):
        self.file = os.fspath(file)
        self.field = field
        self.message = message
        super().__init__(f"{self.file}: {field}: {message}")
