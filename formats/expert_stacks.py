"""Float expert stacks in IEBIN's orientation: [experts, out, in].

IEBIN stores every matrix [out, in] (a row per output feature: what a GEMV
walks), and a stack of experts [experts, out, in]. Mixtral and Qwen3-MoE
checkpoints hold one Linear weight per expert, already [out, in]; gpt-oss's
MXFP4 pairs are [experts, out, in] as well (hf_mxfp4.py). Only gpt-oss's
float parameters run the other way: ``GptOssExperts.gate_up_proj``
[experts, hidden, 2 inter] and ``down_proj`` [experts, inter, hidden], which
transformers multiplies as ``x @ W``. hf-to-iebin transposes those, one
expert at a time (memory: one expert, 33 MB of bf16 for gpt-oss-20b), so the
decoder, the validators and the quantizers see one orientation whatever the
source.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Iterator

import numpy as np

from iekit.formats.hf_checkpoint import collect_tensors
from iekit.formats.safetensors_reader import SafetensorsFile, SafetensorsTensor

GPT_OSS = "GptOssForCausalLM"
TRANSPOSED_SUFFIXES = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # element bits, moved without interpreting them


def transposed(config: Any, tensors: dict[str, tuple[SafetensorsFile, SafetensorsTensor]]) -> set[str]:
    """The float [experts, in, out] stacks of a gpt-oss checkpoint."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    if not (isinstance(archs, list) and GPT_OSS in archs):
        return set()
    return {n for n, (_sf, t) in tensors.items()
            if n.endswith(TRANSPOSED_SUFFIXES) and t.dtype.is_float and len(t.shape) == 3}


def out_shape(t: SafetensorsTensor) -> list[int]:
    experts, n_in, n_out = t.shape
    return [experts, n_out, n_in]


def shapes_as_written(src: Any) -> dict[str, tuple[str, list[int]]]:
    """(dtype, shape) of every tensor of the HF checkpoint ``src`` as
    hf-to-iebin writes it: gpt-oss's float stacks [experts, out, in]."""
    with ExitStack() as stack:
        tensors = collect_tensors(src, stack)
        flip = transposed(src.config, tensors)
        return {n: (t.dtype.name, out_shape(t) if n in flip else list(t.shape)) for n, (_f, t) in tensors.items()}


def read_rows(sf: SafetensorsFile, t: SafetensorsTensor, rows: list[int]) -> bytes:
    """Rows ``rows`` of the stack as written, [experts × out, in]: column o
    of expert e's [in, out] for row e × out + o; each expert that holds one
    is read whole, once."""
    experts, n_in, n_out = t.shape
    raw = _RAW[t.dtype.itemsize]
    out = []
    for e in sorted({r // n_out for r in rows}):
        block = np.frombuffer(sf.read_rows(t, range(e * n_in, (e + 1) * n_in)), raw).reshape(n_in, n_out)
        out += [(r, block[:, r % n_out]) for r in rows if r // n_out == e]
    order = {r: i for i, r in enumerate(rows)}
    return b"".join(col.tobytes() for _r, col in sorted(out, key=lambda rc: order[rc[0]]))


def chunks(sf: SafetensorsFile, t: SafetensorsTensor, advance: Callable[[int], None]) -> Iterator[bytes]:
    """The stack's bytes as [experts, out, in], one expert at a time."""
    experts, n_in, n_out = t.shape
    raw = _RAW[t.dtype.itemsize]
    for buf in sf.iter_chunks(t, t.nbytes // experts if experts else t.nbytes):
        advance(len(buf))
        yield np.frombuffer(buf, raw).reshape(n_in, n_out).T.tobytes()
