"""The ordering rule every converter shares, and what a profile does with a log that breaks
it (docs/design.md, "The ordering rule"; docs/reliability.md, "Rules every converter and the
profile share").

The profile tests drive `rlbatch profile` on the verl-style stand-in (tests/helpers/
log_writer.py: no model, logged step times), a baseline at B = 32 and a candidate at B = 64
whose clean T ratio is exactly 0.5 (the same reward per sample, the same logged seconds per
step, half the steps). A fault on one trial (LOG_WRITER_FAULT_P) must end the profile in one
of three ways only: the clean T ratio within 2%, the faulted trial failed with one line on
the console and left out of every figure, or exit 2 with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.standin_profile import standin_profile
from rlbatch.backends.command.follow import Attempt, Follower
from rlbatch.core.errors import DataError
from rlbatch.core.runlog import read_json
from rlbatch.interop.ingest import IngestOptions
from rlbatch.interop.ingest.logs import going_back, ordered

HELPERS = Path(__file__).resolve().parent / "helpers"
RLBATCH = [sys.executable, "-m", "rlbatch.cli.main"]
CANDIDATE = "sqrt-P8-s0"
OPTS = IngestOptions(prompts_per_step=4, samples_per_prompt=8, lr=1e-4, seed=0)


# ---------------------------------------------------------------- the rule itself
def test_going_back_is_a_restart_only_where_the_writer_continues_from_there():
    assert going_back(2, 6, 3) == "restart"  # back to 2, then 3: a restart from step 1's end
    assert going_back(2, 6, 2) == "restart"
    assert going_back(2, 6, 7) == "stray"  # back to 2, then on from 7: one stray line
    assert going_back(2, 6, 5) == "stray"  # no restart skips from 2 to 5
    assert going_back(2, 6, None) is None  # nothing after it yet: not known


def _kinds(steps, eval_only=(), max_step=None):
    recs = [(i + 1, s, {"eval": True} if i in eval_only else {}) for i, s in enumerate(steps)]
    return [(k, r[1]) for k, r in ordered(recs, "log", lambda d: "eval" in d, max_step)]


def test_ordered_takes_late_evaluations_restarts_and_holds_what_is_not_known_yet():
    assert _kinds([1, 2, 3, 2, 4], eval_only={3}) == [
        ("step", 1), ("step", 2), ("step", 3), ("eval", 2), ("step", 4)]
    assert _kinds([1, 2, 3, 2, 3, 4]) == [
        ("step", 1), ("step", 2), ("step", 3), ("restart", 2), ("step", 3), ("step", 4)]
    assert _kinds([1, 2, 3, 2]) == [("step", 1), ("step", 2), ("step", 3), ("held", 2)]
    # an evaluation between the line that goes back and the next step does not decide it
    assert _kinds([1, 2, 3, 2, 2, 3], eval_only={4}) == [
        ("step", 1), ("step", 2), ("step", 3), ("restart", 2), ("eval", 2), ("step", 3)]


def test_ordered_fails_a_stray_line_and_a_step_past_the_budget_naming_the_line():
    with pytest.raises(DataError, match=r"^log:4: a line for step 2 after step 6, then step 7"):
        list(ordered([(1, 1, {}), (2, 5, {}), (3, 6, {}), (4, 2, {}), (5, 7, {})], "log",
                     lambda d: False))
    with pytest.raises(DataError, match=r"^log:3: step 1004 is past the run's length \(32 "):
        list(ordered([(1, 1, {}), (2, 2, {}), (3, 1004, {})], "log", lambda d: False, 32))


# ---------------------------------------------------------------- a resume reaches its checkpoint
def _verl_log(path: Path, steps: range, bad_after: int | None = None) -> Path:
    lines = []
    for step in steps:
        lines.append(json.dumps({"step": step, "data": {"timing_s/step": 1.0,
                                                         "response_length/mean": 5,
                                                         "critic/score/mean": 0.5}}))
        if step == bad_after:
            lines.append('{"step": oops')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _two_attempts(tmp_path: Path, first: Path, resume: int) -> list:
    second = _verl_log(tmp_path / "a2" / "verl.jsonl", range(resume + 1, 9))
    return [Attempt(1, first, False, -1, tmp_path / "a1" / "rows.json"),
            Attempt(2, second, False, resume, tmp_path / "a2" / "rows.json")]


def test_a_resume_splices_onto_every_row_before_a_bad_line(tmp_path):
    """Finding 2. Attempt 1 is followed while its log holds step 1; it then logs steps 2..3
    and a line that is not JSON, and ends. Attempt 2 continues from step 3's checkpoint. The
    rows kept of attempt 1 are read up to the bad line, so they reach step 3, and the run's
    rows are 1..8, each step's time counted once."""
    first = _verl_log(tmp_path / "a1" / "verl.jsonl", range(1, 2))
    f = Follower("verl", OPTS)
    a1, a2 = _two_attempts(tmp_path, first, 3)
    assert [r["step"] for r in f.read([a1])[0]] == [1]
    _verl_log(first, range(1, 4), bad_after=3)
    f.freeze(a1, exit_status=1)
    steps, _, _ = f.read([a1, a2])
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert [r["train_s"] for r in steps] == pytest.approx([float(s) for s in range(1, 9)])


