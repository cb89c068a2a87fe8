"""The configuration's sections: one strict, frozen pydantic model per YAML section (`task:`,
`batch:`, `optimizer:`, `critic:`, ...) with its types, ranges and defaults, and the
learning-rate rule they resolve (`scaled_lr`, `scaled_adam`). The top-level `Config`, its
cross-section checks and its derived values are `core/config.py`; this module is its lower
half, split along that seam.

The learning-rate rule is `eta(B) = eta0 * (B/B0)^p` with p = 1/2 (sqrt, Malladi et al. 2022),
1 (linear) or 0 (none). With `scale_adam: true` the betas and eps follow Malladi et al.'s
square-root SDE rule as well: `beta -> 1 - k(1 - beta)`, `eps -> eps / sqrt(k)`, k = B/B0.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

LR_EXPONENTS = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}
# Metrics whose range is known; a target outside it can never be reached.
DEFAULT_DIGITS = {"addition": 3, "reverse": 6, "runsum": 1}
BOUNDED_METRICS = {"eval/accuracy": (0.0, 1.0), "reward/mean": (0.0, 1.0)}


# Sane upper bounds: a value past them is a typo or a unit mix-up, and would otherwise end in
# a MemoryError or an overflow deep inside a run instead of one line naming the field.
MAX_PROMPTS = 1_000_000  # prompts per step, held-out prompts
MAX_SAMPLES = 10**13  # sample counts and marks (budgets, cadences, warm-up)
MAX_SEQUENCES = 2**24  # B = P x G sequences in one rollout step
MAX_COUNT = 1_000_000  # minibatches, epochs, group size, concurrency, tokens, steps
MAX_LIST = 64  # values in a list setting (candidate batches, decode concurrencies)
# Below this a sampling temperature is greedy decoding in effect, and far below it (1e-320)
# logits / T overflow to inf and every probability becomes NaN, so every reward is 0.
# Greedy evaluation is `eval.k: 1`.
MIN_TEMPERATURE = 0.01


def _numeric(annotation) -> bool:
    """Whether a field holds a number (int or float, possibly optional or in a list), not a bool."""
    if annotation in (int, float):
        return True
    return any(_numeric(a) for a in get_args(annotation) if a is not bool)


class StrictModel(BaseModel):
    """Unknown keys, non-finite floats and booleans given for numbers are rejected (house
    rule 4): YAML reads `true` as a bool, which pydantic would otherwise take as 1."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info: ValidationInfo):
        field = cls.model_fields.get(info.field_name or "")
        items = value if isinstance(value, list) else [value]
        if field is not None and any(isinstance(v, bool) for v in items) \
                and _numeric(field.annotation):
            raise PydanticCustomError("bool_not_number", "expected a number, not a boolean")
        return value


class TaskConfig(StrictModel):
    """What the model is trained on: a built-in task or a dataset file, and its reward."""

    name: Literal["addition", "reverse", "runsum", "dataset"] = Field(
        "addition", description="a built-in task, or dataset (a file of prompts and answers: path)")
    digits: int = Field(
        None, ge=1, le=12, validate_default=False,
        description="difficulty knob: operand / string length (default 3 for addition, 6 for "
        "reverse) or digits per list item (runsum, default 1)",
    )
    path: str | None = Field(None, description="dataset file (JSONL or Parquet) for name=dataset")
    eval_path: str | None = Field(None, description="held-out dataset file; default: split of path")
    prompt_column: str = Field("prompt", description="name=dataset: the prompt column")
    answer_column: str = Field("answer", description="name=dataset: the answer column")
    format: Literal["auto", "jsonl", "parquet", "verl"] = Field(
        "auto", description="name=dataset: the file's format (auto: from its extension; verl: verl's parquet layout)")
    reward: str = Field("exact", description="exact | numeric | gsm8k | boxed | module:function")
    tolerance: float = Field(1e-6, ge=0, description="numeric reward: the largest difference "
                             "from the answer that still scores 1")

    @model_validator(mode="before")
    @classmethod
    def _default_digits(cls, data):
        if isinstance(data, dict) and data.get("digits") is None:
            data = {**data, "digits": DEFAULT_DIGITS.get(data.get("name", "addition"), 3)}
        return data

    @model_validator(mode="after")
    def _dataset_needs_path(self) -> TaskConfig:
        if self.name == "dataset" and not self.path:
            raise ValueError("task.path is required when task.name is 'dataset'")
        return self


