"""Decode-engine interface shared by the built-in, `transformers`-generate and vLLM engines.

`generate(prompt_ids, params, concurrency)` decodes every prompt (already repeated G times by
the caller) with at most `concurrency` sequences in flight, and returns `Rollouts`: response
token ids, the per-token log-probabilities under the sampling policy, masks, lengths, finish
reasons and timing. The sampling policy's log-probability is that of the temperature-scaled
distribution `log_softmax(logits / temperature)`; top-p truncation is not folded into it (as in verl and
OpenRLHF), so the trainer's teacher-forced forward at the same temperature reproduces it. Greedy
decoding reports `log_softmax(logits)`.

Keyed sampling (`keys`, one integer per sequence; docs/design.md, "Knobs that must not change
learning"): the t-th token of sequence q is drawn by inverse-CDF sampling from the uniform
U[q, t] of a stream seeded by keys[q] alone, so which other sequences share its batch, and
so `concurrency`, change no response (up to float ties at a CDF boundary). The trainer keys
each response by (seed, prompt index in the stream, sample index): `response_keys`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


@dataclass
class Rollouts:
    prompt_ids: list[list[int]]
    response_ids: torch.Tensor  # (N, L) padded with pad_id
    logprobs: torch.Tensor  # (N, L) float32, 0 where mask is False
    mask: torch.Tensor  # (N, L) bool, True on generated tokens (EOS included)
    lengths: torch.Tensor  # (N,) int64
    finish_reasons: list[str]  # "eos" | "length"
    timing: dict = field(default_factory=dict)  # prefill_s, decode_s, decode_low_s, prefills, tokens

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def eos_ids_of(model, tokenizer) -> list[int]:
    """EOS ids from the generation config (may be a list) or the tokenizer."""
    gen = getattr(model, "generation_config", None)
    ids = getattr(gen, "eos_token_id", None) if gen is not None else None
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return list(ids) if isinstance(ids, (list, tuple)) else [int(ids)]


def pad_id_of(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(tokenizer.eos_token_id or 0)


def on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator that can draw on `device`: the given one, or (a CPU generator driving a
    CUDA decode) a fresh device generator seeded from it, so that the CPU generator's state,
    which checkpoints save, still determines every draw."""
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def response_keys(seed: int, stream: int, first_prompt: int, prompts: int,
                  group: int) -> list[int]:
    """One key per response, prompt-major (G consecutive responses per prompt): a 63-bit
    mix of (seed, stream, the prompt's index first_prompt + i, the sample's index j).
    `stream` separates training rollouts (0) from evaluation (1)."""
    return [_mix(seed, stream, first_prompt + i, j) for i in range(prompts) for j in range(group)]


def _mix(*parts: int) -> int:
    """splitmix64 folded over the parts (Steele et al. 2014), to 63 bits."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & _M64)) * 0xBF58476D1CE4E5B9 & _M64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
        x ^= x >> 31
    return x >> 1


_M64 = (1 << 64) - 1


def keyed_uniforms(keys: list[int], length: int) -> torch.Tensor:
    """(len(keys), length) float64 uniforms in [0, 1): row q from a generator seeded by
    keys[q] only."""
    out = torch.empty(len(keys), length, dtype=torch.float64)
    gen = torch.Generator()
    for q, k in enumerate(keys):
        gen.manual_seed(k)
        out[q] = torch.rand(length, generator=gen, dtype=torch.float64)
    return out


def _inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of unnormalised probabilities p (n, V) at uniforms u (n,)."""
    cdf = p.double().cumsum(dim=-1)  # (n, V)
    pick = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1])[:, None], right=True)
    return pick.squeeze(1).clamp_(max=p.shape[-1] - 1)


def sample_next(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None,
                u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick next tokens from (n, V) logits; return (tokens (n,), logprobs (n,)). With `u`
    (n,) the draw is keyed: inverse-CDF sampling at those uniforms, no generator drawn.

    The log-probability is taken under log_softmax(logits / temperature) (module docstring).
    """
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)  # (n, V)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)  # (n, V)
    if u is not None:
        if params.top_p < 1.0:
            sorted_p, idx = logp.exp().sort(dim=-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < params.top_p  # always keeps the top token
            tok = idx.gather(1, _inverse_cdf(sorted_p * keep, u)[:, None]).squeeze(1)
        else:
            tok = _inverse_cdf(logp.exp(), u)
        return tok, logp.gather(1, tok[:, None]).squeeze(1)
    generator = on_device(generator, logits.device)
    if params.top_p < 1.0:
        sorted_p, idx = logp.exp().sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < params.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p, 1, generator=generator)  # (n, 1)
        tok = idx.gather(1, choice).squeeze(1)
    else:
        # Exponential-race (Gumbel-max) sampling: argmax(logp - log E), E ~ Exp(1), draws
        # exactly from softmax(logp) and is cheaper than multinomial for small batches.
        noise = torch.empty_like(logp).exponential_(generator=generator)
        tok = (logp - noise.log()).argmax(dim=-1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)


def pack_rollouts(prompt_ids: list[list[int]], responses: list[list[int]],
                  logprobs: list[list[float]], reasons: list[str], pad_id: int,
                  timing: dict) -> Rollouts:
    n = len(responses)
    t = max((len(r) for r in responses), default=0)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    lp = torch.zeros((n, t), dtype=torch.float32)
    mask = torch.zeros((n, t), dtype=torch.bool)
    for i, (r, l) in enumerate(zip(responses, logprobs)):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        lp[i, : len(l)] = torch.tensor(l, dtype=torch.float32)
        mask[i, : len(r)] = True
    lengths = mask.sum(1)
    return Rollouts(prompt_ids, ids, lp, mask, lengths, reasons, timing)
