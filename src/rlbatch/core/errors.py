"""Errors that reach the user as one line and exit status 2 (docs/design.md, house rule 10).

`UserError` is for bad input: a config, dataset file, model path or log file that cannot be
used. The CLI prints `str(error)` alone (no traceback) and exits with `EXIT_USAGE`. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_USAGE = 2


class UserError(Exception):
    """Bad input. The message names the field, or the file and line, in one line."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        text = f"{where}: {message}" if where else message
        super().__init__(" ".join(text.split("\n")))


class ConfigError(UserError):
    """A configuration value, key or file that cannot be resolved."""


class DataError(UserError):
    """A dataset or log file row that cannot be read."""


class Terminated(Exception):
    """A termination signal (SIGTERM: preemption, a scheduler, `rlbatch profile` stopping its
    trials) turned into an exception, so a run writes down how it ended (`failed`, resumable)
    instead of vanishing as `running`. The CLI exits with 128 + the signal number."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        super().__init__(f"terminated by {signal.Signals(signum).name}")
