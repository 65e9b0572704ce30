"""Ollama's GGUF layouts, read as llama.cpp's (``as_llamacpp``).

Ollama's library (``ollama pull gpt-oss:20b``, ``gemma3:4b``; the blobs
under ~/.ollama/models/blobs/sha256-...) holds files Ollama's own converter
wrote. They are GGUF, but not always laid out as llama.cpp's
``convert_hf_to_gguf.py`` lays them out, which is what the importer reads.
This says, per difference, how such a file reads as llama.cpp's, so that
the importer knows one layout; every difference is a fact of Ollama's
converter (convert/convert_*.go) and of the model code that runs its files
(model/models/*), so the import computes what Ollama computes:

- gpt-oss under ``general.architecture`` ``gptoss`` (GPTOSS): its keys
  under ``gptoss.``; ``attn_out``, ``attn_sinks`` (no ``.weight``) and
  ``ffn_norm`` (the block's second norm) where llama.cpp writes
  ``attn_output``, ``attn_sinks.weight`` and ``post_attention_norm``; no
  ``expert_feed_forward_length`` (its ``feed_forward_length`` is the
  experts' width, gpt-oss's intermediate_size); no ``rope.scaling.type``
  (Ollama's gptoss model turns by YaRN whatever the file says: llama.cpp's
  yarn, its betas 32 and 1); and whatever ``tokenizer.ggml.pre`` it names,
  the o200k split Ollama's gptoss model fixes, llama.cpp's ``gpt-4o``. Its
  ``tokenizer.ggml.eos_token_ids`` must name tokens llama.cpp stops at too
  (gpt-oss's <|endoftext|>, <|return|>, <|call|>), or the file is refused.
  An older converter's fused ``attn_qkv`` and ``ffn_gate_up_exps`` are
  refused, by name.
- gemma3 (GEMMA3): the RoPE bases under ``rope.global.freq_base`` and
  ``rope.local.freq_base`` (llama.cpp's ``rope.freq_base`` and
  ``rope.freq_base_swa``), and where the file has no such key, the values
  Ollama's gemma3 model takes (1e6 and 10000; ``layer_norm_rms_epsilon``
  1e-6), not llama.cpp's defaults.
- lfm2 (LFM2): its final norm as ``output_norm`` (llama.cpp's
  ``token_embd_norm``), and an older converter's ``feed_forward_length``
  stale: Ollama's model reads the width from the tensors, and so does this.
- mistral3 (MISTRAL3): YaRN's betas under ``rope.scaling.beta_fast`` /
  ``beta_slow`` and Llama 4's attention temperature under
  ``rope.scaling_beta`` (llama.cpp's ``rope.scaling.yarn_beta_*`` and
  ``attention.temperature_scale``).
- Multimodal models (gemma3 4B and up, mistral3, llama4, ...) keep their
  vision tower (``v.*``), projector (``mm.*``), audio (``a.*``) and SAM
  (``s.*``) tensors and their ``{arch}.vision.*``-like keys in the same
  file, where llama.cpp writes them to a separate mmproj file. The tools run
  the language model alone: ``text_only`` leaves them out (and the artifact
  records what, ``left_out``); without it they are refused in one line that
  says so.

Ollama's Qwen3.5 files (``qwen35``, ``qwen35moe`` with ``mtp.`` or vision
tensors, per-layer ``head_count_kv`` and a reordered value-head key whose
meaning is Ollama's model code's) are refused in one line naming the layout:
llama.cpp's file of the same model imports.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

from iekit.formats.errors import FormatError
from iekit.formats.gguf_file import GGUFModel

from .gguf_tokenizer import end_of_generation

# tensor-name prefixes of the parts beside the language model in a multimodal file -> what they hold
OTHER_MODALITIES = {"v.": "vision tower", "mm.": "projector", "a.": "audio encoder", "s.": "SAM encoder"}
# {arch}.<section>. keys that describe those parts (Ollama's converter writes them beside the text model's)
OTHER_SECTIONS = ("vision.", "audio.", "mm.", "sam.")


@dataclass(frozen=True)
class Layout:
    """One of Ollama's layouts, as the differences from llama.cpp's."""

    arch: str                                  # general.architecture as Ollama writes it
    as_arch: str                               # llama.cpp's name of the architecture
    # keys (without the arch prefix) that say a file of an architecture llama.cpp names alike is Ollama's
    markers: tuple[str, ...] = ()
    keys: tuple[tuple[str, str], ...] = ()     # Ollama's key -> llama.cpp's (without the arch prefix)
    tensors: tuple[tuple[str, str], ...] = ()  # Ollama's last name part(s) -> llama.cpp's, within blk.N.
    defaults: tuple[tuple[str, Any], ...] = ()  # llama.cpp's keys Ollama's model code fixes where the file is silent
    derived: tuple[tuple[str, str], ...] = ()  # llama.cpp's key -> Ollama's key it equals where absent
    pre: str | None = None                     # the split Ollama's model code fixes (llama.cpp's pre name)
    refused: tuple[str, ...] = ()              # name parts of a layout this does not read
    marker_tensors: tuple[str, ...] = ()       # tensors whose presence says a file is Ollama's
    top: tuple[tuple[str, str], ...] = ()      # Ollama's top-level tensor name prefix -> llama.cpp's
    # llama.cpp's key -> the tensor whose rows it counts, where Ollama's model code reads the width from the tensor
    # (an older converter's key may be stale)
    rows_of: tuple[tuple[str, str], ...] = ()


GPTOSS = Layout(
    "gptoss", "gpt-oss",
    tensors=(("attn_out.", "attn_output."), ("attn_sinks", "attn_sinks.weight"), ("ffn_norm.", "post_attention_norm.")),
    defaults=(("rope.scaling.type", "yarn"),),
    derived=(("expert_feed_forward_length", "feed_forward_length"),),
    pre="gpt-4o", refused=("attn_qkv.", "ffn_gate_up_exps."))
GEMMA3 = Layout(
    "gemma3", "gemma3", markers=("rope.global.freq_base", "rope.local.freq_base", "mm.tokens_per_image"),
    keys=(("rope.global.freq_base", "rope.freq_base"), ("rope.local.freq_base", "rope.freq_base_swa")),
    defaults=(("rope.freq_base", 1_000_000.0), ("rope.freq_base_swa", 10_000.0),
              ("attention.layer_norm_rms_epsilon", 1e-6)))
MISTRAL3 = Layout(
    "mistral3", "mistral3", markers=("rope.scaling.beta_fast", "rope.scaling.beta_slow", "rope.scaling_beta"),
    keys=(("rope.scaling.beta_fast", "rope.scaling.yarn_beta_fast"),
          ("rope.scaling.beta_slow", "rope.scaling.yarn_beta_slow"),
          ("rope.scaling_beta", "attention.temperature_scale")))
LFM2 = Layout("lfm2", "lfm2", marker_tensors=("output_norm.weight",), top=(("output_norm.", "token_embd_norm."),),
              rows_of=(("feed_forward_length", "blk.0.ffn_gate.weight"),))
LAYOUTS = {lay.arch: lay for lay in (GPTOSS, GEMMA3, MISTRAL3, LFM2)}
# Ollama's layouts this does not read: their markers (keys without the arch prefix; tensor-name prefixes)
UNREAD = {"qwen35": ("vision.block_count", "image_token_id", "ssm.v_head_reordered", "rope.mrope_interleaved"),
          "qwen35moe": ("vision.block_count", "image_token_id", "ssm.v_head_reordered", "rope.mrope_interleaved")}
UNREAD_TENSORS = ("mtp.", "v.")


@dataclass(frozen=True)
class Read:
    """How a file was read: ``layout`` ("llama.cpp" or "ollama") and the tensors left out by prefix (count)."""

    layout: str = "llama.cpp"
    left_out: tuple[tuple[str, int], ...] = ()

    def record(self) -> dict[str, Any]:
        """What source.gguf records of it (nothing for a llama.cpp file read whole)."""
        out: dict[str, Any] = {}
        if self.layout != "llama.cpp":
            out["layout"] = self.layout
        if self.left_out:
            out["left_out"] = dict(self.left_out)
        return out

    def describe(self) -> str:
        """One clause for the conversion report ("" for a llama.cpp file read whole)."""
        parts = ["read as Ollama lays it out"] if self.layout != "llama.cpp" else []
        if self.left_out:
            parts.append("left out " + ", ".join(f"{n} {OTHER_MODALITIES[p]} tensors ({p}*)" for p, n in self.left_out))
        return "; ".join(parts)


def as_llamacpp(g: GGUFModel, text_only: bool = False) -> tuple[GGUFModel, Read]:
    """``g`` as llama.cpp's layout of the same model, and how it was read."""
    arch = g.fields.get("general.architecture")
    if not isinstance(arch, str):
        return g, Read()
    _refuse_unread(g, arch)
    lay = LAYOUTS.get(arch)
    counts = _other_modalities(g)
    ollama = lay is not None and (lay.arch != lay.as_arch or any(f"{arch}.{m}" in g.fields for m in lay.markers)
                                  or any(t.name in lay.marker_tensors for t in g.tensors) or bool(counts))
    g, left = _text_model(g, arch, text_only, counts)
    if not ollama:
        return g, Read(left_out=left)
    assert lay is not None
    return _translated(g, lay), Read("ollama", left)


