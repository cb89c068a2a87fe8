"""`rlbatch profile --budget`: the budget's parse, its hold on the trials, the pick's
probabilities against their closed form, the looks it takes, and the whole loop on banks
written from known curves (profile/budget.py; docs/analysis.md, "A budget")."""

from __future__ import annotations

import math

import pytest
import scipy.stats as sps

from helpers.banks import write_bank
from helpers.cli import run_cli
from rlbatch.core.errors import UserError
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import read_jsonl
from rlbatch.profile import budget
from rlbatch.profile.bank import load_bank
from rlbatch.profile.driver import next_sets, with_sets
from rlbatch.profile.procedure import run_profile
from rlbatch.profile.replay import ReplayExecutor, replay, replay_config
from test_replay import config_file


def test_a_budget_is_baseline_runs_or_training_time_and_anything_else_is_one_line():
    assert budget.parse_budget("4") == (4.0, None)
    assert budget.parse_budget("2.5") == (2.5, None)
    assert budget.parse_budget("90m") == (None, 5400.0)
    assert budget.parse_budget("2h") == (None, 7200.0)
    assert budget.parse_budget("3600s") == (None, 3600.0)
    for bad in ("0.5", "four", "4 GPU-hours", "-3"):
        with pytest.raises(UserError, match="--budget"):
            budget.parse_budget(bad)


def test_profile_budget_on_the_command_line_is_refused_before_anything_runs(tmp_path, capsys):
    code, out, err = run_cli(["profile", "--preset", "quick", "--budget", "lots", "--out",
                              tmp_path / "p"], capsys)
    assert code == 2
    assert "--budget" in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()


def entry(config: str, b: int, times: list[float], verdict: str = "inconclusive") -> dict:
    """An analysis entry with the fields the budget reads: runs that crossed at `times`."""
    geo = math.exp(sum(map(math.log, times)) / len(times))
    return {"config": config, "sequences_per_step": b, "lr": 1e-4, "algorithm": "grpo",
            "lr_scaling": "sqrt", "verdict": verdict, "seeds": len(times),
            "time_to_target": geo,
            "runs": [{"censored": False, "time_to_target": t} for t in times]}


def result(*entries: dict, evidence: str = "not_enough", rec: str | None = None) -> dict:
    return {"configs": list(entries), "reference": {"config": entries[0]["config"]},
            "recommendation": {"evidence": evidence, "config": rec or entries[0]["config"]}}


def test_two_configurations_probabilities_follow_the_t_distribution_they_are_drawn_from():
    """Baseline and one candidate, n runs each: the posterior difference of their mean log
    T is d + s sqrt(1/n_b + 1/n_c) t_df (a flat prior on the means, the spread's
    scaled-inverse-chi-squared), so P(slower) and P(within 5%) have closed forms; the
    draws meet them within 3 standard errors of 4,000 draws."""
    base = entry("b", 128, [100.0, 120.0, 90.0])
    cand = entry("c", 256, [80.0, 95.0])
    p = budget.probabilities(result(base, cand), prior_sd=0.3)
    logs = [[math.log(t) for t in (100.0, 120.0, 90.0)], [math.log(t) for t in (80.0, 95.0)]]
    ss = budget.PRIOR_DF * 0.09 + sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in logs)
    df = budget.PRIOR_DF + 2 + 1
    sd = math.sqrt(ss / df)
    assert p["sd_df"] == df and p["sd_log_time"] == pytest.approx(sd)
    d = math.log(cand["time_to_target"] / base["time_to_target"])
    scale = sd * math.sqrt(1 / 3 + 1 / 2)
    slower = sps.t.sf(-d / scale, df)
    within_c = sps.t.cdf((math.log(1.05) - d) / scale, df)
    within_b = sps.t.sf((-math.log(1.05) - d) / scale, df)
    se = 3 * math.sqrt(0.25 / budget.DRAWS)
    rows = {r["config"]: r for r in p["configs"]}
    assert rows["c"]["p_slower_than_baseline"] == pytest.approx(slower, abs=se)
    assert rows["c"]["p_within_5pct"] == pytest.approx(within_c, abs=se)
    assert rows["b"]["p_within_5pct"] == pytest.approx(within_b, abs=se)
    assert rows["b"]["p_slower_than_baseline"] is None
    assert budget.probabilities(result(base, cand), prior_sd=0.3) == p  # seeded draws


