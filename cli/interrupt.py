"""Ctrl-C, at any moment: exit 130 with one line, never a traceback.

Imports nothing but the standard library's builtins, so the console-script
entry points (convert/entry.py, runtime/entry.py) can import it before
anything else and catch a KeyboardInterrupt that arrives while the tool is
still importing click, rich, numpy or the native extension.
"""

from __future__ import annotations

import _thread
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
        _GUARD["on"] = True
        if _GUARD["pending"]:  # (a Ctrl-C that landed in a finalizer before this: _redeliver_interrupts)
            raise KeyboardInterrupt
        main = _import_quickly(load_main)
        main()
    except KeyboardInterrupt:
        exit_interrupted()
    except Exception as e:
        if _caused_by_interrupt(e):
            exit_interrupted()
        raise
    finally:
        _ignore_sigint()


def _caused_by_interrupt(e: BaseException) -> bool:
    """Whether Ctrl-C is behind ``e``: Python wraps some exceptions in others,
    a KeyboardInterrupt included (3.11 turns one raised while a class body's
    ``__set_name__`` runs, as in a dataclass being defined during an import,
    into a RuntimeError), so the chain of causes is searched."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


# Whether run_guarded has started (after which an interrupt delivered again lands inside it), and whether a Ctrl-C
# landed in a finalizer before that: run_guarded raises it as it starts. Process-wide, as the SIGINT handler is.
_GUARD = {"on": False, "pending": False}


def _redeliver_interrupts(previous):
    """A ``sys.unraisablehook`` for Ctrl-C that lands where Python cannot raise
    it: in a weakref callback or a ``__del__`` (importlib runs one for every
    module lock it drops, so start-up is full of them). Python would print
    "Exception ignored in ..." with a traceback and go on running the command;
    this delivers the interrupt again instead, so ordinary code raises
    KeyboardInterrupt where ``run_guarded`` catches it. From a new thread:
    delivered in the hook, it would be raised in the hook (and ignored again);
    that thread needs the GIL, which it gets once the hook has returned (the
    hook does not wait for it). Before run_guarded has started, that thread
    could raise it in the entry point's own code, outside run_guarded (a CI
    run on a loaded machine saw it): then it is kept for run_guarded to raise.
    Anything else goes to ``previous``."""

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            if not _GUARD["on"]:
                _GUARD["pending"] = True
                return
            try:  # interrupt_main: a no-op once SIGINT is ignored (the command has finished)
                _thread.start_new_thread(_thread.interrupt_main, ())
            except RuntimeError:  # the interpreter is shutting down: nothing left to interrupt
                pass
        else:
            previous(unraisable)

    return hook


# Installed as this module is imported, which the entry points do first:
# the module locks of the imports before run_guarded (this module's own,
# its caller's) are dropped through weakref callbacks too, and a CI run
# whose start-up was slowed by the load saw a SIGINT land in one of those.
sys.unraisablehook = _redeliver_interrupts(sys.unraisablehook)

# Until here, cli/00-iekit-interrupt.pth's handler stood in (exit 130 at once,
# nothing to clean up yet); from here Ctrl-C is Python's KeyboardInterrupt,
# which run_guarded turns into the same exit after the cleanup. (A SIGINT
# ignored by the parent, as under nohup, stays ignored.)
if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, signal.SIG_IGN, signal.SIG_DFL, None):
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
