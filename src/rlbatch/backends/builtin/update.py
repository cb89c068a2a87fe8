"""The optimizer updates of one rollout step, actor and critic: for each epoch and each
minibatch, set the LR, accumulate micro-batch gradients, clip and step.

Each update reads top to bottom in one function (`actor_update`, `critic_update`); the
features it carries are named helpers the loop calls: length-ordered, trimmed micro-batches
(`batch.micro_batches`, `SeqBatch.trimmed`), zero-gradient rows left out of the forward
(`algos.losses.zero_gradient_rows`), non-finite skips (`step_or_skip`) and the gradient
noise-scale probe (`NoiseProbe`, an observer of the accumulation). Every formula comes from
`rlbatch.algos`; the micro-batch losses are normalised by the minibatch's response tokens,
so the accumulated gradient equals the minibatch gradient for any micro-batch size (house
rule 3). docs/design.md: "One GRPO step, top to bottom", "The update pays for real tokens".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from rlbatch.algos.diagnostics import explained_variance, masked_sum
from rlbatch.algos.losses import (
    aggregate,
    clipped_surrogate,
    clipped_value_loss,
    kl_k3,
    zero_gradient_rows,
)
from rlbatch.algos.noise_scale import NoiseScaleEMA, effective_small_batch
from rlbatch.backends.builtin.batch import SeqBatch, forward_logprobs_entropy, micro_batches


@dataclass
class UpdateResult:
    stats: dict = field(default_factory=dict)
    skipped: int = 0  # optimizer updates skipped for a non-finite loss or gradient
    noise_s: float = 0.0  # seconds the noise probe spent (reported as time/noise_scale)


class NoiseProbe:
    """Squared gradient norms of one minibatch for the two-batch noise-scale estimator
    (McCandlish et al. 2018, App. A.1; `algos.noise_scale`), read off the accumulation.

    Micro-batch i adds (n_i / N) g_i to the accumulated gradient (n_i its valid tokens, N the
    minibatch's, g_i its own token-mean gradient). `after_micro` recovers g_i from that
    increment; `end_minibatch` feeds |G_small|^2 = mean_i |g_i|^2 at b_eff = 1/mean_i(1/b_i)
    and |G_big|^2 = |accumulated gradient|^2 into the EMA. Costs one flat gradient copy per
    micro-batch, timed in `seconds`. While it watches, micro-batches are random slices, not
    length-ordered (`ordered`): strata of similar length would inflate |G_small|^2.
    """

    ordered = False

    def __init__(self, params: list[torch.nn.Parameter], normalizer: float = 1.0):
        self.params = params
        self.normalizer = normalizer  # N, the minibatch's valid tokens
        self.accumulated: torch.Tensor | None = None  # flat gradient so far (None: all zero)
        self.micro_grad_sq: list[float] = []  # |g_i|^2 per micro-batch
        self.micro_sequences: list[int] = []  # b_i per micro-batch
        self.seconds = 0.0

    @staticmethod
    def watch(noise: NoiseScaleEMA | None, params, sequences: int, micro: int,
              normalizer: float):
        """A probe for this minibatch when the noise scale is measured and the minibatch has
        at least 2 micro-batches; otherwise the no-op `NO_PROBE`."""
        if noise is None or sequences <= micro:
            return NO_PROBE
        return NoiseProbe(params, normalizer)

    def _flat_grad(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])

    def after_micro(self, token_share: float, sequences: int) -> None:
        """After micro-batch i's backward: token_share = n_i / N, sequences = b_i (skipped
        zero-gradient rows included: their gradient is exactly 0). With n_i = 0, |g_i|^2 is
        non-finite and the minibatch's reading is dropped in `end_minibatch`."""
        t0 = time.perf_counter()
        flat = self._flat_grad()
        increment = flat if self.accumulated is None else flat - self.accumulated  # (n_i/N) g_i
        self.micro_grad_sq.append(float((increment / token_share).pow(2).sum()))
        self.micro_sequences.append(int(sequences))
        self.accumulated = flat
        self.seconds += time.perf_counter() - t0

    def after_rows(self, response_mask: torch.Tensor, rows: torch.Tensor) -> None:
        """`after_micro` for the micro-batch of `rows` (skipped rows included), its token
        share counted from `response_mask` (N, L); counted only while probing."""
        self.after_micro(float(response_mask[rows].sum()) / self.normalizer, len(rows))

    def reading(self) -> tuple[float, float, float]:
        """(|G_small|^2, |G_big|^2, b_small = b_eff); NaN norms when nothing was recorded."""
        if self.accumulated is None or not self.micro_grad_sq:
            return math.nan, math.nan, math.nan
        return (sum(self.micro_grad_sq) / len(self.micro_grad_sq),
                float(self.accumulated.pow(2).sum()), effective_small_batch(self.micro_sequences))

    def end_minibatch(self, noise: NoiseScaleEMA, sequences: int, res: UpdateResult) -> None:
        """Fold this minibatch's reading into `noise` (not when a norm is non-finite)."""
        t0 = time.perf_counter()
        small_sq, big_sq, b_small = self.reading()
        if math.isfinite(small_sq) and math.isfinite(big_sq):
            noise.update(small_sq, big_sq, b_small, sequences)
        res.noise_s += self.seconds + time.perf_counter() - t0