def test_the_pool_is_every_configuration_of_the_algorithm_that_ran_and_did_not_break():
    """The fixed-LR control and a departed configuration compete (a budget asks what
    reaches the target soonest); a diverged one, one too easy and another algorithm do
    not; a configuration stopped early stays, as what its stop says (`stopped`)."""
    base = entry("b", 128, [100.0])
    control = {**entry("ctl", 256, [70.0]), "lr_scaling": "none"}
    departed = entry("dep", 512, [50.0], verdict="departed")
    stopped = {**entry("stop", 1024, [140.0], verdict="slower"), "time_to_target": None,
               "runs": [{"censored": True, "last_train_s": 100.0}]}
    broke = [entry("div", 64, [90.0], verdict="diverged"),
             entry("easy", 32, [90.0], verdict="too_easy"),
             {**entry("ppo", 128, [90.0]), "algorithm": "ppo"}]
    names = [e["config"] for e in budget.pool(result(base, control, departed, stopped, *broke))]
    assert names == ["b", "ctl", "dep", "stop"]


def stopped_at(config: str, b: int, seconds: float) -> dict:
    """A configuration whose one run ended without crossing at `seconds`."""
    return {**entry(config, b, [1.0]), "time_to_target": None,
            "runs": [{"censored": True, "last_train_s": seconds}]}


def test_a_run_stopped_before_the_target_says_its_t_lies_beyond_where_it_stopped():
    """A candidate none of whose runs crossed is drawn around the baseline's mean log T
    (the candidates' prior, sd PRIOR_TAU twice over), each draw weighed by the chance its
    run's T lies past the stop: stopped at a tiny fraction of the baseline's T it says
    almost nothing (P(slower) near the prior's 1/2); stopped at the baseline's own T it
    is likely slower; stopped at 3x, more likely still (one run past 3x the baseline's T
    leaves room for a mean below it only in the run's own spread)."""
    base = entry("b", 128, [100.0, 105.0])
    p_slower = {}
    for at in (1.0, 100.0, 300.0):
        probs = budget.probabilities(result(base, stopped_at("c", 256, at)), prior_sd=0.3)
        c = probs["configs"][1]
        assert c["time_ratio"] is None and c["crossed"] == 0
        p_slower[at] = c["p_slower_than_baseline"]
    assert p_slower[1.0] == pytest.approx(0.5, abs=0.05)
    assert 0.6 < p_slower[100.0] < p_slower[300.0]
    assert p_slower[300.0] > 0.9


def test_the_luckiest_of_candidates_seen_once_is_shrunk_towards_the_others(monkeypatch):
    """Three candidates seen once at T ratios 0.6, 0.9 and 1.0: under the candidates' common
    prior (sd PRIOR_TAU) the lowest is less likely the fastest than under a flat prior (a
    PRIOR_TAU far wider than any T ratio), and its P(slower) is higher."""
    r = result(entry("b", 128, [100.0]), entry("c1", 256, [60.0]), entry("c2", 512, [90.0]),
               entry("c3", 1024, [100.0]))
    shrunk = budget.probabilities(r, prior_sd=0.3)["configs"][1]
    monkeypatch.setattr(budget, "PRIOR_TAU", 100.0)
    flat = budget.probabilities(r, prior_sd=0.3)["configs"][1]
    assert shrunk["p_best"] < flat["p_best"] - 0.05
    assert shrunk["p_slower_than_baseline"] > flat["p_slower_than_baseline"] + 0.02


def test_the_pick_is_the_likeliest_best_unless_it_is_too_likely_slower_or_one_is_shown():
    base = entry("b", 128, [100.0])
    near = entry("c", 256, [92.0])  # one seed each, a little faster: too likely slower
    r = result(base, near)
    probs = budget.probabilities(r, prior_sd=0.3)
    row, why = budget.pick(r, probs, max_slower=0.25)
    c = next(x for x in probs["configs"] if x["config"] == "c")
    assert c["p_within_5pct"] > probs["configs"][0]["p_within_5pct"]
    assert c["p_slower_than_baseline"] > 0.25
    assert row["config"] == "b" and "profile.budget_max_slower" in why
    row, _ = budget.pick(r, probs, max_slower=0.5)
    assert row["config"] == "c"
    shown = result(base, near, evidence="established", rec="c")
    row, why = budget.pick(shown, probs, max_slower=0.01)
    assert row["config"] == "c" and "established" in why


