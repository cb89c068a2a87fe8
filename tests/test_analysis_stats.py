"""Pooled intervals, censored medians, invariance verdicts, McCandlish fit, prediction."""

import math

import numpy as np
import pandas as pd
import pytest

from rlbatch.analysis import invariance, noise, selection, stats
from rlbatch.analysis.labels import confidence


def run(n=None, t=None, q=1.0, last=None, last_t=None):
    return {"samples_to_target": n, "time_to_target": t, "censored": n is None,
            "last_samples": last if last is not None else n, "last_train_s": last_t,
            "throughput": q, "throughput_to_target": q}


# ---------- stats ----------

def test_boot_indices_are_deterministic_per_key():
    a = stats.boot_indices(3, 5, seed=0, key="cfg-a")
    assert a.shape == (5, 3) and a.min() >= 0 and a.max() <= 2
    assert np.array_equal(a, stats.boot_indices(3, 5, seed=0, key="cfg-a"))
    assert not np.array_equal(stats.boot_indices(3, 50, 0, "cfg-a"),
                              stats.boot_indices(3, 50, 0, "cfg-b"))


def test_censored_median_rule():
    # 1 of 3 censored: the median is the middle finite value
    assert stats.median_summary([100, 200, None], [False, False, True], [100, 200, 300]) == \
        {"median": 200.0, "lower_bound": 200.0}
    # 2 of 3 censored: null, lower bound = median of (100, 250, 300)
    assert stats.median_summary([100, None, None], [False, True, True], [100, 300, 250]) == \
        {"median": None, "lower_bound": 250.0}
    # even n, exactly half censored: the median averages a censored run -> null
    assert stats.median_summary([100, None], [False, True], [100, 300]) == \
        {"median": None, "lower_bound": 200.0}


def test_interval_uses_actual_bootstrap_values():
    x = np.arange(1.0, 101.0)
    assert stats.raw_interval(x, x, 0.90) == (5.0, 95.0)
    hi = x.copy()
    hi[-10:] = np.inf
    assert stats.interval(x, hi, 0.90) == [5.0, None]  # upper end unbounded


def _fit(**configs):
    return stats.fit_sweep([{"config": c, "runs": runs} for c, runs in configs.items()])


def test_one_seed_each_gives_no_interval():
    runs = [run(100.0, 10.0, q=10.0)]
    s = stats.config_stats("c", runs, _fit(c=runs), 0.9)
    assert s["samples_to_target"] == pytest.approx(100.0)
    assert s["throughput"] == pytest.approx(10.0)
    assert s["samples_to_target_ci"] == s["time_to_target_ci"] == [None, None]  # df = 0


def test_pooled_interval_hand_computed():
    # a: N* 100 and 400 (geometric mean 200); b: 200 and 200. Pooled s^2 over df = 4 - 2:
    # ((log 2)^2 * 2 + 0) / 2, so s = log 2; se of a ratio = s; t(2 df, 0.95) = 2.919986
    a, b = [run(100.0, 10.0), run(400.0, 40.0)], [run(200.0, 20.0), run(200.0, 20.0)]
    fit = _fit(a=a, b=b)
    assert fit.nstar.df == 2 and fit.nstar.s == pytest.approx(math.log(2.0), rel=1e-12)
    s = stats.config_stats("a", a, fit, 0.9)
    assert s["samples_to_target"] == pytest.approx(200.0, rel=1e-12)
    half = 2.919986 * math.log(2.0) / math.sqrt(2.0)
    assert s["samples_to_target_ci"] == pytest.approx([200 * math.exp(-half),
                                                       200 * math.exp(half)], rel=1e-6)
    assert s["samples_to_target_median"] == 250.0  # the descriptive median
    cmp = stats.compare(fit, "a", "b", 0.9)
    assert cmp["samples_ratio_ci"] == pytest.approx([2 ** -2.919986, 2 ** 2.919986], rel=1e-6)
    assert cmp["p_faster"] == pytest.approx(0.5)  # equal geometric means of T


