"""The profile's rules without training: early stopping, the baseline's evidence (cadence,
too-easy targets), the challenger, and the driver's bookkeeping with a scripted executor."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.banks import step_row
from rlbatch.core.errors import UserError
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import RunWriter, read_jsonl
from rlbatch.profile import procedure
from rlbatch.profile.driver import Driver, Journal
from rlbatch.profile.procedure import (
    candidate_eval_every,
    challenger,
    early_stop_reason,
)
from rlbatch.profile.trials import plan_trials


def status(samples, train_s, reached=False):
    return {"samples": samples, "train_s": train_s, "target": {"reached": reached}}


def test_early_stop_codes():
    # baseline median T = 10 s, largest N* x exp(margin) = 1150 samples
    assert early_stop_reason(status(500, 5.0), 10.0, 1150.0) is None
    assert early_stop_reason(status(1150, 5.0), 10.0, 1150.0).startswith("no_crossing: ")
    assert early_stop_reason(status(800, 10.5), 10.0, 1150.0).startswith("cannot_win: ")
    assert early_stop_reason(status(800, 10.0), 10.0, 1150.0) is None  # not past it yet
    # a trial that crossed is never stopped, however long it took
    assert early_stop_reason(status(5000, 99.0, reached=True), 10.0, 1150.0) is None
    # nor is a baseline seed (a confirmation seed of the baseline may need more samples)
    assert early_stop_reason({**status(5000, 99.0), "kind": "baseline"}, 10.0, 1150.0) is None


def quick(*sets):
    """The quick preset with the target and cadence these scripted curves are written for
    (step 0 + 0.15, every 128 samples), whatever the preset's own."""
    return load_config(preset="quick", overrides=["target.gain=0.15",
                                                  "eval.every_samples=128", *sets])


def write_run(d: Path, cfg_dict: dict, evals: list[tuple[int, float]], q: float = 100.0):
    """A finished run log: evaluations (samples, accuracy), one step per evaluation."""
    with RunWriter(d) as w:
        w.write_config(cfg_dict)
        w.write_manifest({"run_id": d.name, "seed": cfg_dict["seed"]})
        for i, (s, _) in enumerate(evals[1:], 1):
            w.log_step(step_row(i, s, s / q))
        for i, (s, v) in enumerate(evals):
            w.log_eval({"step": i, "samples": s, "train_s": s / q, "eval/accuracy": v})
        w.write_summary({"status": "target_reached"})


def baseline_trials(tmp_path, curve, seeds=(0,), **sets):
    cfg = quick(*[f"{k}={v}" for k, v in sets.items()])
    trials = plan_trials(cfg, tmp_path / "runs", 64, list(seeds), kinds=("baseline",))
    for t in trials:
        write_run(t.run_dir(), t.config.resolved_dict(), curve)
    return cfg, trials


def test_baseline_evidence_needs_ten_evaluations_before_n_star(tmp_path):
    # every 512 samples, +0.15 reached at 1,536: 3 evaluations before N*
    curve = [(0, 0.3), (512, 0.35), (1024, 0.4), (1536, 0.46)]
    cfg, trials = baseline_trials(tmp_path, curve)
    ev = procedure.baseline_evidence(trials, cfg)
    with pytest.raises(UserError) as err:
        procedure.require_evaluations(ev, cfg)
    msg = str(err.value)
    assert msg.startswith("eval.every_samples:") and "only 3 evaluations" in msg
    # N* = 1024 + (0.45 - 0.40) / 0.06 * 512 = 1,451 samples: 10 evaluations before it at
    # every 1451 // 11 = 131 samples
    assert "eval.every_samples <= 131" in msg


