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
"""

from __future__ import annotations

import math
import statistics

from rlbatch.analysis import seedstats
from rlbatch.profile.budget import PRIOR_TAU

SAVINGS = (1.2, 1.5, 2.0)  # the savings whose cost to establish is printed
BUDGETS = (2, 4, 8)
POWER = 0.8


def candidate_cost(s: float) -> float:
    """E[min(T_cand / T_base, 1)] for a candidate not yet seen (module text)."""
    v = PRIOR_TAU ** 2 + 2 * s * s
    return 0.5 + math.exp(v / 2) * statistics.NormalDist().cdf(-math.sqrt(v))


def forecast(*, baseline_runs: int, candidates: int, confirm: int, log_times: list[float],
             prior_sd: float, alpha: float, max_slower: float, budgeted: bool) -> dict:
    """The forecast after the baseline's `baseline_runs` (their log T: `log_times`), with
    `candidates` screening trials and `confirm` confirmation seeds to come."""
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
    return {"look_runs": None if budgeted else look, "look_most_runs": None if budgeted
            else most, "sd_log_time": s, "sd_from": "baseline" if n >= 3 else "assumed",
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
    lead = "  at" if out else "forecast: at"  # within a budget there is no look to forecast
    out.append(f"{lead} the {sd}, establishing a saving takes {est}")
    out.append("  --budget " + "; ".join(
        f"{b['budget']}: {b['seeds_per_side']} seed(s) per side of the likeliest best, "
        f"finds a T ratio of {b['finds_ratio']:.2f} or less 80% of the time"
        for b in f["budgets"]))
    return out
