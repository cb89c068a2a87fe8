"""Tensor layout of a rollout batch for teacher-forced forwards.

Prompts are left-padded to a common width Lp and responses right-padded to L, so response
token t of every row sits at column Lp + t and is predicted by the logits at column
Lp - 1 + t. Position ids are the cumulative count of real tokens, so padding changes no
real token's position (the engine decodes with the same positions): the forward is
invariant to how much padding a row carries.

That invariance is what lets the update pay for real tokens only: `micro_batches` orders the
rows of a minibatch by real length (prompt + response tokens) before cutting it into
micro-batches, and `SeqBatch.trimmed` removes the padding columns no row of a micro-batch
uses, so a micro-batch of short responses costs short forwards even when the rollout's
longest response is ten times longer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlbatch.algos.losses import token_logprobs, token_logprobs_and_entropy
from rlbatch.rollout.engine import Rollouts


@dataclass
class SeqBatch:
    input_ids: torch.Tensor  # (N, Lp + L)
    attention_mask: torch.Tensor  # (N, Lp + L) long
    position_ids: torch.Tensor  # (N, Lp + L)
    response_ids: torch.Tensor  # (N, L)
    response_mask: torch.Tensor  # (N, L) bool
    prompt_width: int  # Lp

    def rows(self, idx: torch.Tensor | slice) -> SeqBatch:
        return SeqBatch(self.input_ids[idx], self.attention_mask[idx], self.position_ids[idx],
                        self.response_ids[idx], self.response_mask[idx], self.prompt_width)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def real_lengths(self) -> torch.Tensor:
        """(N,) real tokens per row: prompt + response (padding excluded)."""
        return self.attention_mask[:, :self.prompt_width].sum(1) + self.response_mask.sum(1)

    def trimmed(self) -> SeqBatch:
        """The same rows without the padding columns that none of them uses: prompt padding
        cut to the longest prompt, responses cut to the longest response (responses are
        right-padded, prompts left-padded, so both cuts remove padding only). Response
        column t stays response token t; slice per-token tensors with [:, :L] to match."""
        lp = max(1, int(self.attention_mask[:, :self.prompt_width].sum(1).max()))
        t = max(1, int(self.response_mask.sum(1).max()))
        cols = slice(self.prompt_width - lp, self.prompt_width + t)
        return SeqBatch(self.input_ids[:, cols], self.attention_mask[:, cols],
                        self.position_ids[:, cols], self.response_ids[:, :t],
                        self.response_mask[:, :t], lp)


def micro_batches(idx: torch.Tensor, lengths: torch.Tensor, micro: int,
                  by_length: bool) -> list[torch.Tensor]:
    """Cut the rows `idx` of one minibatch into micro-batches of `micro` rows (the last may be
    smaller). With `by_length` the rows are first ordered by `lengths` (N,) (a stable sort,
    so ties keep their minibatch order), which groups sequences of similar length; without
    it the micro-batches are consecutive slices of `idx` (random subsets when `idx` is a
    random permutation, as the noise-scale estimator needs)."""
    if by_length:
        idx = idx[torch.sort(lengths[idx], stable=True).indices]
    return list(idx.split(micro))


def by_micro_batches(fn, b: SeqBatch, micro: int) -> torch.Tensor:
    """(N, L) per-token outputs of `fn` (a no-grad forward: SeqBatch of m rows -> (m, t))
    over length-ordered, trimmed micro-batches of `micro` rows, scattered back into the
    whole batch's columns (0 in the padding columns a micro-batch was trimmed of). One
    forward over the whole padded batch costs every row the longest row's columns; this
    costs the real tokens, as the updates do (docs/design.md, "The update pays for real
    tokens")."""
    n, t = b.response_ids.shape
    out = torch.zeros((n, t), device=b.response_ids.device)
    for chunk in micro_batches(torch.arange(n, device=b.response_ids.device),
                               b.real_lengths(), micro, by_length=True):
        sub = b.rows(chunk).trimmed()
        out[chunk, :sub.response_ids.shape[1]] = fn(sub).float()
    return out


def build_batch(rollouts: Rollouts, pad_id: int, extra_left_pad: int = 0) -> SeqBatch:
    """`extra_left_pad` widens the prompt padding (used by tests of padding invariance)."""
    prompts = rollouts.prompt_ids
    lp = max(len(p) for p in prompts) + extra_left_pad
    n, t = rollouts.response_ids.shape
    ids = torch.full((n, lp + t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, lp + t), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, lp - len(p): lp] = torch.tensor(p, dtype=torch.long)
        attn[i, lp - len(p): lp] = 1
    ids[:, lp:] = rollouts.response_ids
    attn[:, lp:] = rollouts.mask.long()
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    return SeqBatch(ids, attn, pos, rollouts.response_ids.clone(), rollouts.mask.clone(), lp)


def to_device(b: SeqBatch, device) -> SeqBatch:
    return SeqBatch(b.input_ids.to(device), b.attention_mask.to(device),
                    b.position_ids.to(device), b.response_ids.to(device),
                    b.response_mask.to(device), b.prompt_width)


def response_hidden_slice(b: SeqBatch) -> slice:
    """Columns whose outputs predict response tokens 0..L-1."""
    t = b.response_ids.shape[1]
    return slice(b.prompt_width - 1, b.prompt_width - 1 + t)


def response_logits(model, b: SeqBatch) -> torch.Tensor:
    """(N, L, V) logits of one teacher-forced forward at the columns that predict response
    tokens 0..L-1 (the last token predicts nothing and is not fed)."""
    width = b.prompt_width + b.response_ids.shape[1] - 1
    out = model(input_ids=b.input_ids[:, :width], attention_mask=b.attention_mask[:, :width],
                position_ids=b.position_ids[:, :width], use_cache=False)
    return out.logits[:, response_hidden_slice(b)]


def forward_logprobs(model, b: SeqBatch, temperature: float) -> torch.Tensor:
    """(N, L) teacher-forced log-probs of the response tokens at `temperature`."""
    return token_logprobs(response_logits(model, b), b.response_ids, temperature)


def forward_logprobs_entropy(model, b: SeqBatch,
                             temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`forward_logprobs` and the per-token entropy (N, L) of softmax(logits / temperature),
    detached, from the same forward and log-softmax (`algos.losses.token_logprobs_and_entropy`):
    the log-probs and their gradient are those of `forward_logprobs`."""
    return token_logprobs_and_entropy(response_logits(model, b), b.response_ids, temperature)
