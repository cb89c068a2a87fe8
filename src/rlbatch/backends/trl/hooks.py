"""What the TRL backend hooks into TRL: a `GRPOTrainer` subclass that times the phases, and
the HF callback that skips non-finite updates and hands each finished rollout step (and each
checkpoint) to the run (`run.TRLRun`; package docstring: the backend as a whole).

Timing (TRL measures phases only for W&B/MLflow/Trackio, not in its logs), measured here by
wrapping `GRPOTrainer` methods and optimizer-step callbacks:
- `time/rollout`: prompt tokenization + `model.generate` (`_tokenize_prompts`,
  `_generate_single_turn`).
- `time/reward`: the rest of `_generate` (decoding completions to text, TRL's length metrics)
  + `_calculate_rewards` (the rlbatch task reward).
- `time/reference`: the frozen reference forward (only when `loss.kl_coef > 0`).
- `time/actor_update`: each `training_step` minus its `_prepare_inputs` (forward, loss,
  backward) + gradient clipping and `optimizer.step()` (from the last micro-step's end to
  `on_optimizer_step`).
- `time/other`: the step's wall time minus those: data loading, padding, advantages,
  TRL/HF bookkeeping and logging, the LR scheduler step.
A step's wall time runs from the end of the previous step's logging (after evaluation and
checkpointing, which are excluded) to this step's `on_log`.

The subclass also replaces HF's LR scheduler by the built-in schedule (warm-up in samples,
then constant). The callback drops the gradients of an update whose gradient norm is
non-finite (HF's `Trainer` never skips one), and writes rlbatch's `counters.json` into each
checkpoint folder HF saves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlbatch.core.errors import ConfigError
from rlbatch.core.runlog import atomic_write_json

if TYPE_CHECKING:
    from rlbatch.backends.trl.run import TRLRun

# rlbatch's counters, written into each TRL checkpoint folder last: a folder holding it is complete
COUNTERS = "counters.json"

# GRPOTrainer methods the phase timing wraps (private API; written against TRL 1.16)
WRAPPED = ("training_step", "_prepare_inputs", "_generate_and_score_completions", "_generate",
           "_tokenize_prompts", "_generate_single_turn", "_calculate_rewards",
           "_get_per_token_logps_and_entropies")


def require_trl() -> None:
    """TRL importable and shaped as the timing expects, else a one-line ConfigError."""
    try:
        import trl
        from trl import GRPOTrainer
    except ImportError:
        raise ConfigError("backend: 'trl' needs TRL installed: pip install 'rlbatch[trl]'") from None
    missing = [m for m in WRAPPED if not hasattr(GRPOTrainer, m)]
    if missing:
        raise ConfigError(f"backend: TRL {trl.__version__} lacks GRPOTrainer.{missing[0]} "
                          "(the trl backend is written against TRL 1.16)")


class _PhaseTiming:
    """The timing half of `TimedGRPOTrainer`, mixed in before `GRPOTrainer` (which is imported
    lazily, so the subclass is built in `timed_trainer_class`); `super()` is GRPOTrainer."""

    def init_timing(self, schedule: Callable[[int], float], sync: Callable | None) -> None:
        self.phase_s: dict[str, float] = {}
        self._schedule = schedule
        self._sync = sync or (lambda: None)
        self._last_micro_end: float | None = None
        self._in_scoring = False
        self._prep_s = self._rollout_s = 0.0

    def _now(self) -> float:
        self._sync()  # device sync at phase boundaries (docs/design.md, house rule 6)
        return time.perf_counter()

    def _add(self, name: str, seconds: float) -> None:
        self.phase_s[name] = self.phase_s.get(name, 0.0) + seconds

    def create_scheduler(self, num_training_steps, optimizer=None):
        from torch.optim.lr_scheduler import LambdaLR

        if self.lr_scheduler is None:
            self.lr_scheduler = LambdaLR(optimizer or self.optimizer, self._schedule)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def training_step(self, model, inputs, num_items_in_batch):
        self._prep_s = 0.0
        t0 = self._now()
        out = super().training_step(model, inputs, num_items_in_batch)
        self._last_micro_end = self._now()
        self._add("actor_update", self._last_micro_end - t0 - self._prep_s)
        return out

    def _prepare_inputs(self, generation_batch):
        t0 = self._now()
        try:
            return super()._prepare_inputs(generation_batch)
        finally:
            self._prep_s += self._now() - t0

    def _generate_and_score_completions(self, inputs):
        self._in_scoring = True
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._in_scoring = False

    def _generate(self, prompts):
        t0 = self._now()
        self._rollout_s = 0.0
        try:
            return super()._generate(prompts)
        finally:  # decoding to text and TRL's length metrics count as reward time
            self._add("reward", self._now() - t0 - self._rollout_s)

    def _timed_rollout(self, fn, *args, **kwargs):
        t0 = self._now()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = self._now() - t0
            self._add("rollout", dt)
            self._rollout_s += dt

    def _tokenize_prompts(self, prompts):
        return self._timed_rollout(super()._tokenize_prompts, prompts)

    def _generate_single_turn(self, *args, **kwargs):
        return self._timed_rollout(super()._generate_single_turn, *args, **kwargs)

    def _calculate_rewards(self, *args, **kwargs):
        t0 = self._now()
        try:
            return super()._calculate_rewards(*args, **kwargs)
        finally:
            self._add("reward", self._now() - t0)

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        ref = self._in_scoring and self.ref_model is not None and model is self.ref_model
        t0 = self._now() if ref else 0.0
        try:
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        finally:
            if ref:
                self._add("reference", self._now() - t0)


def timed_trainer_class():
    """GRPOTrainer subclass that times the phases (module docstring) into `self.phase_s` and
    steps the LR by `schedule` (0-based optimizer step -> factor of the base LR)."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(_PhaseTiming, GRPOTrainer):
        pass

    return TimedGRPOTrainer


