"""Batch schedules (`batch.schedule`, issue 31): B changing during a run, stepwise in samples or
adaptive on the measured gradient noise scale.

- the adaptive rule on constructed noise-scale traces (algos/batch_schedule.py);
- the config's checks, and run ids of configs without a schedule unchanged;
- the LR of every row is the square-root rule at that row's B (warm-up in samples kept);
- kills and resumes, one of them at the step where B changes, give the uninterrupted run's
  log (stepwise), and so do kills of an adaptive run (its B, streak and noise-scale state are
  in the checkpoint).

What the trained tests assume of the machine's arithmetic: nothing. They compare a run with
itself (killed or not) on the same machine, and the LRs follow from the config.
"""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from helpers.cli import set_flags
from helpers.kill import Schedule, cli, env, kill_at, run_dir_in, stable
from rlbatch.algos.batch_schedule import adaptive_step, stepwise_sequences
from rlbatch.algos.lr import lr_mean
from rlbatch.core.errors import ConfigError
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import make_run_id, read_run

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

NAN = math.nan


# ---------------------------------------------------------------- the rules
def test_stepwise_sequences_is_the_last_point_at_or_before_the_samples():
    points = [(0, 64), (256, 128), (768, 256)]
    got = [stepwise_sequences(points, s) for s in (0, 255, 256, 767, 768, 10**6)]
    assert got == [64, 64, 128, 128, 256, 256]


def _trace(trace, *, start=64, k=1, factor=2, threshold=1.0, patience=3, cap=512):
    """B before each step and after the last, for a trace of smoothed B_simple values."""
    b, streak, out = start, 0, [start]
    for value in trace:
        b, streak = adaptive_step(b, streak, value, minibatches=k, factor=factor,
                                  threshold=threshold, patience=patience, max_sequences=cap)
        out.append(b)
    return out


def test_adaptive_rule_on_constructed_noise_scale_traces():
    # above the minibatch three steps in a row: raised once, the count starts again
    assert _trace([100, 100, 100, 100]) == [64, 64, 64, 128, 128]
    # an unresolved step (NaN) or one below the threshold breaks the streak
    assert _trace([100, NAN, 100, 100, 50, 100, 100, 100]) == [64] * 8 + [128]
    # the threshold is relative to the optimizer minibatch B / k, not to B
    assert _trace([100] * 3, k=2, start=128) == [128, 128, 128, 256]
    assert _trace([100] * 3, k=1, start=128) == [128] * 4
    assert _trace([130] * 3, threshold=2.0) == [64, 64, 64, 128]
    assert _trace([127] * 3, threshold=2.0) == [64] * 4
    # never above max_sequences, never lowered (a falling B_simple keeps B)
    assert _trace([10**6] * 12, cap=300) == [64, 64, 64, 128, 128, 128, 256, 256, 256, 300,
                                             300, 300, 300]
    assert _trace([1000] * 3 + [1.0] * 6) == [64, 64, 64, 128] + [128] * 6
    # patience 1: every resolved step at or above the threshold raises
    assert _trace([64, 128, 255], patience=1) == [64, 128, 256, 256]


# ---------------------------------------------------------------- the config
def test_schedule_config_checks_name_the_field():
    def refused(*sets, match):
        with pytest.raises(ConfigError, match=match):
            load_config(None, preset="grpo-tiny", overrides=list(sets))

    refused("batch.schedule={steps: [[0, 64], [512, 256]]}", match="starts at B = 64, but")
    refused("batch.schedule={steps: [[0, 128], [512, 260]]}", match="B = 260 is not a multiple")
    refused("batch.schedule={steps: [[0, 128], [0, 256]]}", match="the starts increase")
    refused("batch.schedule={steps: [[0, 128]], adaptive: {max_sequences: 512}}",
            match="exactly one of steps")
    refused("batch.schedule={adaptive: {max_sequences: 512}}", match="noise_scale.enabled")
    refused("batch.schedule={steps: [[0, 128], [512, 256]]}", "optimizer.lr=1e-4",
            match="leave optimizer.lr")
    refused("batch.schedule={steps: [[0, 128], [512, 320]]}", "batch.micro_batch_sequences=128",
            match=r"must divide the minibatch \(320 sequences.*at B = 320")
    ok = load_config(None, preset="grpo-tiny", overrides=[
        "noise_scale.enabled=true", "batch.micro_batch_sequences=16",
        "batch.schedule={adaptive: {factor: 2, max_sequences: 1024}}"])
    assert ok.batch_sizes() == [128, 256, 512, 1024]


