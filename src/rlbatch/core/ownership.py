"""One owner per run directory and per profile directory (docs/reliability.md).

`own(directory, what)` takes an exclusive `fcntl.flock` on `<directory>/owner.lock` and keeps
it for the rest of the process's life (the open file is kept here; the kernel releases the lock
when the process ends, however it ends, so a lock left by a dead process is simply taken).
The file holds the owner's PID, host, command and start time, for the one-line refusal another
process gets (`InUse`, exit status 2). The file descriptor is not inherited by children
(Python opens files close-on-exec), so a reward worker or a left-over child never holds it.

Within one process `own` is re-entrant: a library caller that opens the same run twice (a run,
then its resume) owns it already.

Assumption: flock is advisory and per host. On a local filesystem it excludes every other
process. On NFS, Linux (since 2.6.12) emulates flock with NFS byte-range locks, which the server
arbitrates between hosts, but only where the mount has working locking (`lockd`/NFSv4; not
`nolock`, where the lock is local to each client and two hosts can both own one directory).
Other shared filesystems (CIFS, Lustre, GPFS, FUSE) each have their own rules.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from rlbatch.core.errors import UserError, writing

LOCK_FILE = "owner.lock"
_HELD: dict[str, int] = {}  # resolved directory -> the open, locked file descriptor


class InUse(UserError):
    """The directory is owned by another live process."""


def own(directory: str | os.PathLike, what: str) -> None:
    """Own `directory` (which must exist) for the rest of this process, or raise `InUse`
    naming the owner. `what` names the directory in the message ("run directory")."""
    path = Path(directory).resolve()
    key = str(path)
    if key in _HELD:
        return
    lock = path / LOCK_FILE
    writable = True
    with writing(lock):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only folder: flock needs no write access
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            if not lock.exists():  # nothing can be written here: there is nothing to guard,
                return  # and the first write names its own file (an OutputError)
            fd, writable = os.open(lock, os.O_RDONLY), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise UserError(f"{what} {path} cannot be locked ({os.strerror(exc.errno).lower()}, "
                            f"errno {exc.errno}): rlbatch keeps one owner per directory with "
                            "flock; on NFS, use a mount with locking (not `nolock`)") from None
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise InUse(f"{what} {path} is in use by {_holder(lock)}: wait for it to end, or "
                    "stop that process first") from None
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "command": " ".join(["rlbatch", *sys.argv[1:]])[:200],
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode() + b"\n"
    try:
        if writable:
            os.pwrite(fd, record, 0)
            os.ftruncate(fd, len(record))
    except OSError:  # a full disk: the lock holds; only the refusal's details are missing
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
    _HELD[key] = fd


def held_by(directory: str | os.PathLike) -> str | None:
    """Who owns `directory` now, if another process does (`PID 123 on host h (...)`), else
    None: the lock is tried and at once released, so the caller does not keep it."""
    path = Path(directory).resolve()
    lock = path / LOCK_FILE
    if str(path) in _HELD or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return _holder(lock)
        return None
    finally:
        os.close(fd)  # closing releases a lock taken here
    return None


def owned(directory: str | os.PathLike) -> bool:
    return str(Path(directory).resolve()) in _HELD


def disown(directory: str | os.PathLike) -> None:
    """Give the directory up (before this process deletes it)."""
    fd = _HELD.pop(str(Path(directory).resolve()), None)
    if fd is not None:
        os.close(fd)


def _holder(lock: Path) -> str:
    """`PID 123 on host h (rlbatch train ..., since ...)` from the lock file; the owner writes
    it right after taking the lock, so an empty file is read again briefly."""
    from rlbatch.core.errors import sanitize

    for _ in range(20):
        try:
            info = json.loads(lock.read_text(errors="replace") or "null")
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict):
            text = (f"PID {info.get('pid')} on host {info.get('host')} "
                    f"({info.get('command')}, since {info.get('started')})")
            if info.get("host") == socket.gethostname() and not _running(info.get("pid")):
                text = (f"a process that could not record itself (the record names PID "
                        f"{info.get('pid')}, which has ended)")
            return sanitize(text)
        time.sleep(0.05)
    return "another process (its PID and host are not recorded)"


def _running(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
