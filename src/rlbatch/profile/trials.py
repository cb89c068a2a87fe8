"""Trials of `rlbatch profile`: which runs the procedure needs, as resolved configs.

Kinds (docs/design.md "align, then accelerate"):
- `baseline`: P0 = B0 / G at eta0 (the reference every verdict compares against);
- `sqrt`: each candidate P with eta(B) = eta0 sqrt(B/B0);
- `control`: 2 x B0 with the unscaled eta0 (the paper's "double the batch without retuning");
- `schedule`: each of `profile.schedules`, B changing during the run (docs/design.md, "Batch
  schedules").

A trial's config is the profile's base config with `batch.prompts_per_step`, the LR rule,
the seed, the decode concurrency and the output directory replaced, the `profile:` section
dropped (so editing the candidate list does not change the ids of runs already done), and
`stop_at_target` on. Its run id is the trainer's, so re-running finds finished trials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError
from rlbatch.core.loading import validate_config
from rlbatch.core.runmatch import find_run_dir


@dataclass(frozen=True)
class Trial:
    name: str
    kind: str  # baseline | sqrt | control | schedule
    prompts_per_step: int
    seed: int
    config: Config

    @property
    def sequences_per_step(self) -> int:
        return self.config.sequences_per_step

    @property
    def run_id(self) -> str:
        """The name of its directory (`run_dir`)."""
        return self.run_dir().name

    def run_dir(self) -> Path:
        """Its directory: that of its run id, or an earlier release's of the same run
        (core/runmatch.py), as `rlbatch train` opens it."""
        return find_run_dir(self.config.output_dir, self.config.resolved_dict(), self.seed)[0]


def baseline_prompts(cfg: Config) -> int:
    o, g = cfg.optimizer, cfg.batch.samples_per_prompt
    if o.lr is not None or o.reference_sequences is None or o.reference_lr is None:
        raise ConfigError("profile needs optimizer.reference_sequences and optimizer.reference_lr "
                          "(B0, eta0) and no fixed optimizer.lr")
    if o.reference_sequences % g:
        raise ConfigError(f"optimizer.reference_sequences ({o.reference_sequences}) must be a "
                          f"multiple of batch.samples_per_prompt ({g})")
    return o.reference_sequences // g


def profile_prompts(cfg: Config) -> set[int]:
    """The P of every trial a profile of `cfg` plans: the baseline, the candidates and the
    fixed-LR control (what `plan_trials` runs, schedules aside)."""
    p0 = baseline_prompts(cfg)
    return {p0, *cfg.profile.prompts_per_step} | ({2 * p0} if cfg.profile.fixed_lr_control
                                                  else set())


def trial_config(cfg: Config, *, prompts: int, seed: int, rule: str, concurrency: int,
                 runs_dir: Path, checkpoint_every: int, eval_every: int | None = None,
                 schedule: dict | None = None) -> Config:
    data = cfg.model_dump(mode="json")
    data.pop("profile", None)
    data["batch"]["prompts_per_step"] = prompts
    data["batch"]["schedule"] = schedule
    if schedule and schedule.get("adaptive") and not data["noise_scale"]["enabled"]:
        # the adaptive rule steers by the noise scale: its trial measures it (the static
        # trials do not pay for the probe), in micro-batches of half the first minibatch
        data["noise_scale"]["enabled"] = True
        first = prompts * cfg.batch.samples_per_prompt // cfg.batch.minibatches_per_step
        data["batch"]["micro_batch_sequences"] = data["batch"]["micro_batch_sequences"] or \
            max(1, first // 2)
    data["optimizer"]["lr_scaling"] = rule
    data["seed"] = seed
    data["rollout"]["generation_concurrency"] = concurrency
    data["output_dir"] = str(runs_dir)
    data["budget"]["stop_at_target"] = True
    data["checkpoint"]["every_samples"] = checkpoint_every
    if eval_every is not None:
        data["eval"]["every_samples"] = eval_every
    return validate_config(data)


def plan_trials(cfg: Config, runs_dir: Path, concurrency: int, seeds: list[int],
                kinds: tuple[str, ...] = ("baseline", "sqrt", "control"),
                eval_every: int | None = None,
                baseline_eval_every: int | None = None) -> list[Trial]:
    """Trials for the given seeds, baseline first, then candidates by increasing B.
    `eval_every` replaces the evaluation interval of the candidates, `baseline_eval_every`
    that of the baseline (its trials are then named with an `-e<samples>` suffix: they are
    other runs than the baseline at the configured cadence)."""
    p0 = baseline_prompts(cfg)
    prof = cfg.profile
    ckpt = cfg.checkpoint.every_samples or cfg.eval.every_samples
    specs: list[tuple[str, str, int, str, dict | None]] = []
    if "baseline" in kinds:
        specs.append(("baseline", "base", p0, cfg.optimizer.lr_scaling, None))
    if "sqrt" in kinds:
        specs += [("sqrt", "sqrt", p, "sqrt", None) for p in sorted(set(prof.prompts_per_step))
                  if p != p0]
    if "control" in kinds and prof.fixed_lr_control:
        specs.append(("control", "fixed-lr", 2 * p0, "none", None))
    if "schedule" in kinds:
        for i, sch in enumerate(prof.schedules, start=1):
            first = sch.steps[0][1] // cfg.batch.samples_per_prompt if sch.steps else p0
            specs.append(("schedule", f"sched{i}", first, "sqrt", sch.model_dump(mode="json")))
    trials = []
    for kind, label, p, rule, schedule in specs:
        for seed in seeds:
            every = baseline_eval_every if kind == "baseline" else eval_every
            tc = trial_config(cfg, prompts=p, seed=seed, rule=rule, concurrency=concurrency,
                              runs_dir=runs_dir, checkpoint_every=ckpt, eval_every=every,
                              schedule=schedule)
            suffix = f"-e{every}" if kind == "baseline" and every is not None else ""
            trials.append(Trial(f"{label}-P{p}-s{seed}{suffix}", kind, p, seed, tc))
    return trials