def test_a_sequential_pick_is_the_draws_alone_and_needs_a_cap(tmp_path):
    """profile.sequential: a candidate the decision rule calls `established` is not picked
    on that alone (that test, at alpha at every look, would add its error at each): one
    seed each, a little faster, stays too likely slower; without a cap the config is
    refused with the key named."""
    shown = result(entry("b", 128, [100.0]), entry("c", 256, [92.0]),
                   evidence="established", rec="c")
    probs = budget.probabilities(shown, prior_sd=0.3)
    row, why = budget.pick(shown, probs, budget.SURE_SLOWER, sequential=True)
    assert row["config"] == "b" and "established" not in why
    assert "the sequential decision's bound 0.05" in why
    row, why = budget.pick(shown, probs, budget.SURE_SLOWER)
    assert row["config"] == "c" and "established" in why
    path = config_file(tmp_path, "profile.prompts_per_step=[32,64]")
    with pytest.raises(UserError, match="profile.sequential"):
        load_config(str(path), overrides=["profile.sequential=true"])
    assert load_config(str(path), overrides=["profile.sequential=true",
                                              "profile.budget=12"]).profile.sequential


def test_a_look_is_taken_only_while_the_budget_pays_for_it_and_the_pick_is_unsure():
    base = entry("b", 128, [100.0, 110.0])
    cand = entry("c", 256, [70.0])
    r = result(base, cand)
    probs = budget.probabilities(r, prior_sd=0.3)
    chosen = probs["configs"][1]
    # to bring both to 3 seeds: one baseline run (~105 s) and two of c (~70 s each)
    cost = base["time_to_target"] + 2 * cand["time_to_target"]
    sets, why, rival = budget.next_look(r, probs, chosen, seeds=2, spent=300.0,
                                        limit=300.0 + cost + 1)
    assert sets == {"profile.seeds": 3} and rival == "c"
    sets, why, _ = budget.next_look(r, probs, chosen, seeds=2, spent=300.0,
                                    limit=300.0 + cost - 1)
    assert sets is None and "cannot pay" in why
    sure = result(entry("b", 128, [100.0] * 6), entry("c", 256, [50.0, 52.0, 49.0, 51.0]))
    p2 = budget.probabilities(sure, prior_sd=0.3)
    sets, why, _ = budget.next_look(sure, p2, p2["configs"][1], seeds=6, spent=0.0,
                                    limit=1e9)
    assert sets is None and why.startswith("sure enough")


def test_one_baseline_run_alone_never_ends_the_looks_with_a_candidate_pick():
    """The baseline's one run at 600 s (a slow machine, say) and four candidates at ~100 s:
    the draws put the likeliest at P(slower) 0.00, yet the looks go on, with a second
    baseline run beside it (BASE_RUNS); once the baseline has two runs that crossed the
    same pick ends them."""
    one = result(entry("b", 128, [600.0]), entry("c", 256, [100.0]), entry("d", 512, [95.0]),
                 entry("e", 1024, [110.0]), entry("f", 2048, [105.0]))
    probs = budget.probabilities(one, prior_sd=0.25)
    chosen, _ = budget.pick(one, probs, max_slower=0.05, sequential=True)
    assert chosen["config"] != "b" and chosen["p_slower_than_baseline"] <= budget.SURE_SLOWER
    sets, why, rival = budget.next_look(one, probs, chosen, seeds=1, spent=0.0, limit=1e9,
                                        sure_within=0.0)
    assert sets == {"profile.seeds": 2} and rival == chosen["config"]
    assert [x["config"] for x in budget.look_configs(probs, chosen)] == ["b", chosen["config"]]
    two = result(entry("b", 128, [600.0, 580.0]), *one["configs"][1:])
    p2 = budget.probabilities(two, prior_sd=0.25)
    ch2, _ = budget.pick(two, p2, max_slower=0.05, sequential=True)
    sets, why, _ = budget.next_look(two, p2, ch2, seeds=1, spent=0.0, limit=1e9,
                                    sure_within=0.0)
    assert sets is None and why.startswith("sure enough")


def test_once_the_pick_is_sure_to_be_faster_its_rival_gets_the_seeds_and_the_baseline_rests():
    """Baseline 6 seeds at ~100 s; c 4 seeds at ~50 s and d 1 seed at 52 s: c's lead over
    the baseline is settled (P(slower) <= 0.05) but not, at 0.9, whether it is within 5% of
    d, so the next look runs c and d and no baseline seed. With the baseline at 55 s instead, the
    question is against the baseline, which runs beside the pick."""
    base = entry("b", 128, [100.0, 104.0, 97.0, 101.0, 99.0, 103.0])
    c = entry("c", 256, [50.0, 52.0, 49.0, 51.0])
    d = entry("d", 512, [52.0])
    r = result(base, c, d)
    probs = budget.probabilities(r, prior_sd=0.1)
    chosen, _ = budget.pick(r, probs, max_slower=0.05)
    rows = {x["config"]: x for x in probs["configs"]}
    assert chosen["config"] in ("c", "d") and chosen["p_slower_than_baseline"] <= 0.05
    assert chosen["p_within_5pct"] < 0.9
    looked = budget.look_configs(probs, chosen)
    assert {x["config"] for x in looked} == {"c", "d"}
    sets, why, rival = budget.next_look(r, probs, chosen, seeds=6, spent=0.0, limit=1e9,
                                        sure_within=0.9)
    assert sets == {"profile.seeds": 7} and rival == chosen["config"]
    assert "baseline" not in why and "B=256 and B=512" in why.replace("B=512 and B=256",
                                                                      "B=256 and B=512")
    close = result(entry("b", 128, [55.0, 50.0]), c, d)
    p2 = budget.probabilities(close, prior_sd=0.1)
    ch2, _ = budget.pick(close, p2, max_slower=0.5)
    assert ch2["config"] != "b" and ch2["p_slower_than_baseline"] > budget.SURE_SLOWER
    assert [x["config"] for x in budget.look_configs(p2, ch2)] == ["b", ch2["config"]]
    assert rows["b"]["p_slower_than_baseline"] is None


