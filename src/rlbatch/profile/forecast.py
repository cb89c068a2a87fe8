"""The profile's forecast, printed once the baseline has run (docs/analysis.md, "The
forecast"): what this look will cost, what establishing a saving would cost at the spread
the baseline's seeds show, and what a budget of 2, 4 and 8 baseline runs would buy.

Before any candidate has run, each candidate's log T ratio to the baseline is taken as
Gaussian around 0 (as likely faster as slower) with sd sqrt(PRIOR_TAU^2 + 2 s^2): the
candidates' spread of the budget's model (profile/budget.py) and the run-to-run spread s of
one run of each. A screened candidate costs min(T_cand, T_base) in expectation (the early
stop `cannot_win` ends it at the baseline's time to target), whose mean under that law is
E = 1/2 + exp(v/2) Phi(-sqrt(v)) (v the variance above); the confirmation seed of the
challenger costs the same. All costs are in baseline runs' time to target. Pure: the
replays check it against what the looks cost (`forecast` in `rlbatch replay --json`).

A sequential decision within a cap (the default) is forecast whole: `decision_cost`
simulates its looks under the same law (each candidate's true log T ratio drawn around 0
with sd PRIOR_TAU, each run's log T spread by s) and returns the median cost at which it
stops: once the likeliest fastest candidate is at most SURE_SLOWER likely slower than the
baseline, once the baseline is at least SURE_BASELINE likely within 5% of every candidate,
or when the cap cannot pay for the next look (one seed of the baseline and of the
likeliest fastest, the latter at its own time to target). Its probabilities are the
budget's posterior in closed form at a known spread (`_posteriors`), treating the
candidates as independent where the budget's draws do not: the replays check the
forecast, not the model.
"""

from __future__ import annotations

import math
import random
import statistics

from rlbatch.analysis import seedstats
from rlbatch.profile.budget import PRIOR_TAU, SURE_BASELINE, SURE_SLOWER, WITHIN

SAVINGS = (1.2, 1.5, 2.0)  # the savings whose cost to establish is printed
BUDGETS = (2, 4, 8)
POWER = 0.8
SIMULATIONS = 2000  # simulated decisions behind a sequential forecast


def candidate_cost(s: float) -> float:
    """E[min(T_cand / T_base, 1)] for a candidate not yet seen (module text)."""
    v = PRIOR_TAU ** 2 + 2 * s * s
    return 0.5 + math.exp(v / 2) * statistics.NormalDist().cdf(-math.sqrt(v))


def _posteriors(runs: list[list[float]], base: list[float], s: float) -> list[tuple]:
    """(mean, sd) of each candidate's log T ratio given the runs' log T, under the budget's
    model (profile/budget.py): a flat prior for the baseline's mean, the candidates' means
    around a common mean (flat) with sd PRIOR_TAU, so each is shrunk towards the others."""
    tau2 = PRIOR_TAU ** 2
    w = [1 / (tau2 + s * s / len(r)) for r in runs]
    centre = sum(wi * statistics.fmean(r) for wi, r in zip(w, runs, strict=True)) / sum(w)
    out = []
    for r in runs:
        prec = len(r) / (s * s) + 1 / tau2
        mean = (statistics.fmean(r) * len(r) / (s * s) + centre / tau2) / prec
        var = 1 / prec + (1 / (tau2 * prec)) ** 2 / sum(w) + s * s / len(base)
        out.append((mean - statistics.fmean(base), math.sqrt(var)))
    return out


def _one_decision(rng: random.Random, baseline_runs: int, candidates: int, s: float,
                  cap: float) -> float:
    """The cost of one simulated sequential decision (module text), in baseline runs."""
    cdf = statistics.NormalDist().cdf
    truth = [rng.gauss(0.0, PRIOR_TAU) for _ in range(candidates)]
    base = [rng.gauss(0.0, s) for _ in range(baseline_runs)]
    runs = [[d + rng.gauss(0.0, s)] for d in truth]
    cost = baseline_runs + sum(min(math.exp(r[0]), 1.0) for r in runs)  # screened
    while True:
        post = _posteriors(runs, base, s)
        lead = min(range(candidates), key=lambda i: post[i][0])
        m, sd = post[lead]
        if cdf(m / sd) <= SURE_SLOWER:  # P(slower than the baseline): P(ratio > 1)
            return cost
        sure_base = math.prod(cdf((p + math.log(WITHIN)) / q) for p, q in post)
        step = 1.0 + math.exp(truth[lead])
        if sure_base >= SURE_BASELINE or cost + step > cap:
            return cost
        cost += step
        base.append(rng.gauss(0.0, s))
        runs[lead].append(truth[lead] + rng.gauss(0.0, s))


