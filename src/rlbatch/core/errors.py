"""Errors that reach the user as one line and exit status 2 (docs/design.md, house rule 10).

`UserError` is for bad input: a config, dataset file, model path or log file that cannot be
used. `OutputError` is its kind for output that cannot be written (a full disk, a read-only
folder, a file where a folder must be); `writing(path)` turns such an OSError into one. The
CLI prints `str(error)` alone (no traceback) and exits with `EXIT_USAGE`. Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_USAGE = 2
EXIT_FAILED = 1  # a run that ended `failed` (its one-line reason on stderr)
EXIT_DIVERGED = 3  # a run that ended `diverged`: finished, but not a result


def sanitize(text: str, *, multiline: bool = False) -> str:
    """Outside text (a reward's exception, a dataset value, a framework's log line) made safe
    for a terminal: every character that does not print (ESC, CR, BEL, backspace, the other C0
    and C1 controls, DEL, bidi overrides) is written as its escape (`\\x1b`), so it cannot
    clear the screen, move the cursor or overwrite a line. `multiline` keeps newlines (and
    tabs); else they are escaped too. Every message that quotes outside text goes through it."""
    keep = "\n\t" if multiline else ""
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in str(text))


def missing(path: str | os.PathLike, what: str = "file") -> str:
    """Why `path` cannot be opened, in words: `"<what> not found"`, except that a symbolic
    link loop and a link to nothing are named as such (both read as "not found" otherwise)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (too many levels of symbolic links)"
        if os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
    return f"{what} not found"


class UserError(Exception):
    """Bad input. The message names the field, or the file and line, in one line."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        text = " ".join((f"{where}: {message}" if where else message).split("\n"))
        # characters that do not print (ESC, CR, C1 controls) quoted from a file would rewrite
        # the terminal: they are escaped
        super().__init__(sanitize(text))


class ConfigError(UserError):
    """A configuration value, key or file that cannot be resolved."""


class DataError(UserError):
    """A dataset or log file row that cannot be read."""


# The errnos of output that cannot be written, what they mean and what to do about them.
_SPACE = "free space and run it again"
_ACCESS = "make it writable or choose another output folder"
_IN_THE_WAY = "move it away or choose another output folder"
_RESUME = {_SPACE: "free space and ", _ACCESS: "make it writable and ",
           _IN_THE_WAY: "move it away and "}  # what to do before `--resume`
_DISK_ERRNOS = {
    errno.ENOSPC: ("no space left on device", _SPACE),
    errno.EDQUOT: ("disk quota exceeded", _SPACE),
    errno.EACCES: ("permission denied", _ACCESS),
    errno.EPERM: ("operation not permitted", _ACCESS),
    errno.EROFS: ("read-only file system", _ACCESS),
    errno.EISDIR: ("is a directory, not a file", _IN_THE_WAY),
    errno.ENOTDIR: ("is a file, not a folder", _IN_THE_WAY),
    errno.EEXIST: ("exists and is not a folder", _IN_THE_WAY),
}


class OutputError(UserError):
    """Output that cannot be written: `<path>: <what happened> (errno N); <what to do>`.
    `errno` keeps the number; `resumable()` gives the hint of a run that `--resume` continues."""

    def __init__(self, path: str | os.PathLike | None, code: int, hint: str | None = None):
        self.path = None if path is None else os.fspath(path)
        self.errno = code
        what, default = _DISK_ERRNOS.get(code, (os.strerror(code).lower(), None))
        self.hint = default if hint is None else hint  # "": no hint
        text = f"{what} (errno {code})" + (f"; {self.hint}" if self.hint else "")
        super().__init__(text, where=self.path)

    def resumable(self) -> OutputError:
        """The same error, telling a training run's user to continue it with --resume."""
        hint = _RESUME.get(self.hint, f"{self.hint}, then " if self.hint else "")
        return OutputError(self.path, self.errno, hint + "rerun with --resume")


def output_error(exc: BaseException, path: str | os.PathLike | None = None, *,
                 output: bool = True) -> OutputError | None:
    """The `OutputError` for an OSError that means the output cannot be written (full disk,
    quota, permissions, read-only file system, a file or folder in the way), naming `path`
    (else the error's own file name); None for any other exception, which stays a bug.
    `output=False`: not known to be output (the CLI's last resort), so only a full disk's
    hint is given; "make it writable" would mislead about an input file."""
    if isinstance(exc, OutputError):
        return exc
    if not isinstance(exc, OSError) or exc.errno not in _DISK_ERRNOS:
        return None
    path = os.fspath(path if path is not None else exc.filename or "") or None
    if exc.errno == errno.EEXIST and (path is None or os.path.isdir(path)):
        return None  # not a file in the way of a folder: some other clash, a bug
    if exc.errno == errno.ENOTDIR and path is not None:
        path = _blocking_file(path)
    space = _DISK_ERRNOS[exc.errno][1] == _SPACE
    return OutputError(path, exc.errno, None if output or space else "")


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn an OSError that means the output cannot be written (full disk, quota, read-only,
    permissions, a file or folder in the way) into an `OutputError` naming `path`."""
    try:
        yield
    except OSError as exc:
        err = output_error(exc, path)
        if err is None:
            raise
        raise err from None


def _blocking_file(path: str) -> str:
    """The nearest existing part of `path` that is a file, where a folder must be (a folder
    cannot be made under `--out` naming a file); `path` itself when there is none."""
    part = os.path.dirname(os.path.abspath(path))
    while part and not os.path.exists(part):
        part = os.path.dirname(part) if os.path.dirname(part) != part else ""
    return part if part and not os.path.isdir(part) else path


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) as `rlbatch train` raises it, told apart from a KeyboardInterrupt that
    a reward function raises itself (a reward fault, rollout/reward_runner.py)."""

    def __init__(self):
        super().__init__("interrupted by SIGINT")


class RunFailed(Exception):
    """A run that ended `failed` for a reason that is not bad input (a `sys.exit` inside the
    run, say): the CLI prints the one-line reason and exits with `EXIT_FAILED`."""


_STOP: list[BaseException] = []  # the exception of the first stop signal, while it is handled


def stop_signal(signum: int | None) -> BaseException | None:
    """Record the stop signal `signum` (SIGINT, SIGTERM, SIGHUP) and return its exception, or,
    with None, forget the recorded one. Only the first counts: while it is handled (until the
    CLI's handlers are removed) `pending_stop()` returns it, and later signals are ignored so
    they cannot cut the run's status write short."""
    import signal

    if signum is None:
        _STOP.clear()
        return None
    if not _STOP:
        _STOP.append(Interrupted() if signum == signal.SIGINT else Terminated(signum))
    return _STOP[0]


def pending_stop() -> BaseException | None:
    """The stop signal's exception if one arrived (a reward that swallowed it with its own
    `except Exception` is not allowed to keep the run going)."""
    return _STOP[0] if _STOP else None


class Terminated(Exception):
    """A termination signal (SIGTERM: preemption, a scheduler, `rlbatch profile` stopping its
    trials) turned into an exception, so a run writes down how it ended (`failed`, resumable)
    instead of vanishing as `running`. The CLI exits with 128 + the signal number."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        super().__init__(f"terminated by {signal.Signals(signum).name}")
