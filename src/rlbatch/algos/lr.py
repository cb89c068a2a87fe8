"""Learning-rate schedule defined in samples (docs/design.md, house rule 5: the x-axis is
samples).

The schedule is a function of cumulative samples s: linear warm-up from 0 to the peak over
the first W samples, constant afterwards,

    lr(s) = peak * min(1, s / W)        (W = warmup_samples; W = 0: no warm-up).

An optimizer update consumes a slice of samples, so it gets the **mean of lr(s) over its
slice** (`lr_mean`), not the value at the end of the step: with U updates per rollout step
of B samples starting at s0, update (epoch e, minibatch m) gets the mean over
(s0 + m B/M, s0 + (m + 1) B/M] (M minibatches; every epoch revisits the same slices). Then
the sum over updates of lr x samples-per-update equals the integral of lr(s) over the
samples, whatever B is: at B >= W the first step still warms up (it gets the mean, not the
peak), and runs at different B follow one schedule along the sample axis.
The batch-size scaling rule itself (`eta(B) = eta0 (B/B0)^p`) is `core/lr_rule.py`.
"""

from __future__ import annotations


def lr_at(samples: float, base_lr: float, warmup_samples: int = 0) -> float:
    """lr(s): the schedule's value at `samples` cumulative samples."""
    if warmup_samples <= 0:
        return base_lr
    return base_lr * min(1.0, samples / warmup_samples)


def lr_mean(start: float, end: float, base_lr: float, warmup_samples: int = 0) -> float:
    """Mean of lr(s) over the samples (start, end]: the exact integral of the piecewise
    linear schedule divided by (end - start)."""
    if warmup_samples <= 0 or start >= warmup_samples:
        return base_lr
    if end <= start:
        return lr_at(end, base_lr, warmup_samples)
    w = float(warmup_samples)
    ramp_end = min(end, w)
    ramp = (ramp_end ** 2 - start ** 2) / (2.0 * w)  # integral of s/W over (start, ramp_end]
    flat = max(0.0, end - w)  # integral of 1 over (W, end]
    return base_lr * (ramp + flat) / (end - start)


def update_lrs(samples_before: int, sequences: int, minibatches: int, epochs: int,
               base_lr: float, warmup_samples: int = 0) -> list[float]:
    """The LR of each optimizer update of one rollout step, in the order they run (epoch
    by epoch, minibatch by minibatch): minibatch m's share of the step's samples."""
    width = sequences / minibatches
    per_mb = [lr_mean(samples_before + m * width, samples_before + (m + 1) * width, base_lr,
                      warmup_samples) for m in range(minibatches)]
    return per_mb * epochs


def crosses_mark(samples_before: int, samples_after: int, every: int) -> bool:
    """Whether a step covering samples (before, after] crosses a multiple of `every` samples
    (every = 0: every step does). A cadence in samples: at B >= every it is every step, at
    smaller B every ceil(every / B)-th step, so all B update at the same sample marks."""
    return every <= 0 or samples_after // every > samples_before // every


def in_warmup(samples_after: int, warmup_samples: int) -> bool:
    """Whether a step ending at `samples_after` lies wholly inside a warm-up of
    `warmup_samples` samples. A step that only starts inside it is not a warm-up step, so
    any B spends at most `warmup_samples` samples warming up (B * floor(W / B))."""
    return samples_after <= warmup_samples
