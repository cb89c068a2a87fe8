"""One rule for "this trial is done", and what a profile says of its trials (issue 58, findings
1, 8 and 9), driven through `rlbatch profile` on the verl-style stand-in
(tests/helpers/log_writer.py), which logs its own step times: every T below is arithmetic
(0.1 s a step, the baseline crossing at step 16, B = 64 at step 8), not a wall-clock reading.

- A trial enters the analysis only if its own `rlbatch train` wrote a final status. One that
  is killed outright (SIGKILL, what the OOM killer sends) keeps `running`: the profile starts
  it again, once, to resume from its checkpoint; killed again, it is failed everywhere (the
  journal, the evidence, the analysis, the exit status).
- The converter's warnings that changed a trial's rows are printed beside the decision and
  carried in profile.json (`trial_warnings`).
- A command killed by a signal is named by the signal; a trial whose checkpoint was refused
  keeps its rows and is not told to re-run; a baseline that its command's own step limit
  ended short is not told to raise budget.max_samples.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.procs import alive
from helpers.standin_profile import standin_profile
from rlbatch.core.runlog import read_json, read_jsonl

HELPERS = Path(__file__).resolve().parent / "helpers"
RLBATCH = [sys.executable, "-m", "rlbatch.cli.main"]
ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def _config(tmp_path: Path, **env) -> Path:
    return standin_profile(tmp_path, "killed", {"LOG_WRITER_STEP_S": 0.1, **env})


def _profile(config: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out)],
                          capture_output=True, text=True, check=False, timeout=300, env=ENV)


def _trial_dir(out: Path, trial: str) -> Path | None:
    if not (out / "journal.jsonl").exists():
        return None
    return next((Path(e["run_dir"]) for e in read_jsonl(out / "journal.jsonl")[0]
                 if e["event"] == "started" and e["trial"] == trial), None)


def _profile_killing(config: Path, out: Path, trial: str, at_steps: list[int],
                     killed_at: list[int] | None = None):
    """Run the profile; SIGKILL `trial`'s `rlbatch train` (the PID in its run directory's
    owner.lock) once its run log reaches each of `at_steps`, a new process each time, as the
    OOM killer would. Returns (the finished profile, the PIDs killed); `killed_at` gets the
    last logged step of each process killed."""
    with open(out.parent / "stdout", "w") as so, open(out.parent / "stderr", "w") as se:
        proc = subprocess.Popen([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out)],
                                stdout=so, stderr=se, text=True, env=ENV)
        killed: list[int] = []
        deadline = time.monotonic() + 120
        try:
            for at in at_steps:
                while time.monotonic() < deadline and proc.poll() is None:
                    run = _trial_dir(out, trial)
                    lock = read_json(run / "owner.lock") if run else {}
                    rows = read_jsonl(run / "steps.jsonl")[0] if run else []
                    pid = lock.get("pid")
                    if pid and pid not in killed and alive(pid) and rows \
                            and rows[-1]["step"] >= at:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                        if killed_at is not None:
                            killed_at.append(rows[-1]["step"])
                        break
                    time.sleep(0.05)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    return (subprocess.CompletedProcess(proc.args, proc.returncode,
                                        (out.parent / "stdout").read_text(),
                                        (out.parent / "stderr").read_text()), killed)


def _events(out: Path, event: str) -> list[dict]:
    return [e for e in read_jsonl(out / "journal.jsonl")[0] if e["event"] == event]


# ---------------------------------------------------------------- finding 1: a killed trial
def test_a_baseline_killed_once_is_resumed_and_decides_as_unkilled(tmp_path):
    """SIGKILL of the baseline's `rlbatch train` at step 6 (its checkpoint at step 4): the
    run is left `running`, with no final status. The profile starts it again, it resumes
    from the checkpoint, and the profile decides as the unkilled profile does: the baseline
    crosses at step 16 in 1.6 s, B = 64 in 0.8 s, T ratio 0.5, nothing failed (it used to be
    "failed and is left out", and then analysed anyway)."""
    out = tmp_path / "p"
    killed_at: list[int] = []
    done, killed = _profile_killing(_config(tmp_path), out, "base-P4-s0", [6], killed_at)
    assert done.returncode == 0 and len(killed) == 1, done.stderr[-2000:]
    doc = read_json(out / "profile.json")
    assert doc["failed_trials"] == {}
    assert [e["trial"] for e in _events(out, "resumed_after_kill")] == ["base-P4-s0"]
    run = _trial_dir(out, "base-P4-s0")
    second = read_json(run / "command" / "attempts" / "002" / "attempt.json")
    # from a checkpoint (every 4 steps), not from the start: the last one the run log had
    # reached when the kill landed, or a later one the trainer saved before its rows were
    # converted (a loaded machine can run a step or two past 6 before the kill lands)
    assert second["resume_step"] % 4 == 0 and second["resume_step"] >= killed_at[0] // 4 * 4
    summary = read_json(run / "summary.json")
    assert summary["status"] == "target_reached" and summary["target"]["step"] == 16
    assert summary["target"]["train_s"] == pytest.approx(1.6)
    (cand,) = [c for c in doc["analysis"]["configs"] if c["sequences_per_step"] == 64]
    assert cand["vs_reference"]["time_ratio"] == pytest.approx(0.5)
    assert "decision: keep the baseline P=4 G=8 (B=32)" in done.stdout
    assert "started again to resume from its checkpoint (1 of 2" in done.stderr
    assert "failed and is left out" not in done.stdout


def test_a_baseline_killed_every_time_is_failed_and_the_profile_exits_2(tmp_path):
    """The baseline's `rlbatch train` is killed at step 6, and its resumed process again at
    step 10: the trial is failed, not analysed as a run that stopped short. No baseline is
    left, so the profile exits 2 with one `error:` line naming the trial, how it ended and
    its last line (it used to exit 0, advising to raise budget.max_samples)."""
    out = tmp_path / "p"
    done, killed = _profile_killing(_config(tmp_path), out, "base-P4-s0", [6, 10])
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(killed) == 2
    errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(
        "error: no decision: every baseline trial failed (the first, base-P4-s0: killed by "
        "SIGKILL without writing a final status (status running), 2 times in a row: not "
        "started again; its last line: "), errors[0]
    assert "raise budget.max_samples" not in done.stdout + done.stderr
    doc = read_json(out / "profile.json")
    assert list(doc["failed_trials"]) == ["base-P4-s0"]
    assert doc["analysis"] is None and doc["decision"] is None
    assert doc["cost"]["baseline_time_to_target_s"] is None  # in no figure
    assert not _events(out, "baseline_measured")  # nothing measured from it
    assert read_json(_trial_dir(out, "base-P4-s0") / "summary.json")["status"] == "running"


def test_a_candidate_killed_every_time_is_left_out_of_the_screening(tmp_path):
    """B = 64's `rlbatch train` is killed at step 3 and again, resumed, at step 5: it is
    failed, named on the console, and in no figure: no configuration of it in the analysis,
    no candidate analysed (it used to be screened from its first rows as a run that did not
    reach the target)."""
    out = tmp_path / "p"
    done, killed = _profile_killing(_config(tmp_path), out, "sqrt-P8-s0", [3, 5])
    assert done.returncode == 0, done.stderr[-2000:]
    doc = read_json(out / "profile.json")
    assert doc["analysis"]["recommendation"]["candidates_analysed"] == 0
    assert len(killed) == 2
    assert list(doc["failed_trials"]) == ["sqrt-P8-s0"]
    assert "killed by SIGKILL without writing a final status" in doc["failed_trials"][
        "sqrt-P8-s0"]
    assert [c["sequences_per_step"] for c in doc["analysis"]["configs"]] == [32]
    assert doc["decision"]["candidates_analysed"] == 0
    assert "trial sqrt-P8-s0 failed and is left out of the decision: killed by SIGKILL" \
        in done.stdout
    assert "screened:" not in done.stdout


# ---------------------------------------------------------------- finding 8: warnings shown
def test_a_warning_that_changed_a_trials_rows_is_printed_beside_the_decision(tmp_path):
    """The baseline's log is rotated before step 12 (the candidate ends before it): the
    follower warns in its summary.json, and the profile now prints that warning with the
    trial's name beside the decision and carries it in profile.json (`trial_warnings`, at
    the top and in the decision)."""
    out = tmp_path / "p"
    done = _profile(_config(tmp_path, LOG_WRITER_ROTATE_AT=12), out)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = read_json(_trial_dir(out, "base-P4-s0") / "summary.json")
    (warning,) = summary["command"]["warnings"]
    assert f"warning: trial base-P4-s0: {warning}" in done.stdout.splitlines()
    doc = read_json(out / "profile.json")
    assert doc["trial_warnings"] == [{"trial": "base-P4-s0", "warning": warning}]
    assert doc["decision"]["trial_warnings"] == doc["trial_warnings"]


# ---------------------------------------------------------------- finding 9: smaller
def test_a_command_killed_by_a_signal_is_named_by_it(tmp_path):
    """Every attempt of the stand-in SIGKILLs itself inside its step-4 save: the trial's
    failure names the signal ("killed by SIGKILL"), not `exited with status -9`."""
    out = tmp_path / "p"
    done = _profile(_config(tmp_path, LOG_WRITER_KILL_IN_SAVE_AT=4), out)
    assert done.returncode == 2, done.stderr[-2000:]
    failure = read_json(_trial_dir(out, "base-P4-s0") / "summary.json")["failure"]
    assert " killed by SIGKILL after 3 logged step(s)" in failure, failure
    assert "status -9" not in done.stdout + done.stderr


def test_a_refused_checkpoint_keeps_its_rows_and_is_not_told_to_rerun(tmp_path):
    """The baseline crashes at step 6 (checkpoint at 4); the checkpoint then cannot be
    loaded, and two resumes fail on it; the next profile's trial is refused before it
    starts. Its rows stay (the refusal used to come after the run log was emptied), and the
    output says to remove the checkpoint or start over with --fresh, never to re-run the
    profile to resume it."""
    once, corrupt = tmp_path / "crashed", tmp_path / "corrupt"
    config = _config(tmp_path, LOG_WRITER_CRASH_AT=6, LOG_WRITER_CRASH_ONCE=once,
                     LOG_WRITER_CORRUPT_CKPT=corrupt)
    out = tmp_path / "p"
    assert _profile(config, out).returncode == 2
    corrupt.write_text("")
    trial = out / "trials" / "base-P4-s0.yaml"
    for _ in range(2):  # what the trial of two more profiles runs
        subprocess.run([*RLBATCH, "train", str(trial), "--resume"], capture_output=True,
                       check=False, timeout=120, env=ENV)
    run = _trial_dir(out, "base-P4-s0")
    before = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in before] == [1, 2, 3, 4]
    done = _profile(config, out)
    assert done.returncode == 2, done.stderr[-2000:]
    assert read_jsonl(run / "steps.jsonl")[0] == before  # kept, not emptied
    assert "checkpoint refused: attempts 2 and 3 were each given the checkpoint" in \
        read_json(run / "summary.json")["failure"]
    both = done.stdout + done.stderr
    assert "re-run the profile to resume" not in both
    assert "re-running the same command resumes" not in both
    errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].endswith(
        "its checkpoint was refused, so a re-run would not resume it: remove the checkpoint "
        f"the failure names, or start the trial over with `rlbatch train {trial} --fresh`, "
        "then re-run the profile"), errors
    assert (f"trial base-P4-s0: its checkpoint was refused, so re-running does not resume "
            f"it: remove the checkpoint its line names, or start it over with `rlbatch train "
            f"{out}/trials/base-P4-s0.yaml --fresh`, then re-run the profile") in done.stdout


def test_a_baseline_ended_by_its_own_step_limit_is_not_told_to_raise_the_budget(tmp_path):
    """The user's command carries its own step limit (8 steps, 256 samples; a wrapper puts
    `trainer.total_training_steps=8` after rlbatch's overrides) below budget.max_samples
    (1,024), and the target is out of reach: the baseline ends `ended_short`. A larger
    budget cannot help, so the profile says what ended it instead."""
    config = _config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["command"]["argv"] = ["sh", "-c", 'exec "$0" "$@" trainer.total_training_steps=8',
                               sys.executable, str(HELPERS / "log_writer.py")]
    data["target"]["value"] = 1.5
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "p"
    done = _profile(config, out)
    summary = read_json(_trial_dir(out, "base-P4-s0") / "summary.json")
    assert summary["stop_reason"].startswith("ended_short"), summary
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("decision: ")]
    assert line == ("decision: none (the baseline reached the target in only 0 of its 1 seeds "
                    "(base-P4-s0's command ended by its own step or epoch limit at 256 "
                    "samples, before budget.max_samples: a larger budget does not change "
                    "that; raise the command's own step or epoch limit in command.argv, or "
                    "lower the target))"), line
