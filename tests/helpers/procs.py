"""Process checks shared by the tests that start real processes."""

from __future__ import annotations

import sys
from pathlib import Path


def alive(pid: int) -> bool:
    """Running (a zombie, which nothing reaps in some containers, is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


_DEFAULTS_THEN_EXEC = ("import os, signal, sys\n"
                       "for s in (signal.SIGHUP, signal.SIGINT):\n"
                       "    signal.signal(s, signal.SIG_DFL)\n"
                       "os.execvp(sys.argv[1], sys.argv[1:])\n")


def with_default_stop_signals(cmd: list[str]) -> list[str]:
    """`cmd`, started with the default SIGHUP and SIGINT dispositions. A suite run under
    `nohup` or as a script's `&` job passes those signals down ignored, and the trainer keeps
    a signal ignored at its start ignored (test_ownership.py,
    test_a_signal_ignored_at_start_stays_ignored); a test of what the trainer does on such a
    signal starts it as a terminal would (an exec keeps the dispositions set before it)."""
    return [sys.executable, "-c", _DEFAULTS_THEN_EXEC, *cmd]
