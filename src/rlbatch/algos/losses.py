"""Policy and value losses with one normalization point (docs/design.md, house rules 1 and 3).

Per-token terms are computed unnormalized; `aggregate` is the only place a loss is divided.
It divides the masked sum by a normalizer fixed for the whole minibatch (its total number of
valid response tokens: token-level "token-mean" aggregation, as in DAPO (Yu et al. 2025)
and verl's `token-mean` mode). Because every micro-batch divides by the *minibatch* count,
summing micro-batch gradients gives exactly the minibatch gradient for any
`micro_batch_sequences` and any padding layout (tested).

- `clipped_surrogate`: PPO's clipped objective (Schulman et al. 2017, eq. 7) per token, with
  separate lower/upper clip ranges (DAPO's clip-higher): loss = -min(r A, clip(r, 1-el, 1+eh) A).
- `kl_k3`: the k3 estimator of KL(p || q) from tokens sampled by p (Schulman 2020,
  "Approximating KL divergence"): with d = log q - log p, (e^d - 1) - d, unbiased and
  non-negative, exactly 0 where p = q. The update uses it twice: KL(pi || ref) for the
  reference penalty (`kl_k3(logp, ref_logp)`), and KL(pi_old || pi) as the logged
  `actor/approx_kl` (`kl_k3(old_logp, logp)`: the k3 of cleanrl's ppo.py `approx_kl` and
  verl's `low_var_kl`; verl's `actor/ppo_kl` is the k1 form -log r).
- `clipped_value_loss`: PPO value loss with value clipping (as in OpenAI baselines / verl):
  0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).
- `token_logprobs_and_entropy`: the loss's log-probabilities and, from the same log-softmax,
  the detached per-token entropy that the update logs as `actor/entropy`.
- `zero_gradient_rows`: the sequences whose clipped-surrogate loss has an exactly zero
  gradient (zero advantage on every valid token and no KL term), which the update skips.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """logits (B, L, V), targets (B, L) -> log pi(target) under softmax(logits / temperature): (B, L)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor,
                               temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` plus the per-token entropy of the same distribution, from one
    log-softmax (the entropy costs no second softmax and no second forward).

    Args:
        logits: (B, L, V); targets: (B, L) token ids; temperature: the sampling temperature.
    Returns:
        log pi(target) (B, L), differentiable and computed exactly as `token_logprobs` does
        (so the loss's gradient is unchanged), and the entropy (B, L) of softmax(logits / temperature),
        detached (a diagnostic, never part of a loss).
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, L, V)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, L)
    with torch.no_grad():
        lp = logp.detach()
        plogp = (lp.exp() * lp).masked_fill(lp == -torch.inf, 0.0)  # 0 log 0 = 0
        entropy = -plogp.sum(-1)  # (B, L)
    return picked, entropy


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy loss (B, L) and a (B, L) bool tensor of clipped tokens.

    advantages may be (B,) (one per sequence, GRPO) or (B, L) (per token, PPO).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(logp - old_logp)  # (B, L)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, clipped < unclipped


def kl_k3(logp: torch.Tensor, other_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(p || q), (B, L): `logp` the sampled tokens'
    log-probabilities under p (the policy that drew them, for the estimate to be unbiased),
    `other_logp` under q. Padding positions hold junk; mask them."""
    d = other_logp - logp
    return torch.expm1(d) - d


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip: float | None) -> torch.Tensor:
    """Per-token value loss (B, L)."""
    err = (values - returns) ** 2
    if clip is None:
        return 0.5 * err
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum(err, (v_clip - returns) ** 2)


def zero_gradient_rows(advantages: torch.Tensor, mask: torch.Tensor,
                       kl_active: bool) -> torch.Tensor:
    """(N,) bool: rows whose per-token clipped-surrogate loss has an exactly zero gradient.

    With A = 0 every term of -min(r A, clip(r) A) is r * 0 or clip(r) * 0, whose derivative
    with respect to the log-probability is exactly 0 (the clipped branch has none, the other
    A r = 0): a GRPO group with all-equal rewards (advantage 0) contributes nothing. A KL
    term (kl_active) has a non-zero gradient for every token, so then no row qualifies.
    advantages (N,) (GRPO) or (N, L) (PPO: zero on every valid token); mask (N, L) bool.
    Only exact zeros count: a row is never skipped on approximation.
    """
    n = mask.shape[0]
    if kl_active:
        return torch.zeros(n, dtype=torch.bool, device=mask.device)
    if advantages.dim() == 1:
        return advantages == 0
    return ~((advantages != 0) & mask).any(dim=1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """The one normalization point: sum over valid tokens / normalizer (minibatch tokens)."""
    if normalizer <= 0:
        raise ValueError("normalizer must be positive (the minibatch's valid token count)")
    return (per_token * mask.to(per_token.dtype)).sum() / normalizer