def test_baseline_evidence_resolved_and_candidate_cadence(tmp_path):
    curve = [(i * 100, 0.3 + 0.01 * i) for i in range(31)]  # +0.15 at 1,500 samples
    cfg, trials = baseline_trials(tmp_path, curve, seeds=(0, 1), **{"eval.every_samples": 512})
    ev = procedure.baseline_evidence(trials, cfg)
    assert ev["problem"] is None and ev["evaluations_before_target"] == 15
    assert ev["median_nstar"] == pytest.approx(1500.0)
    assert ev["median_time"] == pytest.approx(15.0)  # q = 100 samples/s
    assert candidate_eval_every(cfg, ev["median_nstar"]) == 150  # N*/10 < configured 512
    assert candidate_eval_every(cfg, 1e6) == cfg.eval.every_samples


def test_baseline_too_easy_is_a_problem_not_a_decision(tmp_path):
    curve = [(0, 0.3), (512, 0.5), (1024, 0.6)]  # +0.15 met by the first evaluation
    cfg, trials = baseline_trials(tmp_path, curve)
    ev = procedure.baseline_evidence(trials, cfg)
    assert ev["problem"].startswith("target too easy: met by the first evaluation at 512")


def entry(config, verdict, t, b=256, scaling="sqrt", indication=None, t_lb=None):
    return {"config": config, "verdict": verdict, "time_to_target": t,
            "time_to_target_lower_bound": t_lb, "sequences_per_step": b, "algorithm": "grpo",
            "lr_scaling": scaling, "indication": indication}


def test_challenger_is_the_fastest_member_of_the_family_that_could_still_win():
    doc = {"reference": {"config": "ref"}, "configs": [
        entry("ref", "reference", 10.0, b=128),
        entry("miss", "unconfirmed", None, indication="departed", t_lb=2.0),  # missed it
        entry("slow", "slower", None, t_lb=11.0),
        entry("ctl", "unconfirmed", 2.0, scaling="none", indication="aligned"),
        entry("b", "unconfirmed", None, b=512, indication="inconclusive", t_lb=3.0),
        entry("a", "unconfirmed", 9.0, b=64, indication="departed"),  # crossed, fewer samples
    ]}
    assert challenger(doc) == "a"  # crossed: ranks before the censored "b"
    doc["configs"] = doc["configs"][:5]
    assert challenger(doc) == "b"  # censored: judged by its lower bound, 3 < 10
    doc["configs"] = doc["configs"][:4]
    assert challenger(doc) is None


class ScriptedExecutor:
    """Runs 'trials' by writing their logs one step per poll; honours STOP files."""

    def __init__(self, steps_by_name):
        self.steps_by_name = steps_by_name  # name -> list of (samples, train_s, accuracy)
        self.live: dict[str, tuple[Path, int]] = {}
        self.submitted: list[str] = []
        self.trials = {}

    def capacity(self):
        return 1 - len(self.live)

    def submit(self, name, config_path, log_path):
        self.submitted.append(name)
        t = self.trials[name]
        t.run_dir().mkdir(parents=True, exist_ok=True)
        self.live[name] = (t.run_dir(), 0)

    def running(self):
        return list(self.live)

    def poll(self):
        done = []
        for name, (d, i) in list(self.live.items()):
            rows = self.steps_by_name[name]
            s, t, acc = rows[i]
            with RunWriter(d) as w:
                if i == 0:
                    w.write_config(self.trials[name].config.resolved_dict())
                    w.write_manifest({"run_id": d.name, "seed": 0})
                w.log_step(step_row(i + 1, s, t))
                w.log_eval({"step": i + 1, "samples": s, "train_s": t, "eval/accuracy": acc})
                stop = (d / "STOP").exists()
                last = i + 1 == len(rows)
                w.write_summary({"status": "stopped" if stop else
                                 ("target_reached" if last else "running"),
                                 "target": {"reached": last and not stop},
                                 "stop_code": (d / "STOP").read_text().split(":")[0]
                                 if stop else None})
            self.live[name] = (d, i + 1)
            if stop or last:
                del self.live[name]
                done.append(procedure_finished(name))
        return done


def procedure_finished(name):
    from rlbatch.profile.executors import Finished

    return Finished(name, 0, Path("/dev/null"))


