"""``ierun generate``'s sampling options, --ignore-eos, --chat and its
output (no EOS text, speed on stderr), against independent restatements of
llama.cpp's and transformers' rules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import BIN_DIR, GOLDEN_HF, GOLDEN_IEBIN, SMOLLM2_GGUF, assert_one_line_error, needs_smollm2, run_tool

from iekit.runtime.sampling import Sampler, generate


def _penalized(logits: np.ndarray, history: list[int], penalty: float, last_n: int) -> np.ndarray:
    """llama.cpp's llama_sampler_penalties, repeat part, element by element."""
    out = logits.astype(np.float64).copy()
    for t in set(history[-last_n:]):
        out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
    return out


def test_repeat_penalty_follows_llama_cpp():
    rng = np.random.default_rng(0)
    for _ in range(200):
        logits = rng.normal(size=50).astype(np.float32)
        history = [int(i) for i in rng.integers(0, 50, rng.integers(1, 80))]
        s = Sampler(repeat_penalty=1.3, repeat_last_n=16)
        assert s(logits, history) == int(np.argmax(_penalized(logits, history, 1.3, 16)))
    logits = np.array([0.0, 2.0, 1.9], np.float32)
    assert Sampler(repeat_penalty=1.1)(logits, [1]) == 2  # 2.0 / 1.1 < 1.9
    assert Sampler(repeat_penalty=1.1, repeat_last_n=0)(logits, [1]) == 1


def _allowed(logits: np.ndarray, temp: float, top_k: int, top_p: float, min_p: float) -> set[int]:
    """transformers' warpers in order: temperature, top-k, top-p, min-p."""
    z = logits.astype(np.float64) / temp
    if top_k:
        z[z < np.sort(z)[-top_k]] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    drop = order[(cum - p[order]) >= top_p]  # tokens after the mass is reached
    p[drop] = 0
    p /= p.sum()
    if min_p:
        p[p < min_p * p.max()] = 0
    return {int(i) for i in np.nonzero(p)[0]}


@pytest.mark.parametrize("top_k, top_p, min_p", [(3, 1.0, 0.0), (0, 0.6, 0.0), (0, 1.0, 0.2), (5, 0.8, 0.1)])
def test_filters_sample_only_what_transformers_keeps(top_k, top_p, min_p):
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=2, size=40).astype(np.float32)
    allowed = _allowed(logits, 0.8, top_k, top_p, min_p)
    s = Sampler(temp=0.8, top_k=top_k, top_p=top_p, min_p=min_p, seed=3)
    seen = {s(logits) for _ in range(2000)}
    assert seen == allowed  # every kept token turns up in 2000 draws, no other does


def test_top_k_1_and_tiny_min_p_mass_are_greedy():
    from iekit.runtime.decoder import Decoder

    d = Decoder(GOLDEN_IEBIN / "tiny-llama")
    greedy = generate(d, [1, 2, 3], 8, Sampler())
    assert generate(d, [1, 2, 3], 8, Sampler(temp=1.5, top_k=1, seed=2)) == greedy
    assert generate(d, [1, 2, 3], 8, Sampler(temp=1.5, min_p=0.999, seed=2)) == greedy


@pytest.mark.parametrize("kw, needle", [({"top_k": -1}, "--top-k"), ({"min_p": 1.0}, "--min-p"),
                                         ({"repeat_penalty": 0.0}, "--repeat-penalty")])
def test_bad_sampler_settings(kw, needle):
    from iekit.formats.errors import IEError

    with pytest.raises(IEError, match=needle):
        Sampler(**kw)


def test_generate_cli_options_and_speed_line():
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "5,6,7", "--max-new", "6",
                   "--temp", "0.9", "--top-k", "20", "--min-p", "0.05", "--repeat-penalty", "1.2", "--seed", "4",
                   "--ignore-eos", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out["generated_ids"]) == 6 and out["stopped_at_eos"] is False and res.stderr == ""
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "5", "--max-new", "3")
    assert res.returncode == 0 and "tok/s" in res.stderr and "tok/s" not in res.stdout
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "5", "--system", "x")
    assert res.returncode == 2


