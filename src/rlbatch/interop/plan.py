"""`rlbatch plan`: the exact settings of a batch-size sweep in another framework's own names.

For each candidate prompt batch P (G samples per prompt kept), B = P x G and the LR is scaled
from the base (B0, eta0) by `eta = eta0 (B/B0)^p` (`core.config.scaled_lr`; p = 1/2, 1, 0 for
sqrt, linear, none; Malladi et al. 2022 for sqrt). Batch units are converted per framework
(names and units, with sources, in docs/integrations.md):

- verl: data.train_batch_size and actor_rollout_ref.actor.ppo_mini_batch_size in prompts
  (the worker multiplies the mini batch by rollout.n); Hydra overrides `key=value`.
- OpenRLHF: --rollout_batch_size in prompts, --train_batch_size in samples.
- TRL GRPOConfig: per_device_train_batch_size in completions per process; the generation batch
  is per_device x processes x steps_per_generation; gradient_accumulation_steps sets the
  optimizer steps per generation.
- prime-rl: orchestrator.batch_size in rollouts (samples), group_size = G.

The number k of optimizer updates per rollout step is kept as in the base (one, unless the
base mini-batches); a candidate whose P is not divisible by k gets the nearest mini batch and
its k is reported. LR schedules advance per framework-specific step (verl: once per rollout
step; OpenRLHF, TRL: per optimizer step; prime-rl: per trainer step = rollout step), so a
warm-up or a step budget defined in steps is converted through samples:
`W_cand = round(W_base x samples_per_scheduler_step_base / samples_per_scheduler_step_cand)`.
Deviation: the critic (PPO) gets the same LR rule and keeps its own k; the paper notes the
critic may need its own batch size (docs/design.md), which `plan` does not choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rlbatch.core.config import LR_EXPONENTS, scaled_lr
from rlbatch.core.errors import ConfigError
from rlbatch.interop.ingest.common import FrameworkConfig

FRAMEWORKS = ("verl", "openrlhf", "trl", "prime-rl")
SCHEDULER_UNIT = {"verl": "rollout step (update_actor call)", "openrlhf": "optimizer step",
                  "trl": "optimizer step", "prime-rl": "trainer step (= rollout step)"}
PER_UPDATE = {"openrlhf", "trl"}  # scheduler steps once per optimizer update


@dataclass(frozen=True)
class Candidate:
    """One candidate's batch sizing in rlbatch units."""

    prompts: int
    samples_per_prompt: int
    lr: float
    critic_lr: float | None
    mini_batch_prompts: int
    critic_mini_batch_prompts: int | None
    epochs: int
    warmup_steps: int | None
    total_steps: int | None

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def minibatches(self) -> float:
        k = self.prompts / self.mini_batch_prompts
        return int(k) if k == int(k) else round(k, 4)


def fmt(value) -> str:
    """A setting as written on a command line: ints plain, floats to 6 significant digits."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


def merge_base(framework: str, file_config: FrameworkConfig | None, prompts: int | None,
               samples_per_prompt: int | None, lr: float | None,
               mini_batch_prompts: int | None) -> FrameworkConfig:
    """The base: the framework config file's values, overridden by flags given explicitly."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"--framework: unknown '{framework}'; use {', '.join(FRAMEWORKS)}")
    # flags are checked before they replace the file's values (the file's own values were
    # checked when it was read, and a bad flag must not be blamed on the file)
    for flag, v in (("--base-prompts", prompts), ("--samples-per-prompt", samples_per_prompt)):
        if v is not None and v <= 0:
            raise ConfigError(f"{flag} must be positive, got {v}")
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"--base-lr must be a finite number > 0, got {lr}")
    if mini_batch_prompts is not None and mini_batch_prompts <= 0:
        raise ConfigError(f"--mini-batch-prompts must be positive, got {mini_batch_prompts}")
    base = file_config or FrameworkConfig(framework=framework)
    changes = {k: v for k, v in (("prompts_per_step", prompts),
                                 ("samples_per_prompt", samples_per_prompt), ("lr", lr),
                                 ("mini_batch_prompts", mini_batch_prompts)) if v is not None}
    base = replace(base, **changes)
    missing = [flag for flag, v in (("--base-prompts", base.prompts_per_step),
                                    ("--samples-per-prompt", base.samples_per_prompt),
                                    ("--base-lr", base.lr)) if v is None]
    if missing:
        raise ConfigError(f"the base needs {', '.join(missing)} (or --base FILE)")
    if base.mini_batch_prompts is not None and base.mini_batch_prompts > base.prompts_per_step:
        base = replace(base, mini_batch_prompts=base.prompts_per_step)
    if mini_batch_prompts is not None:
        if framework == "prime-rl":
            raise ConfigError("--mini-batch-prompts: prime-rl takes one optimizer step per "
                              "trainer step; there is no mini batch to set")
        if not 0 < mini_batch_prompts <= base.prompts_per_step:
            raise ConfigError(f"--mini-batch-prompts must be in 1..{base.prompts_per_step}")
    return base


