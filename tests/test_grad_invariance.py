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


# ---- length-ordered, trimmed micro-batches and skipped zero-gradient rows ----
# The update orders each minibatch's rows by real length, trims every micro-batch to its own
# longest prompt and response, and leaves rows with an exactly zero gradient out of the
# forward and backward. The reference below is the plain computation: one forward over the
# whole padded batch, every row included, one normalization by the minibatch's tokens.

LENGTHS = [9, 1, 5, 2, 12, 3, 7, 4]
GROUP_ADV = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, -0.5, 0.0, 0.0])  # groups of 2; 2 all-equal


def _varied_rollouts(right_pad: int = 3):
    g = torch.Generator().manual_seed(5)
    n = len(LENGTHS)
    prompts = [[1] + torch.randint(3, 12, (int(k),), generator=g).tolist()
               for k in torch.randint(1, 7, (n,), generator=g)]
    responses = [torch.randint(3, 12, (k,), generator=g).tolist() for k in LENGTHS]
    logps = [(-torch.rand(k, generator=g)).tolist() for k in LENGTHS]
    ro = pack_rollouts(prompts, responses, logps, ["length"] * n, 0, {})
    pad = torch.zeros(n, right_pad, dtype=torch.long)
    ro.response_ids = torch.cat([ro.response_ids, pad], 1)
    ro.logprobs = torch.cat([ro.logprobs, pad.float()], 1)
    ro.mask = torch.cat([ro.mask, pad.bool()], 1)
    return ro


def _reference_actor_grad(model, ro, adv, kl_coef, normalizer=None):
    """One padded forward over every row, token-mean over the minibatch (no sort, no skip)."""
    from rlbatch.algos.losses import aggregate, clipped_surrogate, kl_k3
    from rlbatch.backends.builtin.batch import forward_logprobs

    batch = build_batch(ro, pad_id=0, extra_left_pad=2)
    model.zero_grad(set_to_none=True)
    logp = forward_logprobs(model, batch, 0.8)  # (N, T)
    per, _ = clipped_surrogate(logp, ro.logprobs, adv, 0.2, 0.28)
    if kl_coef:
        per = per + kl_coef * kl_k3(logp, ro.logprobs - 0.05 * ro.mask)
    tokens = float(batch.response_mask.sum()) if normalizer is None else normalizer
    aggregate(per, batch.response_mask, tokens).backward()
    return torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])


def _update_grad(model, ro, adv, kl_coef, micro, noise=None, minibatches=1):
    batch = build_batch(ro, pad_id=0)
    ref = ro.logprobs - 0.05 * ro.mask
    opt = GradCapture(model.parameters())
    model.zero_grad(set_to_none=True)
    res = actor_update(model, opt, batch, ro.logprobs, adv, ref if kl_coef else None,
                       temperature=0.8, clip_low=0.2, clip_high=0.28, kl_coef=kl_coef,
                       minibatches=minibatches, epochs=1, micro=micro, max_grad_norm=None,
                       generator=torch.Generator().manual_seed(0), noise=noise)
    return opt.grads, res


class _ForwardLog:
    """Records (rows, width, real lengths) of every forward of the model."""

    def __init__(self, model):
        self.calls: list[tuple[int, int, list[int]]] = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids, attn = kwargs["input_ids"], kwargs["attention_mask"]
        self.calls.append((ids.shape[0], ids.shape[1], attn.sum(1).tolist()))

    def close(self):
        self.handle.remove()


def test_sorted_trimmed_skipped_grpo_gradient_equals_padded_reference(small_llama):
    model = small_llama.float()
    ro = _varied_rollouts()
    ref = _reference_actor_grad(model, ro, GROUP_ADV, 0.0)
    assert ref.norm() > 0
    for micro in (1, 2, 4, 8):
        log = _ForwardLog(model)
        grads, res = _update_grad(model, ro, GROUP_ADV, 0.0, micro)
        log.close()
        assert _rel(grads, ref) <= 1e-6, micro
        # the four zero-advantage rows were never forwarded, the others exactly once
        assert sum(rows for rows, _, _ in log.calls) == 4
        assert res.stats["actor/zero_grad_skipped"] == 0.5
    # with the KL term every row has a gradient: nothing is skipped, the gradient still matches
    ref_kl = _reference_actor_grad(model, ro, GROUP_ADV, 0.1)
    log = _ForwardLog(model)
    grads, res = _update_grad(model, ro, GROUP_ADV, 0.1, 2)
    log.close()
    assert _rel(grads, ref_kl) <= 1e-6
    assert sum(rows for rows, _, _ in log.calls) == len(LENGTHS)
    assert res.stats["actor/zero_grad_skipped"] == 0.0