class AdaptiveSchedule(StrictModel):
    """Raise B by `factor` when the smoothed gradient noise scale B_simple has been at least
    `threshold` x the optimizer minibatch in `patience` consecutive steps (algos/batch_schedule.py)."""

    factor: int = Field(2, ge=2, le=16, description="B is multiplied by this at a raise")
    threshold: float = Field(1.0, gt=0, le=1e6, description="raise when B_simple >= threshold x "
                             "the optimizer minibatch (B / batch.minibatches_per_step)")
    patience: int = Field(3, ge=1, le=MAX_COUNT, description="consecutive resolved steps the "
                          "condition must hold")
    max_sequences: int = Field(gt=0, le=MAX_SEQUENCES, description="the largest B")
    critic: bool = Field(True, description="PPO: steer by the smaller of the actor's and the "
                         "critic's B_simple")


class BatchSchedule(StrictModel):
    """B as a function of cumulative samples: `steps` ([[samples, sequences], ...], from 0,
    the first B = batch.prompts_per_step x G) or `adaptive` (from the noise scale). Each B
    runs at its LR by optimizer.lr_scaling from (reference_sequences, reference_lr)."""

    steps: list[tuple[int, int]] | None = Field(
        None, min_length=1, max_length=MAX_LIST,
        description="[[samples, sequences], ...]: B from each number of samples on")
    adaptive: AdaptiveSchedule | None = Field(None, description="B raised by the noise scale")

    @model_validator(mode="after")
    def _one_kind(self) -> BatchSchedule:
        if (self.steps is None) == (self.adaptive is None):
            raise ValueError("batch.schedule: give exactly one of steps ([[samples, "
                             "sequences], ...]) and adaptive")
        if self.steps is not None:
            starts = [a for a, _ in self.steps]
            if starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
                raise ValueError("batch.schedule.steps: the first starts at 0 samples and the "
                                 f"starts increase (got {starts})")
            if any(not 0 < b <= MAX_SEQUENCES for _, b in self.steps) or \
                    any(not 0 <= a <= MAX_SAMPLES for a in starts):
                raise ValueError(f"batch.schedule.steps: sequences in 1..{MAX_SEQUENCES} and "
                                 f"samples in 0..{MAX_SAMPLES}")
        return self


class BatchConfig(StrictModel):
    """The batch of a rollout step: P prompts x G responses (B = P x G), and how the
    update splits it."""

    prompts_per_step: int = Field(16, gt=0, le=MAX_PROMPTS,
                                  description="P: prompts drawn per rollout step")
    samples_per_prompt: int = Field(8, gt=0, le=MAX_COUNT, description="G: responses per prompt")
    minibatches_per_step: int = Field(1, gt=0, le=MAX_COUNT, description="optimizer updates "
                                      "per epoch over a step's batch")
    epochs_per_step: int = Field(1, gt=0, le=MAX_COUNT, description="passes over a step's "
                                 "batch (PPO epochs)")
    micro_batch_sequences: int | None = Field(
        None, gt=0, le=MAX_SEQUENCES,
        description="gradient-accumulation chunk; default = whole minibatch"
    )
    schedule: BatchSchedule | None = Field(
        None, description="B changing during the run (stepwise in samples, or adaptive on the "
        "noise scale); null: B = prompts_per_step x samples_per_prompt throughout")


class LrRule(StrictModel):
    lr: float | None = Field(None, gt=0, le=10,
                             description="learning rate used as is (no scaling)")
    reference_sequences: int | None = Field(None, gt=0, le=MAX_SEQUENCES, description="B0")
    reference_lr: float | None = Field(None, gt=0, le=10, description="eta0 at B0")
    lr_scaling: Literal["sqrt", "linear", "none"] = Field(
        "sqrt", description="the LR rule eta(B) = eta0 (B/B0)^p: p = 1/2, 1 or 0")

    def resolve_lr(self, sequences: int, field: str) -> float:
        if self.lr is not None:
            return float(self.lr)
        if self.reference_lr is None or self.reference_sequences is None:
            raise ValueError(
                f"{field}.lr is not set and {field}.reference_lr/reference_sequences are missing"
            )
        return scaled_lr(self.reference_lr, self.reference_sequences, sequences, self.lr_scaling)


