"""A stand-in for prime-rl's `rl` entrypoint as a command (tests/test_lifecycle.py): it trains
nothing, takes the words rlbatch appends for prime-rl (`interop/launch.py` `_prime_rl`) and
lives prime-rl's lifecycle from process start to exit, following PrimeIntellect-ai/prime-rl
at 559b447 (paths under src/prime_rl/):

- the run folder is `<output-dir>/<run.name>`; `--clean` deletes it, a run folder holding an
  earlier attempt's files is refused without `--clean` or `--resume`
  (entrypoints/rl.py 621-627, utils/pathing.py `validate_run_dir` 156-193);
- the trainer and the orchestrator each set up a `FileMonitor`, which opens
  `<run_dir>/metrics.jsonl` for append, line-buffered (monitors/file.py 25-31; trainer
  trainer/rl/train.py 84-89, orchestrator orchestrator.py 219-227), minutes before the first
  step's line: here PRIME_STANDIN_STARTUP_S, during which the file exists empty;
- a resumed attempt loads `checkpoints/step_c/{trainer,orchestrator}` and continues at c + 1
  (train.py 221-231, orchestrator.py 314-321; a missing half fails the load, orchestrator/
  ckpt.py 53-55), appending to the same metrics.jsonl;
- the base model's evaluation (policy v0) fires at start-up, not on resume (orchestrator.py
  477-483, orchestrator/eval_source.py 40-49), and is logged with a float `step` 1 and its
  `eval/<env>/policy_version` when its episodes finish (orchestrator.py 911-938);
- the orchestrator ships batch s once the policy is at least v{s-2} (TARGET_LAG 1,
  orchestrator.py 101-104, 662-680), saves `step_s/orchestrator/progress.pt` atomically
  (693, ckpt.py 30-44, 952-968) and logs its line (747); the trainer trains step k, saves
  `step_k/trainer` with torch DCP (`.metadata` written last; train.py 603-616, trainer/ckpt.py
  254-271) and logs five lines (650-693): the ordering is tests/helpers/prime_rl_log.py's
  `attempt_lines`, replayed here in real time;
- `--orchestrator.max-off-policy-steps` is a whole number of at least 0 (packages/
  prime-rl-configs/src/prime_rl/configs/orchestrator.py 532, `Field(8, ge=0)`; pydantic
  refuses anything else before the run starts) and is written to the resolved
  `configs/orchestrator.toml` with the batch and group sizes;
- the final step's checkpoints are written after the loop (train.py 728-731, orchestrator.py
  509-515); `--ckpt.keep-last` keeps the newest step folders (trainer/ckpt.py 274-306).

The learning is a known curve in samples: an evaluation of policy v reads accuracy
0.2 + PRIME_STANDIN_GAIN x v x B / 1000 (the same per sample at any B). Time is the same per
sample: a trainer step takes PRIME_STANDIN_SAMPLE_S x B seconds, shipping a batch
PRIME_STANDIN_GEN_SAMPLE_S x B. Behaviour from the environment:

- PRIME_STANDIN_STARTUP_S: seconds between opening metrics.jsonl and the first step (0.5);
- PRIME_STANDIN_SAMPLE_S (0.0005), PRIME_STANDIN_GEN_SAMPLE_S (a tenth of it), PRIME_STANDIN_GAIN
  (0.25 per 1,000 samples), PRIME_STANDIN_EVAL_LAG (lines between an evaluation's trigger and
  its line, 3), PRIME_STANDIN_SAVE_S (seconds per trainer checkpoint save, 0);
- PRIME_STANDIN_BASE_EVAL_FIRST: seconds; the base model's evaluation line is written at the
  end of start-up, first in the file, and the first batch ships that much later;
- PRIME_STANDIN_EVAL_SWAP: evaluations finish out of step order (EvalSink finalizes each
  epoch on its own, orchestrator/eval_sink.py 24-35, 86-93): each second evaluation's line is
  written before the one triggered before it;
- PRIME_STANDIN_CUT_AT: at step N's first trainer line, write half the line (no newline),
  then SIGKILL itself;
- PRIME_STANDIN_KILL_IN_SAVE_AT: SIGKILL itself inside step N's trainer save, after its
  shard and before `.metadata`;
- PRIME_STANDIN_ONCE: a file; the two faults above apply only while it does not exist (the
  fault creates it), so the next attempt runs through;
- PRIME_STANDIN_DOWNTIME_S: an attempt given a checkpoint waits this long before it starts
  (time the run is down between attempts).

It prints `stand-in prime-rl: opened <path> at <time>` and `... first step line at <time>`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from prime_rl_log import ACC, attempt_lines


def _args(argv: list[str]) -> dict:
    """`--a.b-c value` as {"a.b_c": "value"}; a bare flag as True."""
    out: dict = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("--"):
            key = word[2:].replace("-", "_")
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[key], i = argv[i + 1], i + 2
                continue
            out[key] = True
        i += 1
    return out


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _once_done() -> bool:
    once = os.environ.get("PRIME_STANDIN_ONCE")
    return bool(once) and Path(once).exists()


def _fault(what: str) -> None:
    """SIGKILL this process, first marking the fault done (PRIME_STANDIN_ONCE)."""
    if once := os.environ.get("PRIME_STANDIN_ONCE"):
        Path(once).write_text(what)
    os.kill(os.getpid(), signal.SIGKILL)


def validate_run_dir(run_dir: Path, resuming: bool, clean: bool) -> None:
    """utils/pathing.py 156-193: resuming passes, `clean` deletes the run folder, else a run
    folder with anything beyond the launcher's `configs` is refused."""
    if resuming:
        return
    if clean:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    if run_dir.exists() and any(p.name != "configs" for p in run_dir.iterdir()):
        raise FileExistsError(f"Run directory '{run_dir}' already contains artifacts from a "
                              "previous run.")


