"""The guide's tour (docs/guide.md, "A tour of the commands"), every command as written and
in order, on a fresh model cache.

The commands are read from the guide's first code block after "A tour of the commands", so
the test follows the guide as it changes. Each runs in bash in an empty folder (with the repository's
`tests` folder linked in, for the shipped verl log) and the virtual environment's commands on
PATH; a command whose comment says "exits 2" must exit 2, every other one 0. Prints each
command's wall time and, with RLBATCH_TOUR_TIMES=FILE, writes them
there as JSON. What each command prints is not checked here: the commands' own tests do that.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

REPO = Path(__file__).resolve().parents[1]


TOUR = REPO / "docs" / "guide.md"


def tour_commands(guide: str) -> list[str]:
    """The shell lines of the tour's code block (comments and blank lines dropped, the
    `source` line too: the environment is put on PATH instead)."""
    section = guide.split("A tour of the commands", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)
    lines = [ln.strip() for ln in block.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#") and not ln.startswith("source ")]


def test_tour_commands_are_read_from_the_guide():
    cmds = tour_commands(TOUR.read_text())
    assert cmds[0].startswith("rlbatch lr-scale")
    assert any(c.startswith("rlbatch profile --preset quick") for c in cmds)
    assert all(c.startswith(("rlbatch ", "printf ")) for c in cmds), cmds


@pytest.mark.slow
@pytest.mark.trained
def test_readme_tour_runs_as_written(tmp_path):
    cmds = tour_commands(TOUR.read_text())
    (tmp_path / "tests").symlink_to(REPO / "tests")
    env = dict(os.environ, RLBATCH_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    times = []
    for cmd in cmds:
        want = 2 if "exits 2" in cmd else 0
        t0 = time.perf_counter()
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                              check=False,
                              text=True, timeout=3600)
        times.append({"command": cmd.split("  #")[0].strip(),
                      "seconds": round(time.perf_counter() - t0, 1), "exit": proc.returncode})
        print(f"{times[-1]['seconds']:8.1f} s  exit {proc.returncode}  {times[-1]['command']}")
        assert proc.returncode == want, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])
    if os.environ.get("RLBATCH_TOUR_TIMES"):
        Path(os.environ["RLBATCH_TOUR_TIMES"]).write_text(json.dumps(times, indent=1))