def test_compare_censored_candidate_far_beyond_is_departed_else_inconclusive():
    ref = [run(100.0, 10.0), run(100.0, 10.0), run(100.0, 10.0)]
    far = [run(None, last=200.0, last_t=5.0)] * 3
    lo, hi = stats.compare(_fit(r=ref, c=far), "c", "r", 0.9)["log_samples_ratio_raw"]
    assert (lo, hi) == (pytest.approx(math.log(2.0)), math.inf)  # s = 0: the bounds alone
    assert invariance.verdict(lo, hi) == "departed"
    short = [run(None, last=110.0, last_t=5.0)] * 3
    lo, hi = stats.compare(_fit(r=ref, c=short), "c", "r", 0.9)["log_samples_ratio_raw"]
    assert invariance.verdict(lo, hi) == "inconclusive"


def test_compare_ratios_and_probability():
    base = [run(100.0, 20.0, q=5.0)] * 2
    cand = [run(200.0, 10.0, q=20.0)] * 2
    fit = _fit(b=base, c=cand)
    cmp = stats.compare(fit, "c", "b", 0.9)
    assert cmp["log_samples_ratio_ci"] == pytest.approx([math.log(2.0), math.log(2.0)])
    assert cmp["samples_ratio_ci"] == pytest.approx([2.0, 2.0])
    assert cmp["throughput_ratio_ci"] == pytest.approx([4.0, 4.0])
    assert cmp["time_ratio_ci"] == pytest.approx([0.5, 0.5])  # T = N*/q: (200/20) / (100/5)
    assert cmp["p_faster"] == 1.0
    assert stats.compare(fit, "b", "c", 0.9)["p_faster"] == 0.0


def test_censored_runs_are_fitted_as_bounds():
    # half of a's runs stop short of the target: its estimate lies above the runs' values
    a = [run(100.0, 10.0), run(None, last=150.0, last_t=15.0), run(120.0, 12.0),
         run(None, last=160.0, last_t=16.0)]
    b = [run(100.0, 10.0), run(130.0, 13.0), run(110.0, 11.0), run(125.0, 12.5)]
    fit = _fit(a=a, b=b)
    est = stats.config_stats("a", a, fit, 0.9)
    assert est["samples_to_target"] > est["samples_to_target_lower_bound"]
    assert est["samples_to_target_lower_bound"] == pytest.approx(
        math.exp(np.mean(np.log([100, 150, 120, 160]))))
    assert est["samples_to_target_median"] is None and est["censored_runs"] == 2
    lo, hi = est["samples_to_target_ci"]
    assert lo < est["samples_to_target"] < hi


# ---------- invariance ----------

M = math.log(1.15)


@pytest.mark.parametrize("lo,hi,expected", [
    (-0.1, 0.1, "aligned"), (0.2, 0.3, "departed"), (M, 0.5, "departed"),
    (-0.5, -M, "fewer_samples"), (0.1, 0.2, "inconclusive"), (-0.2, 0.2, "inconclusive"),
    (-math.inf, math.inf, "inconclusive"), (0.2, math.inf, "departed"),
    (math.nan, 0.1, "inconclusive"),
])
def test_verdict_rule(lo, hi, expected):
    assert invariance.verdict(lo, hi, M) == expected


def test_verdict_margin_is_configurable():
    assert invariance.verdict(-0.1, 0.1, margin=0.05) == "inconclusive"
    assert invariance.verdict(0.06, 0.08, margin=0.05) == "departed"


def test_common_grid_is_union_inside_intersection():
    c1 = (np.array([0.0, 100, 200, 300]), np.zeros(4))
    c2 = (np.array([50.0, 150, 250]), np.zeros(3))
    assert invariance.common_grid([c1, c2]).tolist() == [50.0, 100.0, 150.0, 200.0, 250.0]
    c3 = (np.array([400.0, 500]), np.zeros(2))
    assert len(invariance.common_grid([c1, c3])) == 0


def test_normalized_area_hand_computed():
    # trapezoid mean |diff| = ((0+1)/2*1 + (1+1)/2*1) / 2 = 0.75; reference range 4
    area = invariance.normalized_area(np.array([0.0, 1, 2]), np.array([0.0, 1, 1]),
                                      np.array([0.0, 2, 4]))
    assert area == 0.1875
    assert invariance.normalized_area(np.array([0.0, 1]), np.ones(2), np.ones(2)) is None


