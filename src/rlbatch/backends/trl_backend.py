"""TRL backend: Hugging Face TRL's `GRPOTrainer` driven by an rlbatch config, writing the run log.

The same run-log contract as the built-in trainer (docs/metrics.md): one `steps.jsonl` row per
rollout step, evaluations at the same cumulative-sample marks (multiples of
`eval.every_samples`, greedy held-out accuracy with the built-in decode engine over TRL's own
model object), `summary.json` with the same statuses. Counters, stopping rules and the summary
reuse the built-in `RunState`; only the manifest says `backend: trl`.

Config -> `GRPOConfig` (one rollout step = one TRL generation batch of B = P x G completions):
`num_generations` = G, `generation_batch_size` = B, `per_device_train_batch_size` =
`micro_batch_sequences`, `gradient_accumulation_steps` = minibatch / micro,
`num_iterations` = `epochs_per_step`; optimizer steps per rollout step =
`minibatches_per_step x epochs_per_step` (= `updates_per_step`). `loss_type="dapo"` (token-mean
over the minibatch, the built-in aggregation), `scale_rewards="group"|"none"` from
`loss.advantage_norm`, `epsilon`/`epsilon_high` from the clip ratios, `beta` = `loss.kl_coef`,
AdamW with the scaled LR, betas and eps of `derived:`, the built-in LR schedule (warm-up in
samples, then constant) in place of HF's linear decay, fp32 (no bf16), no gradient
checkpointing, the prompts in stream order (`shuffle_dataset=False`), so TRL sees the same
prompts per step as the built-in trainer.

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

Deviations from the built-in trainer (stated, not hidden):
- TRL normalizes group advantages by the Bessel-corrected std (eps 1e-4); the built-in uses
  the population std (eps 1e-6): TRL's advantages are sqrt((G-1)/G) times smaller, a constant
  factor that Adam's normalization nearly cancels.
- Generation is one `model.generate` over all B sequences (`rollout.generation_concurrency`
  and `rollout.engine` do not apply to TRL's rollout; evaluation uses `rollout.engine`, or `hf`
  when it is `vllm`). With one update per step the old log-probabilities of the ratio are
  the current policy's, detached (no extra forward, like the built-in trainer, which takes
  the engine's); with several, TRL recomputes them in one extra forward (in `time/other`).
- HF's `Trainer` never skips an update; here a callback drops the gradients of an update whose
  gradient norm is non-finite (counted in `actor/nonfinite_skipped`), and
  `nonfinite.max_consecutive` such steps in a row end the run as `diverged`.
- Weight decay follows HF (not applied to biases and norm weights).
- Rewards go through the same reward runner and policy as the built-in trainer (a worker
  pool with a timeout for `module:function` rewards, faults counted per step, the run failed
  past `reward.max_error_rate`), except `reward.on_error: drop`, which is refused: TRL's group
  statistics cannot leave a sample out, so a faulted sample gets `reward.error_value`.
- Any exception inside the run writes `status: failed` and `failure` before propagating, as
  the built-in trainer does; `--resume` continues a failed run from its newest checkpoint.
- Checkpoints are TRL/HF checkpoint folders under `<run>/trl/checkpoint-<optimizer step>`
  (plus rlbatch's `counters.json`), written at `checkpoint.every_samples` marks and at the end;
  `--resume` continues from the newest one (HF restores model, optimizer, scheduler, RNG and
  skips the consumed batches), or starts over when there is none.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from rlbatch.backends.builtin.runstate import RunState, fault_rate_message, open_run
from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError
from rlbatch.core.runlog import _read_json, atomic_write_json
from rlbatch.rollout.reward_runner import RewardError

Callback = Callable[[str, dict], None]
COUNTERS = "counters.json"
# transformers 5.x deprecates the `gradient_checkpointing` names TRL still uses (noise only)
_DEPRECATION = r"`(is_)?gradient_checkpointing` is deprecated"


# GRPOTrainer methods the phase timing wraps (private API; written against TRL 1.16)
WRAPPED = ("training_step", "_prepare_inputs", "_generate_and_score_completions", "_generate",
           "_tokenize_prompts", "_generate_single_turn", "_calculate_rewards",
           "_get_per_token_logps_and_entropies")


def _require_trl() -> None:
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


def check_trl_config(cfg: Config) -> None:
    """One-line errors for configs the TRL backend cannot run as the built-in trainer would."""
    if cfg.algorithm != "grpo":
        raise ConfigError(f"algorithm: the trl backend runs GRPO only, not '{cfg.algorithm}'")
    if cfg.noise_scale.enabled:
        raise ConfigError("noise_scale.enabled: not measured by the trl backend; set it to false")
    if cfg.reward.on_error == "drop":
        raise ConfigError("reward.on_error: 'drop' is not supported by the trl backend (its "
                          "group statistics cannot leave a sample out); use 'value'")


def rollout_steps(cfg: Config) -> int:
    """Rollout steps to reach budget.max_samples (the last step may overshoot, as built-in)."""
    return math.ceil(cfg.budget.max_samples / cfg.sequences_per_step)


# ---------------------------------------------------------------- run directory

def open_trl_run(cfg: Config, *, resume: bool, fresh: bool) -> RunState:
    """The built-in `open_run` (same ids, refusal and resume rules); a new run's manifest
    says `backend: trl` and records the TRL version."""
    import trl

    st = open_run(cfg, resume=resume, fresh=fresh)
    if not st.resuming and not st.finished:
        path = st.dir / "manifest.json"
        manifest = {**_read_json(path), "backend": "trl", "trl": trl.__version__}
        atomic_write_json(path, manifest)
    return st


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Newest complete TRL checkpoint (one holding rlbatch's counters.json), or None."""
    root = Path(run_dir) / "trl"
    done = [p for p in root.glob("checkpoint-*") if (p / COUNTERS).exists()]
    return max(done, key=lambda p: int(p.name.split("-")[-1])) if done else None


