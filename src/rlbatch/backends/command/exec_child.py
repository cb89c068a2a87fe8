"""`rlbatch.backends.command.exec_child PARENT_PID ARGV...` (started by core/launch.py): become
ARGV (exec), after asking the kernel to send SIGKILL when the process that started us ends
(Linux PR_SET_PDEATHSIG; elsewhere nothing is asked). `CommandRun` starts a command this way,
so that a `rlbatch train` killed outright (SIGKILL, the OOM killer) does not leave the command
training on. The signal is SIGKILL, not SIGTERM: a trainer may trap SIGTERM, and with its
`rlbatch train` gone nothing is left to wait out a grace period and then kill it (a
`rlbatch train` that ends any other way stops its command itself, SIGTERM first). Run as its
own process, not as a `preexec_fn`, which is unsafe beside threads."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(args: list[str]) -> int:
    parent, argv = int(args[0]), args[1:]
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the request took effect
        return 128 + signal.SIGKILL
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"error: cannot run {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