class _NoProbe:
    """The probe of a minibatch whose noise scale is not measured: watches nothing."""

    ordered = True

    def after_rows(self, response_mask: torch.Tensor, rows: torch.Tensor) -> None:
        pass

    def end_minibatch(self, noise, sequences: int, res: UpdateResult) -> None:
        pass


NO_PROBE = _NoProbe()


def minibatch_indices(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch's split of the n rows into `minibatches` index tensors (a fresh random
    permutation when there is more than one)."""
    perm = torch.randperm(n, generator=generator) if minibatches > 1 else torch.arange(n)
    return list(perm.chunk(minibatches))


def set_lr(optimizer, lrs: list[float] | None, update: int) -> None:
    """The schedule's LR for optimizer update number `update` (algos.lr.update_lrs); with
    `lrs` None the optimizer keeps the LR it has."""
    if lrs is not None:
        for group in optimizer.param_groups:
            group["lr"] = lrs[update]


def zero_fill(params) -> None:
    """Zero gradients where none were accumulated: a minibatch whose every row was skipped
    still steps, as the unskipped update would (Adam moves on its moments even then)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def step_or_skip(optimizer, loss_sum: float, grad_norm: float, res: UpdateResult) -> bool:
    """Step unless the minibatch's loss or its pre-clipping gradient norm is non-finite (then
    count the update in `res.skipped`); the gradient is dropped either way. False only for a
    non-finite loss: that minibatch is left out of the logged means."""
    finite_loss = math.isfinite(loss_sum)
    if finite_loss and math.isfinite(grad_norm):
        optimizer.step()
    else:
        res.skipped += 1
    optimizer.zero_grad(set_to_none=True)
    return finite_loss


def clip(params, max_grad_norm: float | None) -> float:
    """Clip the accumulated gradient to `max_grad_norm` (None or 0: no clipping); returns the
    norm before clipping."""
    limit = max_grad_norm if max_grad_norm else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, limit))