class OptimizerConfig(LrRule):
    """The actor's AdamW and its LR rule: eta(B) = reference_lr
    (B/reference_sequences)^p."""

    scale_adam: bool = Field(False, description="also scale betas and eps (Malladi et al. 2022)")
    beta1: float = Field(0.9, ge=0, lt=1, description="Adam's first-moment decay")
    beta2: float = Field(0.999, ge=0, lt=1, description="Adam's second-moment decay")
    eps: float = Field(1e-8, gt=0, description="Adam's epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay")
    warmup_samples: int = Field(0, ge=0, le=MAX_SAMPLES,
                                description="linear LR warm-up, in samples")
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping by global "
                                         "norm; null = off")


class CriticConfig(LrRule):
    """PPO's critic: its own LR rule and update settings."""

    minibatches_per_step: int = Field(1, gt=0, le=MAX_COUNT, description="critic updates "
                                      "per epoch over a step's batch")
    epochs_per_step: int = Field(1, gt=0, le=MAX_COUNT, description="the critic's passes over "
                                 "a step's batch")
    update_every_samples: int = Field(
        0, ge=0, le=MAX_SAMPLES,
        description="update the critic on the steps that cross a multiple of this many "
                    "samples; 0 = every step")
    warmup_samples: int = Field(
        0, ge=0, le=MAX_SAMPLES,
        description="samples at the start that train only the critic (a step is critic-only "
                    "when it ends at or before this mark)")
    lr_warmup_samples: int = Field(0, ge=0, le=MAX_SAMPLES,
                                   description="linear warm-up of the critic's LR, in samples")
    value_clip: float | None = Field(0.2, gt=0, description="PPO value clipping around the "
                                     "old value; null = off")
    max_grad_norm: float | None = Field(1.0, gt=0, description="the critic's gradient "
                                         "clipping by global norm; null = off")


class LossConfig(StrictModel):
    """The policy loss: clipping, GRPO's advantage normalisation, the KL penalty, PPO's
    GAE."""

    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="the policy ratio is clipped "
                                  "below at 1 - this")
    clip_ratio_high: float = Field(0.2, gt=0, description="the policy ratio is clipped above "
                                   "at 1 + this")
    advantage_norm: Literal["std", "mean"] = Field("std", description="GRPO group normalization")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL penalty to a frozen reference; 0 = off")
    gamma: float = Field(1.0, ge=0, le=1, description="PPO discount")
    lam: float = Field(1.0, ge=0, le=1, description="PPO GAE lambda")


class RolloutConfig(StrictModel):
    """How responses are generated: length, sampling, decode engine and concurrency."""

    generation_concurrency: int = Field(64, gt=0, le=MAX_COUNT,
                                        description="C: sequences decoded at once")
    max_new_tokens: int = Field(5, gt=0, le=MAX_COUNT, description="longest response, in tokens")
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE, description="sampling temperature of "
                               "the rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of the rollouts; 1 = off")
    engine: Literal["builtin", "hf", "vllm"] = Field(
        "builtin", description="decode engine: the built-in torch decoder, HF generate, or vLLM "
        "(GPU)")
    simulated_latency_s: float = Field(
        0.0, ge=0, le=3600, description="seconds of sleep added to every rollout step (counted "
        "in time/rollout), as a remote generation service or weight sync would cost; 0 = off. "
        "For what-if studies and tests of the decision")


class EvalConfig(StrictModel):
    """The held-out evaluation: how often, on how many prompts, with how many samples."""

    every_samples: int = Field(8192, gt=0, le=MAX_SAMPLES,
                               description="evaluate at multiples of this many samples")
    prompts: int = Field(1024, gt=0, le=MAX_PROMPTS, description="fixed held-out prompts")
    k: int = Field(1, gt=0, le=MAX_COUNT,
                   description="samples per eval prompt (mean@k); k=1 decodes greedily")
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE,
                               description="sampling temperature when k > 1")
    at_start: bool = Field(True, description="evaluate before the first step (the step-0 value "
                           "a relative target adds its gain to)")


