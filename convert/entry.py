"""``ieconv``'s console-script entry point ([project.scripts] in pyproject.toml).

Everything, the imports of the command line itself included, runs inside
one ``try``: Ctrl-C at any moment exits 130 with one line (cli/interrupt.py).
"""

from __future__ import annotations

from iekit.cli.interrupt import exit_interrupted


def main() -> None:
    try:
        from iekit.convert.cli import main as run

        run()
    except KeyboardInterrupt:
        exit_interrupted()
