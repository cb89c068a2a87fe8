"""Pure-function tests: advantages, GAE, clipped loss regions, masking, LR schedule."""

from __future__ import annotations

import math

import pytest
import torch

from rlbatch.algos.advantages import gae, grpo_advantages, masked_whiten, outcome_token_rewards
from rlbatch.algos.losses import (
    aggregate,
    clipped_surrogate,
    clipped_value_loss,
    kl_k3,
    token_logprobs,
)
from rlbatch.algos.lr import lr_at


def test_grpo_advantages_hand_computed():
    # group 1: rewards 1,0,0,1 -> mean .5, population std .5 -> +1,-1,-1,+1
    # group 2: all equal -> zero advantage (a solved/unsolved group carries no signal)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv, stats = grpo_advantages(r, 4, "std", eps=0.0)
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert stats["adv/zero_std_groups"] == 0.5
    # three of four correct: mean .75, std sqrt(3)/4 -> (1-.75)/(sqrt(3)/4) = 1/sqrt(3)
    adv, _ = grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), 4, "std", eps=0.0)
    assert adv[0].item() == pytest.approx(1 / math.sqrt(3), rel=1e-6)
    assert adv[3].item() == pytest.approx(-math.sqrt(3), rel=1e-6)
    adv, _ = grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), 4, "mean")
    assert adv.tolist() == [0.25, 0.25, 0.25, -0.75]
    with pytest.raises(ValueError):
        grpo_advantages(torch.ones(6), 4)


def _gae_reference(rewards, values, mask, gamma, lam):
    """Slow per-sequence loop straight from Schulman et al. 2016, eq. 16."""
    B, T = values.shape
    adv = torch.zeros(B, T)
    for b in range(B):
        n = int(mask[b].sum())
        for t in range(n):
            total, coef = 0.0, 1.0
            for k in range(t, n):
                v_next = values[b, k + 1].item() if k + 1 < n else 0.0
                delta = rewards[b, k].item() + gamma * v_next - values[b, k].item()
                total += coef * delta
                coef *= gamma * lam
            adv[b, t] = total
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_slow_reference(gamma, lam):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    lengths = torch.tensor([7, 1, 4, 6, 3])
    mask = torch.arange(T)[None] < lengths[:, None]
    values = torch.randn(B, T, generator=g) * mask
    rewards = outcome_token_rewards(torch.randn(B, generator=g), mask)
    rewards = rewards + torch.randn(B, T, generator=g) * 0.1 * mask  # dense rewards too
    adv, ret = gae(rewards, values, mask, gamma, lam)
    ref = _gae_reference(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, ref, atol=1e-5)
    assert torch.allclose(ret, (ref + values) * mask, atol=1e-5)
    assert (adv[~mask] == 0).all()


def test_outcome_rewards_on_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    out = outcome_token_rewards(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[0, 0, 2.0, 0], [-1.0, 0, 0, 0]]


@pytest.mark.parametrize("ratio,adv,expected_loss,clipped", [
    (1.1, 1.0, -1.1, False),     # inside the range, positive advantage
    (1.5, 1.0, -1.2, True),      # above 1+eps_high with A>0: clipped at 1.2
    (0.5, 1.0, -0.5, False),     # below 1-eps with A>0: min picks the unclipped ratio
    (0.5, -1.0, 0.8, True),      # below 1-eps with A<0: clipped at 0.8
    (1.5, -1.0, 1.5, False),     # above with A<0: unclipped (pessimistic) term
    (0.9, -2.0, 1.8, False),     # inside, negative advantage
])
def test_clipped_surrogate_regions(ratio, adv, expected_loss, clipped):
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(ratio))
    loss, was_clipped = clipped_surrogate(logp, old, torch.tensor([adv]), 0.2, 0.2)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert bool(was_clipped.item()) is clipped


def test_clip_higher_is_asymmetric():
    logp = torch.full((1, 1), math.log(1.25))
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.25)


def test_masked_tokens_get_zero_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    targets = torch.randint(0, 6, (2, 4))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    logp = token_logprobs(logits, targets)
    per_tok, _ = clipped_surrogate(logp, logp.detach() - 0.1, torch.tensor([1.0, -1.0]), 0.2, 0.2)
    per_tok = per_tok + 0.1 * kl_k3(logp, logp.detach() + 0.3)
    aggregate(per_tok, mask, float(mask.sum())).backward()
    grad = logits.grad.abs().sum(-1)  # (2, 4)
    assert (grad[~mask] == 0).all()
    assert (grad[mask] > 0).all()


def test_kl_k3_and_value_loss():
    assert kl_k3(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0
    d = 0.5
    assert kl_k3(torch.tensor([0.0]), torch.tensor([d])).item() == pytest.approx(math.exp(d) - d - 1)
    v, old, ret = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0])
    # unclipped 0.5*1 = .5, clipped value 0.2 -> 0.5*.04 = .02; max = .5
    assert clipped_value_loss(v, old, ret, 0.2).item() == pytest.approx(0.5)
    # moving toward the return beyond the clip: clipped term dominates (pessimistic)
    v, old, ret = torch.tensor([0.5]), torch.tensor([0.0]), torch.tensor([1.0])
    assert clipped_value_loss(v, old, ret, 0.2).item() == pytest.approx(0.5 * 0.8 ** 2)


def test_aggregate_is_the_single_division():
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert aggregate(per_tok, mask, 10.0).item() == pytest.approx(0.7)
    with pytest.raises(ValueError):
        aggregate(per_tok, mask, 0)


def test_masked_whiten():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    w = masked_whiten(x, mask)
    assert w.tolist()[0][:2] == pytest.approx([-1.0, 1.0], rel=1e-4) and w[0, 2] == 0


def test_lr_warmup_in_samples():
    assert lr_at(0, 1e-3, 0) == 1e-3
    assert lr_at(256, 1e-3, 1024) == pytest.approx(2.5e-4)
    assert lr_at(4096, 1e-3, 1024) == 1e-3