class TargetConfig(StrictModel):
    """The score to reach: absolute (`value`) or relative to the start (`gain` over the run's
    step-0 evaluation; `value` must then be null). `rlbatch profile` turns a gain into one
    absolute value for all its trials from the baseline model's step-0 evaluation."""

    metric: str = Field("eval/accuracy", description="the evaluation metric the target is on")
    value: float | None = Field(0.5, description="absolute target (null when `gain` is set)")
    gain: float | None = Field(None, gt=0, description="relative target: step-0 value + gain")

    @model_validator(mode="after")
    def _one_kind(self) -> TargetConfig:
        if (self.value is None) == (self.gain is None):
            raise ValueError("give exactly one of target.value (absolute) and target.gain "
                             "(relative to the step-0 evaluation); set the other to null")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"target.value must be finite, got {self.value}")
        bounds = BOUNDED_METRICS.get(self.metric)
        if bounds and self.value is not None and not (bounds[0] < self.value <= bounds[1]):
            raise ValueError(
                f"target.value {self.value} is outside the range of {self.metric} "
                f"({bounds[0]}, {bounds[1]}]"
            )
        if bounds and self.gain is not None and self.gain >= bounds[1] - bounds[0]:
            raise ValueError(f"target.gain {self.gain} cannot be reached: {self.metric} spans "
                             f"{bounds[0]}..{bounds[1]}")
        return self


class BudgetConfig(StrictModel):
    """When a run ends: a sample budget, a training-seconds cap, or at the target."""

    max_samples: int = Field(131072, gt=0, le=MAX_SAMPLES, description="a run ends after this "
                             "many samples (responses)")
    max_train_s: float | None = Field(None, gt=0, description="a run ends after this many "
                                      "training seconds; null = no cap")
    stop_at_target: bool = Field(True, description="false: run on to max_samples (full curves)")


class CheckpointConfig(StrictModel):
    """How often a run saves what a resume needs."""

    every_samples: int | None = Field(None, gt=0, le=MAX_SAMPLES,
                                      description="None: only at the end")


class NoiseScaleConfig(StrictModel):
    """The gradient noise scale estimate (B_simple), logged per step."""

    enabled: bool = Field(False, description="estimate the gradient noise scale B_simple at "
                          "each step")
    ema: float = Field(0.9, ge=0, lt=1, description="smoothing of numerator and denominator")


class NonFiniteConfig(StrictModel):
    """What a NaN or inf loss does to a run."""

    max_consecutive: int = Field(3, gt=0, le=MAX_COUNT,
                                 description="abort after this many skipped updates")


class RewardConfig(StrictModel):
    """How rewards are computed and what a faulty call means (rollout/reward_runner.py).

    A `module:function` reward runs in a pool of worker processes, each call with a timeout;
    built-in rewards (exact, numeric, gsm8k, boxed) and functions declared cheap (an attribute
    `cheap = True` on the function) run in the training process. A call that raises, times
    out or returns a non-finite or non-numeric value is a fault: counted per step
    (`reward/errors`, `reward/timeouts`, `reward/nonfinite`), its first distinct messages
    logged, and the sample handled by `on_error`."""

    workers: int = Field(
        2, ge=0, le=256, description="worker processes for a module:function reward; 0 = call "
        "it in the training process (timed out there by SIGALRM, on POSIX in the main thread)")
    timeout_s: float = Field(
        30.0, gt=0, le=86400, description="seconds one call may take; past it a worker is killed "
        "and replaced, or an in-process call is interrupted (POSIX, main thread), and the "
        "sample counts in reward/timeouts")
    on_error: Literal["value", "drop"] = Field(
        "value", description="a faulted sample gets `error_value` (value), or is dropped from "
        "its group: left out of the group's mean and std, advantage 0, tokens out of the loss "
        "(drop)")
    error_value: float = Field(0.0, ge=-1e6, le=1e6,
                               description="the reward of a faulted sample under on_error: value")
    max_error_rate: float = Field(
        0.25, ge=0, le=1, description="the run fails (status failed, with the reason) when "
        "more than this fraction of the last `error_window_calls` training calls, or of one "
        "evaluation's calls, faulted")
    error_window_calls: int = Field(
        1024, gt=0, le=10**9, description="training calls over which max_error_rate is judged "
        "(the most recent whole steps covering at least this many calls)")


COMMAND_FRAMEWORKS = ("trl", "verl", "openrlhf", "prime-rl", "rlbatch")