def _other_modalities(g: GGUFModel) -> dict[str, int]:
    """The tensors of other modalities than text, counted by prefix (OTHER_MODALITIES)."""
    counts: dict[str, int] = {}
    for t in g.tensors:
        p = next((p for p in OTHER_MODALITIES if t.name.startswith(p)), None)
        if p is not None:
            counts[p] = counts.get(p, 0) + 1
    return counts


def _refuse_unread(g: GGUFModel, arch: str) -> None:
    markers = UNREAD.get(arch, ())
    hit = next((f"{arch}.{m}" for m in markers if f"{arch}.{m}" in g.fields), None)
    hit = hit or next((t.name for t in g.tensors if markers and t.name.startswith(UNREAD_TENSORS)), None)
    if hit is not None:
        raise FormatError(g.path, hit, f"Ollama's {arch} layout (its MTP and vision tensors, per-layer KV heads and "
                                       "value-head order in one file) is not read; llama.cpp's GGUF of the same "
                                       "model imports")


def _text_model(g: GGUFModel, arch: str, text_only: bool,
                counts: dict[str, int]) -> tuple[GGUFModel, tuple[tuple[str, int], ...]]:
    """``g`` without the other modalities' tensors (``counts``: _other_modalities) and keys (``text_only``), or
    refused where it has them."""
    sections = tuple(f"{arch}.{s}" for s in OTHER_SECTIONS)
    keys = [k for k in g.fields if k.startswith(sections)]
    if not counts and not keys:
        return g, ()
    if not text_only:
        first = next((t.name for t in g.tensors if t.name.startswith(tuple(counts))), None) or keys[0]
        what = ", ".join(f"{n} {OTHER_MODALITIES[p]} tensors ({p}*)" for p, n in counts.items()) or f"key {keys[0]}"
        raise FormatError(g.path, first, f"the file holds more than a language model ({what}, as Ollama's "
                                         "multimodal files do); --text-only imports the language model alone, "
                                         "which is all the tools run")
    fields = {k: v for k, v in g.fields.items() if k not in keys}
    tensors = [t for t in g.tensors if not t.name.startswith(tuple(counts))]
    return dataclasses.replace(g, fields=fields, tensors=tensors), tuple(counts.items())