def test_the_guard_refuses_new_trials_and_stops_running_ones_once_the_budget_is_spent(
        tmp_path):
    """A run of 60 s is in the folder, the decode sweep took 10 s, the limit is 100 s: a
    running trial at 20 s (steps of 2 s: B = 128 over 1,280 samples) is left to run; at
    29 s its next step would pass the limit, so it is stopped; a trial that reached the
    target is not; and no trial is admitted past the limit."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a").mkdir()
    (runs / "a" / "summary.json").write_text('{"train_s": 60.0}')
    g = budget.Guard(100.0, runs, fixed_s=10.0)
    assert g.spent() == 70.0 and g.admit(None)
    st = {"run_dir": str(runs / "b"), "train_s": 20.0, "B": 128, "samples": 1280,
          "target": {}}
    assert g.stop(st) is None and g.spent() == 90.0
    st.update(train_s=29.0, samples=1856)
    assert g.stop(st).startswith("profile_budget:")
    assert g.stop({**st, "target": {"reached": True}}) is None  # a finished run is not stopped
    (runs / "b").mkdir()
    (runs / "b" / "summary.json").write_text('{"train_s": 31.0}')
    assert not g.admit(None) and g.spent() == 101.0  # read again before admitting
    assert budget.Guard(None, runs).admit(None)


@pytest.fixture
def budget_bank(tmp_path):
    """B = 256 at twice the baseline's throughput (T ratio 0.5), B = 512 slower (1.25)."""
    path = config_file(tmp_path, "profile.prompts_per_step=[32,64]")
    cfg = replay_config(load_config(str(path)))
    write_bank(cfg, tmp_path / "bank", range(10), {128: 100.0, 256: 200.0, 512: 80.0})
    return cfg, load_bank(tmp_path / "bank"), tmp_path


@pytest.mark.parametrize("runs", [2.0, 5.0])
def test_looks_within_a_budget_spend_at_most_it_and_give_seeds_to_the_baseline_and_the_pick(
        budget_bank, runs):
    """The profile followed as `rlbatch profile --budget N` follows it: its first look is
    one seed of each configuration; every later look runs new seeds of the baseline and of
    its challenger only; no look spends more than the budget and one step of the trial it
    stopped; the last look's pick is B = 256 with its probabilities."""
    cfg, bank, tmp = budget_bank
    cfg = with_sets(cfg, {"profile.budget": runs})
    out = tmp / f"profile-{runs:g}"
    docs = []
    current = cfg
    for _ in range(budget.follows(cfg.profile, 0) + 1):
        docs.append(run_profile(current, out, ReplayExecutor(bank, {s: s for s in range(10)}),
                                poll_s=0.0))
        sets = next_sets(docs[-1], "full")
        if sets is None:
            break
        current = with_sets(current, sets)
    first = docs[0]
    assert {t["trial"] for t in first["trials"]} <= {"base-P16-s0", "sqrt-P32-s0",
                                                     "sqrt-P64-s0", "fixed-lr-P32-s0"}
    step_s = max(128 / 80.0, 128 / 100.0, 256 / 200.0, 512 / 80.0)  # the longest step
    for doc in docs:
        b = doc["decision"]["budget"]
        assert b["spent_s"] <= b["limit_s"] + step_s
        assert b["limit_s"] == pytest.approx(runs * doc["cost"]["baseline_time_to_target_s"])
    started = [e["trial"] for e in read_jsonl(out / "journal.jsonl")[0]
               if e["event"] == "started"]
    later = started[len({t["trial"] for t in first["trials"]
                         if t["status"] != "pending"}):]
    assert {t.rsplit("-s", 1)[0] for t in later} <= {"base-P16", "sqrt-P32"}
    last = docs[-1]["decision"]["budget"]
    if runs >= 5:
        assert len(docs) > 1 and last["pick_sequences_per_step"] == 256
        assert 0.5 < last["p_within_5pct"] <= 1.0
        assert last["p_slower_than_baseline"] < 0.25
    assert last["next_set"] is None and last["next"]


