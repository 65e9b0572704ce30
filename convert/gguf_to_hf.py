"""``ieconv gguf-to-hf``: a llama.cpp GGUF as the Hugging Face checkpoint it
was converted from (model.safetensors, config.json, tokenizer files).

Why: the calibrated tools here (``rotate``, ``kl-probes``, ``gptq``,
``q4-manifest --ref-dir``) read float weights under HF names, and many
users have a model only as a GGUF (an f16 file from llama.cpp's
convert_hf_to_gguf.py, or a quantized one). This is gguf-to-iebin's import
(HF names, llama.cpp's q/k row interleaving undone, config.json and
tokenizer.json rebuilt from the metadata) written as safetensors instead:
F32/F16/BF16 tensors keep their bytes (or are cast to ``--dtype``), every
block type is dequantized by gguf.quants to ``--dtype`` (f32 by default:
a block's values are exact in f32, not in f16 or bf16). hf-to-iebin of the
result is gguf-to-iebin --dequantize of the file, tensor for tensor
(Qwen3.5's gated DeltaNet value heads back in Hugging Face's order).

gpt-oss is refused: its HF layout (expert stacks stored transposed, MXFP4
pairs) is not what the import builds; gguf-to-iebin reads it.
"""

from __future__ import annotations

import math
import json
import os
import time

import numpy as np

from iekit.formats import delta_net, fused_tensors
from iekit.formats.dtypes import DTYPES
from iekit.formats.expert_stacks import RAW, flip_experts, flipped_stacks
from iekit.formats.gguf_file import GGUFModel
from iekit.formats.errors import FormatError
from iekit.formats.hf_checkpoint import SINGLE_NAME, checkpoint_name
from iekit.formats.safetensors_writer import SafetensorsWriter

from .artifact_out import ConvertResult, Progress, check_dtype, checkpoint_out
from .gguf_to_iebin import aux_files, build_config, file_type_name, open_model, plan_tensors, tensor_chunks

# The model types whose HF layout the import does not build, refused: gpt-oss's (transposed expert stacks, MXFP4
# pairs). Every other import's tensors are its checkpoint's, one for one (phi3: the import's q/k/v and gate/up
# joined again into qkv_proj and gate_up_proj, formats/fused_tensors.py; qwen3_next: its DeltaNet's in_proj_qkvz and
# in_proj_ba, blocked by key head, likewise; llama4_text: its expert stacks turned back to [experts, in, out],
# formats/expert_stacks.py; granitemoehybrid, granitemoeshared: the shared MLP's gate and up joined again into
# input_linear; nemotron_h: under the Hub's backbone. prefix, formats/hf_checkpoint.py PREFIXES).
HF_UNWRITTEN = ("gpt_oss",)


FLOAT_TYPES = ("F32", "F16", "BF16")  # GGUF tensor types that hold the weights themselves, not codes


def _hf_config(g: GGUFModel, advice: str) -> dict:
    """The config.json of ``g``; refused, with ``advice`` (what to do
    instead, which differs by command), where its HF layout is not written."""
    cfg = build_config(g)
    if cfg["model_type"] in HF_UNWRITTEN:
        raise FormatError(g.path, "general.architecture", f"{cfg['model_type']}: its Hugging Face layout (transposed "
                                                          "expert stacks, MXFP4 pairs) is not what the import "
                                                          f"builds; {advice}")
    return cfg


