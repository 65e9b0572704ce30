"""``ierun generate --chat``: the model's own chat template, rendered.

Instruction-tuned models expect their conversation format (SmolLM2:
``<|im_start|>user ...<|im_end|>``); a bare prompt gets answers of a base
model. The template is the Jinja ``chat_template`` of the model directory's
``tokenizer_config.json`` (copied by hf-to-iebin; written by gguf-to-iebin
from the GGUF's ``tokenizer.chat_template``), rendered as transformers'
``apply_chat_template`` renders it: a sandboxed Jinja environment with
``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception`` and
``strftime_now``, the special tokens' text as ``bos_token``/``eos_token``,
and ``add_generation_prompt``. The result is tokenized without the
tokenizer's own BOS/EOS (the template writes what the model needs).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from iekit.formats.errors import FormatError, IEError
from iekit.formats.fileio import model_file, read_small

CONFIG_NAME = "tokenizer_config.json"


def _token_text(v: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


def load_template(model_dir: Path) -> tuple[str, dict[str, str]]:
    """(template source, {bos_token, eos_token}) of the model, or one clear error."""
    path = model_file(model_dir, CONFIG_NAME)
    if path is None:
        raise IEError(f"{model_dir}: no {CONFIG_NAME}, so no chat template; drop --chat and give the prompt as it "
                      "should be fed")
    try:
        cfg = json.loads(read_small(path))
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(path, "(file)", f"not valid JSON: {e}") from None
    tpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}, ...]
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(tpl, str) or not tpl:
        raise FormatError(path, "chat_template", "missing or not a string; this model has no chat template")
    return tpl, {k: _token_text(cfg.get(k)) for k in ("bos_token", "eos_token")}


def render(template: str, specials: dict[str, str], prompt: str, system: str | None = None,
           where: str = "chat_template") -> str:
    """The conversation [system?, user: prompt] in the template, ready for the assistant's turn."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": prompt}]
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True, **specials)
    except TemplateError as e:
        raise IEError(f"{where}: the chat template failed: {e}") from None
