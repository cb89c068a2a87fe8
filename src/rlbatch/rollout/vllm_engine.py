"""vLLM decode engine (`rollout.engine: vllm`): GPU only, optional extra `vllm`.

Implements the engine interface of `engine.py` over `vllm.LLM`: prompts go in as token ids,
one `SamplingParams(n=1, ...)` per sequence, `max_num_seqs = C` caps the sequences in
flight, and after each optimizer update `sync_weights()` loads the HF model's state_dict
into vLLM's model in place (no checkpoint written). Deviations from the built-in engine:
vLLM's log-probabilities are used only where they equal the contract (greedy, or
top_p == 1), otherwise the sampled tokens are re-scored by a teacher-forced forward; each
sequence gets a seed drawn from the generator; a different C rebuilds the LLM; the engine
core stays in this process. UNVERIFIED: written against vLLM's public API (0.8 - 0.11)
without a GPU; its tests skip without CUDA and vllm. Details: docs/design.md,
"Module notes".
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from rlbatch.core.errors import ConfigError
from rlbatch.rollout.engine import Rollouts, SamplingParams, pack_rollouts

UNAVAILABLE = "rollout.engine: vllm needs the `vllm` extra and a CUDA GPU"


def _import_vllm():
    """The vllm module, or a one-line ConfigError when it or a CUDA GPU is missing."""
    if not torch.cuda.is_available():
        raise ConfigError(UNAVAILABLE)
    try:
        import vllm
    except (ImportError, OSError):  # OSError: vllm present but its CUDA libraries are not
        raise ConfigError(UNAVAILABLE) from None
    return vllm


def _engine_arg_names() -> set[str]:
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return set()
    return {f.name for f in dataclasses.fields(EngineArgs)}


@torch.no_grad()
def teacher_forced_logprobs(model, prompt_ids: list[list[int]], responses: list[list[int]],
                            params: SamplingParams, pad_id: int, chunk: int = 32
                            ) -> list[list[float]]:
    """log_softmax(logits / T) of each response token given its prompt and earlier tokens
    (T = 1 when greedy), from a right-padded forward of the HF model, `chunk` rows at a time."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    temp = 1.0 if params.greedy else params.temperature
    out: list[list[float]] = []
    for i in range(0, len(prompt_ids), chunk):
        seqs = [p + r for p, r in zip(prompt_ids[i: i + chunk], responses[i: i + chunk])]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, : len(s)] = torch.tensor(s)
            attn[j, : len(s)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits
        logp = torch.log_softmax(logits.float() / temp, dim=-1)  # (n, width, V)
        for j, (p, r) in enumerate(zip(prompt_ids[i: i + chunk], responses[i: i + chunk])):
            rows = logp[j, len(p) - 1: len(p) - 1 + len(r)]  # (len(r), V): predicts r
            tok = torch.tensor(r, dtype=torch.long, device=rows.device)
            out.append(rows.gather(1, tok[:, None]).squeeze(1).tolist())
    model.train(was_training)
    return out


class _LoadWeights:
    """Picklable callable for `LLM.apply_model`: load (name, tensor) pairs into the model."""

    def __init__(self, weights):
        self.weights = weights

    def __call__(self, vllm_model):
        vllm_model.load_weights(self.weights)


class VLLMEngine:
    name = "vllm"

    def __init__(self, model, tokenizer, eos_ids: list[int], pad_id: int, *,
                 gpu_memory_utilization: float = 0.5, llm_kwargs: dict | None = None):
        self._vllm = _import_vllm()
        self.model, self.tokenizer = model, tokenizer
        self.eos = [int(e) for e in eos_ids]
        self.pad_id = pad_id
        self.gpu_memory_utilization = gpu_memory_utilization
        self.llm_kwargs = dict(llm_kwargs or {})
        self.processed_logprobs = False  # set when the LLM is built
        self._llm = None
        self._max_num_seqs: int | None = None
        self._tmpdir: str | None = None

    # ---- lifecycle ----
    def _model_path(self) -> str:
        """The checkpoint folder the model came from, else a temporary save of it."""
        path = getattr(self.model, "name_or_path", "") or ""
        if path and (Path(path) / "config.json").is_file():
            return path
        if self._tmpdir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="rlbatch-vllm-")
            self.model.save_pretrained(self._tmpdir)
            self.tokenizer.save_pretrained(self._tmpdir)
        return self._tmpdir

    def _ensure_llm(self, concurrency: int):
        if self._llm is not None and self._max_num_seqs == concurrency:
            return self._llm
        self.close(keep_tmpdir=True)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        kwargs = {"model": self._model_path(), "max_num_seqs": concurrency, "dtype": dtype,
                  "gpu_memory_utilization": self.gpu_memory_utilization, "seed": 0}
        if "logprobs_mode" in _engine_arg_names():
            kwargs["logprobs_mode"] = "processed_logprobs"
        kwargs.update(self.llm_kwargs)
        self.processed_logprobs = kwargs.get("logprobs_mode") == "processed_logprobs"
        self._llm = self._vllm.LLM(**kwargs)
        self._max_num_seqs = concurrency
        self.sync_weights()  # the trainer's weights may already differ from the checkpoint
        return self._llm

    def close(self, keep_tmpdir: bool = False) -> None:
        """Drop the LLM and free its GPU memory (a later generate rebuilds it)."""
        if self._llm is not None:
            self._llm = None
            self._max_num_seqs = None
            gc.collect()
            torch.cuda.empty_cache()
        if self._tmpdir is not None and not keep_tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def sync_weights(self) -> None:
        """Load the HF model's current state_dict into vLLM's model, in place.

        Newer vLLM: `LLM.apply_model(fn)` runs fn(model) on each worker. Older vLLM (V0, or
        V1 in-process): the model sits at llm_engine.model_executor.driver_worker.model_runner.
        Either way vLLM's `load_weights` maps HF names (stacked qkv / gate_up, tied head) and
        casts to its dtype. The prefix cache is reset, since cached KV came from old weights.
        """
        llm = self._llm
        if llm is None:
            return  # built later from the checkpoint, then synced
        weights = [(k, v.detach()) for k, v in self.model.state_dict().items()]
        if hasattr(llm, "apply_model"):
            llm.apply_model(_LoadWeights(weights))
        else:
            engine = getattr(llm, "llm_engine", None)
            worker = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
            worker = getattr(worker, "worker", worker)  # WorkerWrapperBase in later V0
            runner = getattr(worker, "model_runner", None)
            if not hasattr(getattr(runner, "model", None), "load_weights"):
                raise ConfigError("rollout.engine: this vllm version exposes no way to load "
                                  "weights (neither LLM.apply_model nor driver_worker.model_runner)")
            runner.model.load_weights(weights)
        if hasattr(llm, "reset_prefix_cache"):
            llm.reset_prefix_cache()

    # ---- decoding ----
    def _sampling_params(self, params: SamplingParams, seed: int):
        kw = {"n": 1, "max_tokens": params.max_new_tokens, "logprobs": 0, "seed": seed}
        if params.greedy:
            kw["temperature"] = 0.0
        else:
            kw.update(temperature=params.temperature, top_p=params.top_p)
        if self.eos:
            kw["stop_token_ids"] = list(self.eos)
        else:
            kw["ignore_eos"] = True  # no EOS: run every sequence to max_tokens
        return self._vllm.SamplingParams(**kw)

    def _uses_vllm_logprobs(self, params: SamplingParams) -> bool:
        return self.processed_logprobs and (params.greedy or params.top_p >= 1.0)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, concurrency: int,
                 generator: torch.Generator | None = None,
                 keys: list[int] | None = None) -> Rollouts:
        c = max(1, min(concurrency, len(prompt_ids)))
        llm = self._ensure_llm(c)
        # one seed per request (vLLM seeds each request's sampler): keyed when keys are given
        seeds = [k % (2 ** 31 - 1) for k in keys] if keys is not None else \
            torch.randint(0, 2 ** 31 - 1, (len(prompt_ids),), generator=generator).tolist()
        sampling = [self._sampling_params(params, s) for s in seeds]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = llm.generate(prompts, sampling, use_tqdm=False)  # in prompt order
        torch.cuda.synchronize()
        decode_s = time.perf_counter() - start
        responses, logps, reasons = [], [], []
        for out in outputs:
            comp = out.outputs[0]
            toks = [int(t) for t in comp.token_ids]
            responses.append(toks)
            reasons.append("length" if comp.finish_reason == "length" else "eos")
            if self._uses_vllm_logprobs(params):
                logps.append([float(comp.logprobs[i][t].logprob) for i, t in enumerate(toks)])
        rescore_s = 0.0
        if not self._uses_vllm_logprobs(params):
            t0 = time.perf_counter()
            logps = teacher_forced_logprobs(self.model, prompt_ids, responses, params,
                                            self.pad_id)
            rescore_s = time.perf_counter() - t0
        timing = {"prefill_s": 0.0, "decode_s": decode_s, "rescore_s": rescore_s,
                  "tokens": sum(len(r) for r in responses), "concurrency": c}
        return pack_rollouts(prompt_ids, responses, logps, reasons, self.pad_id, timing)
