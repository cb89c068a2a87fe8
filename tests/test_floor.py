"""The information floor (profile/floor.py): the least expected cost at which any procedure
meets a decision's error rates, checked against its closed forms, against the cost of the
best fixed-sample test (which it must not exceed), and in `rlbatch replay`'s output."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from rlbatch.profile.floor import information_floor, kl_bernoulli

MARGIN = math.log(1.05)


def test_kl_of_two_coins():
    assert kl_bernoulli(0.9, 0.1) == pytest.approx(0.8 * math.log(9))
    assert kl_bernoulli(0.9, 0.05) == pytest.approx(0.9 * math.log(18) + 0.1 * math.log(0.1 / 0.95))
    assert kl_bernoulli(0.5, 0.5) == 0.0


@pytest.mark.parametrize("ratio", [0.5, 0.66, 0.8])
@pytest.mark.parametrize("sd", [0.15, 0.3])
def test_a_faster_candidate_costs_what_ruling_out_a_false_recommendation_costs(ratio, sd):
    """Baseline and one candidate at T ratio r, each run costing its own T (1 and r): the
    binding alternative makes the candidate exactly as fast as the baseline (a false
    recommendation, allowed 5%), whose distance is minimised over the two runs' counts at
    N_k proportional to 1/sqrt(c_k): floor = (1 + sqrt r)^2 2 sd^2 kl(0.9, 0.05) / log(r)^2."""
    f = information_floor([0.0, math.log(ratio)], [1.0, ratio], [True, True], sd)
    want = (1 + math.sqrt(ratio)) ** 2 * 2 * sd * sd * kl_bernoulli(0.9, 0.05) / math.log(ratio) ** 2
    assert f.cost == pytest.approx(want, rel=1e-4)
    # the allocation: the cost is flat near its minimum, so the cuts fix it less finely
    assert f.runs[0] / f.runs[1] == pytest.approx(math.sqrt(ratio), rel=0.01)
    assert f.right == [1] and {b["error_rate"] for b in f.binding} == {0.05}


def test_a_slower_candidate_costs_what_ruling_out_a_missed_saving_costs():
    """The candidate 1.2x slower: keeping the baseline is right, and the binding alternative
    makes the candidate 5% faster than the baseline (keeping it then a pick not within 5%,
    allowed 10%): distance log 1.2 + log 1.05, kl(0.9, 0.1)."""
    sd, r = 0.25, 1.2
    f = information_floor([0.0, math.log(r)], [1.0, r], [True, True], sd)
    want = (1 + math.sqrt(r)) ** 2 * 2 * sd * sd * kl_bernoulli(0.9, 0.1) / (math.log(r) + MARGIN) ** 2
    assert f.cost == pytest.approx(want, rel=1e-4)
    assert f.right == [0]


@pytest.mark.parametrize("ratio", [0.5, 0.7, 0.85])
def test_no_fixed_sample_test_that_meets_the_error_rates_costs_less(ratio):
    """The one-sided z test on n runs a side with a known spread that recommends with
    probability 0.05 when the candidate is as fast as the baseline and 0.9 at the true
    ratio needs n = 2 sd^2 (z_0.95 + z_0.9)^2 / log(r)^2 a side: a procedure that meets the
    error rates, so it cannot cost less than the floor."""
    sd = 0.25
    f = information_floor([0.0, math.log(ratio)], [1.0, ratio], [True, True], sd)
    n = 2 * sd * sd * (norm.ppf(0.95) + norm.ppf(0.9)) ** 2 / math.log(ratio) ** 2
    assert f.cost <= n * (1 + ratio)
    assert f.cost >= 0.5 * n * (1 + ratio)  # and sequential tests save less than half


def test_the_floor_grows_with_the_square_of_the_spread():
    args = ([0.0, math.log(0.66), math.log(0.76)], [1.0, 0.66, 0.76], [True, True, True])
    a = information_floor(*args, sd=0.2)
    b = information_floor(*args, sd=0.4)
    assert b.cost == pytest.approx(4 * a.cost, rel=1e-5)


def test_only_configurations_a_decision_may_pick_count():
    """A departed configuration (or one outside the reference's family) that is faster is no
    right answer and no rival: the floor is that of the others alone; and where every
    configuration a decision may pick is within 5% of the best, any answer is right: 0."""
    two = information_floor([0.0, math.log(0.66)], [1.0, 0.66], [True, True], 0.23)
    three = information_floor([0.0, math.log(0.66), math.log(0.5)], [1.0, 0.66, 0.5],
                              [True, True, False], 0.23)
    assert three.cost == pytest.approx(two.cost, rel=1e-6) and three.runs[2] == 0.0
    same = information_floor([0.0, math.log(1.02)], [1.0, 1.02], [True, True], 0.23)
    assert same.cost == 0.0 and same.right == [0, 1]


def test_a_close_rival_to_the_best_costs_more_than_the_best_alone():
    """A second candidate 15% slower than the best must be ruled out too (by more than the
    5% margin): the floor rises, and that candidate gets runs of its own."""
    alone = information_floor([0.0, math.log(0.66)], [1.0, 0.66], [True, True], 0.23)
    rival = information_floor([0.0, math.log(0.66), math.log(0.76)], [1.0, 0.66, 0.76],
                              [True, True, True], 0.23)
    assert rival.cost > 2 * alone.cost and rival.runs[2] > 1.0
    assert any(b["made_best"] == 2 for b in rival.binding)


def test_replay_prints_the_floor_and_each_strategys_cost_over_it(tmp_path):
    """`rlbatch replay` puts the bank's floor in its truth and `floor_cost`, `cost_over_floor`
    (median cost / floor) in every strategy's row, and the floor is the one information_floor
    gives for the truth it printed."""
    from helpers.banks import write_bank
    from rlbatch.core.loading import load_config
    from rlbatch.profile.replay import replay
    from test_replay import config_file

    cfg = load_config(str(config_file(tmp_path)))
    write_bank(cfg, tmp_path / "bank", range(8), {128: 100.0, 256: 200.0})
    doc = replay(cfg, tmp_path / "bank", ["full"], 2, seed=1)
    floor = doc["truth"]["floor"]
    configs = doc["truth"]["configs"]
    again = information_floor([math.log(c["time_ratio"]) for c in configs],
                              [c["mean_time_s"] / doc["truth"]["baseline_time_to_target_s"]
                               for c in configs],
                              [c["in_family"] and c["verdict"] != "departed" for c in configs],
                              floor["sd_log_time"])
    assert floor["cost"] == pytest.approx(again.cost) and floor["cost"] > 0
    assert 0.05 < floor["sd_log_time"] < 0.5  # the bank's seeds vary by a factor of e^0.15
    for r in doc["strategies"]:
        assert r["floor_cost"] == floor["cost"]
        assert r["cost_over_floor"] == pytest.approx(r["median_cost"] / floor["cost"])