def test_a_look_whose_baseline_rests_starts_no_baseline_seed(tmp_path):
    """B = 256 at twice the baseline's throughput, B = 512 at 2.2 times: once the pick is
    sure to be faster than the baseline (and, at profile.budget_sure_within 0.9, not yet
    sure to be within 5% of the other), the next look runs the two candidates only, and the
    baseline's seeds stay those it had."""
    path = config_file(tmp_path, "profile.prompts_per_step=[32,64]")
    cfg = replay_config(load_config(str(path)))
    write_bank(cfg, tmp_path / "bank", range(12), {128: 100.0, 256: 200.0, 512: 220.0})
    bank = load_bank(tmp_path / "bank")
    current = with_sets(cfg, {"profile.budget": 10.0, "profile.budget_max_slower": 0.05,
                              "profile.budget_sure_within": 0.9})
    out = tmp_path / "profile"
    rested = []
    for _ in range(budget.follows(current.profile, 0) + 1):
        before = {e["trial"] for e in read_jsonl(out / "journal.jsonl")[0]
                  if e["event"] == "started"} if out.exists() else set()
        doc = run_profile(current, out, ReplayExecutor(bank, {s: s for s in range(12)}),
                          poll_s=0.0)
        started = {e["trial"] for e in read_jsonl(out / "journal.jsonl")[0]
                   if e["event"] == "started"} - before
        if rested and rested[-1] is True:
            assert started and not any(t.startswith("base-") for t in started)
        b = doc["decision"]["budget"]
        rested.append(b["baseline_rests"])
        sets = next_sets(doc, "full")
        if sets is None:
            break
        current = with_sets(current, sets)
    assert True in rested[:-1]  # a look ran the candidates only


def sequential_looks(budget_bank, name: str, sets: dict) -> list[dict]:
    """`decision.budget` of each look of a sequential profile with a cap of 8 baseline runs
    on `budget_bank`, followed as `rlbatch profile --budget` follows it."""
    cfg, bank, tmp = budget_bank
    current = with_sets(cfg, {"profile.budget": 8.0, "profile.sequential": True, **sets})
    looks = []
    for _ in range(budget.follows(current.profile, 0) + 1):
        doc = run_profile(current, tmp / name, ReplayExecutor(bank, {s: s for s in range(10)}),
                          poll_s=0.0)
        looks.append(doc["decision"]["budget"])
        nxt = next_sets(doc, "full")
        if nxt is None:
            break
        current = with_sets(current, nxt)
    return looks


def test_a_sequential_profile_picks_only_a_candidate_at_most_5pct_likely_slower(budget_bank):
    """profile.sequential on the bank where B = 256 takes half the baseline's time: every
    look's pick is the baseline or a candidate the draws put at most 5% likely slower, and
    the last look, within the cap, picks B = 256."""
    looks = sequential_looks(budget_bank, "profile-sequential", {})
    for b in looks:
        assert b["is_reference"] or b["p_slower_than_baseline"] <= budget.SURE_SLOWER
    assert looks[-1]["pick_sequences_per_step"] == 256 and not looks[-1]["is_reference"]


def test_a_lower_sure_within_stops_the_same_looks_sooner(tmp_path):
    """profile.budget_sure_within only decides when a candidate's looks stop: on a bank where
    B = 256 and B = 512 both take about half the baseline's time, at 0.05 the looks are a
    prefix of those at 0.9 (the same seeds, the same picks), ending at the first look whose
    pick is a candidate at most 5% likely slower than the baseline, with its reason."""
    path = config_file(tmp_path, "profile.prompts_per_step=[32,64]")
    cfg = replay_config(load_config(str(path)))
    write_bank(cfg, tmp_path / "bank", range(10), {128: 100.0, 256: 200.0, 512: 195.0})
    close = (cfg, load_bank(tmp_path / "bank"), tmp_path)
    high = sequential_looks(close, "sure-high", {"profile.budget_sure_within": 0.9})
    low = sequential_looks(close, "sure-low", {"profile.budget_sure_within": 0.05})
    assert len(low) < len(high)
    key = [(b["pick"], round(b["spent_s"], 6)) for b in high]
    assert [(b["pick"], round(b["spent_s"], 6)) for b in low] == key[:len(low)]
    last = low[-1]
    assert not last["is_reference"] and last["p_slower_than_baseline"] <= budget.SURE_SLOWER
    assert last["next"].startswith("sure enough") and ">= 0.05" in last["next"]
    assert all(b["next_set"] for b in low[:-1])


