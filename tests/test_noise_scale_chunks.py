"""Two-batch noise-scale estimator with unequal micro-batches (McCandlish et al. 2018,
App. A.1; algos/noise_scale.py). A minibatch of B sequences that `micro` does not divide ends
on a shorter micro-batch; E|g_i|^2 = |G|^2 + tr(Sigma)/b_i, so the mean over micro-batches
belongs to b_eff = 1/mean(1/b_i), not to `micro`. Also: the update's probe squares each
micro-batch's own token-mean gradient and passes b_eff to the estimator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rlbatch.algos.losses import aggregate, clipped_surrogate
from rlbatch.algos.noise_scale import NoiseScaleEMA, effective_small_batch, two_batch_estimate
from rlbatch.backends.builtin.batch import build_batch, forward_logprobs
from rlbatch.backends.builtin.update import NoiseProbe, actor_update
from test_grad_invariance import _varied_rollouts


def test_effective_small_batch_is_the_harmonic_mean():
    assert effective_small_batch([4, 4, 2]) == pytest.approx(3.0, rel=1e-15)
    assert effective_small_batch([3, 3, 2]) == pytest.approx(18 / 7, rel=1e-15)
    assert effective_small_batch([4, 4, 4]) == 4.0 and type(effective_small_batch([2, 2])) is float
    for bad in ([], [4, 0], [2, -1]):
        with pytest.raises(ValueError, match="positive"):
            effective_small_batch(bad)


def _chunked_norms(rng, trials, sizes, d, grad, sigma):
    """Per trial: per-sample gradients g_j = G + N(0, sigma^2 I_d) for sum(sizes) samples,
    cut into consecutive micro-batches of `sizes`. Returns (mean_i |mean of micro-batch i|^2,
    |mean of all|^2), each of shape (trials,)."""
    b = sum(sizes)
    g = grad + sigma * rng.standard_normal((trials, b, d))  # (trials, B, d)
    bounds = np.cumsum([0, *sizes])
    micro = [g[:, lo:hi].mean(axis=1) for lo, hi in itertools.pairwise(bounds)]  # k x (T, d)
    small = np.mean([(m ** 2).sum(-1) for m in micro], axis=0)  # (T,)
    big = (g.mean(axis=1) ** 2).sum(-1)  # (T,)
    return small, big


def test_monte_carlo_unbiased_with_b_eff_and_biased_with_micro():
    """B = 10 cut by micro = 4 into 4, 4, 2: b_eff = 3. |G|^2 = 1, tr(Sigma) = 3.

    With B_small = b_eff the averaged estimates hit the truth within 3%. With B_small = 4 they
    are biased: E small = |G|^2 + tr/3, so tr_hat = (tr/3 - tr/10)/(1/4 - 1/10) = 1.556 tr
    and |G|^2_hat = (10 big - 4 small)/6 = |G|^2 - tr/18 = 0.833 (both off by far more
    than the tolerance)."""
    rng = np.random.default_rng(0)
    d, trials, sizes = 16, 40_000, [4, 4, 2]
    grad = np.full(d, 1.0 / np.sqrt(d))  # |G|^2 = 1
    true_tr = 3.0
    small, big = _chunked_norms(rng, trials, sizes, d, grad, np.sqrt(true_tr / d))
    b_eff = effective_small_batch(sizes)
    good = two_batch_estimate(small.mean(), big.mean(), b_eff, sum(sizes))
    assert good["trace"] == pytest.approx(true_tr, rel=0.03)
    assert good["grad_sq"] == pytest.approx(1.0, rel=0.03)
    assert good["b_simple"] == pytest.approx(true_tr, rel=0.05)
    bad = two_batch_estimate(small.mean(), big.mean(), 4, sum(sizes))
    assert bad["trace"] == pytest.approx(true_tr * (1 / 3 - 1 / 10) / (1 / 4 - 1 / 10),
                                         rel=0.03)
    assert abs(bad["trace"] / true_tr - 1) > 0.3
    assert abs(bad["grad_sq"] - 1.0) > 0.1
    # the EMA used as the trainer uses it (one pair per minibatch) lands on the same values
    ema = NoiseScaleEMA(decay=0.999)
    for s, b in zip(small[:20_000], big[:20_000]):
        ema.update(float(s), float(b), b_eff, sum(sizes))
    assert ema.trace == pytest.approx(true_tr, rel=0.05)
    assert ema.grad_sq == pytest.approx(1.0, rel=0.05)


def test_equal_micro_batches_give_the_same_estimate_as_before():
    """b_eff = micro when micro divides B: the estimator's inputs are unchanged."""
    est = two_batch_estimate(3.0, 1.5, effective_small_batch([1, 1, 1, 1]), 4)
    assert est == two_batch_estimate(3.0, 1.5, 1, 4) == {"grad_sq": 1.0, "trace": 2.0,
                                                           "b_simple": 2.0}