@dataclass
class ActorSums:
    """Sums over micro-batches. loss, kl, clip: shares of a minibatch's means (each
    micro-batch divides by the minibatch's tokens); entropy, approx_kl: sums over the valid
    tokens of the forwarded rows, `forwarded` their count."""

    loss: float = 0.0
    kl: float = 0.0
    clip: float = 0.0
    entropy: float = 0.0
    approx_kl: float = 0.0
    forwarded: float = 0.0

    def add(self, other: ActorSums) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class ActorTotals:
    """The update's totals over its applied minibatches, and the logged statistics."""

    sums: ActorSums = field(default_factory=ActorSums)
    grad_norm: float = 0.0
    clip_max: float = -math.inf
    applied: int = 0

    def add(self, mb: ActorSums, grad_norm: float) -> None:
        self.sums.add(mb)
        self.grad_norm += grad_norm
        self.clip_max = max(self.clip_max, mb.clip)
        self.applied += 1

    def stats(self) -> dict:
        n, s, tok, nan = self.applied, self.sums, self.sums.forwarded, float("nan")
        return {"actor/loss": s.loss / n if n else nan,
                "actor/grad_norm": self.grad_norm / n if n else nan,
                "actor/clip_frac": s.clip / max(1, n), "actor/kl": s.kl / max(1, n),
                "actor/clip_frac_max": self.clip_max if n else nan,
                "actor/entropy": s.entropy / tok if tok else nan,
                "actor/approx_kl": s.approx_kl / tok if tok else nan}


def actor_update(model, optimizer, batch: SeqBatch, old_logp: torch.Tensor,
                 advantages: torch.Tensor, ref_logp: torch.Tensor | None, *, temperature: float,
                 clip_low: float, clip_high: float, kl_coef: float, minibatches: int,
                 epochs: int, micro: int, max_grad_norm: float | None,
                 generator: torch.Generator, noise: NoiseScaleEMA | None,
                 lrs: list[float] | None = None) -> UpdateResult:
    """Clipped-surrogate (+ k3 KL) updates. old_logp, ref_logp (N, L); advantages (N,) or
    (N, L); `lrs`: the LR of each of the epochs x minibatches updates, in order (None: as
    set). Also logs the entropy and KL(pi_old || pi) of the forwarded tokens."""
    params = [p for p in model.parameters() if p.requires_grad]
    res, totals = UpdateResult(), ActorTotals()
    kl_on = ref_logp is not None and kl_coef > 0
    skip = zero_gradient_rows(advantages, batch.response_mask, kl_on)  # (N,) no gradient
    lengths = batch.real_lengths()  # (N,) prompt + response tokens
    model.train()
    for epoch in range(epochs):
        for m, idx in enumerate(minibatch_indices(len(batch), minibatches, generator)):
            set_lr(optimizer, lrs, epoch * minibatches + m)
            normalizer = float(batch.response_mask[idx].sum())  # the minibatch's tokens
            probe = NoiseProbe.watch(noise, params, len(idx), micro, normalizer)
            sums = ActorSums()
            for chunk in micro_batches(idx, lengths, micro, by_length=probe.ordered):
                live = chunk[~skip[chunk]]
                if len(live):
                    loss, part = actor_loss(model, batch.rows(live).trimmed(), old_logp[live],
                                            advantages[live],
                                            ref_logp[live] if kl_on else None, normalizer,
                                            temperature, clip_low, clip_high, kl_coef)
                    loss.backward()
                    sums.add(part)
                probe.after_rows(batch.response_mask, chunk)
            if bool(skip[idx].all()):
                zero_fill(params)
            probe.end_minibatch(noise, len(idx), res)
            grad_norm = clip(params, max_grad_norm)
            if step_or_skip(optimizer, sums.loss, grad_norm, res):
                totals.add(sums, grad_norm)
    res.stats = totals.stats()
    res.stats["actor/zero_grad_skipped"] = float(skip.float().mean())
    if noise is not None and noise.count:
        res.stats["actor/noise_scale"] = noise.b_simple
    return res