def decision_cost(*, baseline_runs: int, candidates: int, s: float, cap: float,
                  seed: int = 0) -> float:
    """Median cost, in baseline runs, of a sequential decision within `cap` (module text)."""
    rng = random.Random(seed)
    return statistics.median(_one_decision(rng, max(1, baseline_runs), candidates, s, cap)
                             for _ in range(SIMULATIONS))


def forecast(*, baseline_runs: int, candidates: int, confirm: int, log_times: list[float],
             prior_sd: float, alpha: float, max_slower: float, budgeted: bool,
             cap: float | None = None) -> dict:
    """The forecast after the baseline's `baseline_runs` (their log T: `log_times`), with
    `candidates` screening trials and `confirm` confirmation seeds to come; `cap`: a
    sequential decision's cap in baseline runs, forecast whole."""
    n = len(log_times)
    s = statistics.stdev(log_times) if n >= 3 else prior_sd  # two seeds cannot estimate it
    e = candidate_cost(s)
    look = baseline_runs + (candidates + confirm) * e
    most = baseline_runs + candidates + confirm
    m = max(1, candidates)
    establish = []
    for saving in SAVINGS:
        per_side = seedstats.seeds_for(s, 0, math.log(saving), POWER, alpha / m)
        establish.append({"saving": saving, "seeds_per_side": per_side,
                          "runs": None if per_side is None else per_side * (1 + 1 / saving)})
    z = statistics.NormalDist().inv_cdf
    buys = []
    for b in BUDGETS:
        grid = min(b, 1 + candidates * e)
        pairs = max(0, int((b - grid) // (1 + e)))
        per_side = 1 + pairs
        ratio = math.exp(-(z(1 - max_slower) + z(POWER)) * s * math.sqrt(2 / per_side))
        buys.append({"budget": b, "seeds_per_side": per_side, "finds_ratio": ratio,
                     "grid_runs": grid})
    decide = decision_cost(baseline_runs=baseline_runs, candidates=candidates, s=s,
                           cap=cap) if cap and candidates else None
    return {"look_runs": None if budgeted else look, "look_most_runs": None if budgeted
            else most, "decide_runs": decide, "decide_most_runs": cap if decide else None,
            "sd_log_time": s, "sd_from": "baseline" if n >= 3 else "assumed",
            "candidate_cost": e, "establish": establish, "budgets": buys}


def lines(f: dict) -> list[str]:
    """The forecast in words."""
    sd = (f"run-to-run sd of log T {f['sd_log_time']:.2f}"
          + (" (the baseline's seeds)" if f["sd_from"] == "baseline"
             else " (assumed: profile.futility_sd; fewer than 3 baseline seeds)"))
    out = []
    if f["look_runs"] is not None:
        out.append(f"forecast: this look costs about {f['look_runs']:.1f} baseline runs' time "
                   f"to target, at most {f['look_most_runs']:.0f} (each candidate stops by the "
                   "baseline's time to target)")
    est = "; ".join(f"{x['saving']:g}x: " + ("more than 1,000 seeds per side"
                                             if x["seeds_per_side"] is None else
                                             f"{x['seeds_per_side']} seeds per side, about "
                                             f"{x['runs']:.0f} runs")
                    for x in f["establish"])
    if f.get("decide_runs") is not None:
        out.append(f"forecast: this sequential decision costs about {f['decide_runs']:.1f} "
                   f"baseline runs' time to target, at most {f['decide_most_runs']:g} (its cap)")
    lead = "  at" if out else "forecast: at"  # a budget's looks are not forecast one by one
    out.append(f"{lead} the {sd}, establishing a saving takes {est}")
    out.append("  --budget " + "; ".join(
        f"{b['budget']}: {b['seeds_per_side']} seed(s) per side of the likeliest best, "
        f"finds a T ratio of {b['finds_ratio']:.2f} or less 80% of the time"
        for b in f["budgets"]))
    return out
