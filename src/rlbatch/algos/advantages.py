"""Advantage estimators (pure functions over tensors; docs/design.md, house rule 1).

- `grpo_advantages`: group-relative advantages of GRPO (Shao et al. 2024, DeepSeekMath,
  eq. 3/outcome supervision): within each group of G responses to one prompt,
  A_i = (r_i - mean(r)) / (std(r) + eps), or the mean-only variant A_i = r_i - mean(r)
  (Liu et al. 2025, "Dr. GRPO", which drops the std division). std is the population std
  (unbiased=False); a group with identical rewards gets zero advantage. With `valid`, the
  samples marked False (rewards dropped by the reward policy, `reward.on_error: drop`) are
  left out of their group's mean and std and get zero advantage; a group with fewer than
  two valid samples gets zero advantage throughout.
  Stats: `adv/zero_std_groups`, the fraction of groups whose rewards are all equal (zero
  std: no learning signal, whether every response was right or every one wrong). With binary
  rewards (every valid reward 0 or 1) it is split into `adv/all_correct_groups` (all 1) and
  `adv/all_wrong_groups` (all 0); groups without a valid sample are in neither.
- `gae`: generalized advantage estimation (Schulman et al. 2016, eq. 16) over response tokens
  with a terminal outcome reward on the last valid token, as in PPO for LLMs (Ouyang et al.
  2022); returns = advantages + values.
- `masked_whiten`: per-batch advantage normalization over valid tokens (PPO practice).
"""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_size: int, norm: str = "std",
                    eps: float = 1e-6, valid: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict]:
    """rewards (P*G,) ordered prompt-major (G consecutive rows per prompt) -> advantages (P*G,)
    and stats (module docstring: `adv/zero_std_groups`, and with binary rewards
    `adv/all_correct_groups`, `adv/all_wrong_groups`).

    valid (P*G,) bool, optional: samples to keep (the others are out of their group). One
    code path: without `valid` every sample is valid, so both forms give the same bits."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if norm not in ("std", "mean"):
        raise ValueError(f"unknown advantage norm {norm!r}")
    r = rewards.float().view(-1, group_size)  # (P, G)
    v = (torch.ones_like(r) if valid is None
         else valid.view(-1, group_size).to(r.dtype))  # (P, G) 0/1
    n = v.sum(dim=1, keepdim=True)  # (P, 1)
    mean = (r * v).sum(dim=1, keepdim=True) / n.clamp(min=1)
    centered = (r - mean) * v
    std = ((centered ** 2).sum(dim=1, keepdim=True) / n.clamp(min=1)).sqrt()  # population std
    flat = (std == 0) | (n < 2)  # (P, 1): equal valid rewards, no learning signal
    if norm == "std":
        adv = torch.where(flat, torch.zeros_like(centered), centered / (std + eps))
    else:
        adv = torch.where(n < 2, torch.zeros_like(centered), centered)
    return adv.view(-1), _group_stats(r, v, flat)


def _group_stats(r: torch.Tensor, v: torch.Tensor, equal: torch.Tensor) -> dict:
    """Learning-signal stats of the groups. r, v (P, G): rewards and 0/1 validity; equal
    (P, 1) bool: groups whose valid rewards are all equal (zero std, zero advantage)."""
    stats = {"adv/zero_std_groups": equal.float().mean().item()}
    kept = r[v > 0]
    if ((kept == 0) | (kept == 1)).all():  # binary rewards: name the two kinds of flat group
        n = v.sum(dim=1, keepdim=True)  # (P, 1)
        hits = torch.where(v > 0, r, 0.0).sum(dim=1, keepdim=True)  # (P, 1) valid 1s
        stats["adv/all_correct_groups"] = ((n > 0) & (hits == n)).float().mean().item()
        stats["adv/all_wrong_groups"] = ((n > 0) & (hits == 0)).float().mean().item()
    return stats


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards, values, mask: (B, L) -> (advantages (B, L), returns (B, L)).

    Responses are right-padded: mask is True on a prefix of each row. The value after the
    last valid token is 0 (episode end). Computed with a backward scan over L.
    """
    B, L = values.shape
    m = mask.float()
    values = values.float() * m
    adv = torch.zeros_like(values)
    last = torch.zeros(B, dtype=values.dtype, device=values.device)
    for t in range(L - 1, -1, -1):
        next_v = values[:, t + 1] if t + 1 < L else torch.zeros_like(last)
        delta = token_rewards[:, t].float() + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last * (m[:, t + 1] if t + 1 < L else 0.0)
        last = last * m[:, t]
        adv[:, t] = last
    return adv, (adv + values) * m


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar reward (B,) on its last valid token -> (B, L)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    last = mask.long().sum(1) - 1  # (B,)
    rows = torch.arange(mask.shape[0], device=mask.device)
    valid = last >= 0
    out[rows[valid], last[valid]] = rewards.float()[valid]
    return out


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over valid tokens; zero elsewhere."""
    m = mask.float()
    n = m.sum().clamp(min=1)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m
