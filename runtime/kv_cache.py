"""The KV cache's element types: ``--cache-type-k`` / ``--cache-type-v``.

llama.cpp's ``-ctk`` / ``-ctv``, with its default: f16. A cache of halves
takes half the memory, and a decode step at a long context reads half the
bytes (on SmolLM2 at 2048 positions the f32 cache is more bytes per token
than the 4-bit weights). The attention still multiplies floats: the kernels
widen each cached half exactly as they load it (csrc/attention/attention.h),
so f16 costs only the rounding of K and V.
f32 keeps them exact: the references that calibration and ``ierun eval
--ref-dir`` compare against run on it, and so does the CUDA decoder, which
has no other. Kept apart from decoder.py so the commands can declare the
options without loading the native runtime.
"""

from __future__ import annotations

import click

from iekit.formats.dtypes import DTYPES
from iekit.formats.errors import IEError

TYPES = ("f16", "f32")  # the cache's element types; their sizes are formats/dtypes.py's


def nbytes(t: str) -> int:
    """Bytes of one cached element of type ``t``."""
    return DTYPES[t].itemsize


def resolve(device: str, k: str | None, v: str | None) -> tuple[str, str]:
    """The K and V cache types that run on ``device`` for --cache-type-k
    ``k`` and --cache-type-v ``v`` (None: f16 on the CPU, f32 on CUDA)."""
    out = []
    for flag, t in (("--cache-type-k", k), ("--cache-type-v", v)):
        if t is None:
            t = "f32" if device == "cuda" else "f16"
        if t not in TYPES:
            raise IEError(f"{flag}: {t!r} is not a KV cache type (f16 or f32)")
        if device == "cuda" and t != "f32":
            raise IEError(f"{flag} {t}: the CUDA decoder keeps an f32 KV cache")
        out.append(t)
    return out[0], out[1]


def options(f):
    """-ctk/--cache-type-k and -ctv/--cache-type-v, for every command that
    runs the decoder on a user's model (generate, logits, eval, verify
    model, bench); the parameters are cache_type_k and cache_type_v."""
    for short, flag, what in (("-ctv", "--cache-type-v", "values"), ("-ctk", "--cache-type-k", "keys")):
        f = click.option(short, flag, type=click.Choice(TYPES), default=None,
                         help=f"KV cache type of the {what} (llama.cpp's {short}): f16 halves the cache's memory "
                              "and what each token reads from a long context; f32 keeps them exact.  "
                              "[default: f16; f32 with --device cuda]")(f)
    return f