def _translated(g: GGUFModel, lay: Layout) -> GGUFModel:
    src, dst = lay.arch + ".", lay.as_arch + "."
    fields: dict[str, Any] = {}
    renamed = dict(lay.keys)
    for k, v in g.fields.items():
        if k.startswith(src):
            suffix = k[len(src):]
            k = dst + renamed.get(suffix, suffix)
            if k in fields:
                raise FormatError(g.path, src + suffix, f"Ollama's key and llama.cpp's {k} are both in the file")
        fields[k] = v
    fields["general.architecture"] = lay.as_arch
    for key, value in lay.defaults:
        fields.setdefault(dst + key, value)
    for key, like in lay.derived:
        if dst + like in fields:
            fields.setdefault(dst + key, fields[dst + like])
    if lay.pre is not None:
        if "tokenizer.ggml.pretokenizer" in fields:
            raise FormatError(g.path, "tokenizer.ggml.pretokenizer", "a split of the file's own, which the import "
                                                                     "does not read")
        fields["tokenizer.ggml.pre"] = lay.pre
    _check_stops(g, fields)
    tensors = [dataclasses.replace(t, name=_tensor_name(g, t.name, lay)) for t in g.tensors]
    names = {t.name: t for t in tensors}
    if len(names) != len(tensors):
        twice = next(n for n, k in Counter(t.name for t in tensors).items() if k > 1)
        raise FormatError(g.path, f"tensor {twice!r}", "is in the file under Ollama's name and under llama.cpp's")
    for key, tensor in lay.rows_of:
        if tensor in names:
            fields[dst + key] = names[tensor].shape[0]
    return dataclasses.replace(g, fields=fields, tensors=tensors)


def _tensor_name(g: GGUFModel, name: str, lay: Layout) -> str:
    head, _, rest = name.partition(".")
    if head != "blk":
        return next((new + name[len(old):] for old, new in lay.top if name.startswith(old)), name)
    layer, _, part = rest.partition(".")
    if part.startswith(lay.refused):
        raise FormatError(g.path, f"tensor {name!r}", f"Ollama's fused {part.split('.')[0]} (an older converter's "
                                                      "layout) is not read; a current `ollama pull` or llama.cpp's "
                                                      "GGUF of the model imports")
    for old, new in lay.tensors:
        if part == old or (old.endswith(".") and part.startswith(old)):
            return f"blk.{layer}.{new}{part[len(old):]}"
    return name


def _check_stops(g: GGUFModel, fields: dict[str, Any]) -> None:
    """Ollama stops at ``tokenizer.ggml.eos_token_ids`` too: they must be tokens llama.cpp's reading stops at."""
    ids = fields.pop("tokenizer.ggml.eos_token_ids", None)
    if ids is None:
        return
    stops = set(end_of_generation(fields))
    if not isinstance(ids, list) or any(type(i) is not int or i not in stops for i in ids):
        raise FormatError(g.path, "tokenizer.ggml.eos_token_ids", f"{ids!r:.60}: Ollama stops at a token llama.cpp "
                                                                  f"does not ({sorted(stops)!r:.60})")