def test_invariance_curves_one_seed_each():
    ref = [(np.array([0.0, 100, 200]), np.array([0.0, 0.5, 1.0]))]
    cand = [(np.array([0.0, 100, 200]), np.array([0.0, 0.25, 0.75]))]
    idx = np.zeros((10, 1), dtype=int)
    out = invariance.invariance_curves(ref, cand, idx, idx, 0.9)
    assert out["grid"] == [0.0, 100.0, 200.0]
    assert out["diff"] == [0.0, -0.25, -0.25]
    assert out["band"] == [[0.0, -0.25, -0.25], [0.0, -0.25, -0.25]]
    assert out["normalized_area"] == 0.1875  # (12.5 + 25) / 200 / 1.0
    assert out["max_abs_diff"] == 0.25


def test_invariance_curves_band_over_two_seeds():
    ref = [(np.array([0.0, 1]), np.array([0.0, 1.0]))] * 2
    cand = [(np.array([0.0, 1]), np.array([0.0, 1.0])), (np.array([0.0, 1]), np.array([0.0, 3.0]))]
    ref_idx = np.zeros((4, 2), dtype=int)
    cand_idx = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])  # means at x=1: 1, 2, 2, 3
    out = invariance.invariance_curves(ref, cand, ref_idx, cand_idx, 0.5)
    assert out["diff"] == [0.0, 1.0]
    # 50% band: 25th / 75th inverted-cdf percentiles of the diffs (0, 1, 1, 2) at x=1 are 0, 1
    assert out["band"] == [[0.0, 0.0], [0.0, 1.0]]


def test_critical_batch_departure():
    def e(b, v):
        return {"sequences_per_step": b, "verdict": v}

    out = invariance.critical_batch_departure(
        [e(64, "aligned"), e(128, "reference"), e(256, "aligned"), e(512, "inconclusive"),
         e(1024, "aligned")])
    assert out == {"critical_batch_departure": 256, "first_not_aligned_batch": 512,
                   "largest_tested_batch": 1024, "lower_bound_only": False}
    all_ok = invariance.critical_batch_departure([e(128, "reference"), e(256, "aligned")])
    assert all_ok["critical_batch_departure"] == 256 and all_ok["lower_bound_only"] is True
    small_bad = invariance.critical_batch_departure([e(32, "departed"), e(128, "reference")])
    assert small_bad["critical_batch_departure"] is None
    # two configurations at one B: both must be aligned
    two = invariance.critical_batch_departure(
        [e(128, "reference"), e(256, "aligned"), e(256, "departed")])
    assert two["critical_batch_departure"] == 128


# ---------- McCandlish fit, noise-scale summaries, prediction ----------