# ---------------------------------------------------------------- config mapping

def grpo_args(cfg: Config, output_dir: Path, device: str):
    """The `GRPOConfig` an rlbatch config maps onto (module docstring)."""
    from trl import GRPOConfig

    b, loss, opt = cfg.batch, cfg.loss, cfg.optimizer
    micro = cfg.micro_batch_sequences
    adam = cfg.adam
    return GRPOConfig(
        output_dir=str(output_dir),
        num_generations=b.samples_per_prompt,
        generation_batch_size=cfg.sequences_per_step,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=cfg.minibatch_sequences // micro,
        num_iterations=b.epochs_per_step,
        max_steps=rollout_steps(cfg) * cfg.updates_per_step,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        learning_rate=cfg.actor_lr,
        lr_scheduler_type="constant",  # replaced by the built-in schedule (create_scheduler)
        optim="adamw_torch",
        adam_beta1=adam["betas"][0],
        adam_beta2=adam["betas"][1],
        adam_epsilon=adam["eps"],
        weight_decay=opt.weight_decay,
        max_grad_norm=opt.max_grad_norm or 0.0,
        beta=loss.kl_coef,
        epsilon=loss.clip_ratio_low,
        epsilon_high=loss.clip_ratio_high,
        loss_type="dapo",
        scale_rewards="group" if loss.advantage_norm == "std" else "none",
        mask_truncated_completions=False,
        shuffle_dataset=False,
        use_vllm=False,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=device == "cpu",
        seed=cfg.seed,
        data_seed=cfg.seed,
        report_to=[],
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="no",  # checkpoints are requested by the run-log callback
        save_total_limit=2,  # the newest complete one survives a kill during the next save
        save_only_model=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        log_completions=False,
    )


