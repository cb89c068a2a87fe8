"""A trial as the user's own training command: the words appended to it, its environment,
the log it writes and how it resumes, per framework (`backend: command`, docs/integrations.md).

The batch, group size and learning rate come from the plan layer (`plan.make_plan` at the
trial's P with `rule: none`, so the LR given is the LR run, already scaled by the profile);
this module adds what a trial needs beyond them: the seed, the evaluation and checkpoint
cadences and the length of the run converted from samples into the framework's steps, where
the log goes (one place per attempt where the framework would overwrite it, or the
framework's own append-mode log), and how an attempt continues from the newest checkpoint.
Overrides are appended after the user's words: argparse-style parsers and Hydra both take
the last value given.

Steps: a rollout step is B = P x G samples. A cadence of `every` samples becomes
max(1, every // B) rollout steps (never sparser than asked); the run length
ceil(max_samples / B) rollout steps. TRL counts optimizer steps: K per rollout step.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rlbatch.core.errors import ConfigError
from rlbatch.interop.ingest.common import FrameworkConfig
from rlbatch.interop.plan import make_plan
from rlbatch.interop.staleness import OPENRLHF_ASYNC, stale_settings
from rlbatch.interop.usercmd import prime_rl_has_inference, verl_loggers

# frameworks with a decode-concurrency setting that a trial passes C to (verl and prime-rl:
# vLLM's max_num_seqs; rlbatch: rollout.generation_concurrency); TRL and OpenRLHF have none
TAKES_CONCURRENCY = ("verl", "prime-rl", "rlbatch")


def fmt(value) -> str:
    """A setting as a command-line word, exactly: floats in full (the shortest decimal that
    reads back as the same number, where `rlbatch plan` prints 6 digits for people), so the
    LR the framework runs is the LR the trial's config records."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class TrialSpec:
    """What one trial runs, in rlbatch units."""

    framework: str
    algorithm: str
    prompts: int
    samples_per_prompt: int
    minibatches: int
    epochs: int
    lr: float
    critic_lr: float | None
    seed: int
    eval_every_samples: int
    checkpoint_every_samples: int
    max_samples: int
    concurrency: int
    num_processes: int = 1
    per_device_batch: int | None = None
    sets: tuple = ()  # rlbatch: further `--set KEY=VALUE` of the trial (target, budget)
    workdir: str | None = None  # where the command runs: its relative paths resolve there
    staleness: int = 0  # rollout.max_staleness: `stale_settings` maps it

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt

    def steps(self, samples: int) -> int:
        """A cadence in samples as rollout steps: at least one, never sparser than asked."""
        return max(1, samples // self.sequences)

    @property
    def total_steps(self) -> int:
        return math.ceil(self.max_samples / self.sequences)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int  # rollout steps done when it was saved


@dataclass
class Launch:
    """One attempt: the full command, its extra environment, the log to follow (`shared`:
    the same log for every attempt, which the framework itself appends to or resumes), and
    the settings appended (framework name -> value), recorded in the run's manifest."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    shared: bool
    resume: Checkpoint | None
    settings: dict = field(default_factory=dict)
    updates_per_step: float = 1
    fresh: bool = True  # no checkpoint to continue from: every earlier row is replaced

    @property
    def resume_step(self) -> int | None:
        """-1 for a fresh start, the checkpoint's rollout step, or None when the framework
        picks its checkpoint itself and it cannot be told from outside."""
        if self.fresh:
            return -1
        return None if self.resume is None else self.resume.step


def plan_settings(spec: TrialSpec) -> tuple[dict, dict]:
    """The plan layer's settings for the trial's P at its LR (rule none: the LR is already
    the scaled one), and the candidate entry (updates per step, notes)."""
    base = FrameworkConfig(
        framework=spec.framework, prompts_per_step=spec.prompts,
        samples_per_prompt=spec.samples_per_prompt, lr=spec.lr, critic_lr=spec.critic_lr,
        mini_batch_prompts=max(1, spec.prompts // spec.minibatches), epochs_per_step=spec.epochs)
    plan = make_plan(base, [spec.prompts], rule="none", num_processes=spec.num_processes,
                     per_device_batch=spec.per_device_batch)
    entry = plan["candidates"][0]
    return dict(entry["settings"]), entry


# ---------------------------------------------------------------- TRL (`trl grpo`)
def trl_checkpoint(state: Path, updates_per_step: float) -> Checkpoint | None:
    """The newest complete `checkpoint-N` of the trial's TRL output folder (N optimizer
    steps; complete when its trainer_state.json was written)."""
    done = []
    for p in (state / "trl-output").glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / "trainer_state.json").is_file():
            done.append((int(m.group(1)), p))
    if not done:
        return None
    n, path = max(done)
    return Checkpoint(path, int(n // updates_per_step))


# Checkpoints a trial keeps: a resume reads the newest complete one, and the one before it
# covers a kill inside the newest's write.
KEEP_CHECKPOINTS = 2


def _trl(spec: TrialSpec, attempt: Path, state: Path, base: list[str]) -> Launch:
    s, _ = plan_settings(spec)
    k = s["steps_per_generation"] * spec.epochs / s["gradient_accumulation_steps"]
    if k != int(k):
        raise ConfigError(f"command: TRL would take {k:g} optimizer steps per generation; "
                          f"choose command.per_device_batch so that it is whole")
    k = int(k)
    stale_settings(spec, base)  # TRL's GRPOTrainer has none: refused above 0
    s.update({"seed": spec.seed, "num_iterations": spec.epochs,
              "max_steps": spec.total_steps * k, "logging_steps": 1,
              "report_to": "tensorboard", "eval_strategy": "steps",
              "eval_steps": spec.steps(spec.eval_every_samples) * k,
              "save_strategy": "steps",
              "save_steps": spec.steps(spec.checkpoint_every_samples) * k,
              # a resume needs the newest; transformers keeps every checkpoint by default
              "save_total_limit": KEEP_CHECKPOINTS,
              "output_dir": str(state / "trl-output")})
    ckpt = trl_checkpoint(state, k)
    if ckpt is None:
        s["eval_on_start"] = True
    else:
        s["resume_from_checkpoint"] = str(ckpt.path)
    argv = [w for name, v in s.items() for w in (f"--{name}", fmt(v))]
    # transformers' TensorBoard callback writes to $TENSORBOARD_LOGGING_DIR when it is set
    env = {"TENSORBOARD_LOGGING_DIR": str(attempt / "tensorboard")}
    return Launch(argv, env, attempt / "tensorboard", shared=False, resume=ckpt, settings=s,
                  updates_per_step=k, fresh=ckpt is None)


# ---------------------------------------------------------------- rlbatch train
def _rlbatch(spec: TrialSpec, attempt: Path, state: Path, base: list[str]) -> Launch:
    """`rlbatch train` as a foreign command: the trial's settings as `--set`s, its runs under
    the trial's state folder; it resumes itself (`--resume`), so one log serves every
    attempt."""
    s = {"batch.prompts_per_step": spec.prompts,
         "batch.samples_per_prompt": spec.samples_per_prompt,
         "batch.minibatches_per_step": spec.minibatches, "batch.epochs_per_step": spec.epochs,
         "optimizer.lr": spec.lr, "seed": spec.seed,
         "eval.every_samples": spec.eval_every_samples,
         "checkpoint.every_samples": spec.checkpoint_every_samples,
         "budget.max_samples": spec.max_samples,
         "rollout.generation_concurrency": spec.concurrency}
    if spec.critic_lr is not None:
        s["critic.lr"] = spec.critic_lr
    s.update(stale_settings(spec, base))
    s.update(dict(spec.sets))
    argv = [w for name, v in s.items() for w in ("--set", f"{name}={fmt(v)}")]
    argv += ["--out", str(state / "rlbatch-runs"), "--resume", "--json"]
    return Launch(argv, {}, state / "rlbatch-runs", shared=True, resume=None, settings=s)


# ---------------------------------------------------------------- verl (Hydra overrides)
def verl_checkpoint(state: Path, reached: int | None = None) -> Checkpoint | None:
    """The checkpoint verl resumes from under `resume_mode=auto`: the one that
    `latest_checkpointed_iteration.txt` names (written after the checkpoint itself). When the
    rows logged so far end before it (`reached`: verl V1 saves inside the step, then
    validates, then logs the step, verl/trainer/ppo/v1/trainer_base.py 449-490 at 1dda039,
    so a kill during that validation leaves a checkpoint whose step was never logged), the
    newest earlier `global_step_N` the rows reach, or None: resuming past the last logged
    step would lose that step's time and its evaluation."""
    root = state / "verl-checkpoints"
    try:
        n = int((root / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None
    path = root / f"global_step_{n}"
    if reached is None or n <= reached:
        return Checkpoint(path, n) if path.is_dir() else None
    older = [int(m.group(1)) for p in root.glob("global_step_*")
             if (m := re.fullmatch(r"global_step_(\d+)", p.name)) and p.is_dir()]
    older = [k for k in older if k <= reached]
    return Checkpoint(root / f"global_step_{max(older)}", max(older)) if older else None


def _verl(spec: TrialSpec, attempt: Path, state: Path, base: list[str],
          reached: int | None = None) -> Launch:
    s, _ = plan_settings(spec)
    stale_settings(spec, base)  # verl's is its entry point: checked, nothing appended
    log = attempt / "verl.jsonl"  # verl's file logger truncates its file: one per attempt
    ckpt = verl_checkpoint(state, reached)
    latest = verl_checkpoint(state)
    # the user's loggers (W&B included) and verl's file logger, which rlbatch follows
    loggers = [x for x in verl_loggers(base, spec.workdir or ".") if x != "file"] + ["file"]
    s.update({"actor_rollout_ref.actor.ppo_epochs": spec.epochs, "data.seed": spec.seed,
              "actor_rollout_ref.rollout.seed": spec.seed,
              "actor_rollout_ref.rollout.max_num_seqs": spec.concurrency,
              "trainer.logger": f"[{','.join(loggers)}]",
              "trainer.test_freq": spec.steps(spec.eval_every_samples),
              "trainer.save_freq": spec.steps(spec.checkpoint_every_samples),
              "trainer.total_training_steps": spec.total_steps,
              "trainer.default_local_dir": str(state / "verl-checkpoints"),
              # verl keeps every checkpoint by default (null, trainer/config/ppo_trainer.yaml)
              "trainer.max_actor_ckpt_to_keep": KEEP_CHECKPOINTS,
              "trainer.max_critic_ckpt_to_keep": KEEP_CHECKPOINTS,
              "trainer.resume_mode": "auto" if ckpt == latest else "resume_path",
              # a resumed run validates at its checkpoint step again, which the first did
              "trainer.val_before_train": ckpt is None,
              # the file logger runs in a Ray actor: its path travels in the runtime env too
              "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": str(log)})
    if ckpt != latest:  # not the checkpoint verl would pick (trainer_base.py 795-810)
        if ckpt is None:
            s["trainer.resume_mode"] = "disable"
        else:
            s["trainer.resume_from_path"] = str(ckpt.path)
    if spec.critic_lr is not None:
        s["critic.ppo_epochs"] = spec.epochs
    argv = [f"{k}={fmt(v)}" for k, v in s.items()]
    return Launch(argv, {"VERL_FILE_LOGGER_PATH": str(log)}, log, shared=False, resume=ckpt,
                  settings=s, fresh=ckpt is None)


# ---------------------------------------------------------------- OpenRLHF (dotted flags)
OPENRLHF_TAG = re.compile(r"(?:best_)?global_step(\d+)")


def deepspeed_saves(root: Path) -> dict[int, str]:
    """The complete DeepSpeed saves in one of OpenRLHF's checkpoint folders (`_actor`,
    `_critic`), rollout step -> tag: the one its `latest` names and every regular tag folder
    older than it. OpenRLHF makes the folder first and DeepSpeed writes `latest` after the
    save (openrlhf/utils/deepspeed/deepspeed.py `save_ckpt` 695-756), one save after the
    other, so a folder newer than `latest`, or one without `latest`, may be cut."""
    try:
        tag = (root / "latest").read_text().strip()
    except OSError:
        return {}
    m = OPENRLHF_TAG.fullmatch(tag)
    if not m or not (root / tag).is_dir():
        return {}
    newest = int(m.group(1))
    saves = {int(mm.group(1)): p.name for p in root.iterdir()
             if (mm := OPENRLHF_TAG.fullmatch(p.name)) and not p.name.startswith("best")
             and p.is_dir() and int(mm.group(1)) < newest}
    return {**saves, newest: tag}


def openrlhf_checkpoint(state: Path, critic: bool = False) -> Checkpoint | None:
    """The step OpenRLHF can resume from with --ckpt.load_enable: the newest complete actor
    save, and with a critic (`critic`, or a `_critic` folder) the newest step both halves
    saved. Each half loads the tag its own `latest` names (trainer/ray/ppo_actor.py 573-576,
    ppo_critic.py 241-244), and the step, episode and data position come from the actor's
    (ppo_trainer.py `init_checkpoint_states` 429-441): halves at different steps would
    resume a critic that does not match its actor."""
    root = state / "openrlhf-checkpoints"
    actor = deepspeed_saves(root / "_actor")
    if critic or (root / "_critic").is_dir():
        steps = set(actor) & set(deepspeed_saves(root / "_critic"))
    else:
        steps = set(actor)
    if not steps:
        return None
    n = max(steps)
    return Checkpoint(root / "_actor" / actor[n], n)


def _openrlhf_resume_point(state: Path, ckpt: Checkpoint | None) -> None:
    """Make the folder say what the attempt resumes from. With a checkpoint: each half's
    `latest` names its tag (DeepSpeed loads the tag `latest` names), rewritten where it
    named a later save of one half alone. Without one: what an earlier attempt left (a save
    cut before its `latest`, which `load_ckpt` would return as `(None, {})` and `fit` fail on
    with KeyError 'episode', ppo_trainer.py 503) is moved to `openrlhf-checkpoints.cut`,
    replacing an earlier such folder, so that the fresh start saves into an empty one."""
    from rlbatch.core.runlog import atomic_write_text

    root = state / "openrlhf-checkpoints"
    if ckpt is None:
        if root.exists():
            aside = state / "openrlhf-checkpoints.cut"
            shutil.rmtree(aside, ignore_errors=True)
            root.rename(aside)
        return
    for half in ("_actor", "_critic"):
        tag = deepspeed_saves(root / half).get(ckpt.step)
        if tag is not None and (root / half / "latest").read_text().strip() != tag:
            atomic_write_text(root / half / "latest", tag)


def _openrlhf(spec: TrialSpec, attempt: Path, state: Path, base: list[str]) -> Launch:
    s, _ = plan_settings(spec)
    ckpt = openrlhf_checkpoint(state, critic=spec.critic_lr is not None)
    _openrlhf_resume_point(state, ckpt)
    s.update({"--train.max_epochs": spec.epochs, "--train.seed": spec.seed,
              "--train.num_episodes": 1,
              # no step limit exists: the prompts of one episode bound the run
              "--data.max_samples": spec.total_steps * spec.prompts,
              "--eval.steps": spec.steps(spec.eval_every_samples),
              "--ckpt.save_steps": spec.steps(spec.checkpoint_every_samples),
              "--ckpt.path": str(state / "openrlhf-checkpoints"),
              # the final model: by default ./ckpt, relative and shared by every trial
              # (cli/train_ppo_ray.py 191, 371)
              "--ckpt.output_dir": str(state / "openrlhf-model"),
              # no full "best" checkpoint after each improving evaluation (ppo_trainer.py
              # save_best_checkpoint, 3c3be62): its write would count as training time
              "--ckpt.best_metric_key": "none",
              "--logger.tensorboard_dir": str(attempt / "tensorboard"),
              # the TensorBoard subfolder is the run name, by default a timestamp
              "--logger.wandb.run_name": "trial"})
    stale = stale_settings(spec, base)
    s.update(stale)
    argv = [w for k, v in s.items() if k != OPENRLHF_ASYNC for w in (k, fmt(v))]
    if stale:  # a bare flag (store_true)
        argv.append(OPENRLHF_ASYNC)
    if ckpt is not None:  # a fresh attempt loads nothing (a cut save fails every load)
        argv.append("--ckpt.load_enable")
        s["--ckpt.load_enable"] = True
    return Launch(argv, {}, attempt / "tensorboard", shared=False, resume=ckpt, settings=s,
                  fresh=ckpt is None)


# ---------------------------------------------------------------- prime-rl (`rl` flags)
def prime_rl_checkpoint(state: Path) -> Checkpoint | None:
    """The newest complete `checkpoints/step_N` of the trial's prime-rl run folder: both
    halves written. prime-rl 559b447: the orchestrator writes `step_N/orchestrator/
    progress.pt` (atomically) when it ships batch N, the trainer `step_N/trainer` only after
    training step N, with torch DCP, whose `.metadata` is written last (src/prime_rl/
    orchestrator/ckpt.py, trainer/ckpt.py `save_to_path`); a kill between the two leaves a
    step_N the trainer cannot load."""
    steps = [(int(m.group(1)), p) for p in (state / "prime-rl" / "trial" / "checkpoints")
             .glob("step_*") if (m := re.fullmatch(r"step_(\d+)", p.name))
             and (p / "trainer" / ".metadata").is_file()
             and (p / "orchestrator" / "progress.pt").is_file()]
    if not steps:
        return None
    n, path = max(steps)
    return Checkpoint(path, n)


def _prime_rl(spec: TrialSpec, attempt: Path, state: Path, base: list[str]) -> Launch:
    """prime-rl appends both its trainer's and its orchestrator's rows to one
    metrics.jsonl in the run folder, which a resumed run keeps: one log for every
    attempt (re-logged steps replace the earlier rows, as `rlbatch ingest` reads them).
    A resumed attempt names its checkpoint (`--resume.step N`, the newest complete one; a
    bare `--resume` takes the newest folder, complete or not); a fresh one passes `--clean`,
    since prime-rl refuses a run folder holding an earlier attempt's files
    (utils/pathing.py, FileExistsError). Two checkpoints are kept (`--ckpt.keep-last`).
    The seed and C go to vLLM only when the user's run starts its own inference server: an
    `--inference...` word would create one for a user who runs it apart
    (usercmd.prime_rl_has_inference)."""
    plan, _ = plan_settings(spec)
    ckpt = prime_rl_checkpoint(state)
    s = {**plan, "output_dir": str(state / "prime-rl"), "run.name": "trial",
         "max_steps": spec.total_steps, "ckpt.interval": spec.steps(spec.checkpoint_every_samples),
         "ckpt.keep_last": KEEP_CHECKPOINTS,
         "orchestrator.eval.interval": spec.steps(spec.eval_every_samples),
         **stale_settings(spec, base)}
    if prime_rl_has_inference(base, spec.workdir or "."):
        s.update({"inference.vllm.seed": spec.seed,
                  "inference.vllm.max_num_seqs": spec.concurrency})
    argv = [w for k, v in s.items() for w in (f"--{k.replace('_', '-')}", fmt(v))]
    argv += ["--ckpt"] + (["--resume.step", str(ckpt.step)] if ckpt is not None else ["--clean"])
    log = state / "prime-rl" / "trial" / "metrics.jsonl"
    return Launch(argv, {}, log, shared=True, resume=ckpt, settings=s, fresh=ckpt is None)


# Frameworks whose command starts its own processes on the GPUs (Ray actors, torchrun ranks,
# vLLM servers), each of which sets its threads itself when OMP_NUM_THREADS is unset: Ray to
# the CPUs it assigned the actor (Ray 2.60, _private/utils.py `set_omp_num_threads_if_unset`
# 235-272), torchrun to 1 per rank (torch 2.13, distributed/run.py 872-884). A value passed
# down would override every one of them with rlbatch's share of one machine.
OWN_THREADS = ("verl", "openrlhf", "prime-rl")


def trial_threads(spec: TrialSpec, share: str | None) -> dict[str, str | None]:
    """OMP_NUM_THREADS for the command of a profile's trial from rlbatch's thread share
    (`RLBATCH_THREADS`: the machine's cores over concurrent trials locally, --trial-cpus on
    Ray): for TRL divided among its `command.num_processes` ranks (at least 1 each), for
    `rlbatch train` the share itself; for the frameworks that set their processes' threads
    themselves (OWN_THREADS), None: unset, also where it was inherited (a Ray task's worker
    has it set to its CPUs). `command.env` gives the command its own value instead."""
    if not share:
        return {}
    if spec.framework in OWN_THREADS:
        return {"OMP_NUM_THREADS": None}
    ranks = spec.num_processes if spec.framework == "trl" else 1
    return {"OMP_NUM_THREADS": str(max(1, int(share) // max(1, ranks)))}


ADAPTERS = {"trl": _trl, "verl": _verl, "openrlhf": _openrlhf, "prime-rl": _prime_rl,
            "rlbatch": _rlbatch}


def launch(spec: TrialSpec, base_argv: list[str], attempt: Path, state: Path,
           reached: int | None = None) -> Launch:
    """The attempt's command: `base_argv` followed by the trial's overrides. `attempt` is
    this attempt's own folder, `state` the trial's folder kept across attempts (checkpoints,
    a shared log). Both are made absolute: the command runs in `command.workdir`, where a
    relative path would name another folder than the one rlbatch follows. `reached`: the
    last step the earlier attempts' rows hold, which a verl attempt resumes at or below
    (`verl_checkpoint`; the other frameworks log a step before or as they save it)."""
    attempt, state = Path(attempt).absolute(), Path(state).absolute()
    adapter = ADAPTERS.get(spec.framework)
    if adapter is None:
        raise ConfigError(f"command.framework: '{spec.framework}' cannot be launched; use one "
                          f"of {', '.join(sorted(ADAPTERS))}")
    kw = {"reached": reached} if spec.framework == "verl" else {}
    out = adapter(spec, attempt, state, list(base_argv), **kw)
    out.argv = [*base_argv, *out.argv]
    return out
