"""Reward functions that misbehave on purpose, for tests/test_reliability.py.

Put this folder on PYTHONPATH (or sys.path) and name them as `task.reward=faulty_rewards:NAME`.
Each scores exact match on the answer (the built-in tasks' reward) when it does not misbehave.
Faults are drawn per call from the process's own random generator, so they are independent of
whether the completion is right (as a flaky verifier's are).
"""

from __future__ import annotations

import os
import random
import time

_rng = random.Random(os.getpid() ^ int(time.time() * 1e6))


def _exact(completion, example) -> float:
    return 1.0 if completion.strip() == example.answer.strip() else 0.0


def flaky(prompt, completion, example):
    """Raises on 5% of calls, returns NaN on 5%, hangs on 1%; else exact match."""
    u = _rng.random()
    if u < 0.05:
        raise ValueError(f"flaky verifier failed on {prompt!r}")
    if u < 0.10:
        return float("nan")
    if u < 0.11:
        time.sleep(3600)
    return _exact(completion, example)


def always_raises(prompt, completion, example):
    raise RuntimeError("verifier is down")


def returns_text(prompt, completion, example):
    return "1.0"


def returns_inf(prompt, completion, example):
    return float("inf")


def two_args(prompt, completion):
    return 1.0


def cheap_exact(prompt, completion, example):
    return _exact(completion, example)


cheap_exact.cheap = True


def returns_nan(prompt, completion, example):
    return float("nan")


def scripted(prompt, completion, example):
    """The completion says what to do: ok/wrong score 1/0 against answer 'ok'; raise, nan,
    hang, die (exit 7), str, none misbehave that way."""
    if completion == "raise":
        raise ValueError("scripted failure")
    if completion == "nan":
        return float("nan")
    if completion == "hang":
        time.sleep(3600)
    if completion == "die":
        os._exit(7)
    if completion == "str":
        return "1"
    if completion == "none":
        return None
    return _exact(completion, example)


def raises_10pct(prompt, completion, example):
    """Raises on 10% of calls (no hangs); else exact match."""
    if _rng.random() < 0.10:
        raise ValueError("flaky")
    return _exact(completion, example)