def test_a_replay_within_a_budget_scores_its_probabilities_beside_the_grid_within_it(
        budget_bank):
    cfg, _bank, tmp = budget_bank
    doc = replay(with_sets(cfg, {"profile.budget": 3.0}), tmp / "bank", ["full"], 4, seed=1)
    rows = {r["strategy"]: r for r in doc["strategies"]}
    assert set(rows) == {"full", "keep_baseline", "one_seed_grid", "one_seed_grid_budget_3"}
    cal = rows["full"]["calibration"]
    assert sum(b["replicates"] for b in cal["p_within_5pct"]) == 4
    for b in cal["p_within_5pct"]:
        assert b["bin"][0] <= b["mean_printed"] <= b["bin"][1]
        assert 0.0 <= b["frequency"] <= 1.0
    grid = rows["one_seed_grid_budget_3"]
    assert grid["median_cost"] <= 3.0 * 1.3  # its unit is its own baseline run, the bank's
    # geometric mean differs from one seed's T by that seed's factor (sd 0.15 + 0.1 in logs)


def test_a_candidate_not_yet_seen_costs_its_expected_time_capped_at_the_baselines():
    """E[min(exp(X), 1)] for X ~ N(0, v), v = PRIOR_TAU^2 + 2 s^2, against 200,000 draws."""
    import random as rnd

    from rlbatch.profile import forecast

    rng = rnd.Random(5)
    for s in (0.1, 0.3):
        sd = math.sqrt(budget.PRIOR_TAU ** 2 + 2 * s * s)
        mc = sum(min(math.exp(rng.gauss(0, sd)), 1.0) for _ in range(200_000)) / 200_000
        assert forecast.candidate_cost(s) == pytest.approx(mc, abs=0.004)


def test_the_forecast_uses_the_baselines_spread_from_three_seeds_and_assumes_it_below():
    from rlbatch.profile import forecast

    kw = {"baseline_runs": 2, "candidates": 4, "confirm": 1, "prior_sd": 0.35,
          "alpha": 0.05, "max_slower": 0.25, "budgeted": False}
    two = forecast.forecast(log_times=[0.0, 0.5], **kw)
    assert two["sd_from"] == "assumed" and two["sd_log_time"] == 0.35
    e = forecast.candidate_cost(0.35)
    assert two["look_runs"] == pytest.approx(2 + 5 * e) and two["look_most_runs"] == 7
    three = forecast.forecast(log_times=[0.0, 0.1, 0.2], **kw)
    assert three["sd_from"] == "baseline" and three["sd_log_time"] == pytest.approx(0.1)
    # a smaller spread: fewer seeds to establish each saving, a finer ratio for each budget
    for a, b in zip(three["establish"], two["establish"]):
        assert a["seeds_per_side"] < b["seeds_per_side"]
    for a, b in zip(three["budgets"], two["budgets"]):
        assert a["finds_ratio"] > b["finds_ratio"]
    assert [b["budget"] for b in two["budgets"]] == [2, 4, 8]
    within = forecast.forecast(log_times=[0.0, 0.5], **{**kw, "budgeted": True})
    assert within["look_runs"] is None
    assert forecast.lines(within)[0].startswith("forecast: at the run-to-run sd")
    text = "\n".join(forecast.lines(two))
    assert "forecast: this look costs about" in text and "--budget 2:" in text


def test_the_first_look_records_its_forecast_and_a_replay_scores_it(budget_bank):
    """profile.json carries the forecast made once the baseline ran (the first look
    only); `rlbatch replay` compares it with what that look cost."""
    cfg, bank, tmp = budget_bank
    doc = run_profile(cfg, tmp / "p", ReplayExecutor(bank, {s: s for s in range(10)}),
                      poll_s=0.0)
    fc = doc["forecast"]
    assert fc["look_most_runs"] == 2 + 2 + 1  # two baseline seeds, B = 256 and 512, a confirmation
    events = [e["event"] for e in read_jsonl(tmp / "p" / "journal.jsonl")[0]]
    assert events.count("forecast") == 1
    scored = replay(cfg, tmp / "bank", ["full"], 3, seed=2)["strategies"][0]["forecast"]
    assert scored["replicates"] == 3
    assert scored["median_ratio"] > 0
    assert "after_first_look" not in scored  # not a sequential decision
    seq = with_sets(cfg, {"profile.budget": 8.0, "profile.sequential": True})
    scored = replay(seq, tmp / "bank", ["full"], 3, seed=2)["strategies"][0]["forecast"]
    later = scored["after_first_look"]  # the decision went on after its first look (one
    assert later["replicates"] == 3  # baseline run), so its second forecast is scored
    assert later["median_cost_runs"] <= 8.0 and later["median_ratio"] > 0


