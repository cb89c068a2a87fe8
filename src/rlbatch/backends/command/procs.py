"""The processes of a command's attempt: every process an attempt starts carries its token
in its environment (`TOKEN`), `rlbatch train` adopts orphans as a child subreaper, and an
attempt is stopped as a whole (SIGTERM, then SIGKILL after the grace). How a command ended,
in words."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

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
