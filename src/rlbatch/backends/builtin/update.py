"""Optimizer updates for the actor and the critic: minibatches x epochs, micro-batch
gradient accumulation, gradient clipping, non-finite handling and (opt-in) the gradient noise
scale. Orchestration only: every formula comes from `rlbatch.algos`.

Normalization: each micro-batch loss is `aggregate(..., normalizer=minibatch tokens)` so the
accumulated gradient equals the minibatch gradient for any micro-batch size (docs/design.md, house rule 3).

Paying for real tokens only (every workload, GRPO and PPO, actor and critic):
- Length-ordered micro-batches: within each optimizer minibatch the rows are ordered by real
  length (prompt + response tokens) and cut into micro-batches of `micro` sequences, and each
  micro-batch is trimmed to its own longest prompt and response (`batch.micro_batches`,
  `SeqBatch.trimmed`), so the forward and backward cost follows the real token count instead
  of B x the rollout's longest sequence. Which rows share a micro-batch and how much padding
  they carry do not change the gradient (house rule 3; tests/test_grad_invariance.py).
- Zero-gradient rows skipped (actor): a sequence whose advantage is 0 on every valid token
  (a GRPO group with all-equal rewards) with no KL term has an exactly zero gradient
  (`algos.losses.zero_gradient_rows`); it is left out of the forward and backward, while the
  normalizer still counts its tokens, so the gradient and the logged loss and clip fraction
  are unchanged. A minibatch whose every row is skipped still steps the optimizer, with
  zero gradients, as the unskipped update would (Adam moves on its moments even then).
  Deviation: a non-finite log-probability in a skipped row no longer poisons the update
  (it contributed nothing but NaN * 0).

Noise scale (McCandlish et al. 2018, App. A.1): with k >= 2 micro-batches of b sequences in a
minibatch of B sequences, |G_small|^2 is the mean over micro-batches of the squared norm of
that micro-batch's own mean gradient, and |G_big|^2 the squared norm of the accumulated
minibatch gradient. The estimator assumes each micro-batch is a random subset of the
minibatch: micro-batches of length-sorted rows are strata, whose means differ systematically
(long and short responses pull differently), which inflates |G_small|^2 and so tr(Sigma)
and B_simple. So while the probe runs, micro-batches keep equal sequence counts and are
consecutive slices of the minibatch's random permutation (not length-ordered; still
trimmed and still skipping zero-gradient rows, neither of which changes a micro-batch's
gradient). Updates are then slower on variable-length workloads. Measuring it costs one flat
copy of the gradient per micro-batch; the trainer reports that time as `time/noise_scale`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from rlbatch.algos.losses import (aggregate, clipped_surrogate, clipped_value_loss, kl_k3,
                                  zero_gradient_rows)
from rlbatch.algos.noise_scale import NoiseScaleEMA
from rlbatch.backends.builtin.batch import SeqBatch, forward_logprobs, micro_batches


@dataclass
class UpdateResult:
    stats: dict = field(default_factory=dict)
    skipped: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    noise_s: float = 0.0


class _NoiseProbe:
    """Collects micro-batch and minibatch squared gradient norms for the two-batch estimator."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.prev: torch.Tensor | None = None
        self.small_sq: list[float] = []
        self.seconds = 0.0

    def _flat(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])

    def after_micro(self, share: float) -> None:
        """share = micro tokens / minibatch tokens: rescales the contribution to a mean."""
        t0 = time.perf_counter()
        flat = self._flat()
        contrib = flat if self.prev is None else flat - self.prev
        self.small_sq.append(float((contrib / share).pow(2).sum()))
        self.prev = flat
        self.seconds += time.perf_counter() - t0

    def finish(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        big_sq = float(self.prev.pow(2).sum()) if self.prev is not None else float("nan")
        small = sum(self.small_sq) / max(1, len(self.small_sq))
        self.seconds += time.perf_counter() - t0
        return small, big_sq


def _set_lr(optimizer, lrs: list[float] | None, update: int) -> None:
    """The schedule's LR for this update (algos.lr.update_lrs), when the caller gives one."""
    if lrs is not None:
        for group in optimizer.param_groups:
            group["lr"] = lrs[update]


def _minibatches(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    perm = torch.randperm(n, generator=generator) if minibatches > 1 else torch.arange(n)
    return list(perm.chunk(minibatches))


def _zero_fill(params) -> None:
    """Zero gradients for a minibatch whose every row was skipped (see the module docstring)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def _clip_and_step(params, optimizer, max_norm: float | None) -> tuple[float, bool]:
    """Clip, check finiteness, step. Returns (grad_norm, stepped)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    norm = float(norm)
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return norm, False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, True


def _close_minibatch(probe, noise, micro: int, sequences: int, loss_sum: float, params,
                     optimizer, max_grad_norm, res: UpdateResult) -> float | None:
    """Feed the noise-scale estimator, then step unless the loss or gradient is non-finite.
    Returns the gradient norm, or None when the loss was non-finite (update skipped)."""
    if probe is not None:
        small, big = probe.finish()
        if math.isfinite(small) and math.isfinite(big):
            noise.update(small, big, micro, sequences)
        res.noise_s += probe.seconds
    if not math.isfinite(loss_sum):
        optimizer.zero_grad(set_to_none=True)
        res.skipped += 1
        return None
    norm, stepped = _clip_and_step(params, optimizer, max_grad_norm)
    res.skipped += 0 if stepped else 1
    return norm


def actor_update(model, optimizer, batch: SeqBatch, old_logp: torch.Tensor,
                 advantages: torch.Tensor, ref_logp: torch.Tensor | None, *, temperature: float,
                 clip_low: float, clip_high: float, kl_coef: float, minibatches: int,
                 epochs: int, micro: int, max_grad_norm: float | None,
                 generator: torch.Generator, noise: NoiseScaleEMA | None,
                 lrs: list[float] | None = None) -> UpdateResult:
    """Clipped-surrogate (+ k3 KL) updates. old_logp, ref_logp (N, T); advantages (N,) or (N, T).
    `lrs`: the LR of each of the epochs x minibatches updates, in order (None: as set)."""
    params = [p for p in model.parameters() if p.requires_grad]
    res = UpdateResult()
    acc = {"loss": 0.0, "kl": 0.0, "clip": 0.0, "norm": 0.0, "n": 0}
    kl_on = ref_logp is not None and kl_coef > 0
    skip = zero_gradient_rows(advantages, batch.response_mask, kl_on)  # (N,) bool
    lengths = batch.real_lengths()  # (N,)
    model.train()
    for epoch in range(epochs):
        for m, idx in enumerate(_minibatches(len(batch), minibatches, generator)):
            _set_lr(optimizer, lrs, epoch * minibatches + m)
            tokens = float(batch.response_mask[idx].sum())
            probe = _NoiseProbe(params) if noise is not None and len(idx) > micro else None
            loss_sum = kl_sum = clip_sum = 0.0
            for chunk in micro_batches(idx, lengths, micro, by_length=probe is None):
                live = chunk[~skip[chunk]]
                if len(live):
                    loss, kl, clip = _actor_micro(
                        model, batch.rows(live).trimmed(), old_logp[live], advantages[live],
                        ref_logp[live] if kl_on else None, tokens, temperature=temperature,
                        clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef)
                    loss_sum, kl_sum, clip_sum = loss_sum + loss, kl_sum + kl, clip_sum + clip
                if probe is not None:
                    probe.after_micro(float(batch.response_mask[chunk].sum()) / tokens)
            if bool(skip[idx].all()):
                _zero_fill(params)
            norm = _close_minibatch(probe, noise, micro, len(idx), loss_sum, params, optimizer,
                                    max_grad_norm, res)
            if norm is None:
                continue
            acc["loss"] += loss_sum
            acc["kl"] += kl_sum
            acc["clip"] += clip_sum
            acc["norm"] += norm
            acc["n"] += 1
    n = max(1, acc["n"])
    res.stats = {"actor/loss": acc["loss"] / n if acc["n"] else float("nan"),
                 "actor/grad_norm": acc["norm"] / n if acc["n"] else float("nan"),
                 "actor/clip_frac": acc["clip"] / n, "actor/kl": acc["kl"] / n,
                 "actor/zero_grad_skipped": float(skip.float().mean())}
    if noise is not None and noise.count:
        res.stats["actor/noise_scale"] = noise.b_simple
    return res


def _actor_micro(model, b: SeqBatch, old_logp: torch.Tensor, advantages: torch.Tensor,
                 ref_logp: torch.Tensor | None, tokens: float, *, temperature: float,
                 clip_low: float, clip_high: float,
                 kl_coef: float) -> tuple[float, float, float]:
    """Forward and backward of one trimmed micro-batch `b` (m rows, t response columns);
    old_logp, ref_logp (m, T) and advantages (m,) or (m, T) are cut to its t columns.
    Returns this micro-batch's shares of the loss, the KL and the clipped fraction."""
    t = b.response_ids.shape[1]
    mask = b.response_mask  # (m, t)
    logp = forward_logprobs(model, b, temperature)  # (m, t)
    adv = advantages if advantages.dim() == 1 else advantages[:, :t]
    per_tok, clipped = clipped_surrogate(logp, old_logp[:, :t], adv, clip_low, clip_high)
    kl_share = 0.0
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp[:, :t])
        per_tok = per_tok + kl_coef * kl
        kl_share = float(aggregate(kl.detach(), mask, tokens))
    loss = aggregate(per_tok, mask, tokens)
    loss.backward()
    return (float(loss.detach()), kl_share, float(aggregate(clipped.float(), mask, tokens)))


def critic_update(critic, optimizer, batch: SeqBatch, old_values: torch.Tensor,
                  returns: torch.Tensor, *, value_clip: float | None, minibatches: int,
                  epochs: int, micro: int, max_grad_norm: float | None,
                  generator: torch.Generator, noise: NoiseScaleEMA | None,
                  lrs: list[float] | None = None) -> UpdateResult:
    """Clipped value-loss updates. old_values, returns (N, T). `lrs` as in actor_update."""
    params = [p for p in critic.parameters() if p.requires_grad]
    res = UpdateResult()
    tot_loss = tot_norm = 0.0
    steps = 0
    lengths = batch.real_lengths()  # (N,)
    critic.train()
    for epoch in range(epochs):
        for m, idx in enumerate(_minibatches(len(batch), minibatches, generator)):
            _set_lr(optimizer, lrs, epoch * minibatches + m)
            tokens = float(batch.response_mask[idx].sum())
            probe = _NoiseProbe(params) if noise is not None and len(idx) > micro else None
            loss_sum = 0.0
            for chunk in micro_batches(idx, lengths, micro, by_length=probe is None):
                b = batch.rows(chunk).trimmed()
                t = b.response_ids.shape[1]
                values = critic(b)  # (m, t)
                per_tok = clipped_value_loss(values, old_values[chunk, :t], returns[chunk, :t],
                                             value_clip)
                loss = aggregate(per_tok, b.response_mask, tokens)
                loss.backward()
                loss_sum += float(loss.detach())
                if probe is not None:
                    probe.after_micro(float(b.response_mask.sum()) / tokens)
            norm = _close_minibatch(probe, noise, micro, len(idx), loss_sum, params, optimizer,
                                    max_grad_norm, res)
            if norm is None:
                continue
            tot_loss += loss_sum
            tot_norm += norm
            steps += 1
    res.stats = {"critic/loss": tot_loss / steps if steps else float("nan"),
                 "critic/grad_norm": tot_norm / steps if steps else float("nan")}
    if noise is not None and noise.count:
        res.stats["critic/noise_scale"] = noise.b_simple
    return res
