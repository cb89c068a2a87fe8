"""A bank's truth and a replay's score (`rlbatch replay`; docs/analysis.md, "Replays" and
"The information floor"): every configuration's time ratio against the baseline from all
of the bank's seeds, the best configuration a decision may pick, same-seed pairing, the
information floor; and how a strategy's replicates score against it, beside the two
reference rows (always keep the baseline; one seed of each configuration, lowest T)."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from rlbatch.core.config import Config
from rlbatch.profile.bank import Bank, BankRun, describe

WITHIN = 1.05  # a pick "within 5%" of the best: its true T at most 1.05 x the best's
# the error rates the floor is computed for: a pick not within 5% of the best at most 10%
# of the time, a recommendation no faster than the baseline at most the decision's alpha
FLOOR_WRONG = 0.10


# ---- the truth of a bank -------------------------------------------------------------------

def bank_truth(cfg: Config, bank: Bank, keys: list[tuple]) -> dict:
    """Every configuration's time ratio against the baseline from all of the bank's seeds
    (the analysis `rlbatch analyze` runs, at the bank's evaluation cadence), and the best."""
    from rlbatch.analysis.analyze import analyze
    from rlbatch.profile.driver import target_of

    base = bank.runs[keys[0]]
    dirs = [r.dir for k in keys for r in bank.runs[k].values()]
    doc = analyze(dirs, target_of(cfg), reference_run=str(base[min(base)].dir),
                  margin=cfg.profile.margin, statistic=cfg.profile.statistic,
                  spread=cfg.profile.spread)
    by_run = {}
    for e in doc["configs"]:
        for r in e["runs"]:
            by_run[str(Path(r["run"]).resolve())] = e
    rows = []
    ref = by_run[str(next(iter(base.values())).dir.resolve())]
    for k in keys:
        e = by_run[str(next(iter(bank.runs[k].values())).dir.resolve())]
        vs = e.get("vs_reference") or {}
        ratio = 1.0 if k == keys[0] else vs.get("time_ratio")
        times = [_run_time(r) for r in bank.runs[k].values()]
        rows.append({"key": k, "config": describe(k), "sequences_per_step": e["sequences_per_step"],
                     "lr": e["lr"], "seeds": len(bank.runs[k]),
                     "crossed": sum(t is not None for t in times),
                     "time_ratio": ratio,
                     "time_ratio_ci": [1.0, 1.0] if k == keys[0] else vs.get("time_ratio_ci"),
                     "samples_ratio": 1.0 if k == keys[0] else vs.get("samples_ratio"),
                     "throughput_ratio": 1.0 if k == keys[0] else vs.get("throughput_ratio"),
                     "verdict": e["verdict"],
                     # a decision picks among the reference's LR-scaling family only
                     "in_family": e["algorithm"] == ref["algorithm"]
                     and e["lr_scaling"] == ref["lr_scaling"],
                     "mean_time_s": statistics.fmean(t for t in times if t is not None)
                     if any(t is not None for t in times) else None,
                     "sd_log_time": statistics.stdev(math.log(t) for t in times if t is not None)
                     if sum(t is not None for t in times) >= 2 else None})
    finite = [r for r in rows if r["time_ratio"] is not None and r["crossed"] * 2 > r["seeds"]]
    # the method's own admission, with every seed: a configuration whose curve departs
    # from the baseline's is not a right pick however fast (docs/design.md, Method)
    admitted = [r for r in finite if r["verdict"] != "departed"]
    best = min(admitted, key=lambda r: r["time_ratio"])
    fastest = min(finite, key=lambda r: r["time_ratio"])
    base_times = [t for t in (_run_time(r) for r in base.values()) if t is not None]
    unit = math.exp(statistics.fmean(math.log(t) for t in base_times))
    return {"configs": rows, "floor": bank_floor(rows, unit), "best": best["key"], "best_time_ratio": best["time_ratio"],
            "best_sequences": best["sequences_per_step"],
            "fastest": fastest["key"], "fastest_time_ratio": fastest["time_ratio"],
            "departed": [r["key"] for r in rows if r["verdict"] == "departed"],
            "baseline_time_to_target_s": unit, "analysis": doc}


def pooled_sd(rows: list[dict]) -> float | None:
    """The spread of log T within a configuration, pooled over the bank's configurations
    (each weighted by its seeds that crossed, less one)."""
    parts = [(r["sd_log_time"], r["crossed"] - 1) for r in rows if r["sd_log_time"] is not None]
    dof = sum(d for _, d in parts)
    return math.sqrt(sum(sd * sd * d for sd, d in parts) / dof) if dof else None


def bank_floor(rows: list[dict], unit: float) -> dict | None:
    """The information floor (profile/floor.py) of the bank's truth: the configurations'
    geometric-mean T ratios, each run costing its configuration's mean T, the spread pooled
    over the bank, the error rates FLOOR_WRONG and the decision's alpha. In units of
    the baseline's T, as every cost of a replay. None where a family member never crossed."""
    from rlbatch.analysis.selection import DEFAULT_ALPHA
    from rlbatch.profile.floor import information_floor

    sd = pooled_sd(rows)
    use = [r for r in rows if r["time_ratio"] is not None and r["mean_time_s"] is not None]
    if sd is None or len(use) < 2 or use[0] is not rows[0] or any(
            r["in_family"] and r["time_ratio"] is None for r in rows):
        return None
    eligible = [r["in_family"] and r["verdict"] != "departed" for r in use]
    f = information_floor([math.log(r["time_ratio"]) for r in use],
                          [r["mean_time_s"] / unit for r in use], eligible, sd,
                          p_right=1 - FLOOR_WRONG, p_false=DEFAULT_ALPHA)
    return {"cost": f.cost, "sd_log_time": sd, "p_within_5pct": 1 - FLOOR_WRONG,
            "p_false_recommendation": DEFAULT_ALPHA,
            "right_answers": [use[i]["config"] for i in f.right],
            "runs": {r["config"]: n for r, n in zip(use, f.runs) if n > 1e-9},
            "binding": [{"made_best": use[b["made_best"]]["config"],
                         "kind": "a false recommendation" if b["margin"] == 0
                         else "a pick not within 5%", "error_rate": b["error_rate"]}
                        for b in f.binding]}


def pairing(bank: Bank, keys: list[tuple]) -> list[dict]:
    """Same-seed pairs of each configuration with the baseline (the same prompt stream):
    the correlation of log N* and of log T across seeds where both crossed, and the sd of
    the per-seed log T ratio against that of unpaired differences (sqrt(sd_a^2 + sd_b^2)).
    `seed_factor` = (paired variance) / (unpaired variance): the share of seeds a paired
    comparison needs for the same precision (below 1: pairing pays)."""
    base = bank.runs[keys[0]]
    out = []
    for k in keys[1:]:
        seeds = [s for s in bank.common_seeds([keys[0], k])
                 if base[s].crossing and bank.runs[k][s].crossing]
        row = {"config": describe(k), "pairs": len(seeds)}
        if len(seeds) >= 3:
            nb, nc = _logs(base, seeds, "samples"), _logs(bank.runs[k], seeds, "samples")
            tb, tc = _logs(base, seeds, "train_s"), _logs(bank.runs[k], seeds, "train_s")
            diff = [c - b for b, c in zip(tb, tc)]
            unpaired = statistics.variance(tb) + statistics.variance(tc)
            row.update(corr_log_nstar=_corr(nb, nc), corr_log_time=_corr(tb, tc),
                       sd_paired_log_time_ratio=statistics.stdev(diff),
                       sd_unpaired_log_time_ratio=math.sqrt(unpaired),
                       seed_factor=statistics.variance(diff) / unpaired if unpaired else None)
        out.append(row)
    return out


def _logs(runs: dict[int, BankRun], seeds: list[int], what: str) -> list[float]:
    return [math.log(runs[s].crossing[what]) for s in seeds]


def _corr(a: list[float], b: list[float]) -> float | None:
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:  # a constant series
        return None


def _run_time(run: BankRun) -> float | None:
    """A bank run's time to target at its own cadence (None when it never crossed)."""
    return _crossing(run, lambda s: s["train_s"])


def _crossing(run: BankRun, what) -> float | None:
    return None if run.crossing is None else what(run.crossing)


def _first_crossing(run: BankRun, cfg: Config) -> dict | None:
    t = cfg.target
    rows = [run.evals[k] for k in sorted(run.evals)]
    if not rows:
        return None
    threshold = t.value
    if threshold is None:
        v0 = rows[0].get(t.metric)
        threshold = None if v0 is None or rows[0]["step"] != 0 else v0 + t.gain
    if threshold is None:
        return None
    for r in rows:
        v = r.get(t.metric)
        if isinstance(v, (int, float)) and math.isfinite(v) and v >= threshold:
            return r
    return None


def attach_crossings(bank: Bank, cfg: Config) -> None:
    for runs in bank.runs.values():
        for r in runs.values():
            r.crossing = _first_crossing(r, cfg)


@dataclass
class Outcome:
    """One replicate: what it picked (a learning key; the baseline when it kept it or
    decided nothing), the interval it printed for the pick, its cost, how many times it
    followed `next`, and whether the bank ran out before `next` could be followed."""

    pick: tuple
    recommends: bool
    interval: list | None
    cost_s: float
    follows: int
    unserved: int = 0
    cut: str | None = None
    problem: str | None = None
    evidence: str | None = None
    point: float | None = None  # the pick's printed T ratio
    p_within: float | None = None  # within a budget: the pick's printed P(within 5%)
    p_slower: float | None = None  # ... and P(slower than the baseline)
    forecast: float | None = None  # the first look's forecast of its cost (baseline runs)
    first_look: float | None = None  # what the first look cost, in the same unit
    after_first: float | None = None  # a sequential decision's forecast from its first look


def score(outcomes: list[Outcome], truth: dict, strategy: str) -> dict:
    ratio = {r["key"]: r["time_ratio"] for r in truth["configs"]}
    best = truth["best_time_ratio"]

    def true_ratio(key):
        r = ratio.get(key)
        return math.inf if r is None else r

    n = len(outcomes)
    regrets = [true_ratio(o.pick) / best - 1 for o in outcomes]
    recs = [o for o in outcomes if o.recommends]
    covered = [o for o in recs if o.interval and None not in o.interval
               and ratio.get(o.pick) is not None
               and o.interval[0] <= ratio[o.pick] <= o.interval[1]]
    with_ci = [o for o in recs if o.interval and None not in o.interval]
    unit = truth["baseline_time_to_target_s"]
    return {"strategy": strategy, "replicates": n,
            "recommends": len(recs) / n,
            "picks_within_5pct": sum(true_ratio(o.pick) <= WITHIN * best for o in outcomes) / n,
            "mean_regret": statistics.fmean(regrets) if all(map(math.isfinite, regrets))
            else math.inf,
            "slower_than_baseline": sum(true_ratio(o.pick) > 1.0 for o in recs) / n,
            "picks_departed": sum(o.pick in truth["departed"] for o in recs) / n,
            "median_cost": statistics.median(o.cost_s / unit for o in outcomes),
            "mean_cost": statistics.fmean(o.cost_s / unit for o in outcomes),
            "pick_interval_coverage": len(covered) / len(with_ci) if with_ci else None,
            "recommendations_with_interval": len(with_ci),
            "followed_next": sum(o.follows for o in outcomes) / n,
            "cut_by_bank": sum(o.cut is not None for o in outcomes),
            "unserved_evaluations": sum(o.unserved for o in outcomes),
            "no_decision": sum(o.problem is not None for o in outcomes),
            "pick_log_bias": pick_log_bias(recs, ratio),
            **calibration(outcomes, true_ratio, truth["fastest_time_ratio"]),
            **forecast_score(outcomes)}


def forecast_score(outcomes: list[Outcome]) -> dict:
    """The first look's forecast against what it cost (each in the replicate's own baseline
    runs): medians of both and of their ratio; for a sequential decision, also the forecast
    its first look made from its own runs (`after_first_look`). {} where no replicate
    forecast a cost."""
    pairs = [(o.forecast, o.first_look) for o in outcomes if o.forecast and o.first_look]
    if not pairs:
        return {}
    out = {"replicates": len(pairs),
           "median_forecast_runs": statistics.median(f for f, _ in pairs),
           "median_first_look_runs": statistics.median(c for _, c in pairs),
           "median_ratio": statistics.median(f / c for f, c in pairs)}
    later = [(o.after_first, o.first_look) for o in outcomes if o.after_first and o.first_look]
    if later:  # a sequential decision's second forecast, from its first look's runs, where
        # the decision went on: against what the whole decision cost
        out["after_first_look"] = {
            "replicates": len(later),
            "median_forecast_runs": statistics.median(f for f, _ in later),
            "median_cost_runs": statistics.median(c for _, c in later),
            "median_ratio": statistics.median(f / c for f, c in later)}
    return {"forecast": out}


BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def calibration(outcomes: list[Outcome], true_ratio, fastest: float) -> dict:
    """Within a budget: the printed probabilities against how often they came true, in
    bins of the printed value (each: replicates, mean printed probability, frequency). P(within
    5% of the fastest) over every pick, against the bank's fastest configuration (a departed
    one included, as the budget's pool does: profile/budget.py); P(slower than the baseline)
    over the picks that are not the baseline. {} when no replicate printed a probability."""
    within = [(o.p_within, true_ratio(o.pick) <= WITHIN * fastest) for o in outcomes
              if o.p_within is not None]
    slower = [(o.p_slower, true_ratio(o.pick) > 1.0) for o in outcomes
              if o.p_slower is not None and o.recommends]
    if not within:
        return {}
    return {"calibration": {"p_within_5pct": _bins(within),
                            "p_slower_than_baseline": _bins(slower)}}


def _bins(pairs: list[tuple[float, bool]]) -> list[dict]:
    out = []
    for lo, hi in itertools.pairwise(BINS):
        got = [(p, hit) for p, hit in pairs if lo <= p < hi or (hi == 1.0 and p == 1.0)]
        if got:
            out.append({"bin": [lo, hi], "replicates": len(got),
                        "mean_printed": statistics.fmean(p for p, _ in got),
                        "frequency": sum(hit for _, hit in got) / len(got)})
    return out


def pick_log_bias(recs: list[Outcome], ratio: dict) -> float | None:
    """How far the recommended picks' printed T ratios lie from the bank's truth: the mean
    of log(printed / true) (negative: the pick looks faster than it is, as a pick chosen and
    stopped on its luckier draws does). None without a recommendation."""
    logs = [math.log(o.point / ratio[o.pick]) for o in recs
            if o.point and ratio.get(o.pick)]
    return statistics.fmean(logs) if logs else None


def reference_rows(truth: dict, bank: Bank, keys: list[tuple], replicates: int,
                   rng: random.Random, budget: float | None = None) -> list[dict]:
    """"always keep the baseline", and one seed per configuration with the lowest T picked
    (each run to its target; a run that never crosses counts its whole training time).
    With `budget` (baseline runs), a third row: the same grid within that budget: runs in
    the profile's order (the baseline first: its time is the unit) while the budget pays for
    each whole; a run it cannot pay for is cut and not compared."""
    best = truth["best_time_ratio"]
    keep = {"strategy": "keep_baseline", "replicates": replicates, "recommends": 0.0,
            "picks_within_5pct": float(1.0 <= WITHIN * best), "mean_regret": 1.0 / best - 1,
            "slower_than_baseline": 0.0, "picks_departed": 0.0, "median_cost": 0.0,
            "mean_cost": 0.0,
            "pick_interval_coverage": None}
    rows = [keep, grid_within(truth, bank, keys, replicates, rng)]
    if budget is not None:
        rows.append(grid_within(truth, bank, keys, replicates, rng, budget))
    return rows


def grid_within(truth: dict, bank: Bank, keys: list[tuple], replicates: int,
                rng: random.Random, budget: float | None = None, margin: float = 1.0) -> dict:
    """The one-seed grid (reference_rows), within `budget` baseline runs when given; with
    `margin` < 1, a candidate is picked only when its T is below margin x the baseline's
    (bench/budget_frontier.py)."""
    ratio = {r["key"]: r["time_ratio"] for r in truth["configs"]}
    best, unit = truth["best_time_ratio"], truth["baseline_time_to_target_s"]
    seeds = bank.common_seeds(keys)
    picks, costs = [], []
    for _ in range(replicates):
        s = rng.choice(seeds)
        times, cost, limit = {}, 0.0, None
        for k in keys:
            run = bank.runs[k][s]
            t = _run_time(run)
            whole = run.steps[-1]["train_s"] if t is None else t
            if limit is None:  # the baseline's run sets the unit
                limit = math.inf if budget is None else budget * whole
            if cost + whole > limit:
                cost = limit
                break
            cost += whole
            times[k] = math.inf if t is None else t
        low = min(times, key=lambda k: (times[k], keys.index(k)))
        picks.append(low if times[low] < margin * times[keys[0]] or low == keys[0]
                     else keys[0])
        costs.append(cost / unit)
    tr = [math.inf if ratio.get(k) is None else ratio[k] for k in picks]
    name = "one_seed_grid" if budget is None else f"one_seed_grid_budget_{budget:g}"
    return {"strategy": name, "replicates": replicates,
            "recommends": sum(k != keys[0] for k in picks) / replicates,
            "picks_within_5pct": sum(r <= WITHIN * best for r in tr) / replicates,
            "mean_regret": statistics.fmean(r / best - 1 for r in tr),
            "slower_than_baseline": sum(r > 1.0 for k, r in zip(picks, tr) if k != keys[0])
            / replicates,
            "picks_departed": sum(k in truth["departed"] for k in picks) / replicates,
            "median_cost": statistics.median(costs), "mean_cost": statistics.fmean(costs),
            "pick_interval_coverage": None}