def build_dataset(task, tokenizer, cfg: Config):
    """The first `steps x P` prompts of the task's training stream, in order, as a Dataset.

    `idx` points back into the returned example list so the reward sees the whole Example.
    With a chat template the prompt is a message list (TRL applies the template, as
    `encode_prompt` does); otherwise plain text (the tiny tokenizer adds `<bos>`).
    """
    from datasets import Dataset

    stream = task.train_stream(cfg.seed)
    examples = [next(stream) for _ in range(rollout_steps(cfg) * cfg.batch.prompts_per_step)]
    chat = bool(getattr(tokenizer, "chat_template", None))
    prompts = [(e.meta.get("messages") or [{"role": "user", "content": e.prompt}]) if chat
               else e.prompt for e in examples]
    return Dataset.from_dict({"prompt": prompts, "idx": list(range(len(examples)))}), examples


class TaskReward:
    """TRL reward function over the rlbatch task reward (through the reward runner); also
    counts this step's tokens and reward faults.

    Unscorable completions (reward None) are counted and scored 0, as in the built-in trainer
    (TRL would drop them from the group baseline instead); a faulted call scores
    `reward.error_value`.
    """

    __name__ = "task_reward"

    def __init__(self, task, examples, runner=None, error_value: float = 0.0, on_faults=None):
        from rlbatch.core.config import RewardConfig
        from rlbatch.rollout.reward_runner import RewardRunner

        self.task, self.examples = task, examples
        self.runner = runner or RewardRunner(task, "exact", 1e-6, RewardConfig())
        self.error_value = error_value
        self.on_faults = on_faults or (lambda rows: None)
        self.reset()

    def reset(self) -> None:
        self.rewards: list[float] = []
        self.unscorable = 0
        self.tokens = 0
        self.lengths: list[int] = []
        self.faults = {"errors": 0, "timeouts": 0, "nonfinite": 0}

    def __call__(self, prompts, completions, completion_ids, idx, **_) -> list[float]:
        from rlbatch.rollout.reward_runner import Call

        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        calls = [Call(self.examples[i].prompt, text, self.examples[i], i)
                 for text, i in zip(texts, idx)]
        scored = self.runner.score(calls)
        self.on_faults(self.runner.log.new(self.runner.name, scored, calls))
        out = []
        for value, fault in zip(scored.values, scored.faults):
            if fault is not None:
                value = self.error_value
            elif value is None:
                self.unscorable += 1
                value = 0.0
            out.append(float(value))
        for key, n in scored.counts().items():
            self.faults[key] += n
        self.lengths.extend(len(ids) for ids in completion_ids)
        self.rewards.extend(out)
        self.tokens += sum(len(ids) for ids in completion_ids)
        return out


