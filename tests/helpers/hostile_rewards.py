"""Reward functions that misbehave against the trainer itself, for tests/test_ownership.py
(issue 32): escape codes in their errors, exiting, interrupting, forking.

Put this folder on PYTHONPATH (or sys.path) and name them `task.reward=hostile_rewards:NAME`.
Functions whose name ends in `_cheap` are declared cheap (they run in the training process).
A function that starts a child writes the child's PID to a file in $HOSTILE_PIDS (a folder).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ESCAPE = "\x1b[2J\x1b[31mFAKE: all good\r"


def _exact(completion, example) -> float:
    return 1.0 if completion.strip() == example.answer.strip() else 0.0


def escape(prompt, completion, example):
    raise RuntimeError(ESCAPE)


def exits_0(prompt, completion, example):
    raise SystemExit(0)


def exits_3(prompt, completion, example):
    raise SystemExit(3)


def interrupts(prompt, completion, example):
    raise KeyboardInterrupt


def escape_cheap(prompt, completion, example):
    raise RuntimeError(ESCAPE)


def exits_0_cheap(prompt, completion, example):
    raise SystemExit(0)


def interrupts_cheap(prompt, completion, example):
    raise KeyboardInterrupt


def os_exit_cheap(prompt, completion, example):
    os._exit(0)


for _fn in (escape_cheap, exits_0_cheap, interrupts_cheap, os_exit_cheap):
    _fn.cheap = True

_started: list[int] = []


def _start_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                             stdin=subprocess.DEVNULL)
    folder = os.environ.get("HOSTILE_PIDS")
    if folder:
        with open(os.path.join(folder, f"{child.pid}"), "w") as f:
            f.write(str(os.getpid()))
    _started.append(child.pid)


def forks(prompt, completion, example):
    """Starts a child that sleeps an hour (once per worker process); else exact match."""
    if not _started:
        _start_child()
    return _exact(completion, example)


def forks_then_hangs(prompt, completion, example):
    """Starts a child, then hangs: the worker is killed and replaced at its timeout."""
    _start_child()
    time.sleep(3600)