def run_log_callback_class():
    """HF `TrainerCallback` subclass that feeds a `TRLRun` (module docstring)."""
    from transformers import TrainerCallback

    class RunLogCallback(TrainerCallback):
        """Writes steps/evals/summary from HF callback events; evaluates at the sample marks."""

        def __init__(self, run: TRLRun):
            self.run = run
            self.mark = time.perf_counter()  # start of the step in flight
            self.logs: list[dict] = []  # HF log rows of this rollout step's optimizer steps
            self.skipped = 0

        def on_train_begin(self, args, state, control, **kw):
            self.mark = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            tr = self.run.trainer
            if not _grads_finite(tr.model):
                tr.model.zero_grad(set_to_none=True)  # skip this update (module docstring)
                self.skipped += 1

        def on_optimizer_step(self, args, state, control, **kw):
            tr = self.run.trainer
            if tr._last_micro_end is not None:  # gradient clipping + optimizer.step()
                tr._add("actor_update", tr._now() - tr._last_micro_end)
                tr._last_micro_end = None

        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "loss" not in logs:
                return
            self.logs.append(dict(logs))
            if len(self.logs) < self.run.cfg.updates_per_step:
                return
            wall = time.perf_counter() - self.mark
            logs_now, self.logs = self.logs, []
            skipped, self.skipped = self.skipped, 0
            self.run.end_step(logs_now, wall, skipped, control)
            self.mark = time.perf_counter()

        def on_save(self, args, state, control, **kw):
            run = self.run
            seconds = time.perf_counter() - self.mark
            run.state.checkpointed(seconds)
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            atomic_write_json(ckpt / COUNTERS, run.state.counters_for_checkpoint())
            self.mark = time.perf_counter()

    return RunLogCallback


def _grads_finite(model) -> bool:
    import torch

    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(torch.stack(norms)).all()) if norms else True
