"""The content hashes iekit's formats record, by name: one registry.

Every file with digests (model.ie.json, model.dedup.json, tensor_map.json)
names its algorithm once in ``checksum``, and each record carries its digest
under that same name as key (``"sha256": "…"`` or ``"xxh3_128": "…"``), so
a record says what it holds and an old artifact reads as it always did.

Why two: SHA-256 is what artifacts recorded first and what ``sha256sum``
checks, but at ~1.3 GB/s on one core hashing the source shards and every
payload was most of a conversion's time (issue 14). XXH3-128 (the xxhash
package, ~25 GB/s) catches accidental corruption (a flipped bit, a truncated
copy) as surely, but it is not a cryptographic hash: it does not protect a
model against someone who can also rewrite its JSON, which no digest stored
beside the data does anyway. New artifacts record ``xxh3_128`` unless a
command is given ``--checksum sha256``; readers accept both.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

import xxhash

from .errors import FormatError
from .fileio import pread_views


@dataclass(frozen=True)
class Algorithm:
    name: str
    new: Callable[[], Any]  # an object with update(bytes) and hexdigest()
    hex_digits: int

    def check(self, value: object) -> bool:
        return isinstance(value, str) and len(value) == self.hex_digits and _LOWER_HEX.fullmatch(value) is not None


_LOWER_HEX = re.compile(r"[0-9a-f]+")

ALGORITHMS: dict[str, Algorithm] = {
    "xxh3_128": Algorithm("xxh3_128", xxhash.xxh3_128, 32),
    "sha256": Algorithm("sha256", hashlib.sha256, 64),
}
DEFAULT = "xxh3_128"
NAMES = tuple(ALGORITHMS)


def algorithm(value: object, file: str | os.PathLike, field: str = "checksum") -> Algorithm:
    """The registry entry a file's ``checksum`` field names, or one clear error."""
    if isinstance(value, str) and value in ALGORITHMS:
        return ALGORITHMS[value]
    raise FormatError(file, field, f"unsupported checksum algorithm {value!r} (known: {', '.join(NAMES)})")


def check_record(record: dict, alg: Algorithm, file: str | os.PathLike, where: str, label: str = "") -> None:
    """``record`` carries a well-formed digest under ``alg``'s name and no
    other algorithm's (a record hashed differently from the file's
    ``checksum`` would otherwise pass unchecked)."""
    for other in NAMES:
        if other != alg.name and other in record:
            raise FormatError(file, f"{where}.{other}", f"{label}{other} digest in a file whose checksum is {alg.name!r}")
    if alg.name not in record:
        raise FormatError(file, where, f"{label}missing key {alg.name!r}")
    if not alg.check(record[alg.name]):
        raise FormatError(file, f"{where}.{alg.name}", f"{label}must be {alg.hex_digits} lowercase hex digits")


def digest(name: str, data: bytes | memoryview) -> str:
    h = ALGORITHMS[name].new()
    h.update(data)
    return h.hexdigest()


def digest_range(f: BinaryIO, offset: int, nbytes: int, name: str,
                 check: Callable[[memoryview], None] | None = None,
                 advance: Callable[[int], None] | None = None) -> str:
    """Digest of ``nbytes`` of ``f`` from ``offset``, read in bounded chunks;
    ``check(view)`` sees each chunk (finite.checker: raising stops the hash),
    ``advance(n)`` after each (a progress bar; raising stops it too)."""
    h = ALGORITHMS[name].new()
    for view in pread_views(f, offset, nbytes):
        if check is not None:
            check(view)
        h.update(view)
        if advance is not None:
            advance(len(view))
    return h.hexdigest()


def digest_file_range(path: str | os.PathLike, offset: int, nbytes: int, name: str,
                      advance: Callable[[int], None] | None = None) -> str:
    with open(path, "rb", buffering=0) as f:
        return digest_range(f, offset, nbytes, name, advance=advance)
