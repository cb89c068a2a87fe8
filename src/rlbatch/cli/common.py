"""Helpers shared by CLI commands: config options, comma-separated lists, JSON output, and
the stop signals of the commands that run for long (`stop_signals`)."""

from __future__ import annotations

import contextlib
import signal

import typer

from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError, pending_stop, stop_signal
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import dumps_strict

# The arguments this invocation was given after `rlbatch` (set by main.main), for commands
# that print a command to continue them.
INVOKED: list[str] = []
# Whether rlbatch is this process's program (main.main called with no argv), not a library
# call inside another program: process-wide settings (a subreaper) are made only then.
WHOLE_PROCESS = False

SetOption = typer.Option(None, "--set", help="override a config value: a.b=c (repeatable)")
PresetOption = typer.Option(None, "--preset", help="start from a built-in preset")


def resolve(config: str | None, preset: str | None, overrides: list[str] | None) -> Config:
    return load_config(config, preset=preset, overrides=list(overrides or []))


def whole_numbers(text: str, flag: str) -> list[int]:
    """A flag's comma-separated positive whole numbers (`8,32,64`); ConfigError naming `flag`
    and the first value that is not one."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"{flag}: expected comma-separated integers; '{part}' is not a "
                              f"whole number") from None
        if value <= 0:
            raise ConfigError(f"{flag}: expected positive integers; '{part}' is not positive")
        values.append(value)
    if not values:
        raise ConfigError(f"{flag}: give one or more positive integers")
    return values


def print_json(obj) -> None:
    """The last stdout line: one JSON document."""
    print(dumps_strict(obj))


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def stop_signals():
    """SIGTERM and SIGHUP (a closed terminal) raise `Terminated`, SIGINT raises `Interrupted`,
    so the run is marked failed (and resumable) instead of being left `running`. Only the first
    signal is raised: later ones are ignored until the handlers are removed, so repeated
    Ctrl-Cs cannot cut the status write short (it comes first, then the shutdown)."""

    def on_signal(signum, frame):
        if pending_stop() is None:
            raise stop_signal(signum)

    # a signal ignored when we started (`nohup` ignores SIGHUP, a shell's `&` job SIGINT)
    # stays ignored
    previous = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        stopped = pending_stop() is not None
        for s, handler in previous.items():  # after a stop, Ctrl-C stays ignored to the exit
            signal.signal(s, signal.SIG_IGN if stopped and s == signal.SIGINT else handler)
        stop_signal(None)
