"""Kills at random points (issue 16, build item 3): a real `rlbatch train` process SIGKILLed
at points drawn from a seeded generator (inside steps, evaluations and checkpoint writes,
and during start-up and restore) and resumed with `--resume` after each kill, until it
completes; every non-timing value it logged must then equal an uninterrupted run's with the
same seed and config. And `rlbatch profile` killed during its decode sweep and during its
trials (the baseline's first seed, its confirmation seed and a screening trial): no finished
trial is re-run and the decision equals an uninterrupted profile's.

The kill points and how a kill's landing place is read back are in tests/helpers/kill.py.
`RLBATCH_KILL_SEED` picks other kill points (the default is fixed, so a failure can be
re-run). The uninterrupted reference runs beside the killed run, both with one thread, so
the two compute alike and the test takes about the time of one run plus its restarts.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import set_flags
from helpers.kill import Schedule, cli, env, kill, kill_at, run_dir_in, stable, start
from helpers.profile_kill import logged_steps
from rlbatch.core.runlog import FINISHED, read_run

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

KILL_SEED = int(os.environ.get("RLBATCH_KILL_SEED", "16"))

# 24 steps of 64 sequences; evaluations every 8 steps, checkpoints every 4
TRAIN = ["batch.prompts_per_step=8", "budget.max_samples=1536", "eval.every_samples=512",
         "eval.prompts=64", "checkpoint.every_samples=256"]
TRAIN_MARKS = Schedule(per_step=64, eval_every=512, ckpt_every=256, budget=1536)
# 8 steps; evaluations every 4 steps, checkpoints every 2
FAST = ["batch.prompts_per_step=8", "budget.max_samples=512", "eval.every_samples=256",
        "eval.prompts=32", "checkpoint.every_samples=128"]
FAST_MARKS = Schedule(per_step=64, eval_every=256, ckpt_every=128, budget=512)


def _kill_resume_compare(tmp_path: Path, settings: list[str], marks: Schedule,
                         phases: list[str], rng: np.random.Generator) -> list[str]:
    """Run the reference, kill a second run once per phase (resuming it after each kill),
    finish it, and assert that the two logs agree in every non-timing value."""
    cmd = cli("train", "--preset", "grpo-tiny", *set_flags(settings))
    a, b = tmp_path / "a", tmp_path / "b"
    reference = subprocess.Popen(cmd + ["--out", str(a)], env=env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    places = []
    try:
        for i, phase in enumerate(phases):
            resume = ["--resume"] if i else []
            places.append(kill_at(cmd + ["--out", str(b), *resume], b, phase, marks, rng,
                                  len(phases) - i))
            run = run_dir_in(b)
            if run is not None and (run / "summary.json").exists():  # nothing written at a kill
                assert json.loads((run / "summary.json").read_text())["status"] == "running"
        done = subprocess.run(cmd + ["--out", str(b), "--resume"], env=env(),
                              capture_output=True, text=True, check=False, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        _, err = reference.communicate(timeout=900)
    assert reference.returncode == 0, err[-3000:]
    print(f"kill seed {KILL_SEED}: {list(zip(phases, places))}")
    ra, rb = read_run(run_dir_in(a)), read_run(run_dir_in(b))
    assert len(ra.steps) == len(rb.steps) == marks.steps
    assert not rb.warnings  # no row cut by a kill survives the resume
    assert stable(rb.steps) == stable(ra.steps)
    assert stable(rb.evals) == stable(ra.evals)
    assert stable(rb.summary) == stable(ra.summary)
    # the budget ends the run (grpo-tiny does not stop at its target); whether the target was
    # crossed on the way is where the run landed, and the status must say which
    reached = rb.summary["target"]["reached"]
    assert rb.summary["status"] == ("target_reached" if reached else "budget_exhausted")
    for phase, place in zip(phases, places):  # the targeted points were hit
        want = {"eval": "evaluation", "checkpoint": "checkpoint write"}.get(phase)
        assert want is None or place == want, (phase, place)
    return places


def test_two_random_kills_resume_to_the_uninterrupted_log(tiny_model_dir, tmp_path):
    """One kill inside an evaluation and one inside a checkpoint write, in a random order at
    random steps of an 8-step run."""
    rng = np.random.default_rng(KILL_SEED)
    phases = [str(p) for p in rng.permutation(["eval", "checkpoint"])]
    _kill_resume_compare(tmp_path, FAST, FAST_MARKS, phases, rng)


def test_a_stale_run_killed_twice_resumes_to_the_uninterrupted_log(tiny_model_dir, tmp_path):
    """Rollouts decoded two versions ahead (rollout.max_staleness=2): kills inside an
    evaluation and inside a checkpoint write, while batches are pending on the worker; the
    checkpoint's kept weights decode them again on resume, to the same log."""
    rng = np.random.default_rng(KILL_SEED + 1)
    phases = [str(p) for p in rng.permutation(["eval", "checkpoint"])]
    _kill_resume_compare(tmp_path, [*FAST, "rollout.max_staleness=2"], FAST_MARKS, phases, rng)