def test_probe_squares_each_micro_batch_own_mean_gradient():
    """A linear model with per-token losses: the gradient is accumulated with the minibatch's
    token count as normalizer (as the update does), and the probe must recover each
    micro-batch's own token-mean gradient g_i = (sum over its tokens) / n_i."""
    g = torch.Generator().manual_seed(0)
    d = 5
    w = torch.nn.Parameter(torch.randn(d, generator=g))
    tokens_per_row = [3, 1, 4, 2, 5, 1, 2, 3, 1, 2]  # B = 10 rows, unequal token counts
    x = [torch.randn(n, d, generator=g) for n in tokens_per_row]
    chunks = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # micro = 4: 4, 4, 2 rows
    total = float(sum(tokens_per_row))
    probe = NoiseProbe([w])
    own = []
    for rows in chunks:
        feats = torch.cat([x[r] for r in rows])  # (n_i, d)
        per_tok = 0.5 * (feats @ w) ** 2  # (n_i,)
        aggregate(per_tok, torch.ones_like(per_tok, dtype=torch.bool), total).backward()
        probe.after_micro(len(feats) / total, len(rows))
        own.append((feats * (feats @ w.detach())[:, None]).mean(0))  # g_i, token mean
    small, big, b_small = probe.reading()
    assert small == pytest.approx(float(np.mean([float(o.pow(2).sum()) for o in own])),
                                  rel=1e-5)
    full = torch.cat(x)
    assert big == pytest.approx(float((full * (full @ w.detach())[:, None]).mean(0)
                                      .pow(2).sum()), rel=1e-5)
    assert b_small == pytest.approx(3.0, rel=1e-15)


class _Recorder(NoiseScaleEMA):
    def __init__(self):
        super().__init__(0.9)
        self.calls: list[tuple] = []

    def update(self, g_small_sq, g_big_sq, b_small, b_big):
        self.calls.append((g_small_sq, g_big_sq, b_small, b_big))
        return super().update(g_small_sq, g_big_sq, b_small, b_big)


def test_update_passes_b_eff_and_each_micro_batch_own_mean_gradient(small_llama):
    """8 rows, micro = 3 -> micro-batches of 3, 3, 2 rows (consecutive slices: minibatches=1
    keeps the rows in order); two rows have zero advantage and are skipped, yet count in their
    micro-batch's tokens. The recorded |G_small|^2 is the mean of each micro-batch's squared
    own token-mean gradient (an explicit forward per micro-batch, normalized by its own
    tokens), |G_big|^2 the squared full gradient, and b_small = 1/mean(1/3, 1/3, 1/2)."""
    model = small_llama.float()
    ro = _varied_rollouts()
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, 0.0, -0.5, 0.25, -0.25])
    batch = build_batch(ro, pad_id=0)
    rec = _Recorder()
    model.zero_grad(set_to_none=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    actor_update(model, opt, batch, ro.logprobs, adv, None, temperature=0.8, clip_low=0.2,
                 clip_high=0.28, kl_coef=0.0, minibatches=1, epochs=1, micro=3,
                 max_grad_norm=None, generator=torch.Generator().manual_seed(0), noise=rec)
    ((small, big, b_small, b_big),) = rec.calls
    assert b_small == pytest.approx(18 / 7, rel=1e-12) and b_big == 8

    def grad_of(rows, normalizer):
        model.zero_grad(set_to_none=True)
        b = batch.rows(rows)
        logp = forward_logprobs(model, b, 0.8)
        per, _ = clipped_surrogate(logp, ro.logprobs[rows], adv[rows], 0.2, 0.28)
        aggregate(per, b.response_mask, normalizer).backward()
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in model.parameters()])

    parts = [torch.arange(0, 3), torch.arange(3, 6), torch.arange(6, 8)]
    own = [grad_of(r, float(batch.response_mask[r].sum())) for r in parts]
    expect_small = float(np.mean([float(o.pow(2).sum()) for o in own]))
    assert small == pytest.approx(expect_small, rel=1e-4)
    full = grad_of(torch.arange(8), float(batch.response_mask.sum()))
    assert big == pytest.approx(float(full.pow(2).sum()), rel=1e-4)
    # control: the minibatch-normalized shares (not divided by the token share) differ
    shares = [grad_of(r, float(batch.response_mask.sum())) for r in parts]
    assert abs(float(np.mean([float(s.pow(2).sum()) for s in shares])) / expect_small - 1) > 0.1
