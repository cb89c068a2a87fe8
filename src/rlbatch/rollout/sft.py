"""Teacher-forced fine-tuning and greedy held-out checks for the built-in tiny models
(`rollout.tiny_model`'s warm start), on fixed- or variable-length answers.

Fixed-length tasks (addition, reverse: every prompt and every answer of one length) run the
computation the default models are built with: one unmasked forward per SFT
step, and greedy decoding by full forwards checked by exact match of every answer token and
EOS. Variable-length tasks (runsum) pad: prompts on the left (with an attention mask and
position ids that count real tokens, as the trainer's batches do), answers on the right with
the ignored label IGNORE. An SFT step then orders its examples by length and accumulates
micro-batches, each padded only to its own longest example and divided by the whole step's
answer-token count (one normalization point, house rule 3: the gradient is that of one padded
batch, tested); greedy checks decode with the built-in engine's KV cache up to EOS and score
with the task's own reward, the quantity the trainer's `eval/accuracy` measures, while the
per-position accuracies that show whether each step's skill is partly formed are
teacher-forced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlbatch.rollout.tasks import Example

IGNORE = -100  # label of padded answer positions (cross_entropy's ignore_index)


@dataclass
class _Encoded:
    """A batch of examples for teacher forcing and greedy checks. Prompts are left-padded to a
    common width and answers right-padded with IGNORE, so answer token t of every row sits
    at column Lp + t. `prompt_mask` is None when every prompt has the same length and
    `uniform` is True when, in addition, every answer has the same length: fixed-length tasks
    then run exactly the computation they always ran (no masks, no padding)."""

    prompts: torch.Tensor  # (N, Lp) pad-filled on the left
    prompt_mask: torch.Tensor | None  # (N, Lp) long, 1 on real tokens
    answers: torch.Tensor  # (N, Ta+1) answer ids + EOS, IGNORE after it
    uniform: bool


def _encode(tokenizer, examples: list[Example]) -> _Encoded:
    prompt_ids = [tokenizer(e.prompt)["input_ids"] for e in examples]
    eos = tokenizer.eos_token_id
    answer_ids = [tokenizer(e.answer, add_special_tokens=False)["input_ids"] + [eos]
                  for e in examples]
    lp, ta = max(map(len, prompt_ids)), max(map(len, answer_ids))
    same_prompts = all(len(p) == lp for p in prompt_ids)
    if same_prompts and all(len(a) == ta for a in answer_ids):
        return _Encoded(torch.tensor(prompt_ids), None, torch.tensor(answer_ids), True)
    prompts = torch.full((len(examples), lp), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(examples), lp), dtype=torch.long)
    answers = torch.full((len(examples), ta), IGNORE, dtype=torch.long)
    for i, (p, a) in enumerate(zip(prompt_ids, answer_ids)):
        prompts[i, lp - len(p):] = torch.tensor(p)
        mask[i, lp - len(p):] = 1
        answers[i, :len(a)] = torch.tensor(a)
    return _Encoded(prompts, None if same_prompts else mask, answers, False)


@torch.no_grad()
def greedy_accuracy(model, tokenizer, examples: list[Example], task=None,
                    position_share: float = 0.5) -> tuple[float, list[float]]:
    """Held-out accuracy under greedy decoding, and per-position accuracy.

    Fixed-length answers (addition, reverse): exact match of every answer token and EOS,
    decoded by full forwards (the computation the default models are built with), and the
    accuracy of each answer position. Variable-length answers (runsum): decoded with the
    built-in engine's KV cache up to EOS or the longest answer + 1, scored by the task's own
    reward (what the trainer's `eval/accuracy` measures: the final answer only for runsum);
    per-position accuracy is teacher-forced (`_teacher_forced_hits`), over the answer
    positions at least `position_share` of the examples have.
    """
    enc = _encode(tokenizer, examples)
    model.eval()
    if enc.uniform:
        prompts, answers = enc.prompts, enc.answers  # (N, Tp), (N, Ta+1)
        seq = prompts
        for _ in range(answers.shape[1]):
            logits = model(input_ids=seq).logits[:, -1]  # (N, V)
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
        pred = seq[:, prompts.shape[1]:]  # (N, Ta+1)
        hit = pred == answers
        per_pos = hit[:, :-1].float().mean(0).tolist()
        return hit.all(1).float().mean().item(), per_pos
    return _greedy_variable(model, tokenizer, examples, enc, task, position_share)


def _greedy_variable(model, tokenizer, examples, enc: _Encoded, task, share: float):
    from rlbatch.rollout.builtin_engine import BuiltinEngine
    from rlbatch.rollout.engine import SamplingParams

    if task is None:
        raise ValueError("greedy_accuracy: variable-length answers are scored by the task's "
                         "reward; pass task=")
    engine = BuiltinEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    prompt_ids = [tokenizer(e.prompt)["input_ids"] for e in examples]
    ta = enc.answers.shape[1]
    ro = engine.generate(prompt_ids, SamplingParams(max_new_tokens=ta, greedy=True),
                         concurrency=len(examples))
    texts = tokenizer.batch_decode(
        [ids[:n] for ids, n in zip(ro.response_ids.tolist(), ro.lengths.tolist())],
        skip_special_tokens=True)
    acc = sum(task.reward(e.prompt, t, e) for e, t in zip(examples, texts)) / len(examples)
    hits, counts = _teacher_forced_hits(model, tokenizer, examples)  # (Ta,), (Ta,)
    keep = counts >= share * len(examples)
    return float(acc), (hits[keep].float() / counts[keep]).tolist()


def _teacher_forced_hits(model, tokenizer, examples: list[Example],
                         micro: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per answer position j (EOS excluded): how many examples have position j, and how
    many of them the model predicts right given the correct prefix. Teacher forcing judges
    each step's skill on its own (free-running decoding would carry one wrong running total
    into every later position). Examples are length-ordered into micro-batches."""
    ta = max(len(tokenizer(e.answer, add_special_tokens=False)["input_ids"]) for e in examples)
    hits, counts = torch.zeros(ta, dtype=torch.long), torch.zeros(ta, dtype=torch.long)
    order = sorted(examples, key=lambda e: len(e.prompt) + len(e.answer))
    for start in range(0, len(order), micro):
        enc = _encode(tokenizer, order[start:start + micro])
        pred = _answer_logits(model, enc).argmax(-1)  # (m, Ta_c + 1)
        has = (enc.answers[:, :-1] != IGNORE) & (enc.answers[:, 1:] != IGNORE)  # no EOS
        t = has.shape[1]
        hits[:t] += ((pred[:, :-1] == enc.answers[:, :-1]) & has).sum(0)
        counts[:t] += has.sum(0)
    return hits, counts


def sft_step(model, opt, tokenizer, examples: list[Example], micro: int = 32) -> float:
    """One AdamW step of teacher-forced cross-entropy on the answers and EOS, averaged over
    the answer tokens of all `examples` (token mean). Variable-length examples are sorted by
    length and cut into micro-batches of `micro` examples, each padded only to its own
    longest example; every micro-batch divides by the whole step's token count, so the
    gradient is that of one padded batch (house rule 3) at the cost of the real tokens."""
    enc = _encode(tokenizer, examples)
    opt.zero_grad(set_to_none=True)
    if enc.uniform:
        loss = _sft_loss(model, enc, None)
        loss.backward()
    else:
        total = float((enc.answers != IGNORE).sum())
        order = sorted(range(len(examples)),
                       key=lambda i: len(examples[i].prompt) + len(examples[i].answer))
        loss = 0.0
        for start in range(0, len(order), micro):
            part = _encode(tokenizer, [examples[i] for i in order[start:start + micro]])
            part_loss = _sft_loss(model, part, total)
            part_loss.backward()
            loss += float(part_loss.detach())
        loss = torch.tensor(loss)
    opt.step()
    return loss.item()


def _answer_logits(model, enc: _Encoded) -> torch.Tensor:
    """(N, Ta+1, V) logits at the positions that predict the answer tokens and EOS."""
    prompts, answers = enc.prompts, enc.answers
    seq = torch.cat([prompts, answers.clamp(min=0)], dim=1)  # (N, L); IGNORE -> pad id 0
    if enc.uniform:
        logits = model(input_ids=seq[:, :-1]).logits  # (N, L-1, V)
    else:
        attn = torch.ones_like(seq)  # right padding sits after every real token: unmasked
        if enc.prompt_mask is not None:
            attn[:, :prompts.shape[1]] = enc.prompt_mask
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=seq[:, :-1], attention_mask=attn[:, :-1],
                       position_ids=pos[:, :-1]).logits  # (N, L-1, V)
    return logits[:, prompts.shape[1] - 1:]


def _sft_loss(model, enc: _Encoded, normalizer: float | None) -> torch.Tensor:
    """Cross-entropy of the answer tokens and EOS: their mean (normalizer None) or their sum
    divided by `normalizer`."""
    logits = _answer_logits(model, enc)
    pred = logits.reshape(-1, logits.shape[-1])
    labels = enc.answers.reshape(-1)
    if normalizer is None:
        return torch.nn.functional.cross_entropy(pred, labels, ignore_index=IGNORE)
    return torch.nn.functional.cross_entropy(pred, labels, ignore_index=IGNORE,
                                             reduction="sum") / normalizer
