"""Training diagnostics (docs/metrics.md): actor/entropy, actor/approx_kl, actor/clip_frac(_max),
critic/explained_variance and the advantage-group stats. Formulas against hand-computed
values; the update's values against separate explicit forwards."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlbatch.algos.advantages import grpo_advantages
from rlbatch.algos.diagnostics import explained_variance, masked_sum
from rlbatch.algos.losses import (
    clipped_surrogate,
    kl_k3,
    token_logprobs,
    token_logprobs_and_entropy,
)
from rlbatch.backends.builtin.batch import build_batch, forward_logprobs, response_logits
from rlbatch.backends.builtin.critic import ValueModel
from rlbatch.backends.builtin.update import actor_update, critic_update
from test_grad_invariance import GROUP_ADV, GradCapture, _varied_rollouts

LN2 = math.log(2.0)


# ---- the formulas ----
def test_kl_k3_hand_computed_in_both_roles():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    logp = old + torch.tensor([[LN2, -LN2, 0.0]])  # ratios pi / pi_old: 2, 1/2, 1
    # KL(pi_old || pi), sampled by pi_old: (r - 1) - log r: (2 - 1) - ln 2, (1/2 - 1) + ln 2, 0
    expect = [1.0 - LN2, -0.5 + LN2, 0.0]
    assert kl_k3(old, logp)[0].tolist() == pytest.approx(expect, abs=1e-6)
    assert kl_k3(old, old).eq(0).all()  # exactly 0 for the same policy
    # the other direction, KL(pi || pi_old) sampled by pi: (1/r - 1) + log r
    assert kl_k3(logp, old)[0].tolist() == pytest.approx([-0.5 + LN2, 1.0 - LN2, 0.0],
                                                         abs=1e-6)


def test_masked_sum_ignores_padding_even_when_it_is_not_finite():
    x = torch.tensor([[1.0, 2.0, math.inf], [4.0, math.nan, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_sum(x, mask) == 7.0
    assert masked_sum(x, torch.zeros_like(mask)) == 0.0


def test_explained_variance_hand_computed_and_limits():
    mask = torch.tensor([[True, True, False], [True, True, True]])
    returns = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, 5.0]])  # valid: 1..5, Var = 2
    # values off by (0, 0, 1, -1, 0) on the valid tokens: Var(R - V) = 2/5 - 0 = 0.4
    values = torch.tensor([[1.0, 2.0, -7.0], [2.0, 5.0, 5.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(1 - 0.4 / 2, abs=1e-12)
    assert explained_variance(returns, returns, mask) == 1.0  # a perfect critic
    # the variance of the residual, not its mean square: a constant offset is not counted
    # (cleanrl's np.var(y - y_hat)); here the mean square would give 1 - 1/2
    assert explained_variance(returns - 1.0, returns, mask) == 1.0
    mean_only = torch.full_like(returns, 3.0)  # predicts the mean valid return
    assert explained_variance(mean_only, returns, mask) == pytest.approx(0.0, abs=1e-12)
    worse = torch.full_like(returns, 3.0) - (returns - 3.0)  # anti-correlated: below 0
    assert explained_variance(worse, returns, mask) == pytest.approx(1 - 8 / 2, abs=1e-12)
    # Var(returns) = 0 (or no valid token): undefined, NaN, never 0 or 1 or a division error
    assert math.isnan(explained_variance(values, torch.full_like(returns, 2.0), mask))
    assert math.isnan(explained_variance(values, returns, torch.zeros_like(mask)))


def test_token_logprobs_and_entropy_match_the_separate_functions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, generator=g, requires_grad=True)
    targets = torch.randint(0, 7, (3, 4), generator=g)
    lp, ent = token_logprobs_and_entropy(logits, targets, 0.7)
    assert torch.equal(lp, token_logprobs(logits, targets, 0.7))
    assert torch.allclose(ent, entropy_from_logits(logits, 0.7), atol=1e-6)
    assert not ent.requires_grad and lp.requires_grad
    # uniform over V: log V; one certain token (others -inf): 0, not NaN
    flat = torch.zeros(1, 1, 5)
    assert token_logprobs_and_entropy(flat, torch.zeros(1, 1, dtype=torch.long))[1].item() == \
        pytest.approx(math.log(5), abs=1e-6)
    sure = torch.tensor([[[0.0, -math.inf, -math.inf]]])
    assert token_logprobs_and_entropy(sure, torch.zeros(1, 1, dtype=torch.long))[1].item() == 0.0


# ---- the update's diagnostics against explicit forwards ----
def _perturbed(model, scale=0.05, seed=1):
    """A changed copy of the model (the policy after some updates)."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


