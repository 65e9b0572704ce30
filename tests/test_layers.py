"""The package's layers depend one way: convert -> formats <- runtime, and cli is plumbing.

Every .py file under convert/, formats/, runtime/ and cli/ is parsed (not
imported), and every import in it (top-level or inside a function, absolute
or relative, ``importlib.import_module("...")`` too) is checked against the
rules below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("cli", "convert", "formats", "runtime")

# folder -> modules it must never import (or import anything inside of)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "runtime": ("iekit.convert",),
    "formats": ("iekit.convert", "iekit.runtime", "iekit.cli", "click", "rich"),
    "cli": ("iekit.convert", "iekit.runtime"),
}

FILES = sorted(p for f in FOLDERS for p in (REPO / f).rglob("*.py"))


def imports(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module of ``package``
    (e.g. 'iekit.formats'). ``from X import y`` yields X and X.y, since y may
    be a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            found.append((node.lineno, mod))
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(source: str, package: str, folder: str) -> list[str]:
    return [f"line {line}: imports {mod}" for line, mod in imports(source, package)
            for bad in FORBIDDEN.get(folder, ()) if mod == bad or mod.startswith(bad + ".")]


def package_of(path: Path) -> str:
    return ".".join(("iekit", *path.relative_to(REPO).parent.parts))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_layering(path):
    folder = path.relative_to(REPO).parts[0]
    bad = violations(path.read_text(), package_of(path), folder)
    assert not bad, f"{path.relative_to(REPO)} ({folder}/ must not import {', '.join(FORBIDDEN[folder])}): {'; '.join(bad)}"


def test_every_folder_is_checked():
    assert {p.relative_to(REPO).parts[0] for p in FILES} == set(FOLDERS)


@pytest.mark.parametrize("folder, source", [
    ("runtime", "from iekit.convert.block_sparse import load_dense"),
    ("runtime", "def f():\n    from ..convert import hf_hub"),
    ("runtime", "import iekit.convert.cli"),
    ("runtime", "from iekit import convert"),
    ("runtime", "importlib.import_module('iekit.convert.casting')"),
    ("formats", "import click"),
    ("formats", "from rich.console import Console"),
    ("formats", "from ..runtime import kernels"),
    ("formats", "from .. import cli"),
    ("formats", "from iekit.cli.support import human_bytes"),
    ("cli", "from iekit.runtime.native import _native"),
    ("cli", "from ..convert import cli"),
])
def test_the_check_catches(folder, source):
    assert violations(source, f"iekit.{folder}", folder)


@pytest.mark.parametrize("folder, source", [
    ("runtime", "from iekit.formats.casting import decode_f32"),
    ("runtime", "from . import kernels\nimport click"),
    ("formats", "from . import quant\nfrom .casting import decode_f32"),
    ("convert", "from iekit.formats import iebin\nfrom iekit.cli.support import run_cli"),
    ("cli", "from iekit.formats.errors import IEError\nimport click"),
])
def test_the_check_allows(folder, source):
    assert not violations(source, f"iekit.{folder}", folder)


def module_of(path: Path) -> str:
    return f"{package_of(path)}.{path.stem}" if path.stem != "__init__" else package_of(path)


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """The cycles among modules ``sources`` (module name -> source) through
    their imports, function-level ones included: a cycle hidden inside a
    function is still two modules that cannot be understood apart."""
    graph = {m: sorted({d for _, d in imports(src, m.rpartition(".")[0]) if d in sources and d != m})
             for m, src in sources.items()}
    cycles, done = [], set()

    def walk(m: str, stack: list[str]) -> None:
        for d in graph[m]:
            if d in stack:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in done:
                walk(d, stack + [d])
        done.add(m)

    for m in sorted(graph):
        if m not in done:
            walk(m, [m])
    return cycles


def test_no_import_cycles():
    sources = {module_of(p): p.read_text() for p in FILES if p.stem != "__init__"}
    cycles = import_cycles(sources)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_catches():
    assert import_cycles({"iekit.formats.a": "from . import b", "iekit.formats.b": "def f():\n    from .a import x"})
    assert not import_cycles({"iekit.formats.a": "from . import b", "iekit.formats.b": "import numpy"})