def test_driver_skips_finished_trials_and_writes_stop_requests(tmp_path):
    cfg = quick("profile.prompts_per_step=[32]", "profile.fixed_lr_control=false")
    runs = tmp_path / "runs"
    base = plan_trials(cfg, runs, 64, [0], kinds=("baseline",))
    cand = plan_trials(cfg, runs, 64, [0], kinds=("sqrt",))
    write_run(base[0].run_dir(), base[0].config.resolved_dict(), [(0, 0.3), (1000, 0.5)])
    ex = ScriptedExecutor({cand[0].name: [(i * 256, i * 1.0, 0.3) for i in range(50)]})
    ex.trials = {t.name: t for t in base + cand}
    for sub in ("trials", "logs"):
        (tmp_path / sub).mkdir()
    journal = Journal(tmp_path / "journal.jsonl")
    driver = Driver(cfg, tmp_path, ex, journal, None, poll_s=0.0)
    driver.run(base)  # already finished: no process
    assert ex.submitted == []
    driver.run(cand, lambda st: early_stop_reason(st, 5.0, math.inf))
    events = read_jsonl(tmp_path / "journal.jsonl")[0]
    kinds = [e["event"] for e in events]
    assert kinds == ["skipped_finished", "started", "stop_requested", "finished"]
    stop = next(e for e in events if e["event"] == "stop_requested")
    assert stop["reason"].startswith("cannot_win: ")
    assert (cand[0].run_dir() / "STOP").read_text().startswith("cannot_win")
    fin = events[-1]
    assert fin["status"] == "stopped"


def test_driver_records_a_trial_that_ended_without_finishing_its_run_and_goes_on(tmp_path):
    """A trial whose process ended but whose run is not finished is a failed trial: written
    down (journal `trial_failed`, `Driver.failed`) and left out, and the driver goes on
    (issue 29: a failed trial does not stop the profile; a re-run resumes it)."""
    cfg = quick("profile.prompts_per_step=[32]")
    base = plan_trials(cfg, tmp_path / "runs", 64, [0], kinds=("baseline",))

    class Vanishing(ScriptedExecutor):
        def poll(self):
            self.live.clear()
            return [procedure_finished(base[0].name)]

    for sub in ("trials", "logs"):
        (tmp_path / sub).mkdir()
    ex = Vanishing({})
    ex.trials = {base[0].name: base[0]}
    driver = Driver(cfg, tmp_path, ex, Journal(tmp_path / "j.jsonl"), None, poll_s=0.0)
    driver.run(base)
    assert list(driver.failed) == [base[0].name]
    assert "but its run is not finished (status pending)" in driver.failed[base[0].name]
    events = [e["event"] for e in read_jsonl(tmp_path / "j.jsonl")[0]]
    assert events[-1] == "trial_failed"


class ResumingExecutor(ScriptedExecutor):
    """The scripted executor for the probe strategy: finds each trial's run directory from
    the config file the driver wrote (candidates' configs carry the probe's eval cadence),
    and continues a run from its logged steps, as `rlbatch train --resume` does."""

    def submit(self, name, config_path, log_path):
        from rlbatch.core.runlog import make_run_id

        cfg = load_config(config_path)
        d = Path(cfg.output_dir) / make_run_id(cfg.resolved_dict(), cfg.seed)
        d.mkdir(parents=True, exist_ok=True)
        self.trials[name] = SimpleNamespace(config=cfg, run_dir=lambda: d)
        self.submitted.append(name)
        self.live[name] = (d, len(read_jsonl(d / "steps.jsonl")[0]) if
                           (d / "steps.jsonl").exists() else 0)


