"""Ctrl-C, at any moment: exit 130 with one line, never a traceback.

Imports nothing but the standard library's builtins, so the console-script
entry points (convert/entry.py, runtime/entry.py) can import it before
anything else and catch a KeyboardInterrupt that arrives while the tool is
still importing click, rich, numpy or the native extension.
"""

from __future__ import annotations

import gc
import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def _ignore_sigint() -> None:
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):  # not the main thread
        pass


def run_guarded(load_main) -> None:
    """The console scripts' body: ``load_main()`` imports the command line
    and returns its main, which runs; Ctrl-C at any moment of either exits
    130. Once the command has finished (or is failing), Ctrl-C is ignored:
    otherwise one arriving during the interpreter's shutdown would turn a
    finished run into death by SIGINT."""
    try:
        main = _import_quickly(load_main)
        main()
    except KeyboardInterrupt:
        exit_interrupted()
    finally:
        _ignore_sigint()


def _import_quickly(load_main):
    """``load_main()`` with the cyclic garbage collector off, then every object
    it made frozen. Why: importing click, rich, numpy and iekit makes ~30k
    objects that live until exit; the collector's passes over them while
    importing free nothing, and frozen, no later collection (the interpreter's
    last one at exit included) walks them again."""
    gc.disable()
    try:
        main = load_main()
    finally:
        gc.enable()
    gc.freeze()
    return main


def exit_interrupted() -> None:
    """Ignore further Ctrl-C (a second one must not interrupt the exit with
    a traceback), say so on stderr, exit 130."""
    _ignore_sigint()
    try:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(EXIT_INTERRUPTED)