def test_rows_kept_short_of_the_checkpoint_are_read_again_from_the_log(tmp_path):
    """The rows kept of attempt 1 end at step 1 (kept as last read) while its log, bad line
    and all, reaches step 3, the checkpoint attempt 2 continues from: the log is read again
    up to the bad line (warned), not spliced after step 1."""
    first = _verl_log(tmp_path / "a1" / "verl.jsonl", range(1, 4), bad_after=2)
    a1, a2 = _two_attempts(tmp_path, first, 3)
    f = Follower("verl", OPTS)
    step_1 = [r for r in f._convert_upto_bad_line(first)[0] if r["step"] == 1]
    a1.rows_file.write_text(json.dumps({"steps": step_1, "evals": []}))
    steps, _, _ = f.read([a1, a2])
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert any("cannot be read; the rows of the lines around them are kept" in w
               for w in f.warnings), f.warnings


def test_a_resume_whose_earlier_rows_end_before_its_checkpoint_fails_in_one_line(tmp_path):
    """Attempt 1's log holds steps 1..2 and attempt 2 continues from step 4: steps 3..4
    were never logged, so the rows cannot be spliced without losing their time."""
    first = _verl_log(tmp_path / "a1" / "verl.jsonl", range(1, 3))
    with pytest.raises(DataError, match=r"attempt 2 continues from the checkpoint at step 4, "
                                        r"but the rows of the attempts before it end at step "
                                        r"2: the steps 3\.\.4 were never logged"):
        Follower("verl", OPTS).read(_two_attempts(tmp_path, first, 4))


# ---------------------------------------------------------------- through `rlbatch profile`
def _config(tmp_path: Path, **env) -> Path:
    return standin_profile(tmp_path, "order", {"LOG_WRITER_STEP_S": 0.05,
                                               "LOG_WRITER_FAULT_P": 8, **env})


