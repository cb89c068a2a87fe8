"""A stand-in training command for the tests of rlbatch's process control (tests/test_command.py):
it trains nothing, and writes lines in the format of verl's file logger
(`{"step": N, "data": {...}}`, to $VERL_FILE_LOGGER_PATH) with the Hydra overrides rlbatch
appends for verl, so that following, stopping, failing and resuming can be tested without a
GPU. It is not verl: the real third-party trainer of these tests is TRL's `trl grpo`.

It reads `data.train_batch_size`, `actor_rollout_ref.rollout.n`, `trainer.total_training_steps`,
`trainer.test_freq`, `trainer.save_freq` and `trainer.default_local_dir` from its arguments,
"checkpoints" inside the step, before logging it, by writing a `global_step_N` folder and
then `latest_checkpointed_iteration.txt` there (`_save`), and resumes from the checkpoint
the tracker names as verl's `resume_mode=auto` does (first step N + 1), or the one
`resume_mode=resume_path` names (`disable`: from step 1). The reward of step s is s / total (a rising curve; validation logs it as `val-core/x/reward/mean@1`).
Behaviour from the environment:

- LOG_WRITER_STEP_S: seconds per step (default 0.05);
- LOG_WRITER_CRASH_AT: raise at this step (after logging the one before);
- LOG_WRITER_HANG_AT: stop logging at this step and sleep;
- LOG_WRITER_PIDS: a folder to write this process's PID (and a child's) into;
- LOG_WRITER_CHILD: start a child process that sleeps (it must die with the group);
- LOG_WRITER_TRAP_TERM: ignore SIGTERM, as a trainer that traps it and carries on;
- LOG_WRITER_BAD_LINE_AT: before this step (after a pause in which the follower reads what
  was written), write a line that is not JSON, then go on;
- LOG_WRITER_KILL_IN_SAVE_AT: SIGKILL itself inside this step's checkpoint save, after the
  `global_step_N` folder and before the tracker file (`_save`);
- LOG_WRITER_CRASH_ONCE: a file; LOG_WRITER_CRASH_AT, LOG_WRITER_BAD_LINE_AT and
  LOG_WRITER_KILL_IN_SAVE_AT apply only while it does not exist (the fault creates it), so
  the next attempt runs through;
- LOG_WRITER_RESTART_IF: a file; when it exists, the checkpoint is ignored and training
  starts again from step 1 (a checkpoint that cannot be loaded, or resume turned off);
- LOG_WRITER_ROTATE_AT: before this step, move the log to `<log>.1` and start a new one;
- LOG_WRITER_TRUNCATE_AT: before this step, truncate the log to nothing and write on;
- LOG_WRITER_DELETE_AT: before this step, delete the log and write on into the deleted file;
- LOG_WRITER_NAN_FROM: from this step on, log the loss and gradient norm as NaN (Python's
  json spells them `NaN`, as verl's file logger did before it wrote orjson, which writes
  them as null; both read as "measured, not finite"), as a diverged update does;
- LOG_WRITER_RENAME_AT: from this step on, log validation under another name
  (`val-core/x/reward/mean@1` becomes `val-core/x/score@1`), as a renamed reward does;
- LOG_WRITER_CORRUPT_CKPT: a file; when it exists, resuming from a checkpoint fails at
  load (exit status 1, before any step is logged), as an unreadable checkpoint does;
- LOG_WRITER_OUTPUT_BYTES: print this many bytes of output per step (a chatty trainer);
- LOG_WRITER_SEED_JITTER: log each step's time as LOG_WRITER_STEP_S times exp(j x u), u in
  [-1, 1] fixed by `data.seed` (seeds of one configuration then differ in time to target,
  the same seed alike at every B), j the value given;
- LOG_WRITER_SAVE_S: each checkpoint save takes this long and is timed as verl times it,
  inside the step (`timing_s/save_checkpoint`, also counted in that step's `timing_s/step`:
  verl-project/verl 1dda039, verl/trainer/ppo/ray_trainer.py, `marked_timer("step")` at
  1508 encloses `marked_timer("save_checkpoint")` at 1711);
- LOG_WRITER_STARTUP_S: seconds between opening the log and the first step, the file
  existing empty meanwhile (verl opens its file logger when `fit` creates `Tracking`, before
  the validation before training and the first step: verl/trainer/ppo/v1/trainer_base.py
  398-403, verl/utils/tracking.py 419-431, at 1dda039); it prints `stand-in trainer:
  opened <log> at <time>` and `... first step line at <time>`;
- LOG_WRITER_VALIDATE_S: V1's order at a step that validates: the step (its save inside it),
  then the validation, which takes this long and is timed outside the step
  (`timing_s/testing`), then the step's line (trainer_base.py 449-490);
- LOG_WRITER_KILL_IN_VALIDATE_AT: SIGKILL itself during the validation of this step, after
  the step's checkpoint was saved and before its line (LOG_WRITER_CRASH_ONCE applies);
- LOG_WRITER_LATE_EVAL, LOG_WRITER_STRAY, LOG_WRITER_JUMP (each "S:T"): after step S's
  line, one more line: an evaluation-only line for step T (a logger flushing an evaluation
  from another thread), a whole step line for step T (5 s, reward 0: a stray line), a step
  line for step T far ahead (a writer outside the trainer);
- LOG_WRITER_BAD_AFTER: right after this step's line, with no pause, a line that is not
  JSON (LOG_WRITER_CRASH_ONCE applies);
- LOG_WRITER_TEXT_EVAL_FROM: from this step on, validation logged as a JSON string
  (`"0.1875"`, a formatting logger's);
- LOG_WRITER_FAULT_P: the faults above apply only to the trial whose
  `data.train_batch_size` is this (the other trials of a profile run clean);
- LOG_WRITER_VERL_LOGGER: write the step lines with verl's own `FileLogger` instead of
  this module's copy of its format (`_verl_file_logger`);
- LOG_WRITER_DAEMON: leave a daemon behind (LOG_WRITER_PIDS/daemon.pid): it forks away from
  a helper that exits, calls `setsid` and has an empty environment, so it is neither in the
  command's process group nor marked with its token.
"""


