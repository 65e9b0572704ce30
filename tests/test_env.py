"""runtime/env.py: the one parser of every IE_* variable, one rule each.

The rules with plain dicts (the bench's warnings, the dedup loader's
errors), the IE_DEDUP=yes regression through every command that reads it,
the variables table against docs/environment.md, and a scan of the sources proving
that nothing else reads an IE_* variable.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from conftest import GOLDEN_IEBIN, REPO, assert_one_line_error, run_tool
from iekit.formats.errors import IEError
from iekit.runtime import env as env_module
from iekit.runtime.dedup import DedupConfig
from iekit.runtime.env import VARIABLES, BenchEnv

ENV_MODULE = REPO / "runtime" / "env.py"
FLAGS_ERROR = ("IE_DEDUP", "IE_DEDUP_STRICT", "IE_DEDUP_DEBUG")
FLAGS_WARN = ("IE_REQUIRE_MODEL", "IE_VERIFY_TOUCH", "IE_TP_USE_AFFINITY")


# ------------------------------------------------- ierun bench's knobs (warn)

def test_env_defaults():
    e = BenchEnv.from_env({})
    assert (e.precision_expected, e.act_prec, e.act, e.affinity, e.bytes_per_token, e.stride_bytes) == \
        (None, "auto", "auto", None, 0, 256)
    assert not (e.require_model or e.verify_touch or e.dedup or e.warnings)


def test_env_supported_values():
    e = BenchEnv.from_env({"IE_PRECISION": "FP16", "IE_ACT_PREC": "int8", "IE_TP_USE_AFFINITY": "1",
                           "AFFINITY": "scatter", "IE_BYTES_PER_TOKEN": "4096", "IE_STRIDE_BYTES": "64",
                           "IE_VERIFY_TOUCH": "1", "IE_DEDUP": "1", "IE_REQUIRE_MODEL": "1"})
    assert (e.precision_expected, e.act, e.affinity, e.bytes_per_token, e.stride_bytes) == \
        ("f16", "int8", "scatter", 4096, 64)
    assert e.verify_touch and e.dedup and e.require_model and not e.warnings
    assert BenchEnv.from_env({"IE_TP_USE_AFFINITY": "1"}).affinity == "auto"


@pytest.mark.parametrize("env, field, value, needle", [
    ({"IE_ACT_PREC": "fp8"}, "act", "auto", "IE_ACT_PREC=fp8: not supported, using auto"),
    ({"IE_ACT_PREC": "int3"}, "act", "auto", "unknown"),
    ({"IE_PRECISION": "int2"}, "precision_expected", None, "IE_PRECISION='int2'"),
    ({"IE_STRIDE_BYTES": "0"}, "stride_bytes", 256, "IE_STRIDE_BYTES"),
    ({"IE_BYTES_PER_TOKEN": "lots"}, "bytes_per_token", 0, "IE_BYTES_PER_TOKEN"),
    ({"IE_TP_USE_AFFINITY": "1", "AFFINITY": "spread"}, "affinity", None, "AFFINITY='spread'"),
    ({"AFFINITY": "compact"}, "affinity", None, "without IE_TP_USE_AFFINITY=1"),
    ({"IE_VERIFY_TOUCH": "yes"}, "verify_touch", False, "IE_VERIFY_TOUCH"),
])
def test_env_unsupported_values_warn_and_are_ignored(env, field, value, needle):
    e = BenchEnv.from_env(env)
    assert getattr(e, field) == value
    assert len(e.warnings) == 1 and needle in e.warnings[0]
    if "IE_ACT_PREC" in env:
        assert e.act_prec == env["IE_ACT_PREC"]  # reported as requested


def test_precision_warning_and_model_error():
    e = BenchEnv.from_env({"IE_PRECISION": "int4w"})
    assert e.precision_warning(("int4w",)) is None
    assert "stored as int4w, f32 (only some are int4w)" in e.precision_warning(("int4w", "f32"))
    assert "(only some" not in e.precision_warning(("f16",))
    assert BenchEnv().precision_warning(("f32",)) is None
    assert "no stub mode" in BenchEnv().model_error("m", "gone")
    assert BenchEnv(require_model=True).model_error("m", "gone").startswith("IE_REQUIRE_MODEL=1:")


# ---------------------------------------------------- the dedup loader's (error)

def test_env_config():
    env = {"IE_DEDUP": "1", "IE_DEDUP_STRICT": "1", "IE_DEDUP_CACHE_MB": "12.5", "IE_DEDUP_DEBUG": "1",
           "IE_DEDUP_POLICY": "lossless"}
    assert DedupConfig.from_env(env) == DedupConfig(True, True, "lossless", 12.5, True)
    assert DedupConfig.from_env({}) == DedupConfig()
    for k, v, needle in (("IE_DEDUP", "yes", "expected 0 or 1"), ("IE_DEDUP_POLICY", "lossy", "only 'lossless'"),
                         ("IE_DEDUP_CACHE_MB", "-1", "MiB"), ("IE_DEDUP_CACHE_MB", "lots", "MiB"),
                         ("IE_DEDUP_STRICT", "2", "expected 0 or 1")):
        with pytest.raises(IEError, match=needle):
            DedupConfig.from_env({k: v})


# ------------------------------------------------------------- one rule each

@pytest.mark.parametrize("name", FLAGS_ERROR + FLAGS_WARN)
@pytest.mark.parametrize("raw, value", [("", False), ("0", False), ("1", True), (" 1 ", True), ("\t0\n", False)])
def test_every_flag_has_the_same_grammar(name, raw, value):
    """0/1, blanks around ignored, empty = unset, for every flag alike."""
    env = {name: raw}
    b = BenchEnv.from_env(env)
    assert not b.warnings
    got = {"IE_DEDUP": b.dedup, "IE_DEDUP_STRICT": DedupConfig.from_env(env).strict,
           "IE_DEDUP_DEBUG": DedupConfig.from_env(env).debug, "IE_REQUIRE_MODEL": b.require_model,
           "IE_VERIFY_TOUCH": b.verify_touch, "IE_TP_USE_AFFINITY": b.affinity is not None}[name]
    assert got is value


@pytest.mark.parametrize("raw", ["yes", "true", "2", "on", "01"])
@pytest.mark.parametrize("name", FLAGS_ERROR)
def test_malformed_dedup_flag_is_the_same_error_for_every_reader(name, raw):
    """IE_DEDUP=yes was "treated as 0" by the bench and an error for the
    decoder it then loaded; now one rule: an error, whoever reads it."""
    message = f"{name}={raw!r}: expected 0 or 1"
    for reader in (DedupConfig.from_env, BenchEnv.from_env):
        with pytest.raises(IEError) as e:
            reader({name: raw})
        assert str(e.value) == message


@pytest.mark.parametrize("raw", ["yes", "2"])
@pytest.mark.parametrize("name", FLAGS_WARN)
def test_malformed_bench_flag_warns_and_means_0(name, raw):
    e = BenchEnv.from_env({name: raw})
    assert e.warnings == (f"{name}={raw!r}: expected 0 or 1; treated as 0",)
    assert not (e.require_model or e.verify_touch or e.affinity)


def test_every_variable_has_one_rule_in_the_table():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    assert {v.rule for v in VARIABLES} <= {"error", "warn", "cli", "native"}
    assert {v.name for v in VARIABLES if v.rule == "error"} == set(FLAGS_ERROR) | {"IE_DEDUP_POLICY",
                                                                                    "IE_DEDUP_CACHE_MB", "IE_GGUF_CACHE"}
    # each variable has one function in the module (IE_DEBUG and IE_ISA are read elsewhere)
    for v in VARIABLES:
        if v.rule in ("error", "warn") and v.name not in ("AFFINITY", "IE_TP_USE_AFFINITY"):
            assert callable(getattr(env_module, v.name.lower())), v.name
    assert callable(env_module.ie_affinity)


def _table_names(text: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, text, flags=re.M))


def test_documented_and_docstring_tables_list_every_variable():
    names = {v.name for v in VARIABLES}
    table = (REPO / "docs" / "environment.md").read_text()
    assert _table_names(table, r"^\| `((?:IE_)?[A-Z_]+)` \|") == names
    assert "runtime/bench_env.py" not in table
    assert "docs/environment.md" in (REPO / "README.md").read_text()
    doc = env_module.__doc__
    assert _table_names(doc, r"^((?:IE_)?[A-Z][A-Z_]+) +\S") >= names
    for v in VARIABLES:  # the rule column of the docstring table
        assert re.search(rf"^{v.name} .* {v.rule}$", doc, flags=re.M), v.name


# ------------------------------------------------ IE_DEDUP=yes, as a user runs it

@pytest.mark.parametrize("argv", [
    ("bench", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--max-new", "1", "--rounds", "1", "--bandwidth-mb", "1"),
    ("generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1", "--max-new", "1"),
    ("verify", "quant", "--model-dir", GOLDEN_IEBIN / "tiny-llama-mixedq"),
    ("verify", "dedup", "--model-dir", GOLDEN_IEBIN / "tiny-llama"),
], ids=["bench", "generate", "verify-int4", "verify-dedup"])
def test_ie_dedup_yes_is_one_error_line_for_every_command(argv):
    res = run_tool("ierun", *argv, env={**os.environ, "IE_DEDUP": "yes"})
    assert_one_line_error(res, "IE_DEDUP='yes': expected 0 or 1")
    assert res.stderr == "error: IE_DEDUP='yes': expected 0 or 1\n"  # no "treated as 0" warning first
    assert not res.stdout


# ----------------------------------------------------------- the source scan

def _package_dirs() -> list[Path]:
    """The folders the iekit package is assembled from (pyproject.toml), and benchmarks/."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[tool.scikit-build.wheel.packages]", 1)[1].split("\n[", 1)[0]
    dirs = [REPO / d for d in re.findall(r'^"iekit/[^"]+"\s*=\s*"([^"]+)"', section, flags=re.M)]
    assert {"convert", "formats", "runtime"} <= {d.name for d in dirs}
    return dirs + [REPO / "benchmarks"]