def test_a_sequential_decision_prints_its_pick_as_the_decision(budget_bank, capsys):
    """Under a sequential decision (the default) the first `decision:` line is the budget's
    pick; the decision rule's verdict follows, named as its own test, so that the output
    never shows two decisions."""
    from rlbatch.cli.profile_cmds import _print_decision

    cfg, bank, tmp = budget_bank
    cfg = with_sets(cfg, {"profile.budget": 8.0, "profile.sequential": True})
    doc = run_profile(cfg, tmp / "printed", ReplayExecutor(bank, {s: s for s in range(10)}),
                      poll_s=0.0)
    _print_decision(doc, str(tmp / "printed"), False)
    lines = capsys.readouterr().out.splitlines()
    decisions = [x for x in lines if x.startswith("decision: ")]
    assert len(decisions) == 1
    assert decisions[0].startswith("decision: within the budget (8 baseline runs;")
    assert any(x.startswith("the decision rule's own test of these runs") for x in lines)
    assert lines.index(decisions[0]) < next(
        i for i, x in enumerate(lines) if x.startswith("the decision rule's own test"))
    b = doc["decision"]["budget"]  # the first look, one baseline run: the decision goes on,
    assert b["next_set"]  # and forecasts its whole cost from these runs
    assert b["spent_runs"] <= b["forecast_runs"] <= 8.0
    assert (f"  forecast: from these runs, this decision costs about {b['forecast_runs']:.1f} "
            "baseline runs in all, at most 8 (its cap)") in lines


def test_the_decision_prints_the_budgets_pick_with_the_chance_it_is_slower_only(
        budget_bank, capsys):
    """The pick's line names what it spent and P(slower than the baseline), the one
    probability the replays found calibrated; the model's P(within 5%) only orders the
    ranked line (docs/analysis.md, "A budget")."""
    from rlbatch.cli.profile_cmds import _print_decision

    cfg, bank, tmp = budget_bank
    cfg = with_sets(cfg, {"profile.budget": 3.0})
    doc = run_profile(cfg, tmp / "p", ReplayExecutor(bank, {s: s for s in range(10)}),
                      poll_s=0.0)
    _print_decision(doc, str(tmp / "p"), False)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("within the budget (3 baseline"))
    b = doc["decision"]["budget"]
    if not b["is_reference"]:
        assert f"P(slower than the baseline) {b['p_slower_than_baseline']:.2f}" in line
    assert "ranked, likeliest fastest first: " in out and "next: " in out
    assert "P(within" not in out


def test_rlbatch_replay_budget_prints_the_grid_within_it_and_the_calibration(budget_bank,
                                                                              capsys):
    from rlbatch.profile import DEFAULT_BUDGET

    _, _, tmp = budget_bank
    path = config_file(tmp, "profile.prompts_per_step=[32,64]", name="cli.yaml")
    code, out, err = run_cli(["replay", path, tmp / "bank", "--budget", "3", "--replicates",
                              "2"], capsys)
    assert code == 0, err
    assert "one_seed_grid_budget_3" in out
    assert "full p within 5pct, printed against replayed: " in out
    code, _, err = run_cli(["replay", path, tmp / "bank", "--budget", "3x"], capsys)
    assert code == 2 and "--budget" in err
    code, out, err = run_cli(["replay", path, tmp / "bank", "--budget", "3", "--sequential",
                              "--replicates", "2"], capsys)
    assert code == 0, err
    assert "one_seed_grid_budget_3" in out
    code, _, err = run_cli(["replay", path, tmp / "bank", "--sequential", "--follow", "0"],
                           capsys)
    assert code == 2 and "profile.sequential" in err and "cap" in err
    code, out, err = run_cli(["replay", path, tmp / "bank", "--replicates", "2"], capsys)
    assert code == 0, err  # no flags: the default decision, as `rlbatch profile` runs it
    assert f"one_seed_grid_budget_{DEFAULT_BUDGET}" in out


def test_sequential_on_the_command_line_stands_for_the_config_key():
    from rlbatch.cli.profile_cmds import budget_overrides

    assert budget_overrides("12", True) == ["profile.sequential=true", "profile.budget=12.0"]
    assert budget_overrides("90m", False) == ["profile.budget_seconds=5400.0"]
    assert budget_overrides(None, True) == ["profile.sequential=true"]