def check_float_source(gguf_path: str | os.PathLike, allow_requantize: bool) -> None:
    """Refuse, before anything is written, a GGUF that cannot be a float
    source for calibrated quantization (ieconv quantize --from-gguf): an
    architecture whose HF layout is not written, or quantized tensors
    unless ``allow_requantize``. Why the second: their values are the codes
    of an earlier quantization, and quantizing them again adds a second
    rounding on top of the first (llama-quantize asks for
    --allow-requantize for the same reason)."""
    g, _read = open_model(gguf_path, text_only=True)  # (quantize writes the language model alone)
    with g:
        _hf_config(g, "ieconv quantize cannot start from it: give its HF checkpoint as --hf-dir")
        coded = [t for t in g.tensors if t.ggml_type not in FLOAT_TYPES]
    if coded and not allow_requantize:
        kinds = sorted({t.ggml_type for t in coded})
        raise FormatError(g.path, f"tensor {coded[0].name!r}",
                          f"is {coded[0].ggml_type} ({len(coded)} tensors are quantized: {', '.join(kinds)}): "
                          "quantizing codes again adds a second rounding error to the first; start from an "
                          "F16/BF16/F32 GGUF (convert_hf_to_gguf.py --outtype f16), or pass --allow-requantize")


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str | None = None,
                       overwrite: bool = False, progress: Progress | None = None,
                       allow_nonfinite: bool = False, text_only: bool = False) -> ConvertResult:
    """Write ``gguf_path`` into ``out_dir`` as an HF checkpoint (module
    docstring), staged and renamed together; the directory follows
    artifact_out.checkpoint_out's rules. ``text_only``: as gguf-to-iebin's."""
    progress = progress or Progress()
    check_dtype(dtype)
    g, read = open_model(gguf_path, text_only)
    tiled = _hf_config(g, "gguf-to-iebin imports it")
    plans = plan_tensors(g, tiled, dtype, dequantize_all=True)
    # (Qwen3.5's value heads back in Hugging Face's order: formats/delta_net.py)
    cfg = {k: v for k, v in tiled.items() if k != delta_net.ORDER_KEY}
    floats = {p.dtype for p in plans}
    if len(floats) == 1:
        cfg["torch_dtype"] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}.get(floats.pop())
    aux = aux_files(g, cfg)
    out = checkpoint_out(out_dir, overwrite, list(aux))
    t0 = time.perf_counter()
    bytes_in = sum(p.in_nbytes for p in plans)
    progress.start("converting", bytes_in)
    meta = {"format": "pt", "iekit.source": json.dumps({"gguf": g.path.name, "file_type": file_type_name(g),
                                                        **read.record()})}
    by_name = {p.name: p for p in plans}
    # (e.g. a phi3 file's attn_q in F16 beside a dequantized attn_k cannot be one qkv_proj)
    layout = fused_tensors.joined(cfg, [(p.name, p.dtype, p.shape) for p in plans], str(g.path))
    flipped = flipped_stacks(cfg)
    flip = {name for name, _d, shape, _p, _r in layout if len(shape) == 3 and name.endswith(flipped)}
    heads = [(checkpoint_name(cfg, n), d, [s[0], s[2], s[1]] if n in flip else s) for n, d, s, _p, _r in layout]
    with out.writing() as staged:
        writer = SafetensorsWriter(staged.open(SINGLE_NAME), heads, meta)
        for name, dtype, shape, parts, runs in layout:
            progress.describe(name)
            data = fused_tensors.in_order([tensor_chunks(g, by_name[n], progress, None, allow_nonfinite)
                                           for n in parts], runs, math.prod(shape[1:]) * DTYPES[dtype].itemsize)
            if (where := delta_net.tiled_axis(name, cfg)) is not None:  # (a layer's projection, whole)
                whole = np.frombuffer(b"".join(data), RAW[DTYPES[dtype].itemsize]).reshape(shape)
                data = [delta_net.untile(whole, *where).tobytes()]
            writer.write(checkpoint_name(cfg, name), flip_experts(data, *shape, DTYPES[dtype].itemsize) if name in flip else data)
        writer.finish()
        for name, data in aux.items():
            staged.write_bytes(name, data)
    return ConvertResult(out.dir, len(layout), bytes_in, (out.dir / SINGLE_NAME).stat().st_size,
                         time.perf_counter() - t0, sum(p.mode in ("cast", "dequant") for p in plans), removed=out.stale,
                         read_as=read.describe())
