"""The counters of one training run (runstate.py): saved with each checkpoint as
`counters.json` and restored on resume."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rlbatch.core.config import Config


@dataclass
class Counters:
    """Everything a run counts, saved with each checkpoint (`counters.json`) and restored on
    resume; names as in summary.json where they appear there."""

    step: int = 0  # rollout steps done
    samples: int = 0  # retained responses (the x-axis)
    prompts: int = 0
    tokens: int = 0  # generated response tokens
    train_s: float = 0.0  # wall seconds of rollout steps (evaluations, checkpoints excluded)
    consumed: int = 0  # prompts drawn from the training stream (replayed on resume)
    nonfinite_total: int = 0  # optimizer updates skipped as non-finite, in all
    nonfinite_run: int = 0  # consecutive steps with a skipped update
    next_eval: int = 0  # the sample mark of the next evaluation
    next_ckpt: int = 0  # the sample mark of the next checkpoint (0: none)
    evals_done: int = 0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    first_step_s: float | None = None
    target: dict | None = None  # the crossing: step, samples, train_s, reached_value
    target_threshold: float | None = None  # absolute, or step-0 value + gain once known
    status: str = "running"
    last_eval: dict | None = None
    stop_reason: str | None = None
    stop_code: str | None = None
    failure: str | None = None
    reward_calls: int = 0
    reward_errors: int = 0
    reward_timeouts: int = 0
    reward_nonfinite: int = 0
    reward_window: list = field(default_factory=list)  # [calls, faults] of recent steps
    sequences: int = 0  # batch.schedule.adaptive: B for the next step (0: the first B)
    schedule_streak: int = 0  # batch.schedule.adaptive: steps in a row that met the rule

    @classmethod
    def fresh(cls, cfg: Config) -> Counters:
        return cls(next_eval=cfg.eval.every_samples,
                   next_ckpt=cfg.checkpoint.every_samples or 0,
                   target_threshold=cfg.target.value)

    def restore(self, saved: dict) -> None:
        """Take the values of a checkpoint's counters.json (unknown keys are ignored)."""
        names = {f.name for f in fields(self)}
        for key, value in saved.items():
            if key in names:
                setattr(self, key, value)
