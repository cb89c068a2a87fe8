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
from dataclasses import dataclass, field
from pathlib import Path

from rlbatch.core.errors import ConfigError
from rlbatch.interop.ingest.common import FrameworkConfig
from rlbatch.interop.plan import make_plan

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


def _trl(spec: TrialSpec, attempt: Path, state: Path) -> Launch:
    s, _ = plan_settings(spec)
    k = s["steps_per_generation"] * spec.epochs / s["gradient_accumulation_steps"]
    if k != int(k):
        raise ConfigError(f"command: TRL would take {k:g} optimizer steps per generation; "
                          f"choose command.per_device_batch so that it is whole")
    k = int(k)
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
def _rlbatch(spec: TrialSpec, attempt: Path, state: Path) -> Launch:
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
    s.update(dict(spec.sets))
    argv = [w for name, v in s.items() for w in ("--set", f"{name}={fmt(v)}")]
    argv += ["--out", str(state / "rlbatch-runs"), "--resume", "--json"]
    return Launch(argv, {}, state / "rlbatch-runs", shared=True, resume=None, settings=s)


# ---------------------------------------------------------------- verl (Hydra overrides)
def verl_checkpoint(state: Path) -> Checkpoint | None:
    """The checkpoint verl resumes from under `resume_mode=auto`: the one that
    `latest_checkpointed_iteration.txt` names (written after the checkpoint itself)."""
    root = state / "verl-checkpoints"
    try:
        n = int((root / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None
    path = root / f"global_step_{n}"
    return Checkpoint(path, n) if path.is_dir() else None


def _verl(spec: TrialSpec, attempt: Path, state: Path) -> Launch:
    s, _ = plan_settings(spec)
    log = attempt / "verl.jsonl"  # verl's file logger truncates its file: one per attempt
    ckpt = verl_checkpoint(state)
    s.update({"actor_rollout_ref.actor.ppo_epochs": spec.epochs, "data.seed": spec.seed,
              "actor_rollout_ref.rollout.seed": spec.seed,
              "actor_rollout_ref.rollout.max_num_seqs": spec.concurrency,
              "trainer.logger": "[console,file]",
              "trainer.test_freq": spec.steps(spec.eval_every_samples),
              "trainer.save_freq": spec.steps(spec.checkpoint_every_samples),
              "trainer.total_training_steps": spec.total_steps,
              "trainer.default_local_dir": str(state / "verl-checkpoints"),
              # verl keeps every checkpoint by default (null, trainer/config/ppo_trainer.yaml)
              "trainer.max_actor_ckpt_to_keep": KEEP_CHECKPOINTS,
              "trainer.max_critic_ckpt_to_keep": KEEP_CHECKPOINTS,
              "trainer.resume_mode": "auto",
              # a resumed run validates at its checkpoint step again, which the first did
              "trainer.val_before_train": ckpt is None,
              # the file logger runs in a Ray actor: its path travels in the runtime env too
              "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": str(log)})
    if spec.critic_lr is not None:
        s["critic.ppo_epochs"] = spec.epochs
    argv = [f"{k}={fmt(v)}" for k, v in s.items()]
    return Launch(argv, {"VERL_FILE_LOGGER_PATH": str(log)}, log, shared=False, resume=ckpt,
                  settings=s, fresh=ckpt is None)


# ---------------------------------------------------------------- OpenRLHF (dotted flags)
def openrlhf_checkpoint(state: Path) -> Checkpoint | None:
    """The actor checkpoint OpenRLHF resumes from with --ckpt.load_enable: the tag that
    DeepSpeed's `latest` file names (`global_step<N>` or `best_global_step<N>`)."""
    root = state / "openrlhf-checkpoints" / "_actor"
    try:
        tag = (root / "latest").read_text().strip()
    except OSError:
        return None
    m = re.fullmatch(r"(?:best_)?global_step(\d+)", tag)
    return Checkpoint(root / tag, int(m.group(1))) if m and (root / tag).is_dir() else None


def _openrlhf(spec: TrialSpec, attempt: Path, state: Path) -> Launch:
    s, _ = plan_settings(spec)
    ckpt = openrlhf_checkpoint(state)
    s.update({"--train.max_epochs": spec.epochs, "--train.seed": spec.seed,
              "--train.num_episodes": 1,
              # no step limit exists: the prompts of one episode bound the run
              "--data.max_samples": spec.total_steps * spec.prompts,
              "--eval.steps": spec.steps(spec.eval_every_samples),
              "--ckpt.save_steps": spec.steps(spec.checkpoint_every_samples),
              "--ckpt.path": str(state / "openrlhf-checkpoints"),
              # no full "best" checkpoint after each improving evaluation (ppo_trainer.py
              # save_best_checkpoint, 3c3be62): its write would count as training time
              "--ckpt.best_metric_key": "none",
              "--logger.tensorboard_dir": str(attempt / "tensorboard"),
              # the TensorBoard subfolder is the run name, by default a timestamp
              "--logger.wandb.run_name": "trial"})
    argv = [w for k, v in s.items() for w in (k, fmt(v))] + ["--ckpt.load_enable"]
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


def _prime_rl(spec: TrialSpec, attempt: Path, state: Path) -> Launch:
    """prime-rl appends both its trainer's and its orchestrator's rows to one
    metrics.jsonl in the run folder, which a resumed run keeps: one log for every
    attempt (re-logged steps replace the earlier rows, as `rlbatch ingest` reads them).
    A resumed attempt names its checkpoint (`--resume.step N`, the newest complete one; a
    bare `--resume` takes the newest folder, complete or not); a fresh one passes `--clean`,
    since prime-rl refuses a run folder holding an earlier attempt's files
    (utils/pathing.py, FileExistsError). Two checkpoints are kept (`--ckpt.keep-last`)."""
    plan, _ = plan_settings(spec)
    ckpt = prime_rl_checkpoint(state)
    s = {**plan, "output_dir": str(state / "prime-rl"), "run.name": "trial",
         "max_steps": spec.total_steps, "ckpt.interval": spec.steps(spec.checkpoint_every_samples),
         "ckpt.keep_last": KEEP_CHECKPOINTS,
         "orchestrator.eval.interval": spec.steps(spec.eval_every_samples),
         "inference.vllm.seed": spec.seed, "inference.vllm.max_num_seqs": spec.concurrency}
    argv = [w for k, v in s.items() for w in (f"--{k.replace('_', '-')}", fmt(v))]
    argv += ["--ckpt"] + (["--resume.step", str(ckpt.step)] if ckpt is not None else ["--clean"])
    log = state / "prime-rl" / "trial" / "metrics.jsonl"
    return Launch(argv, {}, log, shared=True, resume=ckpt, settings=s, fresh=ckpt is None)


ADAPTERS = {"trl": _trl, "verl": _verl, "openrlhf": _openrlhf, "prime-rl": _prime_rl,
            "rlbatch": _rlbatch}


def launch(spec: TrialSpec, base_argv: list[str], attempt: Path, state: Path) -> Launch:
    """The attempt's command: `base_argv` followed by the trial's overrides. `attempt` is
    this attempt's own folder, `state` the trial's folder kept across attempts (checkpoints,
    a shared log). Both are made absolute: the command runs in `command.workdir`, where a
    relative path would name another folder than the one rlbatch follows."""
    attempt, state = Path(attempt).absolute(), Path(state).absolute()
    adapter = ADAPTERS.get(spec.framework)
    if adapter is None:
        raise ConfigError(f"command.framework: '{spec.framework}' cannot be launched; use one "
                          f"of {', '.join(sorted(ADAPTERS))}")
    out = adapter(spec, attempt, state)
    out.argv = [*base_argv, *out.argv]
    return out
