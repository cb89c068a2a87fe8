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
simulates its looks (`_looks`, as budget.next_look takes them) under the same law and
returns the median cost at which it stops; after a look that goes on, `remaining_cost`
simulates the same looks from the runs the decision has, each configuration's true mean
drawn from the budget's posterior (docs/design.md, "profile/budget.py and
profile/forecast.py"). The replays check both forecasts, not the model.
"""

from __future__ import annotations

import math
import random
import statistics

from rlbatch.analysis import seedstats
from rlbatch.profile import budget
from rlbatch.profile.budget import BASE_RUNS, PRIOR_TAU, SURE_BASELINE, SURE_SLOWER, WITHIN

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
                  cap: float, sure_within: float) -> float:
    """The cost of one simulated sequential decision (module text), in baseline runs."""
    truth = [0.0] + [rng.gauss(0.0, PRIOR_TAU) for _ in range(candidates)]
    base = [rng.gauss(0.0, s) for _ in range(baseline_runs)]
    runs = [[d + rng.gauss(0.0, s)] for d in truth[1:]]
    cost = baseline_runs + sum(min(math.exp(r[0]), 1.0) for r in runs)  # screened
    return _looks(rng, truth, base, runs, s, cost, cap, sure_within)


def _looks(rng: random.Random, truth: list[float], base: list[float], runs: list[list[float]],
           s: float, cost: float, cap: float, sure_within: float) -> float:
    """The looks of a simulated decision from where they stand (`truth`: every
    configuration's true mean log T, the baseline's first, in log baseline runs; `base`,
    `runs`: the log T seen so far; `cost`: spent), until it stops; its cost. As the budget's
    looks (budget.next_look): a lead at most SURE_SLOWER likely slower than the baseline
    (which has BASE_RUNS runs) stops them once it is `sure_within` likely within 5% of
    every rival, and until then the lead and its nearest rival run while the baseline
    rests; otherwise the baseline and the lead run."""
    cdf = statistics.NormalDist().cdf
    while True:
        post = _posteriors(runs, base, s)
        order = sorted(range(len(runs)), key=lambda i: post[i][0])
        lead = order[0]
        m, sd = post[lead]
        faster = cdf(m / sd) <= SURE_SLOWER and len(base) >= BASE_RUNS  # P(ratio > 1)
        if faster and _within(post, lead, s * s / len(base)) >= sure_within:
            return cost
        sure_base = math.prod(cdf((p + math.log(WITHIN)) / q) for p, q in post)
        looked = [lead, order[1]] if faster and len(order) > 1 else [-1, lead]  # -1: baseline
        step = sum(math.exp(truth[i + 1]) for i in looked)
        if (not faster and sure_base >= SURE_BASELINE) or cost + step > cap:
            return cost
        cost += step
        for i in looked:
            (base if i < 0 else runs[i]).append(truth[i + 1] + rng.gauss(0.0, s))


def _within(post: list[tuple], lead: int, shared: float) -> float:
    """P(the lead within 5% of every other candidate), the differences taken as independent
    (each pair's variance less the baseline's share, `shared`, that cancels in it)."""
    cdf = statistics.NormalDist().cdf
    m, sd = post[lead]
    return math.prod(cdf((math.log(WITHIN) - (m - p)) / math.sqrt(max(
        sd * sd + q * q - 2 * shared, 1e-12))) for i, (p, q) in enumerate(post) if i != lead)


def decision_cost(*, baseline_runs: int, candidates: int, s: float, cap: float,
                  sure_within: float = 0.5, seed: int = 0) -> float:
    """Median cost, in baseline runs, of a sequential decision within `cap` (module text)."""
    rng = random.Random(seed)
    return statistics.median(_one_decision(rng, max(1, baseline_runs), candidates, s, cap,
                                           sure_within) for _ in range(SIMULATIONS))


def remaining_cost(entries: list[dict], *, spent: float, cap: float, prior_sd: float,
                   sure_within: float = 0.5, seed: int = 0) -> float | None:
    """After a look: the median total cost, in baseline runs (the median of the baseline's
    runs' T), of the sequential decision carried on from the runs it has (`entries`: the
    budget's pool, the baseline first; `spent`: baseline runs so far). Each simulated
    decision draws every configuration's true mean log T from the budget's posterior
    (`budget.draw_means`, resampled by the chance of the runs stopped before the target),
    completes each stopped run above where it stopped, then takes the looks
    (`_looks`). None before the baseline has a run that crossed."""
    seen = [budget.observed(e) or ([], []) for e in entries]
    if not seen[0][0] or len(seen) < 2:
        return None
    s, _ = budget.spread(entries, prior_sd)
    unit = statistics.median(seen[0][0])
    seen = [([x - unit for x in c], [x - unit for x in b]) for c, b in seen]
    crossed_c = [(statistics.fmean(c), len(c)) for c, _ in seen[1:] if c]
    rng = random.Random(seed)
    cdf = statistics.NormalDist().cdf
    draws, weights = [], []
    for _ in range(SIMULATIONS):
        mu = budget.draw_means(seen, crossed_c, s, rng)
        draws.append(mu)
        weights.append(math.prod(cdf((mu[i] - b) / s) for i, (_, bounds) in enumerate(seen)
                                 for b in bounds))
    if not sum(weights):
        return None
    costs = []
    for mu in rng.choices(draws, weights=weights, k=SIMULATIONS):
        runs = [c + [_above(rng, mu[i], s, b) for b in bounds]
                for i, (c, bounds) in enumerate(seen[1:], start=1)]
        costs.append(_looks(rng, mu, list(seen[0][0]), runs, s, spent, cap, sure_within))
    return statistics.median(costs)


def _above(rng: random.Random, mean: float, s: float, bound: float) -> float:
    """A draw of N(mean, s^2) above `bound` (a run stopped there, completed)."""
    dist = statistics.NormalDist(mean, s)
    low = min(dist.cdf(bound), 1 - 1e-12)
    return max(bound, dist.inv_cdf(low + (1 - low) * rng.random()))


def forecast(*, baseline_runs: int, candidates: int, confirm: int, log_times: list[float],
             prior_sd: float, alpha: float, max_slower: float, budgeted: bool,
             cap: float | None = None, sure_within: float = 0.5) -> dict:
    """The forecast after the baseline's `baseline_runs` (their log T: `log_times`), with
    `candidates` screening trials and `confirm` confirmation seeds to come; `cap`: a
    sequential decision's cap in baseline runs, forecast whole (stopping at
    `sure_within`, profile.budget_sure_within)."""
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
                           cap=cap, sure_within=sure_within) if cap and candidates else None
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
