"""HF safetensors checkpoint -> IEBIN schema2, streamed tensor by tensor.

Memory: tensors kept as they are are copied file to file inside the kernel
(copy_file_range), cast or quantized ones in 8 MiB chunks, so peak RSS is a
few chunks plus Python, independent of model size. Atomicity: everything is
staged under temporary names in the output directory and renamed at the end,
``model.ie.json`` last; on any error the directory is left as it was (and
directories the run created are removed again): artifact_out.py, the frame
every converter writes through, which also says what --overwrite does.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from iekit.formats import checksums, expert_stacks, gptq, hf_fp8, hf_nvfp4, iebin
from iekit.formats import imatrix as imatrix_fmt
from iekit.formats.casting import cast_bytes, decode_f32
from iekit.formats.dtypes import DTYPES
from iekit.formats.finite import checked, checker
from iekit.formats.gptq_partial import PartialRun
from iekit.formats.hf_checkpoint import HFSource, collect_tensors, read_aux
from iekit.formats.hf_config import model_summary
from iekit.formats.model_spec import check_convertible
from iekit.formats.safetensors_reader import CHUNK_BYTES

from iekit.formats.q4_manifest import Manifest, plan
from iekit.formats.quant import SCHEMES, QuantError, QuantizedRows, QuantParams, map_row_pieces, matrix_dims
from iekit.formats.workers import worker_count

from . import hf_mxfp4
from .gguf_names import importance_to_hf
from .text_model import MULTIMODAL
from .artifact_out import (CONFIG_FILES, TOKENIZER_FILES, ArtifactOut, ConvertResult, Progress, check_dtype,
                           natural_key)
from .source_hashes import SourceHashes

QUANT_CHUNK_ELEMS = 1 << 20  # rows are quantized ~1M elements at a time

def load_importance(path: str | os.PathLike | None, quantize: dict[str, QuantParams],
                    shapes: dict[str, list[int]]) -> tuple[dict[str, Any], list[str]]:
    """The importance vector of every matrix to quantize that the imatrix at
    ``path`` (ours, or llama.cpp's legacy .dat) has an entry for, and a
    warning naming those it has none for (quantized unweighted). Read and
    checked before anything is written."""
    if path is None or not quantize:
        return {}, []
    im = imatrix_fmt.read_any(Path(path))
    if im.meta["format"] in imatrix_fmt.LLAMACPP_FORMATS:  # llama.cpp's tensor names -> ours
        im.entries = importance_to_hf(im.entries, shapes, os.fspath(path))
    found, missing = imatrix_fmt.select_for(im, {n: shapes[n] for n in quantize}, os.fspath(path))
    if not missing:
        return found, []
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    return found, [f"{path}: no entry for {len(missing)} of the {len(quantize)} matrices to quantize ({shown}); "
                   "they are quantized unweighted"]


def convert(src: HFSource, out_dir: str | os.PathLike, *, dtype: str | None = None,
            overwrite: bool = False, progress: Progress | None = None,
            manifest: Manifest | None = None, force: bool = False,
            imatrix: str | os.PathLike | None = None, covariances: Any = None,
            checksum: str = checksums.DEFAULT, allow_nonfinite: bool = False,
            partial: PartialRun | None = None, refit_scales: bool = gptq.REFIT_SCALES) -> ConvertResult:
    """Convert ``src`` into ``out_dir``; ``dtype`` casts floating tensors,
    ``manifest`` (q4_manifest.json) quantizes the tensors it selects,
    weighting each one's error by ``imatrix`` (default: the manifest's).
    ``covariances`` (runtime/hessians.py's Hessians): the matrices it has
    an input covariance for are quantized error-compensated (formats/gptq.py)
    instead, each read whole; with ``partial`` (formats/gptq_partial.py)
    each compensated matrix is kept there as soon as it is made, and a
    matrix an interrupted run kept is taken from there, not quantized
    again; ``refit_scales``: their scales refitted once their codes are
    final (gptq.refit_scales). ``checksum``: the digest algorithm recorded
    (formats/checksums.py). A float tensor holding NaN or ±inf (or a cast
    overflowing to inf) is refused, naming its shard, unless
    ``allow_nonfinite``: ``validate --deep`` would refuse the artifact."""
    progress = progress or Progress()
    check_dtype(dtype)
    # The config and tokenizer files are read first (each checked: regular,
    # inside the checkpoint, bounded), so the names written are known.
    aux_data = {n: d for n in CONFIG_FILES + TOKENIZER_FILES if (d := read_aux(src, n)) is not None}
    out = ArtifactOut(out_dir, overwrite, list(aux_data), src.dir)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        # gpt-oss's MXFP4 blocks + scales pairs become one mxfp4 tensor each, never offered to the manifest.
        tensors, pairs = hf_mxfp4.split_pairs(collect_tensors(src, stack), src.config, str(src.dir))
        # An NVFP4 checkpoint's weights become nvfp4 tensors as they are (formats/hf_nvfp4.py), never offered to
        # the manifest either; its config.json is written without the quantization_config.
        tensors, nv_list = hf_nvfp4.split(tensors, src.config, str(src.dir))
        # An FP8 checkpoint is written as the float one it stands for (formats/hf_fp8.py): its weights dequantized
        # (in its own dtype unless --dtype says), its config without the quantization_config, config.json too.
        config = hf_nvfp4.float_config(hf_fp8.float_config(src.config, tensors))
        fp8_dtype = dtype or hf_fp8.default_dtype(src.config)
        if config is not src.config:
            aux_data["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
        mx_pairs = {p.name: p for p in pairs}
        nv_mats = {m.name: m for m in nv_list}
        # gpt-oss's float expert stacks are [experts, in, out]: written transposed (expert_stacks.py).
        written = expert_stacks.AsWritten(config, tensors)
        if written.config is not config:  # (Qwen3.5's value heads in llama.cpp's order: recorded in config.json)
            config = written.config
            aux_data["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
        shapes = written.shapes()
        # An invalid MoE / attention config is refused here, before any byte is written.
        summary = model_summary(config)
        unsupported = check_convertible(summary, config,
                                        {**shapes, **{p.name: p.shape for p in [*pairs, *nv_list]}},
                                        src.dir / "config.json")
        arch = summary["architecture"]
        if arch in MULTIMODAL:
            unsupported = (f"ierun cannot run this model: {arch} is multimodal; `ieconv text-model --hf-dir "
                           f"{src.dir} --out-dir DIR` writes its language model, which it runs")
        qplan = plan(manifest, {n: (t.dtype.name, shapes[n]) for n, (_sf, t) in tensors.items()},
                     force=force) if manifest else None
        importance, iwarn = load_importance(imatrix or (manifest.imatrix if manifest else None),
                                            qplan.quantize if qplan else {}, shapes)
        names = sorted([*tensors, *mx_pairs, *nv_mats], key=natural_key)
        if covariances is not None:  # the order its windows (and a sequential pass) are collected in
            names = covariances.forward_order(names)
        bytes_in = sum(t.nbytes for _, t in tensors.values()) + sum(p.source_nbytes for p in [*pairs, *nv_list])
        # One bar for both: the shards are hashed beside the conversion (source_hashes.py).
        progress.start("converting", bytes_in + sum((src.dir / s).stat().st_size for s in src.shards))
        hashes = stack.enter_context(SourceHashes([(s, src.dir / s) for s in src.shards], progress.advance, checksum))
        n_cast = 0
        errors: dict[str, QuantError] = {}
        with out.writing() as staged:
            if partial is not None:
                partial.begin()
            writer = iebin.IebinWriter(staged, checksum=checksum)
            for name in names:
                progress.describe(name)
                if name in mx_pairs:
                    pair = mx_pairs[name]
                    writer.add_tensor(name, "mxfp4", pair.shape, hf_mxfp4.chunks(pair, progress.advance), pair.nbytes,
                                      extra={iebin.QUANT_KEY: hf_mxfp4.MXFP4.quant_dict(pair.shape[-1], QuantParams("mxfp4"))})
                    continue
                if name in nv_mats:
                    m = nv_mats[name]
                    writer.add_tensor(name, "nvfp4", m.shape, hf_nvfp4.chunks(m, progress.advance), m.nbytes,
                                      extra={iebin.QUANT_KEY: hf_nvfp4.NVFP4.quant_dict(m.shape[-1], m.params)})
                    continue
                sf, t = tensors[name]
                shape = shapes[name]

                def tensor_bytes(chunk_bytes: int, name=name) -> Iterator[bytes]:
                    return written.chunks(name, chunk_bytes, progress.advance)

                if qplan and name in qplan.quantize:
                    settle = covariances.settle if covariances is not None and covariances.sequential else None
                    kept = partial.get(name) if partial is not None else None
                    if kept is not None:
                        errors[name] = _add_payload(writer, name, shape, qplan.quantize[name], *kept, settle)
                        progress.advance(t.nbytes)  # its source is not read
                        continue
                    cov = covariances.of(name) if covariances is not None else None
                    errors[name] = _add_quantized(writer, name, shape, t.dtype.name, tensor_bytes,
                                                  qplan.quantize[name], importance.get(name), cov,
                                                  settle if cov is not None else None,
                                                  partial.put if cov is not None and partial is not None else None,
                                                  refit_scales)
                    cov = None  # not held while the next window's covariances are collected
                    continue
                target = dtype if dtype and t.dtype.is_float else t.dtype.name
                if isinstance(sf, hf_fp8.Fp8Matrix):
                    target = fp8_dtype
                entry = {"dtype": target, "shape": shape}
                if target == t.dtype.name and name not in written.moved:
                    writer.add_copy(name, target, shape, t.nbytes,
                                    lambda fd, off, sf=sf, t=t: sf.copy_to(t, fd, off, progress.advance),
                                    check=checker(entry, sf.path, name, allow_nonfinite))
                    continue
                chunks = tensor_bytes(CHUNK_BYTES)
                where = sf.path
                if target != t.dtype.name:
                    n_cast += 1
                    chunks = (cast_bytes(c, t.dtype.name, target) for c in chunks)
                    where = f"{sf.path} (cast to {target})"
                out_nbytes = t.nbytes // t.dtype.itemsize * DTYPES[target].itemsize
                writer.add_tensor(name, target, shape, checked(chunks, entry, where, name, allow_nonfinite), out_nbytes)

            aux = writer.stage_aux(aux_data)
            source = {"kind": src.kind, "name": src.name, "revision": src.revision, "shards": hashes.records()}
            meta = writer.finish(config=config, model=summary, source=source,
                                 tokenizer_files=out.tokenizer_files, aux_files=aux)
    bytes_out = meta["files"][0]["nbytes"]
    return ConvertResult(out.dir, len(names), bytes_in, bytes_out, time.perf_counter() - t0, n_cast,
                         len(qplan.quantize) if qplan else 0,
                         (qplan.warnings if qplan else []) + iwarn + ([unsupported] if unsupported else []), out.stale,
                         weighted_tensors=len(importance), errors=errors, kept_blocks=len(pairs),
                         fp8_tensors=hf_fp8.fp8_count(tensors))


def _add_quantized(writer: iebin.IebinWriter, name: str, shape: list[int], src_dtype: str,
                   source: Callable[[int], Iterator[bytes]], params: QuantParams, importance: Any = None,
                   covariance: tuple[Any, Any] | None = None,
                   settle: Callable[[str, np.ndarray], None] | None = None,
                   keep: Callable[[str, bytes, QuantError], None] | None = None,
                   refit_scales: bool = gptq.REFIT_SCALES) -> QuantError:
    """Quantize a float matrix (or expert stack: its matrices' rows one after
    another) a block of rows at a time from ``source`` (chunk bytes -> its
    bytes, whole rows per chunk): memory stays bounded. Its predicted loss
    is recorded in the entry and returned. With ``covariance`` (its input's
    H and inverse factor, runtime/hessians.py; for a stack, expert -> its
    own, or None for an expert quantized plain) error-compensated instead
    (formats/gptq.py), chunks of gptq.chunk_rows rows on worker threads, its
    dequantized values handed to ``settle`` (a sequential pass runs on with
    them) and its payload to ``keep`` (an interrupted run resumes from it);
    ``refit_scales``: gptq.quantize's ``refit``."""
    count, rows, cols = matrix_dims(shape)
    rows *= count
    scheme = SCHEMES[params.scheme]
    rows_per_chunk = max(1, QUANT_CHUNK_ELEMS // max(cols, 1)) if covariance is None else \
        gptq.chunk_rows(rows, cols, worker_count())

    def row_chunks() -> Iterator:
        for chunk in source(rows_per_chunk * cols * DTYPES[src_dtype].itemsize):
            yield decode_f32(chunk, src_dtype).reshape(-1, cols)

    if covariance is None and importance is not None and importance.ndim == 2:  # a stack, one vector per expert
        error = QuantError()
        pieces = _per_expert(scheme, row_chunks(), params, rows // count, name, importance, error)
    elif covariance is None:
        error = QuantError()
        pieces = scheme.stream(row_chunks(), params, rows, name, importance, error)
    else:
        error = QuantError(compensated=True)
        parts = []
        if callable(covariance):  # a stack: each expert under its own covariance, in row order
            step = gptq.chunk_rows(rows // count, cols, worker_count())  # an expert's rows, on every worker
            runs = ((covariance(e), [w[a:a + step] for a in range(0, len(w), step)])
                    for e, w in _expert_rows(row_chunks(), rows // count))
        else:
            runs = [(covariance, row_chunks())]
        for cov, chunks in runs:
            if cov is None:  # an expert with no covariance: its nearest codes
                parts += scheme.measured_pieces(chunks, params, name, None, error)
                continue
            h, u = cov
            # Rows are independent under one covariance: a chunk at a time gives the
            # whole matrix's codes in memory bounded by the chunk (whole chunks:
            # smaller pieces only add per-call cost).
            for qr, e in map_row_pieces(lambda w: gptq.quantize(w, h, scheme, params, name, u, refit=refit_scales),
                                        chunks, None):
                error.merge(e)
                parts.append(qr)
        qr = QuantizedRows.vstack(parts)
        if settle is not None:
            settle(name, scheme.dequantize_rows(qr, cols, params).reshape(rows, cols))
        pieces = scheme.payload(qr)
        if keep is not None:  # the payload joined once: kept, then written from the same bytes
            data = b"".join(p.tobytes() for p in pieces)
            keep(name, data, error)
            return _add_payload(writer, name, shape, params, data, error)
    writer.add_tensor(name, params.scheme, shape, (p.tobytes() for p in pieces),
                      scheme.tensor_nbytes(shape, params), extra={iebin.QUANT_KEY: scheme.quant_dict(cols, params)},
                      error=error)
    return error


def _add_payload(writer: iebin.IebinWriter, name: str, shape: list[int], params: QuantParams, data: bytes,
                 error: QuantError, settle: Callable[[str, np.ndarray], None] | None = None) -> QuantError:
    """A compensated matrix's whole payload written as _add_quantized writes
    one: just made and kept (formats/gptq_partial.py), or kept by an
    interrupted run and handed to ``settle`` as it dequantizes (the values
    dequantize_rows gave when it was made)."""
    count, rows, cols = matrix_dims(shape)
    scheme = SCHEMES[params.scheme]
    if settle is not None:
        settle(name, scheme.dequantize(np.frombuffer(data, np.uint8), rows * count, cols, params)
               .reshape(rows * count, cols))
    writer.add_tensor(name, params.scheme, shape, [data], scheme.tensor_nbytes(shape, params),
                      extra={iebin.QUANT_KEY: scheme.quant_dict(cols, params)}, error=error)
    return error


def _expert_rows(row_chunks: Iterator[np.ndarray], rows_per_expert: int) -> Iterator[tuple[int, np.ndarray]]:
    """A stack's row chunks as (expert, its rows): the chunks joined and cut
    at expert boundaries, so one expert's rows are held at a time."""
    expert, held, have = 0, [], 0
    for w in row_chunks:
        while len(w):
            take = min(len(w), rows_per_expert - have)
            held.append(w[:take])
            w, have = w[take:], have + take
            if have == rows_per_expert:
                yield expert, (np.concatenate(held) if len(held) > 1 else held[0])
                expert, held, have = expert + 1, [], 0


def _per_expert(scheme: Any, row_chunks: Iterator[np.ndarray], params: QuantParams, rows_per_expert: int,
                name: str, importance: np.ndarray, error: QuantError) -> Iterator[np.ndarray]:
    """A stack's payload with expert e's rows weighted by importance[e]
    (block schemes are row-local, so the pieces' payloads concatenate in
    file order)."""
    for e, w in _expert_rows(row_chunks, rows_per_expert):
        yield from scheme.stream([w], params, len(w), name, importance[e], error)

