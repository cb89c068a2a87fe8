"""N*, T and q per run, on hand-computed curves and on synthetic run logs (RunWriter)."""

import math

import numpy as np
import pandas as pd
import pytest

from rlbatch.analysis.crossing import (
    Target,
    first_crossing,
    parse_target,
    per_run_records,
    run_result,
    smooth_trailing,
)
from rlbatch.analysis.runs import load_runs
from rlbatch.core.errors import DataError, UserError
from rlbatch.core.runlog import RunWriter

ACC = "eval/accuracy"
T05 = Target(ACC, 0.5)


def step_row(step, samples, train_s, **extra):
    row = {"step": step, "samples": samples, "prompts": samples // 8, "tokens": samples * 5,
           "train_s": train_s, "time/rollout": 0.0, "time/reward": 0.0,
           "time/actor_update": 0.0, "time/critic_update": 0.0, "time/other": 0.0,
           "reward/mean": 0.0, "actor/lr": 1e-4, "actor/grad_norm": 1.0, "actor/loss": 0.0}
    row.update(extra)
    return row


def write_run(root, name, evals, steps=(), seed=0, b=128, config=True):
    """evals: (samples, accuracy[, train_s]); steps: (samples, train_s). step = samples/100."""
    d = root / name
    with RunWriter(d) as w:
        if config:
            w.write_config({"algorithm": "grpo", "batch": {"prompts_per_step": b // 8,
                            "samples_per_prompt": 8}, "seed": seed,
                            "optimizer": {"reference_sequences": 128, "lr_scaling": "sqrt"},
                            "derived": {"sequences_per_step": b, "actor_lr": 1e-4}})
            w.write_manifest({"run_id": name, "seed": seed})
        for s, t in steps:
            w.log_step(step_row(s // 100, s, t))
        for e in evals:
            s, acc = e[0], e[1]
            t = e[2] if len(e) > 2 else s / 10
            w.log_eval({"step": s // 100, "samples": s, "train_s": t, ACC: acc})
    return d


STEPS = [(100, 10.0), (200, 30.0), (300, 40.0)]


def result(root, name="r"):
    frames = load_runs([root / name])
    return per_run_records(frames, T05)[0], frames


# ---------- first_crossing on arrays ----------

def test_interpolates_between_bracketing_evaluations():
    c = first_crossing([0, 100, 200, 300], [0.125, 0.25, 0.75, 0.875], 0.5)
    # frac = (0.5 - 0.25) / (0.75 - 0.25) = 0.5 -> 100 + 0.5 * 100
    assert (c.samples, c.censored, c.last_samples, c.index) == (150.0, False, 300.0, 2)


def test_first_of_several_crossings_counts():
    c = first_crossing([0, 100, 200, 300], [0.25, 0.75, 0.25, 0.75], 0.5)
    assert c.samples == 50.0


def test_tie_at_target_counts_as_reached():
    assert first_crossing([0, 100, 200, 300], [0.25, 0.5, 0.5, 0.75], 0.5).samples == 100.0
    # equal samples with a jump (same samples logged twice): no division by a zero width
    assert first_crossing([0, 100, 100, 200], [0.25, 0.25, 0.75, 0.75], 0.5).samples == 100.0


def test_first_evaluation_already_meets_target():
    c = first_crossing([64, 128], [0.5, 0.75], 0.5)
    assert (c.samples, c.index) == (64.0, 0)


def test_never_crossing_is_censored_not_extrapolated():
    c = first_crossing([0, 100, 200], [0.125, 0.25, 0.375], 0.5)
    assert (c.samples, c.censored, c.last_samples) == (None, True, 200.0)
    empty = first_crossing([], [], 0.5)
    assert (empty.samples, empty.censored, empty.last_samples) == (None, True, None)


def test_nan_values_are_skipped():
    c = first_crossing([0, 100, 200, 300], [0.25, math.nan, 0.75, 0.875], 0.5)
    assert c.samples == 100.0  # interpolated between 0 (0.25) and 200 (0.75)


def test_lower_is_better_target():
    c = first_crossing([0, 100, 200], [1.0, 0.75, 0.25], 0.5, higher_is_better=False)
    assert c.samples == 150.0


def test_smoothing_is_a_trailing_mean():
    assert smooth_trailing([1.0, 3.0, 5.0, 7.0], 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert smooth_trailing([1.0, 3.0], 1).tolist() == [1.0, 3.0]
    with pytest.raises(UserError):
        smooth_trailing([1.0], 0)


def test_parse_target():
    assert parse_target("eval/accuracy=0.8") == Target("eval/accuracy", 0.8, True)
    assert parse_target("eval/accuracy>=0.8") == Target("eval/accuracy", 0.8, True)
    assert parse_target("eval/loss<=0.25") == Target("eval/loss", 0.25, False)
    for bad in ("eval/accuracy", "eval/accuracy=", "=0.5", "eval/accuracy=abc", "a=1=2"):
        with pytest.raises(UserError, match="--target"):
            parse_target(bad)


# ---------- synthetic run logs ----------

def test_run_log_crossing_and_time_through_step_log(tmp_path):
    # eval train_s (11, 31, ...) differ from the step log: T must come from the step log.
    write_run(tmp_path, "r", [(0, 0.125, 0.0), (100, 0.25, 11.0), (200, 0.75, 31.0),
                              (300, 0.875, 41.0)], STEPS)
    r, _ = result(tmp_path)
    assert r["samples_to_target"] == 150.0
    assert r["time_to_target"] == 20.0  # interp((100, 10), (200, 30)) at 150
    assert r["censored"] is False
    assert r["throughput"] == 300 / 40.0
    assert r["config"].startswith("grpo-B128-lr0.0001-")


def test_time_falls_back_to_eval_rows_without_step_log(tmp_path):
    write_run(tmp_path, "r", [(0, 0.125, 0.0), (100, 0.25, 11.0), (200, 0.75, 31.0)])
    r, _ = result(tmp_path)
    assert r["time_to_target"] == 21.0
    assert r["throughput"] == 200 / 31.0


def test_time_before_first_step_interpolates_from_zero(tmp_path):
    write_run(tmp_path, "r", [(0, 0.25, 0.0), (100, 0.75, 10.0)], [(100, 8.0), (200, 16.0)])
    r, _ = result(tmp_path)
    assert (r["samples_to_target"], r["time_to_target"]) == (50.0, 4.0)


def test_censored_run_reports_last_samples(tmp_path):
    write_run(tmp_path, "r", [(0, 0.125), (100, 0.25), (300, 0.375)], STEPS)
    r, _ = result(tmp_path)
    assert (r["samples_to_target"], r["time_to_target"], r["censored"]) == (None, None, True)
    assert (r["last_samples"], r["last_train_s"]) == (300.0, 40.0)


def test_first_eval_meets_target(tmp_path):
    write_run(tmp_path, "r", [(0, 0.5, 0.0), (100, 0.75)], STEPS)
    r, _ = result(tmp_path)
    assert (r["samples_to_target"], r["time_to_target"]) == (0.0, 0.0)


def test_null_metric_rows_are_skipped(tmp_path):
    # RunWriter stores NaN as null; a NaN above the target must not count as reaching it.
    write_run(tmp_path, "r", [(0, 0.25), (100, math.nan), (200, 0.75), (300, float("inf"))], STEPS)
    r, _ = result(tmp_path)
    assert r["samples_to_target"] == 100.0
    assert r["evaluations"] == 2


def test_unsorted_and_duplicated_rows(tmp_path):
    # Written out of order; step 2 (samples 200) logged twice: the later row (0.75) wins.
    write_run(tmp_path, "r", [(300, 0.875), (100, 0.25), (200, 0.0), (0, 0.125), (200, 0.75)],
              [(300, 40.0), (100, 10.0), (200, 99.0), (200, 30.0)])
    r, frames = result(tmp_path)
    assert r["samples_to_target"] == 150.0
    assert r["time_to_target"] == 20.0
    ev = frames.run_evals(str(tmp_path / "r"))
    assert ev["samples"].tolist() == [0.0, 100.0, 200.0, 300.0]
    assert ev[ACC].tolist() == [0.125, 0.25, 0.75, 0.875]
    assert sum("duplicated step" in w for w in frames.warnings) == 2


def test_truncated_last_line_is_ignored_with_warning(tmp_path):
    d = write_run(tmp_path, "r", [(0, 0.125), (100, 0.25), (200, 0.75)], STEPS)
    with open(d / "evals.jsonl", "a") as fh:
        fh.write('{"step": 3, "samples": 300, "train_s": 40.0, "eval/accur')
    r, frames = result(tmp_path)
    assert r["samples_to_target"] == 150.0
    assert any("truncated" in w for w in frames.warnings)


def test_run_without_config_has_no_batch_size(tmp_path):
    write_run(tmp_path, "bare", [(0, 0.25), (100, 0.75)], config=False)
    r, _ = result(tmp_path, "bare")
    assert (r["sequences_per_step"], r["lr"], r["seed"]) == (None, None, None)
    assert r["config"].startswith("unconfigured-bare-")
    assert r["samples_to_target"] == 50.0


def test_metric_absent_from_all_runs_is_a_data_error(tmp_path):
    write_run(tmp_path, "r", [(0, 0.25)], STEPS)
    frames = load_runs([tmp_path])
    with pytest.raises(DataError, match="absent from all runs"):
        per_run_records(frames, Target("eval/missing", 0.5))


def test_step_metric_is_used_when_no_eval_has_it(tmp_path):
    d = tmp_path / "r"
    with RunWriter(d) as w:
        for i, rew in enumerate([0.25, 0.75], start=1):
            w.log_step(step_row(i, 100 * i, 10.0 * i, **{"reward/mean": rew}))
    frames = load_runs([d])
    r = per_run_records(frames, Target("reward/mean", 0.5))[0]
    assert (r["samples_to_target"], r["time_to_target"]) == (150.0, 15.0)


def test_non_numeric_samples_is_a_data_error(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "evals.jsonl").write_text('{"step": 1, "samples": "many", "train_s": 1.0}\n')
    with pytest.raises(DataError, match="non-numeric"):
        load_runs([d])


def test_run_result_with_smoothing(tmp_path):
    write_run(tmp_path, "r", [(0, 0.0), (100, 1.0), (200, 0.0), (300, 1.0), (400, 1.0)], STEPS)
    frames = load_runs([tmp_path / "r"])
    rs = str(tmp_path / "r")
    raw = run_result(frames.run_steps(rs), frames.run_evals(rs), T05)
    assert raw["samples_to_target"] == 50.0
    sm = run_result(frames.run_steps(rs), frames.run_evals(rs), T05, smooth=2)
    # smoothed: [0, 0.5, 0.5, 0.5, 1.0] -> reaches 0.5 at samples 100
    assert sm["samples_to_target"] == 100.0
    assert np.isfinite(sm["throughput"])


def _frames(samples, values, train_s=None):
    evals = pd.DataFrame({"samples": samples, "eval/accuracy": values})
    s = [x for x in samples if x > 0]
    steps = pd.DataFrame({"samples": s, "train_s": train_s or [x / 10.0 for x in s]})
    return steps, evals


def test_relative_target_is_the_runs_step0_value_plus_gain():
    steps, evals = _frames([0, 100, 200, 300], [0.3, 0.35, 0.42, 0.5])
    res = run_result(steps, evals, Target("eval/accuracy", None, gain=0.1))
    assert res["threshold"] == pytest.approx(0.4)
    assert res["samples_to_target"] == pytest.approx(100 + 0.05 / 0.07 * 100)
    assert res["too_easy"] is False and res["evaluations_before_target"] == 2
    # q over the span to the target: N* / T, with T interpolated on the step log (10 samples/s)
    assert res["throughput_to_target"] == pytest.approx(10.0)
    assert parse_target("eval/accuracy=+0.1") == Target("eval/accuracy", None, gain=0.1)


def test_target_met_by_the_first_evaluation_after_step0_is_too_easy():
    steps, evals = _frames([0, 100, 200], [0.3, 0.45, 0.5])
    assert run_result(steps, evals, Target("eval/accuracy", None, gain=0.1))["too_easy"] is True
    # without a step-0 row the first evaluation is the first after training started
    steps, evals = _frames([100, 200], [0.6, 0.7])
    res = run_result(steps, evals, Target("eval/accuracy", 0.5))
    assert res["too_easy"] is True and res["first_evaluation_samples"] == 100
    steps, evals = _frames([0, 100, 200], [0.3, 0.45, 0.5])
    assert run_result(steps, evals, Target("eval/accuracy", 0.48))["too_easy"] is False


def test_relative_target_without_a_step0_value_is_censored():
    steps, evals = _frames([100, 200], [0.3, 0.9])
    res = run_result(steps, evals, Target("eval/accuracy", None, gain=0.1))
    assert res["censored"] and res["threshold"] is None and res["last_samples"] == 200


def test_run_without_a_finite_metric_is_counted_as_censored_not_dropped(tmp_path):
    """Leaving such a run out would favour the configurations whose runs survived."""
    from rlbatch.analysis.analyze import analyze

    write_run(tmp_path, "a", [(0, 0.2), (100, 0.4), (200, 0.6)], STEPS, seed=0)
    write_run(tmp_path, "b", [(0, 0.2), (100, 0.4), (200, 0.6)], STEPS, seed=1)
    write_run(tmp_path, "c", [(0, float("nan")), (100, float("nan"))], STEPS[:1], seed=2)
    doc = analyze([tmp_path], T05)
    (conf,) = doc["configs"]
    assert conf["seeds"] == 3 and conf["censored_runs"] == 1
    assert conf["samples_to_target_median"] == 150.0  # of 150, 150 and a censored run
    # the model's estimate: the censored run has no bound (no finite metric), so it carries
    # no information about N* beyond being counted
    assert conf["samples_to_target"] == pytest.approx(150.0, rel=1e-12)
    assert any("counted as a censored run" in w for w in doc["warnings"])
