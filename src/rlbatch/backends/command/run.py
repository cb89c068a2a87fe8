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

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rlbatch.backends.builtin.counters import Counters
from rlbatch.backends.builtin.runstate import RunState, open_run, run_recorded
from rlbatch.backends.command.follow import TRAIN_S_SOURCE, Attempt, Follower, output_tail
from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError, UserError
from rlbatch.core.launch import module_argv
from rlbatch.core.runlog import atomic_write_json, atomic_write_text, dumps_strict, read_json

Callback = Callable[[str, dict], None]
HOME = "command"  # the trial's folder for the command: attempts/, checkpoints, shared logs
READ_SHARE = 0.05  # the most of one core that reading the command's log may take


class CommandFailed(UserError):
    """The command exited with a non-zero status, or stopped logging: one line with the
    tail of its output."""


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
        workdir=c.workdir)


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
    check_framework_files(cfg, where, prompts or {cfg.batch.prompts_per_step})


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


ROWS_FILE = "rows.json"  # an ended attempt's rows (follow.py, Follower.freeze)
TOKEN = "RLBATCH_COMMAND_TOKEN"  # in every process an attempt starts, whatever its group


def marked(token: str) -> list[int]:
    """The processes whose environment carries `TOKEN=token`: an attempt's command and all
    it started, including those that left its process group (Linux /proc; elsewhere none)."""
    needle = f"{TOKEN}={token}".encode()
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in env.read_bytes().split(b"\0"):
                found.append(int(env.parent.name))
        except (OSError, ValueError):
            continue
    return [pid for pid in found if pid != os.getpid()]


PR_SET_CHILD_SUBREAPER = 36
_SUBREAPER: list[bool] = [False]


