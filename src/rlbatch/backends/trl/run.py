"""The TRL backend's driver: the run directory and its TRL checkpoints, `TRLRun` (one
training run: TRL builds and drives the loop, the run-log callback calls back into
`end_step`, which writes the `steps.jsonl` row, evaluates at the sample marks and decides
whether to stop or checkpoint), and `train_trl` (package docstring: the backend as a whole;
its deviations from the built-in trainer: docs/design.md, "Module notes").
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from rlbatch.backends.builtin.runstate import (
    RunState,
    fault_rate_message,
    half_accuracies,
    open_run,
    run_recorded,
)
from rlbatch.backends.trl.hooks import (
    COUNTERS,
    require_trl,
    run_log_callback_class,
    timed_trainer_class,
)
from rlbatch.backends.trl.mapping import TaskReward, build_dataset, check_trl_config, grpo_args
from rlbatch.core.config import Config
from rlbatch.core.runlog import atomic_write_json, read_json
from rlbatch.rollout.reward_runner import RewardError

Callback = Callable[[str, dict], None]
# transformers 5.x deprecates the `gradient_checkpointing` names TRL still uses (noise only)
_DEPRECATION = r"`(is_)?gradient_checkpointing` is deprecated"


def open_trl_run(cfg: Config, *, resume: bool, fresh: bool) -> RunState:
    """The built-in `open_run` (same ids, refusal and resume rules); a new run's manifest
    says `backend: trl` and records the TRL version."""
    import trl

    st = open_run(cfg, resume=resume, fresh=fresh)
    if not st.resuming and not st.finished:
        path = st.dir / "manifest.json"
        manifest = {**read_json(path), "backend": "trl", "trl": trl.__version__}
        atomic_write_json(path, manifest)
    return st


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Newest complete TRL checkpoint (one holding rlbatch's counters.json), or None."""
    root = Path(run_dir) / "trl"
    done = [p for p in root.glob("checkpoint-*") if (p / COUNTERS).exists()]
    return max(done, key=lambda p: int(p.name.split("-")[-1])) if done else None


def _mean(values: list) -> float:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else float("nan")


class TRLRun:
    """One training run with TRL's GRPOTrainer; `run()` returns the summary.

    Same surface as the built-in `Trainer` for the CLI: `.state`, `.cb`, `.run()`.
    """

    def __init__(self, cfg: Config, *, resume: bool = False, fresh: bool = False,
                 callback: Callback | None = None, build_progress: Callable | None = None):
        require_trl()
        check_trl_config(cfg)
        from rlbatch.backends.builtin.trainer import pick_device
        from rlbatch.rollout.datasets import build_task, check_eval_prompts
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
        from rlbatch.rollout.prompt_lengths import check_prompt_lengths

        check_prompt_lengths(self.task, self.model_path, cfg.rollout.max_new_tokens)
        check_eval_prompts(self.task, cfg.eval.prompts, cfg.task.eval_path or cfg.task.path)
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

        cls = timed_trainer_class()
        args = grpo_args(cfg, self.state.dir / "trl", self.device)
        self.trainer = cls(model=model, reward_funcs=[self.reward], args=args,
                           train_dataset=dataset, processing_class=tok,
                           callbacks=[run_log_callback_class()(self)])
        self.trainer.init_timing(schedule, cuda_sync_or_none(self.device))
        for quiet in (PrinterCallback, ProgressCallback):  # the rlbatch CLI shows progress
            self.trainer.remove_callback(quiet)
        engine = cfg.rollout.engine if cfg.rollout.engine in ("builtin", "hf") else "hf"
        self.eval_engine = make_engine(engine, self.trainer.model, tok)
        self.tok = tok

    # ---- the loop (HF drives it; the callback calls back into these) ----
    def run(self) -> dict:
        return run_recorded(self.state, self._run, self.runner.close)

    def _run(self) -> dict:
        st = self.state
        if st.c.step == 0 and self.cfg.eval.at_start and not st.c.evals_done:
            self.evaluate()
        if st.status != "running":  # target reached at the start, or a final checkpoint
            return st.finish()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _DEPRECATION, FutureWarning)
            self.trainer.train(resume_from_checkpoint=str(self.checkpoint) if self.checkpoint
                               else None)
        if st.status == "running":  # HF stopped before the budget: should not happen
            st.c.status = "failed"
        return st.finish()

    def end_step(self, logs: list[dict], wall: float, skipped: int, control) -> None:
        """Write one steps.jsonl row, evaluate at due marks, update the status."""
        cfg, st, tr, rw = self.cfg, self.state, self.trainer, self.reward
        P = cfg.batch.prompts_per_step
        times, tr.phase_s = tr.phase_s, {}
        st.advance(P, len(rw.rewards), rw.tokens, wall, skipped)
        row = {"step": st.c.step, "samples": st.c.samples, "prompts": st.c.prompts,
               "tokens": st.c.tokens, "train_s": st.c.train_s}
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
        if st.after_step(self.evaluate):
            control.should_save = True
        if st.status != "running":
            control.should_training_stop = True

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
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + st.c.step)
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
        row = {"step": st.c.step, "samples": st.c.samples, "train_s": st.c.train_s,
               # the mean over the calls that did not fault, as the built-in trainer's
               "eval/accuracy": sum(s or 0.0 for s in ok) / len(ok) if ok else float("nan"),
               "eval/unscorable": sum(s is None for s in ok),
               "eval/prompts": len(examples), "eval/k": ev.k,
               "eval/mean_length": float(ro.lengths.float().mean()),
               **{f"eval/reward_{k}": n for k, n in scored.counts().items()}}
        if ev.halves:
            row.update(half_accuracies(scored.values, [f is not None for f in scored.faults],
                                       ev.k))
        st.log_eval(row, time.perf_counter() - t0)
        self.cb("eval", row)
        reason = fault_rate_message(cfg, scored.n_faults, len(calls),
                                    f"in the evaluation at step {st.c.step}")
        if reason is not None:
            raise RewardError(reason)


def train_trl(cfg: Config, *, resume: bool = False, fresh: bool = False,
              callback: Callback | None = None,
              build_progress: Callable | None = None) -> tuple[Path, dict]:
    """Run (or resume) one TRL GRPO run; return (run directory, summary)."""
    run = TRLRun(cfg, resume=resume, fresh=fresh, callback=callback,
                 build_progress=build_progress)
    return run.state.dir, run.run()