def _mini(prompts: int, base_prompts: int, base_mini: int | None) -> tuple[int, str | None]:
    """Mini batch keeping the base's number of updates per rollout step k."""
    if base_mini is None or base_mini >= base_prompts:
        return prompts, None
    k = base_prompts / base_mini
    mini = prompts / k
    if mini == int(mini) and mini >= 1:
        return int(mini), None
    mini = max(1, round(mini))
    return mini, (f"P={prompts} is not divisible by the base's k={k:g} updates per rollout "
                  f"step: mini batch {mini} prompts gives k={prompts / mini:.4g}")


def samples_per_scheduler_step(framework: str, sequences: int, updates: float) -> float:
    return sequences / updates if framework in PER_UPDATE else float(sequences)


def make_candidate(base: FrameworkConfig, prompts: int, rule: str) -> tuple[Candidate, list]:
    g, b0, b = base.samples_per_prompt, base.sequences_per_step, prompts * base.samples_per_prompt
    notes = []
    mini, note = _mini(prompts, base.prompts_per_step, base.mini_batch_prompts)
    notes += [note] if note else []
    critic_mini = None
    if base.critic_lr is not None:
        critic_mini, note = _mini(prompts, base.prompts_per_step,
                                  base.critic_mini_batch_prompts or base.mini_batch_prompts)
        notes += [f"critic: {note}"] if note else []
    unit0 = samples_per_scheduler_step(base.framework, b0, base.minibatches_per_step
                                       * base.epochs_per_step)
    unit = samples_per_scheduler_step(base.framework, b, prompts / mini * base.epochs_per_step)

    def convert(steps):
        return None if steps is None else max(0, round(steps * unit0 / unit))

    cand = Candidate(
        prompts=prompts, samples_per_prompt=g, lr=scaled_lr(base.lr, b0, b, rule),
        critic_lr=scaled_lr(base.critic_lr, b0, b, rule) if base.critic_lr else None,
        mini_batch_prompts=mini, critic_mini_batch_prompts=critic_mini,
        epochs=base.epochs_per_step, warmup_steps=convert(base.warmup_steps),
        total_steps=convert(base.total_steps))
    if base.warmup_steps is not None and abs(cand.warmup_steps * unit
                                             - base.warmup_steps * unit0) > 1e-9 * unit0:
        notes.append(f"warm-up rounded to {cand.warmup_steps} steps = "
                     f"{cand.warmup_steps * unit:g} samples (base: {base.warmup_steps * unit0:g})")
    return cand, notes


# ---------------------------------------------------------------- per-framework settings
def _verl(base: FrameworkConfig, c: Candidate, opts: dict) -> tuple[dict, list]:
    s = {"data.train_batch_size": c.prompts, "actor_rollout_ref.rollout.n": c.samples_per_prompt,
         "actor_rollout_ref.actor.ppo_mini_batch_size": c.mini_batch_prompts,
         "actor_rollout_ref.actor.optim.lr": c.lr}
    if c.critic_lr is not None:
        s["critic.optim.lr"] = c.critic_lr
        s["critic.ppo_mini_batch_size"] = c.critic_mini_batch_prompts
    if c.warmup_steps is not None:
        s["actor_rollout_ref.actor.optim.lr_warmup_steps"] = c.warmup_steps
    if c.total_steps is not None:
        s["trainer.total_training_steps"] = c.total_steps
    notes = []
    gpus, micro = base.extra.get("n_gpus"), base.extra.get("ppo_micro_batch_size_per_gpu")
    if gpus:
        per_gpu = c.mini_batch_prompts * c.samples_per_prompt / gpus
        if per_gpu != int(per_gpu) or (micro and int(per_gpu) % micro):
            notes.append(f"mini batch {c.mini_batch_prompts * c.samples_per_prompt} samples over "
                         f"{gpus} GPUs = {per_gpu:g} per GPU, not a multiple of "
                         f"ppo_micro_batch_size_per_gpu={micro}: verl will reject it")
    return s, notes