def _timed_trainer_class():
    """GRPOTrainer subclass that times the phases (module docstring) into `self.phase_s`."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        def _init_timing(self, schedule: Callable[[int], float], sync: Callable | None) -> None:
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

    return TimedGRPOTrainer


# ---------------------------------------------------------------- the run-log callback

def _make_callback_class():
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


def _mean(values: list) -> float:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else float("nan")


# ---------------------------------------------------------------- the run

class TRLRun:
    """One training run with TRL's GRPOTrainer; `run()` returns the summary.

    Same surface as the built-in `Trainer` for the CLI: `.state`, `.cb`, `.run()`.
    """

    def __init__(self, cfg: Config, *, resume: bool = False, fresh: bool = False,
                 callback: Callback | None = None, build_progress: Callable | None = None):
        _require_trl()
        check_trl_config(cfg)
        from rlbatch.backends.builtin.trainer import pick_device
        from rlbatch.rollout.datasets import build_task
        from rlbatch.rollout.models import resolve_model_path

        self.cfg = cfg
        self.cb = callback or (lambda kind, row: None)
        self.device = pick_device(cfg.device)
        if os.environ.get("RLBATCH_THREADS"):  # set by rlbatch profile's executors (as built-in)
            import torch

            torch.set_num_threads(int(os.environ["RLBATCH_THREADS"]))
        from rlbatch.rollout.reward_runner import RewardRunner

        self.task = build_task(cfg.task)
        self.runner = RewardRunner(self.task, cfg.task.reward, cfg.task.tolerance, cfg.reward)
        self.model_path = resolve_model_path(cfg.model, cfg.task.name, cfg.task.digits,
                                             build_progress)
        self.state: RunState = open_trl_run(cfg, resume=resume, fresh=fresh)
        self.trainer = None
        if self.state.finished:
            return
        try:
            self.checkpoint = latest_checkpoint(self.state.dir) if self.state.resuming else None
            if self.checkpoint is not None:
                self.state.load_counters(json.loads((self.checkpoint / COUNTERS).read_text()))
            self.state.truncate_logs()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", _DEPRECATION, FutureWarning)
                self._build()
        except BaseException as exc:  # any way out of the run is written down first
            self.state.fail(exc)
            self.runner.close()
            raise

    def _build(self) -> None:
        import torch
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        from rlbatch.algos.lr import lr_at
        from rlbatch.core.timers import cuda_sync_or_none
        from rlbatch.rollout.models import load_model_and_tokenizer, make_engine

        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        model, tok = load_model_and_tokenizer(self.model_path, self.device)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        dataset, examples = build_dataset(self.task, tok, cfg)
        self.reward = TaskReward(self.task, examples, self.runner, cfg.reward.error_value,
                                 lambda rows: self.state.log_reward_faults(rows, "train"))
        U, B = cfg.updates_per_step, cfg.sequences_per_step
        base, warm = cfg.actor_lr, cfg.optimizer.warmup_samples

        def schedule(opt_step: int) -> float:  # 0-based optimizer step -> LR factor
            return lr_at((opt_step // U + 1) * B, base, warm) / base

        cls = _timed_trainer_class()
        args = grpo_args(cfg, self.state.dir / "trl", self.device)
        self.trainer = cls(model=model, reward_funcs=[self.reward], args=args,
                           train_dataset=dataset, processing_class=tok,
                           callbacks=[_make_callback_class()(self)])
        self.trainer._init_timing(schedule, cuda_sync_or_none(self.device))
        for quiet in (PrinterCallback, ProgressCallback):  # the rlbatch CLI shows progress
            self.trainer.remove_callback(quiet)
        engine = cfg.rollout.engine if cfg.rollout.engine in ("builtin", "hf") else "hf"
        self.eval_engine = make_engine(engine, self.trainer.model, tok)
        self.tok = tok

    # ---- the loop (HF drives it; the callback calls back into these) ----
    def run(self) -> dict:
        if self.state.finished:
            return self.state.summary
        try:
            return self._run()
        except BaseException as exc:  # written down, then propagated
            self.state.fail(exc)
            raise
        finally:
            self.runner.close()

    def _run(self) -> dict:
        st = self.state
        if st.c["step"] == 0 and self.cfg.eval.at_start and not st.c["evals_done"]:
            self.evaluate()
        if st.status != "running":  # target reached at the start, or a final checkpoint
            return st.finish()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _DEPRECATION, FutureWarning)
            self.trainer.train(resume_from_checkpoint=str(self.checkpoint) if self.checkpoint
                               else None)
        if st.status == "running":  # HF stopped before the budget: should not happen
            st.c["status"] = "failed"
        return st.finish()

    def end_step(self, logs: list[dict], wall: float, skipped: int, control) -> None:
        """Write one steps.jsonl row, evaluate at due marks, update the status."""
        cfg, st, tr, rw = self.cfg, self.state, self.trainer, self.reward
        P = cfg.batch.prompts_per_step
        times, tr.phase_s = tr.phase_s, {}
        st.advance(P, len(rw.rewards), rw.tokens, wall, skipped, skipped > 0)
        row = {"step": st.c["step"], "samples": st.c["samples"], "prompts": st.c["prompts"],
               "tokens": st.c["tokens"], "train_s": st.c["train_s"]}
        named = ("rollout", "reward", "actor_update", "critic_update", "reference")
        for k in named:
            if k != "reference" or cfg.loss.kl_coef > 0:
                row[f"time/{k}"] = times.get(k, 0.0)
        row["time/other"] = max(0.0, wall - sum(times.get(k, 0.0) for k in named))
        n = max(len(rw.rewards), 1)
        row.update({
            "reward/mean": sum(rw.rewards) / n, "reward/unscorable": rw.unscorable,
            "response/mean_length": sum(rw.lengths) / n,
            "rollout/tokens_per_s": rw.tokens / max(times.get("rollout", 0.0), 1e-9),
            "actor/lr": logs[-1].get("learning_rate"),
            "actor/loss": _mean([r.get("loss") for r in logs]),
            "actor/grad_norm": _mean([r.get("grad_norm") for r in logs]),
            "actor/entropy": _mean([r.get("entropy") for r in logs]),
            "actor/clip_frac": _mean([r.get("clip_ratio/region_mean") for r in logs]),
            "adv/zero_std_groups": _mean([r.get("frac_reward_zero_std") for r in logs]),
            "actor/nonfinite_skipped": skipped,
            **{f"reward/{k}": n for k, n in rw.faults.items()},
        })
        st.count_reward_faults(len(rw.rewards), rw.faults)
        if cfg.loss.kl_coef > 0:
            row["actor/kl"] = _mean([r.get("kl") for r in logs])
        rw.reset()
        st.log_step(row)
        self.cb("step", row)
        if (reason := st.reward_fault_rate_exceeded()) is not None:
            raise RewardError(reason)
        while st.c["samples"] >= st.c["next_eval"]:
            self.evaluate()
        st.update_status(row)
        if st.needs_final_eval():
            self.evaluate()
            st.after_final_eval()
        if st.status != "running":
            control.should_training_stop = True
        if st.due_checkpoint() or st.status != "running":
            control.should_save = True

    def evaluate(self) -> None:
        """Greedy (k=1) or sampled mean@k held-out accuracy of the current policy."""
        import torch

        from rlbatch.rollout.engine import SamplingParams
        from rlbatch.rollout.models import encode_prompt
        from rlbatch.rollout.reward_runner import Call

        cfg, st = self.cfg, self.state
        t0 = time.perf_counter()
        ev = cfg.eval
        examples = self.task.eval_set(ev.prompts)
        reps = [e for e in examples for _ in range(ev.k)]
        prompt_ids = [encode_prompt(self.tok, e) for e in reps]
        params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, greedy=ev.k == 1,
                                temperature=ev.temperature)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + st.c["step"])
        model = self.trainer.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                ro = self.eval_engine.generate(prompt_ids, params,
                                               cfg.rollout.generation_concurrency, generator=gen)
        finally:
            model.train(was_training)
        texts = self.tok.batch_decode(
            [ids[:n] for ids, n in zip(ro.response_ids.tolist(), ro.lengths.tolist())],
            skip_special_tokens=True)
        calls = [Call(e.prompt, t, e, i // ev.k) for i, (e, t) in enumerate(zip(reps, texts))]
        scored = self.runner.score(calls)
        st.log_reward_faults(self.runner.log.new(self.runner.name, scored, calls), "eval")
        ok = [s for s, f in zip(scored.values, scored.faults) if f is None]
        row = {"step": st.c["step"], "samples": st.c["samples"], "train_s": st.c["train_s"],
               # the mean over the calls that did not fault, as the built-in trainer's
               "eval/accuracy": sum(s or 0.0 for s in ok) / len(ok) if ok else float("nan"),
               "eval/unscorable": sum(s is None for s in ok),
               "eval/prompts": len(examples), "eval/k": ev.k,
               "eval/mean_length": float(ro.lengths.float().mean()),
               **{f"eval/reward_{k}": n for k, n in scored.counts().items()}}
        st.log_eval(row, time.perf_counter() - t0)
        self.cb("eval", row)
        reason = fault_rate_message(cfg, scored.n_faults, len(calls),
                                    f"in the evaluation at step {st.c['step']}")
        if reason is not None:
            raise RewardError(reason)


def train_trl(cfg: Config, *, resume: bool = False, fresh: bool = False,
              callback: Callback | None = None,
              build_progress: Callable | None = None) -> tuple[Path, dict]:
    """Run (or resume) one TRL GRPO run; return (run directory, summary)."""
    run = TRLRun(cfg, resume=resume, fresh=fresh, callback=callback,
                 build_progress=build_progress)
    return run.state.dir, run.run()
