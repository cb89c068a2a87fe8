"""`rlbatch profile --strategy probe` end to end on the tiny model: killed in the middle of
a probe and resumed, it loses no finished work, continues the predicted winner's probe to
the target (the same run, not a new one), and decides as constructed.

As in tests/test_profile.py, every rollout step sleeps `rollout.simulated_latency_s`, so
samples per second grow with B whatever the CPU and B = 512 wins by construction; the wide
margin (log ratio 1.0) keeps two seeds' noise from calling the curves departed. The test is
about the procedure, not this workload. What it assumes of the arithmetic is what
tests/test_profile.py assumes (one AdamW step at eta0 does not raise accuracy by 0.12, and
each configuration gains 0.12 within the budget); the baseline's probe seed may meet the
target inside its probe, and then ends `target_reached` instead of stopped. The profile's
spending limit is off (`profile.probe_budget: null`): it counts training seconds, which the
machine's load moves, and its cuts are tested in tests/test_profile_rules.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.profile_kill import kill_profile_when, logged_steps
from rlbatch.core.runlog import read_jsonl, read_run

# a learning outcome decides these: CI runs them under another kernel choice too
pytestmark = pytest.mark.lands

PROBE = ["--strategy", "probe", "--batches", "64", "--concurrency", "64",
         "--set", "target.gain=0.12", "--set", "eval.prompts=512",
         "--set", "eval.every_samples=128", "--set", "profile.min_evaluations=2",
         "--set", "profile.fixed_lr_control=false",
         "--set", "profile.margin=1.0", "--set", "rollout.simulated_latency_s=2.0",
         "--set", "budget.max_samples=32768", "--set", "profile.probe_fraction=0.4",
         "--set", "profile.probe_budget=null"]


def _cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "rlbatch.cli.main", "profile", "--preset", "quick", *PROBE,
            "--out", str(out), "--json"]


def _kill_in_a_probe(out: Path) -> None:
    """SIGKILL the profile (and its trial) once the candidate's probe has logged a step. Its
    probe lasts 0.4 x the baseline's N*, so this assumes N*_base > 1,280 samples (ten B0
    steps), so that the probe has a second step of 512 samples."""
    def ready(events: list[dict]) -> bool:
        return any(e["event"] == "started" and e["trial"] == "sqrt-P64-s0"
                   and logged_steps(e["run_dir"]) >= 1 for e in events)

    kill_profile_when(_cmd(out), out, ready)


@pytest.fixture(scope="module")
def probed(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "p"
    _kill_in_a_probe(out)
    before = read_jsonl(out / "journal.jsonl")[0]
    proc = subprocess.run(_cmd(out), check=False, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, before, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_probe_profile_resumes_and_confirms_the_predicted_winner(probed):
    out, before, printed = probed
    doc = json.loads((out / "profile.json").read_text())
    events = read_jsonl(out / "journal.jsonl")[0]
    restart = max(i for i, e in enumerate(events) if e["event"] == "profile_started")
    # the baseline seed that finished before the kill is not run again
    assert any(e["event"] == "finished" and e["trial"] == "base-P16-s0" for e in before)
    assert not any(e["event"] == "started" and e["trial"] == "base-P16-s0"
                   for e in events[restart:])
    trials = {t["trial"]: t for t in doc["trials"]}
    assert set(trials) == {"base-P16-s0", "base-P16-s1", "sqrt-P64-s0"}
    assert trials["base-P16-s0"]["status"] == "target_reached"
    probe_seed = trials["base-P16-s1"]
    assert (probe_seed["status"], probe_seed["stop_code"]) in (("stopped", "probe"),
                                                               ("target_reached", None))
    # the winner's probe was continued to the target in the same run directory
    winner = read_run(trials["sqrt-P64-s0"]["run_dir"])
    assert winner.summary["status"] == "target_reached"
    samples = [r["samples"] for r in winner.steps]
    assert samples == sorted(set(samples))  # one row per step, no step logged twice
    spend = [e for e in events if e["event"] == "spending"]
    assert spend[0]["confirm"] == "sqrt-P64-s0" or spend[0]["extend"]
    assert spend[-1]["outcome"] == "indicated"
    d = doc["decision"]
    assert (d["sequences_per_step"], d["is_reference"], d["outcome"]) == (512, False,
                                                                          "indicated")
    assert d["predicted_time_ratio"] < 1.0
    assert printed["decision"]["trial"] == "sqrt-P64-s0"
    pred = doc["predictions"]["sqrt-P64-s0"]
    assert pred["verdict"] != "departed" and pred["time_ratio"] < 1.0
    # the cost in training seconds: its parts and its multiple of the baseline's T (how
    # large the multiple is depends on the machine's load, which a test does not assert;
    # the spending limit's cuts: tests/test_profile_rules.py)
    cost = doc["cost"]
    assert cost["grid_estimate_s"] > cost["total_s"] > 0
    assert cost["total_s"] == pytest.approx(cost["trial_train_s"] + cost["decode_sweep_s"])
    assert cost["multiple_of_baseline_time_to_target"] == pytest.approx(
        cost["total_s"] / cost["baseline_time_to_target_s"])
    assert cost["multiple_of_baseline_time_to_target"] > 1