def _openrlhf(base: FrameworkConfig, c: Candidate, opts: dict) -> tuple[dict, list]:
    from rlbatch.interop.ingest import openrlhf as o


    # the base script's spelling; without one, that of current releases (0.10.2 on)
    style = base.extra.get("flag_style", "dotted")
    f = o.flag_names(style)
    s = {f[o.ROLLOUT]: c.prompts, f[o.N]: c.samples_per_prompt,
         f[o.TRAIN]: c.mini_batch_prompts * c.samples_per_prompt, f[o.LR]: c.lr}
    if c.critic_lr is not None:
        s[f[o.CRITIC_LR]] = c.critic_lr
    notes = []
    if "flag_style" not in base.extra:
        flat = o.flag_names("flat")
        notes.append(f"flags of OpenRLHF 0.10.2 and later; up to 0.10.1 they are "
                     f"{', '.join(flat[k] for k in (o.ROLLOUT, o.N, o.TRAIN, o.LR))}")
    if base.warmup_ratio:
        notes.append(f"{f[o.WARMUP]} {base.warmup_ratio:g} unchanged: a fraction of all "
                     f"optimizer updates, so the same samples when the data budget is the same")
    return s, notes


def _trl(base: FrameworkConfig, c: Candidate, opts: dict) -> tuple[dict, list]:
    nproc = opts.get("num_processes") or base.extra.get("num_processes") or 1
    pd = opts.get("per_device_batch") or base.extra.get("per_device_train_batch_size")
    notes = []
    if pd is None:
        pd = c.samples_per_prompt
        notes.append(f"per_device_train_batch_size defaults to G={pd} completions; pass "
                     f"--per-device-batch (and --num-processes) for your hardware")
    if c.sequences % (pd * nproc):
        raise ConfigError(f"B={c.sequences} completions is not a multiple of "
                          f"--per-device-batch {pd} x --num-processes {nproc}")
    spg = c.sequences // (pd * nproc)
    accum_f = spg / (c.prompts / c.mini_batch_prompts)
    accum = max(1, round(accum_f))
    s = {"per_device_train_batch_size": pd, "num_generations": c.samples_per_prompt,
         "steps_per_generation": spg, "gradient_accumulation_steps": accum,
         "learning_rate": c.lr}
    if c.warmup_steps is not None:
        s["warmup_steps"] = c.warmup_steps
    if c.total_steps is not None:
        s["max_steps"] = c.total_steps
    notes.append(f"generation batch = {pd} completions x {nproc} processes x {spg} steps = "
                 f"{c.sequences} = {c.prompts} prompts x {c.samples_per_prompt}; the optimizer "
                 f"steps every {accum} micro-steps ({spg * c.epochs / accum:g} per generation)")
    if accum != accum_f:
        notes.append(f"gradient_accumulation_steps rounded from {accum_f:g}")
    if base.warmup_ratio:
        notes.append(f"warmup ratio {base.warmup_ratio:g} unchanged (a fraction of all steps)")
    return s, notes


def _prime_rl(base: FrameworkConfig, c: Candidate, opts: dict) -> tuple[dict, list]:
    s = {"orchestrator.batch_size": c.sequences,
         "orchestrator.group_size": c.samples_per_prompt,
         "trainer.optim.lr": c.lr}
    if c.warmup_steps is not None:
        s["trainer.scheduler.warmup_steps"] = c.warmup_steps
    if c.total_steps is not None:
        s["max_steps"] = c.total_steps
    # prime-rl's CLI (pydantic-config): dotted, kebab-case flags (docs/configuration.md)
    cli = " ".join(f"--{k.replace('_', '-')} {fmt(v)}" for k, v in s.items())
    return s, [f"on the command line instead of the TOML file: {cli}"]


RENDER = {"verl": _verl, "openrlhf": _openrlhf, "trl": _trl, "prime-rl": _prime_rl}