def test_a_budget_in_seconds_below_one_baseline_run_says_so(budget_bank):
    """`--budget 5s` against a baseline that needs about 16 training seconds: the budget
    stops the baseline's only run before the target, and the profile's problem says to
    give a budget of at least one baseline run (not to raise budget.max_samples)."""
    cfg, bank, tmp = budget_bank
    cfg = with_sets(cfg, {"profile.budget_seconds": 5.0})
    doc = run_profile(cfg, tmp / "p", ReplayExecutor(bank, {s: s for s in range(10)}),
                      poll_s=0.0)
    assert doc["decision"] is None
    assert "stopped by the profile's budget" in doc["problem"]
    assert "--budget at least one baseline run" in doc["problem"]
    assert "budget.max_samples" not in doc["problem"]


def test_the_grid_with_a_margin_picks_a_candidate_only_below_margin_times_the_baseline(
        budget_bank):
    """bench/budget_frontier.py's rule: margin 1 is the grid within the budget; B = 256 at
    T ratio 0.5 (the bank's noise about 0.15 in logs) is picked at a margin of 0.9 as often,
    and never at 0.1, which keeps the baseline every time."""
    import random as rnd

    from rlbatch.profile.replay import profile_keys
    from rlbatch.profile.replay_truth import attach_crossings, bank_truth, grid_within

    cfg, bank, _ = budget_bank
    keys = profile_keys(cfg)
    attach_crossings(bank, cfg)
    truth = bank_truth(cfg, bank, keys)
    plain = grid_within(truth, bank, keys, 50, rnd.Random(2), 3.0)
    assert grid_within(truth, bank, keys, 50, rnd.Random(2), 3.0, 1.0) == plain
    assert plain["recommends"] == 1.0
    assert grid_within(truth, bank, keys, 50, rnd.Random(2), 3.0, 0.9)["recommends"] == 1.0
    never = grid_within(truth, bank, keys, 50, rnd.Random(2), 3.0, 0.1)
    assert never["recommends"] == 0.0 and never["slower_than_baseline"] == 0.0


def test_a_profile_stopped_by_its_cap_prints_the_budget_that_pays_for_its_next_look(
        budget_bank, monkeypatch):
    """At --budget 2 the looks stop because the cap cannot pay for the next one: the command
    printed to continue is the same one with the budget that pays for it (not the decision
    rule's seeds, which the spent budget would refuse), and re-run at that budget on the
    same folder the profile takes that look. A profile that stopped because it is sure
    enough prints no command."""
    from rlbatch.cli import common, profile_cmds

    cfg, bank, tmp = budget_bank
    out = tmp / "capped"
    doc = run_profile(with_sets(cfg, {"profile.budget": 2.0}), out,
                      ReplayExecutor(bank, {s: s for s in range(10)}), poll_s=0.0)
    b = doc["decision"]["budget"]
    assert b["next_set"] is None and b["next"].startswith("the budget cannot pay")
    more = math.ceil(b["next_look_budget_runs"] * 10) / 10
    assert more > 2.0
    monkeypatch.setattr(common, "INVOKED", ["profile", "cfg.yaml", "--budget", "2",
                                            "--sequential", "--out", str(out)])
    assert profile_cmds._next_command(doc, str(out)) == (
        f"rlbatch profile cfg.yaml --sequential --budget {more:g} --out {out}")
    again = run_profile(with_sets(cfg, {"profile.budget": more}), out,
                        ReplayExecutor(bank, {s: s for s in range(10)}), poll_s=0.0)
    assert again["decision"]["next_set"] == {"profile.seeds": cfg.profile.seeds + 1}
    secs = tmp / "capped-s"  # a budget in seconds is continued in seconds
    limit = 2.0 * b["spent_s"] / b["spent_runs"]
    doc_s = run_profile(with_sets(cfg, {"profile.budget_seconds": limit}), secs,
                        ReplayExecutor(bank, {s: s for s in range(10)}), poll_s=0.0)
    need = math.ceil(doc_s["decision"]["budget"]["next_look_budget_s"])
    assert need > limit
    monkeypatch.setattr(common, "INVOKED", ["profile", "cfg.yaml", "--budget", "2m",
                                            "--out", str(secs)])
    assert profile_cmds._next_command(doc_s, str(secs)) == (
        f"rlbatch profile cfg.yaml --budget {need}s --out {secs}")
    sure = sequential_looks(budget_bank, "sure", {"profile.budget_sure_within": 0.9})[-1]
    assert sure["next"].startswith("sure enough") and sure["next_look_budget_runs"] is None
    assert profile_cmds._next_command({"decision": {"budget": sure, "next_set": None}},
                                      str(out)) is None
