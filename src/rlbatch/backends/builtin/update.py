"""Optimizer updates for the actor and the critic: minibatches x epochs, micro-batch
gradient accumulation, gradient clipping, non-finite handling and (opt-in) the gradient noise
scale. Orchestration only: every formula comes from `rlbatch.algos`.

Normalization: each micro-batch loss is `aggregate(..., normalizer=minibatch tokens)` so the
accumulated gradient equals the minibatch gradient for any micro-batch size (docs/design.md, house rule 3).

Noise scale (McCandlish et al. 2018, App. A.1): with k >= 2 micro-batches of b sequences in a
minibatch of B sequences, |G_small|^2 is the mean over micro-batches of the squared norm of
that micro-batch's own mean gradient, and |G_big|^2 the squared norm of the accumulated
minibatch gradient. Measuring it costs one flat copy of the gradient per micro-batch; the
trainer reports that time as `time/noise_scale`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from rlbatch.algos.losses import aggregate, clipped_surrogate, clipped_value_loss, kl_k3
from rlbatch.algos.noise_scale import NoiseScaleEMA
from rlbatch.backends.builtin.batch import SeqBatch, forward_logprobs


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


def _minibatches(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    perm = torch.randperm(n, generator=generator) if minibatches > 1 else torch.arange(n)
    return list(perm.chunk(minibatches))


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
                 generator: torch.Generator, noise: NoiseScaleEMA | None) -> UpdateResult:
    """Clipped-surrogate (+ k3 KL) updates. old_logp, ref_logp (N, T); advantages (N,) or (N, T)."""
    params = [p for p in model.parameters() if p.requires_grad]
    res = UpdateResult()
    acc = {"loss": 0.0, "kl": 0.0, "clip": 0.0, "norm": 0.0, "n": 0}
    model.train()
    for _ in range(epochs):
        for idx in _minibatches(len(batch), minibatches, generator):
            tokens = float(batch.response_mask[idx].sum())
            probe = _NoiseProbe(params) if noise is not None and len(idx) > micro else None
            loss_sum = kl_sum = clip_sum = 0.0
            for chunk in idx.split(micro):
                b = batch.rows(chunk)
                mask = b.response_mask
                logp = forward_logprobs(model, b, temperature)  # (m, T)
                per_tok, clipped = clipped_surrogate(logp, old_logp[chunk], advantages[chunk],
                                                     clip_low, clip_high)
                if ref_logp is not None and kl_coef > 0:
                    kl = kl_k3(logp, ref_logp[chunk])
                    per_tok = per_tok + kl_coef * kl
                    kl_sum += float(aggregate(kl.detach(), mask, tokens))
                loss = aggregate(per_tok, mask, tokens)
                loss.backward()
                loss_sum += float(loss.detach())
                clip_sum += float(aggregate(clipped.float(), mask, tokens))
                if probe is not None:
                    probe.after_micro(float(mask.sum()) / tokens)
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
                 "actor/clip_frac": acc["clip"] / n, "actor/kl": acc["kl"] / n}
    if noise is not None and noise.count:
        res.stats["actor/noise_scale"] = noise.b_simple
    return res


def critic_update(critic, optimizer, batch: SeqBatch, old_values: torch.Tensor,
                  returns: torch.Tensor, *, value_clip: float | None, minibatches: int,
                  epochs: int, micro: int, max_grad_norm: float | None,
                  generator: torch.Generator, noise: NoiseScaleEMA | None) -> UpdateResult:
    """Clipped value-loss updates. old_values, returns (N, T)."""
    params = [p for p in critic.parameters() if p.requires_grad]
    res = UpdateResult()
    tot_loss = tot_norm = 0.0
    steps = 0
    critic.train()
    for _ in range(epochs):
        for idx in _minibatches(len(batch), minibatches, generator):
            tokens = float(batch.response_mask[idx].sum())
            probe = _NoiseProbe(params) if noise is not None and len(idx) > micro else None
            loss_sum = 0.0
            for chunk in idx.split(micro):
                b = batch.rows(chunk)
                values = critic(b)  # (m, T)
                per_tok = clipped_value_loss(values, old_values[chunk], returns[chunk], value_clip)
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