from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

DAEMON = ("import os, sys, time\n"
          "if os.fork() == 0:\n"
          "    os.setsid()\n"
          "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
          "    time.sleep(3600)\n")


FAULTS = ("LOG_WRITER_CRASH_AT", "LOG_WRITER_BAD_LINE_AT", "LOG_WRITER_BAD_AFTER",
          "LOG_WRITER_DELETE_AT", "LOG_WRITER_LATE_EVAL", "LOG_WRITER_STRAY",
          "LOG_WRITER_JUMP", "LOG_WRITER_TEXT_EVAL_FROM", "LOG_WRITER_KILL_IN_SAVE_AT",
          "LOG_WRITER_KILL_IN_VALIDATE_AT", "LOG_WRITER_ROTATE_AT", "LOG_WRITER_TRUNCATE_AT",
          "LOG_WRITER_NAN_FROM", "LOG_WRITER_RENAME_AT")


def _extra_line(step: int, total: int) -> tuple[int, dict] | None:
    """The line LOG_WRITER_LATE_EVAL, _STRAY or _JUMP ("S:T") adds after step S's line."""
    for key in ("LOG_WRITER_LATE_EVAL", "LOG_WRITER_STRAY", "LOG_WRITER_JUMP"):
        at, _, target = os.environ.get(key, "").partition(":")
        if not at or int(at) != step:
            continue
        t = int(target)
        if key == "LOG_WRITER_LATE_EVAL":
            return t, {"val-core/x/reward/mean@1": t / total}
        return t, {"timing_s/step": 5.0 if key == "LOG_WRITER_STRAY" else 0.05,
                   "critic/score/mean": 0.0, "actor/lr": 1e-4, "actor/pg_loss": 0.0,
                   "actor/grad_norm": 1.0, "response_length/mean": 5.0}
    return None


def _verl_file_logger():
    """verl's own file logger (verl.utils.tracking.FileLogger, verl 0.9.1, installed by
    `make setup` without its GPU dependencies): it opens $VERL_FILE_LOGGER_PATH for writing
    when verl's `Tracking` is created and writes each `log(data, step)` call as one orjson
    line, NaN and inf as null (tracking.py 419-431 at 1dda039)."""
    from verl.utils.tracking import FileLogger

    return FileLogger("rlbatch", "trial")


def _args(argv: list[str]) -> dict:
    out = {}
    for word in argv:
        key, eq, value = word.partition("=")
        if eq:
            out[key.lstrip("+")] = value
    return out


