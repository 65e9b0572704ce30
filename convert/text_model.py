"""A multimodal checkpoint's language model as a checkpoint of its own
(``ieconv text-model``).

Gemma 3 4B, 12B and 27B are published as ``Gemma3ForConditionalGeneration``:
a SigLIP vision tower and a projector beside a Gemma 3 text model, which is
all a text prompt runs through (llama.cpp's converter likewise writes the
text model as one GGUF and the vision part as another, ``mmproj``). This
writes that text model as the ``Gemma3ForCausalLM`` checkpoint transformers
would build from it: its tensors renamed from either layout
(``language_model.model.*`` as the Hub's files hold them,
``model.language_model.*`` as transformers 5 saves them) and copied byte for
byte, the vision tower's and projector's left out because the user asked
for the text model, and ``text_config`` as a config of its own. The Hub's
``text_config`` holds only what differs from transformers' defaults, so
those defaults are filled in (``GEMMA3_TEXT_DEFAULTS``, transformers 5.23's
Gemma3TextConfig; golden/ref/gemma3-text-defaults.json is transformers'
own, and the tests hold the table to it). Every other tool then reads the
result as any Gemma 3 checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from iekit.formats.errors import IEError
from iekit.formats.hf_checkpoint import HFSource, SINGLE_NAME, collect_tensors, read_aux
from iekit.formats.hf_config import model_summary
from iekit.formats.safetensors_writer import SafetensorsWriter

from .artifact_out import CONFIG_FILES, TOKENIZER_FILES, ConvertResult, Progress, checkpoint_out, natural_key

# transformers 5.23's Gemma3TextConfig defaults that shape the computation, filled in where a
# multimodal config's text_config leaves them out (the RoPE and window keys in the Hub's spelling)
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1,
    "bos_token_id": 2, "tie_word_embeddings": True, "attention_bias": False, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}
# only where the config has no rope_parameters (transformers 5) / layer_types of its own
GEMMA3_ROPE_DEFAULTS = {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
GEMMA3_PATTERN_DEFAULT = {"sliding_window_pattern": 6}


@dataclass(frozen=True)
class TextPart:
    """Where a multimodal architecture keeps its language model."""

    text_class: str
    model_type: str
    renames: tuple[tuple[str, str], ...]  # source prefix -> the text model's, first match wins
    left_out: tuple[str, ...]             # prefixes of the other modalities' tensors
    defaults: dict[str, Any]
    # defaults filled in only where text_config lacks the key that would say otherwise
    defaults_unless: tuple[tuple[str, dict[str, Any]], ...] = ()


MULTIMODAL = {
    "Gemma3ForConditionalGeneration": TextPart(
        "Gemma3ForCausalLM", "gemma3_text",
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head.")),
        left_out=("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "model.multi_modal_projector."),
        defaults=GEMMA3_TEXT_DEFAULTS,
        defaults_unless=(("rope_parameters", GEMMA3_ROPE_DEFAULTS), ("layer_types", GEMMA3_PATTERN_DEFAULT))),
}


def text_config(config: dict[str, Any], part: TextPart, where: str) -> dict[str, Any]:
    """The text model's config.json: ``text_config`` over the defaults, the
    top level's ids where it states them (its eos_token_id list is where
    generation stops: Gemma 3's <end_of_turn> besides <eos>)."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise IEError(f"{where}: text_config: expected an object, got {text!r}")
    out = {**part.defaults, **text}
    for key, defaults in part.defaults_unless:
        if key not in text:
            out = {**defaults, **out}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"):
        if config.get(key) is not None:
            out[key] = config[key]
    out.update(architectures=[part.text_class], model_type=part.model_type)
    return out


def _renamed(name: str, part: TextPart) -> str | None:
    if name.startswith(part.left_out):
        return None
    for src, dst in part.renames:
        if name.startswith(src):
            return dst + name[len(src):]
    return ""  # neither the text model's nor a known other modality's


def extract_text_model(src: HFSource, out_dir: str | os.PathLike, *, overwrite: bool = False,
                       progress: Progress | None = None) -> ConvertResult:
    """Write ``src``'s language model into ``out_dir`` (module docstring):
    model.safetensors, config.json and the source's generation and
    tokenizer files, staged and renamed together. A tensor that is neither
    the text model's nor a known other modality's is refused, naming it."""
    progress = progress or Progress()
    where = str(src.dir / "config.json")
    arch = model_summary(src.config)["architecture"]
    if arch not in MULTIMODAL:
        raise IEError(f"{where}: architectures: {arch!r} is not a multimodal model this extracts the text model "
                      f"of ({', '.join(MULTIMODAL)})")
    part = MULTIMODAL[arch]
    config = text_config(src.config, part, where)
    aux = {n: d for n in CONFIG_FILES + TOKENIZER_FILES if n != "config.json" and (d := read_aux(src, n)) is not None}
    out = checkpoint_out(out_dir, overwrite, ["config.json", *aux], src.dir)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        tensors = collect_tensors(src, stack)
        kept: dict[str, str] = {}  # text model's name -> source name
        for name in tensors:
            new = _renamed(name, part)
            if new == "":
                raise IEError(f"{tensors[name][0].path}: {name}: neither {arch}'s language model nor its vision "
                              "tower or projector; refusing rather than dropping it")
            if new is not None:
                if new in kept:
                    raise IEError(f"{tensors[name][0].path}: {name}: a second tensor for {new} ({kept[new]})")
                kept[new] = name
        order = sorted(kept, key=natural_key)
        bytes_in = sum(tensors[kept[n]][1].nbytes for n in order)
        progress.start("extracting", bytes_in)
        meta = {"format": "pt", "iekit.source": json.dumps({"text_model_of": arch})}
        with out.writing() as staged:
            specs = [(n, tensors[kept[n]][1].dtype.name, list(tensors[kept[n]][1].shape)) for n in order]
            writer = SafetensorsWriter(staged.open(SINGLE_NAME), specs, meta)
            for n in order:
                sf, t = tensors[kept[n]]
                progress.describe(n)
                writer.copy(n, lambda fd, off, sf=sf, t=t: sf.copy_to(t, fd, off, progress.advance))
            writer.finish()
            staged.write_bytes("config.json", (json.dumps(config, indent=2) + "\n").encode())
            for n, d in aux.items():
                staged.write_bytes(n, d)
    return ConvertResult(out.dir, len(order), bytes_in, (out.dir / SINGLE_NAME).stat().st_size,
                         time.perf_counter() - t0, 0, removed=out.stale)
