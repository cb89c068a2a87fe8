"""`rlbatch train` with stderr redirected to a file: plain progress lines arrive while the
run goes on (a terminal gets the live bar instead)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rlbatch.core.runlog import read_run

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free


def test_progress_lines_reach_a_log_file_while_the_run_goes_on(tiny_model_dir, tmp_path):
    log = tmp_path / "log"
    # 16 steps of 64 samples, each sleeping 0.25 s: at least 4 s of run after the first line
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", "grpo-tiny",
           "--out", str(tmp_path / "runs"), "--set", "batch.prompts_per_step=8",
           "--set", "budget.max_samples=1024", "--set", "eval.every_samples=512",
           "--set", "eval.prompts=64", "--set", "rollout.simulated_latency_s=0.25"]
    env = dict(os.environ, RLBATCH_PROGRESS_EVERY_S="0")
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        seen_while_running = None
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline:
            lines = [x for x in log.read_text().splitlines() if " samples, step " in x]
            if lines:
                seen_while_running = lines[0]
                break
            time.sleep(0.05)
        assert proc.wait(timeout=300) == 0, log.read_text()[-2000:]
    assert seen_while_running is not None, log.read_text()
    assert seen_while_running.startswith("grpo-tiny: ") and "/1,024 samples" in seen_while_running
    assert "samples/s" in seen_while_running and "to the budget" in seen_while_running
    lines = [x for x in log.read_text().splitlines() if " samples, step " in x]
    assert len(lines) >= 16  # every step (RLBATCH_PROGRESS_EVERY_S=0), and a last line
    assert lines[-1].startswith("grpo-tiny: 1,024/1,024 samples, step 16 ")
    # the last line shows the evaluation of the step it reports (step 16, at 1,024 samples)
    (run,) = (tmp_path / "runs").iterdir()
    last = read_run(run).evals[-1]
    assert last["samples"] == 1024 and f"eval/accuracy {last['eval/accuracy']:.3f} " in lines[-1]