def become_subreaper() -> None:
    """Make this process the subreaper of what it starts (Linux PR_SET_CHILD_SUBREAPER): a
    descendant of the command whose parent ends, one that daemonized with `setsid` and a
    scrubbed environment included, becomes this process's child instead of init's, and
    `adopted` finds it. Only for a process that is rlbatch's own (the CLI's `rlbatch train`):
    inside another program it would adopt, and stop, that program's orphans."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) == 0:
            _SUBREAPER[0] = True


def adopted(started: set[int]) -> list[int]:
    """This process's children other than `started` (the ones it started itself): as a
    subreaper, the orphaned descendants of its command. Empty unless `become_subreaper`
    took effect."""
    if not _SUBREAPER[0]:
        return []
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and int(stat.parent.name) not in started:
            found.append(int(stat.parent.name))
    return found


def _reap(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_attempt(proc: subprocess.Popen | None, token: str, grace_s: float) -> None:
    """SIGTERM to the command's process group, to every process of the attempt (its token)
    and to every descendant this process adopted as a subreaper, SIGKILL to what is left
    after `grace_s`; `proc` (when it is this process's child) and the adopted are reaped."""
    started = set() if proc is None else {proc.pid}
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    _signal_all(marked(token) + adopted(started), signal.SIGTERM)

    def live_adopted() -> list[int]:  # an adopted zombie has ended: it is only reaped
        return [p for p in adopted(started) if not _gone(p)]

    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (marked(token) or live_adopted()
                                           or (proc and proc.poll() is None)):
        time.sleep(0.1)
    if proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    left = adopted(started)
    _signal_all(marked(token) + left, signal.SIGKILL)
    _reap(left)
    if proc is not None:
        proc.wait()


# attempts in a row that may fail on one checkpoint before the next is refused
CHECKPOINT_TRIES = 2
# how a refused attempt's failure begins (summary.json `failure`: "command: <this>: ..."): a
# re-run does not resume such a run, so `rlbatch profile` does not advise one
CHECKPOINT_REFUSED = "checkpoint refused"


def bad_checkpoint(earlier: list[dict], resume, attempts_dir: Path) -> str | None:
    """Why the next attempt is refused, or None: the last CHECKPOINT_TRIES attempts were
    each given the checkpoint it would be given (`resume`), and each exited with an error
    status (not a signal) before logging a step after it, so the checkpoint itself is the
    likely fault and another attempt would fail the same way."""
    if resume is None:
        return None
    failed = []
    for info in reversed(earlier):
        if info.get("resume_from") != str(resume.path):
            break
        rows_file = attempts_dir / f"{info['number']:03d}" / ROWS_FILE
        doc = read_json(rows_file) if rows_file.is_file() else {}
        status = doc.get("exit_status")
        if not isinstance(status, int) or not 0 < status < 128 \
                or any(r.get("step", 0) > resume.step for r in doc.get("steps", [])):
            break
        failed.append((info["number"], status))
    if len(failed) < CHECKPOINT_TRIES:
        return None
    numbers = " and ".join(str(n) for n, _ in reversed(failed))
    return (f"attempts {numbers} were each given the checkpoint {resume.path} (step "
            f"{resume.step}) and exited with an error (status "
            f"{', '.join(str(st) for _, st in reversed(failed))}) before logging a step after "
            "it: the checkpoint may be unreadable; remove it so that the next attempt does "
            "not resume from it, or start the run over with --fresh")


OUTPUT_CAP = 64 << 20  # bytes of an attempt's output.log before it is cut back
OUTPUT_HEAD = 1 << 20  # bytes of its start kept when it is


def cap_output(path: Path) -> int:
    """Keep an attempt's output.log under OUTPUT_CAP bytes: past it, the file is cut back to
    its first OUTPUT_HEAD bytes and a line saying how much was cut; the command appends
    after that (its output was opened for appending), so the newest output, which a
    failure's message quotes, is always at the end. Returns the bytes cut."""
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    if size <= OUTPUT_CAP:
        return 0
    with open(path, "r+b") as f:
        f.truncate(OUTPUT_HEAD)
    with open(path, "ab") as f:
        f.write(f"\n[rlbatch: {size - OUTPUT_HEAD:,} bytes of output cut here: output.log "
                f"is kept under {OUTPUT_CAP:,} bytes]\n".encode())
    return size - OUTPUT_HEAD


# step keys whose non-finite value (a converter's null: "measured, not finite") means the
# update diverged (docs/metrics.md)
DIVERGENCE_KEYS = ("actor/loss", "actor/grad_norm", "critic/loss", "critic/grad_norm",
                   "reward/mean")
# evaluations in a row without the target metric, after one that had it (or from the first),
# before the run fails as no longer measured
TARGET_LOST_AFTER = 3


@dataclass(frozen=True)
class NonFinite:
    """Steps whose divergence keys were logged non-finite: `total` of them, the trailing
    `run` of consecutive ones (from step `run_from`, with the `keys` they had), and the first
    such step with its keys."""

    total: int = 0
    run: int = 0
    run_from: int | None = None
    keys: tuple = ()
    first: int | None = None
    first_keys: tuple = ()


def nonfinite_steps(steps: list) -> NonFinite:
    total = run = 0
    run_from = first = None
    keys: set = set()
    first_keys: tuple = ()
    for r in steps:
        bad = tuple(k for k in DIVERGENCE_KEYS if k in r and r[k] is None)
        if not bad:
            run, run_from, keys = 0, None, set()
            continue
        total += 1
        if first is None:
            first, first_keys = r["step"], bad
        if run == 0:
            run_from = r["step"]
        run += 1
        keys.update(bad)
    return NonFinite(total, run, run_from, tuple(k for k in DIVERGENCE_KEYS if k in keys),
                     first, first_keys)


def nonfinite_evals(evals: list, metric: str) -> list[int]:
    """Steps of the evaluations that logged the target metric non-finite (null)."""
    return [r["step"] for r in evals if metric in r and r[metric] is None]


def target_lost(evals: list, metric: str, every: int = 0) -> str | None:
    """Why the run can no longer be judged, or None: the last TARGET_LOST_AFTER evaluations
    lack the target metric (renamed, or never logged under that name), and they span at
    least TARGET_LOST_AFTER - 1 evaluation intervals (`every` samples: rows of a framework
    that logs several evaluation sets apart are not mistaken for it), so a crossing can no
    longer be seen and the run would read as one that did not cross."""
    had = [i for i, r in enumerate(evals) if metric in r]
    since = evals[had[-1] + 1:] if had else evals
    if len(since) < TARGET_LOST_AFTER or (
            since[-1].get("samples", 0) - since[0].get("samples", 0)
            < (TARGET_LOST_AFTER - 1) * every):
        return None
    keys = sorted({k for r in since for k in r if k.startswith("eval/")})[:6]
    logs = f"they log {', '.join(keys)}" if keys else "they log no eval/ key"
    if had:
        return (f"stopped logging the target metric {metric} (target.metric): the last at "
                f"step {evals[had[-1]]['step']}, none in the {len(since)} evaluations since "
                f"(steps {since[0]['step']}..{since[-1]['step']}; {logs})")
    return (f"logged no target metric {metric} (target.metric) in its {len(since)} "
            f"evaluations (steps {since[0]['step']}..{since[-1]['step']}; {logs})")


def exit_words(code: int) -> str:
    """A process's return code in words: `killed by SIGSEGV` for a signal (a negative
    code, as Python's subprocess reports it), `exited with status 139 (128 + SIGSEGV: a
    shell's way of saying its child was killed by it)` for 128 + a signal, else `exited with
    status N`."""
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if 128 < code < 128 + 65:
        sig = _signal_name(code - 128)
        return (f"exited with status {code} (128 + {sig}: a shell's way of saying its child "
                f"was killed by {sig})")
    return f"exited with status {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


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