def resume_step(a: dict, ckpt_dir: Path) -> int | None:
    """`--resume.step N`, or a bare `--resume`: the newest step folder, complete or not
    (utils/pathing.py 117-133); None for a fresh run. Both halves must load."""
    if "resume.step" in a:
        step = int(a["resume.step"])
    elif a.get("resume"):
        steps = sorted(int(p.name.split("_")[-1]) for p in ckpt_dir.glob("step_*"))
        step = steps[-1] if steps else None
    else:
        return None
    if step is None:
        return None
    folder = ckpt_dir / f"step_{step}"
    if not (folder / "orchestrator" / "progress.pt").is_file():
        raise FileNotFoundError(f"Orchestrator checkpoint not found at "
                                f"{folder / 'orchestrator' / 'progress.pt'}")
    if not (folder / "trainer" / ".metadata").is_file():
        raise FileNotFoundError(f"Checkpoint not found at {folder / 'trainer'} (no .metadata)")
    return step


class Run:
    """One attempt: the run folder, the open metrics.jsonl and the checkpoint cadence."""

    def __init__(self, a: dict, run_dir: Path, start: int):
        self.run_dir, self.start = run_dir, start
        self.ckpt_dir = run_dir / "checkpoints"
        self.interval = int(a.get("ckpt.interval", 0)) if a.get("ckpt") else 0
        self.keep = int(a.get("ckpt.keep_last", 0))
        self.max_steps = int(a["max_steps"])
        self.batch = int(a.get("orchestrator.batch_size", 128))
        self.saved = sorted(int(p.name.split("_")[-1]) for p in self.ckpt_dir.glob("step_*")
                            if int(p.name.split("_")[-1]) <= start)
        self.path = run_dir / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115  (file.py 30)
        print(f"stand-in prime-rl: opened {self.path} at {time.time():.3f}", flush=True)

    def write(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")

    def cut(self, row: dict) -> None:
        text = json.dumps(row)
        self.file.write(text[:len(text) // 2])
        self.file.flush()
        _fault(f"killed mid-line at step {row['step']}")

    def save_orchestrator(self, step: int) -> None:
        """orchestrator/ckpt.py 30-44: a temporary file renamed to progress.pt."""
        folder = self.ckpt_dir / f"step_{step}" / "orchestrator"
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "progress.pt.tmp"
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, folder / "progress.pt")

    def save_trainer(self, step: int) -> float:
        """trainer/ckpt.py 254-271 (DCP: the shards, then `.metadata`), then `maybe_clean`
        (274-306): the seconds it is modelled to take (PRIME_STANDIN_SAVE_S, slept)."""
        folder = self.ckpt_dir / f"step_{step}" / "trainer"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__0_0.distcp").write_bytes(b"\0" * 64)
        time.sleep(_env("PRIME_STANDIN_SAVE_S", 0))
        kill_at = int(_env("PRIME_STANDIN_KILL_IN_SAVE_AT", 0))
        if step == kill_at and not _once_done():
            _fault(f"killed inside the save of step {step}")
        (folder / ".metadata").write_bytes(b"{}")
        self.saved.append(step)
        if self.keep:
            for old in self.saved[:-self.keep]:
                shutil.rmtree(self.ckpt_dir / f"step_{old}", ignore_errors=True)
            self.saved = self.saved[-self.keep:]
        return _env("PRIME_STANDIN_SAVE_S", 0)

    def saves_at(self, step: int) -> bool:
        """In the loop every `ckpt.interval` steps, the last step after it (train.py 603-607,
        orchestrator.py 957-961)."""
        return bool(self.interval) and step % self.interval == 0 and step < self.max_steps


def _lines(a: dict, start: int) -> list[dict]:
    """prime_rl_log's order of this attempt's lines, evaluations reading the curve in
    samples, out of step order when PRIME_STANDIN_EVAL_SWAP is set."""
    b = int(a.get("orchestrator.batch_size", 128))
    lines = attempt_lines(int(a["max_steps"]), batch=b,
                          group=int(a.get("orchestrator.group_size", 1)),
                          interval=int(a.get("orchestrator.eval.interval", 10 ** 9)),
                          start=start, eval_lag=int(_env("PRIME_STANDIN_EVAL_LAG", 3)))
    gain = _env("PRIME_STANDIN_GAIN", 0.25)
    for row in lines:
        if ACC in row:
            version = row[next(k for k in row if k.endswith("/policy_version"))]
            row[ACC] = round(min(1.0, 0.2 + gain * version * b / 1000), 6)
    if os.environ.get("PRIME_STANDIN_EVAL_SWAP"):
        evals = [i for i, r in enumerate(lines) if ACC in r and r["step"] != 1.0]
        for first, second in zip(evals[::2], evals[1::2]):  # the first finishes after
            lines.insert(second, lines.pop(first))
    if os.environ.get("PRIME_STANDIN_BASE_EVAL_FIRST") and start == 0:
        base = next(i for i, r in enumerate(lines) if ACC in r and r["step"] == 1.0)
        lines.insert(0, lines.pop(base))
    return lines


def replay(run: Run, lines: list[dict]) -> None:
    """Write the lines at the times their events take: shipping costs GEN_SAMPLE_S x B, a
    trainer step SAMPLE_S x B (its save after it), an evaluation line nothing more. Each line
    is written once its time has come, and logs that time (its `time`, and `time/step` as the
    gap since the last line of its kind): the schedule, not the moment this process got the
    core back, so the times a test reads are the ones it set, however loaded the machine."""
    sample_s = _env("PRIME_STANDIN_SAMPLE_S", 0.0005)
    train_s = sample_s * run.batch
    gen_s = _env("PRIME_STANDIN_GEN_SAMPLE_S", sample_s / 10) * run.batch
    cut_at = 0 if _once_done() else int(_env("PRIME_STANDIN_CUT_AT", 0))
    due = last_ship = last_train = time.time()
    first_batch_s = _env("PRIME_STANDIN_BASE_EVAL_FIRST", 0) if run.start == 0 else 0.0
    first = True
    for row in lines:
        src = "eval" if ACC in row else "orch" if "progress/total_rollouts" in row else "trainer"
        new_step = src == "trainer" and "perf/throughput" in row
        if src == "orch":
            due += gen_s + first_batch_s
            first_batch_s = 0.0
        elif new_step:
            due += train_s
        time.sleep(max(0.0, due - time.time()))
        if src == "orch":
            if run.saves_at(row["step"]):
                run.save_orchestrator(row["step"])
            row["time/step"], last_ship = due - last_ship, due
        if new_step:
            save_s = run.save_trainer(row["step"]) if run.saves_at(row["step"]) else 0.0
            due += save_s
            step_s, last_train = due - last_train, due
        if "time/step" in row and src == "trainer":
            row.update({"time/step": step_s, "time/save_ckpt": save_s,
                        "time/forward_backward": train_s})
        row["time"] = due
        if new_step and row["step"] == cut_at:
            run.cut(row)
        if first and src != "eval":
            print(f"stand-in prime-rl: first step line at {time.time():.3f}", flush=True)
            first = False
        run.write(row)


def main(argv: list[str]) -> int:
    a = _args(argv)
    off_policy = str(a.get("orchestrator.max_off_policy_steps", 8))
    if not off_policy.isdigit():
        print(f"orchestrator.max_off_policy_steps: Input should be greater than or equal to 0 "
              f"[input_value={off_policy}]", file=sys.stderr)
        return 1
    run_dir = Path(a["output_dir"]) / a.get("run.name", "default")
    resuming = "resume.step" in a or bool(a.get("resume"))
    if resuming:
        time.sleep(_env("PRIME_STANDIN_DOWNTIME_S", 0))
    validate_run_dir(run_dir, resuming, bool(a.get("clean")))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "configs").mkdir(exist_ok=True)
    (run_dir / "configs" / "orchestrator.toml").write_text(
        f"batch_size = {a.get('orchestrator.batch_size', 128)}\n"
        f"group_size = {a.get('orchestrator.group_size', 1)}\n"
        f"max_off_policy_steps = {off_policy}\n")
    start = resume_step(a, run_dir / "checkpoints") or 0
    run = Run(a, run_dir, start)
    lines = _lines(a, start)
    time.sleep(_env("PRIME_STANDIN_STARTUP_S", 0.5))
    print(f"stand-in prime-rl: steps {start + 1}..{run.max_steps} of {run.batch}", flush=True)
    replay(run, lines)
    if run.interval:  # the final step's checkpoints, after the loop
        run.save_trainer(run.max_steps)
        run.save_orchestrator(run.max_steps)
    run.file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
