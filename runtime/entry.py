"""``ierun``'s console-script entry point ([project.scripts] in pyproject.toml).

Everything, the imports of the command line and the native extension
included, runs inside one ``try``: Ctrl-C at any moment exits 130 with one
line (cli/interrupt.py).
"""

from __future__ import annotations

from iekit.cli.interrupt import run_guarded


def _load_main():
    from iekit.runtime.cli import main

    return main


def main() -> None:
    run_guarded(_load_main)
