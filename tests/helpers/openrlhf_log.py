"""OpenRLHF's TensorBoard log as its PPO trainer writes it, one attempt per call, with the
wall times of each event, so that a test can check which seconds rlbatch counts.

Follows OpenRLHF/OpenRLHF at 3c3be623 (v0.11.x):
- the writer opens when the driver creates the trainer actor (openrlhf/cli/train_ppo_ray.py
  151; `BasePPOTrainer.__init__`, openrlhf/trainer/ppo_trainer.py 190), before the actor,
  reference and critic load their weights (train_ppo_ray.py 173-186): start-up passes with
  no event after the writer's file is opened;
- a resumed attempt broadcasts the checkpoint's weights to vLLM before its first step
  (ppo_trainer.py 510-511) and continues at the checkpoint's step + 1;
- each step logs every status key as `train/<key>` at the global step (`log_train`, called
  by `save_logs_and_checkpoints`, 383-389), including `timing/make_experience`,
  `timing/ppo_train`, `timing/broadcast` (`train_step`, 256-258), `timing/generation` and
  `timing/step_total`, their sum (`fit`, 540-541);
- then, every `ckpt.save_steps`, a checkpoint save (393-409), untimed;
- then, when `global_step % eval.steps == 0`, an evaluation whose `eval/<key>` are logged
  when it ends (559, `evaluate` 578-589), followed by a "best" checkpoint save when the
  metric improved and `ckpt.best_metric_key` is not "none" (`save_best_checkpoint`, 337).

rlbatch gives every attempt its own `--logger.tensorboard_dir`, so each attempt is one
folder. Tags and step numbers are OpenRLHF's; the values are a known curve.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

PHASES = {"generation": 2.0, "make_experience": 1.0, "ppo_train": 3.0, "broadcast": 0.5}
STEP_S = sum(PHASES.values())  # timing/step_total of every step


@dataclass
class Attempt:
    opened: float  # wall time the writer opened
    first_step: int = 1
    last_step: int = 6
    startup_s: float = 40.0  # model load and DeepSpeed init, after the writer opened
    save_every: int = 2
    save_s: float = 5.0
    eval_every: int = 2
    eval_s: float = 3.0
    best_s: float | None = 4.0  # None: best checkpoints off (`--ckpt.best_metric_key none`)
    killed_after_train: bool = False  # killed right after the last step's train/* events,
    # inside its checkpoint save or evaluation (nothing after them is written)


def accuracy(step: int) -> float:
    return 0.1 * step


def events(a: Attempt) -> list[tuple[str, float, int, float]]:
    """(tag, value, step, wall time) in the order OpenRLHF logs them."""
    out = []
    wall = a.opened + a.startup_s + (PHASES["broadcast"] if a.first_step > 1 else 0.0)
    best = accuracy(a.first_step - 1) if a.first_step > 1 else float("-inf")
    for step in range(a.first_step, a.last_step + 1):
        wall += STEP_S
        out += [(f"train/timing/{k}", v, step, wall) for k, v in PHASES.items()]
        out += [("train/timing/step_total", STEP_S, step, wall),
                ("train/reward", accuracy(step), step, wall),
                ("train/policy_loss", 0.1, step, wall), ("train/actor_lr", 1e-6, step, wall)]
        if a.killed_after_train and step == a.last_step:
            break
        if step % a.save_every == 0:
            wall += a.save_s
        if step % a.eval_every == 0:
            wall += a.eval_s
            out.append(("eval/eval_math_pass1", accuracy(step), step, wall))
            if a.best_s is not None and accuracy(step) > best:
                best = accuracy(step)
                wall += a.best_s
    return out


def write(folder: Path, a: Attempt) -> Path:
    """The attempt's TensorBoard folder, written with torch's SummaryWriter (the writer
    OpenRLHF uses) at the attempt's wall times."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
    spec = importlib.util.spec_from_file_location("make_tb", fixtures / "make_tb_fixtures.py")
    make_tb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_tb)
    make_tb._write(folder, a.opened, events(a))
    return folder
