"""Sequential spending (profile/spending.py) on constructed predictions: drops, extensions,
confirmation of the predicted winner, and that the loop always stops."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbatch.profile.spending import Candidate, Plan, fit_budget, plan_next

CAP = 8192


def pred(t, lo, hi, verdict="aligned", problem=None, q=None):
    """A prediction with time ratio t (T_cand / T_base) in [lo, hi] (and throughput q)."""
    return {"time_ratio": t, "time_ratio_ci": [lo, hi], "verdict": verdict, "problem": problem,
            "throughput": q}


def test_slower_and_departed_candidates_are_dropped_and_the_baseline_kept():
    plan = plan_next([
        Candidate("B128", 2048, pred(1.5, 1.2, 1.8)),  # slower even at its best
        Candidate("B256", 2048, pred(0.6, 0.5, 0.7, verdict="departed")),  # fast but not aligned
    ], cap=CAP)
    assert set(plan.drop) == {"B128", "B256"}
    assert "cannot win" in plan.drop["B128"] and "departed" in plan.drop["B256"]
    assert plan.outcome == "keep_baseline" and not plan.extend and plan.confirm is None


def test_undecided_candidates_are_extended_up_to_the_cap_then_left_open():
    cands = [Candidate("B128", 2048, pred(0.95, 0.7, 1.3, verdict="inconclusive")),
             Candidate("B256", 1024, None),  # no prediction yet
             Candidate("B512", 6000, pred(0.98, 0.85, 1.15))]  # aligned, overlaps the baseline
    plan = plan_next(cands, cap=CAP)
    assert plan.extend == {"B128": 4096, "B256": 2048, "B512": CAP}
    assert plan.outcome is None and plan.confirm is None
    at_cap = [Candidate(c.config, CAP, c.prediction) for c in cands]
    plan = plan_next(at_cap, cap=CAP)
    # nothing settled below 1: the lowest point ratio below 1 among the open ones is measured
    assert not plan.extend and plan.confirm == "B128" and set(plan.open) == {"B256", "B512"}
    slower = [Candidate("B128", CAP, pred(1.02, 0.8, 1.3, verdict="inconclusive")),
              Candidate("B512", CAP, pred(1.05, 0.9, 1.2))]
    plan = plan_next(slower, cap=CAP)
    assert plan.outcome == "keep_baseline" and plan.confirm is None
    assert set(plan.open) == {"B128", "B512"}


def test_the_predicted_winner_is_confirmed_then_indicated_or_not_confirmed():
    cands = [Candidate("B128", 2048, pred(0.8, 0.7, 0.88)),
             Candidate("B256", 2048, pred(0.7, 0.6, 0.85)),  # lowest predicted T
             Candidate("B512", 2048, pred(1.4, 1.25, 1.6))]
    plan = plan_next(cands, cap=CAP)
    assert plan.confirm == "B256" and plan.outcome is None
    assert plan.drop == {"B512": plan.drop["B512"]}
    done = [Candidate("B256", 30000, cands[1].prediction, measured_ratio=0.72)]
    plan = plan_next(done, cap=CAP)
    assert plan.outcome is not None and plan.outcome == "indicated" and plan.winner == "B256"
    slow = [Candidate("B256", 30000, cands[1].prediction, measured_ratio=1.05)]
    plan = plan_next(slow, cap=CAP)
    assert plan.outcome == "not_confirmed" and plan.winner is None


def test_only_candidates_that_could_be_confirmed_are_extended():
    """Rule 3, `promising` (the default): an undecided candidate predicted at or above the
    baseline is left open without a longer probe, since at the cap it would not be confirmed
    either; `undecided` extends it. Both end in the same outcome on these predictions."""
    cands = [Candidate("B128", 2048, pred(1.1, 0.8, 1.4, verdict="inconclusive")),
             Candidate("B256", 2048, pred(0.9, 0.7, 1.2, verdict="inconclusive")),
             Candidate("B512", 2048, pred(1.0, 0.9, 1.1))]  # exactly at 1: not promising
    plan = plan_next(cands, cap=CAP)
    assert plan.extend == {"B256": 4096} and set(plan.open) == {"B128", "B512"}
    assert plan_next(cands, cap=CAP, extend="undecided").extend == {
        "B128": 4096, "B256": 4096, "B512": 4096}
    # once the promising one's probe is at the cap and still below 1, it is confirmed
    plan = plan_next([cands[0], Candidate("B256", CAP, cands[1].prediction), cands[2]], cap=CAP)
    assert plan.confirm == "B256" and not plan.extend
    # with none below 1, nothing is extended and the baseline is kept at once
    plan = plan_next([cands[0], cands[2]], cap=CAP)
    assert plan.outcome == "keep_baseline" and not plan.extend and plan.confirm is None
    with pytest.raises(ValueError, match="extend"):
        plan_next(cands, cap=CAP, extend="all")


def test_a_prediction_with_a_problem_is_extended_not_trusted():
    plan = plan_next([Candidate("B128", 512, pred(
        0.5, 0.4, 0.6, problem="the probe has 1 evaluation(s)"))], cap=CAP)
    assert plan.extend == {"B128": 1024} and plan.confirm is None


def test_the_budget_reserves_the_best_confirmation_then_grants_extensions_by_promise():
    """T_base 100 s. The best candidate (ratio 0.5, 10 s run) needs 40 s more to confirm; the
    rest of what is left goes to extensions, most promising first; what does not fit is
    refused with its projected cost."""
    cands = [Candidate("best", 1000, pred(0.5, 0.3, 1.1, "inconclusive", q=100.0), train_s=10),
             Candidate("next", 1000, pred(0.8, 0.5, 1.2, "inconclusive", q=100.0), train_s=10),
             Candidate("last", 1000, pred(0.9, 0.5, 1.3, "inconclusive", q=50.0), train_s=20)]
    plan = Plan(extend={"best": 2000, "next": 2000, "last": 2000})
    # left 60: reserve 40 (0.5 x 100 - 10); best's own extension (10 s) comes out of its
    # reserve; next costs 10 s and fits the 20 s of room; last costs 20 s and does not
    granted, refused = fit_budget(plan, cands, left_s=60.0, base_time=100.0)
    assert granted == {"best": 2000, "next": 2000}
    assert refused == {"last": pytest.approx(20.0)}
    # with room for everything, everything is granted
    granted, refused = fit_budget(plan, cands, left_s=1000.0, base_time=100.0)
    assert set(granted) == {"best", "next", "last"} and not refused
    # with nothing beyond the reserve, only the best's own extension fits
    granted, refused = fit_budget(plan, cands, left_s=40.0, base_time=100.0)
    assert granted == {"best": 2000} and set(refused) == {"next", "last"}
    # less than the reserve: not even the best's own extension; refusals show full costs
    granted, refused = fit_budget(plan, cands, left_s=30.0, base_time=100.0)
    assert granted == {} and refused == {"best": pytest.approx(10.0),
                                         "next": pytest.approx(10.0),
                                         "last": pytest.approx(20.0)}
    # a dropped candidate (departed) reserves nothing, however low its ratio
    gone = Candidate("gone", 1000, pred(0.2, 0.1, 0.3, "departed", q=100.0), train_s=5)
    slow = Candidate("slow", 1000, pred(1.05, 0.6, 1.5, "inconclusive", q=100.0), train_s=10)
    dropped = Plan(extend={"slow": 2000}, drop={"gone": "departed"})
    assert fit_budget(dropped, [gone, slow], left_s=10.0, base_time=100.0)[0] == \
        {"slow": 2000}
    # the reserve does not cover an extension longer than the confirmation's remainder
    long = Plan(extend={"best": 6000})  # 50 s to go at q = 100, 40 s reserved
    assert fit_budget(long, cands, left_s=45.0, base_time=100.0)[0] == {}
    assert fit_budget(long, cands, left_s=50.0, base_time=100.0)[0] == {"best": 6000}


def test_without_a_promising_candidate_nothing_is_reserved_and_a_blind_probe_is_granted():
    cands = [Candidate("slow", 1000, pred(1.1, 0.7, 1.5, "inconclusive", q=100.0)),
             Candidate("blind", 200, None)]  # no prediction, no throughput: cost unknown
    plan = Plan(extend={"slow": 2000, "blind": 400})
    granted, refused = fit_budget(plan, cands, left_s=10.0, base_time=100.0)
    assert granted == {"slow": 2000, "blind": 400} and not refused
    granted, refused = fit_budget(plan, cands, left_s=5.0, base_time=100.0)
    assert granted == {"blind": 400} and refused == {"slow": pytest.approx(10.0)}
    assert fit_budget(plan, cands, left_s=0.0, base_time=100.0) == ({}, {"blind": None,
                                                                        "slow": 10.0})


def test_a_confirmation_stopped_by_the_budget_keeps_the_baseline():
    plan = plan_next([Candidate("B256", 5000, pred(0.7, 0.6, 0.85), over_budget=True)],
                     cap=CAP)
    assert plan.outcome is not None and plan.outcome == "over_budget" and plan.winner is None


intervals = st.tuples(st.floats(0.1, 3.0), st.floats(0.0, 0.5), st.floats(0.0, 0.5),
                      st.sampled_from(["aligned", "departed", "inconclusive"]))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(intervals, min_size=1, max_size=6), st.integers(256, 4096),
       st.sampled_from(["promising", "undecided"]))
def test_spending_always_stops(specs, start, rule):
    """Whatever the predictions say, applying the plan (probes grow, predictions unchanged)
    ends in a confirmation or a final outcome within log2(CAP / start) + 2 rounds."""
    cands = [Candidate(f"c{i}", start, pred(t, t * (1 - a), t * (1 + b), v))
             for i, (t, a, b, v) in enumerate(specs)]
    bound = math.ceil(math.log2(CAP / start)) + 2
    for _ in range(bound):
        plan = plan_next(cands, cap=CAP, extend=rule)
        if plan.outcome is not None or plan.confirm:
            break
        assert plan.extend, "neither extending, confirming nor finished"
        cands = [Candidate(c.config, plan.extend.get(c.config, c.samples), c.prediction)
                 for c in cands if c.config not in plan.drop]
    else:
        raise AssertionError("did not stop")
    if plan.confirm:
        chosen = next(c for c in cands if c.config == plan.confirm)
        assert chosen.prediction["verdict"] != "departed"
        assert chosen.prediction["time_ratio"] < 1.0
