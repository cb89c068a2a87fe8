"""`rlbatch profile` end to end on the tiny model: the decision, resume after SIGKILL, Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbatch.core.runlog import read_jsonl

# A small preset: baseline P=16 plus candidates P=8 and P=32 (three batch sizes), one seed,
# an early target, a small eval set. A tiny margin makes the verdicts (and so the decision)
# depend only on the deterministic sample counts, not on timing noise.
SMALL = ["--batches", "8,32", "--concurrency", "64", "--set", "target.value=0.35",
         "--set", "eval.prompts=256", "--set", "eval.every_samples=1024",
         "--set", "profile.fixed_lr_control=false", "--set", "profile.margin=0.001",
         "--set", "profile.early_stop=false", "--set", "budget.max_samples=16384"]


def _profile_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlbatch.cli.main", "profile", "--preset", "quick", *SMALL,
            "--out", str(out), "--json", *extra]


def _run(out: Path, *extra: str) -> dict:
    proc = subprocess.run(_profile_cmd(out, *extra), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _evidence(profile_dir: Path) -> dict:
    doc = json.loads((profile_dir / "profile.json").read_text())
    return {e["sequences_per_step"]: (e["samples_to_target"], e["verdict"])
            for e in doc["analysis"]["configs"]}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "a"
    _run(out)
    return out


def test_profile_end_to_end(uninterrupted):
    doc = json.loads((uninterrupted / "profile.json").read_text())
    trials = {t["trial"]: t for t in doc["trials"]}
    assert set(trials) == {"base-P16-s0", "sqrt-P8-s0", "sqrt-P32-s0"}
    assert {t["B"] for t in trials.values()} == {64, 128, 256}
    assert trials["sqrt-P32-s0"]["lr"] == pytest.approx(1e-4 * 2 ** 0.5)
    assert trials["sqrt-P8-s0"]["lr"] == pytest.approx(1e-4 * 0.5 ** 0.5)
    assert all(t["status"] == "target_reached" for t in trials.values())
    assert doc["decode"]["chosen"] == 64
    d = doc["decision"]
    assert d is not None and d["generation_concurrency"] == 64
    assert d["sequences_per_step"] == d["prompts_per_step"] * d["samples_per_prompt"]
    verdicts = {e["sequences_per_step"]: e["verdict"] for e in doc["analysis"]["configs"]}
    assert verdicts[128] == "reference"
    assert doc["cost"]["multiple_of_baseline_time_to_target"] > 1
    assert doc["cost"]["trial_train_s"] > doc["cost"]["baseline_time_to_target_s"]
    events = [e["event"] for e in read_jsonl(uninterrupted / "journal.jsonl")[0]]
    assert events.count("started") == 3 and events[-1] == "profile_finished"


def test_sigkill_then_rerun_same_decision_no_finished_trial_rerun(uninterrupted, tmp_path):
    out = tmp_path / "b"
    proc = subprocess.Popen(_profile_cmd(out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    journal = out / "journal.jsonl"
    deadline = time.time() + 300
    killed = False
    while time.time() < deadline and proc.poll() is None:
        events = read_jsonl(journal)[0] if journal.exists() else []
        started = [e for e in events if e["event"] == "started"]
        if any(e["event"] == "finished" for e in events) and len(started) >= 2:
            steps = Path(started[-1]["run_dir"]) / "steps.jsonl"
            if steps.exists() and len(steps.read_text().splitlines()) >= 20:
                os.killpg(proc.pid, signal.SIGKILL)  # the profile and its trial process
                killed = True
                break
        time.sleep(0.1)
    proc.wait()
    assert killed, "profile finished or stalled before it could be killed mid-way"
    finished_before = {e["trial"]: e for e in read_jsonl(journal)[0] if e["event"] == "finished"}
    steps_before = {name: (Path(e["run_dir"]) / "steps.jsonl").read_text()
                    for name, e in ((e["trial"], e) for e in read_jsonl(journal)[0]
                                    if e["event"] == "started") if name in finished_before}
    _run(out)
    events = read_jsonl(journal)[0]
    restart = max(i for i, e in enumerate(events) if e["event"] == "profile_started")
    after = events[restart:]
    for name in finished_before:
        assert not any(e["event"] == "started" and e["trial"] == name for e in after), name
        assert any(e["event"] == "skipped_finished" and e["trial"] == name for e in after)
    for name, text in steps_before.items():  # finished runs' logs untouched
        run_dir = next(e["run_dir"] for e in events if e.get("trial") == name and "run_dir" in e)
        assert (Path(run_dir) / "steps.jsonl").read_text() == text
    a = json.loads((uninterrupted / "profile.json").read_text())
    b = json.loads((out / "profile.json").read_text())
    assert _evidence(out) == _evidence(uninterrupted)
    assert b["decision"]["config"] == a["decision"]["config"]


def test_ray_executor_runs_the_small_preset(uninterrupted, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    doc = _run(out, "--executor", "ray")
    assert doc["decision"] is not None
    assert _evidence(out) == _evidence(uninterrupted)
    profile = json.loads((out / "profile.json").read_text())
    assert all(t["status"] == "target_reached" for t in profile["trials"])
