"""The config schema: one strict, frozen pydantic model per YAML section (`task:`, `batch:`,
`optimizer:`, `critic:`, ...) with its types, ranges and defaults. The `profile:` section is
`core/profile_schema.py`; the learning-rate rule the sections resolve is `core/lr_rule.py`.
The top-level `Config`, its cross-section checks and its derived values are
`core/config.py`.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlbatch.core.lr_rule import scaled_lr

# Metrics whose range is known; a target outside it can never be reached.
DEFAULT_DIGITS = {"addition": 3, "reverse": 6, "runsum": 1}
BOUNDED_METRICS = {"eval/accuracy": (0.0, 1.0), "eval/accuracy_a": (0.0, 1.0),
                   "eval/accuracy_b": (0.0, 1.0), "reward/mean": (0.0, 1.0)}


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
        "in time/rollout; with rollout.max_staleness, in rollout/decode_s), as a remote "
        "generation service or weight sync would cost; 0 = off. "
        "For what-if studies and tests of the decision")
    max_staleness: int = Field(
        0, ge=0, le=8, description="k: each step trains on rollouts generated by the policy "
        "k updates older (the first k steps: by the starting policy), decoded on a second "
        "thread while the update runs, the loss clipped against that behaviour policy; 0 = "
        "synchronous. The built-in trainer runs at the bound every step, so a run is the "
        "same at any speed and resumes exactly (docs/design.md, 'Stale rollouts')")


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
    halves: bool = Field(False, description="also log eval/accuracy_a and eval/accuracy_b, the "
                         "accuracy on the first and the second half of the prompts: two disjoint "
                         "evaluation sets of the same run, whose N* differ only by evaluation "
                         "noise (docs/analysis.md, \"Evaluation noise\")")


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
