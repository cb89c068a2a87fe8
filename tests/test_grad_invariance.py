"""House rule 3: the gradient is the same for every micro_batch_sequences and padding layout.

Runs the trainer's real update path (`actor_update`, `critic_update`) with an optimizer that
records the gradient instead of stepping.
"""

from __future__ import annotations

import torch

from rlbatch.backends.builtin.batch import build_batch
from rlbatch.backends.builtin.critic import ValueModel
from rlbatch.backends.builtin.update import actor_update, critic_update
from rlbatch.rollout.engine import pack_rollouts


class GradCapture(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})
        self.grads = None

    def step(self, closure=None):
        self.grads = torch.cat([p.grad.reshape(-1).clone() for g in self.param_groups
                                for p in g["params"] if p.grad is not None])


def _rollouts(extra_right_pad: int = 0):
    g = torch.Generator().manual_seed(3)
    n = 6
    prompts = [[1] + torch.randint(3, 12, (int(k),), generator=g).tolist()
               for k in torch.randint(2, 6, (n,), generator=g)]
    lengths = [4, 1, 3, 2, 4, 3]
    responses = [torch.randint(3, 12, (k,), generator=g).tolist() for k in lengths]
    logps = [(-torch.rand(k, generator=g)).tolist() for k in lengths]
    ro = pack_rollouts(prompts, responses, logps, ["length"] * n, 0, {})
    if extra_right_pad:
        pad = torch.zeros(n, extra_right_pad, dtype=torch.long)
        ro.response_ids = torch.cat([ro.response_ids, pad], 1)
        ro.logprobs = torch.cat([ro.logprobs, pad.float()], 1)
        ro.mask = torch.cat([ro.mask, pad.bool()], 1)
    return ro


def _actor_grad(model, micro: int, left_pad: int = 0, right_pad: int = 0) -> torch.Tensor:
    ro = _rollouts(right_pad)
    batch = build_batch(ro, pad_id=0, extra_left_pad=left_pad)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, 0.1])
    ref = ro.logprobs - 0.05 * ro.mask
    opt = GradCapture(model.parameters())
    model.zero_grad(set_to_none=True)
    actor_update(model, opt, batch, ro.logprobs, adv, ref, temperature=0.8, clip_low=0.2,
                 clip_high=0.28, kl_coef=0.1, minibatches=1, epochs=1, micro=micro,
                 max_grad_norm=None, generator=torch.Generator().manual_seed(0), noise=None)
    return opt.grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_actor_gradient_invariant_to_micro_batch_and_padding(small_llama):
    model = small_llama.float()
    base = _actor_grad(model, micro=6)
    assert base.norm() > 0
    for micro in (1, 2, 3):
        assert _rel(_actor_grad(model, micro), base) <= 1e-6, micro
    assert _rel(_actor_grad(model, 6, left_pad=3), base) <= 1e-6
    assert _rel(_actor_grad(model, 2, left_pad=2, right_pad=3), base) <= 1e-6


def test_changing_the_normalizer_would_be_detected(small_llama):
    """Control: per-micro-batch normalization (the classic bug) does change the gradient."""
    model = small_llama.float()
    base = _actor_grad(model, micro=6)
    ro = _rollouts()
    batch = build_batch(ro, pad_id=0)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, 0.1])
    opt = GradCapture(model.parameters())
    model.zero_grad(set_to_none=True)
    for chunk in torch.arange(6).split(2):  # normalize each micro-batch by its own tokens
        b = batch.rows(chunk)
        from rlbatch.algos.losses import aggregate, clipped_surrogate, kl_k3
        from rlbatch.backends.builtin.batch import forward_logprobs
        logp = forward_logprobs(model, b, 0.8)
        per, _ = clipped_surrogate(logp, ro.logprobs[chunk], adv[chunk], 0.2, 0.28)
        per = per + 0.1 * kl_k3(logp, (ro.logprobs - 0.05 * ro.mask)[chunk])
        (aggregate(per, b.response_mask, float(b.response_mask.sum())) / 3).backward()
    opt.step()
    assert _rel(opt.grads, base) > 1e-3


def test_critic_gradient_invariant_to_micro_batch_and_padding(small_llama):
    torch.manual_seed(0)
    critic = ValueModel(small_llama.float())
    torch.nn.init.normal_(critic.head.weight, std=0.1)

    def grad(micro, left_pad=0, right_pad=0):
        ro = _rollouts(right_pad)
        batch = build_batch(ro, pad_id=0, extra_left_pad=left_pad)
        mask = batch.response_mask.float()
        rows, cols = torch.meshgrid(torch.arange(mask.shape[0]), torch.arange(mask.shape[1]),
                                    indexing="ij")
        returns = (0.3 * rows - 0.2 * cols).float() * mask  # depends on (row, token) only
        old = torch.full_like(mask, 0.05) * mask
        opt = GradCapture(critic.parameters())
        critic.zero_grad(set_to_none=True)
        critic_update(critic, opt, batch, old, returns, value_clip=0.2, minibatches=1, epochs=1,
                      micro=micro, max_grad_norm=None, generator=torch.Generator(), noise=None)
        return opt.grads

    base = grad(6)
    for micro in (1, 2, 3):
        assert _rel(grad(micro), base) <= 1e-6
    assert _rel(grad(3, left_pad=4, right_pad=2), base) <= 1e-6