def _profile(config: Path, out: Path) -> tuple[int, dict, str]:
    """(exit status, profile.json, what it printed) of `rlbatch profile`."""
    proc = subprocess.run([*RLBATCH, "profile", str(config), "--follow", "0", "--out", str(out)],
                          capture_output=True, text=True, check=False, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc.returncode, read_json(out / "profile.json"), proc.stdout + proc.stderr


def _time_ratio(doc: dict) -> float | None:
    """The candidate's T ratio to the baseline's, as the analysis measured it."""
    return next((c["vs_reference"]["time_ratio"] for c in doc["analysis"]["configs"]
                 if c.get("vs_reference")), None)


def _assert_left_out(doc: dict, err: str, said: str) -> None:
    """The candidate failed, said so in one line on the console, and is in no figure."""
    lines = [x for x in err.splitlines()
             if x.startswith(f"trial {CANDIDATE} failed and is left out")]
    assert len(lines) == 1 and said in lines[0], err[-3000:]
    assert CANDIDATE in doc["failed_trials"]
    configs = [c["config"] for c in doc["analysis"]["configs"]]
    assert all("B64" not in c for c in configs), configs


FAULTS = {
    # finding 3: an evaluation logged late, for step 2 after step 6, is that evaluation
    "late evaluation": ({"LOG_WRITER_LATE_EVAL": "6:2"}, None),
    # finding 5: one line for step 2 after step 6, then step 7: not a restart
    "stray line": ({"LOG_WRITER_STRAY": "6:2"}, "a line for step 2 after step 6, then step 7"),
    # finding 6: a line for step 1004 of a 16-step trial
    "jump past the budget": ({"LOG_WRITER_JUMP": "6:1004"},
                             "step 1004 is past the run's length (16 steps"),
    # finding 4: the target metric logged as text
    "target as text": ({"LOG_WRITER_TEXT_EVAL_FROM": "3"},
                       ("logged the target metric eval/x/reward/mean@1 (target.metric) as "
                        "something other than a number (")),
    # finding 7: the log deleted at step 4
    "deleted log": ({"LOG_WRITER_DELETE_AT": "4"}, "deleted its log "),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_in_a_candidates_log_keeps_the_t_ratio_or_leaves_the_trial_out(tmp_path,
                                                                               fault):
    env, said = FAULTS[fault]
    code, doc, err = _profile(_config(tmp_path, **env), tmp_path / "p")
    assert code == 0, err[-3000:]
    if said is None:
        assert _time_ratio(doc) == pytest.approx(0.5, rel=0.02), doc["analysis"]
        assert not doc["failed_trials"]
    else:
        _assert_left_out(doc, err, said)


# The whole matrix: this round's faults and the last round's, on either trial. The three
# endings (and `diverged` for a NaN loss) are the contract; which one a fault takes is printed (`pytest -s`) and recorded in
# docs/reliability.md. Its contract is checked fast by the parametrized test above (this
# round's faults on the candidate), the baseline test below and tests/test_trial_done.py.
MATRIX = {
    **{name: env for name, (env, _) in FAULTS.items()},
    "crash, then runs": {"LOG_WRITER_CRASH_AT": "5", "ONCE": ""},
    "crash at every attempt": {"LOG_WRITER_CRASH_AT": "5"},
    "bad line": {"LOG_WRITER_BAD_LINE_AT": "5", "ONCE": ""},
    "bad line right after a step": {"LOG_WRITER_BAD_AFTER": "5", "ONCE": ""},
    "killed inside a save": {"LOG_WRITER_KILL_IN_SAVE_AT": "4", "ONCE": ""},
    "killed in validation": {"LOG_WRITER_KILL_IN_VALIDATE_AT": "4", "LOG_WRITER_VALIDATE_S":
                             "0.2", "ONCE": ""},
    "rotated log": {"LOG_WRITER_ROTATE_AT": "5"},
    "truncated log": {"LOG_WRITER_TRUNCATE_AT": "5"},
    "NaN loss": {"LOG_WRITER_NAN_FROM": "5", "DIVERGES": ""},
    "renamed reward": {"LOG_WRITER_RENAME_AT": "5"},
}


def one_of_three(code: int, doc: dict | None, err: str, faulted: str,
                 diverges: bool = False) -> str:
    """Which of the three permitted endings this profile took; an assertion error for any
    other: the clean T ratio within 2% and no trial left out, the faulted candidate left out
    with one line and in no figure, or exit 2 with one error line. A faulted baseline never
    ends in exit 0 unless its T ratio is the clean one. A NaN loss (`diverges`) is a learning
    outcome, not a misbehaving log: that trial ends `diverged`, a run that did not reach the
    target, with the non-finite step's warning on the console; the baseline's then says why
    there is no decision."""
    if diverges and code == 0:
        name = CANDIDATE if faulted == "candidate" else "base-P4-s0"
        warned = [x for x in err.splitlines()
                  if x.startswith(f"warning: trial {name}: step 5: ") and "non-finite" in x]
        assert len(warned) == 1 and f"trial {name} (" in err and "): diverged," in err, err
        if faulted == "baseline":
            assert doc["decision"] is None and "base-P4-s0 diverged at " in err, err
        return f"diverged, with: {warned[0]}"
    if code == 2:
        errors = [x for x in err.splitlines() if x.startswith("error:")]
        assert len(errors) == 1, err[-3000:]
        return f"exit 2: {errors[0]}"
    assert code == 0 and doc is not None, err[-3000:]
    if not doc["failed_trials"]:
        assert _time_ratio(doc) == pytest.approx(0.5, rel=0.02), (err[-2000:], doc["analysis"])
        return f"T ratio {_time_ratio(doc):.4f}"
    assert faulted == "candidate", (doc["failed_trials"], err[-3000:])
    _assert_left_out(doc, err, "")
    return next(x for x in err.splitlines() if x.startswith(f"trial {CANDIDATE} failed"))


@pytest.mark.slow
@pytest.mark.parametrize("trial", ["candidate", "baseline"])
@pytest.mark.parametrize("fault", list(MATRIX))
def test_every_fault_on_either_trial_ends_in_one_of_three_ways(tmp_path, fault, trial):
    env = dict(MATRIX[fault])
    if "ONCE" in env:  # the fault fires at one attempt only
        env.pop("ONCE")
        env["LOG_WRITER_CRASH_ONCE"] = str(tmp_path / "fired")
    diverges = env.pop("DIVERGES", None) is not None
    env["LOG_WRITER_FAULT_P"] = "8" if trial == "candidate" else "4"
    out = tmp_path / "p"
    proc = subprocess.run([*RLBATCH, "profile", str(_config(tmp_path, **env)), "--follow", "0",
                           "--out",
                           str(out)], capture_output=True, text=True, check=False,
                          timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    doc = read_json(out / "profile.json") if (out / "profile.json").exists() else None
    ending = one_of_three(proc.returncode, doc, proc.stdout + proc.stderr, trial, diverges)
    print(f"\n{fault} on the {trial}: {ending}")


def test_a_fault_in_the_baselines_log_exits_2_in_one_line(tmp_path):
    config = _config(tmp_path, LOG_WRITER_STRAY="6:2", LOG_WRITER_FAULT_P="4")
    code, _, err = _profile(config, tmp_path / "p")
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and len(errors) == 1, err[-3000:]
    assert "a line for step 2 after step 6, then step 7" in errors[0]


def test_a_bad_line_then_a_fixed_trainer_resumes_with_every_step_before_it(tmp_path):
    """Finding 2: the candidate writes a line that is not JSON right after step 2 (its
    checkpoint step): the trial fails; the trainer fixed (LOG_WRITER_CRASH_ONCE), the profile
    is run again and the trial resumes from step 2's checkpoint. The rows of the first
    attempt are read up to the bad line, so they reach step 2 and the T ratio is the clean
    one."""
    config = _config(tmp_path, LOG_WRITER_BAD_AFTER="2",
                     LOG_WRITER_CRASH_ONCE=str(tmp_path / "once"))
    code, doc, err = _profile(config, tmp_path / "p")
    assert code == 0, err[-3000:]
    _assert_left_out(doc, err, "invalid JSON")
    code, doc, err = _profile(config, tmp_path / "p")
    assert code == 0, err[-3000:]
    assert not doc["failed_trials"] and _time_ratio(doc) == pytest.approx(0.5, rel=0.02)
    run = next((tmp_path / "p" / "runs").glob("grpo-P8*"))
    steps = [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))
    assert read_json(run / "summary.json")["command"]["attempts"] == 2


def test_a_kill_during_verl_validation_at_a_save_step_resumes_from_a_step_it_logged(
        tmp_path, capsys):
    """Issue 54, finding 8. verl V1 saves inside the step, then validates, then logs the
    step (verl/trainer/ppo/v1/trainer_base.py 449-490 at 1dda039; the stand-in's
    LOG_WRITER_VALIDATE_S): a SIGKILL during step 8's validation leaves its checkpoint
    saved and its line unwritten. The next attempt resumes from step 4's checkpoint, the
    newest that the rows reach, so step 8's time and evaluation are counted once: the rows
    are the uninterrupted run's."""
    from helpers.cli import run_cli
    from rlbatch.core.runlog import read_jsonl
    from test_command import _config as train_config
    from test_command import _run_dir

    once = tmp_path / "killed"
    config = train_config(tmp_path, LOG_WRITER_STEP_S=0.05, LOG_WRITER_VALIDATE_S=0.4,
                          LOG_WRITER_KILL_IN_VALIDATE_AT=8, LOG_WRITER_CRASH_ONCE=once)
    code, _, err = run_cli(["train", str(config)], capsys)
    assert code == 2 and once.exists() and "killed by SIGKILL" in err, err
    run = _run_dir(tmp_path)
    assert [r["step"] for r in read_jsonl(run / "steps.jsonl")[0]] == list(range(1, 8))
    code, _, err = run_cli(["train", str(config), "--resume"], capsys)
    assert code == 0, err
    second = json.loads((run / "command" / "attempts" / "002" / "attempt.json").read_text())
    assert second["resume_step"] == 4
    assert second["settings"]["trainer.resume_mode"] == "resume_path"
    steps = read_jsonl(run / "steps.jsonl")[0]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert [r["train_s"] for r in steps] == pytest.approx([0.05 * s for s in range(1, 21)])
    assert [e["step"] for e in read_jsonl(run / "evals.jsonl")[0]] == [0, *range(2, 21, 2)]