def entropy_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T, V) -> (B, T) entropy of softmax(logits / T), the textbook form."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _run(model, ro, old_logp, adv, *, minibatches=1, epochs=1, micro=3, kl_coef=0.0):
    batch = build_batch(ro, pad_id=0)
    opt = GradCapture(model.parameters())  # records the gradient, never moves the model
    model.zero_grad(set_to_none=True)
    ref = ro.logprobs - 0.05 * ro.mask if kl_coef else None
    res = actor_update(model, opt, batch, old_logp, adv, ref, temperature=0.8, clip_low=0.2,
                       clip_high=0.28, kl_coef=kl_coef, minibatches=minibatches, epochs=epochs,
                       micro=micro, max_grad_norm=None,
                       generator=torch.Generator().manual_seed(0), noise=None)
    return opt.grads, res.stats


def _explicit(model, ro, old_logp, rows):
    """Token-weighted entropy and k3 approx KL over `rows`, from one padded forward."""
    batch = build_batch(ro, pad_id=0, extra_left_pad=2)
    with torch.no_grad():
        logits = response_logits(model, batch)
        logp = token_logprobs(logits, batch.response_ids, 0.8)
    mask = batch.response_mask.clone()
    mask[~rows] = False
    ent = entropy_from_logits(logits, 0.8)
    kl = (logp - old_logp).exp() - 1 - (logp - old_logp)
    n = float(mask.sum())
    return float(ent[mask].sum()) / n, float(kl[mask].sum()) / n


def test_approx_kl_is_zero_for_the_rollout_policy_and_positive_after_a_change(small_llama):
    model = small_llama.float()
    ro = _varied_rollouts()
    adv = torch.linspace(-1, 1, ro.mask.shape[0]) + 0.01  # every row forwarded
    with torch.no_grad():  # old log-probs from a teacher-forced forward of the same model
        old = forward_logprobs(model, build_batch(ro, pad_id=0), 0.8)
    _, stats = _run(model, ro, old, adv)
    assert 0.0 <= stats["actor/approx_kl"] < 1e-9  # the same policy, up to padding numerics
    assert stats["actor/clip_frac"] == 0.0 and stats["actor/clip_frac_max"] == 0.0
    changed = _perturbed(model)
    _, stats = _run(changed, ro, old, adv)
    ent, kl = _explicit(changed, ro, old, torch.ones(len(adv), dtype=torch.bool))
    assert kl > 1e-4
    assert stats["actor/approx_kl"] == pytest.approx(kl, rel=1e-5)
    assert stats["actor/entropy"] == pytest.approx(ent, rel=1e-5)


def test_entropy_and_approx_kl_average_over_forwarded_rows_every_minibatch_and_epoch(
        small_llama):
    """GROUP_ADV skips 4 of 8 rows (zero gradient, never forwarded): the diagnostics are the
    token-weighted means over the 4 forwarded rows; with 2 minibatches x 2 epochs and a model
    that does not move, every forward sees the same policy, so the means are unchanged."""
    model = small_llama.float()
    ro = _varied_rollouts()
    with torch.no_grad():
        old = forward_logprobs(model, build_batch(ro, pad_id=0), 0.8)
    changed = _perturbed(model)
    ent, kl = _explicit(changed, ro, old, GROUP_ADV != 0)
    ent_all, _ = _explicit(changed, ro, old, torch.ones(len(GROUP_ADV), dtype=torch.bool))
    assert abs(ent - ent_all) > 1e-4  # the definition matters on this batch
    for minibatches, epochs, micro in ((1, 1, 8), (1, 1, 1), (2, 2, 2)):
        _, stats = _run(changed, ro, old, GROUP_ADV, minibatches=minibatches, epochs=epochs,
                        micro=micro)
        assert stats["actor/entropy"] == pytest.approx(ent, rel=1e-5)
        assert stats["actor/approx_kl"] == pytest.approx(kl, rel=1e-5)
    # every row skipped: nothing was forwarded, so there is nothing to average
    _, stats = _run(changed, ro, old, torch.zeros(len(GROUP_ADV)))
    assert math.isnan(stats["actor/entropy"]) and math.isnan(stats["actor/approx_kl"])


