"""A deadline for a call made in this process: `reward.timeout_s` for in-process rewards
(built-in rewards, functions declared `cheap`, `reward.workers: 0`; rollout/reward_runner.py).

A Python call can be interrupted from outside only by a signal, so the deadline is an
ITIMER_REAL timer whose SIGALRM handler raises `CallTimeout` into the running code. Python
delivers signal handlers only in the main thread of the main interpreter, and setitimer is
POSIX: elsewhere `alarm_usable()` is False and the caller runs without a deadline. Limits: the
handler runs between bytecodes, so a blocking call (`time.sleep`, a socket read) is cut short
but one long computation inside a single C call is interrupted only when it returns; a
function that sets its own SIGALRM timer replaces this one for the rest of that call. Other
signal handling (SIGTERM raising `Terminated` in `rlbatch train`, Ctrl-C) is untouched, and a
SIGALRM handler and timer that were set before are put back afterwards.
"""

from __future__ import annotations

import math
import signal
import threading
import time


class CallTimeout(BaseException):
    """Raised into an in-process call past its deadline; a BaseException, so that the
    function's own `except Exception` does not swallow it."""


def alarm_usable() -> bool:
    """Python runs signal handlers only in the main thread of the main interpreter, setitimer
    is POSIX, and a SIGALRM handler set outside Python (getsignal None) cannot be put back."""
    return (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) is not None)


class Deadlines:
    """Per-call deadlines for a series of calls, by SIGALRM (`alarm_usable()` must hold):

        with Deadlines(seconds) as timer:
            for ...:
                timer.start()
                try:
                    ...  # raises CallTimeout `seconds` after start(), once
                finally:
                    timer.stop()

    The handler is installed once for the series (installing one costs ~15 us; a call's
    start/stop only sets the timer). An outer timer (ITIMER_REAL) that falls due meanwhile is
    delivered to its handler on time; the outer handler and what is left of its timer are put
    back on exit."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.due = math.inf
        self.fired = False

    def __enter__(self) -> Deadlines:  # noqa: PYI034  (typing.Self needs Python 3.11)
        self.outer = signal.getsignal(signal.SIGALRM)
        left, self.interval = signal.getitimer(signal.ITIMER_REAL)
        self.outer_due = time.monotonic() + left if left > 0 else math.inf
        signal.signal(signal.SIGALRM, self._on_alarm)
        self._arm()  # the outer timer keeps running, through our handler
        return self

    def start(self) -> None:
        self.due, self.fired = time.monotonic() + self.seconds, False
        self._arm()

    def stop(self) -> None:
        self.due = math.inf
        self._arm()

    def _arm(self) -> None:
        soonest = min(self.due, self.outer_due)
        delay = 0.0 if soonest == math.inf else max(soonest - time.monotonic(), 1e-6)
        signal.setitimer(signal.ITIMER_REAL, delay)

    def _on_alarm(self, signum, frame) -> None:
        now = time.monotonic() + 1e-3  # the two clocks may differ by a hair
        if now >= self.outer_due:  # the outer timer's turn: deliver it, keep ours
            self.outer_due = self.outer_due + self.interval if self.interval else math.inf
            self._arm()
            if callable(self.outer):
                self.outer(signum, frame)
            elif self.outer == signal.SIG_DFL:  # what it would have done: end the process
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.raise_signal(signal.SIGALRM)
        elif now >= self.due and not self.fired:
            self.fired, self.due = True, math.inf
            self._arm()
            raise CallTimeout
        else:  # a stale alarm (its call already stopped): wait for what is due
            self._arm()

    def __exit__(self, *exc) -> None:
        try:  # nested: a timeout raised on the first line still restores the outer state
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, self.outer)
            if self.outer_due < math.inf:
                signal.setitimer(signal.ITIMER_REAL,
                                 max(self.outer_due - time.monotonic(), 1e-6), self.interval)
