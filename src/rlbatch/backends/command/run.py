"""`CommandRun`: one trial run as the user's own training command (`backend: command`).

`rlbatch train` owns the trial's run directory as for any run (core/ownership.py), starts the
command with the trial's overrides (interop/launch.py) in its own process group, and follows
its log (follow.py) into the run log every `command.poll_s` seconds, or less often when the
log is long: reading it takes at most `READ_SHARE` of one core. The run's status is
judged from the rows as for the built-in trainer: the target, the budget and a STOP file
(`rlbatch profile`'s early stops) end it, and then the command is stopped: SIGTERM to its
group, SIGKILL after `command.stop_grace_s`. A command that exits with a non-zero status, or
whose log does not grow for `command.idle_timeout_s`, fails the run with the tail of its
output. A signal to `rlbatch train` stops the command the same way and is written down;
`--resume` starts a new attempt, which continues from the framework's newest checkpoint.
If `rlbatch train` is killed outright, the command gets SIGTERM from the kernel (Linux,
PR_SET_PDEATHSIG), and a later attempt first stops whatever of an earlier one still runs
(every process an attempt starts carries its token in its environment).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rlbatch.backends.builtin.counters import Counters
from rlbatch.backends.builtin.runstate import RunState, open_run, run_recorded
from rlbatch.backends.command.follow import TRAIN_S_SOURCE, Attempt, Follower, output_tail
from rlbatch.backends.command.health import (
    CHECKPOINT_REFUSED,
    ROWS_FILE,
    bad_checkpoint,
    cap_output,
    nonfinite_evals,
    nonfinite_steps,
    target_lost,
)
from rlbatch.backends.command.preflight import check_command, trial_spec
from rlbatch.backends.command.procs import TOKEN, exit_words, stop_attempt
from rlbatch.core.config import Config
from rlbatch.core.errors import UserError
from rlbatch.core.launch import module_argv
from rlbatch.core.runlog import atomic_write_json, atomic_write_text, dumps_strict, read_json

Callback = Callable[[str, dict], None]
HOME = "command"  # the trial's folder for the command: attempts/, checkpoints, shared logs
READ_SHARE = 0.05  # the most of one core that reading the command's log may take


class CommandFailed(UserError):
    """The command exited with a non-zero status, or stopped logging: one line with the
    tail of its output."""


class CommandRun:
    """One trial run as a foreign command; `run()` returns the summary. Same surface as the
    built-in `Trainer` for the CLI: `.state`, `.cb`, `.run()`."""

    def __init__(self, cfg: Config, *, resume: bool = False, fresh: bool = False,
                 callback: Callback | None = None, build_progress: Callable | None = None):
        from rlbatch.interop.ingest import IngestOptions

        check_command(cfg)
        self.cfg, self.spec = cfg, trial_spec(cfg)
        self.cb = callback or (lambda kind, row: None)
        self.proc: subprocess.Popen | None = None
        self.state: RunState = open_run(cfg, resume=resume, fresh=fresh)
        self.home = self.state.dir / HOME
        if not self.state.finished and not self.state.resuming:
            path = self.state.dir / "manifest.json"
            atomic_write_json(path, {**read_json(path), "backend": f"command:{cfg.command.framework}",
                                     "train_s_source": TRAIN_S_SOURCE[cfg.command.framework]})
        self.follower = Follower(cfg.command.framework, IngestOptions(
            prompts_per_step=cfg.batch.prompts_per_step,
            samples_per_prompt=cfg.batch.samples_per_prompt, lr=cfg.actor_lr, seed=cfg.seed,
            algorithm=cfg.algorithm, max_samples=cfg.budget.max_samples))
        self._missing = False  # the attempt's log was found deleted at the last poll
        self._written: tuple[list, list] = ([], [])
        self.attempts: list[Attempt] = []
        self.output = self.home / "output.log"
        self.output_dropped = 0  # bytes of the command's output cut (cap_output)

    def run(self) -> dict:
        return run_recorded(self.state, self._run, self._close)

    # ---- the loop ----
    def _run(self) -> dict:
        st, c = self.state, self.cfg.command
        # the run log is rebuilt from the command's own logs, once the attempt is not refused
        # (a refused attempt leaves the rows as they are: `_start_attempt`)
        self.attempts = self._start_attempt()
        quiet_since = next_read = time.monotonic()
        while True:
            if time.monotonic() >= next_read:
                self.output_dropped += cap_output(self.output)
                if self._follow():
                    quiet_since = time.monotonic()
                # a long log costs more to read: at most READ_SHARE of one core goes to it
                next_read = time.monotonic() + self.follower.last_cost_s / READ_SHARE
            st.update_status()  # a STOP file is seen at every poll
            code = self.proc.poll()
            if self._stop_now():
                stop_attempt(self.proc, self.token, c.stop_grace_s)
                break
            if code is not None:
                self._follow()  # what it wrote last
                self._ended(code)
                break
            if time.monotonic() - quiet_since > c.idle_timeout_s:
                stop_attempt(self.proc, self.token, c.stop_grace_s)
                if st.status == "running":
                    raise self._failed(f"its log did not grow for {c.idle_timeout_s:g} s "
                                       "(command.idle_timeout_s)")
                break  # past its budget, the rows complete: stopped as it did not exit
            time.sleep(c.poll_s)
        self._set_extra()
        return st.finish()

    def _stop_now(self) -> bool:
        """Whether the rows ended the run and the command must be stopped: a STOP file, the
        target (budget.stop_at_target) or budget.max_train_s. At budget.max_samples the
        command, given the same length, ends by itself (its last evaluation included)."""
        st, budget = self.state, self.cfg.budget
        if st.status == "running":
            return False
        if st.status == "stopped" or (st.c.target and budget.stop_at_target):
            return True
        return st.c.samples < budget.max_samples

    def _start_attempt(self) -> list[Attempt]:
        from rlbatch.interop.launch import launch, trial_threads

        c = self.cfg.command
        earlier = self._attempts()
        for info in earlier:  # a command its killed follower left running
            stop_attempt(None, info["token"], c.stop_grace_s)
        folder = self.home / "attempts" / f"{len(earlier) + 1:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        ln = launch(self.spec, list(c.argv), folder, self.home,
                    reached=self.follower.reached(self._as_attempts(earlier)))
        if (why := bad_checkpoint(earlier, ln.resume, self.home / "attempts")) is not None:
            shutil.rmtree(folder, ignore_errors=True)
            raise CommandFailed(f"{CHECKPOINT_REFUSED}: {why}", where="command")
        self.state.truncate_logs()  # after the refusal: a refused run keeps its rows
        # TRL logs optimizer steps: K of them make one rollout step
        self.follower.options = replace(self.follower.options,
                                        updates_per_step=ln.updates_per_step)
        self.token = f"{self.state.dir.name}-{len(earlier) + 1}-{os.getpid()}-{time.time_ns()}"
        env = {**os.environ, **c.env, **ln.env, "PYTHONUNBUFFERED": "1", TOKEN: self.token}
        if "OMP_NUM_THREADS" not in c.env:  # the executor's share (launch.trial_threads)
            for key, value in trial_threads(self.spec, os.environ.get("RLBATCH_THREADS")).items():
                if value is None:
                    env.pop(key, None)
                else:
                    env[key] = value
        self.output = folder / "output.log"
        with open(self.output, "ab") as out:
            # its own process group (stopped as a whole), dying with this process
            # (exec_child.py)
            self.proc = subprocess.Popen(
                module_argv("rlbatch.backends.command.exec_child", str(os.getpid()), *ln.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=c.workdir, env=env, start_new_session=True)
        info = {"number": len(earlier) + 1, "argv": ln.argv, "env": {**c.env, **ln.env},
                "log": str(ln.log), "shared": ln.shared, "resume_step": ln.resume_step,
                "resume_from": None if ln.resume is None else str(ln.resume.path),
                "settings": ln.settings, "pid": self.proc.pid, "token": self.token,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write_text(folder / "attempt.json", dumps_strict(info, indent=2) + "\n")
        return self._as_attempts([*earlier, info])

    def _as_attempts(self, infos: list[dict]) -> list[Attempt]:
        return [Attempt(a["number"], Path(a["log"]), a["shared"], a["resume_step"],
                        self.home / "attempts" / f"{a['number']:03d}" / ROWS_FILE)
                for a in infos]

    def _attempts(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(
            (self.home / "attempts").glob("*/attempt.json"))]

    # ---- the run log ----
    def _follow(self) -> bool:
        """Read the logs; write what is new; count it; True when anything changed."""
        from rlbatch.core.errors import DataError

        try:
            steps, evals, changed = self.follower.read(self.attempts)
        except DataError as exc:
            stop_attempt(self.proc, self.token, self.cfg.command.stop_grace_s)
            raise self._failed(f"its log cannot be read: {exc}") from None
        # deleted, not rotated: gone at two polls in a row (a rotation's new file comes at once)
        gone = self.follower.vanished(self.attempts)
        if gone is not None and (self._missing or self.proc.poll() is not None):
            stop_attempt(self.proc, self.token, self.cfg.command.stop_grace_s)
            raise self._failed(gone)
        self._missing = gone is not None
        if (where := self.follower.non_numbers.get(self.cfg.target.metric)) is not None:
            stop_attempt(self.proc, self.token, self.cfg.command.stop_grace_s)
            raise self._failed(f"logged the target metric {self.cfg.target.metric} "
                               f"(target.metric) as something other than a number ({where}): "
                               "log it as a number")
        if changed:
            if (why := self._ignored_checkpoint()) is not None:
                stop_attempt(self.proc, self.token, self.cfg.command.stop_grace_s)
                raise self._failed(why)
            self._write(steps, evals)
            self._count(steps, evals)
            if (why := target_lost(evals, self.cfg.target.metric,
                                   self.cfg.eval.every_samples)) is not None:
                stop_attempt(self.proc, self.token, self.cfg.command.stop_grace_s)
                raise self._failed(why)
        self.state.update_status()
        return changed

    def _ignored_checkpoint(self) -> str | None:
        """TRL resumes only where `trl grpo` passes `--resume_from_checkpoint` on to
        `trainer.train` (trl/scripts/grpo.py, from trl 1.16): an attempt of an older trl that
        was given a checkpoint and started over would redo every step on each resume, so it
        fails in one line instead (other frameworks' restarts replace the rows, with a
        warning)."""
        if self.cfg.command.framework != "trl" or not self.follower.restarts:
            return None
        number, ckpt, first = self.follower.restarts[0]
        return (f"attempt {number} was given TRL's checkpoint at step {ckpt} but logged step "
                f"{first} again: this trl does not resume (`trl grpo` passes "
                "--resume_from_checkpoint to trainer.train from trl 1.16); install "
                "trl>=1.16,<2, the version rlbatch[trl] pins")

    def _write(self, steps: list, evals: list) -> None:
        """Append the new rows; rewrite both logs when earlier rows changed (an attempt that
        continued from a checkpoint replaced them)."""
        from rlbatch.core.runlog import RunWriter

        old_steps, old_evals = self._written
        st = self.state
        if steps[:len(old_steps)] != old_steps or evals[:len(old_evals)] != old_evals:
            st.writer.close()
            for name, rows in (("steps.jsonl", steps), ("evals.jsonl", evals)):
                atomic_write_text(st.dir / name, "".join(dumps_strict(r) + "\n" for r in rows))
            st.writer = RunWriter(st.dir)
            new_steps, new_evals = steps, evals
        else:
            new_steps, new_evals = steps[len(old_steps):], evals[len(old_evals):]
            st.writer.log_converted(new_steps, new_evals)
        self._written = (list(steps), list(evals))
        for r in sorted([*(("step", r) for r in new_steps), *(("eval", r) for r in new_evals)],
                        key=lambda kr: (kr[1]["step"], kr[0] == "eval")):
            self.cb(*r)

    def _count(self, steps: list, evals: list) -> None:
        """The counters from the rows (the target crossing, the budget), as if logged now."""
        st = self.state
        st.c = Counters.fresh(self.cfg)
        if steps:
            last = steps[-1]
            for key in ("step", "samples", "prompts", "tokens", "train_s"):
                if last.get(key) is not None:
                    setattr(st.c, key, last[key])
            st.c.first_step_s = steps[0].get("train_s")
        for row in evals:
            st.record_eval(row, 0.0)
        div = nonfinite_steps(steps)
        st.c.nonfinite_total, st.c.nonfinite_run = div.total, div.run
        limit = self.cfg.nonfinite.max_consecutive
        if div.total:
            self._warn(f"step {div.first}: the command logged {', '.join(div.first_keys)} "
                       "non-finite (NaN or inf)")
        if div.run >= limit:
            st.c.stop_reason = (
                f"diverged: the command logged non-finite {', '.join(div.keys)} at "
                f"{div.run} consecutive steps ({div.run_from}..{steps[-1]['step']}; "
                f"nonfinite.max_consecutive {limit})")
        for step in nonfinite_evals(evals, self.cfg.target.metric):
            self._warn(f"the evaluation at step {step} logged {self.cfg.target.metric} "
                       "non-finite (NaN or inf): not a value, so not a crossing")
        self._set_extra()
        st.write_summary()

    def _warn(self, text: str) -> None:
        if text not in self.follower.warnings:
            self.follower.warnings.append(text)

    # ---- the end ----
    def _ended(self, code: int) -> None:
        st = self.state
        st.update_status()
        if st.status == "diverged":  # it logged its divergence, then stopped on it
            return
        if code != 0:
            raise self._failed(exit_words(code))
        if not self._written[0]:
            raise self._failed("exited 0 without logging a training step")
        if st.status == "running":  # it ended by its own rule (an epoch limit, say)
            st.c.status = "target_reached" if st.c.target else "budget_exhausted"
            budget = self.cfg.budget.max_samples
            if st.c.samples < budget:  # censored where it ended, and said to be short
                st.c.stop_reason = (
                    f"ended_short: the command exited 0 after {st.c.samples:,} of "
                    f"budget.max_samples {budget:,} samples (its own step or epoch limit, "
                    "or a log that lost its last rows)")

    def _failed(self, why: str) -> CommandFailed:
        """The one-line failure: the program, why, how far it got, its output's tail."""
        self._set_extra()
        tail = output_tail(self.output)
        steps = len(self._written[0])
        return CommandFailed(f"{self.cfg.command.argv[0]} {why} after {steps} logged step(s)"
                             + (f": {tail}" if tail else "")
                             + f" (its output: {self.output})", where="command")

    def _set_extra(self) -> None:
        """summary.json's `command`: the framework, attempts, exit status, timing source and
        the converter's warnings."""
        f = self.follower
        self.state.extra = {"command": {
            "framework": self.cfg.command.framework, "attempts": len(self.attempts),
            "exit_status": None if self.proc is None else self.proc.returncode,
            "train_s_source": TRAIN_S_SOURCE[self.cfg.command.framework],
            "output": str(self.output), "output_dropped_bytes": self.output_dropped,
            "log_reads": f.conversions,
            "log_read_cpu_s": f.cpu_s, "warnings": f.warnings[:20]}}

    def _close(self) -> None:
        """Stop what is left of the attempt: the command if it still runs, and whatever it
        left behind after it exited (its group, its token, descendants adopted here)."""
        if self.proc is not None:
            stop_attempt(self.proc, self.token, self.cfg.command.stop_grace_s)
        if self.attempts:  # its rows as they ended, for the re-run that resumes it
            self.follower.freeze(self.attempts[-1], None if self.proc is None
                                 else self.proc.returncode)
