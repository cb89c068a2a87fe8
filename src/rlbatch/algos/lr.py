"""Learning-rate schedule defined in samples (docs/design.md: the x-axis is samples).

`lr_at(samples, base_lr, warmup_samples)`: the LR of the update that brings the cumulative
sample count to `samples`; linear warm-up from 0 to base_lr over the first
`warmup_samples` samples, constant afterwards. Defining warm-up in samples (not
optimizer steps) keeps runs at different B on the same schedule along the sample axis.
The batch-size scaling rule itself (`eta(B) = eta0 (B/B0)^p`) is `core.config.scaled_lr`.
"""

from __future__ import annotations


def lr_at(samples: int, base_lr: float, warmup_samples: int = 0) -> float:
    if warmup_samples <= 0:
        return base_lr
    return base_lr * min(1.0, samples / warmup_samples)