def test_generate_takes_llama_cli_short_flags():
    """-m, -p and -n as llama-cli spells them: the same run as the long flags."""
    model = GOLDEN_IEBIN / "tiny-llama"
    long = run_tool("ierun", "generate", "--model-dir", model, "--prompt", "hello world", "--max-new", "5",
                    "--ignore-eos", "--json")
    short = run_tool("ierun", "generate", "-m", model, "-p", "hello world", "-n", "5", "--ignore-eos", "--json")
    assert long.returncode == 0 and short.returncode == 0, long.stderr + short.stderr
    assert json.loads(short.stdout) == json.loads(long.stdout) and len(json.loads(long.stdout)["generated_ids"]) == 5


# -- chat templates ------------------------------------------------------------------

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[SYS]{{ m['content'] }}\n"
            "{% else %}<{{ m['role'] }}>{{ m['content'] | trim }}</{{ m['role'] }}>\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _chat_model(tmp_path: Path, template) -> Path:
    """golden tiny-llama with ``template`` in its tokenizer_config.json, converted as a user would."""
    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-llama", hf)
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": {"content": "<s>"},
                                                          "eos_token": "</s>"}))
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "m", "-q")
    assert res.returncode == 0, res.stderr
    return tmp_path / "m"


def test_chat_renders_like_transformers(tmp_path):
    """The rendered text, tokenized without added specials, is the prompt:
    checked against the same template rendered by a plain jinja2 sandbox
    with transformers' settings."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer

    d = _chat_model(tmp_path, TEMPLATE)
    res = run_tool("ierun", "generate", "--model-dir", d, "--chat", "--prompt", " hi there ", "--system", "be brief",
                   "--max-new", "2", "--json")
    assert res.returncode == 0, res.stderr
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(TEMPLATE).render(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": " hi there "}],
        add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    assert text == "<s>[SYS]be brief\n<user>hi there</user>\n<assistant>"
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert json.loads(res.stdout)["prompt_ids"] == tok.encode(text, add_special_tokens=False).ids


def test_chat_template_jinja_is_the_template_everywhere(tmp_path):
    """A checkpoint saved by transformers >= 4.50 keeps its template in
    chat_template.jinja (gpt-oss does): hf-to-iebin carries it, generate
    --chat renders it (over tokenizer_config.json's, as transformers does)
    and iebin-to-gguf writes it as tokenizer.chat_template, so LM Studio and
    Ollama see it; a template file that is not UTF-8 is one line."""
    import gguf

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-llama", hf)
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": "old {{ messages }}",
                                                          "bos_token": "<s>", "eos_token": "</s>"}))
    (hf / "chat_template.jinja").write_text(TEMPLATE)
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "m", "-q").returncode == 0
    res = run_tool("ierun", "generate", "--model-dir", tmp_path / "m", "--chat", "--prompt", "hi", "--max-new", "1",
                   "--json")
    assert res.returncode == 0, res.stderr
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "m/tokenizer.json"))
    want = tok.encode("<s><user>hi</user>\n<assistant>", add_special_tokens=False).ids
    assert json.loads(res.stdout)["prompt_ids"] == want
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "m", "--out", tmp_path / "m.gguf", "-q")
    assert res.returncode == 0, res.stderr
    assert gguf.GGUFReader(str(tmp_path / "m.gguf")).fields["tokenizer.chat_template"].contents() == TEMPLATE
    (hf / "chat_template.jinja").write_bytes(b"{{ 'caf\xe9' }}")
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "m2", "-q").returncode == 0
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", tmp_path / "m2", "--chat", "--prompt", "x"),
                          "chat_template.jinja", "not valid UTF-8 at byte 7")


def test_named_chat_templates_go_both_ways(tmp_path):
    """A GGUF's named templates (tokenizer.chat_template.NAME, as gguf-py
    writes tool_use and the like) were dropped on import; now they are
    transformers' list in tokenizer_config.json, --chat renders the default
    one, and an export writes every key back as it was."""
    import gguf
    from gguf_build import gguf_from_hf

    kv = {"tokenizer.chat_template": ("string", TEMPLATE), "tokenizer.chat_template.tool_use": ("string", "T {{ 1 }}")}
    src = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", extra_kv=kv)
    assert run_tool("ieconv", "gguf-to-iebin", "--gguf", src, "--out-dir", tmp_path / "m", "-q").returncode == 0
    cfg = json.loads((tmp_path / "m/tokenizer_config.json").read_text())
    assert cfg["chat_template"] == [{"name": "default", "template": TEMPLATE}, {"name": "tool_use", "template": "T {{ 1 }}"}]
    res = run_tool("ierun", "generate", "--model-dir", tmp_path / "m", "--chat", "--prompt", "hi", "--max-new", "1")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "m", "--out", tmp_path / "b.gguf", "-q")
    assert res.returncode == 0, res.stderr
    fields = gguf.GGUFReader(str(tmp_path / "b.gguf")).fields
    assert fields["tokenizer.chat_template"].contents() == TEMPLATE
    assert fields["tokenizer.chat_template.tool_use"].contents() == "T {{ 1 }}"
    assert fields["tokenizer.chat_templates"].contents() == ["tool_use"]


@pytest.mark.parametrize("template, needle", [
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ("{% for %}", "chat template failed"),
    (None, "chat_template"),
    # what a template can raise besides Jinja's own errors (each was exit 3)
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion too deep"),
    ("{{ raise_exception() }}", "TypeError"),
    ("{{ '%d' % 'x' }}", "format"),
    # templates that ran away (each kept generate --chat running, or ate the memory)
    ("{{ 'x' * 10**10 }}", "needs more than"),
    ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "renders more than"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran for more than"),
])
def test_chat_template_errors_are_one_line(tmp_path, template, needle):
    d = _chat_model(tmp_path, template)
    res = run_tool("ierun", "generate", "--model-dir", d, "--chat", "--prompt", "x", timeout=60)
    assert_one_line_error(res, needle, "tokenizer_config.json")


@pytest.mark.parametrize("edit", [
    {"truncation": {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 5}},
    {"normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAA"}},
    {"normalizer": {"type": "Replace", "pattern": {"String": ""}, "content": "x"}},
    {"pre_tokenizer": {"type": "FixedLength", "length": 0}},
])
def test_a_tokenizer_that_panics_is_one_line(tmp_path, edit):
    """Each panics inside the Rust tokenizers library: pyo3's PanicException
    (a BaseException) and Rust's own backtrace on stderr were 38 lines."""
    hf, d = tmp_path / "hf", tmp_path / "m"
    shutil.copytree(GOLDEN_HF / "tiny-llama", hf)
    tok = json.loads((hf / "tokenizer.json").read_text())
    tok.update(edit)
    (hf / "tokenizer.json").write_text(json.dumps(tok))
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", d, "-q").returncode == 0
    res = run_tool("ierun", "generate", "--model-dir", d, "--prompt", "hello world abc", "--max-new", "1",
                   env={**os.environ, "RUST_BACKTRACE": "1"})
    assert_one_line_error(res, str(d / "tokenizer.json"), "failed")