def actor_loss(model, b: SeqBatch, old_logp: torch.Tensor, advantages: torch.Tensor,
               ref_logp: torch.Tensor | None, normalizer: float, temperature: float,
               clip_low: float, clip_high: float,
               kl_coef: float) -> tuple[torch.Tensor, ActorSums]:
    """The loss of one trimmed micro-batch `b` (m rows, t response columns) as its share of
    the minibatch's mean, and its detached sums. old_logp, ref_logp (m, L) and advantages
    (m,) or (m, L) are cut to its t columns."""
    t = b.response_ids.shape[1]
    mask = b.response_mask  # (m, t)
    old = old_logp[:, :t]  # (m, t)
    logp, entropy = forward_logprobs_entropy(model, b, temperature)  # (m, t) each
    adv = advantages if advantages.dim() == 1 else advantages[:, :t]
    per_tok, clipped = clipped_surrogate(logp, old, adv, clip_low, clip_high)
    part = ActorSums()
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp[:, :t])
        per_tok = per_tok + kl_coef * kl
        part.kl = float(aggregate(kl.detach(), mask, normalizer))
    loss = aggregate(per_tok, mask, normalizer)
    part.loss = float(loss.detach())
    part.clip = float(aggregate(clipped.float(), mask, normalizer))
    part.entropy = masked_sum(entropy, mask)
    part.approx_kl = masked_sum(kl_k3(old, logp.detach()), mask)  # KL(pi_old || pi)
    part.forwarded = float(mask.sum())
    return loss, part


def critic_update(critic, optimizer, batch: SeqBatch, old_values: torch.Tensor,
                  returns: torch.Tensor, *, value_clip: float | None, minibatches: int,
                  epochs: int, micro: int, max_grad_norm: float | None,
                  generator: torch.Generator, noise: NoiseScaleEMA | None,
                  lrs: list[float] | None = None) -> UpdateResult:
    """Clipped value-loss updates. old_values (the critic's values before this update),
    returns (N, L); `lrs` as in actor_update. Also logs critic/explained_variance of
    old_values against the returns."""
    params = [p for p in critic.parameters() if p.requires_grad]
    res = UpdateResult()
    loss_total = grad_norm_total = 0.0
    applied = 0
    lengths = batch.real_lengths()  # (N,)
    critic.train()
    for epoch in range(epochs):
        for m, idx in enumerate(minibatch_indices(len(batch), minibatches, generator)):
            set_lr(optimizer, lrs, epoch * minibatches + m)
            normalizer = float(batch.response_mask[idx].sum())
            probe = NoiseProbe.watch(noise, params, len(idx), micro, normalizer)
            loss_sum = 0.0
            for chunk in micro_batches(idx, lengths, micro, by_length=probe.ordered):
                b = batch.rows(chunk).trimmed()
                loss = critic_loss(critic, b, old_values[chunk], returns[chunk], normalizer,
                                   value_clip)
                loss.backward()
                loss_sum += float(loss.detach())
                probe.after_rows(batch.response_mask, chunk)
            probe.end_minibatch(noise, len(idx), res)
            grad_norm = clip(params, max_grad_norm)
            if step_or_skip(optimizer, loss_sum, grad_norm, res):
                loss_total += loss_sum
                grad_norm_total += grad_norm
                applied += 1
    nan = float("nan")
    res.stats = {"critic/loss": loss_total / applied if applied else nan,
                 "critic/grad_norm": grad_norm_total / applied if applied else nan,
                 "critic/explained_variance": explained_variance(old_values, returns,
                                                                 batch.response_mask)}
    if noise is not None and noise.count:
        res.stats["critic/noise_scale"] = noise.b_simple
    return res


def critic_loss(critic, b: SeqBatch, old_values: torch.Tensor, returns: torch.Tensor,
                normalizer: float, value_clip: float | None) -> torch.Tensor:
    """The value loss of one trimmed micro-batch `b` (m rows, t response columns) as its
    share of the minibatch's mean; old_values, returns (m, L) are cut to its t columns."""
    t = b.response_ids.shape[1]
    values = critic(b)  # (m, t)
    per_tok = clipped_value_loss(values, old_values[:, :t], returns[:, :t], value_clip)
    return aggregate(per_tok, b.response_mask, normalizer)
