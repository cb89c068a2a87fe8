"""Trials of `rlbatch profile`: which runs the procedure needs, as resolved configs.

Kinds (docs/design.md "align, then accelerate"):
- `baseline`: P0 = B0 / G at eta0 (the reference every verdict compares against);
- `sqrt`: each candidate P with eta(B) = eta0 sqrt(B/B0), at each of
  `profile.max_staleness` (B0 too at each other than the baseline's; named `-k<staleness>`
  where it is not the baseline's, `rollout.max_staleness`);
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
                 schedule: dict | None = None, staleness: int = 0) -> Config:
    data = cfg.model_dump(mode="json")
    data.pop("profile", None)
    data["batch"]["prompts_per_step"] = prompts
    data["batch"]["schedule"] = schedule
    data["rollout"]["max_staleness"] = staleness
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
    k0 = cfg.rollout.max_staleness  # the baseline's, the control's and the schedules'
    specs: list[tuple[str, str, int, str, dict | None, int]] = []
    if "baseline" in kinds:
        specs.append(("baseline", "base", p0, cfg.optimizer.lr_scaling, None, k0))
    if "sqrt" in kinds:
        stale = sorted(set(prof.max_staleness) | {k0})
        at_p0 = {p0} if stale != [k0] else set()
        specs += [("sqrt", "sqrt", p, "sqrt", None, k)
                  for p in sorted(set(prof.prompts_per_step) | at_p0)
                  for k in stale if (p, k) != (p0, k0)]
    if "control" in kinds and prof.fixed_lr_control:
        specs.append(("control", "fixed-lr", 2 * p0, "none", None, k0))
    if "schedule" in kinds:
        for i, sch in enumerate(prof.schedules, start=1):
            first = sch.steps[0][1] // cfg.batch.samples_per_prompt if sch.steps else p0
            specs.append(("schedule", f"sched{i}", first, "sqrt", sch.model_dump(mode="json"),
                          k0))
    trials = []
    for kind, label, p, rule, schedule, k in specs:
        for seed in seeds:
            every = baseline_eval_every if kind == "baseline" else eval_every
            tc = trial_config(cfg, prompts=p, seed=seed, rule=rule, concurrency=concurrency,
                              runs_dir=runs_dir, checkpoint_every=ckpt, eval_every=every,
                              schedule=schedule, staleness=k)
            suffix = f"-e{every}" if kind == "baseline" and every is not None else ""
            stale_part = f"-k{k}" if k != k0 else ""
            trials.append(Trial(f"{label}-P{p}{stale_part}-s{seed}{suffix}", kind, p, seed, tc))
    return trials
