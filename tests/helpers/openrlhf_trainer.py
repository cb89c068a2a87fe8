"""A stand-in for OpenRLHF's `train_ppo_ray` as a command (tests/test_lifecycle.py): it trains
nothing, takes the dotted flags rlbatch appends for OpenRLHF (`interop/launch.py`
`_openrlhf`) and lives OpenRLHF's lifecycle from process start to exit, following
OpenRLHF/OpenRLHF at 3c3be62 (the facts of tests/helpers/openrlhf_log.py):

- the PPO trainer actor is created first (openrlhf/cli/train_ppo_ray.py 151), and its
  `TensorboardLogger` opens a torch `SummaryWriter` at `<logger.tensorboard_dir>/
  <logger.wandb.run_name>` (openrlhf/trainer/ppo_trainer.py 190, openrlhf/utils/
  logging_utils.py 112-119): the event file exists, with no scalar, while the models load
  (train_ppo_ray.py 173-186; here OPENRLHF_STANDIN_STARTUP_S). The stand-in calls that
  `TensorboardLogger` itself (`log_train`, `log_eval`, `close`), from the openrlhf wheel;
- with `--ckpt.load_enable` and `<ckpt.path>/_actor` present, the actor loads the checkpoint
  DeepSpeed's `latest` names (openrlhf/trainer/ray/ppo_actor.py 572-577); without `latest`,
  `load_ckpt` returns `(None, {})` (openrlhf/utils/deepspeed/deepspeed.py 760-782) and `fit`
  raises `KeyError: 'episode'` (ppo_trainer.py 429-436, 497-500);
- the prompts are the train set cut at `--data.max_samples`, one pass per
  `--train.num_episodes`, P a step; the run ends when they are used up (ppo_trainer.py
  516-569); a resumed run continues after the checkpoint's consumed prompts (504-511);
- each step logs `train/<key>` for its status, `timing/*` and `timing/step_total` their sum
  included (`fit` 538-541, `log_train` 383-389); then every `ckpt.save_steps` a save: the
  `_actor` folder (deepspeed.py 695-696), the tag's files, DeepSpeed's `latest` last
  (`model.save_checkpoint`, deepspeed.py 750); then every `eval.steps` an evaluation whose
  `eval/<key>` are logged when it ends (ppo_trainer.py 559-562, `evaluate` 578-589), when
  an evaluation set is given (`--eval.dataset`); after the last step, the final model goes
  to `--ckpt.output_dir`, `./ckpt` by default (train_ppo_ray.py 191, 371).

With `--train.async_enable` (OpenRLHF's PPOTrainerAsync, train_ppo_ray.py 145-148 of the
0.11.2 wheel), a `--train.async_queue_size` below 1 raises as OpenRLHF does
(ppo_trainer_async.py 287-289), and each batch's generation overlaps the previous step's
training: the generator decodes the next batch as soon as the trainer takes one (the slot
tokens, ppo_trainer_async.py 109-136, 227-230), so a step lasts the longer of its
generation and the rest, and `timing/step_total` is that wall time, `timing/generation`
the generation's own (ppo_trainer_async.py 234-237).

The learning is a known curve in samples: the evaluation after step s reads
`eval/eval_math_pass1` = 0.1 + OPENRLHF_STANDIN_GAIN x s x P x G / 1000. A step takes
OPENRLHF_STANDIN_SAMPLE_S x P x G seconds, split among the phases in openrlhf_log's
proportions. Behaviour from the environment:

- OPENRLHF_STANDIN_STARTUP_S (0.5), OPENRLHF_STANDIN_SAMPLE_S (0.0005), OPENRLHF_STANDIN_GAIN
  (0.25 per 1,000 samples), OPENRLHF_STANDIN_SAVE_S and OPENRLHF_STANDIN_EVAL_S (seconds per
  save and per evaluation, 0), OPENRLHF_STANDIN_PROMPTS (prompts in the train set, 10**6);
- OPENRLHF_STANDIN_KILL_IN_SAVE_AT: SIGKILL itself inside step N's save, after `_actor/
  global_stepN` holds its model file and before `latest` is written;
- OPENRLHF_STANDIN_ONCE: a file; the kill applies only while it does not exist (the kill
  creates it).

It prints `stand-in openrlhf: opened <event file> at <time>` and `... first step at <time>`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from openrlhf_log import PHASES, STEP_S


def _args(argv: list[str]) -> dict:
    """`--a.b value` as {"a.b": "value"}; a bare flag as True."""
    out: dict = {}
    i = 0
    while i < len(argv):
        if argv[i].startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[argv[i][2:]], i = argv[i + 1], i + 2
                continue
            out[argv[i][2:]] = True
        i += 1
    return out


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def checkpoint_states(a: dict, ckpt: Path) -> dict:
    """ppo_actor.py 572-577 and ppo_trainer.py 487-500: the client states of the tag that
    `_actor/latest` names; {} when `_actor` exists without `latest`; a fresh start's states
    when nothing is loaded."""
    actor = ckpt / "_actor"
    if not (a.get("ckpt.load_enable") and actor.exists()):
        return {"episode": 0, "global_step": 0, "total_consumed_prompts": 0}
    try:
        tag = (actor / "latest").read_text().strip()
    except OSError:
        print(f"Warning: [deepspeed] No checkpoint found at {actor}, skipping checkpoint "
              "loading.", flush=True)
        return {}
    return json.loads((actor / tag / "client_state.json").read_text())


def save(ckpt: Path, step: int, states: dict) -> None:
    """deepspeed.py 695-756: `_actor`, then the tag's files, then `latest` (DeepSpeed writes
    it after the checkpoint), then the metric file."""
    actor = ckpt / "_actor"
    actor.mkdir(parents=True, exist_ok=True)
    tag = actor / f"global_step{step}"
    tag.mkdir(exist_ok=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"\0" * 64)
    time.sleep(_env("OPENRLHF_STANDIN_SAVE_S", 0))
    once = os.environ.get("OPENRLHF_STANDIN_ONCE")
    if step == int(_env("OPENRLHF_STANDIN_KILL_IN_SAVE_AT", 0)) and not (
            once and Path(once).exists()):
        if once:
            Path(once).write_text(f"killed inside the save of step {step}")
        os.kill(os.getpid(), signal.SIGKILL)
    (tag / "client_state.json").write_text(json.dumps(states))
    (actor / "latest").write_text(tag.name)


def fit(a: dict, writer, states: dict) -> None:
    """ppo_trainer.py `fit` 495-569: steps until the prompts of every episode are used up,
    each logged, then saved and evaluated at their cadences."""
    p, g = int(a["rollout.batch_size"]), int(a["rollout.n_samples_per_prompt"])
    ckpt = Path(a["ckpt.path"])
    start, step = states["episode"], states["global_step"]  # KeyError, as fit raises it
    consumed = states["total_consumed_prompts"]
    prompts = min(int(_env("OPENRLHF_STANDIN_PROMPTS", 10 ** 6)),
                  int(a.get("data.max_samples", 10 ** 9)))
    per_episode = prompts // p
    step_s = _env("OPENRLHF_STANDIN_SAMPLE_S", 0.0005) * p * g
    overlap = bool(a.get("train.async_enable"))
    if overlap and int(a.get("train.async_queue_size", 1)) <= 0:
        raise ValueError(f"async_queue_size must be positive, got {a['train.async_queue_size']}")
    if step:
        time.sleep(step_s * PHASES["broadcast"] / STEP_S)  # the checkpoint's weights to vLLM
    gain = _env("OPENRLHF_STANDIN_GAIN", 0.25)
    print(f"stand-in openrlhf: {per_episode} steps an episode of {p} x {g}", flush=True)
    for episode in range(start, int(a.get("train.num_episodes", 1))):
        while consumed < (episode + 1) * per_episode * p:
            status = {f"timing/{k}": v / STEP_S * step_s for k, v in PHASES.items()}
            wall = sum(status.values())
            if overlap:  # the generation runs beside the previous step's training
                wall = max(status["timing/generation"], wall - status["timing/generation"])
            time.sleep(wall)
            step, consumed = step + 1, consumed + p
            status["timing/step_total"] = wall
            status |= {"reward": 0.1 + gain * step * p * g / 1000, "policy_loss": 0.1,
                       "actor_lr": float(a.get("actor.adam.lr", 1e-6))}
            if step == states["global_step"] + 1:
                print(f"stand-in openrlhf: first step at {time.time():.3f}", flush=True)
            writer.log_train(step, status)
            if step % int(a.get("ckpt.save_steps", 10 ** 9)) == 0:
                save(ckpt, step, {"episode": episode, "global_step": step,
                                  "total_consumed_prompts": consumed})
            if a.get("eval.dataset") and step % int(a.get("eval.steps", 10 ** 9)) == 0:
                time.sleep(_env("OPENRLHF_STANDIN_EVAL_S", 0))
                writer.log_eval(step, {"eval_math_pass1":
                                       round(min(1.0, 0.1 + gain * step * p * g / 1000), 6)})


def _logger_args(a: dict) -> SimpleNamespace:
    """The `args.logger` fields OpenRLHF's TensorboardLogger reads (logging_utils.py
    112-119), from the dotted flags."""
    wandb = SimpleNamespace(run_name=a.get("logger.wandb.run_name", "run"))
    return SimpleNamespace(logger=SimpleNamespace(tensorboard_dir=a["logger.tensorboard_dir"],
                                                  wandb=wandb))


def main(argv: list[str]) -> int:
    # OpenRLHF's own logger (the openrlhf 0.11.2 wheel `make setup` installs without its GPU
    # dependencies): it opens the SummaryWriter and writes `train/<key>` and `eval/<key>`
    from openrlhf.utils.logging_utils import TensorboardLogger

    a = _args(argv)
    args = _logger_args(a)
    folder = Path(args.logger.tensorboard_dir) / args.logger.wandb.run_name
    writer = TensorboardLogger(args)
    event = max(folder.glob("events.out.tfevents.*"), key=lambda f: f.stat().st_mtime_ns)
    print(f"stand-in openrlhf: opened {event} at {time.time():.3f}", flush=True)
    time.sleep(_env("OPENRLHF_STANDIN_STARTUP_S", 0.5))  # the models load
    fit(a, writer, checkpoint_states(a, Path(a["ckpt.path"])))
    writer.close()
    # the final model (train_ppo_ray.py 191, ppo_actor.py 607-616): --ckpt.output_dir,
    # by default ./ckpt where the command runs
    out = Path(a.get("ckpt.output_dir", "./ckpt"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.safetensors").write_bytes(b"\0" * 64)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
