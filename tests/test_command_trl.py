"""`rlbatch profile` driving TRL's own `trl grpo` script, unmodified, on the tiny model, with a
local dataset folder and a reward function given by dotted path (issue 29, acceptance 1).

The profile is SIGKILLed (with its trial process) while the baseline's second seed trains
and has saved a TRL checkpoint, then run again: the finished first seed is not run again,
the second resumes from TRL's checkpoint (`--resume_from_checkpoint`), and its run log has
every step once. The candidate's trials crash (the test reward refuses a batch of 64
completions, B of the candidate P = 8), end `failed`, and the profile still decides.

What the test assumes of the machine's arithmetic, and why it holds anywhere: GRPO through
TRL at temperature 0.7 raises `eval/reward` (mean reward over 8 samples of 128 held-out
prompts) by 0.03 within 4,096 samples of the warm start, for both baseline seeds, and not
within its first evaluation after step 0 (128 samples). Where it was run it rose by 0.03
within 300-700 samples. The kill needs a checkpoint, which TRL saves every 4 steps, before
the second seed reaches the target.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.profile_kill import kill_profile_when
from rlbatch.core.runlog import read_json, read_jsonl

# Slow (`make test-slow`): about five minutes of TRL training. The fast tests that check the
# same contracts: test_command::test_trl_flags_count_optimizer_steps_and_resume_from_the_newest_checkpoint
# (TRL's flags and `--resume_from_checkpoint` from the newest checkpoint),
# test_command::test_a_resumed_attempt_replaces_rows_after_its_checkpoint_and_continues_the_clock,
# test_command_profile::test_a_killed_profile_reruns_no_finished_trial,
# test_profile_rules::test_driver_records_a_trial_that_ended_without_finishing_its_run_and_goes_on
# and test_command::test_a_crashing_command_fails_the_run_in_one_line (a failed trial is left
# out and the profile goes on), test_ingest (TRL's logs), and test_trl_backend (TRL's
# GRPOTrainer on the tiny model, a profile included).
pytestmark = [pytest.mark.lands, pytest.mark.slow]

pytest.importorskip("trl")

HELPERS = Path(__file__).resolve().parent / "helpers"
TRL = Path(sys.executable).parent / "trl"


def _dataset(folder: Path) -> Path:
    """The built-in addition task as the JSON-lines folder `trl grpo --dataset_name` loads
    (train.jsonl and test.jsonl: its train and test splits), as `rlbatch data export`
    writes it."""
    from rlbatch.rollout.export import export_task

    export_task("addition", None, folder, train=4096, test=128)
    return folder


def _config(tmp: Path, model: Path) -> Path:
    argv = [str(TRL), "grpo", "--model_name_or_path", str(model), "--dataset_name",
            str(_dataset(tmp / "data")), "--reward_funcs", "trl_addition.exact_or_crash",
            "--max_completion_length", "5", "--temperature", "0.7",
            "--per_device_eval_batch_size", "128", "--use_cpu", "true", "--disable_tqdm", "true"]
    cfg = {"extends": "grpo-tiny", "name": "trl-profile", "backend": "command",
           "command": {"framework": "trl", "argv": argv, "poll_s": 0.5, "stop_grace_s": 10,
                       "env": {"PYTHONPATH": str(HELPERS), "RLBATCH_TEST_CRASH_AT": "64"}},
           "batch": {"prompts_per_step": 4, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 32, "reference_lr": 1.0e-4},
           "target": {"metric": "eval/reward", "value": None, "gain": 0.03},
           "budget": {"max_samples": 4096}, "eval": {"every_samples": 128},
           "checkpoint": {"every_samples": 128},
           "profile": {"prompts_per_step": [8], "seeds": 1, "confirm_seeds": 1,
                       "fixed_lr_control": False, "concurrency": [], "min_evaluations": 3}}
    path = tmp / "trl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cmd(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "rlbatch.cli.main", "profile", str(config), "--follow", "0", "--out",
            str(out), "--json"]


def _trial_dir(out: Path, name: str) -> Path:
    events = read_jsonl(out / "journal.jsonl")[0]
    return Path(next(e["run_dir"] for e in events if e.get("trial") == name
                     and e["event"] == "started"))


@pytest.fixture(scope="module")
def profiled(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl")
    config, out = _config(tmp, tiny_model_dir), tmp / "profile"

    def ready(events: list[dict]) -> bool:  # the second seed runs and has a checkpoint
        if not any(e["event"] == "started" and e["trial"] == "base-P4-s1" for e in events):
            return False
        ckpts = (_trial_dir(out, "base-P4-s1") / "command" / "trl-output").glob("checkpoint-*")
        return any((c / "trainer_state.json").is_file() for c in ckpts)

    kill_profile_when(_cmd(config, out), out, ready, timeout_s=900)
    before = read_jsonl(out / "journal.jsonl")[0]
    proc = subprocess.run(_cmd(config, out), capture_output=True, text=True, check=False,
                          timeout=1800, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, before, json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_killed_profile_resumes_without_rerunning_the_finished_trial(profiled):
    out, before, _ = profiled
    assert [e["trial"] for e in before if e["event"] == "finished"] == ["base-P4-s0"]
    after = read_jsonl(out / "journal.jsonl")[0][len(before):]
    assert {"event": "skipped_finished", "trial": "base-P4-s0"}.items() <= \
        next(e for e in after if e["event"] == "skipped_finished").items()
    first = _trial_dir(out, "base-P4-s0") / "command" / "attempts"
    assert [p.name for p in first.iterdir()] == ["001"]  # run once, never started again


def test_the_interrupted_trial_resumes_through_trls_checkpoint(profiled):
    out, _, _ = profiled
    run = _trial_dir(out, "base-P4-s1")
    second = json.loads((run / "command" / "attempts" / "002" / "attempt.json").read_text())
    ckpt = Path(second["resume_from"])
    assert ckpt.parent == run / "command" / "trl-output" and ckpt.name.startswith("checkpoint-")
    assert second["argv"][second["argv"].index("--resume_from_checkpoint") + 1] == str(ckpt)
    done = int(ckpt.name.split("-")[1])  # optimizer steps = rollout steps here (one update)
    assert second["resume_step"] == done
    # the second attempt's own log starts right after the checkpoint
    from rlbatch.interop.ingest import IngestOptions, convert

    own = convert("trl", run / "command" / "attempts" / "002" / "tensorboard",
                  IngestOptions(prompts_per_step=4, samples_per_prompt=8))
    assert next(iter(own.steps))["step"] == done + 1
    # the run log: every step once, in order, the clock running on across the attempts
    steps = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))
    assert [r["samples"] for r in steps] == [32 * r["step"] for r in steps]
    t = [r["train_s"] for r in steps]
    assert all(b > a for a, b in itertools.pairwise(t))
    evals = read_jsonl(run / "evals.jsonl")[0]
    assert len({e["step"] for e in evals}) == len(evals) and evals[0]["step"] == 0
    summary = read_json(run / "summary.json")
    assert summary["command"]["attempts"] == 2 and summary["status"] == "target_reached"
    # the crossing is the first evaluation at the threshold, and the trial was stopped there:
    # short of its budget (a read may bring rows TRL flushed past the crossing)
    threshold = evals[0]["eval/reward"] + 0.03
    first = next(e for e in evals if e["eval/reward"] >= threshold)
    assert summary["target"]["samples"] == first["samples"]
    assert max(e["samples"] for e in evals) < 4096 and summary["samples"] < 4096


def test_a_crashing_trial_fails_and_the_profile_still_decides(profiled):
    out, _, doc = profiled
    failed = doc["failed_trials"]
    assert sorted(failed) == ["sqrt-P8-s0"]  # the challenger was never confirmed
    assert "exited with status 1 after 0 logged step(s): RuntimeError: test reward: refusing " \
           "a batch of 64 completions" in failed["sqrt-P8-s0"]
    summary = read_json(_trial_dir(out, "sqrt-P8-s0") / "summary.json")
    assert summary["status"] == "failed"
    d = doc["decision"]
    assert d is not None and d["sequences_per_step"] == 32 and d["generation_concurrency"] is None
    profile = read_json(out / "profile.json")
    runs = [r for c in profile["analysis"]["configs"] for r in c["runs"]]
    assert len(runs) == 2 and all(math.isfinite(r["time_to_target"]) for r in runs)
