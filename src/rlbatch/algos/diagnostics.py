"""Training diagnostics of the policy and the critic (pure functions over tensors; docs/design.md,
house rules 1 and 2). None of them enters a loss; the update computes them from tensors its
own forward already produced (no extra forward pass) and logs them (docs/metrics.md).

- `approx_kl_k3`: per-token k3 estimate of KL(pi_old || pi_new) between the rollout policy and
  the policy being updated, from samples of pi_old: (r - 1) - log r with r = pi_new / pi_old
  (Schulman 2020, "Approximating KL divergence"; cleanrl's ppo.py `approx_kl`; the same k3
  form as verl's `low_var_kl`, which verl applies to the reference KL, while its
  `actor/ppo_kl` is the k1 form -log r). Non-negative per token, 0 where r = 1.
- `explained_variance`: 1 - Var(R - V) / Var(R) over valid tokens (cleanrl's ppo.py
  `explained_var`, verl's `critic/vf_explained_var`): 1 for a perfect critic, 0 for one that
  predicts the mean return, negative for one worse than that; NaN when Var(R) = 0.
- `masked_sum`: sum over valid tokens, the numerator of a token-weighted mean that is
  accumulated over micro-batches and minibatches and divided once at the end.

The per-token policy entropy comes from `algos.losses.token_logprobs_and_entropy`, which
shares the log-softmax of the loss's own log-probabilities.
"""

from __future__ import annotations

import math

import torch


def approx_kl_k3(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_old || pi) from tokens sampled by pi_old.

    Schulman 2020 ("Approximating KL divergence", k3) as in cleanrl's ppo.py:
    with log r = logp - old_logp, k3 = (r - 1) - log r >= 0 (exactly 0 where r = 1).

    Args:
        logp: (B, T) log-probabilities of the sampled tokens under the current policy.
        old_logp: (B, T) their log-probabilities under the rollout (old) policy.
    Returns:
        (B, T) per-token estimates (padding positions hold junk; mask them).
    """
    log_ratio = logp - old_logp  # (B, T)
    return torch.expm1(log_ratio) - log_ratio


def masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> float:
    """Sum of `per_token` (B, T) over the valid tokens `mask` (B, T) bool, as a Python float.
    Padding is selected out, not multiplied by 0, so junk (even inf) there cannot leak."""
    return float(per_token.detach()[mask].double().sum())


def explained_variance(values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the valid tokens.

    cleanrl's ppo.py (`explained_var`) and verl (`critic/vf_explained_var`); population
    variances (the 1/n factors cancel in the ratio). NaN when Var(returns) == 0 (every valid
    return equal, or no valid token): the ratio is undefined, not 0 or 1.

    Args:
        values: (B, T) the critic's predictions (before its update, when logging an update).
        returns: (B, T) the regression targets.
        mask: (B, T) bool, valid response tokens.
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
