"""Training diagnostics of the policy and the critic (pure functions over tensors; docs/design.md,
house rules 1 and 2). None of them enters a loss; the update computes them from tensors its
own forward already produced (no extra forward pass) and logs them (docs/metrics.md).

- `explained_variance`: 1 - Var(R - V) / Var(R) over valid tokens (cleanrl's ppo.py
  `explained_var`, verl's `critic/vf_explained_var`): 1 for a perfect critic, 0 for one that
  predicts the mean return, negative for one worse than that; NaN when Var(R) = 0.
- `masked_sum`: sum over valid tokens, the numerator of a token-weighted mean that is
  accumulated over micro-batches and minibatches and divided once at the end.

The per-token policy entropy comes from `algos.losses.token_logprobs_and_entropy`, which
shares the log-softmax of the loss's own log-probabilities; the logged KL to the rollout
policy is `algos.losses.kl_k3` with the old policy as the sampler.
"""

from __future__ import annotations

import math

import torch


def masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> float:
    """Sum of `per_token` (B, L) over the valid tokens `mask` (B, L) bool, as a Python float.
    Padding is selected out, not multiplied by 0, so junk (even inf) there cannot leak."""
    return float(per_token.detach()[mask].double().sum())


def explained_variance(values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the valid tokens.

    cleanrl's ppo.py (`explained_var`) and verl (`critic/vf_explained_var`); population
    variances (the 1/n factors cancel in the ratio). NaN when Var(returns) == 0 (every valid
    return equal, or no valid token): the ratio is undefined, not 0 or 1.

    Args:
        values: (B, L) the critic's predictions (before its update, when logging an update).
        returns: (B, L) the regression targets.
        mask: (B, L) bool, valid response tokens.
    Returns:
        A Python float in (-inf, 1], or NaN.
    """
    r = returns.detach()[mask].double()  # (n,)
    v = values.detach()[mask].double()  # (n,)
    if r.numel() == 0:
        return math.nan
    var_r = float(r.var(unbiased=False))
    if var_r == 0.0:
        return math.nan
    return 1.0 - float((r - v).var(unbiased=False)) / var_r
