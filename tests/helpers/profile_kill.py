"""SIGKILL an `rlbatch profile` process (and its trial process) once its journal and run
directories show the moment a test wants (tests/test_profile.py, tests/test_probing.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlbatch.core.runlog import read_jsonl


def kill_profile_when(cmd: list[str], out: Path, ready: Callable[[list[dict]], bool],
                      timeout_s: float = 900) -> None:
    """Start `cmd` (a profile writing to `out`) in its own session; SIGKILL the whole group
    as soon as `ready(journal events)` holds. Fails the test if it finishes or stalls first."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    journal = out / "journal.jsonl"
    deadline = time.time() + timeout_s
    try:
        while time.time() < deadline and proc.poll() is None:
            if ready(read_jsonl(journal)[0] if journal.exists() else []):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("the profile finished or stalled before the moment to kill it")


def logged_steps(run_dir: str | Path) -> int:
    steps = Path(run_dir) / "steps.jsonl"
    return len(steps.read_text().splitlines()) if steps.exists() else 0