def test_chat_without_a_prompt_is_a_conversation_on_standard_input(tmp_path):
    """Each line is the next user message, answered in the conversation so
    far: the second turn's prompt holds the first turn and its answer, and
    only the new turn is computed (the cached prefix is reused)."""
    d = _chat_model(tmp_path, TEMPLATE)
    res = subprocess.run([str(BIN_DIR / "ierun"), "generate", "--model-dir", str(d), "--chat", "--max-new", "3",
                          "--ignore-eos", "--system", "be brief"], input="hi there\n\nand again\n",
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    turns = [ln for ln in res.stderr.splitlines() if ln.startswith("[")]
    assert len(turns) == 2 and all("3 generated" in t for t in turns), res.stderr
    first, second = (int(t[1:].split()[0]) for t in turns)
    assert second > first + 3  # the first turn, its 3-token answer and the new message
    usage = run_tool("ierun", "generate", "--model-dir", d, "--chat", "--json")
    assert usage.returncode == 2 and "--json needs --prompt" in usage.stderr


def test_chat_without_a_template_is_one_line():
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-mistral", "--chat",
                                   "--prompt", "x"), "chat_template", "no chat template")
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN.parent / "gguf" / "tiny-llama-mixed",
                                   "--chat", "--prompt", "x"), "no tokenizer_config.json")