def test_configs_without_a_schedule_keep_their_run_ids():
    """The run id hashes the resolved config: an unset schedule leaves no key in it, so the
    config resolves to what it did before the section existed."""
    cfg = load_config(None, preset="grpo-tiny", overrides=[])
    resolved = cfg.resolved_dict()
    assert "schedule" not in resolved["batch"]
    assert set(resolved["batch"]) == {"prompts_per_step", "samples_per_prompt",
                                      "minibatches_per_step", "epochs_per_step",
                                      "micro_batch_sequences"}
    with_one = load_config(None, preset="grpo-tiny",
                           overrides=["batch.schedule={steps: [[0, 128], [4096, 256]]}"])
    assert make_run_id(with_one.resolved_dict(), 0) != make_run_id(resolved, 0)


# ---------------------------------------------------------------- real runs
STEPWISE = ["batch.prompts_per_step=8",
            "batch.schedule={steps: [[0, 64], [256, 128], [768, 256]]}",
            "budget.max_samples=1536", "budget.stop_at_target=false",
            "eval.every_samples=256", "eval.prompts=32", "checkpoint.every_samples=256"]
STEPWISE_MARKS = Schedule(per_step=64, eval_every=256, ckpt_every=256, budget=1536,
                          points=((0, 64), (256, 128), (768, 256)))


