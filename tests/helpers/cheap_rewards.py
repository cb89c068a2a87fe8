"""Reward functions declared cheap (`cheap = True`), so rlbatch calls them in the training
process instead of a worker pool; for tests/test_input_messages.py (in-process timeouts).

Put this folder on PYTHONPATH (or sys.path) and name them as `task.reward=cheap_rewards:NAME`.
Each scores exact match on the answer when it does not misbehave.
"""

from __future__ import annotations

import itertools
import os
import signal
import time

_calls = itertools.count(1)


def _exact(completion, example) -> float:
    return 1.0 if completion.strip() == example.answer.strip() else 0.0


def sleepy(prompt, completion, example):
    """Sleeps an hour when the completion is 'hang'; else exact match."""
    if completion == "hang":
        time.sleep(3600)
    return _exact(completion, example)


def swallowing(prompt, completion, example):
    """On 'hang', sleeps in a loop that catches every Exception (a verifier's retry loop)."""
    while completion == "hang":
        try:
            time.sleep(3600)
        except Exception:  # noqa: BLE001, S112 - on purpose: it must not stop the timeout
            continue
    return _exact(completion, example)


def terminates(prompt, completion, example):
    """Sends SIGTERM to its own process (a preemption arriving mid-call), then sleeps."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(3600)
    return 0.0


def hangs_every_50th(prompt, completion, example):
    """Hangs on every 50th call of the process (deterministic); else exact match."""
    if next(_calls) % 50 == 0:
        time.sleep(3600)
    return _exact(completion, example)


for _fn in (sleepy, swallowing, terminates, hangs_every_50th):
    _fn.cheap = True
