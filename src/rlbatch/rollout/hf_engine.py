"""Reference engine over `transformers` generate: the correctness oracle and speed baseline.

`generate` has no continuous batching, so concurrency C means static batches of C prompts,
left-padded, each decoded until its longest member stops. Log-probabilities are computed
from the raw logits (`output_logits=True`) at the sampling temperature, matching
`engine.sample_next`. Sampling uses the global torch RNG (generate takes no generator).
"""

from __future__ import annotations

import time

import torch

from rlbatch.core.timers import cuda_sync_or_none
from rlbatch.rollout.engine import Rollouts, SamplingParams, pack_rollouts


class HFEngine:
    name = "hf"

    def __init__(self, model, eos_ids: list[int], pad_id: int):
        self.model = model
        self.eos = set(eos_ids)
        self.pad_id = pad_id

    @torch.inference_mode()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, concurrency: int,
                 generator: torch.Generator | None = None,
                 keys: list[int] | None = None) -> Rollouts:
        """`keys` are accepted and not used: `transformers` generate draws from the global
        RNG, so its samples depend on the batching (a reference engine, not for studies)."""
        device = next(self.model.parameters()).device
        sync = cuda_sync_or_none(str(device)) or (lambda: None)
        responses, logps, reasons = [], [], []
        start = time.perf_counter()
        for i in range(0, len(prompt_ids), concurrency):
            chunk = prompt_ids[i: i + concurrency]
            r, lp, why = self._batch(chunk, params, device)
            responses += r
            logps += lp
            reasons += why
        sync()
        timing = {"prefill_s": 0.0, "decode_s": time.perf_counter() - start,
                  "tokens": sum(len(r) for r in responses), "concurrency": concurrency}
        return pack_rollouts(prompt_ids, responses, logps, reasons, self.pad_id, timing)

    def _batch(self, chunk, params: SamplingParams, device):
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, width - len(p):] = torch.tensor(p)
            attn[j, width - len(p):] = 1
        kwargs = {"do_sample": False} if params.greedy else {
            "do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": 0}
        out = self.model.generate(
            input_ids=ids.to(device), attention_mask=attn.to(device),
            max_new_tokens=params.max_new_tokens, eos_token_id=sorted(self.eos) or None,
            pad_token_id=self.pad_id, output_logits=True, return_dict_in_generate=True, **kwargs,
        )
        gen = out.sequences[:, width:].cpu()  # (n, L)
        logits = torch.stack(out.logits, dim=1).float().cpu()  # (n, L, V)
        if not params.greedy:
            logits = logits / params.temperature
        lp = torch.log_softmax(logits, -1).gather(2, gen[:, :, None]).squeeze(2)
        responses, logps, reasons = [], [], []
        for j in range(len(chunk)):
            toks = gen[j].tolist()
            cut = next((k + 1 for k, t in enumerate(toks) if t in self.eos), None)
            n = cut if cut is not None else len(toks)
            responses.append(toks[:n])
            logps.append(lp[j, :n].tolist())
            reasons.append("eos" if cut is not None else "length")
        return responses, logps, reasons