class CommandConfig(StrictModel):
    """`backend: command`: the trial is the user's own training command, run with the
    framework's overrides for the trial (batch, scaled LR, seed, cadences, log location,
    resume) and followed through its log (backends/command; docs/integrations.md)."""

    framework: Literal["trl", "verl", "openrlhf", "prime-rl", "rlbatch"] = Field(
        description="whose command it is: which overrides it takes and which log it writes")
    argv: list[str] = Field(min_length=1, max_length=4096, description="the base command, "
                            "one word per item (e.g. [trl, grpo, --model_name_or_path, ...]); "
                            "the trial's overrides are appended")
    workdir: str | None = Field(None, description="working directory of the command "
                                "(default: the one rlbatch runs in)")
    env: dict[str, str] = Field({}, max_length=MAX_LIST, description="extra environment "
                                "variables of the command")
    num_processes: int = Field(1, gt=0, le=MAX_COUNT, description="trl: processes the "
                               "command trains on (per_device x processes x steps per "
                               "generation = B)")
    per_device_batch: int | None = Field(None, gt=0, le=MAX_SEQUENCES, description="trl: "
                                         "per_device_train_batch_size (default: G)")
    poll_s: float = Field(2.0, gt=0, le=3600, description="seconds between two reads of the "
                          "command's log")
    idle_timeout_s: float = Field(1800.0, gt=0, le=7 * 86400, description="the trial fails "
                                  "when its log does not grow for this long (start-up "
                                  "included)")
    stop_grace_s: float = Field(60.0, ge=0, le=3600, description="seconds between SIGTERM to "
                                "the command's process group and SIGKILL")

    @field_validator("argv")
    @classmethod
    def _words(cls, argv: list[str]) -> list[str]:
        if not argv[0].strip():
            raise ValueError("command.argv[0] must name a program")
        return argv


