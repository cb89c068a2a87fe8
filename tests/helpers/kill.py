"""SIGKILL a real `rlbatch train` process at random points, resume it, and compare what it
logged with an uninterrupted run's (tests/test_kill.py).

A kill point is a phase and a position, both drawn from a seeded generator:

- `start`: a random delay after the process starts (imports, model load, checkpoint restore,
  log truncation, the first step);
- `step`: a random fraction of the mean step time after the run has logged step `w`;
- `eval`: as soon as the row of a step that is due an evaluation (it crossed an
  `eval.every_samples` mark, or it is the last) is logged and that evaluation's row is not;
- `checkpoint`: as soon as a checkpoint's temporary folder (`checkpoints/.tmp-step-*`) exists,
  that is, while the checkpoint is being written.

`w` is drawn after the rows already logged, spread over the rest of the run, so successive
kills move through it. After each kill `landed` reads the files to say where the kill really
was (a checkpoint folder still temporary, an evaluation row missing, no new row yet), so a
test can check that the kills covered what it meant them to.

A SIGKILL cannot be caught: nothing is written at the kill, the run stays `running`, and
`--resume` continues it from its last complete checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIMING_PREFIXES = ("time/",)
TIMING_KEYS = {"train_s", "eval_s", "checkpoint_s", "first_step_s", "throughput", "updated",
               "time"}


def is_timing(key: str) -> bool:
    """Wall-clock keys: phase times, seconds (`*_s`: cumulative, or a batch's decoding
    ahead), per-second rates, timestamps."""
    return key.startswith(TIMING_PREFIXES) or key in TIMING_KEYS or key.endswith("_s")


def stable(obj):
    """`obj` without its wall-clock values, at any depth (rows, summaries, journal events)."""
    if isinstance(obj, dict):
        return {k: stable(v) for k, v in obj.items() if not is_timing(k)}
    if isinstance(obj, list):
        return [stable(v) for v in obj]
    return obj


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlbatch.cli.main", *args]


def env() -> dict:
    """One intra-op thread per process, so that the killed run and the reference (run side by
    side) compute with the same thread count, and unbuffered output."""
    return dict(os.environ, PYTHONUNBUFFERED="1", RLBATCH_THREADS="1")


def start(cmd: list[str]) -> subprocess.Popen:
    """A process in its own session, so that a kill reaches its children (reward workers,
    a profile's trial processes) too."""
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group this test started (if it is still there) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # ended between the poll and the kill
            pass
    proc.wait()


@dataclass(frozen=True)
class Schedule:
    """The sample marks of the run under test: sequences per step, cadences, budget, and for a
    run with a stepwise `batch.schedule` its points ((samples, B), ...), which then set the
    sequences of each step instead of `per_step`."""

    per_step: int
    eval_every: int
    ckpt_every: int
    budget: int
    points: tuple = ()

    def samples(self, step: int) -> int:
        """Cumulative samples after `step` steps."""
        s = 0
        for _ in range(step):
            b = self.per_step
            for start, size in self.points:
                if start <= s:
                    b = size
            s += b
        return s

    @property
    def steps(self) -> int:
        n = 0
        while self.samples(n) < self.budget:
            n += 1
        return n

    def _crosses(self, step: int, every: int) -> bool:
        s, before = self.samples(step), self.samples(step - 1)
        return s // every > before // every or s >= self.budget

    def eval_due(self, step: int) -> bool:
        return self._crosses(step, self.eval_every)

    def ckpt_due(self, step: int) -> bool:
        return self._crosses(step, self.ckpt_every)


def _rows(path: Path) -> list[dict]:
    """The complete rows of a JSONL file (a line cut by a kill is left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def run_dir_in(out: Path) -> Path | None:
    found = sorted(p.parent for p in out.glob("*/config.yaml"))
    return found[0] if found else None


class Watch:
    """What a run directory shows right now: its step rows, its evaluation steps, and whether a
    checkpoint is being written. Temporary checkpoint folders left by an earlier kill (the
    next save removes them) are told apart from a save in progress by inode and mtime."""

    def __init__(self, out: Path):
        self.out = out
        self.stale = self._temporary()

    @property
    def dir(self) -> Path | None:
        return run_dir_in(self.out)

    def steps(self) -> list[dict]:
        d = self.dir
        return _rows(d / "steps.jsonl") if d else []

    def eval_steps(self) -> set[int]:
        d = self.dir
        return {int(r["step"]) for r in _rows(d / "evals.jsonl")} if d else set()

    def _temporary(self) -> set[tuple]:
        d = self.dir
        found = set()
        try:
            for p in (d / "checkpoints").iterdir() if d else ():
                if p.name.startswith(".tmp-"):
                    st = p.stat()
                    found.add((p.name, st.st_ino, st.st_mtime_ns))
        except FileNotFoundError:  # no folder yet, or a save renamed it meanwhile
            pass
        return found

    def writing_checkpoint(self) -> bool:
        return bool(self._temporary() - self.stale)

    def steps_bytes(self) -> bytes:
        d = self.dir
        try:
            return (d / "steps.jsonl").read_bytes() if d else b""
        except FileNotFoundError:
            return b""


def _mean_step_s(rows: list[dict]) -> float:
    last = rows[-1] if rows else {}
    return last.get("train_s", 1.0) / max(1, last.get("step", 1))


def _fired(phase: str, watch: Watch, sched: Schedule, w: int, started: float,
           delay: float, armed: list[float]) -> bool:
    """Whether the kill point (`phase`, position `w`) has come. `armed` holds the time a
    `step` point's row appeared (its delay counts from then)."""
    if phase == "start":
        return time.monotonic() - started >= delay
    rows = watch.steps()
    if phase == "step":
        if not armed and len(rows) >= w:
            armed.append(time.monotonic() + delay * _mean_step_s(rows))
        return bool(armed) and time.monotonic() >= armed[0]
    if phase == "eval":
        last = int(rows[-1]["step"]) if rows else 0
        return last >= w and sched.eval_due(last) and last not in watch.eval_steps()
    if phase == "checkpoint":
        return len(rows) >= w and watch.writing_checkpoint()
    raise ValueError(phase)


def landed(watch: Watch, sched: Schedule, before: bytes) -> str:
    """Where a kill was, read from the files it left (`before`: steps.jsonl at the start)."""
    if watch.dir is None:
        return "start-up"
    if watch.writing_checkpoint():
        return "checkpoint write"
    if watch.steps_bytes() == before:
        return "start-up, restore or first step"
    rows = watch.steps()
    last = int(rows[-1]["step"]) if rows else 0
    if rows and sched.eval_due(last) and last not in watch.eval_steps():
        return "evaluation"
    return "step"


def position(rng: np.random.Generator, rows: int, last: int, kills_left: int) -> int:
    """A row to wait for: after the `rows` already logged, within an even share of the steps
    left up to `last`."""
    share = max(1, (last - rows) // kills_left)
    return min(last, rows + 1 + int(rng.integers(0, share)))


def kill_at(cmd: list[str], out: Path, phase: str, sched: Schedule, rng: np.random.Generator,
            kills_left: int, timeout: float = 900, row: int | None = None) -> str:
    """Start `cmd`, SIGKILL it at a random point of `phase` (after row `row` when given), and
    say where the kill landed. Fails when the process ends (or stalls) before the point
    comes."""
    watch = Watch(out)
    before = watch.steps_bytes()
    rows0 = len(watch.steps())
    last = sched.steps - 2 if phase == "step" else sched.steps  # a step point needs room
    w = position(rng, rows0, last, kills_left) if row is None else row
    delay = float(rng.uniform(0.5, 6.0)) if phase == "start" else float(rng.uniform(0, 1))
    proc = start(cmd)
    started, armed = time.monotonic(), []
    try:
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise AssertionError(f"the run ended (exit {proc.returncode}) before the "
                                     f"{phase} kill at row {w}")
            if _fired(phase, watch, sched, w, started, delay, armed):
                break
            time.sleep(0.004)
        else:
            raise AssertionError(f"no {phase} point at row {w} within {timeout:.0f} s")
    finally:
        kill(proc)
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    return landed(watch, sched, before)
