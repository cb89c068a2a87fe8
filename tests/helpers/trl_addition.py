"""A reward function for TRL's own `trl grpo` script on the built-in addition task, for the
tests that profile it as a foreign command (tests/test_command.py).

`exact_or_crash` scores exact matches; it raises when one call scores as many completions as
$RLBATCH_TEST_CRASH_AT says (TRL scores a generation batch, B completions, in one call), so
that the trials of one batch size crash and the others do not. Put this folder on PYTHONPATH
and name it `--reward_funcs trl_addition.exact_or_crash`.
"""

from __future__ import annotations

import os


def exact_or_crash(completions, answer, **kwargs):
    crash_at = int(os.environ.get("RLBATCH_TEST_CRASH_AT", "0"))
    if crash_at and len(completions) == crash_at:
        raise RuntimeError(f"test reward: refusing a batch of {crash_at} completions")
    return [1.0 if c.strip() == a.strip() else 0.0 for c, a in zip(completions, answer)]
