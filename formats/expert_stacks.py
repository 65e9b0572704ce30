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
source. Llama 4's float stacks run the same way (``Llama4TextExperts``).
Every reader of a checkpoint that must agree with the artifact (the
converter, q4-manifest's bit budget, gptq, verify quant --hf-dir) reads it
through ``AsWritten``.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from iekit.formats import delta_net
from iekit.formats.hf_checkpoint import collect_tensors
from iekit.formats.safetensors_reader import SafetensorsFile, SafetensorsTensor

# architecture -> its float stacks stored [experts, in, out] (Llama 4's as gpt-oss's, gate_up_proj's columns
# gate's then up's: rows once transposed)
TRANSPOSED_SUFFIXES = {"GptOssForCausalLM": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
                       "Llama4ForCausalLM": ("feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj")}
RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # element bits, moved without interpreting them


def flipped_stacks(config: Any) -> tuple[str, ...]:
    """The suffixes of the stacks the checkpoint of ``config``'s architecture
    stores [experts, in, out] (TRANSPOSED_SUFFIXES): what a reader turns to
    IEBIN's [experts, out, in], and a writer of that checkpoint back."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    return TRANSPOSED_SUFFIXES.get(archs[0], ()) if isinstance(archs, list) and archs else ()


def transposed(config: Any, tensors: dict[str, tuple[SafetensorsFile, SafetensorsTensor]]) -> set[str]:
    """The float [experts, in, out] stacks of a gpt-oss or Llama 4 checkpoint."""
    suffixes = flipped_stacks(config)
    return {n for n, (_sf, t) in tensors.items()
            if suffixes and n.endswith(suffixes) and t.dtype.is_float and len(t.shape) == 3}


class AsWritten:
    """A checkpoint's tensors (collect_tensors: name -> (file, tensor)) as
    hf-to-iebin writes them: the same names, every stack [experts, out, in],
    and gated DeltaNet's value heads in llama.cpp's tiled order
    (formats/delta_net.py; ``config`` then records it)."""

    def __init__(self, config: Any, tensors: dict[str, tuple[SafetensorsFile, SafetensorsTensor]]):
        self.tensors = tensors
        self.flipped = transposed(config, tensors)  # read transposed, one expert at a time
        # read whole, one value-head axis reordered (a layer's projection: bounded)
        self.tiled = {n: where for n in tensors if (where := delta_net.tiled_axis(n, config)) is not None}
        self.config = delta_net.tiled_config(config)
        self.moved = self.flipped | set(self.tiled)  # the tensors whose bytes are not the stored ones

    def shape(self, name: str) -> list[int]:
        t = self.tensors[name][1]
        if name in self.flipped:
            experts, n_in, n_out = t.shape
            return [experts, n_out, n_in]
        return list(t.shape)

    def shapes(self) -> dict[str, list[int]]:
        return {n: self.shape(n) for n in self.tensors}

    def chunks(self, name: str, chunk_bytes: int, advance: Callable[[int], None]) -> Iterator[bytes]:
        """The tensor's bytes as written, whole rows per chunk (a transposed
        stack: one expert per chunk); ``advance`` gets each chunk's size."""
        sf, t = self.tensors[name]
        if name in self.tiled:
            whole = b"".join(sf.iter_chunks(t, t.nbytes))
            advance(len(whole))
            axis, index = self.tiled[name]
            yield np.take(np.frombuffer(whole, RAW[t.dtype.itemsize]).reshape(t.shape), index, axis).tobytes()
            return
        if name not in self.flipped:
            for buf in sf.iter_chunks(t, chunk_bytes):
                advance(len(buf))
                yield buf
            return
        experts, n_in, n_out = t.shape
        raw = RAW[t.dtype.itemsize]
        for buf in sf.iter_chunks(t, t.nbytes // experts if experts else t.nbytes):
            advance(len(buf))
            yield np.frombuffer(buf, raw).reshape(n_in, n_out).T.tobytes()

    def read_rows(self, name: str, rows: list[int]) -> bytes:
        """Rows ``rows`` of the tensor as written, viewed as a matrix
        [prod(shape[:-1]), cols]. A transposed stack's row e × out + o is
        column o of expert e's [in, out]: each expert holding one is read
        whole, once."""
        sf, t = self.tensors[name]
        if name in self.tiled:
            axis, index = self.tiled[name]
            if axis == 0:
                return sf.read_rows(t, [int(index[r]) for r in rows])
            got = np.frombuffer(sf.read_rows(t, rows), RAW[t.dtype.itemsize]).reshape(len(rows), -1)
            return np.take(got, index, 1).tobytes()
        if name not in self.flipped:
            return sf.read_rows(t, rows)
        experts, n_in, n_out = t.shape
        raw = RAW[t.dtype.itemsize]
        cols: dict[int, np.ndarray] = {}
        for e in sorted({r // n_out for r in rows}):
            block = np.frombuffer(sf.read_rows(t, range(e * n_in, (e + 1) * n_in)), raw).reshape(n_in, n_out)
            cols.update({r: block[:, r % n_out] for r in rows if r // n_out == e})
        return b"".join(cols[r].tobytes() for r in rows)


def shapes_as_written(src: Any) -> dict[str, tuple[str, list[int]]]:
    """(dtype, shape) of every tensor of the HF checkpoint ``src`` as written."""
    with ExitStack() as stack:
        written = AsWritten(src.config, collect_tensors(src, stack))
        return {n: (t.dtype.name, written.shape(n)) for n, (_f, t) in written.tensors.items()}


def flip_experts(chunks: Iterable[bytes], experts: int, rows: int, cols: int, itemsize: int) -> Iterator[bytes]:
    """The bytes of a stack [experts, rows, cols] (``chunks``, cut anywhere)
    as [experts, cols, rows]: one expert held at a time."""
    per = rows * cols * itemsize
    buf = bytearray()
    for c in chunks:
        buf += c
        while len(buf) >= per:
            yield np.frombuffer(bytes(buf[:per]), RAW[itemsize]).reshape(rows, cols).T.tobytes()
            del buf[:per]
    if buf:
        raise ValueError(f"an expert stack's bytes end {len(buf)} bytes into an expert of {per}")