@pytest.mark.slow
def test_five_random_kills_resume_to_the_uninterrupted_log(tiny_model_dir, tmp_path):
    """Five kills of a 24-step run: during start-up or restore, inside a step, inside an
    evaluation, inside a checkpoint write, and one more of the last three, in random order."""
    rng = np.random.default_rng(KILL_SEED)
    extra = str(rng.choice(["step", "eval", "checkpoint"]))
    phases = [str(p) for p in rng.permutation(["start", "step", "eval", "checkpoint", extra])]
    places = _kill_resume_compare(tmp_path, TRAIN, TRAIN_MARKS, phases, rng)
    assert {"evaluation", "checkpoint write"} <= set(places)


# ---------------------------------------------------------------- rlbatch profile

# A profile small enough to run twice, whose decision does not depend on timing: baseline
# B0 = 32 (P0 = 4, eta0 = 5e-5, the presets' rule at B = 32), no sqrt-scaled candidate
# (`--batches 4` is the baseline's P), the fixed-LR control at 2 x B0, which is never
# recommended (it is outside the baseline's LR-scaling family), and no early stops (where
# they land depends on timing). So the decision is the baseline with evidence `nothing_compared`
# on any machine and every trial runs to its target or budget: both profiles must run the
# same trials to the same logs. A decode sweep over one concurrency (its choice does not
# depend on timing either); min_evaluations=1, so that the profile never refuses on its
# cadence, wherever the runs land; trials checkpoint every 128 samples (4 baseline steps), so
# that a killed trial resumes from a checkpoint taken inside it.
# (A sqrt candidate that wins makes the decision hang on wall-clock seconds: with P = 32 the
# candidate needed about twice the baseline's samples, and the upper end of the T-ratio
# interval came out 0.76 in one profile and 1.07 in the other, on the same runs' values.)
PROFILE = ["--follow", "0", "--batches", "4", "--concurrency", "64", *set_flags([
    "optimizer.reference_sequences=32", "optimizer.reference_lr=5e-5", "target.gain=0.05",
    "eval.prompts=256", "eval.every_samples=256", "profile.fixed_lr_control=true",
    "profile.early_stop=false", "profile.min_evaluations=1", "checkpoint.every_samples=128",
    "budget.max_samples=6144"])]
DECISION_KEYS = ("config", "prompts_per_step", "samples_per_prompt", "sequences_per_step",
                 "lr", "generation_concurrency", "evidence", "is_reference", "seeds")
ANALYSIS_KEYS = ("config", "verdict", "indication", "seeds", "samples_to_target")
PROFILE_TIMEOUT = 1800


def _profile_cmd(out: Path) -> list[str]:
    return cli("profile", "--preset", "quick", *PROFILE, "--out", str(out), "--json")


def _journal(out: Path) -> list[dict]:
    path = out / "journal.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def _finished_logs(out: Path) -> dict[str, str]:
    """steps.jsonl of every trial whose run directory says it finished, by run directory."""
    done = {}
    for run in (out / "runs").glob("*/summary.json"):
        if json.loads(run.read_text()).get("status") in FINISHED:
            done[str(run.parent)] = (run.parent / "steps.jsonl").read_text()
    return done


def _resume_points(out: Path) -> list[str]:
    """The checkpoints of the trials a kill left unfinished (what their re-run resumes from)."""
    return sorted(f"{c.parent.parent.name}/{c.name}"
                  for run in (out / "runs").glob("*/summary.json")
                  if json.loads(run.read_text()).get("status") not in FINISHED
                  for c in run.parent.glob("checkpoints/step-*"))


def _point_fired(point: tuple, out: Path, events: list[dict]) -> bool | None:
    """Whether a profile kill point has come (None: it can no longer come in this process).
    Points: ("sweep",) while the decode sweep runs; ("trial", name, rows) once trial `name`
    has logged `rows` steps."""
    if point[0] == "sweep":
        if any(e["event"] == "started" for e in events) or (out / "decode.json").exists():
            return None
        return any(e["event"] == "profile_started" for e in events)
    _, name, rows = point
    if any(e.get("trial") == name and e["event"] in ("finished", "skipped_finished")
           for e in events):
        return None
    started = [e for e in events if e["event"] == "started" and e["trial"] == name]
    return bool(started) and logged_steps(started[-1]["run_dir"]) >= rows