def test_skipped_rows_still_count_in_the_normalizer(small_llama):
    """Control: dividing by the live rows' tokens only (dropping the skipped rows' tokens
    from the normalizer) changes the gradient, and the comparison above would see it."""
    model = small_llama.float()
    ro = _varied_rollouts()
    live_tokens = float(sum(n for n, a in zip(LENGTHS, GROUP_ADV) if a != 0))
    wrong = _reference_actor_grad(model, ro, GROUP_ADV, 0.0, normalizer=live_tokens)
    grads, _ = _update_grad(model, ro, GROUP_ADV, 0.0, 2)
    assert _rel(grads, wrong) > 1e-2


def test_micro_batches_are_length_ordered_and_trimmed(small_llama):
    model = small_llama.float()
    ro = _varied_rollouts()
    batch = build_batch(ro, pad_id=0)
    prompt_lens = [len(p) for p in ro.prompt_ids]
    real = [p + r for p, r in zip(prompt_lens, LENGTHS)]
    adv = torch.linspace(-1, 1, len(LENGTHS)) + 0.01  # no zero: every row is forwarded
    log = _ForwardLog(model)
    _update_grad(model, ro, adv, 0.0, 2)
    log.close()
    order = sorted(range(len(real)), key=lambda i: real[i])  # stable, as the update's sort
    chunks = [order[k:k + 2] for k in range(0, len(order), 2)]
    # each forward holds the next two rows by real length, trimmed to their own longest
    # prompt and response (the last response token predicts nothing, hence - 1)
    assert [(rows, width) for rows, width, _ in log.calls] == [
        (2, max(prompt_lens[i] for i in c) + max(LENGTHS[i] for i in c) - 1) for c in chunks]
    padded = len(real) * (batch.input_ids.shape[1] - 1)
    assert sum(r * w for r, w, _ in log.calls) < 0.75 * padded


def test_all_rows_skipped_still_steps_with_zero_gradients(small_llama):
    model = small_llama.float()
    ro = _varied_rollouts()
    log = _ForwardLog(model)
    grads, res = _update_grad(model, ro, torch.zeros(len(LENGTHS)), 0.0, 2)
    log.close()
    assert log.calls == []  # no forward, no backward
    n_params = sum(p.numel() for p in model.parameters())
    assert grads is not None and grads.shape == (n_params,) and not grads.any()
    assert res.skipped == 0 and res.stats["actor/loss"] == 0.0


def test_ppo_actor_rows_with_zero_token_advantages_are_skipped(small_llama):
    """(N, T) advantages: a row is skipped when its advantage is 0 on every valid token,
    whatever sits on its padding."""
    model = small_llama.float()
    ro = _varied_rollouts()
    g = torch.Generator().manual_seed(9)
    adv = torch.randn(ro.mask.shape, generator=g) * ro.mask
    adv[2] = 0.0
    adv[3] = (~ro.mask[3]).float() * 7.0  # junk on padding only
    ref = _reference_actor_grad(model, ro, adv, 0.0)
    log = _ForwardLog(model)
    grads, res = _update_grad(model, ro, adv, 0.0, 3)
    log.close()
    assert _rel(grads, ref) <= 1e-6
    assert sum(rows for rows, _, _ in log.calls) == len(LENGTHS) - 2
    assert res.stats["actor/zero_grad_skipped"] == 2 / len(LENGTHS)


