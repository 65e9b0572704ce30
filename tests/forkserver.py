"""A warm interpreter that runs the console scripts in forked children.

Most of the suite's time went into starting ``ieconv``/``ierun``: each of
~200 runs paid ~0.4 s for the interpreter and the imports of numpy, click
and rich before doing a few milliseconds of work. This server imports those
third-party libraries once and forks a child per run. The child is a
separate process, as a user's run is: its own stdin (/dev/null), stdout and
stderr files, working directory, environment and argv; it imports iekit
itself (fresh, after the environment is set), calls the console script's
entry point, and ends through the interpreter's normal exit (exit status,
atexit, flushing) -- what the installed script does after its imports.

conftest.run_tool uses it only when the run's environment equals the one
this server started with except for the variables read at run time (IE_*,
AFFINITY, PYTEST_CURRENT_TEST); anything else (HF_HUB_CACHE, ...) could be
read while importing, so such a run gets a real process. Set
IEKIT_TEST_REAL_PROCESSES=1 to run every command in a real process.
tests/test_forkserver.py checks that both give the same results.

Protocol (one JSON object per line): request {"argv", "env", "cwd",
"stdout", "stderr", "entry"}; replies {"pid"} at once, then {"status"}
(the raw wait status) when the child has ended.
"""

from __future__ import annotations

import json
import os
import sys

# Third-party modules every command imports, none of which reads the
# variables a test may vary at run time while it is imported.
PRELOAD = ("numpy", "click", "rich.console", "rich.table", "rich.progress", "rich.markup", "jsonschema_rs",
           "zstandard", "tokenizers", "safetensors", "safetensors.numpy")


def _serve(req_fd: int, rep_fd: int) -> dict:
    """Answer requests until EOF; returns (only in a child) its request."""
    inp = os.fdopen(req_fd, "r", encoding="utf-8")
    out = os.fdopen(rep_fd, "w", encoding="utf-8")
    for line in inp:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            inp.close()
            out.close()
            return req
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"status": status}) + "\n")
        out.flush()
    os._exit(0)


def _become(req: dict) -> None:
    """Turn this child into the requested run of a console script."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, flags, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = list(req["argv"])
    sys.path[0] = os.path.dirname(req["argv"][0])  # as for the installed script


if __name__ == "__main__":
    # The installed scripts run with their own directory first on sys.path, never tests/.
    sys.path[0] = os.path.dirname(sys.executable)
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    request = _serve(int(sys.argv[1]), int(sys.argv[2]))
    # In the child from here on.
    _become(request)
    module, _, attr = request["entry"].partition(":")
    main = __import__(module, fromlist=[attr])
    for part in attr.split("."):
        main = getattr(main, part)
    sys.exit(main())
