"""What ieconv's calibration commands (imatrix, gptq, kl-probes) run: the
float model, and calibration text cut into chunks of its context.

Those commands import it inside their functions, when a model runs, so
that ieconv starts without the native extension (docs/architecture.md);
each reads its calibration the same way, so --ctx, --chunks, --text-file
and --ids-file mean the same in all three.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import evaluation
from .decoder import Decoder
from .token_ids import load_ids


def float_decoder(model_dir: str | os.PathLike, *, threads: int, ctx: int | None) -> Decoder:
    """The model with f32 activations: a calibration statistic describes the
    float model, not its int8-activation approximation. Its context is
    ``ctx``, else ierun eval's default (or the model's own, if smaller)."""
    return Decoder(model_dir, threads=threads, ctx=ctx, default_ctx=evaluation.DEFAULT_CTX, act="f32")


def calibration_chunks(dec: Decoder, text_file: Path | None, ids_file: Path | None,
                       chunks: int | None) -> tuple[list[list[int]], str]:
    """The calibration token ids (--text-file, tokenized by ``dec``'s
    tokenizer, or --ids-file) cut into whole chunks of ``dec``'s context, the
    first ``chunks`` of them; and where they came from, for messages."""
    ids, what = load_ids(dec, text_file, ids_file)
    return evaluation.chunk_ids(ids, dec.max_ctx, chunks, what), what