def test_critic_sorted_trimmed_gradient_equals_padded_reference(small_llama):
    from rlbatch.algos.losses import aggregate, clipped_value_loss

    torch.manual_seed(0)
    critic = ValueModel(small_llama.float())
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ro = _varied_rollouts()
    batch = build_batch(ro, pad_id=0)
    mask = batch.response_mask.float()
    rows, cols = torch.meshgrid(torch.arange(mask.shape[0]), torch.arange(mask.shape[1]),
                                indexing="ij")
    returns = (0.3 * rows - 0.2 * cols).float() * mask
    old = torch.full_like(mask, 0.05) * mask
    critic.zero_grad(set_to_none=True)
    per = clipped_value_loss(critic(build_batch(ro, pad_id=0, extra_left_pad=3)), old, returns,
                             0.2)
    aggregate(per, batch.response_mask, float(mask.sum())).backward()
    ref = torch.cat([p.grad.reshape(-1).clone() for p in critic.parameters()
                     if p.grad is not None])
    for micro in (1, 2, 4):
        opt = GradCapture(critic.parameters())
        critic.zero_grad(set_to_none=True)
        critic_update(critic, opt, batch, old, returns, value_clip=0.2, minibatches=1,
                      epochs=1, micro=micro, max_grad_norm=None, generator=torch.Generator(),
                      noise=None)
        assert _rel(opt.grads, ref) <= 1e-6, micro


def test_noise_probe_keeps_random_equal_micro_batches(small_llama):
    """While the noise-scale probe runs, micro-batches are slices of the minibatch's random
    permutation with `micro` rows each (not length-ordered: length strata would bias the
    two-batch estimator), and the gradient is still the reference's."""
    from rlbatch.algos.noise_scale import NoiseScaleEMA
    from rlbatch.backends.builtin.batch import micro_batches

    model = small_llama.float()
    ro = _varied_rollouts()
    adv = torch.linspace(-1, 1, len(LENGTHS)) + 0.01
    ref = _reference_actor_grad(model, ro, adv, 0.0)
    log = _ForwardLog(model)
    grads, res = _update_grad(model, ro, adv, 0.0, 2, noise=NoiseScaleEMA(0.9))
    log.close()
    assert _rel(grads, ref) <= 1e-6
    prompt_lens = [len(p) for p in ro.prompt_ids]
    real = [p + r for p, r in zip(prompt_lens, LENGTHS)]
    # minibatches=1: the minibatch is rows 0..7 in order, so the slices are (0,1), (2,3), ...
    # (each still trimmed to its own longest prompt and response)
    chunks = [[i, i + 1] for i in range(0, len(real), 2)]
    assert [(rows, width) for rows, width, _ in log.calls] == [
        (2, max(prompt_lens[i] for i in c) + max(LENGTHS[i] for i in c) - 1) for c in chunks]
    assert "actor/noise_scale" in res.stats
    idx = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    lengths = torch.tensor(real)
    assert [c.tolist() for c in micro_batches(idx, lengths, 2, by_length=False)] == [
        [3, 0], [6, 1], [7, 2], [5, 4]]
    sorted_chunks = micro_batches(idx, lengths, 3, by_length=True)
    assert [len(c) for c in sorted_chunks] == [3, 3, 2]
    flat = torch.cat(sorted_chunks)
    assert lengths[flat].tolist() == sorted(real) and sorted(flat.tolist()) == list(range(8))


def test_no_grad_forwards_by_micro_batches_equal_one_padded_forward(small_llama):
    """The critic's values and the reference's log-probs, computed over length-ordered,
    trimmed micro-batches, equal one forward over the whole padded batch (with extra left
    and right padding) on every response token; callers mask the padding."""
    from rlbatch.backends.builtin.batch import by_micro_batches, forward_logprobs

    torch.manual_seed(0)
    model = small_llama.float()
    critic = ValueModel(model)
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ro = _varied_rollouts()
    batch = build_batch(ro, pad_id=0)
    mask = batch.response_mask
    with torch.no_grad():
        padded = build_batch(ro, pad_id=0, extra_left_pad=3)
        ref_values = critic(padded)
        ref_logp = forward_logprobs(model, padded, 0.8)
        for micro in (1, 2, 4, len(ro.mask)):
            values = by_micro_batches(critic, batch, micro)
            logp = by_micro_batches(lambda b: forward_logprobs(model, b, 0.8), batch, micro)
            assert values.shape == logp.shape == mask.shape
            assert _rel(values[mask], ref_values[mask]) <= 1e-6, micro
            assert _rel(logp[mask], ref_logp[mask]) <= 1e-6, micro
            # the columns no row uses (the rollouts' 3 right-padding columns) are trimmed
            assert not values[:, -3:].any() and not logp[:, -3:].any()
