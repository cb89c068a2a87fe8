"""Validated, frozen run configuration (docs/design.md, house rule 4: the config you log is the config you ran).

Vocabulary follows docs/design.md: every batch quantity carries its unit in its name
(`prompts_per_step` P, `samples_per_prompt` G, derived `sequences_per_step` B = P*G).
Derived values (B, optimizer updates per step, the scaled learning rates and Adam
hyper-parameters) are computed once here and logged with the config under `derived:`.

This module is the top-level `Config`: its sections, the checks that span sections and the
derived values. The sections themselves (types, ranges, defaults) are `core/schema.py` and
`core/profile_schema.py`, the learning-rate rule `eta(B) = eta0 * (B/B0)^p` (`scaled_lr`,
`scaled_adam`) `core/lr_rule.py`, each re-exported here. Loading and error reporting (file and line for every field) live in `core/loading.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlbatch.core.lr_rule import LR_EXPONENTS, scaled_adam, scaled_lr  # noqa: F401
from rlbatch.core.profile_schema import ProfileConfig
from rlbatch.core.schema import (  # noqa: F401  (re-exported: the config's public names)
    BOUNDED_METRICS,
    DEFAULT_DIGITS,
    MAX_SEQUENCES,
    BatchConfig,
    BudgetConfig,
    CheckpointConfig,
    CommandConfig,
    CriticConfig,
    EvalConfig,
    LossConfig,
    NoiseScaleConfig,
    NonFiniteConfig,
    OptimizerConfig,
    RewardConfig,
    RolloutConfig,
    StrictModel,
    TargetConfig,
    TaskConfig,
)


class Config(StrictModel):
    name: str = Field("run", description="the config's name: a profile's folder and its "
                      "trials' names")
    model: str = Field("tiny", description="'tiny' (built-in default) or a local HF checkpoint")
    algorithm: Literal["grpo", "ppo"] = Field("grpo", description="grpo (group-normalized "
                                              "advantages) or ppo (with a critic)")
    backend: Literal["builtin", "trl", "command"] = Field(
        "builtin", description="who trains: the built-in trainer, TRL's GRPOTrainer, or your "
        "own command (the command: section)")
    task: TaskConfig = TaskConfig()
    batch: BatchConfig = BatchConfig()
    optimizer: OptimizerConfig = OptimizerConfig(reference_sequences=128, reference_lr=1e-4)
    critic: CriticConfig = CriticConfig(reference_sequences=128, reference_lr=1e-4)
    loss: LossConfig = LossConfig()
    rollout: RolloutConfig = RolloutConfig()
    eval: EvalConfig = EvalConfig()
    target: TargetConfig = TargetConfig()
    budget: BudgetConfig = BudgetConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    noise_scale: NoiseScaleConfig = NoiseScaleConfig()
    nonfinite: NonFiniteConfig = NonFiniteConfig()
    reward: RewardConfig = RewardConfig()
    profile: ProfileConfig = ProfileConfig()
    command: CommandConfig | None = Field(
        None, description="backend: command: the user's own training command (trl, verl, "
        "openrlhf, prime-rl, or rlbatch train) run and followed as the trial")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the run's seed: prompt order, sampling and "
                      "any random initialisation")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when "
                                                   "available, else the CPU")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="the trained "
                                                  "model's dtype")
    output_dir: str = Field("runs", description="where `rlbatch train` writes its run folder "
                            "(--out)")
    trackers: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        [], description="metric sinks of the built-in trainer (x axis: samples); optional packages")

    @model_validator(mode="after")
    def _check(self) -> Config:
        b = self.batch
        if self.algorithm == "grpo" and b.samples_per_prompt < 2:
            raise ValueError("batch.samples_per_prompt must be >= 2 for GRPO (group baseline)")
        self._check_schedule()
        for seqs in self.batch_sizes():
            self._check_sizes(seqs)
        if (self.backend == "command") != (self.command is not None):
            raise ValueError("backend: command and a command: section go together (give "
                             "both, or neither)")
        if self.target.gain is not None and not self.eval.at_start:
            raise ValueError("target.gain is relative to the step-0 evaluation: it needs "
                             "eval.at_start: true")
        if self.target.gain is not None and self.command is not None \
                and self.command.framework == "openrlhf":
            # openrlhf/trainer/ppo_trainer.py `fit` (OpenRLHF 3c3be62): evaluation only after
            # a training step, when global_step % eval.steps == 0
            raise ValueError("target.gain: OpenRLHF evaluates only after training steps, never "
                             "before training, so there is no start to measure a gain from; "
                             "set target.value to an absolute score (and target.gain: null)")
        self._check_staleness()
        self.optimizer.resolve_lr(self.sequences_per_step, "optimizer")
        if self.algorithm == "ppo":
            self.critic.resolve_lr(self.sequences_per_step, "critic")
        return self

    def _check_sizes(self, seqs: int) -> None:
        """What must hold at every B the run takes: divisibility of the minibatches and
        micro-batches, and room for the noise-scale estimator's two batch sizes."""
        b = self.batch
        where = "" if b.schedule is None else f" (at B = {seqs} of batch.schedule)"
        if seqs > MAX_SEQUENCES:
            raise ValueError(
                f"batch.prompts_per_step x batch.samples_per_prompt = {seqs:,} sequences per "
                f"step is more than {MAX_SEQUENCES:,}")
        if seqs % b.minibatches_per_step:
            raise ValueError(
                f"batch.minibatches_per_step ({b.minibatches_per_step}) must divide "
                f"sequences_per_step ({seqs} = {seqs // b.samples_per_prompt} x "
                f"{b.samples_per_prompt}){where}")
        mini = seqs // b.minibatches_per_step
        if b.micro_batch_sequences is not None and mini % b.micro_batch_sequences:
            raise ValueError(
                f"batch.micro_batch_sequences ({b.micro_batch_sequences}) must divide the "
                f"minibatch ({mini} sequences = {seqs} / {b.minibatches_per_step} minibatches)"
                f"{where}")
        if self.algorithm == "ppo" and seqs % self.critic.minibatches_per_step:
            raise ValueError(
                f"critic.minibatches_per_step ({self.critic.minibatches_per_step}) must divide "
                f"sequences_per_step ({seqs}){where}")
        micro = b.micro_batch_sequences or mini
        if self.noise_scale.enabled and mini < 2 * micro:
            raise ValueError(
                f"noise_scale.enabled needs at least 2 micro-batches per minibatch (the two-batch "
                f"estimator compares them with the minibatch): set batch.micro_batch_sequences "
                f"<= {mini // 2} (the minibatch is {mini} sequences){where}")
        critic_mini = seqs // self.critic.minibatches_per_step
        if self.noise_scale.enabled and self.algorithm == "ppo" and critic_mini < 2 * micro:
            raise ValueError(
                f"noise_scale.enabled needs at least 2 micro-batches per critic minibatch too: "
                f"set batch.micro_batch_sequences <= {critic_mini // 2} or fewer "
                f"critic.minibatches_per_step (the critic's minibatch is {critic_mini} "
                f"sequences){where}")

    def _check_staleness(self) -> None:
        """Rollouts ahead of the update, in this run or in a profile's trials: the built-in
        trainer's at one B, decoded by an engine that can run on a second copy of the model;
        a command's framework maps them (interop/staleness.py); TRL's backend has none."""
        k, crossed = self.rollout.max_staleness, any(self.profile.max_staleness)
        if self.backend == "trl" and (k or crossed):
            raise ValueError("rollout.max_staleness: the TRL backend runs TRL's GRPOTrainer, "
                             "which decodes each batch with the policy it trains; set 0")
        if self.backend != "builtin":
            return
        if k and self.batch.schedule is not None:
            raise ValueError("rollout.max_staleness with batch.schedule is not supported: the "
                             "rollouts decoded ahead need their B before the schedule sets it")
        if k and self.profile.schedules:
            raise ValueError("profile.schedules run at rollout.max_staleness, and a schedule "
                             "cannot run stale: set rollout.max_staleness: 0")
        if (k or crossed) and self.rollout.engine != "builtin":
            field = "rollout.max_staleness" if k else "profile.max_staleness"
            raise ValueError(f"{field} needs rollout.engine: builtin (its keyed sampling draws "
                             "nothing from a generator two threads share)")

    def _check_schedule(self) -> None:
        """A schedule starts at the configured B, moves in whole groups, and scales the LR
        by the rule (a fixed LR, or Adam's scaled betas, would not follow B)."""
        sch, b = self.batch.schedule, self.batch
        if sch is None:
            return
        start = b.prompts_per_step * b.samples_per_prompt
        if sch.steps is not None and sch.steps[0][1] != start:
            raise ValueError(f"batch.schedule.steps starts at B = {sch.steps[0][1]}, but "
                             f"batch.prompts_per_step x samples_per_prompt = {start}: they "
                             "must agree (the schedule's first B is the run's)")
        if sch.adaptive is not None:
            if sch.adaptive.max_sequences < start:
                raise ValueError(f"batch.schedule.adaptive.max_sequences "
                                 f"({sch.adaptive.max_sequences}) is below the first B ({start})")
            if not self.noise_scale.enabled:
                raise ValueError("batch.schedule.adaptive steers by the noise scale: set "
                                 "noise_scale.enabled: true (and batch.micro_batch_sequences)")
        odd = [s for s in self.batch_sizes() if s % b.samples_per_prompt]
        if odd:
            raise ValueError(f"batch.schedule: B = {odd[0]} is not a multiple of "
                             f"batch.samples_per_prompt ({b.samples_per_prompt})")
        if self.optimizer.lr is not None or (self.algorithm == "ppo"
                                             and self.critic.lr is not None):
            raise ValueError("batch.schedule rescales the LR at each B by lr_scaling from "
                             "reference_sequences and reference_lr: leave optimizer.lr (and "
                             "critic.lr) unset")
        if self.optimizer.scale_adam:
            raise ValueError("batch.schedule with optimizer.scale_adam is not supported (the "
                             "betas would change with B during the run)")

    def batch_sizes(self) -> list[int]:
        """Every B the run can take: B itself, or each B of its schedule (an adaptive one:
        B x factor^k up to max_sequences)."""
        sizes = [self.batch.prompts_per_step * self.batch.samples_per_prompt]
        sch = self.batch.schedule
        if sch is not None and sch.steps is not None:
            return sorted({s for _, s in sch.steps})
        if sch is not None:
            while sizes[-1] < sch.adaptive.max_sequences:
                sizes.append(min(sizes[-1] * sch.adaptive.factor, sch.adaptive.max_sequences))
        return sizes

    # ---- derived values (computed once, logged under `derived:`) ----
    @property
    def sequences_per_step(self) -> int:
        return self.batch.prompts_per_step * self.batch.samples_per_prompt

    @property
    def updates_per_step(self) -> int:
        return self.batch.minibatches_per_step * self.batch.epochs_per_step

    @property
    def minibatch_sequences(self) -> int:
        return self.sequences_per_step // self.batch.minibatches_per_step

    @property
    def micro_batch_sequences(self) -> int:
        return self.batch.micro_batch_sequences or self.minibatch_sequences

    @property
    def actor_lr(self) -> float:
        return self.optimizer.resolve_lr(self.sequences_per_step, "optimizer")

    @property
    def critic_lr(self) -> float:
        return self.critic.resolve_lr(self.sequences_per_step, "critic")

    @property
    def adam(self) -> dict:
        """Betas and eps actually used (scaled by Malladi et al.'s rule when asked)."""
        o = self.optimizer
        if not o.scale_adam or o.reference_sequences is None or o.lr is not None:
            return {"betas": (o.beta1, o.beta2), "eps": o.eps}
        return scaled_adam(o.beta1, o.beta2, o.eps, self.sequences_per_step / o.reference_sequences)

    def derived(self) -> dict:
        d = {
            "sequences_per_step": self.sequences_per_step,
            "updates_per_step": self.updates_per_step,
            "minibatch_sequences": self.minibatch_sequences,
            "micro_batch_sequences": self.micro_batch_sequences,
            "actor_lr": self.actor_lr,
            "adam_betas": list(self.adam["betas"]),
            "adam_eps": self.adam["eps"],
        }
        if self.algorithm == "ppo":
            d["critic_lr"] = self.critic_lr
        return d

    def resolved_dict(self) -> dict:
        """Inputs plus `derived:`; what config.yaml holds and `config show` prints."""
        out = self.model_dump(mode="json")
        if not out["trackers"]:  # sinks, not the experiment: an empty list leaves the run id alone
            del out["trackers"]
        if out["command"] is None:  # absent unless backend: command (run ids stay as they were)
            del out["command"]
        if out["batch"]["schedule"] is None:  # absent unless set (run ids stay as they were)
            del out["batch"]["schedule"]
        if not out["rollout"]["max_staleness"]:  # absent unless set (run ids stay as they were)
            del out["rollout"]["max_staleness"]
        out["derived"] = self.derived()
        return out
