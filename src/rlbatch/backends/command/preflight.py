"""Checks of a `backend: command` config before any trial starts (`rlbatch config check`,
`rlbatch profile` and `rlbatch train` run them): the trial's settings in rlbatch units, the
command's words against its framework, the model path, and the framework's own files
(OpenRLHF's train and evaluation sets)."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError


def trial_spec(cfg: Config):
    """The trial's settings in rlbatch units (interop/launch.py `TrialSpec`)."""
    from rlbatch.interop.launch import TrialSpec

    c = cfg.command
    sets = ()
    if c.framework == "rlbatch":  # the target and how the inner run ends are rlbatch's own keys
        t = cfg.target
        sets = (("target.metric", t.metric), ("budget.stop_at_target", cfg.budget.stop_at_target),
                *((("target.value", t.value), ("target.gain", "null")) if t.value is not None
                  else (("target.value", "null"), ("target.gain", t.gain))))
    return TrialSpec(
        framework=c.framework, algorithm=cfg.algorithm, prompts=cfg.batch.prompts_per_step,
        samples_per_prompt=cfg.batch.samples_per_prompt,
        minibatches=cfg.batch.minibatches_per_step, epochs=cfg.batch.epochs_per_step,
        lr=cfg.actor_lr, critic_lr=cfg.critic_lr if cfg.algorithm == "ppo" else None,
        seed=cfg.seed, eval_every_samples=cfg.eval.every_samples,
        checkpoint_every_samples=cfg.checkpoint.every_samples or cfg.eval.every_samples,
        max_samples=cfg.budget.max_samples, concurrency=cfg.rollout.generation_concurrency,
        num_processes=c.num_processes, per_device_batch=c.per_device_batch, sets=sets,
        workdir=c.workdir, staleness=cfg.rollout.max_staleness)


def check_command(cfg: Config, prompts: set[int] | None = None) -> None:
    """The program and working directory exist, and the model and evaluation set it names
    can be used: one line naming `command.argv` or `command.workdir` otherwise (before any
    run directory is made). `prompts`: the P of every trial to be run (this run's own P by
    default)."""
    c = cfg.command
    if c.workdir is not None and not Path(c.workdir).is_dir():
        raise ConfigError(f"command.workdir: {c.workdir} is not a folder")
    program = c.argv[0]
    where = c.workdir or os.getcwd()
    # the command runs with command.env over this environment: its PATH is the one searched
    search = "command.env.PATH" if "PATH" in c.env else "PATH"
    if os.sep in program:
        file = Path(where, program)
        found = file.is_file() and os.access(file, os.X_OK)
    else:
        found = shutil.which(program, path=c.env.get("PATH", os.environ.get("PATH"))) is not None
    if not found:
        raise ConfigError(f"command.argv[0]: '{program}' is not an executable program on "
                          f"{search} (or relative to {where})")
    check_model_path(c.framework, c.argv, where)
    check_staleness(cfg, prompts is not None)
    check_framework_files(cfg, where, prompts or {cfg.batch.prompts_per_step})


def check_staleness(cfg: Config, profiled: bool) -> None:
    """Every staleness the trial runs at, or with `profiled` the profile's trials
    (rollout.max_staleness, and each of profile.max_staleness), maps to the framework's own setting (interop/launch.py
    `stale_settings`). prime-rl decodes one step ahead at any setting: a profile that
    compares staleness values there starts from 1."""
    import dataclasses

    from rlbatch.interop.staleness import stale_settings

    crossed = cfg.profile.max_staleness if profiled else []  # a trial: its own only
    values = sorted({cfg.rollout.max_staleness, *crossed})
    if cfg.command.framework == "prime-rl" and len(values) > 1 and values[0] == 0:
        raise ConfigError("profile.max_staleness: prime-rl always decodes one step ahead "
                          "(docs/algorithms.md 180 at 559b447), so it has no staleness 0 to "
                          "compare with; set rollout.max_staleness: 1 and profile values of "
                          "1 and more")
    spec = trial_spec(cfg)
    for k in values:
        stale_settings(dataclasses.replace(spec, staleness=k), list(cfg.command.argv))


def check_framework_files(cfg: Config, where: str, prompts: set[int]) -> None:
    """What the command's own settings and the files it names refuse (interop/usercmd.py),
    where the command runs (`where`), for the profile's trials' P (`prompts`): OpenRLHF's
    train and evaluation sets, prime-rl's evaluation settings."""
    from rlbatch.interop import usercmd

    framework = cfg.command.framework
    if framework == "openrlhf":
        usercmd.check_openrlhf_train_set(cfg, where, prompts)
        check_openrlhf_eval_set(cfg, where, prompts)
        usercmd.warn_uncounted_eval_set(cfg, where, prompts)
    elif framework == "prime-rl":
        usercmd.check_prime_rl(cfg, where)


MODEL_FLAGS = {"trl": "--model_name_or_path", "openrlhf": "--actor.model_name_or_path",
               "verl": "actor_rollout_ref.model.path"}


def check_model_path(framework: str, argv: list[str], where: str) -> None:
    """A model given as a local path (starting with /, . or ~) or as an unexpanded shell
    variable is a folder that exists where the command runs: otherwise the framework takes
    it for a hub name and fails much later on a download that never names it. A hub name
    (org/name) is the framework's business."""
    flag = MODEL_FLAGS.get(framework)
    if flag is None:
        return
    values = [b for a, b in itertools.pairwise(argv) if a == flag] + \
        [w.split("=", 1)[1] for w in argv if w.startswith(flag + "=")]
    for value in values:
        local = value.startswith(("/", ".", "~")) or "$" in value
        if local and not Path(where, os.path.expanduser(value)).is_dir():
            raise ConfigError(f"command.argv: {flag} {value}: no such model folder (relative "
                              f"to {where}); give a local checkpoint's folder, e.g. "
                              "MODEL=$(rlbatch model build --path) for the built-in model")


def check_openrlhf_eval_set(cfg: Config, where: str, prompts: set[int]) -> None:
    """OpenRLHF cuts its evaluation set to `--data.max_samples` prompts
    (openrlhf/trainer/ppo_trainer.py, `prepare_datasets`, at 3c3be62), the flag that also
    bounds the run and that rlbatch sets per trial to its steps x P. An evaluation set larger
    than the smallest such cut of the profile's trials would be a different set per trial:
    refused in one line, with the budget that keeps it whole."""
    import math

    from rlbatch.interop.usercmd import count_prompts

    argv = cfg.command.argv
    values = [b for a, b in itertools.pairwise(argv) if a == "--eval.dataset"]
    n = count_prompts(values[-1], where) if values else None
    if not n:
        return
    g, budget = cfg.batch.samples_per_prompt, cfg.budget.max_samples
    cut, p = min((math.ceil(budget / (p * g)) * p, p) for p in prompts)
    if n > cut:
        raise ConfigError(
            f"command.argv: --eval.dataset {values[-1]}: {n:,} prompts, more than the {cut:,} "
            f"OpenRLHF keeps of it in the trial with P = {p} (it cuts the evaluation set at "
            "--data.max_samples, which rlbatch sets from budget.max_samples): use at most "
            f"{cut:,} prompts, or set budget.max_samples to at least {n * g:,}")
