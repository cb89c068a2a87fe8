"""`rlbatch profile CONFIG --out OUT --json` as a subprocess, for the tests that drive whole
profiles: its decision document, and the run folder of each trial it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rlbatch.core.runlog import read_jsonl

RLBATCH = [sys.executable, "-m", "rlbatch.cli.main"]


def profile_json(config: Path, out: Path, *extra: str, timeout: float = 1800) -> dict:
    """The profile's last stdout line as JSON; a non-zero exit fails with its stderr's tail."""
    proc = subprocess.run([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out),
                           "--json",
                           *extra], capture_output=True, text=True, check=False,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def started_trials(out: Path) -> dict[str, Path]:
    """Trial name -> its run folder, from the profile's journal."""
    return {e["trial"]: Path(e["run_dir"]) for e in read_jsonl(out / "journal.jsonl")[0]
            if e["event"] == "started"}