def test_probe_confirmation_stops_once_it_cannot_beat_the_baseline(tmp_path):
    """A candidate whose probe is aligned and 3x faster is confirmed: its probe is at the cap
    at once (probe_max_fraction = probe_fraction), and its point ratio is the lowest below
    1 (one probe and the baseline's copy leave a 1-df interval that settles nothing). Past
    its probe it stops learning. The confirmation stops (`cannot_win`) once it has trained
    longer than the baseline's time to target, instead of running out its budget, and the
    outcome is `not_confirmed` with its ratio bounded from below."""
    from rlbatch.profile.probing import run_probe_profile

    cfg = quick("profile.prompts_per_step=[32]", "profile.fixed_lr_control=false",
                "profile.concurrency=[]", "profile.probe_fraction=0.25",
                "profile.probe_max_fraction=0.25", "profile.probe_budget=null", f"output_dir={tmp_path / 'runs'}")
    acc = lambda s: 0.30 + s / 20000  # crosses step 0 + 0.15 at 3,000 samples
    base = [(s, s / 100, acc(s)) for s in range(0, 4097, 128)]  # T_base = 30 s
    probe = [(s, s / 100, acc(s) + (0.004 if (s // 128) % 2 else -0.004))
             for s in range(0, 4097, 128)]
    cand = [(s, s / 300, acc(s)) for s in range(0, 1025, 256)]  # aligned, q 3x
    cand += [(s, cand[-1][1] + (s - 1024) / 20, acc(1024)) for s in range(1280, 16385, 256)]
    ex = ResumingExecutor({"base-P16-s0": base, "base-P16-s1": probe, "sqrt-P32-s0": cand})
    doc = run_probe_profile(cfg, tmp_path, ex, poll_s=0.0)
    assert doc["rounds"][0]["plan"]["confirm"] == "sqrt-P32-s0"
    winner = next(t for t in doc["trials"] if t["trial"] == "sqrt-P32-s0")
    assert winner["stop_code"] == "cannot_win"
    # the step that passed T_base (41.8 s) asks for the stop, the next one honours it; the
    # script would have run on to 16,384 samples
    assert 30.0 < winner["train_s"] <= 30.0 + 2 * 256 / 20
    assert winner["samples"] == 2048
    last = doc["rounds"][-1]["plan"]
    assert last["outcome"] == "not_confirmed"
    assert last["measured_ratio_at_least"]["sqrt-P32-s0"] > 1.0
    assert doc["decision"]["is_reference"]


def test_probe_budget_stops_the_confirmation_and_the_control_is_not_probed(tmp_path):
    """The same aligned, 3x-faster probe, under profile.probe_budget = 1.5 (45 s with T_base
    30 s). The fixed-LR control is configured but not probed (profile.probe_control is off
    by default). After the baseline (30 s) and the probes, the confirmation may train only
    to what the budget leaves it; it is stopped there (stop code `profile_budget`), long
    before it would reach the baseline's time, the outcome is `over_budget` and the
    baseline is kept."""
    from rlbatch.profile.probing import run_probe_profile

    cfg = quick("profile.prompts_per_step=[32]", "profile.concurrency=[]",
                "profile.probe_fraction=0.25", "profile.probe_max_fraction=0.25",
                "profile.probe_budget=1.5",
                f"output_dir={tmp_path / 'runs'}")
    assert cfg.profile.fixed_lr_control and not cfg.profile.probe_control
    acc = lambda s: 0.30 + s / 20000
    base = [(s, s / 100, acc(s)) for s in range(0, 3073, 128)]  # ends at its crossing
    probe = [(s, s / 100, acc(s) + (0.004 if (s // 128) % 2 else -0.004))
             for s in range(0, 4097, 128)]
    # aligned and 3x faster through its probe, then it stops learning at the same speed
    cand = [(s, s / 300, acc(min(s, 1024))) for s in range(0, 16385, 256)]
    ex = ResumingExecutor({"base-P16-s0": base, "base-P16-s1": probe, "sqrt-P32-s0": cand})
    doc = run_probe_profile(cfg, tmp_path, ex, poll_s=0.0)
    assert [t["kind"] for t in doc["trials"]] == ["baseline", "baseline", "sqrt"]
    assert doc["rounds"][0]["plan"]["confirm"] == "sqrt-P32-s0"
    winner = next(t for t in doc["trials"] if t["trial"] == "sqrt-P32-s0")
    others = sum(t["train_s"] for t in doc["trials"] if t is not winner)
    allowance = 45.0 - others
    assert winner["stop_code"] == "profile_budget"
    # asked once two more steps (256 / 300 s each) would pass the allowance, so the step
    # under way ends within it
    assert allowance - 3 * 256 / 300 < winner["train_s"] <= allowance
    assert winner["train_s"] < 30.0  # short of the baseline's time: nothing was measured
    last = doc["rounds"][-1]["plan"]
    assert last["outcome"] == "over_budget" and last["measured_ratio"] == {}
    assert last["stopped_by_budget"]["sqrt-P32-s0"]["samples"] == winner["samples"]
    assert doc["decision"]["is_reference"] and "probe_budget" in doc["decision"]["evidence"]
    assert doc["cost"]["total_s"] <= 45.0
    d = doc["decision"]
    assert d["unconfirmed"] == "sqrt-P32-s0" and d["predicted_time_ratio"] < 1.0
    # the suggested budget leaves room to settle it: re-run with it, the stopped
    # confirmation is read as a longer probe and continued (the same run, not a new one);
    # past its probe it learns nothing, so it is dropped or measured slower
    budget = float(d["next"].split("at least ")[1].split()[0])
    cfg2 = quick("profile.prompts_per_step=[32]", "profile.concurrency=[]",
                 "profile.probe_fraction=0.25", "profile.probe_max_fraction=0.25",
                 f"profile.probe_budget={budget}",
                 f"output_dir={tmp_path / 'runs'}")
    doc2 = run_probe_profile(cfg2, tmp_path, ex, poll_s=0.0)
    again = next(t for t in doc2["trials"] if t["trial"] == "sqrt-P32-s0")
    assert again["run_dir"] == winner["run_dir"] and again["samples"] > winner["samples"]
    assert doc2["rounds"][-1]["plan"]["outcome"] in ("not_confirmed", "keep_baseline")
    assert doc2["decision"]["is_reference"] and "next" not in doc2["decision"]
    assert doc2["cost"]["total_s"] <= budget * 30.0


def test_profile_decides_when_every_candidate_cannot_win_and_resumes_to_the_same(tmp_path):
    """The case that crashed: an earlier attempt with another evaluation cadence left a fast
    run in the same folder, every candidate of this attempt is stopped `cannot_win`, and
    the fixed-LR control reaches the target. The decision is taken from this attempt's own
    trials (the baseline is kept), and a re-run in the same folder gives the same decision
    without starting a trial."""
    out = tmp_path
    cfg = quick("profile.prompts_per_step=[32]", "profile.concurrency=[]",
                f"output_dir={out / 'runs'}")
    stale = quick("profile.prompts_per_step=[32]", "eval.every_samples=256",
                  f"output_dir={out / 'runs'}")
    old = plan_trials(stale, out / "runs", 64, [0], kinds=("sqrt",))[0]
    write_run(old.run_dir(), old.config.resolved_dict(),
              [(0, 0.30), (256, 0.40), (512, 0.60)], q=1000.0)  # crossed at once, long ago
    acc = lambda s: 0.30 + s / 20000  # crosses step 0 + 0.15 at 3,000 samples
    base = [(s, s / 100, acc(s)) for s in range(0, 4097, 128)]  # T_base = 30 s
    never = [(s, s / 50, 0.30) for s in range(0, 16385, 256)]  # no learning, half the q
    ex = ResumingExecutor({"base-P16-s0": base, "base-P16-s1": base, "sqrt-P32-s0": never,
                           "fixed-lr-P32-s0": [(s, s / 200, acc(s)) for s in
                                               range(0, 3073, 256)]})  # ends at its crossing
    doc = procedure.run_profile(cfg, out, ex, poll_s=0.0)
    trials = {t["trial"]: t for t in doc["trials"]}
    assert trials["sqrt-P32-s0"]["stop_code"] == "cannot_win"
    assert trials["fixed-lr-P32-s0"]["status"] == "target_reached"
    assert doc["problem"] is None and doc["decision"]["is_reference"]
    assert doc["decision"]["evidence"] == "none_faster"
    ran = {r["run"] for c in doc["analysis"]["configs"] for r in c["runs"]}
    assert str(old.run_dir()) not in ran  # the earlier attempt's run is not in the decision
    submitted = list(ex.submitted)
    again = procedure.run_profile(cfg, out, ex, poll_s=0.0)
    assert ex.submitted == submitted  # nothing started again
    assert again["decision"]["config"] == doc["decision"]["config"]
    assert again["decision"]["evidence"] == doc["decision"]["evidence"]


def test_profile_evaluates_the_baseline_again_densely_instead_of_refusing(tmp_path):
    """Evaluated every 1,024 samples, the baseline crosses at 3,000 with 3 evaluations before
    it (step 0 counted). Instead of asking for a cadence, the profile runs the same baseline seeds
    again at one that resolves them (3,000 // 11 = 272, down to a whole step of 128: 256),
    decides from those, counts both in its cost, and resumes to the same decision."""
    cfg = quick("profile.prompts_per_step=[32]", "profile.concurrency=[]",
                "profile.fixed_lr_control=false", "eval.every_samples=1024",
                f"output_dir={tmp_path / 'runs'}")
    acc = lambda s: 0.30 + s / 20000  # crosses step 0 + 0.15 at 3,000 samples
    sparse = [(s, s / 100, acc(s)) for s in range(0, 4097, 1024)]
    dense = [(s, s / 100, acc(s)) for s in range(0, 3073, 256)]
    slow = [(s, s / 50, acc(s)) for s in range(0, 8193, 256)]  # half the q: cannot win
    ex = ResumingExecutor({"base-P16-s0": sparse, "base-P16-s1": sparse,
                           "base-P16-s0-e256": dense, "base-P16-s1-e256": dense,
                           "sqrt-P32-s0": slow})
    doc = procedure.run_profile(cfg, tmp_path, ex, poll_s=0.0)
    events = read_jsonl(tmp_path / "journal.jsonl")[0]
    again = next(e for e in events if e["event"] == "baseline_reevaluated")
    assert again["eval_every"] == 256 and again["evaluations_before_target"] == 3
    assert doc["problem"] is None and doc["decision"]["is_reference"]
    ref = next(c for c in doc["analysis"]["configs"] if c["verdict"] == "reference")
    assert ref["seeds"] == 2 and all(r["evaluations_before_target"] >= 10 for r in ref["runs"])
    assert ref["samples_to_target"] == pytest.approx(3000.0)
    ran = {r["run"] for c in doc["analysis"]["configs"] for r in c["runs"]}
    first = {t["run_dir"] for t in doc["trials"] if t["trial"] in ("base-P16-s0", "base-P16-s1")}
    assert len(first) == 2 and not first & ran  # superseded, not analysed
    # both baselines are paid for: the profile's cost sums the trials it lists
    assert {"base-P16-s0", "base-P16-s1", "base-P16-s0-e256", "base-P16-s1-e256"} <= \
        {t["trial"] for t in doc["trials"]}
    submitted = list(ex.submitted)
    doc2 = procedure.run_profile(cfg, tmp_path, ex, poll_s=0.0)
    assert ex.submitted == submitted and doc2["decision"]["config"] == doc["decision"]["config"]


def test_profile_refuses_when_even_every_step_is_too_few():
    cfg = quick("eval.every_samples=1024")
    ev = {"dense_every": 60, "evaluations_before_target": 1, "median_nstar": 700.0}
    with pytest.raises(UserError, match=r"^target.gain: the baseline reached the target"):
        procedure.denser_baseline(cfg, Path("."), 64, [0], ev, None, None)


def test_profile_confirms_a_faster_larger_batch_and_decides_on_two_seeds(tmp_path):
    """The whole default procedure on scripted runs whose answer is known: B = 512 needs the
    baseline's samples (each seed its own N*) at 3.5x its throughput. The baseline runs two
    seeds, the candidate is screened on one and confirmed on a second, and the decision is
    the candidate, shown faster on two seeds each. The fast form of test_profile's
    constructed winner (slow), which trains the tiny model to the same end."""
    out = tmp_path
    cfg = quick("profile.prompts_per_step=[64]", "profile.concurrency=[]",
                "profile.fixed_lr_control=false", f"output_dir={out / 'runs'}")

    def curve(cross: float, q: float, every: int) -> list[tuple[int, float, float]]:
        # accuracy 0.30 at step 0, rising linearly to step 0 + 0.15 at `cross` samples
        return [(s, s / q, 0.30 + 0.15 * s / cross) for s in range(0, 8193, every)]

    ex = ResumingExecutor({"base-P16-s0": curve(3000, 100.0, 128),
                           "base-P16-s1": curve(3400, 100.0, 128),
                           "sqrt-P64-s0": curve(3100, 350.0, 512),
                           "sqrt-P64-s1": curve(3300, 350.0, 512)})
    doc = procedure.run_profile(cfg, out, ex, poll_s=0.0)
    assert ex.submitted == ["base-P16-s0", "base-P16-s1", "sqrt-P64-s0", "sqrt-P64-s1"]
    assert doc["problem"] is None
    d = doc["decision"]
    assert (d["sequences_per_step"], d["evidence"], d["is_reference"]) == (512, "established",
                                                                           False)
    assert [c["seeds"] for c in d["compared"]] == [2, 2]
    assert d["time_ratio_ci"][1] < 1.0
    cand = next(c for c in doc["analysis"]["configs"] if c["sequences_per_step"] == 512)
    assert cand["vs_reference"]["throughput_ratio"] == pytest.approx(3.5, rel=0.01)


def test_futility_limits_stop_a_run_of_a_configuration_at_the_smallest_effect_at_the_stated_rate():
    """The `futility` rule: a run of a configuration truly faster by `smallest_effect` (10%)
    is stopped `cannot_win` in at most `futility_alpha` (5%) of draws, and a run of one
    needing exp(margin) x the baseline's N* is stopped `no_crossing` as rarely; here drawn
    with the baseline's two seeds and the candidate's run at the assumed spread (0.35)."""
    import random
    import statistics

    prof = quick("profile.early_stop_rule=futility").profile
    ev = {"log_times": [math.log(10.0)] * 2, "log_nstars": [math.log(3000.0)] * 2}
    t_lim, n_lim, _ = procedure.stop_limits(ev, prof)
    widen = 1.6449 * 0.35 * math.sqrt(1.5)
    assert t_lim == pytest.approx(10.0 / 1.1 * math.exp(widen), rel=1e-3)
    assert n_lim == pytest.approx(3000.0 * 1.15 * math.exp(widen), rel=1e-3)
    rng = random.Random(1)
    stops_t = stops_n = 0
    draws = 20000
    for _ in range(draws):
        lt = [rng.gauss(0.0, 0.35) for _ in range(2)]
        t, n, _ = procedure.stop_limits({"log_times": lt, "log_nstars": lt}, prof)
        run = rng.gauss(-math.log(1.1), 0.35)
        stops_t += math.exp(run) > t
        stops_n += math.exp(rng.gauss(prof.margin, 0.35)) > n
    # at most 5% (the baseline's sample sd, when above 0.35, only widens the limit); a rule
    # without the baseline's own uncertainty (sqrt(1 + 1/n)) would stop about 9%
    for rate in (stops_t / draws, stops_n / draws):
        assert 0.035 < rate < 0.053
    med = procedure.stop_limits({**ev, "median_time": 10.0, "max_nstar": 3000.0},
                                quick().profile)
    assert med[:2] == (10.0, pytest.approx(3000.0 * 1.15)) and med[2] is None
    assert statistics.NormalDist().inv_cdf(0.95) == pytest.approx(1.6449, abs=1e-4)