def main(argv: list[str]) -> int:
    a = _args(argv)
    p, g = int(a["data.train_batch_size"]), int(a["actor_rollout_ref.rollout.n"])
    if os.environ.get("LOG_WRITER_FAULT_P", str(p)) != str(p):
        for key in FAULTS:
            os.environ.pop(key, None)
    total = int(a["trainer.total_training_steps"])
    test_freq, save_freq = int(a["trainer.test_freq"]), int(a["trainer.save_freq"])
    ckpt = Path(a["trainer.default_local_dir"])
    step_s = float(os.environ.get("LOG_WRITER_STEP_S", "0.05"))
    jitter = float(os.environ.get("LOG_WRITER_SEED_JITTER", "0"))
    u = random.Random(int(a.get("data.seed", "0"))).uniform(-1.0, 1.0)
    logged_s = step_s * math.exp(jitter * u)
    crash_at = int(os.environ.get("LOG_WRITER_CRASH_AT", "0"))
    hang_at = int(os.environ.get("LOG_WRITER_HANG_AT", "0"))
    if os.environ.get("LOG_WRITER_TRAP_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("LOG_WRITER_PIDS"):
        pids = Path(os.environ["LOG_WRITER_PIDS"])
        (pids / f"{os.getpid()}.pid").write_text(str(os.getpid()))
        if os.environ.get("LOG_WRITER_CHILD"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            (pids / f"{child.pid}.pid").write_text(str(child.pid))
        if os.environ.get("LOG_WRITER_DAEMON"):
            subprocess.run([sys.executable, "-c", DAEMON, str(pids / "daemon.pid")], env={},
                           check=True)
    bad_at = int(os.environ.get("LOG_WRITER_BAD_LINE_AT", "0"))
    bad_after = int(os.environ.get("LOG_WRITER_BAD_AFTER", "0"))
    once = os.environ.get("LOG_WRITER_CRASH_ONCE")
    kill_in_save_at = int(os.environ.get("LOG_WRITER_KILL_IN_SAVE_AT", "0"))
    kill_in_validate_at = int(os.environ.get("LOG_WRITER_KILL_IN_VALIDATE_AT", "0"))
    validate_s = float(os.environ.get("LOG_WRITER_VALIDATE_S", "0"))
    if once and Path(once).exists():
        crash_at = bad_at = bad_after = kill_in_save_at = kill_in_validate_at = 0
    try:
        start = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    except OSError:
        start = 0
    if a.get("trainer.resume_mode") == "disable":
        start = 0
    elif a.get("trainer.resume_mode") == "resume_path":  # trainer_base.py 806-817
        start = int(a["trainer.resume_from_path"].split("global_step_")[-1])
    restart_if = os.environ.get("LOG_WRITER_RESTART_IF")
    if restart_if and Path(restart_if).exists():
        start = 0
    corrupt = os.environ.get("LOG_WRITER_CORRUPT_CKPT")
    if start and corrupt and Path(corrupt).exists():
        raise RuntimeError(f"stand-in trainer: cannot load {ckpt / f'global_step_{start}'}")
    path = os.environ["VERL_FILE_LOGGER_PATH"]
    verl_logger = _verl_file_logger() if os.environ.get("LOG_WRITER_VERL_LOGGER") else None
    log = verl_logger.fp if verl_logger else open(path, "wb", buffering=0)  # noqa: SIM115
    rotate_at = int(os.environ.get("LOG_WRITER_ROTATE_AT", "0"))
    truncate_at = int(os.environ.get("LOG_WRITER_TRUNCATE_AT", "0"))
    delete_at = int(os.environ.get("LOG_WRITER_DELETE_AT", "0"))
    nan_from = int(os.environ.get("LOG_WRITER_NAN_FROM", "0"))
    rename_at = int(os.environ.get("LOG_WRITER_RENAME_AT", "0"))
    chatter = int(os.environ.get("LOG_WRITER_OUTPUT_BYTES", "0"))

    def write(step: int, data: dict) -> None:
        if verl_logger is not None:
            verl_logger.fp = log  # the file it writes to (a rotation opens a new one)
            verl_logger.log(data, step)
            return
        log.write((json.dumps({"step": step, "data": data}) + "\n").encode())

    startup_s = float(os.environ.get("LOG_WRITER_STARTUP_S", "0"))
    if startup_s:
        print(f"stand-in trainer: opened {path} at {time.time():.3f}", flush=True)
        time.sleep(startup_s)
    if a.get("trainer.val_before_train") == "true":
        write(start, {"val-core/x/reward/mean@1": start / total})
    print(f"stand-in trainer: steps {start + 1}..{total} of {p} x {g}", flush=True)
    for step in range(start + 1, total + 1):
        if step == crash_at:
            if once:
                Path(once).write_text("crashed")
            raise RuntimeError(f"stand-in trainer: crash at step {step}")
        if step == hang_at:
            time.sleep(3600)
        if step == bad_at:
            time.sleep(1.0)
            if once:
                Path(once).write_text("bad line")
            log.write(b"this is not a log line\n")
        if step in (rotate_at, truncate_at, delete_at):
            time.sleep(1.0)  # what was written is read before it goes
        if step == delete_at:
            os.unlink(path)
        if step == rotate_at:
            log.close()
            os.replace(path, path + ".1")
            log = open(path, "wb", buffering=0)  # noqa: SIM115
        if step == truncate_at:
            log.truncate(0)
            log.seek(0)
        time.sleep(step_s)
        data = {"timing_s/step": logged_s, "timing_s/gen": logged_s / 2,
                "response_length/mean": 5.0, "critic/score/mean": step / total,
                "actor/lr": 1e-4, "actor/pg_loss": 0.0, "actor/grad_norm": 1.0}
        if nan_from and step >= nan_from:
            data["actor/pg_loss"] = data["actor/grad_norm"] = float("nan")
        if step % test_freq == 0:
            renamed = rename_at and step >= rename_at
            data["val-core/x/score@1" if renamed else "val-core/x/reward/mean@1"] = step / total
        save_s = float(os.environ.get("LOG_WRITER_SAVE_S", "0"))
        if save_s and step % save_freq == 0:
            time.sleep(save_s)
            data["timing_s/save_checkpoint"] = save_s
            data["timing_s/step"] = logged_s + save_s
        if step % save_freq == 0:
            _save(ckpt, step, kill=step == kill_in_save_at, once=once)
        if (validate_s or kill_in_validate_at) and step % test_freq == 0:
            _validate(data, validate_s, kill=step == kill_in_validate_at, once=once)
        text_from = int(os.environ.get("LOG_WRITER_TEXT_EVAL_FROM", "0"))
        if text_from and step >= text_from and "val-core/x/reward/mean@1" in data:
            data["val-core/x/reward/mean@1"] = str(data["val-core/x/reward/mean@1"])
        write(step, data)
        if step == bad_after:
            if once:
                Path(once).write_text("bad line")
            log.write(b"this is not a log line\n")
        if (extra := _extra_line(step, total)) is not None:
            time.sleep(0.5)  # the follower reads the step first
            write(*extra)
        if startup_s and step == start + 1:
            print(f"stand-in trainer: first step line at {time.time():.3f}", flush=True)
        if chatter:
            sys.stdout.write(("." * 99 + "\n") * (chatter // 100))
            sys.stdout.flush()
    return 0


def _validate(data: dict, seconds: float, kill: bool, once: str | None) -> None:
    """V1's validation (verl/trainer/ppo/v1/trainer_base.py 465-476 at 1dda039): after the
    step and its checkpoint save, before the step's line, timed as `timing_s/testing` outside
    `timing_s/step`. `kill`: SIGKILLed during it (the checkpoint saved, the line not)."""
    if kill:
        time.sleep(seconds / 2)
        if once:
            Path(once).write_text("killed during a validation")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)
    data["timing_s/testing"] = seconds


def _save(ckpt: Path, step: int, kill: bool, once: str | None) -> None:
    """verl's `_save_checkpoint` (verl/trainer/ppo/ray_trainer.py 983-1050 at 1dda039),
    inside the step, before the step's metrics are logged: the `global_step_N` folder, then
    the tracker file that names it. `kill`: SIGKILLed between the two, as a kill inside the
    save leaves it (the folder half-written, the tracker naming the previous one)."""
    (ckpt / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
    if kill:
        if once:
            Path(once).write_text("killed inside a checkpoint save")
        os.kill(os.getpid(), signal.SIGKILL)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