ENV_NAME = re.compile(r"^(IE_[A-Z0-9_]*|AFFINITY)$")
ENV_READ = re.compile(r"(environ|getenv)\b.*\bIE_|\bIE_\w*\b.*\bin\s+(os\.)?environ\b")


def env_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for every way the source could read an IE_* variable:
    an environ/getenv access naming IE_ on its line, or any string constant
    that is exactly a variable name (the name handed to a reader elsewhere).
    Docstrings and messages only embed names, so they do not count."""
    found = [(n, line.strip()) for n, line in enumerate(source.splitlines(), 1) if ENV_READ.search(line)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_NAME.match(node.value):
            found.append((node.lineno, node.value))
    return found


def _allowed(path: Path, what: str) -> bool:
    if path == ENV_MODULE:
        return True
    # The CLI plumbing's error handler reads IE_DEBUG (cli/support.py).
    cli_plumbing = path.parent.name == "cli"
    return cli_plumbing and "IE_DEBUG" in what and not re.search(r"IE_(?!DEBUG\b)", what)


def test_the_scan_finds_every_kind_of_read():
    for snippet in ('os.environ.get("IE_FOO")', "os.getenv('IE_BAR', '0')", 'environ["IE_X"]',
                    'v = os.environ[f"IE_{name}"]', 'NAME = "IE_Y"', 'k = "AFFINITY"', 'if "IE_Z" in os.environ: pass'):
        assert env_reads(snippet), snippet
    assert not env_reads('"""IE_DEDUP=1 serves grouped tensors."""\nraise E(f"IE_X={v!r}: bad")\n'
                         'x = os.environ.get("HOME")\n')


def test_only_the_env_module_reads_ie_variables():
    offenders, debug_readers = [], set()
    for d in _package_dirs():
        for path in sorted(d.rglob("*.py")):
            for line, what in env_reads(path.read_text(encoding="utf-8")):
                if not _allowed(path, what):
                    offenders.append(f"{path.relative_to(REPO)}:{line}: {what}")
                elif path != ENV_MODULE:
                    debug_readers.add(path)
    assert not offenders, "IE_* variables are parsed in runtime/env.py only:\n" + "\n".join(offenders)
    assert len(debug_readers) <= 1, debug_readers  # IE_DEBUG has one reader too
    assert env_reads(ENV_MODULE.read_text())  # the scan does see the env module's reads


def test_native_code_reads_ie_isa_only():
    """IE_ISA is the native library's; no other IE_* variable is read in C++."""
    names = set()
    for path in (REPO / "csrc").rglob("*"):
        if path.suffix in (".cpp", ".h", ".cu", ".cuh", ".hpp"):
            names |= set(re.findall(r'getenv\(\s*"([A-Z0-9_]+)"', path.read_text(encoding="utf-8", errors="replace")))
    assert names == {"IE_ISA"}
