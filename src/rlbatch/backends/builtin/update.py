"""Optimizer updates for the actor and the critic: minibatches x epochs, micro-batch
gradient accumulation, gradient clipping, non-finite handling and (opt-in) the gradient noise
scale. Orchestration only: every formula comes from `rlbatch.algos`.

Normalization: each micro-batch loss is `aggregate(..., normalizer=minibatch tokens)` so the
accumulated gradient equals the minibatch gradient for any micro-batch size (docs/design.md,
house rule 3).

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

Noise scale (McCandlish et al. 2018, App. A.1; `_NoiseProbe`): with k >= 2 micro-batches
of b_i sequences in a minibatch of B sequences, |G_small|^2 is the mean over micro-batches of
the squared norm of that micro-batch's own mean gradient, at the small batch
b_eff = 1/mean_i(1/b_i) (the harmonic mean: b when `micro` divides B, less when the last
micro-batch is shorter), and |G_big|^2 the squared norm of the accumulated minibatch
gradient. The estimator assumes each micro-batch is a random subset of the minibatch:
micro-batches of length-sorted rows are strata, whose means differ systematically (long and
short responses pull differently), which inflates |G_small|^2 and so tr(Sigma) and B_simple.
So while the probe runs, micro-batches are consecutive slices of `micro` sequences of the
minibatch's random permutation (not length-ordered; still trimmed and still skipping
zero-gradient rows, neither of which changes a micro-batch's gradient). Updates are then
slower on variable-length workloads. Measuring it costs one flat copy of the gradient per
micro-batch; the trainer reports that time as `time/noise_scale`.

Diagnostics without an extra forward (`algos.diagnostics`, docs/metrics.md): the actor's
forward returns the per-token entropy with the log-probabilities (one log-softmax), and the
k3 estimate of KL(pi_old || pi) comes from those log-probabilities and the rollout's; both are
token-weighted over the valid tokens of the rows actually forwarded (skipped zero-gradient
rows are not), over every minibatch and epoch. The critic's explained variance uses the
values it received (computed before its update) and the returns. None of them enters a loss.
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
from rlbatch.backends.builtin.batch import SeqBatch, forward_logprobs, micro_batches


@dataclass
class UpdateResult:
    stats: dict = field(default_factory=dict)
    skipped: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    noise_s: float = 0.0


class _NoiseProbe:
    """Squared gradient norms of one minibatch for the two-batch estimator (McCandlish et al.
    2018, App. A.1; `algos.noise_scale`), read off the gradient accumulation.

    Micro-batch i adds its share of the minibatch gradient to `p.grad`: with n_i its valid
    tokens and N the minibatch's (the loss normalizer, `aggregate`),

        accumulated_after_i - accumulated_before_i = (n_i / N) g_i,

    g_i being micro-batch i's own token-mean gradient. `after_micro` takes that increment,
    divides it by `token_share` = n_i / N to get g_i and keeps |g_i|^2 and b_i (the
    micro-batch's sequences, skipped zero-gradient rows included: their gradient is exactly 0
    and their tokens count in n_i). `finish` returns

        |G_small|^2 = mean_i |g_i|^2   at b_small = b_eff = 1 / mean_i(1/b_i),
        |G_big|^2   = |accumulated minibatch gradient|^2   (at the minibatch's sequences).

    Costs one flat copy of the gradient per micro-batch, timed in `seconds`.
    """

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.accumulated: torch.Tensor | None = None  # flat gradient so far (None: all zero)
        self.micro_sq: list[float] = []  # |g_i|^2 per micro-batch
        self.micro_sequences: list[int] = []  # b_i per micro-batch
        self.seconds = 0.0

    @classmethod
    def maybe(cls, noise: NoiseScaleEMA | None, params, sequences: int,
              micro: int) -> _NoiseProbe | None:
        """A probe when the noise scale is measured and the minibatch has >= 2 micro-batches."""
        return cls(params) if noise is not None and sequences > micro else None

    def _flat_grad(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])

    def after_micro(self, token_share: float, sequences: int) -> None:
        """Record micro-batch i after its backward: token_share = n_i / N, sequences = b_i.
        A micro-batch without valid tokens (n_i = 0) has no mean gradient: its |g_i|^2 is
        non-finite and the minibatch's reading is dropped (`_feed_noise`)."""
        t0 = time.perf_counter()
        flat = self._flat_grad()
        increment = flat if self.accumulated is None else flat - self.accumulated  # (n_i/N) g_i
        own_mean_grad = increment / token_share  # g_i
        self.micro_sq.append(float(own_mean_grad.pow(2).sum()))
        self.micro_sequences.append(int(sequences))
        self.accumulated = flat
        self.seconds += time.perf_counter() - t0

    def finish(self) -> tuple[float, float, float]:
        """(|G_small|^2, |G_big|^2, b_small = b_eff); NaN norms when nothing was recorded."""
        t0 = time.perf_counter()
        if self.accumulated is None or not self.micro_sq:
            return math.nan, math.nan, math.nan
        big_sq = float(self.accumulated.pow(2).sum())
        small_sq = sum(self.micro_sq) / len(self.micro_sq)
        b_small = effective_small_batch(self.micro_sequences)
        self.seconds += time.perf_counter() - t0
        return small_sq, big_sq, b_small


def _feed_noise(probe: _NoiseProbe | None, noise: NoiseScaleEMA | None, sequences: int,
                res: UpdateResult) -> None:
    """Fold one minibatch's probe reading into the EMA (not when a norm is non-finite)."""
    if probe is None:
        return
    small_sq, big_sq, b_small = probe.finish()
    if math.isfinite(small_sq) and math.isfinite(big_sq):
        noise.update(small_sq, big_sq, b_small, sequences)
    res.noise_s += probe.seconds


def _set_lr(optimizer, lrs: list[float] | None, update: int) -> None:
    """The schedule's LR for this update (algos.lr.update_lrs), when the caller gives one."""
    if lrs is not None:
        for group in optimizer.param_groups:
            group["lr"] = lrs[update]


def _minibatches(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    perm = torch.randperm(n, generator=generator) if minibatches > 1 else torch.arange(n)
    return list(perm.chunk(minibatches))


def _walk(batch, epochs: int, minibatches: int, generator: torch.Generator, optimizer,
          lrs: list[float] | None, noise, params, micro: int):
    """The optimizer minibatches of one update, as both the actor and the critic walk them:
    per epoch a fresh split, each minibatch's LR set, then (indices, its response tokens (the
    loss normaliser), the noise probe when this minibatch feeds one, its micro-batches:
    ordered by length unless probed)."""
    lengths = batch.real_lengths()  # (N,)
    for epoch in range(epochs):
        for m, idx in enumerate(_minibatches(len(batch), minibatches, generator)):
            _set_lr(optimizer, lrs, epoch * minibatches + m)
            tokens = float(batch.response_mask[idx].sum())
            probe = _NoiseProbe.maybe(noise, params, len(idx), micro)
            yield idx, tokens, probe, micro_batches(idx, lengths, micro, by_length=probe is None)


def _zero_fill(params) -> None:
    """Zero gradients for a minibatch whose every row was skipped (see the module docstring)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def _step(params, optimizer, loss_sum: float, max_grad_norm: float | None,
          res: UpdateResult) -> float | None:
    """Clip and step unless the loss or the gradient is non-finite (then drop the gradient and
    count the update in `res.skipped`). Returns the pre-clipping gradient norm, or None when
    the loss was non-finite."""
    if not math.isfinite(loss_sum):
        optimizer.zero_grad(set_to_none=True)
        res.skipped += 1
        return None
    norm = float(torch.nn.utils.clip_grad_norm_(
        params, max_grad_norm if max_grad_norm else float("inf")))
    if math.isfinite(norm):
        optimizer.step()
    else:
        res.skipped += 1
    optimizer.zero_grad(set_to_none=True)
    return norm


@dataclass
class _ActorSums:
    """Sums over the micro-batches of one minibatch. loss, kl, clip: this minibatch's means
    (each micro-batch divides by the minibatch's tokens, so their shares add up to the mean);
    entropy, approx_kl: sums over the valid tokens of the forwarded rows, `forwarded` their
    count (token-weighted means are divided once, at the end of the step)."""

    loss: float = 0.0
    kl: float = 0.0
    clip: float = 0.0
    entropy: float = 0.0
    approx_kl: float = 0.0
    forwarded: float = 0.0

    def add(self, other: _ActorSums) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _ActorTotals:
    """The step's totals over its applied minibatches (non-finite loss: left out)."""

    sums: _ActorSums = field(default_factory=_ActorSums)
    norm: float = 0.0
    clip_max: float = -math.inf
    updates: int = 0

    def add(self, mb: _ActorSums, norm: float) -> None:
        self.sums.add(mb)
        self.norm += norm
        self.clip_max = max(self.clip_max, mb.clip)
        self.updates += 1

    def stats(self, diagnostics: bool) -> dict:
        n, s, nan = self.updates, self.sums, float("nan")
        out = {"actor/loss": s.loss / n if n else nan,
               "actor/grad_norm": self.norm / n if n else nan,
               "actor/clip_frac": s.clip / max(1, n), "actor/kl": s.kl / max(1, n)}
        if diagnostics:
            tok = s.forwarded
            out.update({"actor/clip_frac_max": self.clip_max if n else nan,
                        "actor/entropy": s.entropy / tok if tok else nan,
                        "actor/approx_kl": s.approx_kl / tok if tok else nan})
        return out


def actor_update(model, optimizer, batch: SeqBatch, old_logp: torch.Tensor,
                 advantages: torch.Tensor, ref_logp: torch.Tensor | None, *, temperature: float,
                 clip_low: float, clip_high: float, kl_coef: float, minibatches: int,
                 epochs: int, micro: int, max_grad_norm: float | None,
                 generator: torch.Generator, noise: NoiseScaleEMA | None,
                 lrs: list[float] | None = None, diagnostics: bool = True) -> UpdateResult:
    """Clipped-surrogate (+ k3 KL) updates. old_logp, ref_logp (N, T); advantages (N,) or (N, T).
    `lrs`: the LR of each of the epochs x minibatches updates, in order (None: as set).
    `diagnostics`: also log actor/entropy, actor/approx_kl and actor/clip_frac_max (from the
    update's own forwards; the gradient is the same either way)."""
    params = [p for p in model.parameters() if p.requires_grad]
    res = UpdateResult()
    totals = _ActorTotals()
    kl_on = ref_logp is not None and kl_coef > 0
    skip = zero_gradient_rows(advantages, batch.response_mask, kl_on)  # (N,) bool
    opts = {"temperature": temperature, "clip_low": clip_low, "clip_high": clip_high,
            "kl_coef": kl_coef, "diagnostics": diagnostics}
    model.train()
    for idx, tokens, probe, chunks in _walk(batch, epochs, minibatches, generator, optimizer,
                                            lrs, noise, params, micro):
        sums = _ActorSums()
        for chunk in chunks:
            live = chunk[~skip[chunk]]
            if len(live):
                sums.add(_actor_micro(model, batch.rows(live).trimmed(), old_logp[live],
                                      advantages[live], ref_logp[live] if kl_on else None,
                                      tokens, **opts))
            if probe is not None:
                probe.after_micro(float(batch.response_mask[chunk].sum()) / tokens,
                                  len(chunk))
        if bool(skip[idx].all()):
            _zero_fill(params)
        _feed_noise(probe, noise, len(idx), res)
        norm = _step(params, optimizer, sums.loss, max_grad_norm, res)
        if norm is not None:
            totals.add(sums, norm)
    res.stats = totals.stats(diagnostics)
    res.stats["actor/zero_grad_skipped"] = float(skip.float().mean())
    if noise is not None and noise.count:
        res.stats["actor/noise_scale"] = noise.b_simple
    return res


def _actor_micro(model, b: SeqBatch, old_logp: torch.Tensor, advantages: torch.Tensor,
                 ref_logp: torch.Tensor | None, tokens: float, *, temperature: float,
                 clip_low: float, clip_high: float, kl_coef: float,
                 diagnostics: bool) -> _ActorSums:
    """Forward and backward of one trimmed micro-batch `b` (m rows, t response columns);
    old_logp, ref_logp (m, T) and advantages (m,) or (m, T) are cut to its t columns.
    Returns this micro-batch's shares of the minibatch's loss, KL and clipped fraction, and
    (with `diagnostics`) its token sums of the entropy and of the approximate KL."""
    t = b.response_ids.shape[1]
    mask = b.response_mask  # (m, t)
    old = old_logp[:, :t]  # (m, t)
    if diagnostics:
        logp, entropy = forward_logprobs(model, b, temperature, with_entropy=True)  # (m, t)
    else:
        logp, entropy = forward_logprobs(model, b, temperature), None  # (m, t)
    adv = advantages if advantages.dim() == 1 else advantages[:, :t]
    per_tok, clipped = clipped_surrogate(logp, old, adv, clip_low, clip_high)
    out = _ActorSums()
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp[:, :t])
        per_tok = per_tok + kl_coef * kl
        out.kl = float(aggregate(kl.detach(), mask, tokens))
    loss = aggregate(per_tok, mask, tokens)
    loss.backward()
    out.loss = float(loss.detach())
    out.clip = float(aggregate(clipped.float(), mask, tokens))
    if entropy is not None:
        out.entropy = masked_sum(entropy, mask)
        out.approx_kl = masked_sum(kl_k3(old, logp.detach()), mask)  # KL(pi_old || pi)
        out.forwarded = float(mask.sum())
    return out


def critic_update(critic, optimizer, batch: SeqBatch, old_values: torch.Tensor,
                  returns: torch.Tensor, *, value_clip: float | None, minibatches: int,
                  epochs: int, micro: int, max_grad_norm: float | None,
                  generator: torch.Generator, noise: NoiseScaleEMA | None,
                  lrs: list[float] | None = None) -> UpdateResult:
    """Clipped value-loss updates. old_values (the critic's values before this update),
    returns (N, T). `lrs` as in actor_update. Also logs critic/explained_variance of
    old_values against the returns."""
    params = [p for p in critic.parameters() if p.requires_grad]
    res = UpdateResult()
    tot_loss = tot_norm = 0.0
    steps = 0
    critic.train()
    for idx, tokens, probe, chunks in _walk(batch, epochs, minibatches, generator, optimizer,
                                            lrs, noise, params, micro):
        loss_sum = 0.0
        for chunk in chunks:
            b = batch.rows(chunk).trimmed()
            loss_sum += _critic_micro(critic, b, old_values[chunk], returns[chunk], tokens,
                                      value_clip)
            if probe is not None:
                probe.after_micro(float(b.response_mask.sum()) / tokens, len(chunk))
        _feed_noise(probe, noise, len(idx), res)
        norm = _step(params, optimizer, loss_sum, max_grad_norm, res)
        if norm is not None:
            tot_loss += loss_sum
            tot_norm += norm
            steps += 1
    res.stats = {"critic/loss": tot_loss / steps if steps else float("nan"),
                 "critic/grad_norm": tot_norm / steps if steps else float("nan"),
                 "critic/explained_variance": explained_variance(old_values, returns,
                                                                 batch.response_mask)}
    if noise is not None and noise.count:
        res.stats["critic/noise_scale"] = noise.b_simple
    return res


def _critic_micro(critic, b: SeqBatch, old_values: torch.Tensor, returns: torch.Tensor,
                  tokens: float, value_clip: float | None) -> float:
    """Forward and backward of one trimmed micro-batch `b` (m rows, t response columns);
    old_values, returns (m, T) are cut to its t columns. Returns its share of the loss."""
    t = b.response_ids.shape[1]
    values = critic(b)  # (m, t)
    per_tok = clipped_value_loss(values, old_values[:, :t], returns[:, :t], value_clip)
    loss = aggregate(per_tok, b.response_mask, tokens)
    loss.backward()
    return float(loss.detach())