class ProfileConfig(StrictModel):
    """`rlbatch profile`: the candidates and the procedure's settings (docs/design.md)."""

    prompts_per_step: list[int] = Field(
        [8, 32, 64], max_length=MAX_LIST, description="candidate P values (B = P x G); the "
        "baseline P0 = B0 / G is always run")
    seeds: int = Field(1, gt=0, le=1000, description="seeds per configuration")
    confirm_seeds: int = Field(1, ge=0, le=1000, description="extra seeds for the baseline and the "
                               "challenger (the most promising candidate), so that the "
                               "decision compares configurations with >= 2 seeds")
    fixed_lr_control: bool = Field(True, description="also run 2 x B0 with the unscaled LR")
    concurrency: list[int] = Field([16, 64, 256], max_length=MAX_LIST,
                                   description="decode sweep; [] = keep C")
    early_stop: bool = Field(True, description="stop candidates that missed the crossing or cannot win")
    early_stop_rule: Literal["median", "futility"] = Field(
        "median", description="median: stop a candidate past the baseline's median T "
        "(cannot_win) or past exp(margin) x its largest N* (no_crossing); futility: only once "
        "a configuration faster than the baseline by profile.smallest_effect (cannot_win), or "
        "needing exp(margin) x its N* (no_crossing), would have crossed by then in all but "
        "profile.futility_alpha of its runs (docs/analysis.md, 'The profile's early stopping')")
    follow_up: Literal["all", "open", "challenger"] = Field(
        "challenger", description="a re-run with more seeds (the decision's `next`): all gives "
        "every configuration the new seeds; open only the baseline and the configurations "
        "the previous decision left open (neither ruled out nor shown faster); challenger "
        "only the baseline and the open one with the lowest point T, with the seeds its own "
        "plan asks for")
    alpha_spending: bool = Field(
        False, description="each re-run that follows the decision's `next` is another look: "
        "look k decides at alpha / 2^(k+1), so that all looks together keep alpha; off: "
        "every look at alpha")
    smallest_effect: float = Field(0.1, gt=0, le=10, description="futility: the smallest "
                                   "speed-up worth finding (0.1: T ratio 1/1.1)")
    futility_alpha: float = Field(0.05, gt=0, lt=0.5, description="futility: the chance of "
                                  "stopping a run of a configuration at that effect")
    futility_sd: float = Field(0.35, gt=0, le=5, description="futility: the run-to-run sd "
                               "of log T and log N* assumed when the baseline's seeds show "
                               "less (two seeds cannot estimate it)")
    min_evaluations: int = Field(10, ge=1, description="evaluations the baseline's N* must "
                                 "be resolved by (else the profile refuses and names the "
                                 "interval to set)")
    margin: float = Field(math.log(1.15), gt=0,
                          description="equivalence margin on log N* ratio (log 1.15)")
    statistic: Literal["crossing", "stretch"] = Field(
        "crossing", description="a run's N* in the decision: its first crossing of the "
        "target, or a stretch fitted to its rising curve near it (rlbatch analyze "
        "--statistic; docs/analysis.md, 'Which statistic')")
    spread: Literal["pooled", "pair", "larger", "paired"] = Field(
        "pair", description="the run-to-run spread a comparison with the baseline rests on: "
        "the pair's own, pooled over every configuration, the larger of the two, or paired "
        "by seed where 3 or more seeds of both crossed (rlbatch analyze --spread; "
        "docs/analysis.md, 'Per-configuration spread')")
    workers: int = Field(1, gt=0, le=1024, description="trials run at once; each gets its "
                         "share of the CPUs (RLBATCH_THREADS)")
    strategy: Literal["full", "probe"] = Field(
        "full", description="full: every candidate towards the target (early stops); probe: "
        "short probes, predicted time to target, only the predicted winner run to the target")
    probe_fraction: float = Field(0.15, gt=0, le=1, description="probe: first probe length, "
                                  "as a fraction of the baseline's N*")
    probe_max_fraction: float = Field(0.6, gt=0, le=1, description="probe: longest probe "
                                      "(probes double while undecided), fraction of N*")
    probe_budget: float | None = Field(
        2.0, ge=1, le=1000, description="probe: the most the profile may spend, in training "
        "seconds (decode sweep included) as a multiple of the baseline's time to target; "
        "probe extensions and the confirmation stay within it (a confirmation it stops ends "
        "with outcome over_budget, and the baseline is kept); the first probes always run; "
        "null: no limit")
    probe_control: bool = Field(False, description="probe: also probe the fixed-LR control "
                                "(reported only: the probe decision never uses it)")
    schedules: list[BatchSchedule] = Field(
        [], max_length=8, description="batch schedules to compare as candidates beside the "
        "static B (full strategy): each starts at the baseline's B (steps: at its first B) "
        "and runs the LR rule at every B")

    @model_validator(mode="after")
    def _positive(self) -> ProfileConfig:
        if any(p <= 0 for p in self.prompts_per_step) or any(c <= 0 for c in self.concurrency):
            raise ValueError("profile.prompts_per_step and profile.concurrency must be positive")
        if any(p > MAX_PROMPTS for p in self.prompts_per_step) \
                or any(c > MAX_COUNT for c in self.concurrency):
            raise ValueError(f"profile.prompts_per_step must be <= {MAX_PROMPTS} and "
                             f"profile.concurrency <= {MAX_COUNT}")
        if self.schedules and self.strategy == "probe":
            raise ValueError("profile.schedules are compared by the full strategy only: set "
                             "profile.strategy: full")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError("profile.concurrency must name each C once (the decode sweep "
                             "measures each once)")
        return self


def scaled_lr(reference_lr: float, reference_sequences: int, sequences: int, rule: str) -> float:
    """eta(B) = eta0 * (B / B0)^p, p from LR_EXPONENTS (docs/design.md; Malladi et al. 2022)."""
    if rule not in LR_EXPONENTS:
        raise ValueError(f"unknown lr_scaling {rule!r}; use one of {sorted(LR_EXPONENTS)}")
    return reference_lr * (sequences / reference_sequences) ** LR_EXPONENTS[rule]


def scaled_adam(beta1: float, beta2: float, eps: float, k: float) -> dict:
    """Malladi et al. 2022 square-root scaling: beta -> 1 - k(1 - beta), eps -> eps/sqrt(k).

    Betas are floored at 0 (a k large enough to make them negative is out of the rule's range).
    """
    b1 = max(0.0, 1.0 - k * (1.0 - beta1))
    b2 = max(0.0, 1.0 - k * (1.0 - beta2))
    return {"betas": (b1, b2), "eps": eps / math.sqrt(k)}
