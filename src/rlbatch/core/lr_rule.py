"""The learning-rate rule across batch sizes: `eta(B) = eta0 * (B/B0)^p` with p = 1/2 (sqrt,
Malladi et al. 2022), 1 (linear) or 0 (none). With `scale_adam: true` the betas and eps
follow Malladi et al.'s square-root SDE rule as well: `beta -> 1 - k(1 - beta)`,
`eps -> eps / sqrt(k)`, k = B/B0. The schedule along the samples axis (warm-up) is
`algos/lr.py`.
"""

from __future__ import annotations

import math

LR_EXPONENTS = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}


def scaled_lr(reference_lr: float, reference_sequences: int, sequences: int, rule: str) -> float:
    """eta(B) = eta0 * (B / B0)^p, p from LR_EXPONENTS (docs/design.md; Malladi et al. 2022)."""
    if rule not in LR_EXPONENTS:
        raise ValueError(f"unknown lr_scaling {rule!r}; use one of {sorted(LR_EXPONENTS)}")
    return reference_lr * (sequences / reference_sequences) ** LR_EXPONENTS[rule]


def scaled_adam(beta1: float, beta2: float, eps: float, k: float) -> dict:
    """Malladi et al. 2022 square-root scaling: beta -> 1 - k(1 - beta), eps -> eps/sqrt(k).

    Betas are floored at 0 (a k large enough to make them negative is out of the rule's range).
    """
    b1 = max(0.0, 1.0 - k * (1.0 - beta1))
    b2 = max(0.0, 1.0 - k * (1.0 - beta2))
    return {"betas": (b1, b2), "eps": eps / math.sqrt(k)}