def test_mccandlish_fit_exact_hyperbola():
    b = np.array([25.0, 50, 100, 200, 400])
    e = 10000.0 * (1 + b / 100.0)  # E_min = 1e4, B_noise = 100, S_min = 100
    fit = noise.mccandlish_fit(b, e)
    assert fit["b_crit_mccandlish"] == pytest.approx(100.0, rel=1e-9)
    assert fit["s_min"] == pytest.approx(100.0, rel=1e-9)
    assert fit["e_min"] == pytest.approx(10000.0, rel=1e-9)
    assert fit["cbs_zhang_20pct_model"] == pytest.approx(20.0, rel=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_mccandlish_fit_recovers_b_crit_within_5_percent_under_noise(seed):
    # 10 batch sizes 16..8192, 3 seeds each with 3% log-normal noise on N*, median per B
    b = 2.0 ** np.arange(4, 14)
    s_min, b_noise = 1000.0, 512.0
    rng = np.random.default_rng(seed)
    e = s_min * b_noise * (1 + b / b_noise) * np.exp(0.03 * rng.standard_normal((3, len(b))))
    fit = noise.mccandlish_fit(b, np.median(e, axis=0))
    assert abs(fit["b_crit_mccandlish"] / b_noise - 1) < 0.05


def test_mccandlish_fit_refuses_bad_inputs():
    assert noise.mccandlish_fit([128, 128], [1e4, 2e4])["reason"].startswith("needs")
    # E falling with B (slope >= 0 in 1/S vs 1/E) is not the hyperbola
    assert "hyperbola" in noise.mccandlish_fit([64, 128, 256], [4e4, 2e4, 1e4])["reason"]


def test_second_half_median_and_config_summary():
    steps = pd.DataFrame({"samples": np.arange(100.0, 1001.0, 100.0),
                          "actor/noise_scale": np.arange(1.0, 11.0)})
    assert noise.second_half_median(steps, "actor/noise_scale") == 8.0  # median of 6..10
    assert noise.second_half_median(steps, "critic/noise_scale") is None
    steps2 = steps.assign(**{"actor/noise_scale": np.arange(1.0, 11.0) * 2})
    assert noise.config_noise_summary([steps, steps2]) == {"actor": 12.0, "critic": None}


def test_prediction():
    # N*_ref = 1000 at B_ref = 100, B_noise = 100: N*(300) = 1000 * 4 / 2
    assert noise.predicted_samples(300, 1000.0, 100, 100.0) == 2000.0
    assert noise.predict_time(300, 50.0, 1000.0, 100, 100.0) == \
        {"predicted_samples_to_target": 2000.0, "predicted_time_to_target": 40.0}
    assert noise.predict_time(None, 50.0, 1000.0, 100, 100.0)["predicted_time_to_target"] is None
    assert noise.choose_b_noise([None, 300.0, 100.0], {}) == (200.0, "b_simple_actor")
    assert noise.choose_b_noise([None], {"b_crit_mccandlish": 64.0}) == \
        (64.0, "b_crit_mccandlish_fit")


# ---------- selection ----------

def _entry(cfg, verdict, t, ci=None, seeds=3, scaling="sqrt", b=256, p=0.99):
    return {"config": cfg, "verdict": verdict, "time_to_target": t, "time_to_target_ci": [t, t],
            "sequences_per_step": b, "lr": 1.0, "seeds": seeds, "algorithm": "grpo",
            "lr_scaling": scaling,
            "vs_reference": None if ci is None else {"time_ratio": t / 10.0,
                                                     "time_ratio_ci": ci, "p_faster": p}}


REF = _entry("ref", "reference", 10.0, b=128)


def test_recommendation_needs_an_advantage_that_holds_across_seeds():
    a = _entry("a", "aligned", 6.0, [0.5, 0.8])
    b = _entry("b", "aligned", 5.0, [0.3, 1.1], b=512, p=0.9)  # faster, not shown
    rec = selection.recommend([REF, a, b], "ref")
    assert (rec["config"], rec["evidence"], rec["is_reference"]) == ("a", "established", False)
    assert rec["speedup_vs_reference"] == 10.0 / 6.0 and rec["p_faster_than_reference"] == 0.99
    assert [o["config"] for o in rec["open"]] == ["b"]
    # the decision is made: nothing to follow, though b is named as possibly faster still
    assert rec["next_seeds"] is None
    assert rec["next"] == ("nothing for this decision (B=256 is shown faster); more seeds of "
                           "B=512 and the reference could show one of them faster still")
    alone = selection.recommend([REF, a], "ref")
    assert alone["evidence"] == "established" and alone["next"] is None


def test_recommendation_keeps_the_reference_and_says_what_to_run():
    a = _entry("a", "aligned", 8.0, [0.7, 1.1], p=0.8)
    rec = selection.recommend([REF, a], "ref")
    assert rec["is_reference"] and rec["evidence"] == "not_enough"
    assert rec["p_faster_than_reference"] is None and "B=256" in rec["next"]
    slow = _entry("s", "aligned", 12.0, [1.1, 1.3], p=0.01)
    done = selection.recommend([REF, slow], "ref")
    assert done["evidence"] == "none_faster" and done["next"] is None
    assert [c["config"] for c in done["compared"]] == ["ref", "s"]


@pytest.mark.parametrize("other", [
    _entry("d", "departed", 2.0, [0.1, 0.3]),       # curve departs: never recommended
    _entry("w", "slower", 2.0, [0.1, 0.3]),         # stopped for cannot_win
    _entry("e", "too_easy", 2.0, [0.1, 0.3]),
    _entry("c", "aligned", 2.0, [0.1, 0.3], scaling="none"),  # the fixed-LR control
])
def test_only_aligned_members_of_the_reference_family_can_win(other):
    rec = selection.recommend([REF, other], "ref")
    # the fixed-LR control is outside the family: no candidate of it was compared
    assert rec["is_reference"] and rec["evidence"] == (
        "nothing_compared" if other["config"] == "c" else "none_faster")


def test_unconfirmed_candidate_is_open_not_recommended():
    u = _entry("u", "unconfirmed", 4.0, [None, None], seeds=1)
    rec = selection.recommend([REF, u], "ref")
    assert rec["is_reference"] and rec["evidence"] == "not_enough"
    assert [c["config"] for c in rec["compared"]] == ["ref"]  # one seed: not compared
    assert selection.recommend([_entry("ref", "reference", None)], "ref") is None
    # the only candidate failed (left out of the analysis): nothing was compared, and the
    # evidence line says so instead of "none is left open"
    alone = selection.recommend([REF], "ref")
    assert alone["evidence"] == "nothing_compared" and alone["candidates_analysed"] == 0
    from rlbatch.cli.decision_text import _headline
    line = _headline(alone, {**REF, "prompts_per_step": 16, "samples_per_prompt": 8},
                     "90%", None)[1]
    assert "nothing was compared" in line and "none is left open" not in line
    assert selection.recommend([REF, u], "ref")["candidates_analysed"] == 1
    assert selection.recommend([_entry("ref", "too_easy", 3.0)], "ref") is None


def _runs(*specs):
    return [{"censored": c, "too_easy": e, "stop_code": s} for c, e, s in specs]


def test_config_verdicts():
    ref = {"seeds": 3}
    ok = (False, False, None)
    stopped = (True, False, "cannot_win")
    lo, hi = -0.05, 0.05  # inside the margin
    assert selection.config_verdict({"seeds": 3, "runs": _runs(ok, ok, ok)}, ref, lo, hi, M) == \
        {"verdict": "aligned", "indication": "aligned"}
    assert selection.config_verdict({"seeds": 1, "runs": _runs(ok)}, ref, lo, hi, M) == \
        {"verdict": "unconfirmed", "indication": "aligned"}
    assert selection.config_verdict({"seeds": 3, "runs": _runs(ok, ok, ok)}, {"seeds": 1},
                                    lo, hi, M)["verdict"] == "unconfirmed"
    assert selection.config_verdict({"seeds": 2, "runs": _runs(ok, stopped)}, ref, 0.0,
                                    math.inf, M)["verdict"] == "slower"
    assert selection.config_verdict({"seeds": 3, "runs": _runs(ok, ok, stopped)}, ref, 0.0,
                                    math.inf, M)["verdict"] == "inconclusive"
    easy = (False, True, None)
    assert selection.config_verdict({"seeds": 3, "runs": _runs(ok, easy, ok)}, ref, lo, hi,
                                    M)["verdict"] == "too_easy"


def test_versus_baseline_rule():
    base = {"samples_to_target": 100.0, "time_to_target": 20.0, "throughput": 5.0, "seeds": 3}
    cand = {"samples_to_target": 150.0, "time_to_target": 15.0, "throughput": 10.0, "seeds": 3}
    cmp = {"samples_ratio_ci": [1.4, 1.6], "throughput_ratio_ci": [1.9, 2.1],
           "time_ratio_ci": [0.7, 0.8], "p_faster": 0.95}
    vs = selection.versus_baseline(cand, base, cmp)
    assert (vs["samples_ratio"], vs["throughput_ratio"], vs["time_ratio"]) == (1.5, 2.0, 0.75)
    assert vs["faster_by_rule"] is True  # q ratio 2.0 > N* ratio 1.5
    assert vs["time_ratio_ci"] == [0.7, 0.8] and vs["p_faster"] == 0.95
    one = selection.versus_baseline({**cand, "seeds": 1}, base, cmp)  # a point, not a spread
    assert one["time_ratio"] == 0.75 and one["p_faster"] is None
    assert one["time_ratio_ci"] == one["samples_ratio_ci"] == [None, None]


def test_seeds_for_power_is_the_smallest_that_resolves_the_effect():
    from scipy.stats import t as student_t

    from rlbatch.analysis import seedstats

    sd, effect = 0.3, math.log(1 / 1.5)  # a 1.5x faster candidate at CV ~0.3
    n = seedstats.seeds_for(sd, 0, effect)

    def resolves(k):
        df = 2 * k - 2
        return abs(effect) / (sd * math.sqrt(2 / k)) >= \
            student_t.ppf(0.95, df) + student_t.ppf(0.8, df)
    assert n is not None and resolves(n) and not resolves(n - 1)
    assert seedstats.seeds_for(sd, 0, math.log(0.999)) is None  # beyond 1,000 seeds
    # runs that did not vary at all (a deterministic trainer): the smallest plan, no crash
    assert seedstats.seeds_for(0.0, 2, math.log(1.3)) == 2
    se = sd * math.sqrt(2 / 4)  # 4 seeds per side, df 6: the smallest resolved log ratio
    assert seedstats.detectable_log_ratio(se, 6) == pytest.approx(
        se * (student_t.ppf(0.95, 6) + student_t.ppf(0.8, 6)))


def test_the_family_confidence_is_holm_adjusted_and_agrees_with_the_decision():
    """`p_faster` is 1 - the one-sided p-value of one comparison; allowing for the m
    candidates of the family it is 1 - the Holm-adjusted p-value (step-down, monotone), and
    a candidate is shown faster exactly when that is at least 1 - alpha. A candidate at
    0.97 on its own among 3 reads 0.91 allowing for them: not recommended, and the printed
    words say why rather than contradicting the decision."""
    a = _entry("a", "aligned", 6.0, [0.5, 0.8], p=0.97)
    b = _entry("b", "aligned", 7.0, [0.5, 0.9], p=0.96, b=512)
    u = _entry("u", "unconfirmed", 5.0, None, seeds=1)  # counted in m, not adjusted
    conf = selection.family_confidence([REF, a, b, u], REF)
    assert conf == pytest.approx({"a": 1 - 3 * 0.03, "b": 1 - 3 * 0.03})  # monotone: max
    assert selection.shown_faster([REF, a, b, u], REF) == []
    strong = _entry("s", "aligned", 6.0, [0.5, 0.8], p=0.99)
    conf = selection.family_confidence([REF, strong, b, u], REF)
    assert conf == pytest.approx({"s": 1 - 3 * 0.01, "b": 1 - 2 * 0.04})
    assert [e["config"] for e in selection.shown_faster([REF, strong, b, u], REF)] == ["s"]
    for c, e in (("s", strong), ("b", b)):  # shown faster exactly at >= 1 - alpha
        assert (conf[c] >= 0.95) == (e in selection.shown_faster([REF, strong, b, u], REF))
    vs = {**a["vs_reference"], "p_faster_family": 0.91, "family_size": 3}
    assert confidence(vs) == "confidence faster 0.97 (0.91 allowing for 3 candidates)"
    assert confidence({**vs, "family_size": 1}) == "confidence faster 0.97"
    assert confidence({}) == ""


def test_a_candidate_with_a_diverged_run_is_rejected_not_a_late_crossing():
    """A diverged run never reaches the target; counted as censored it read as a crossing a
    little after its last evaluation, and a candidate fast on its other seeds could be
    recommended. Any diverged run rejects the candidate (verdict `diverged`), with its reason
    in words; the same candidate without the diverged run is recommended."""
    def runs(statuses):
        return [{"run": f"r{i}", "status": st, "censored": st == "diverged",
                 "stop_code": None, "too_easy": False} for i, st in enumerate(statuses)]

    ref = {**REF, "runs": runs(["target_reached"] * 3)}
    fast = _entry("a", "aligned", 5.0, [0.4, 0.6], p=0.999)
    verdict = selection.config_verdict({**fast, "runs": runs(["target_reached"] * 2 + ["diverged"])},
                                       ref, -0.1, 0.1, 0.14)
    assert verdict == {"verdict": "diverged", "indication": "aligned"}
    bad = {**fast, **verdict, "runs": runs(["target_reached"] * 2 + ["diverged"])}
    rec = selection.recommend([ref, bad], "ref")
    assert rec["is_reference"] and rec["shown_faster"] == []
    assert rec["rejected"] == [{"config": "a", "sequences_per_step": 256, "verdict": "diverged",
                                "why": "diverged in 1 of its 3 seeds (non-finite training "
                                       "values): a run that diverges does not reach the "
                                       "target later, it does not reach it, so its time to "
                                       "target is not estimated as a late crossing"}]
    ok = selection.config_verdict({**fast, "runs": runs(["target_reached"] * 3)}, ref,
                                  -0.1, 0.1, 0.14)
    assert ok["verdict"] == "aligned"
    assert selection.recommend([ref, {**fast, **ok}], "ref")["config"] == "a"


def test_a_candidate_that_never_crossed_is_never_shown_faster():
    """Every run of the candidate stopped before the target: its ratio is bounded below
    only, no P(faster) is claimed, and it cannot be recommended, however fast its q."""
    ref = [run(1000.0, 10.0, q=100.0), run(1200.0, 12.0, q=100.0), run(1100.0, 11.0, q=100.0)]
    cand = [run(None, last=400.0, last_t=0.4, q=1000.0) for _ in range(3)]
    fit = _fit(r=ref, c=cand)
    cmp = stats.compare(fit, "c", "r", 0.9)
    assert cmp["p_faster"] is None and cmp["time_ratio_ci"][1] is None
    entries = []
    for name, runs in (("r", ref), ("c", cand)):
        e = {"config": name, "sequences_per_step": 128 if name == "r" else 256, "lr": 1.0,
             "seeds": 3, "algorithm": "grpo", "lr_scaling": "sqrt",
             **stats.config_stats(name, runs, fit, 0.9)}
        entries.append(e)
    entries[0].update(verdict="reference", vs_reference=None)
    entries[1].update(verdict="inconclusive", indication="inconclusive",
                      vs_reference={**cmp, "time_ratio": None})
    rec = selection.recommend(entries, "r")
    assert rec["is_reference"] and rec["shown_faster"] == []


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_the_picks_interval_allows_for_its_selection_among_m(m):
    """The recommended candidate's `time_ratio_ci` is its own 90% interval widened to level
    1 - 0.1/m (Benjamini-Yekutieli's FCR-adjusted interval for one selected of m), computed
    from the same log-t interval; its upper end is below 1 exactly when the one-sided
    p-value clears Holm's first step, 0.05/m. The unadjusted interval is kept beside it."""
    from scipy import stats as sps

    d, se, df = math.log(0.7), 0.12, 9
    t90 = sps.t.ppf(0.95, df)
    vs = {"time_ratio": 0.7, "time_ratio_ci": [math.exp(d - t90 * se), math.exp(d + t90 * se)],
          "p_faster": float(sps.t.cdf(-d / se, df)), "df": df, "time_ratio_se": se}
    cands = [dict(_entry(f"c{i}", "aligned", 7.0 + i), vs_reference=dict(vs)) for i in range(m)]
    rec = selection.recommend([REF, *cands], "ref")
    assert rec["config"] == "c0" and rec["candidates_analysed"] == m
    tq = sps.t.ppf(1 - 0.05 / m, df)
    assert rec["time_ratio_ci"] == pytest.approx([math.exp(d - tq * se), math.exp(d + tq * se)],
                                                 rel=1e-9)
    assert rec["time_ratio_ci_unadjusted"] == vs["time_ratio_ci"]
    assert rec["time_ratio_ci_level_each"] == pytest.approx(1 - 0.1 / m)
    # the edge: a p-value exactly at Holm's first step puts the upper end exactly at 1
    d_edge = -sps.t.ppf(1 - 0.05 / m, df) * se
    edge = {**vs, "time_ratio_ci": [math.exp(d_edge - t90 * se), math.exp(d_edge + t90 * se)]}
    assert selection.selected_interval(edge, m)[1] == pytest.approx(1.0, rel=1e-9)
    assert selection.selected_interval({**vs, "time_ratio_ci": [None, 0.9]}, m) == [None, 0.9]


# ---------- the spread a comparison rests on ----------

def _spread_groups():
    """The reference and two candidates at 4 seeds: `calm` with the reference's small
    spread, `wild` with a much larger one (its log T spans +-0.6)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from coverage import group

    def runs(ts):
        return [{"run": f"r{i}", "seed": i, "censored": False, "too_easy": False,
                 "stop_code": None, "samples_to_target": 4000.0, "time_to_target": t,
                 "last_samples": 4000.0, "last_train_s": t, "throughput_to_target": 4000.0 / t}
                for i, t in enumerate(ts)]

    return [group("ref", 128, runs([10.0, 10.5, 9.5, 10.2])),
            group("calm", 256, runs([8.0, 8.3, 7.8, 8.1])),
            group("wild", 512, runs([4.0, 14.0, 6.0, 12.0]))]


def test_a_comparison_rests_on_the_pooled_the_pairs_or_the_larger_spread():
    """`pooled`: every comparison on one spread over all three configurations (df 12 - 3 =
    9), which the wild candidate inflates, so the calm candidate, clearly faster (T 8 against
    10 at a 2-4% spread), is not shown faster. `pair` (the default): each comparison on the
    two compared alone (df 4 + 4 - 2 = 6): the calm one is shown faster, the wild one's
    interval is wider than the pooled one. `larger`: each on whichever has the larger
    standard error."""
    from rlbatch.analysis.analyze import judge

    def run(spread):
        entries, _, _ = judge(_spread_groups(), "ref", math.log(1.15), 0.9, spread)
        rec = selection.recommend(entries, "ref")
        return {e["config"]: e["vs_reference"] for e in entries if e["config"] != "ref"}, rec

    (pooled, rec_pooled), (pair, rec_pair), (larger, _) = map(run, ("pooled", "pair", "larger"))
    assert pooled["wild"]["df"] == pooled["calm"]["df"] == 9
    assert pair["wild"]["df"] == pair["calm"]["df"] == 6
    assert pair["wild"]["time_ratio_se"] > pooled["wild"]["time_ratio_se"]
    assert pair["calm"]["time_ratio_se"] < pooled["calm"]["time_ratio_se"] / 5
    for c in ("wild", "calm"):  # the same point estimate, another spread
        assert pair[c]["time_ratio"] == pytest.approx(pooled[c]["time_ratio"])
    assert larger["wild"] == pair["wild"] and larger["calm"] == pooled["calm"]
    assert rec_pooled["is_reference"] and rec_pooled["evidence"] == "not_enough"
    assert rec_pair["config"] == "calm" and rec_pair["evidence"] == "established"


def test_a_paired_comparison_is_a_t_interval_on_the_same_seed_log_ratios():
    """`spread: paired`: with at least 3 seeds run by both sides and all of them crossing,
    each ratio is the mean of the per-seed log ratios with a t interval on their spread
    (n - 1 df); fewer pairs, or a pair with a run that did not cross, fall back to the
    unpaired comparison of the two (None here)."""
    from scipy.stats import t as student_t

    from rlbatch.analysis.analyze import _paired

    def runs(ts, censored=()):
        return [{"seed": i, "samples_to_target": 1000.0, "throughput_to_target": 1000.0 / t,
                 "time_to_target": t, "censored": i in censored} for i, t in enumerate(ts)]

    a = {"config": "a", "runs": runs([8.0, 9.0, 7.0, 12.0])}
    b = {"config": "b", "runs": runs([10.0, 10.0, 9.0, 13.0, 11.0])}  # seed 4: no pair
    d = np.log([8 / 10, 9 / 10, 7 / 9, 12 / 13])
    se = d.std(ddof=1) / math.sqrt(4)
    tq = student_t.ppf(0.95, 3)
    got = _paired(a, b, 0.90)
    assert got["pairs"] == 4 and got["df"] == 3
    assert got["time_ratio_ci"] == pytest.approx([math.exp(d.mean() - tq * se),
                                                  math.exp(d.mean() + tq * se)], rel=1e-12)
    assert got["p_faster"] == pytest.approx(student_t.cdf(-d.mean() / se, 3), rel=1e-12)
    assert got["samples_ratio_ci"] == pytest.approx([1.0, 1.0])  # same N* on every seed
    assert _paired({**a, "runs": a["runs"][:2]}, b, 0.90) is None  # 2 pairs: too few
    assert _paired({**a, "runs": runs([8.0, 9.0, 7.0, 12.0], censored=(1,))}, b, 0.90) is None


def test_a_fixed_lr_control_without_a_time_ratio_says_it_was_not_compared():
    """The control line names the control without its LR rule (the line says it is fixed)
    and, where the control or its twin has no time to target, says it was not compared
    instead of printing dashes."""
    from rlbatch.cli.decision_text import _closing_lines

    labels = {"c": "B256 lr0.0001 none", "t": "B256 lr0.000141"}
    ctl = {"control": "c", "twin": "t", "samples_ratio": None, "samples_ratio_ci": [None, None],
           "time_ratio": None, "time_ratio_ci": [None, None], "scaled_lr_too_high": False,
           "eta0_may_be_under_tuned": False}
    (line,) = _closing_lines({"fixed_lr_controls": [ctl]}, {}, labels)
    assert line.startswith("fixed-LR control B256 lr0.0001 vs its sqrt twin B256 lr0.000141: "
                           "not compared") and " none" not in line
    ctl.update(samples_ratio=0.9, time_ratio=0.95)
    (line,) = _closing_lines({"fixed_lr_controls": [ctl]}, {}, labels)
    assert line == "fixed-LR control B256 lr0.0001 vs its sqrt twin: N* ratio 0.9, T ratio 0.95"
