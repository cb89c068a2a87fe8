"""Rollouts decoded ahead of the update: `rollout.max_staleness` = k > 0 (docs/design.md,
"Stale rollouts").

Step s trains on the batch that policy version max(0, s - k) decoded (version v: the weights
after v updates). While step s updates the model, a worker thread decodes batch s + k on a
second copy of the model, loaded with the weights as they were before that update. The lag
is fixed, not a bound the decoder reaches when it falls behind, so a run's rows do not
depend on how fast either side is, and a resumed run continues exactly: a checkpoint keeps
the weights its pending batches are decoded from (`state`, `restore`). Sampling is keyed
per response (rollout/engine.py), so the worker draws from no generator the update shares.

A step's exposed rollout time is what it waited for its batch; the batch's own decoding
time (simulated latency included) is reported beside it. Before an evaluation or a
checkpoint the worker is drained and the wait is charged to the next step, so no decoding
hides in the time that `train_s` excludes.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from rlbatch.rollout.engine import SamplingParams
from rlbatch.rollout.models import make_engine


@dataclass
class Pending:
    step: int  # the step (1-based, as logged) that trains on this batch
    version: int  # the policy version that decodes it
    weights: dict  # that version's weights, kept until the batch is taken
    examples: list
    prompt_ids: list
    future: Future


@dataclass
class Taken:
    pending: Pending
    rollouts: object
    decode_s: float  # the batch's decoding, latency included, on the worker
    wait_s: float  # what the step waited for it (plus any drain carried over)


def weights_of(model: torch.nn.Module) -> dict:
    """A copy of the model's weights, safe from the updates that follow."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Ahead:
    """The worker, its copy of the model and the batches it decodes, in step order."""

    def __init__(self, model: torch.nn.Module, tokenizer, engine: str, k: int, threads: int):
        self.k = k
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.engine = make_engine(engine, self.model, tokenizer)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rlbatch-rollout",
                                       initializer=torch.set_num_threads, initargs=(threads,))
        self.pending: deque[Pending] = deque()
        self.carry_s = 0.0
        self.restored: dict[int, dict] = {}  # version -> weights, from a checkpoint

    def next_step(self, done_steps: int) -> int:
        """The step of the next batch to submit."""
        return done_steps + 1 + len(self.pending)

    def prompts_pending(self) -> int:
        return sum(len(p.examples) for p in self.pending)

    def version_for(self, step: int) -> int:
        return max(0, step - 1 - self.k)

    def weights_for(self, version: int, current_version: int, model) -> dict:
        """Weights of `version`: those a pending batch or a checkpoint already holds, else a
        copy of the model's where it is current."""
        held = {**self.restored, **{p.version: p.weights for p in self.pending}}
        if version in held:
            return held[version]
        if version == current_version:
            return weights_of(model)
        raise RuntimeError(f"no weights kept for policy version {version}")

    def submit(self, step: int, version: int, weights: dict, examples: list,
               prompt_ids: list, params: SamplingParams, concurrency: int, keys: list[int],
               latency_s: float) -> None:
        fut = self.pool.submit(self._decode, weights, prompt_ids, params, concurrency, keys,
                               latency_s)
        self.pending.append(Pending(step, version, weights, examples, prompt_ids, fut))

    @torch.no_grad()
    def _decode(self, weights, prompt_ids, params, concurrency, keys, latency_s):
        t0 = time.perf_counter()
        self.model.load_state_dict(weights)
        ro = self.engine.generate(prompt_ids, params, concurrency, keys=keys)
        if latency_s:
            time.sleep(latency_s)
        return ro, time.perf_counter() - t0

    def take(self, step: int) -> Taken:
        """The batch of `step`, waiting for it if the worker has not finished it."""
        p = self.pending.popleft()
        if p.step != step:
            raise RuntimeError(f"batch of step {p.step} pending where step {step} runs")
        t0 = time.perf_counter()
        ro, decode_s = p.future.result()
        wait = time.perf_counter() - t0 + self.carry_s
        self.carry_s = 0.0
        self.restored = {v: w for v, w in self.restored.items()
                         if any(q.version == v for q in self.pending)}
        return Taken(p, ro, decode_s, wait)

    def drain(self) -> None:
        """Wait for every pending batch (before an evaluation or a checkpoint), the wait
        charged to the next step."""
        t0 = time.perf_counter()
        for p in self.pending:
            p.future.result()
        self.carry_s += time.perf_counter() - t0

    def state(self) -> dict:
        """What a checkpoint keeps: the weights of the versions the pending batches are
        decoded from (their prompts are drawn again from the stream on resume)."""
        return {"weights": {p.version: p.weights for p in self.pending}}

    def restore(self, state: dict | None) -> None:
        """Take the weights a checkpoint kept."""
        self.restored = dict(state["weights"]) if state else {}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
