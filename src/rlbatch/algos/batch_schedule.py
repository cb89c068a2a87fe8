"""Batch schedules: the training batch B as a function of cumulative samples (stepwise), or
raised when the measured gradient noise scale says a larger batch would still be efficient
(adaptive). Pure functions of numbers; the trainer keeps the state (docs/design.md, "Batch
schedules").

Theory (McCandlish et al. 2018, Sec. 2-3): a batch well below the noise scale
B_simple = tr(Sigma) / |G|^2 wastes optimizer steps, one well above it wastes samples; the
critical batch grows as training progresses (Merrill et al. 2025, "Critical Batch Size
Revisited", measured it starting near zero, rising and plateauing; their batch-size warm-up
reached slightly better loss with 43% fewer gradient steps). So B is
raised by `factor` once the smoothed B_simple has exceeded `threshold` x the optimizer
minibatch (B / minibatches, the batch of one update, which B_simple is compared with) in
`patience` consecutive steps in which it was resolved (|G|^2 > 0). It is never lowered. An
unresolved step (B_simple NaN) resets the count: the rule acts only on evidence.
"""

from __future__ import annotations

import math


def stepwise_sequences(points: list[tuple[int, int]], samples: int) -> int:
    """B in force at `samples` cumulative samples: the last point (start, B) with
    start <= samples. `points` start at 0 and increase in `start`."""
    b = points[0][1]
    for start, seqs in points:
        if start > samples:
            break
        b = seqs
    return b


def adaptive_step(sequences: int, streak: int, b_simple: float, *, minibatches: int,
                  factor: int, threshold: float, patience: int,
                  max_sequences: int) -> tuple[int, int]:
    """One step of the adaptive rule: (B for the next step, the new streak).

    `b_simple` is the smoothed noise scale after this step (NaN when unresolved); the
    streak counts consecutive resolved steps with b_simple >= threshold x (B / minibatches).
    When it reaches `patience`, B becomes min(B x factor, max_sequences) and the streak
    starts again; B never falls."""
    if sequences >= max_sequences:
        return sequences, 0
    minibatch = sequences / minibatches
    resolved = b_simple is not None and math.isfinite(b_simple) and b_simple > 0
    streak = streak + 1 if resolved and b_simple >= threshold * minibatch else 0
    if streak >= patience:
        return min(sequences * factor, max_sequences), 0
    return sequences, streak