@needs_smollm2
def test_real_smollm2_chat(tmp_path):
    """The GGUF's chat template comes through gguf-to-iebin; SmolLM2-Instruct
    answers in its own format and stops at <|im_end|>, which is not printed."""
    gguf = SMOLLM2_GGUF
    assert run_tool("ieconv", "gguf-to-iebin", "--gguf", gguf, "--out-dir", tmp_path / "m", "-q").returncode == 0
    cfg = json.loads((tmp_path / "m/tokenizer_config.json").read_text())
    assert "<|im_start|>" in cfg["chat_template"] and cfg["eos_token"] == "<|im_end|>"
    # f32 activations: the greedy first token is a near tie (0.08 logits) that int8 activations
    # (the default for 4-bit weights) flip; this test is about the template and EOS.
    args = ("--model-dir", tmp_path / "m", "--chat", "--prompt", "What is the capital of France?", "--max-new", "40",
            "--act", "f32")
    res = run_tool("ierun", "generate", *args, "--json")
    out = json.loads(res.stdout)
    assert out["stopped_at_eos"] and "Paris" in out["text"] and "<|im_end|>" not in out["text"]
    res = run_tool("ierun", "generate", *args)
    assert "Paris" in res.stdout and "<|im_end|>" not in res.stdout


def test_prompts_file_runs_each_prompt_like_a_single_run(tmp_path):
    """Text and 'ids:' lines (blank ones skipped), one model load: each JSON
    line is what the same prompt gives alone; --chat refuses 'ids:' lines."""
    f = tmp_path / "p.txt"
    f.write_text("The capital of France is\n\nids: 5, 6, 7\n  Paris\n")
    args = ("--model-dir", GOLDEN_IEBIN / "tiny-llama", "--max-new", "5", "--json")
    res = run_tool("ierun", "generate", *args, "--prompts-file", f)
    assert res.returncode == 0, res.stderr
    got = [json.loads(ln) for ln in res.stdout.splitlines()]
    alone = [json.loads(run_tool("ierun", "generate", *args, *a).stdout)
             for a in (("--prompt", "The capital of France is"), ("--ids", "5,6,7"), ("--prompt", "Paris"))]
    assert got == alone
    text = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--max-new", "3",
                    "--prompts-file", f)
    assert [ln for ln in text.stdout.splitlines() if ln.startswith("### ")] == \
        [f"### {f}:1: The capital of France is", f"### {f}:3: ids", f"### {f}:4: Paris"]
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", _chat_model(tmp_path, TEMPLATE), "--chat",
                                   "--prompts-file", f), "p.txt:3", "not 'ids:' lines")
    assert run_tool("ierun", "generate", *args, "--prompts-file", f, "--prompt", "x").returncode == 2


def test_prompts_file_is_checked_before_anything_runs(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("ids: 5, 6\nids: " + ", ".join(["7"] * 30) + "\n")
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--prompts-file", f,
                   "--ctx", "16", "--max-new", "4")
    assert_one_line_error(res, "p.txt:2")
    assert res.stdout == ""  # the first prompt did not run either


# -- llama.cpp habits ------------------------------------------------------------------

def test_prompt_dash_reads_standard_input():
    args = [str(BIN_DIR / "ierun"), "generate", "--model-dir", str(GOLDEN_IEBIN / "tiny-llama"), "--max-new", "3",
            "--json"]
    piped = subprocess.run([*args, "--prompt", "-"], input="hello world\n", capture_output=True, text=True,
                           timeout=300)
    given = subprocess.run([*args, "--prompt", "hello world\n"], capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout) == json.loads(given.stdout)
    bad = subprocess.run([*args, "--prompt", "-"], input=b"\xff\xfe", capture_output=True, timeout=300)
    assert bad.returncode == 1 and b"not UTF-8" in bad.stderr


@pytest.mark.parametrize("opt", [("--temp", "-1"), ("--top-p", "0"), ("--min-p", "1"), ("--temp", "nan")])
def test_sampling_values_out_of_range_are_usage_errors(opt):
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1", *opt)
    assert res.returncode == 2 and opt[0] in res.stderr, res.stderr


def test_help_names_every_architecture_the_decoder_runs():
    from iekit.formats.model_spec import ARCHITECTURES

    text = " ".join(run_tool("ierun", "generate", "--help").stdout.split())
    for a in ARCHITECTURES:
        assert a.removesuffix("ForCausalLM") in text, a
