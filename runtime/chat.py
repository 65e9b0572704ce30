"""``ierun generate --chat``: the model's own chat template, rendered.

Instruction-tuned models expect their conversation format (SmolLM2:
``<|im_start|>user ...<|im_end|>``); a bare prompt gets answers of a base
model. The template is the model directory's ``chat_template.jinja``
(where transformers >= 4.50 saves it; copied by hf-to-iebin), else the Jinja
``chat_template`` of its ``tokenizer_config.json`` (copied by hf-to-iebin;
written by gguf-to-iebin from the GGUF's ``tokenizer.chat_template``; of a
list of named ones, "default"), rendered as transformers'
``apply_chat_template`` renders it: a sandboxed Jinja environment with
``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception`` and
``strftime_now``, the special tokens' text as ``bos_token``/``eos_token``,
and ``add_generation_prompt``. The result is tokenized without the
tokenizer's own BOS/EOS (the template writes what the model needs).

A template is a program from whoever made the model: nested loops, huge
string products and gigabyte outputs kept ``generate --chat`` running, and
an exception other than Jinja's own (division by zero, recursion, a bad
``%`` format) was exit 3. So it renders in a child interpreter that cannot
run away: at most ``RENDER_SECONDS`` of wall time and of CPU, ``RENDER_MEMORY``
bytes of address space and ``RENDER_MAX_CHARS`` characters of output; any
failure of the template is one line naming the file it came from.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

CONFIG_NAME = "tokenizer_config.json"
JINJA_NAME = "chat_template.jinja"
RENDER_SECONDS = 10           # wall and CPU time of one rendering
RENDER_MEMORY = 1 << 30       # the renderer's address space
RENDER_MAX_CHARS = 1 << 22    # 4 Mi characters: more than any context holds as tokens


def _token_text(v: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else ""


def load_template(model_dir: Path) -> tuple[str, dict[str, str], Path]:
    """(template source, {bos_token, eos_token}, the file it came from) of
    the model, or one clear error. ``chat_template.jinja``, where transformers >= 4.50 saves the
    template, wins over tokenizer_config.json's, as in transformers."""
    from iekit.formats.errors import FormatError, IEError
    from iekit.formats.fileio import model_file, read_small, read_small_text
    from iekit.formats.jsonio import loads_strict

    path = model_file(model_dir, CONFIG_NAME)
    jinja = model_file(model_dir, JINJA_NAME)
    if path is None and jinja is None:
        raise IEError(f"{model_dir}: no {CONFIG_NAME} or {JINJA_NAME}, so no chat template; drop --chat and give the "
                      "prompt as it should be fed")
    cfg = loads_strict(read_small(path), path) if path is not None else {}
    cfg = cfg if isinstance(cfg, dict) else {}
    if jinja is not None:
        tpl: Any = read_small_text(jinja)
        path = jinja
    else:
        tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}, ...]
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(tpl, str) or not tpl:
        raise FormatError(path, "chat_template", "missing or not a string; this model has no chat template")
    return tpl, {k: _token_text(cfg.get(k)) for k in ("bos_token", "eos_token")}, path


def first_turn(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """The conversation [system?, user: prompt]."""
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": prompt}]


def render(template: str, specials: dict[str, str], messages: list[dict[str, str]], where: str = "chat_template") -> str:
    """The conversation ``messages`` in the template, ready for the
    assistant's turn, rendered by a bounded child (module docstring)."""
    from iekit.formats.errors import IEError

    job = json.dumps({"template": template, "specials": specials, "messages": messages})
    try:
        res = subprocess.run([sys.executable, "-m", "iekit.runtime.chat"], input=job.encode(), capture_output=True,
                             timeout=RENDER_SECONDS, preexec_fn=_limit_child)
    except subprocess.TimeoutExpired:
        raise IEError(f"{where}: the chat template ran for more than {RENDER_SECONDS} s; stopped") from None
    # A child that has a core to itself uses its CPU as fast as the clock runs, so its CPU limit can end it
    # first (SIGXCPU at the soft limit, SIGKILL at the hard one): the same runaway, said the same way.
    if res.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise IEError(f"{where}: the chat template ran for more than {RENDER_SECONDS} s of CPU; stopped")
    try:
        answer = json.loads(res.stdout)
    except ValueError:
        answer = {"error": "the renderer ended without an answer (exit status "
                           f"{res.returncode}: out of its {RENDER_MEMORY >> 20} MiB or {RENDER_SECONDS} s of CPU?)"}
    if "error" in answer:
        raise IEError(f"{where}: the chat template failed: {answer['error']}")
    return answer["text"]


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (RENDER_MEMORY, RENDER_MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (RENDER_SECONDS, RENDER_SECONDS + 1))


def _render_here(template: str, specials: dict[str, str], messages: list[dict[str, str]]) -> str:
    """What the child runs: transformers' environment, streamed, stopped at RENDER_MAX_CHARS."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    out, n = [], 0
    for piece in env.from_string(template).generate(messages=messages, add_generation_prompt=True, **specials):
        n += len(piece)
        if n > RENDER_MAX_CHARS:
            raise TemplateError(f"renders more than {RENDER_MAX_CHARS} characters; stopped")
        out.append(piece)
    return "".join(out)


def _child_main() -> None:
    """Read the job (JSON) on stdin, write {"text": ...} or {"error": ...} on stdout."""
    try:
        job = json.loads(sys.stdin.buffer.read())
        answer = {"text": _render_here(job["template"], job["specials"], job["messages"])}
    except MemoryError:
        answer = {"error": f"needs more than {RENDER_MEMORY >> 20} MiB"}
    except RecursionError:
        answer = {"error": "recursion too deep"}
    except Exception as e:  # whatever the template raised: it is the template's failure
        answer = {"error": f"{type(e).__name__}: {e}" if not type(e).__module__.startswith("jinja2") else str(e)}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    _child_main()
