"""The LR schedule in samples: each update gets the mean of lr(s) over its slice of samples,
so LR x samples summed over updates equals the schedule's integral for every B."""

from __future__ import annotations

import pytest
import torch

from rlbatch.algos.lr import crosses_mark, in_warmup, lr_at, lr_mean, update_lrs

PEAK, W = 1e-3, 1000


def integral(a: float, b: float, n: int = 200_000) -> float:
    """Slow reference: midpoint rule on the schedule itself."""
    h = (b - a) / n
    return sum(lr_at(a + (i + 0.5) * h, PEAK, W) for i in range(n)) * h


@pytest.mark.parametrize("a,b", [(0, 100), (0, 1000), (0, 4000), (500, 1500), (1200, 1300),
                                 (999, 1001)])
def test_lr_mean_is_the_exact_average_of_the_schedule(a, b):
    assert lr_mean(a, b, PEAK, W) * (b - a) == pytest.approx(integral(a, b), rel=1e-6)


@pytest.mark.parametrize("sequences", [256, 1000, 4096])  # B below, equal to and above W
@pytest.mark.parametrize("minibatches,epochs", [(1, 1), (4, 1), (4, 2)])
def test_applied_lr_follows_the_schedule_in_samples_for_any_batch(sequences, minibatches,
                                                                   epochs):
    total, s0 = 0.0, 0
    applied = []
    while s0 < 4096:
        lrs = update_lrs(s0, sequences, minibatches, epochs, PEAK, W)
        assert len(lrs) == minibatches * epochs
        assert lrs[:minibatches] * epochs == lrs  # every epoch revisits the same slices
        # one epoch's updates cover the step's samples once: sum lr x slice = the integral
        total += sum(lrs[:minibatches]) * sequences / minibatches
        applied.append(lrs[0])
        s0 += sequences
    assert total == pytest.approx(integral(0, s0), rel=1e-6)
    # the first update is warmed up even when one step holds more than W samples
    assert applied[0] < PEAK
    if sequences >= W:
        assert applied[0] == pytest.approx(lr_mean(0, sequences / minibatches, PEAK, W))


def test_the_old_end_of_step_rule_would_skip_warm_up_at_large_batch():
    # reading lr at the end of a step of B >= W samples gives the peak at once ...
    assert lr_at(4096, PEAK, W) == PEAK
    # ... while the mean over that step's samples is well below it
    assert update_lrs(0, 4096, 1, 1, PEAK, W)[0] == pytest.approx(PEAK * (500 + 3096) / 4096)


def test_no_warm_up_is_the_peak_everywhere():
    assert update_lrs(0, 128, 2, 2, PEAK, 0) == [PEAK] * 4


class LrRecorder(torch.optim.SGD):
    """A real optimizer that records the LR it steps with."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.applied: list[float] = []

    def step(self, closure=None):
        self.applied.append(self.param_groups[0]["lr"])
        return super().step(closure)


@pytest.mark.parametrize("sequences", [6, 1000 // 100 * 6, 4096])
def test_actor_and_critic_updates_step_with_the_schedule(small_llama, sequences):
    """The LR each optimizer step actually uses equals update_lrs, update by update."""
    from rlbatch.backends.builtin.batch import build_batch
    from rlbatch.backends.builtin.critic import ValueModel
    from rlbatch.backends.builtin.update import actor_update, critic_update
    from test_grad_invariance import _rollouts

    ro = _rollouts()
    batch = build_batch(ro, pad_id=0)
    # schedule position: this step starts at 1,000 - 3 samples, the step holds `sequences`
    lrs = update_lrs(997, sequences, 3, 2, PEAK, W)
    opt = LrRecorder(small_llama.parameters())
    actor_update(small_llama, opt, batch, ro.logprobs, torch.ones(6), None, temperature=1.0,
                 clip_low=0.2, clip_high=0.2, kl_coef=0.0, minibatches=3, epochs=2, micro=2,
                 max_grad_norm=None, generator=torch.Generator().manual_seed(0), noise=None,
                 lrs=lrs)
    assert opt.applied == lrs and len(set(lrs)) > 1  # warm-up crosses W inside this step
    critic = ValueModel(small_llama)
    copt = LrRecorder(critic.parameters())
    zeros = torch.zeros_like(ro.logprobs)
    critic_update(critic, copt, batch, zeros, zeros + 1.0, value_clip=None, minibatches=3,
                  epochs=2, micro=2, max_grad_norm=None,
                  generator=torch.Generator().manual_seed(0), noise=None, lrs=lrs)
    assert copt.applied == lrs


def _steps(batch: int, total: int) -> list[tuple[int, int]]:
    return [(s, s + batch) for s in range(0, total, batch)]


@pytest.mark.parametrize("batch", [32, 64, 128, 256, 512])
def test_critic_cadence_in_samples_gives_every_batch_the_same_updates_per_sample(batch):
    # an update every 512 samples: 16 updates in 8192 samples whatever B (B divides 8192),
    # at the same sample marks; counted in steps it would be 8192 / B / k
    marks = [after for before, after in _steps(batch, 8192) if crosses_mark(before, after, 512)]
    assert len(marks) == 16
    assert [-(-m // 512) * 512 for m in marks] == list(range(512, 8193, 512))
    assert all(crosses_mark(b, a, 0) for b, a in _steps(batch, 1024))  # 0: every step


@pytest.mark.parametrize("batch", [48, 64, 100, 128, 256, 1024])
def test_critic_warm_up_idles_at_most_its_samples_for_any_batch(batch):
    # counted in steps (the old rule, 4 steps) the actor idled 4 x B samples; in samples it
    # idles B * floor(W / B) <= W, and every step that starts after W trains the actor
    warm = 512
    idle = sum(a - b for b, a in _steps(batch, 8192) if in_warmup(a, warm))
    assert idle == batch * (warm // batch) and idle <= warm
    assert not any(in_warmup(a, warm) for b, a in _steps(batch, 8192) if b >= warm)
    assert not in_warmup(batch, 0)  # no warm-up: the first step trains the actor
