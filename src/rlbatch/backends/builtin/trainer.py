"""Built-in online RL trainer (GRPO, PPO) writing the run-log contract.

One rollout step: draw P prompts -> decode P x G responses at concurrency C -> score them ->
advantages (GRPO: group-normalized; PPO: GAE over critic values) -> `updates_per_step`
optimizer updates of the actor (and of the critic for PPO) -> one `steps.jsonl` row.
Evaluations happen at the same cumulative-sample marks for every B and, like checkpoints,
are excluded from `train_s`. The old log-probabilities of the ratio are the engine's, which
saves one forward pass per step. Rewards go through `rollout/reward_runner.py`; unscorable
responses, reward faults and non-finite updates are counted per step under stated policies,
and any exception inside the run writes `status: failed` before it propagates. Accounting,
timing and the fault policies: docs/design.md, "Module notes".
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlbatch.algos.advantages import gae, grpo_advantages, masked_whiten, outcome_token_rewards
from rlbatch.algos.batch_schedule import adaptive_step, stepwise_sequences
from rlbatch.algos.lr import crosses_mark, in_warmup, update_lrs
from rlbatch.algos.noise_scale import NoiseScaleEMA
from rlbatch.backends.builtin.ahead import Ahead
from rlbatch.backends.builtin.batch import (
    build_batch,
    by_micro_batches,
    forward_logprobs,
    to_device,
)
from rlbatch.backends.builtin.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from rlbatch.backends.builtin.critic import ValueModel
from rlbatch.backends.builtin.runstate import (
    RunState,
    fault_rate_message,
    half_accuracies,
    open_run,
    run_recorded,
)
from rlbatch.backends.builtin.trackers import open_trackers, require_trackers
from rlbatch.backends.builtin.update import actor_update, critic_update
from rlbatch.core.config import Config
from rlbatch.core.timers import PhaseTimer, cuda_sync_or_none
from rlbatch.rollout.datasets import build_task, check_eval_prompts
from rlbatch.rollout.engine import SamplingParams, response_keys
from rlbatch.rollout.models import (
    encode_prompt,
    load_model_and_tokenizer,
    make_engine,
    resolve_model_path,
)
from rlbatch.rollout.prompt_lengths import check_prompt_lengths
from rlbatch.rollout.reward_runner import Call, RewardError, RewardRunner, fault_key

Callback = Callable[[str, dict], None]


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        from rlbatch.core.errors import ConfigError

        raise ConfigError("device: 'cuda' requested but no CUDA device is available")
    return name


class Trainer:
    def __init__(self, cfg: Config, *, resume: bool = False, fresh: bool = False,
                 callback: Callback | None = None, build_progress: Callable | None = None):
        self.cfg = cfg
        self.cb = callback or (lambda kind, row: None)
        self.device = pick_device(cfg.device)
        if os.environ.get("RLBATCH_THREADS"):  # set by rlbatch profile's executors
            torch.set_num_threads(int(os.environ["RLBATCH_THREADS"]))
        torch.manual_seed(cfg.seed)
        self.task = build_task(cfg.task)  # validates dataset files before anything is written
        self.rewards = RewardRunner(self.task, cfg.task.reward, cfg.task.tolerance, cfg.reward)
        require_trackers(cfg.trackers)
        path = resolve_model_path(cfg.model, cfg.task.name, cfg.task.digits, build_progress)
        check_prompt_lengths(self.task, path, cfg.rollout.max_new_tokens)  # before any run dir
        check_eval_prompts(self.task, cfg.eval.prompts, cfg.task.eval_path or cfg.task.path)
        self.state: RunState = open_run(cfg, resume=resume, fresh=fresh)
        if self.state.finished:
            return
        try:
            self._setup(path)
        except BaseException as exc:  # any way out of the run is written down first
            self.state.fail(exc)
            raise

    def _setup(self, path) -> None:
        cfg = self.cfg
        self.trackers = open_trackers(cfg.trackers, self.state.dir, cfg.resolved_dict())
        self.model, self.tok = load_model_and_tokenizer(path, self.device, cfg.dtype)
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tok)
        self.pad_id = self.engine.pad_id
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.actor_lr,
                                           weight_decay=cfg.optimizer.weight_decay, **cfg.adam)
        self.critic = self.critic_opt = None
        if cfg.algorithm == "ppo":
            base, _ = load_model_and_tokenizer(path, self.device, cfg.dtype)
            self.critic = ValueModel(base).to(self.device)
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr,
                                                weight_decay=0.0)
        self.ref = None
        if cfg.loss.kl_coef > 0:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        ns = cfg.noise_scale
        self.actor_noise = NoiseScaleEMA(ns.ema) if ns.enabled else None
        self.critic_noise = NoiseScaleEMA(ns.ema) if ns.enabled and self.critic else None
        self.timer = PhaseTimer(sync=cuda_sync_or_none(self.device))
        self._encoded: dict[str, list[int]] = {}
        self.ahead = None
        if cfg.rollout.max_staleness:  # decode on a second thread, each side half the threads
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, threads - threads // 2))
            self.ahead = Ahead(self.model, self.tok, cfg.rollout.engine,
                               cfg.rollout.max_staleness, max(1, threads // 2))
        self._restore()

    # ---- setup / resume ----
    def _restore(self) -> None:
        st = self.state
        ckpt = find_checkpoint(st.dir) if st.resuming else None
        if ckpt is not None:
            counters, extra = load_checkpoint(
                ckpt, model=self.model, optimizer=self.optimizer, generator=self.gen,
                critic=self.critic, critic_optimizer=self.critic_opt)
            st.load_counters(counters)
            for ema, key in ((self.actor_noise, "actor_noise"), (self.critic_noise, "critic_noise")):
                if ema is not None and key in extra:
                    ema.load_state_dict(extra[key])
            if self.ahead is not None:
                self.ahead.restore(extra.get("ahead"))
        st.truncate_logs()
        self.rewards.log.seen |= {fault_key(*kind_message)
                                  for kind_message in st.logged_reward_faults()}
        self.stream = self.task.train_stream(self.cfg.seed)
        for _ in range(st.c.consumed):  # replay the prompt stream to where it stopped
            next(self.stream)

    def _ids(self, example) -> list[int]:
        key = example.prompt + "\x00" + repr(example.meta.get("messages"))
        if key not in self._encoded:
            self._encoded[key] = encode_prompt(self.tok, example)
        return self._encoded[key]

    # ---- the loop ----
    def run(self) -> dict:
        return run_recorded(self.state, self._run, self.rewards.close)

    def _run(self) -> dict:
        st, cfg = self.state, self.cfg
        if st.c.step == 0 and cfg.eval.at_start and not st.c.evals_done:
            self._evaluate()
        try:
            while st.status == "running":
                row = self._step()
                st.log_step(row)
                self.trackers.log(row)
                self.cb("step", row)
                if st.after_step(self._evaluate):
                    self._checkpoint()
        finally:
            if self.ahead is not None:
                self.ahead.close()
        self.trackers.close()
        return st.finish()

    def _batch_now(self) -> int:
        """B for this step: the configured one, or the schedule's (docs/design.md, "Batch
        schedules")."""
        sch, c = self.cfg.batch.schedule, self.state.c
        if sch is None:
            return self.cfg.sequences_per_step
        if sch.steps is not None:
            return stepwise_sequences(sch.steps, c.samples)
        return c.sequences or self.cfg.sequences_per_step

    def _micro(self, sequences: int) -> int:
        """The micro-batch at B: batch.micro_batch_sequences, else the whole minibatch."""
        return self.cfg.batch.micro_batch_sequences or \
            sequences // self.cfg.batch.minibatches_per_step

    def _adapt(self, sequences: int) -> dict:
        """The adaptive schedule after a step: B for the next step, from the smoothed noise
        scale (PPO: the smaller of the actor's and the critic's, both resolved). Returns the
        row's keys of the rule."""
        sch, c = self.cfg.batch.schedule, self.state.c
        if sch is None or sch.adaptive is None:
            return {}
        a = sch.adaptive
        b_simple = self.actor_noise.b_simple
        if self.critic_noise is not None and a.critic:
            critic = self.critic_noise.b_simple
            b_simple = math.nan if math.isnan(critic) else min(b_simple, critic)
        k = self.cfg.batch.minibatches_per_step
        c.sequences, c.schedule_streak = adaptive_step(
            sequences, c.schedule_streak, b_simple, minibatches=k, factor=a.factor,
            threshold=a.threshold, patience=a.patience, max_sequences=a.max_sequences)
        return {"batch/noise_over_minibatch": b_simple / (sequences / k),
                "batch/schedule_streak": c.schedule_streak}

    def _step(self) -> dict:
        cfg, st, timer = self.cfg, self.state, self.timer
        B, G = self._batch_now(), cfg.batch.samples_per_prompt
        P = B // G
        t_step = time.perf_counter()
        if self.ahead is None:
            examples, prompt_ids, ro = self._rollout_now(P, G)
            stale, carried = {}, 0.0
        else:
            examples, prompt_ids, ro, stale, carried = self._rollout_ahead(P, G)
        with timer.phase("reward"):
            rewards, unscorable, faults = self._score(
                ro, [e for e in examples for _ in range(G)], st.c.consumed, G, "train")
            st.count_reward_faults(len(prompt_ids), faults.counts())
        drop = self._dropped(torch.tensor(faults.faulted, dtype=torch.bool), B)
        with timer.phase("other"):
            # rollouts come back on the CPU; the update runs where the model is
            batch = to_device(build_batch(ro, self.pad_id), self.device)
            if drop is not None:  # reward.on_error: drop -> these tokens leave the loss
                batch.response_mask[drop.to(self.device)] = False
            old_logp = ro.logprobs.to(self.device)
            rewards = rewards.to(self.device)
        ref_logp = None
        if self.ref is not None:
            with timer.phase("reference"), torch.no_grad():
                ref_logp = by_micro_batches(
                    lambda b: forward_logprobs(self.ref, b, cfg.rollout.temperature), batch,
                    self._micro(B))
        samples_after = st.c.samples + len(prompt_ids)
        stats, skipped = self._updates(batch, rewards, old_logp, ref_logp, samples_after, B,
                                       valid=None if drop is None else ~drop)
        times, _ = timer.end_step()
        wall = time.perf_counter() - t_step + carried
        st.advance(P, len(prompt_ids), ro.tokens, wall, skipped)
        row = {"step": st.c.step, "samples": st.c.samples, "prompts": st.c.prompts,
               "tokens": st.c.tokens, "train_s": st.c.train_s}
        named = ("rollout", "reward", "actor_update", "critic_values", "critic_update",
                 "reference", "noise_scale")
        for k in named:
            row[f"time/{k}"] = times.get(k, 0.0)
        row["time/other"] = max(0.0, wall - sum(times.get(k, 0.0) for k in named))
        lengths = ro.lengths.float()  # (B,) response tokens, EOS included
        row.update({"reward/mean": float(rewards.mean()), "reward/unscorable": unscorable,
                    "response/mean_length": float(lengths.mean()),
                    "response/p50_length": float(torch.quantile(lengths, 0.5)),
                    "response/p90_length": float(torch.quantile(lengths, 0.9)),
                    "response/max_length": float(lengths.max()),
                    "rollout/tokens_per_s": ro.tokens / max(stale.get("rollout/decode_s",
                                                                      times["rollout"]), 1e-9),
                    "rollout/concurrency": ro.timing.get("concurrency")})
        if ro.timing.get("decode_s"):  # engines that time their decode steps (built-in)
            row["rollout/low_concurrency_share"] = (ro.timing.get("decode_low_s", 0.0)
                                                    / ro.timing["decode_s"])
        row.update(stale)
        row.update(stats)
        row.update(self._fault_stats(faults, rewards, drop))
        row.update({"actor/nonfinite_skipped": skipped, "batch/sequences_per_step": B,
                    "batch/prompts_per_step": P, **self._adapt(B)})
        return row

    def _rollout_now(self, P: int, G: int) -> tuple[list, list, object]:
        """This step's batch, decoded now by the current policy (timed as `rollout`)."""
        cfg, st = self.cfg, self.state
        with self.timer.phase("rollout"):
            examples = [next(self.stream) for _ in range(P)]
            prompt_ids = [self._ids(e) for e in examples for _ in range(G)]
            keys = response_keys(cfg.seed, 0, st.c.consumed, P, G)  # C changes no response
            ro = self.engine.generate(prompt_ids, self._sampling(), cfg.rollout.generation_concurrency,
                                      generator=self.gen, keys=keys)
            if cfg.rollout.simulated_latency_s:
                time.sleep(cfg.rollout.simulated_latency_s)
        return examples, prompt_ids, ro

    def _rollout_ahead(self, P: int, G: int) -> tuple[list, list, object, dict, float]:
        """This step's batch, decoded ahead by the policy `max_staleness` versions older
        (backends/builtin/ahead.py), after submitting the batches up to that many steps
        ahead. `rollout` is timed as the wait for it; returns the row's keys of the batch's
        policy and the seconds of a drain carried into this step."""
        cfg, st, a = self.cfg, self.state, self.ahead
        while a.next_step(st.c.step) <= st.c.step + 1 + a.k:
            step = a.next_step(st.c.step)
            version = a.version_for(step)
            first = st.c.consumed + a.prompts_pending()
            examples = [next(self.stream) for _ in range(P)]
            a.submit(step, version, a.weights_for(version, st.c.step, self.model), examples,
                     [self._ids(e) for e in examples for _ in range(G)], self._sampling(),
                     cfg.rollout.generation_concurrency, response_keys(cfg.seed, 0, first, P, G),
                     cfg.rollout.simulated_latency_s)
        carried = a.carry_s
        got = a.take(st.c.step + 1)
        self.timer.add("rollout", got.wait_s)
        p = got.pending
        return p.examples, p.prompt_ids, got.rollouts, {
            "rollout/policy_version": p.version, "rollout/staleness": p.step - 1 - p.version,
            "rollout/decode_s": got.decode_s}, carried

    def _sampling(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                              top_p=r.top_p)

    def _score(self, ro, examples, first_index: int, group: int, phase: str):
        """(rewards (N,), unscorable count, Scored) under `reward:`'s policy. A faulted call
        scores `reward.error_value` here; `_dropped` and `_evaluate` treat it further.
        `first_index + i // group` is the prompt's index in the stream or held-out set."""
        texts = self.tok.batch_decode(
            [ids[:n] for ids, n in zip(ro.response_ids.tolist(), ro.lengths.tolist())],
            skip_special_tokens=True)
        calls = [Call(ex.prompt, text, ex, first_index + i // group)
                 for i, (ex, text) in enumerate(zip(examples, texts))]
        scored = self.rewards.score(calls)
        self.state.log_reward_faults(self.rewards.log.new(self.rewards.name, scored, calls),
                                     phase)
        values, missing = [], 0
        for value, fault in zip(scored.values, scored.faults):
            if fault is not None:
                value = self.cfg.reward.error_value
            elif value is None:
                missing += 1
                value = 0.0
            values.append(float(value))
        return torch.tensor(values), missing, scored

    def _dropped(self, faulted: torch.Tensor, sequences: int) -> torch.Tensor | None:
        """Samples to drop (bool (N,)) under reward.on_error: drop, else None. When they could
        fill a whole actor or critic minibatch (which would leave its loss without tokens)
        the step falls back to error_value."""
        cfg, n = self.cfg, int(faulted.sum())
        smallest = sequences // cfg.batch.minibatches_per_step
        if cfg.algorithm == "ppo":
            smallest = min(smallest, sequences // cfg.critic.minibatches_per_step)
        if cfg.reward.on_error != "drop" or n == 0 or n >= smallest:
            return None
        return faulted

    def _fault_stats(self, scored, rewards: torch.Tensor, drop: torch.Tensor | None) -> dict:
        out = {f"reward/{k}": v for k, v in scored.counts().items()}
        if self.cfg.reward.on_error == "drop":
            out["reward/dropped"] = 0 if drop is None else int(drop.sum())
            if drop is not None:  # the mean over the samples that stayed in their groups
                out["reward/mean"] = float(rewards[~drop].mean())
        return out

    def _updates(self, batch, rewards, old_logp, ref_logp, samples_after, sequences: int,
                 valid: torch.Tensor | None = None) -> tuple[dict, int]:
        """Advantages, then the critic's update (PPO) and the actor's, at this step's B and
        its LR (the rule's eta(B)). Returns (stats, actor updates skipped as non-finite)."""
        cfg, timer, b = self.cfg, self.timer, self.cfg.batch
        samples_before = samples_after - sequences
        stats: dict = {}
        if cfg.algorithm == "grpo":
            with timer.phase("other"):
                adv, adv_stats = grpo_advantages(
                    rewards, b.samples_per_prompt, cfg.loss.advantage_norm,
                    valid=None if valid is None else valid.to(rewards.device))
            stats.update(adv_stats)
        else:
            adv, critic_stats = self._ppo_critic(batch, rewards, samples_before, samples_after,
                                                 sequences)
            stats.update(critic_stats)
        # one LR per optimizer update: the schedule's mean over that update's share of the
        # step's samples (algos/lr.py), so warm-up is exact in samples for any B
        lrs = update_lrs(samples_before, sequences, b.minibatches_per_step, b.epochs_per_step,
                         cfg.optimizer.resolve_lr(sequences, "optimizer"),
                         cfg.optimizer.warmup_samples)
        stats["actor/lr"] = sum(lrs) / len(lrs)
        if cfg.algorithm == "ppo" and in_warmup(samples_after, cfg.critic.warmup_samples):
            # critic warm-up: the actor waits (its LR schedule does not)
            stats.update({"actor/loss": float("nan"), "actor/grad_norm": float("nan")})
            return stats, 0
        with timer.phase("actor_update"):
            res = actor_update(
                self.model, self.optimizer, batch, old_logp, adv, ref_logp,
                temperature=cfg.rollout.temperature, clip_low=cfg.loss.clip_ratio_low,
                clip_high=cfg.loss.clip_ratio_high, kl_coef=cfg.loss.kl_coef,
                minibatches=b.minibatches_per_step, epochs=b.epochs_per_step,
                micro=self._micro(sequences), max_grad_norm=cfg.optimizer.max_grad_norm,
                generator=self.gen, noise=self.actor_noise, lrs=lrs)
        timer.reassign("actor_update", "noise_scale", res.noise_s)
        stats.update(res.stats)
        return stats, res.skipped

    def _ppo_critic(self, batch, rewards, samples_before: int, samples_after: int,
                    sequences: int) -> tuple[torch.Tensor, dict]:
        """Values, GAE advantages and, on the steps its cadence picks, the critic's update.
        Returns (advantages (N, L), stats)."""
        cfg, timer = self.cfg, self.timer
        c, micro = cfg.critic, self._micro(sequences)
        mask = batch.response_mask
        with timer.phase("critic_values"), torch.no_grad():
            values = by_micro_batches(self.critic, batch, micro) * mask  # (N, L)
        with timer.phase("other"):
            token_r = outcome_token_rewards(rewards, mask)
            adv, returns = gae(token_r, values, mask, cfg.loss.gamma, cfg.loss.lam)
            adv = masked_whiten(adv, mask)
        critic_lrs = update_lrs(samples_before, sequences, c.minibatches_per_step,
                                c.epochs_per_step, c.resolve_lr(sequences, "critic"),
                                c.lr_warmup_samples)
        stats = {"critic/lr": sum(critic_lrs) / len(critic_lrs),
                 "critic/value_mean": float(values.sum() / mask.sum())}
        if crosses_mark(samples_before, samples_after, c.update_every_samples):
            with timer.phase("critic_update"):
                res = critic_update(
                    self.critic, self.critic_opt, batch, values, returns,
                    value_clip=c.value_clip, minibatches=c.minibatches_per_step,
                    epochs=c.epochs_per_step, micro=micro,
                    max_grad_norm=c.max_grad_norm, generator=self.gen, noise=self.critic_noise,
                    lrs=critic_lrs)
            timer.reassign("critic_update", "noise_scale", res.noise_s)
            stats.update(res.stats)
        return adv, stats

    # ---- evaluation and checkpoints (excluded from train_s) ----
    @torch.no_grad()
    def _evaluate(self) -> None:
        cfg, st = self.cfg, self.state
        if self.ahead is not None:
            self.ahead.drain()
        t0 = time.perf_counter()
        ev = cfg.eval
        examples = self.task.eval_set(ev.prompts)
        k = ev.k
        prompt_ids = [self._ids(e) for e in examples for _ in range(k)]
        params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, greedy=k == 1,
                                temperature=ev.temperature)
        # the same draws at every evaluation of a run: its curve moves only with the policy
        keys = response_keys(cfg.seed, 1, 0, len(examples), k)
        ro = self.engine.generate(prompt_ids, params, cfg.rollout.generation_concurrency,
                                  keys=keys)
        rewards, unscorable, scored = self._score(ro, [e for e in examples for _ in range(k)], 0,
                                                  k, "eval")
        ok = ~torch.tensor(scored.faulted, dtype=torch.bool)
        row = {"step": st.c.step, "samples": st.c.samples, "train_s": st.c.train_s,
               # the mean over the calls that did not fault (none faulted: over all of them)
               "eval/accuracy": float(rewards[ok].mean()) if ok.any() else float("nan"),
               "eval/unscorable": unscorable,
               "eval/prompts": len(examples), "eval/k": k,
               "eval/mean_length": float(ro.lengths.float().mean())}
        row.update({f"eval/reward_{key}": n for key, n in scored.counts().items()})
        if ev.halves:
            row.update(half_accuracies(rewards.tolist(), scored.faulted, k))
        st.log_eval(row, time.perf_counter() - t0)
        self.trackers.log(row)
        self.cb("eval", row)
        reason = fault_rate_message(cfg, scored.n_faults, len(scored.faults),
                                    f"in the evaluation at step {st.c.step}")
        if reason is not None:
            raise RewardError(reason)

    def _checkpoint(self) -> None:
        st = self.state
        t0 = time.perf_counter()
        extra = {}
        if self.actor_noise is not None:
            extra["actor_noise"] = self.actor_noise.state_dict()
        if self.critic_noise is not None:
            extra["critic_noise"] = self.critic_noise.state_dict()
        if self.ahead is not None:
            self.ahead.drain()
            extra["ahead"] = self.ahead.state()
        save_checkpoint(st.dir, model=self.model, optimizer=self.optimizer,
                        counters=st.counters_for_checkpoint(), generator=self.gen,
                        critic=self.critic, critic_optimizer=self.critic_opt, extra_state=extra)
        st.checkpointed(time.perf_counter() - t0)


def train(cfg: Config, *, resume: bool = False, fresh: bool = False,
          callback: Callback | None = None, build_progress: Callable | None = None) -> tuple[Path, dict]:
    """Run (or resume) one training run; return (run directory, summary)."""
    trainer = Trainer(cfg, resume=resume, fresh=fresh, callback=callback,
                      build_progress=build_progress)
    summary = trainer.run()
    return trainer.state.dir, summary