def test_clip_frac_is_the_mean_over_minibatches_and_clip_frac_max_their_largest(small_llama):
    model = small_llama.float()
    ro = _varied_rollouts()
    n = ro.mask.shape[0]
    adv = torch.linspace(-1, 1, n) + 0.01
    with torch.no_grad():
        old = forward_logprobs(model, build_batch(ro, pad_id=0), 0.8)
    changed = _perturbed(model, scale=0.3)  # far enough from the old policy to clip
    _, stats = _run(changed, ro, old, adv, minibatches=2, micro=2)
    batch = build_batch(ro, pad_id=0)
    with torch.no_grad():
        logp = forward_logprobs(changed, batch, 0.8)
    _, clipped = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))  # as the update's
    fracs = [float(clipped[idx][batch.response_mask[idx]].float().mean())
             for idx in perm.chunk(2)]
    assert max(fracs) > 0 and fracs[0] != fracs[1]
    assert stats["actor/clip_frac"] == pytest.approx(sum(fracs) / 2, rel=1e-6)
    assert stats["actor/clip_frac_max"] == pytest.approx(max(fracs), rel=1e-6)


# ---- critic ----
def _critic_stats(critic, ro, old_values, returns):
    critic = copy.deepcopy(critic)
    batch = build_batch(ro, pad_id=0)
    opt = torch.optim.SGD(critic.parameters(), lr=0.05)  # real steps: the values change
    res = critic_update(critic, opt, batch, old_values, returns, value_clip=0.2, minibatches=2,
                        epochs=2, micro=2, max_grad_norm=None, generator=torch.Generator(),
                        noise=None)
    return res.stats


def _trained_values(critic, ro, old_values, returns):
    """The critic's values after the same update `_critic_stats` runs."""
    critic = copy.deepcopy(critic)
    batch = build_batch(ro, pad_id=0)
    opt = torch.optim.SGD(critic.parameters(), lr=0.05)
    critic_update(critic, opt, batch, old_values, returns, value_clip=0.2, minibatches=2,
                  epochs=2, micro=2, max_grad_norm=None, generator=torch.Generator(), noise=None)
    with torch.no_grad():
        return critic(batch) * ro.mask


def test_critic_explained_variance_uses_the_values_before_the_update(small_llama):
    torch.manual_seed(0)
    critic = ValueModel(small_llama.float())
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ro = _varied_rollouts()
    mask = ro.mask
    g = torch.Generator().manual_seed(4)
    returns = torch.randn(mask.shape, generator=g) * mask
    # perfect old values: 1 whatever the critic's weights and its update do
    assert _critic_stats(critic, ro, returns.clone(), returns)["critic/explained_variance"] \
        == 1.0
    mean = float(returns[mask].mean())
    st = _critic_stats(critic, ro, torch.full_like(returns, mean) * mask, returns)
    assert st["critic/explained_variance"] == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        values = critic(build_batch(ro, pad_id=0)) * mask
    st = _critic_stats(critic, ro, values, returns)
    assert st["critic/explained_variance"] == pytest.approx(
        explained_variance(values, returns, mask), abs=1e-12)
    assert math.isfinite(st["critic/loss"])
    after = _trained_values(critic, ro, values, returns)
    # the update moved the values; the logged figure is still the one of the values before
    assert explained_variance(after, returns, mask) != pytest.approx(
        st["critic/explained_variance"], abs=1e-4)
    st = _critic_stats(critic, ro, values, torch.full_like(returns, 0.5) * mask)
    assert math.isnan(st["critic/explained_variance"])  # Var(returns) = 0


# ---- advantage groups ----
def test_group_stats_split_equal_reward_groups_when_rewards_are_binary():
    # groups of 4: all right, all wrong, mixed, all wrong
    r = torch.tensor([1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.0, 1.0] + [0.0] * 4)
    _, stats = grpo_advantages(r, 4)
    assert stats == {"adv/zero_std_groups": 0.75, "adv/all_correct_groups": 0.25,
                     "adv/all_wrong_groups": 0.5}
    # non-binary rewards: only the equal-reward fraction (no "correct" to speak of)
    _, stats = grpo_advantages(torch.tensor([0.5] * 4 + [0.0, 1.0, 2.0, 0.0]), 4)
    assert stats == {"adv/zero_std_groups": 0.5}


def test_group_stats_with_dropped_samples():
    # groups of 3, dropped samples (valid False) out of their group:
    # (1, [9], 1): all correct; (0, [5], [5]): one valid sample, wrong -> all wrong;
    # ([7], [7], [7]): no valid sample -> equal but neither kind; (1, 0, 0): signal.
    # The dropped 9, 5 and 7 do not make the rewards non-binary.
    r = torch.tensor([1.0, 9.0, 1.0, 0.0, 5.0, 5.0, 7.0, 7.0, 7.0, 1.0, 0.0, 0.0])
    valid = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    _, stats = grpo_advantages(r, 3, valid=valid)
    assert stats == {"adv/zero_std_groups": 0.75, "adv/all_correct_groups": 0.25,
                     "adv/all_wrong_groups": 0.25}