def _train(tmp_path, settings, out="a"):
    res = subprocess.run(cli("train", "--preset", "grpo-tiny", *set_flags(settings), "--out",
                             str(tmp_path / out)), env=env(), capture_output=True, text=True,
                         check=False, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return read_run(run_dir_in(tmp_path / out))


def test_every_row_runs_at_the_sqrt_rule_of_its_batch(tiny_model_dir, tmp_path):
    run = _train(tmp_path, [*STEPWISE, "optimizer.warmup_samples=512"])
    sizes = [r["batch/sequences_per_step"] for r in run.steps]
    assert sizes == [64] * 4 + [128] * 4 + [256] * 3
    assert [r["batch/prompts_per_step"] for r in run.steps] == [b // 8 for b in sizes]
    before = 0
    for row, b in zip(run.steps, sizes):
        eta = 1e-4 * math.sqrt(b / 128)  # eta0 sqrt(B / B0), B0 = 128, eta0 = 1e-4
        want = lr_mean(before, before + b, eta, 512)  # the warm-up stays in samples
        assert row["actor/lr"] == pytest.approx(want, rel=1e-12), row["step"]
        assert row["samples"] == before + b
        before += b


def _killed_equals_uninterrupted(tmp_path, settings, marks, kills):
    """Run a reference and, beside it, a run killed at `kills` ((phase, row or None), ...),
    resumed after each; their logs must agree in every non-timing value."""
    cmd = cli("train", "--preset", "grpo-tiny", *set_flags(settings))
    rng = np.random.default_rng(31)
    ref = subprocess.Popen(cmd + ["--out", str(tmp_path / "a")], env=env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    places = []
    try:
        for i, (phase, row) in enumerate(kills):
            resume = ["--resume"] if i else []
            places.append(kill_at(cmd + ["--out", str(tmp_path / "b"), *resume],
                                  tmp_path / "b", phase, marks, rng, len(kills) - i, row=row))
        done = subprocess.run(cmd + ["--out", str(tmp_path / "b"), "--resume"], env=env(),
                              capture_output=True, text=True, check=False, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        _, err = ref.communicate(timeout=900)
    assert ref.returncode == 0, err[-3000:]
    ra, rb = read_run(run_dir_in(tmp_path / "a")), read_run(run_dir_in(tmp_path / "b"))
    assert not rb.warnings
    assert stable(rb.steps) == stable(ra.steps)
    assert stable(rb.evals) == stable(ra.evals)
    assert stable(rb.summary) == stable(ra.summary)
    return ra, places


def test_kills_at_a_change_of_batch_resume_to_the_uninterrupted_log(tiny_model_dir, tmp_path):
    """Three kills: inside step 5 (the first at B = 128: the row of step 4, the last at 64,
    is logged), inside a checkpoint write, and inside an evaluation."""
    run, places = _killed_equals_uninterrupted(
        tmp_path, STEPWISE, STEPWISE_MARKS, [("step", 4), ("checkpoint", None),
                                             ("eval", None)])
    assert [r["batch/sequences_per_step"] for r in run.steps] == [64] * 4 + [128] * 4 + [256] * 3
    print("kills landed:", places)


def test_kills_of_an_adaptive_run_resume_to_the_uninterrupted_log(tiny_model_dir, tmp_path):
    settings = ["batch.prompts_per_step=8", "noise_scale.enabled=true",
                "batch.micro_batch_sequences=16",
                ("batch.schedule={adaptive: {factor: 2, threshold: 1.0, patience: 2, "
                 "max_sequences: 512}}"),
                "budget.max_samples=2048", "budget.stop_at_target=false",
                "eval.every_samples=512", "eval.prompts=32", "checkpoint.every_samples=128"]
    # positions drawn as if every step ran at the largest B (the fewest steps there can be)
    marks = Schedule(per_step=512, eval_every=512, ckpt_every=128, budget=2048)
    run, _ = _killed_equals_uninterrupted(tmp_path, settings, marks,
                                          [("step", 2), ("checkpoint", None)])
    sizes = [r["batch/sequences_per_step"] for r in run.steps]
    assert sizes == sorted(sizes) and sizes[0] == 64  # never lowered
    for row, nxt in zip(run.steps, sizes[1:]):  # a raise follows `patience` steps at or above
        if nxt > row["batch/sequences_per_step"]:
            assert row["batch/schedule_streak"] == 0 and row["batch/noise_over_minibatch"] >= 1
    print("B per step:", json.dumps(sizes))


def test_a_schedule_is_a_candidate_but_not_a_point_of_the_b_axis_models():
    """A schedule's `sequences_per_step` is its first B: the critical batch and the N*(B) fit
    leave it out, the recommendation's family keeps it."""
    from rlbatch.analysis import selection
    from rlbatch.analysis.analyze import _critical_batch

    ref = {"config": "r", "algorithm": "grpo", "lr_scaling": "sqrt", "sequences_per_step": 128,
           "verdict": "reference", "samples_to_target": 1000.0, "schedule": None}
    sched = {**ref, "config": "s", "verdict": "departed", "schedule": "steps 128,256@1024"}
    big = {**ref, "config": "b", "sequences_per_step": 256, "verdict": "aligned",
           "samples_to_target": 1100.0}
    assert selection.family([ref, sched, big], ref) == [ref, sched, big]
    assert selection.static([ref, sched, big]) == [ref, big]
    assert _critical_batch([ref, sched, big], ref)["critical_batch_departure"] == 256


# ---------------------------------------------------------------- in a profile
def test_a_profile_compares_a_schedule_as_a_candidate(tiny_model_dir, tmp_path, capsys):
    """A schedule beside the baseline: it runs as a trial of its own, the analysis lists it
    with its schedule (left out of the B-axis models), and the report marks where B
    changed. Whether it wins is where the runs land; the test does not ask. No early stops:
    they compare training seconds, which the other worker's load moves (a `cannot_win` stop
    of the schedule at its 1,024th sample, before its first step at B = 256, left nothing to
    mark). The schedule's first 512 samples are the baseline's own steps (same seed, B and
    LR), so it reaches B = 256 unless the baseline meets the target within 4 steps."""
    from helpers.cli import run_cli
    from rlbatch.analysis.figures import invariance_data
    from rlbatch.analysis.runs import load_runs

    out = tmp_path / "p"
    code, stdout, err = run_cli([
        "profile", "--preset", "quick", "--follow", "0", "--out", out, "--json",
        "--concurrency", "64",
        *set_flags(["profile.prompts_per_step=[16]", "profile.confirm_seeds=0",
                    "profile.fixed_lr_control=false", "target.gain=0.1",
                    "eval.prompts=256", "profile.min_evaluations=3",
                    "profile.early_stop=false",
                    "profile.schedules=[{steps: [[0, 128], [512, 256]]}]"])], capsys)
    assert code == 0, err
    doc = json.loads(stdout.strip().splitlines()[-1])
    profile = json.loads((out / "profile.json").read_text())
    names = [t["trial"] for t in profile["trials"]]
    assert names == ["base-P16-s0", "sched1-P16-s0"]
    sched = next(c for c in profile["analysis"]["configs"] if c["schedule"])
    assert sched["schedule"] == "steps 128,256@512" and sched["sequences_per_step"] == 128
    assert doc["decision"] is not None
    frames = load_runs([str(out / "runs")])
    data = invariance_data(profile["analysis"], frames)
    marks = next(c for c in data["configs"] if c["config"] == sched["config"])["changes"]
    assert marks == [[[512.0, 256.0]]]  # B went to 256 where 512 samples were done
    code, _, err = run_cli(["report", out, "-o", tmp_path / "r.html"], capsys)
    assert code == 0, err
