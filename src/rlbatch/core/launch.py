"""Starting one of rlbatch's modules in a new Python process (a profile's trial, a command's
exec shim, a reward worker).

`python -m MODULE` puts the current directory first on `sys.path`, ahead of the standard
library and installed packages: an `inspect.py`, `typing.py` or `yaml.py` beside the user's
run would replace the real module in every process started that way. `module_argv` starts the
module through a short bootstrap instead, which moves that entry to the end of `sys.path`:
modules of the working directory (a `module:function` reward) are still found, after
everything else. Python 3.11's `-P` would drop the entry altogether, and with it those modules.
"""

from __future__ import annotations

import os
import sys

PATH_FIRST = ("import sys\n"
              "if sys.path and sys.path[0] == '':\n"
              "    sys.path.append(sys.path.pop(0))\n")
# Linux PR_SET_PDEATHSIG (1): SIGTERM when the process that started this one ends; and if it
# ended before the request took effect, end now as that SIGTERM would have made it
DIE_WITH_PARENT = ("import os, signal\n"
                   "try:\n"
                   "    import ctypes\n"
                   "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
                   "except (OSError, AttributeError):\n"
                   "    pass\n"
                   "if os.getppid() != int(sys.argv.pop(1)):\n"
                   "    sys.exit(128 + signal.SIGTERM)\n")
RUN = ("import runpy\n"
       "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n")
BOOTSTRAP = PATH_FIRST + RUN


def module_argv(module: str, *args: str, die_with_parent: bool = False) -> list[str]:
    """The argv that runs `module` as `__main__` with `args`, like `python -m module args`,
    the working directory last on `sys.path` instead of first. `die_with_parent`: the
    process gets SIGTERM when this one (its parent) ends, however it ends (Linux; elsewhere
    nothing is asked), so that a profile killed outright does not leave its trials running."""
    if not die_with_parent:
        return [sys.executable, "-c", BOOTSTRAP, module, *args]
    return [sys.executable, "-c", PATH_FIRST + DIE_WITH_PARENT + RUN, str(os.getpid()), module,
            *args]
