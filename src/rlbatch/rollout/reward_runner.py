"""The reward runner: every reward call of a run goes through it, under one stated policy.

Built-in rewards, `module:function` rewards marked `cheap = True`, and any reward under
`reward.workers: 0` run in the training process with a SIGALRM timeout
(`rollout/deadline.py`); every other `module:function` runs in a pool of `reward.workers`
worker processes (`python -m rlbatch.rollout.reward_runner`, one socket pair each), where a
worker that times out or dies is replaced. `classify` sorts each result into a reward,
unscorable (None) or a fault (`error`, `timeout`, `nonfinite`); the trainer applies the
fault policy, this module only reports the faults (`FaultLog`). Where each kind of call
runs, the limits of the in-process timeout and the pool's start-up: docs/design.md,
"Module notes".
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from rlbatch.core.config import RewardConfig
from rlbatch.core.errors import (
    ConfigError,
    Interrupted,
    Terminated,
    UserError,
    pending_stop,
    sanitize,
)
from rlbatch.core.launch import module_argv
from rlbatch.rollout.deadline import CallTimeout, Deadlines, alarm_usable
from rlbatch.rollout.rewards import BUILTIN_REWARDS, make_reward
from rlbatch.rollout.tasks import Example

FAULT_KINDS = ("error", "timeout", "nonfinite")
COUNTER_KEYS = {"error": "errors", "timeout": "timeouts", "nonfinite": "nonfinite"}
FLOAT32_MAX = 3.4028234663852886e38
MAX_LOGGED = 20  # distinct fault messages kept per run
_MESSAGE_CHARS = 300


class RewardError(UserError):
    """A reward function that cannot be used, or faults past the configured error rate."""


@dataclass(frozen=True)
class Call:
    prompt: str
    completion: str
    example: Example
    prompt_index: int  # the prompt's index in the training stream or the held-out set


@dataclass
class Scored:
    """The outcome of a batch of calls, in call order."""

    values: list  # float, or None (unscorable, or a fault)
    faults: list  # None, or one of FAULT_KINDS
    messages: list  # None, or the fault's one-line message

    def counts(self) -> dict:
        return {COUNTER_KEYS[k]: sum(f == k for f in self.faults) for k in FAULT_KINDS}

    @property
    def faulted(self) -> list[bool]:
        return [f is not None for f in self.faults]

    @property
    def n_faults(self) -> int:
        return sum(self.faulted)


def one_line(text: str) -> str:
    """Outside text (a reward's message, a prompt) as one safe line: whitespace runs (CR and
    newlines included) become one space, other control characters are escaped (`sanitize`:
    an ESC from a reward's exception must not reach the terminal), at most 300 characters."""
    text = sanitize(" ".join(str(text).split()))
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def describe_exception(exc: BaseException) -> str:
    if isinstance(exc, UserError):
        return one_line(str(exc))
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):  # named: the reward did it, not us
        what = f"SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else "KeyboardInterrupt"
        return one_line(f"the reward function raised {what}; a reward must return a value, "
                        "not exit or interrupt the run")
    return one_line(f"{type(exc).__name__}: {exc}")


def classify(value) -> tuple[str | None, float | None, str | None]:
    """(fault kind or None, reward or None, message or None) of what a reward returned."""
    if value is None:
        return None, None, None
    if isinstance(value, numbers.Real):  # bool, int, float, numpy scalars
        number = float(value)
        if not math.isfinite(number):
            return "nonfinite", None, f"returned {number}"
        if abs(number) > FLOAT32_MAX:  # rewards are float32 tensors: this would become inf
            return "nonfinite", None, f"returned {number:g}, beyond the float32 range"
        return None, number, None
    return "error", None, f"returned {type(value).__name__}; expected a number, a bool or None"


def call_in_process(fn, call: Call, timer: Deadlines | None = None,
                    ) -> tuple[str | None, float | None, str | None]:
    """One call under the policy: an exception of the function is a fault, never a crash;
    with a `timer` (in-process deadlines) a call past its deadline is a `timeout` fault."""
    try:
        if timer is not None:
            timer.start()
        try:
            value = fn(call.prompt, call.completion, call.example)
        finally:
            if timer is not None:
                timer.stop()
    except CallTimeout:
        return "timeout", None, (f"no result within {timer.seconds:g} s (in-process call "
                                 "interrupted)")
    except (Terminated, Interrupted):  # a stop signal to the trainer: not the reward's fault
        raise
    except KeyboardInterrupt as exc:  # the function's own, unless no CLI handler tells them apart
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            raise
        return "error", None, describe_exception(exc)
    # the user's function may raise anything (sys.exit included): counted, not fatal
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        outcome = ("error", None, describe_exception(exc))
    else:
        outcome = classify(value)
    if (stop := pending_stop()) is not None:  # a function that swallowed the stop signal
        raise stop
    return outcome