def _kill_profile(out: Path, points: list[tuple], rng: np.random.Generator) -> list[dict]:
    """Run the profile, SIGKILL it (with its trial process) at each point that comes, re-run
    it after each kill, and let the last re-run finish. Returns, per kill, its point, the
    logs of the trials finished by then, the journal's length then, whether the decode
    sweep had been saved, and the checkpoints the killed trial can resume from."""
    kills, points = [], list(points)
    while True:
        restart = len(_journal(out))
        proc = start(_profile_cmd(out))
        t0, fired = time.monotonic(), False
        try:
            while points and proc.poll() is None and time.monotonic() - t0 < PROFILE_TIMEOUT:
                state = _point_fired(points[0], out, _journal(out)[restart:])
                if state is None:  # this point passed: the next one
                    points.pop(0)
                elif state:
                    time.sleep(float(rng.uniform(0, 1.0)))  # within the sweep or the step
                    if proc.poll() is None:
                        kill(proc)
                        kills.append({"point": points.pop(0), "finished": _finished_logs(out),
                                      "journal": len(_journal(out)),
                                      "swept": (out / "decode.json").exists(),
                                      "resumes_from": _resume_points(out)})
                        fired = True
                    break
                time.sleep(0.02)
            if not fired:
                assert proc.wait(timeout=PROFILE_TIMEOUT) == 0, "the profile failed"
                return kills
        finally:
            kill(proc)


def _profile_doc(out: Path) -> dict:
    return json.loads((out / "profile.json").read_text())


@pytest.mark.slow
def test_profile_killed_in_its_sweep_and_trials_reruns_nothing_finished(tiny_model_dir,
                                                                        tmp_path):
    """Kills during the decode sweep, the baseline's first seed, its confirmation seed and
    the control's screening seed (each at a random step 1-12), a re-run after each; then no
    trial that had finished was started again or changed, and the decision, the analysis'
    verdicts and N*, the trials and their logs equal an uninterrupted profile's run beside
    it."""
    rng = np.random.default_rng(KILL_SEED)
    ref, out = tmp_path / "reference", tmp_path / "killed"
    reference = start(_profile_cmd(ref))
    # each trial's kill row comes before its first evaluation after step 0 (256 samples: step
    # 8 of B0 = 32, step 4 of the control's 64), so no trial can end before its kill
    points = [("sweep",)] + [("trial", name, int(rng.integers(1, last + 1)))
                             for name, last in (("base-P4-s0", 7), ("base-P4-s1", 7),
                                                ("fixed-lr-P8-s0", 3))]
    try:
        kills = _kill_profile(out, points, rng)
        assert reference.wait(timeout=PROFILE_TIMEOUT) == 0, "the reference profile failed"
    finally:
        kill(reference)
    print(f"kill seed {KILL_SEED}: {[(k['point'], k['resumes_from']) for k in kills]}")
    ran = {t["trial"] for t in _profile_doc(ref)["trials"]}  # the control runs unless the
    assert [k["point"] for k in kills] == [  # baseline's evidence has a problem (too easy)
        p for p in points if p[0] == "sweep" or p[1] in ran]
    assert not kills[0]["swept"]  # killed inside the sweep
    events = _journal(out)
    assert sum(e["event"] == "decode_sweep" for e in events) == 1
    for k in kills:  # nothing finished before a kill was run again, nor changed
        later = events[k["journal"]:]
        for run_dir, text in k["finished"].items():
            assert not any(e["event"] == "started" and e["run_dir"] == run_dir for e in later)
            assert (Path(run_dir) / "steps.jsonl").read_text() == text
    for name in {e["trial"] for e in events if "trial" in e}:
        assert sum(e["event"] == "finished" and e["trial"] == name for e in events) <= 1, name
    a, b = _profile_doc(ref), _profile_doc(out)
    assert b["problem"] == a["problem"]
    if a["problem"] is None:  # both seeds of the baseline crossed, after their first eval
        assert {k: b["decision"][k] for k in DECISION_KEYS} == \
            {k: a["decision"][k] for k in DECISION_KEYS}
        assert b["decision"]["is_reference"] and b["decision"]["evidence"] == "nothing_compared"
    else:
        assert a["decision"] is None and b["decision"] is None
    if a["analysis"] is None:  # a baseline with a problem stops the profile before analysis
        assert b["analysis"] is None
    else:
        assert [{k: c.get(k) for k in ANALYSIS_KEYS} for c in b["analysis"]["configs"]] == \
            [{k: c.get(k) for k in ANALYSIS_KEYS} for c in a["analysis"]["configs"]]
    assert [(t["trial"], t["status"]) for t in b["trials"]] == \
        [(t["trial"], t["status"]) for t in a["trials"]]
    for ta, tb in zip(a["trials"], b["trials"]):
        ra, rb = read_run(ta["run_dir"]), read_run(tb["run_dir"])
        assert not rb.warnings, tb["trial"]
        assert stable(rb.steps) == stable(ra.steps), ta["trial"]
        assert stable(rb.evals) == stable(ra.evals), ta["trial"]
        assert stable(rb.summary) == stable(ra.summary), ta["trial"]
