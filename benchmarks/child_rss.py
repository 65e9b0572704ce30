"""Run a command as a child and measure it: wall seconds and its own peak RSS.

posix_spawn + wait4: ``ru_maxrss`` is the child's own peak. A child forked
from a process that held a lot of memory inherits that peak across exec,
and RUSAGE_CHILDREN reports the largest of all children waited for, so
neither measures one command.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class Failed(SystemExit):
    """The command failed (or was stopped) after ``seconds``; the message holds its stderr."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


def run(cmd: list[str], stderr: Path, stdout: Path | None = None, anon: list[float] | None = None) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of ``cmd``; its stderr (and stdout) go to
    the files given. Failed (a SystemExit), with its stderr, when it fails. With
    ``anon`` (a list), its peak anonymous RSS in MiB is appended, sampled
    from /proc every 0.2 s: the memory it allocated, where ru_maxrss also
    counts the pages of files it mapped (a model's weights), which the
    kernel can drop and read again."""
    actions = [(os.POSIX_SPAWN_OPEN, 2, str(stderr), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
    if stdout is not None:
        actions.append((os.POSIX_SPAWN_OPEN, 1, str(stdout), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    t0 = time.perf_counter()
    pid = os.posix_spawn(cmd[0], cmd, os.environ, file_actions=actions)
    done, peak = threading.Event(), [0.0]
    if anon is not None:
        threading.Thread(target=_sample_anon, args=(pid, done, peak), daemon=True).start()
    _pid, status, usage = os.wait4(pid, 0)
    done.set()
    if anon is not None:
        anon.append(peak[0])
    secs = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise Failed(f"{' '.join(cmd)} failed: {stderr.read_text().strip()}", secs)
    return secs, usage.ru_maxrss / 1024


def _sample_anon(pid: int, done: threading.Event, peak: list[float]) -> None:
    """Track the peak of ``pid``'s RssAnon (MiB) until ``done``."""
    while not done.wait(0.2):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    peak[0] = max(peak[0], int(line.split()[1]) / 1024)
        except (OSError, ValueError):
            return