def render_args(framework: str, settings: dict) -> list[str]:
    """Settings in the framework's syntax: Hydra overrides, CLI flags, or TOML lines."""
    if framework == "verl":
        return [f"{k}={fmt(v)}" for k, v in settings.items()]
    if framework == "openrlhf":
        return [f"{k} {fmt(v)}" for k, v in settings.items()]
    if framework == "trl":
        return [f"--{k} {fmt(v)}" for k, v in settings.items()]
    return [f"{k} = {fmt(v)}" for k, v in settings.items()]


def schedule_warning(base: FrameworkConfig) -> str:
    unit = SCHEDULER_UNIT[base.framework]
    text = (f"LR schedules in {base.framework} advance once per {unit}, so a warm-up or decay "
            f"given in steps covers a different number of samples at each batch size; define "
            f"it in samples")
    if base.warmup_steps is not None:
        text += (f" (the base's {base.warmup_steps}-step warm-up is converted for each "
                 f"candidate below)")
    elif base.warmup_ratio:
        text += f" (the base's warm-up ratio {base.warmup_ratio:g} is a fraction of all steps)"
    return text + "."


def _base_doc(base: FrameworkConfig) -> dict:
    return {"prompts_per_step": base.prompts_per_step,
            "samples_per_prompt": base.samples_per_prompt,
            "sequences_per_step": base.sequences_per_step, "lr": base.lr,
            "critic_lr": base.critic_lr, "mini_batch_prompts": base.mini_batch_prompts,
            "minibatches_per_step": base.minibatches_per_step,
            "epochs_per_step": base.epochs_per_step, "warmup_steps": base.warmup_steps,
            "warmup_ratio": base.warmup_ratio, "total_steps": base.total_steps,
            "source": base.source, "settings": base.settings}


def make_plan(base: FrameworkConfig, prompts: list[int], rule: str = "sqrt",
              num_processes: int | None = None, per_device_batch: int | None = None) -> dict:
    """The plan document: base, one entry per candidate (settings and args), warnings."""
    if rule not in LR_EXPONENTS:
        raise ConfigError(f"--rule: unknown rule '{rule}'; use sqrt, linear or none")
    if not prompts or any(p <= 0 for p in prompts):
        raise ConfigError("candidate prompts per rollout step: give one or more positive "
                          "integers")
    warnings = [schedule_warning(base)] + [f"{base.source}: {n}" for n in base.notes]
    k = base.minibatches_per_step
    if k != 1:
        warnings.append(f"the base takes k={k:g} optimizer updates per rollout step (mini batch "
                        f"{base.mini_batch_prompts} of {base.prompts_per_step} prompts) x "
                        f"{base.epochs_per_step} epoch(s); candidates keep k, so each update's "
                        f"batch grows with P. For one update per rollout batch (the paper's "
                        f"setting) pass --mini-batch-prompts {base.prompts_per_step}.")
    opts = {"num_processes": num_processes, "per_device_batch": per_device_batch}
    unit0 = samples_per_scheduler_step(base.framework, base.sequences_per_step,
                                       k * base.epochs_per_step)
    entries = []
    for p in prompts:
        cand, notes = make_candidate(base, p, rule)
        settings, more = RENDER[base.framework](base, cand, opts)
        entries.append({
            "prompts_per_step": p, "samples_per_prompt": cand.samples_per_prompt,
            "sequences_per_step": cand.sequences,
            "batch_ratio": cand.sequences / base.sequences_per_step, "lr": cand.lr,
            "critic_lr": cand.critic_lr, "mini_batch_prompts": cand.mini_batch_prompts,
            "minibatches_per_step": cand.minibatches,
            "updates_per_step": cand.minibatches * cand.epochs,
            "warmup_steps": cand.warmup_steps,
            "warmup_samples": None if base.warmup_steps is None else base.warmup_steps * unit0,
            "total_steps": cand.total_steps,
            "settings": settings, "args": render_args(base.framework, settings),
            "notes": notes + more})
    return {"framework": base.framework, "rule": rule, "exponent": LR_EXPONENTS[rule],
            "scheduler_unit": SCHEDULER_UNIT[base.framework], "base": _base_doc(base),
            "candidates": entries, "warnings": warnings}
