"""``ieconv``'s console-script entry point ([project.scripts] in pyproject.toml).

Everything, the imports of the command line itself included, runs inside
one ``try``: Ctrl-C at any moment exits 130 with one line (cli/interrupt.py).
"""

from __future__ import annotations

from iekit.cli.interrupt import run_guarded


def _load_main():
    from iekit.convert.cli import main

    return main


def main() -> None:
    run_guarded(_load_main)


if __name__ == "__main__":  # ieconv quantize runs its stages as `python -m iekit.convert.entry ...`
    main()