# ---------------------------------------------------------------- the worker process

def _worker_main(fd: int) -> None:
    """Serve calls on the socket `fd`: the first message is (sys.path, spec, tolerance)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and closes us
    sys.stdout = sys.stderr  # a print in the reward must not mix into the CLI's stdout
    conn = Connection(fd)
    try:
        path, spec, tolerance = conn.recv()
    except (EOFError, OSError):  # the trainer closed us before we started
        return
    try:
        sys.path[:] = path
        fn = make_reward(spec, tolerance)
    # importing the user's module may raise anything: reported to the parent as one line
    except Exception as exc:  # noqa: BLE001
        _send(conn, ("import_error", describe_exception(exc)))
        return
    reply: tuple = ("ready", None)
    while _send(conn, reply):
        try:
            index, prompt, completion, example = conn.recv()
        except (EOFError, OSError):  # the trainer closed us or died
            return
        try:
            value = fn(prompt, completion, example)
            kind, out, msg = classify(value)
        # the user's function may raise anything, sys.exit and KeyboardInterrupt included
        # (SIGINT is ignored here, so that one is the function's own): counted by the parent
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001
            kind, out, msg = "error", None, describe_exception(exc)
        reply = (index, kind, out, msg)


def _send(conn: Connection, message: tuple) -> bool:
    try:
        conn.send(message)
    except OSError:  # the trainer closed us or died
        return False
    return True


class _Worker:
    def __init__(self, spec: str, tolerance: float):
        parent, child = socket.socketpair()
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # rlbatch importable in the worker
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        # its own session and process group (pgid = its pid): whatever the function forks
        # stays in it and is killed with it; a terminal's Ctrl-C or hang-up reaches only
        # the trainer, which closes the pool
        self.proc = subprocess.Popen(
            module_argv("rlbatch.rollout.reward_runner", str(child.fileno())),
            pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
            start_new_session=True)
        child.close()
        self.conn = Connection(parent.detach())
        self.conn.send((list(sys.path), spec, tolerance))
        self.started = time.monotonic()
        self.ready = False
        self.busy: tuple[int, float] | None = None  # (call index, start time)

    def _kill_group(self) -> None:
        """SIGKILL to the worker's process group: the worker and every process the reward
        function started that did not leave the group (`setsid` would escape it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone already
            pass

    def kill(self) -> None:
        self._kill_group()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass
        self.conn.close()

    def close(self) -> None:
        self.conn.close()  # EOF: the worker leaves its loop
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # and whatever it left behind in its group


class RewardPool:
    """`workers` processes calling `make_reward(spec, tolerance)`, with a per-call timeout."""

    def __init__(self, spec: str, tolerance: float, workers: int, timeout_s: float):
        self.spec, self.tolerance, self.timeout_s = spec, tolerance, timeout_s
        self.startup_s = max(60.0, timeout_s)
        self.workers = [_Worker(spec, tolerance) for _ in range(workers)]
        self.replaced = 0
        deadline = time.monotonic() + self.startup_s
        while not all(w.ready for w in self.workers):  # fail early, with one line
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise RewardError(f"task.reward: {spec}: reward workers did not start within "
                                  f"{self.startup_s:g} s")
            for conn in wait([w.conn for w in self.workers if not w.ready], timeout=left):
                self._on_message(self._by_conn(conn), None, None)

    def _by_conn(self, conn) -> _Worker:
        return next(w for w in self.workers if w.conn is conn)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = _Worker(self.spec, self.tolerance)
        self.replaced += 1

    def _on_message(self, w: _Worker, results: list | None, todo: deque | None) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            try:
                code = w.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:  # its socket broke but it lives: killed below
                code = None
            if not w.ready:
                self.close()
                raise RewardError(f"task.reward: {self.spec}: a reward worker exited while "
                                  f"starting (exit code {code})") from None
            if w.busy is not None and results is not None:
                results[w.busy[0]] = ("error", None, f"reward worker died (exit code {code})")
            self._replace(w)
            return
        if not w.ready:
            if msg[0] == "import_error":
                self.close()
                raise RewardError(msg[1])
            w.ready = True
            return
        index, kind, value, message = msg
        if results is not None:
            results[index] = (kind, value, message)
        w.busy = None

    def map(self, calls: list[Call]) -> list[tuple]:
        results: list = [None] * len(calls)
        todo = deque(range(len(calls)))
        while todo or any(w.busy for w in self.workers):
            for w in self.workers:
                if w.ready and w.busy is None and todo:
                    i = todo.popleft()
                    c = calls[i]
                    try:
                        w.conn.send((i, c.prompt, c.completion, c.example))
                    except OSError:  # died between calls: replace it and retry the call
                        todo.appendleft(i)
                        self._replace(w)
                        continue
                    w.busy = (i, time.monotonic())
            waiting = [w for w in self.workers if w.busy or not w.ready]
            now = time.monotonic()
            ends = [w.busy[1] + self.timeout_s for w in waiting if w.busy]
            ends += [w.started + self.startup_s for w in waiting if not w.ready]
            timeout = max(0.0, min(ends) - now) if ends else None
            for conn in wait([w.conn for w in waiting], timeout=timeout):
                self._on_message(self._by_conn(conn), results, todo)
            self._expire(results)
        return results

    def _expire(self, results: list) -> None:
        now = time.monotonic()
        for w in list(self.workers):
            if w.busy and now - w.busy[1] > self.timeout_s:
                results[w.busy[0]] = ("timeout", None, (f"no result within {self.timeout_s:g} s "
                                                        "(worker killed and replaced)"))
                self._replace(w)
            elif not w.ready and now - w.started > self.startup_s:
                self.close()
                raise RewardError(f"task.reward: {self.spec}: a replacement reward worker did "
                                  f"not start within {self.startup_s:g} s")

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []


# ---------------------------------------------------------------- the runner

def fault_key(kind: str | None, message: str | None) -> tuple:
    """What makes two faults "the same": kind and message with quoted text and numbers
    masked, so `failed on '12+34='` and `failed on '56+78='` count once."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message or "")
    return kind, re.sub(r"\d+(\.\d+)?", "N", text)


@dataclass
class FaultLog:
    """The first `MAX_LOGGED` distinct faults (`fault_key`) of a run."""

    seen: set = field(default_factory=set)

    def new(self, function: str, scored: Scored, calls: list[Call]) -> list[dict]:
        rows = []
        for call, kind, message in zip(calls, scored.faults, scored.messages):
            key = fault_key(kind, message)
            if kind is None or key in self.seen or len(self.seen) >= MAX_LOGGED:
                continue
            self.seen.add(key)
            rows.append({"kind": kind, "function": function, "prompt_index": call.prompt_index,
                         "prompt": one_line(call.prompt)[:120], "message": message})
        return rows


class RewardRunner:
    """Scores batches of calls with `task.reward` in-process, or in a `RewardPool`."""

    def __init__(self, task, spec: str, tolerance: float, cfg: RewardConfig):
        self.task, self.spec, self.tolerance, self.cfg = task, spec, tolerance, cfg
        self.name = spec
        custom = spec not in BUILTIN_REWARDS and ":" in spec
        cheap = custom and bool(getattr(make_reward(spec, tolerance), "cheap", False))
        self.pooled = custom and cfg.workers > 0 and not cheap
        self.pool: RewardPool | None = None
        self.log = FaultLog()
        self.warned = False

    def score(self, calls: list[Call]) -> Scored:
        if self.pooled:
            if self.pool is None:
                self.pool = RewardPool(self.spec, self.tolerance, self.cfg.workers,
                                       self.cfg.timeout_s)
            outcomes = self.pool.map(calls)
        else:
            timeout = self.cfg.timeout_s if alarm_usable() else None
            if timeout is None and not self.warned:
                self.warned = True
                warnings.warn("reward.timeout_s does not apply to in-process reward calls "
                              "outside the main thread or POSIX (SIGALRM)", stacklevel=2)
            with Deadlines(timeout) if timeout else nullcontext() as timer:
                outcomes = [call_in_process(self.task.reward, c, timer) for c in calls]
        values = [v for _, v, _ in outcomes]
        return Scored(values, [k for k, _, _ in outcomes], [m for _, _, m in outcomes])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


if __name__ == "__main__":  # a pool worker: python -m rlbatch.rollout.reward_runner FD
    try:
        _worker_main(int(sys.argv[1]))
    except (IndexError, ValueError):
        raise ConfigError("usage: python -m rlbatch.rollout.reward_runner FD") from None
