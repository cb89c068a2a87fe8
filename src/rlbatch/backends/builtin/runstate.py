"""Counters, stopping rules and the run directory of one training run.

`open_run` decides what an existing run directory means: a finished run is returned as is
(re-running is idempotent), an interrupted (`running`) or `failed` one needs `resume=True`
(or `fresh=True` to start over), and anything else is a one-line error. A `stopped` run
whose STOP file has been removed continues with `resume=True` from its last checkpoint
(how `rlbatch profile` extends a probe, profile/probing.py). On resume the log
files are cut back to the last checkpoint, so the rows of steps that are re-run are not
duplicated.

Failures: `fail(exc)` writes `status: failed` and `failure: "<one line>"` to summary.json;
the trainers call it for any exception inside a run before it propagates, so only a killed
process (SIGKILL, power loss) leaves a run `running`. A failed run keeps its checkpoints and
`--resume` continues it from the last one. On a full disk or a read-only folder writing `failed`
may fail too: the run stays `running` and the `OutputError` that ended it says to `--resume`.

Reward faults (`rollout/reward_runner.py`): the counters hold the run's totals and a window
of the most recent steps' (calls, faults); `reward_fault_rate_exceeded` judges
`reward.max_error_rate` over that window, and the first distinct faults are appended to
`reward_errors.jsonl`.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import yaml

from rlbatch.backends.builtin.counters import Counters
from rlbatch.core.config import Config
from rlbatch.core.errors import (
    ConfigError,
    Interrupted,
    OutputError,
    RunFailed,
    Terminated,
    UserError,
    pending_stop,
    sanitize,
    writing,
)
from rlbatch.core.ownership import LOCK_FILE, disown, own
from rlbatch.core.runlog import (
    FINISHED,
    STOP_FILE,
    RunWriter,
    append_jsonl,
    atomic_write_json,
    build_manifest,
    ended_for_good,
    identity,
    make_dir,
    make_run_id,
    read_json,
    read_jsonl,
    truncate_jsonl_after_step,
)
from rlbatch.core.runmatch import added_at_default, find_run_dir, note_text
from rlbatch.rollout.reward_runner import RewardError

REWARD_ERRORS = "reward_errors.jsonl"
_LOGS = ("steps.jsonl", "evals.jsonl", REWARD_ERRORS)
_OWN_FILES = ("config.yaml", "manifest.json", "summary.json", *_LOGS)
_FAULT_KEYS = ("errors", "timeouts", "nonfinite")
STOP_CODES = ("cannot_win", "no_crossing", "probe", "profile_budget")


def failure_line(exc: BaseException) -> str:
    """What went wrong, in one line: a UserError's, Terminated's or Interrupted's own message,
    else `Type: message` (the type alone when there is no message); control characters are
    escaped (`sanitize`)."""
    message = sanitize(" ".join(str(exc).split()))
    if isinstance(exc, (UserError, Terminated, Interrupted)) and message:
        text = message
    else:
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


class RunState:
    def __init__(self, cfg: Config, run_dir: Path, resuming: bool, finished: bool):
        self.cfg = cfg
        self.dir = run_dir
        self.resuming = resuming
        self.finished = finished
        self.c = Counters.fresh(cfg)
        self._from_checkpoint = False
        self.summary = read_json(run_dir / "summary.json") if finished else {}
        self.writer: RunWriter | None = None
        self._range_warned = False  # eval/accuracy outside [0, 1] is said once per run
        self.extra: dict = {}  # more keys of summary.json (a command trial's `command`)

    @property
    def status(self) -> str:
        return self.c.status

    def load_counters(self, counters: dict) -> None:
        self.c.restore(counters)
        self._from_checkpoint = True
        if self.c.status == "stopped":  # its STOP file was removed: it continues (open_run)
            self.c.status, self.c.stop_reason, self.c.stop_code = "running", None, None

    def truncate_logs(self) -> None:
        if self.finished:
            return
        keep = self.c.step if self._from_checkpoint else -1
        try:
            for name in _LOGS:
                truncate_jsonl_after_step(self.dir / name, keep)
            for tmp in (t for name in _OWN_FILES for t in self.dir.glob(f".{name}.tmp*")):
                with writing(tmp):  # atomic writes' temporary files a killed process left
                    tmp.unlink(missing_ok=True)
            self.writer = RunWriter(self.dir)
            self.write_summary()
        except OutputError as exc:  # the run folder exists: fix it, then --resume
            raise exc.resumable() from None

    def logged_reward_faults(self) -> list[tuple]:
        """(kind, message) of the faults already in reward_errors.jsonl (kept across resume)."""
        rows, _ = read_jsonl(self.dir / REWARD_ERRORS)
        return [(r.get("kind"), r.get("message")) for r in rows]

    # ---- updates ----
    def advance(self, prompts: int, samples: int, tokens: int, wall: float, skipped: int) -> None:
        c = self.c
        c.step += 1
        c.prompts += prompts
        c.samples += samples
        c.tokens += tokens
        c.train_s += wall
        c.consumed += prompts
        c.first_step_s = c.first_step_s if c.first_step_s is not None else wall
        c.nonfinite_total += skipped
        c.nonfinite_run = c.nonfinite_run + 1 if skipped else 0

    def log_step(self, row: dict) -> None:
        self.writer.log_step(row)

    # ---- reward faults ----
    def count_reward_faults(self, calls: int, counts: dict) -> None:
        """Add one training step's reward calls and faults to the totals and the window."""
        c = self.c
        c.reward_calls += calls
        for key in _FAULT_KEYS:
            setattr(c, f"reward_{key}", getattr(c, f"reward_{key}") + counts[key])
        window = [*c.reward_window, [calls, sum(counts[k] for k in _FAULT_KEYS)]]
        keep = self.cfg.reward.error_window_calls
        while len(window) > 1 and sum(n for n, _ in window[1:]) >= keep:
            window.pop(0)  # the most recent whole steps covering at least `keep` calls
        c.reward_window = window

    def reward_fault_rate_exceeded(self) -> str | None:
        """The failure message when the window's fault rate is past reward.max_error_rate."""
        calls = sum(n for n, _ in self.c.reward_window)
        faults = sum(f for _, f in self.c.reward_window)
        return fault_rate_message(self.cfg, faults, calls, "of the last training calls")

    def log_reward_faults(self, rows: list[dict], phase: str) -> None:
        """Append new distinct faults to reward_errors.jsonl and say them on stderr."""
        if not rows:
            return
        step = self.c.step + (1 if phase == "train" else 0)  # the step being run
        rows = [{"step": step, "phase": phase, **row} for row in rows]
        for row in rows:
            print(f"reward {row['kind']} ({phase}, step {row['step']}, prompt "
                  f"{row['prompt_index']}) in {row['function']}: {row['message']}",
                  file=sys.stderr)
        append_jsonl(self.dir / REWARD_ERRORS, *rows)

    def log_eval(self, row: dict, seconds: float) -> None:
        self.writer.log_eval(row)
        self.record_eval(row, seconds)

    def record_eval(self, row: dict, seconds: float) -> None:
        """Count an evaluation already written: its time, the next mark, the relative
        target's threshold (from the step-0 evaluation) and the first crossing."""
        c, t = self.c, self.cfg.target
        c.eval_s += seconds
        c.evals_done += 1
        c.last_eval = row
        every = self.cfg.eval.every_samples
        c.next_eval = (c.samples // every + 1) * every
        value = row.get(t.metric)
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # not measured (e.g. every held-out reward call faulted)
        self._check_accuracy_range(row)
        if c.target_threshold is None and t.gain is not None and row["step"] == 0 \
                and value is not None:
            c.target_threshold = value + t.gain  # relative target: step-0 value + gain
        threshold = c.target_threshold
        if c.target is None and threshold is not None and value is not None \
                and value >= threshold:
            c.target = {"step": row["step"], "samples": row["samples"],
                           "train_s": row["train_s"], "reached_value": value}
            if self.cfg.budget.stop_at_target and c.status == "running":
                c.status = "target_reached"

    def _check_accuracy_range(self, row: dict) -> None:
        """One warning per run when `eval/accuracy` leaves [0, 1]: the reward returned values
        outside the range its contract states, and a target on it means little."""
        acc = row.get("eval/accuracy")
        if self._range_warned or not isinstance(acc, float) or not math.isfinite(acc) \
                or 0.0 <= acc <= 1.0:
            return
        self._range_warned = True
        print(f"warning: eval/accuracy = {acc:.4g} at step {row['step']} is outside [0, 1]: "
              f"task.reward {sanitize(self.cfg.task.reward)} returns values outside [0, 1], "
              "so eval/accuracy is not an accuracy and a target on it means little",
              file=sys.stderr)

    def needs_final_eval(self) -> bool:
        """A finished run ends on an evaluation at its last step (a stopped or budget-ended
        run's curve then ends where it stopped, not at the last eval mark)."""
        last = self.c.last_eval
        return self.c.status != "running" and (last is None or last["step"] != self.c.step)

    def after_final_eval(self) -> None:
        if self.c.status == "budget_exhausted" and self.c.target:
            self.c.status = "target_reached"

    def update_status(self) -> None:
        c, budget = self.c, self.cfg.budget
        if c.status != "running":
            return
        stop = self.dir / STOP_FILE
        if stop.exists():  # a cooperative stop request (rlbatch profile's early stopping)
            c.stop_reason = stop.read_text().strip() or "requested"
            code = c.stop_reason.split(":", 1)[0].strip()
            c.stop_code = code if code in STOP_CODES else "requested"
            c.status = "stopped"
        elif c.nonfinite_run >= self.cfg.nonfinite.max_consecutive:
            c.status = "diverged"
        elif c.samples >= budget.max_samples or (budget.max_train_s
                                                 and c.train_s >= budget.max_train_s):
            c.status = "target_reached" if c.target else "budget_exhausted"

    def after_step(self, evaluate: Callable[[], None]) -> bool:
        """What follows every logged step, in both trainers: fail past the reward fault rate,
        run the evaluations whose sample marks this step crossed, update the status (target,
        budget, stop request, divergence), end a finished run on an evaluation. Returns
        whether a checkpoint is due now (by cadence, or because the run has finished)."""
        if (reason := self.reward_fault_rate_exceeded()) is not None:
            raise RewardError(reason)
        while self.c.samples >= self.c.next_eval:
            evaluate()
        self.update_status()
        if self.needs_final_eval():
            evaluate()
            self.after_final_eval()
        return self.due_checkpoint() or self.c.status != "running"

    def due_checkpoint(self) -> bool:
        every = self.cfg.checkpoint.every_samples
        if not every or self.c.samples < self.c.next_ckpt:
            return False
        self.c.next_ckpt = (self.c.samples // every + 1) * every
        return True

    def counters_for_checkpoint(self) -> dict:
        return asdict(self.c)

    def checkpointed(self, seconds: float) -> None:
        self.c.checkpoint_s += seconds

    # ---- failure ----
    def fail(self, exc: BaseException) -> None:
        """Write `failed` and the reason before the exception propagates. Counters that were
        not restored (a resume that failed before loading its checkpoint) are not written
        over the previous attempt's: only its status and failure change then. When that write
        fails too (a full disk), the summary keeps its previous content and `exc` stays the
        error reported (the second one becomes a note on it)."""
        self.c.status = "failed"
        self.c.failure = failure_line(exc)
        try:
            if self.resuming and not self._from_checkpoint and self.writer is None:
                previous = read_json(self.dir / "summary.json")
                self.summary = {**previous, "status": "failed", "failure": self.c.failure,
                                "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
            else:
                self.summary = self._summary()
            atomic_write_json(self.dir / "summary.json", self.summary)
        except (OSError, UserError) as second:
            if hasattr(exc, "add_note"):  # Python >= 3.11; shown with a traceback only
                exc.add_note(f"status 'failed' not recorded: {second}")
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # ---- summary ----
    def _summary(self) -> dict:
        c, t = self.c, self.cfg.target
        target = {"metric": t.metric, "value": t.value, "gain": t.gain,
                  "threshold": c.target_threshold, "reached": c.target is not None}
        if c.target:
            target.update(c.target)  # step, samples, train_s, reached_value of the crossing
        return {"status": c.status, "steps": c.step, "samples": c.samples,
                "prompts": c.prompts, "tokens": c.tokens, "train_s": c.train_s,
                "eval_s": c.eval_s, "checkpoint_s": c.checkpoint_s,
                "first_step_s": c.first_step_s,
                "throughput": c.samples / c.train_s if c.train_s else None,
                "nonfinite_skipped": c.nonfinite_total, "target": target,
                "last_eval": c.last_eval, "stop_reason": c.stop_reason,
                "stop_code": c.stop_code, "failure": c.failure,
                "reward_faults": {"calls": c.reward_calls,
                                  **{k: getattr(c, f"reward_{k}") for k in _FAULT_KEYS}},
                **self.extra, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def write_summary(self) -> None:
        self.summary = self._summary()
        self.writer.write_summary(self.summary)

    def finish(self) -> dict:
        self.write_summary()
        self.writer.close()
        self.finished = True
        return self.summary


def run_recorded(state: RunState, body: Callable[[], dict], close: Callable[[], None]) -> dict:
    """Both trainers' way into a run: a finished run returns its summary; otherwise `body()`
    runs, any exception is written down (`state.fail`) before it propagates, and `close()`
    (the reward runner's pool) runs in every case."""
    if state.finished:
        return state.summary
    try:
        return body()
    except OutputError as exc:  # written down if it can be; the run resumes once it can write
        state.fail(err := exc.resumable())
        raise err from None
    except SystemExit as exc:  # sys.exit inside the run: a failure, never exit status 0
        state.fail(exc)
        raise RunFailed(f"{state.dir}: run failed: {state.c.failure}") from None
    except BaseException as exc:  # written down, then propagated
        stop = pending_stop()
        if stop is None or exc is stop:
            state.fail(exc)
            raise
        # the stop signal was raised inside library code that replaced it while unwinding
        # (torch.save's zip writer raises its own RuntimeError): the run ended by the signal
        state.fail(stop)
        raise stop from exc
    finally:
        close()


def open_run(cfg: Config, *, resume: bool = False, fresh: bool = False) -> RunState:
    """The run directory of `cfg`, owned by this process (core/ownership.py) before anything
    in it is read, deleted or written: another live owner is one line, exit 2, and `--fresh`
    and `--resume` refuse the same way."""
    resolved = cfg.resolved_dict()
    run_dir, earlier = find_run_dir(cfg.output_dir, resolved, cfg.seed)
    run_id = run_dir.name
    if earlier is not None:  # an earlier release's directory of this very run
        print(note_text(earlier), file=sys.stderr)
    new = not run_dir.exists()
    make_dir(run_dir)
    try:
        own(run_dir, "run directory")
    except OutputError:
        if new:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    exists = (run_dir / "config.yaml").exists()
    if exists and fresh:
        _clear(run_dir)
        exists = False
    if exists:
        summary = read_json(run_dir / "summary.json")
        status = summary.get("status")
        if status in FINISHED and (not resume or ended_for_good(run_dir, status)):
            return RunState(cfg, run_dir, resuming=False, finished=True)
        if not resume:
            what = (f"a failed run ({summary.get('failure') or 'no reason recorded'})"
                    if status == "failed" else "an interrupted run")
            raise ConfigError(
                f"run directory {run_dir} holds {what}: pass --resume to continue it from its "
                "last checkpoint or --fresh to start over")
        check_recorded_config(run_dir, run_id, resolved)
        return RunState(cfg, run_dir, resuming=True, finished=False)
    try:  # config.yaml, which marks a run as existing, is written last
        with RunWriter(run_dir) as w:
            w.write_manifest(build_manifest(run_id, "builtin", cfg.seed, _versions(cfg)))
            w.write_config(resolved)
    except OutputError:
        if new:  # nothing half-written: a folder this call made goes again
            disown(run_dir)
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return RunState(cfg, run_dir, resuming=False, finished=False)


def _clear(run_dir: Path) -> None:
    """`--fresh`: everything in the run directory goes but its lock file, which stays held
    (deleting it would let a third process own a new one beside this)."""
    for entry in run_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        with writing(entry):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def check_recorded_config(run_dir: Path, run_id: str, resolved: dict) -> None:
    """Before a resume: the run's config.yaml must still hash to its run id, or the resumed
    steps would run one config while the record says another. Refused in one line naming the
    changed keys."""
    path = run_dir / "config.yaml"
    try:
        recorded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot be read to resume the run ({type(exc).__name__})",
                          where=str(path)) from None
    if isinstance(recorded, dict) and (
            make_run_id(recorded, recorded.get("seed", resolved.get("seed"))) == run_id
            or added_at_default(resolved, recorded) is not None):  # core/runmatch.py
        return
    ours, theirs = _flat(identity(resolved)), _flat(identity(recorded)
                                                     if isinstance(recorded, dict) else {})
    changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    raise ConfigError(f"no longer matches its run id {run_id} (changed: {shown or 'its form'}); "
                      "restore it, or start over with --fresh", where=str(path))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def fault_rate_message(cfg: Config, faults: int, calls: int, what: str) -> str | None:
    """One line when faults / calls is past reward.max_error_rate, else None."""
    limit = cfg.reward.max_error_rate
    if not calls or faults / calls <= limit:
        return None
    return (f"task.reward: {cfg.task.reward} faulted on {faults} of {calls} calls "
            f"({faults / calls:.0%}) {what}, more than reward.max_error_rate = {limit:g}; "
            f"see {REWARD_ERRORS} in the run directory")


def half_accuracies(scores: list, faulted: list[bool], k: int) -> dict:
    """`eval.halves`: the mean score of the calls that did not fault on the first and the
    second half of the evaluation's prompts (`scores` prompt-major, k calls per prompt; a
    half with no call left is NaN)."""
    cut = (len(scores) // k) // 2 * k
    out = {}
    for name, part in (("a", slice(0, cut)), ("b", slice(cut, None))):
        kept = [s or 0.0 for s, f in zip(scores[part], faulted[part]) if not f]
        out[f"eval/accuracy_{name}"] = sum(kept) / len(kept) if kept else float("nan")
    return out


def _versions(cfg: Config) -> dict:
    import torch
    import transformers

    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) \
        else "cpu"
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "torch_threads": torch.get_num_threads(), "algorithm": cfg.algorithm}
