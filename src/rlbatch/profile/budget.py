"""A profile within a budget (`rlbatch profile --budget N`; docs/analysis.md, "A budget";
docs/design.md, "profile/budget.py and profile/forecast.py").

The budget is N baseline runs' time to target (the median of the baseline's runs, the unit
of the profile's cost) or a number of training seconds. The first look is the one-seed
grid (candidates stopped by the futility rule); each later look adds one seed to the
baseline and to the candidate most likely to be the fastest while the budget pays for
both; `Guard` refuses to start a trial, and stops a running one (stop code
`profile_budget`), once the trials have spent it.

The answer is a pick with the chance that it is slower than the baseline, from a posterior
of each configuration's mean log T (`probabilities`: a flat prior for the baseline's, a
common normal prior for the candidates', one run-to-run spread, runs stopped before the
target as bounds). The pick is the likeliest within 5% of the fastest unless it is more
than `profile.budget_max_slower` likely slower than the baseline; a candidate shown faster
by the decision rule is the pick whatever the draws say. The replays check both
probabilities (`calibration` in `rlbatch replay --json`): P(slower) is printed, P(within
5%), overconfident on the banks, only orders the configurations (`lines`).
"""

from __future__ import annotations

import math
import random
import re
import statistics
from pathlib import Path

from rlbatch.analysis.labels import size_words
from rlbatch.core.errors import UserError

WITHIN = 1.05
DRAWS = 4000
PRIOR_DF = 4
SURE_SLOWER = 0.05  # a look is not followed once a candidate pick is at most this likely
# slower than the baseline and at least profile.budget_sure_within likely within 5% of the
# fastest, or once the baseline is at least SURE_BASELINE likely within 5% of the fastest
SURE_BASELINE = 0.9
BASE_RUNS = 2  # a candidate pick ends the looks only once the baseline has this many runs
# that crossed: one baseline run alone (slow on a loaded machine, say) would decide
CANNOT_PAY = "the budget cannot pay"  # next_look's reason when the cap refuses the look
OUT = ("too_easy", "diverged")  # verdicts the pick never takes
PRIOR_TAU = 0.3  # sd of the candidates' mean log T around their common mean
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> tuple[float | None, float | None]:
    """`--budget`: `4` (baseline runs' time to target) or `3600s`, `90m`, `2h` (training
    seconds); (runs, seconds), one of them None."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not m:
        raise UserError(f"--budget: {text!r} is neither a number of baseline runs (e.g. 4) "
                        "nor training time (e.g. 3600s, 90m, 2h)")
    value, unit = float(m.group(1)), m.group(2)
    if not unit:
        if value < 1:
            raise UserError(f"--budget: {value:g} baseline runs is less than the baseline's "
                            "first run, which every profile spends; give at least 1")
        return value, None
    if value <= 0:
        raise UserError(f"--budget: {text!r} is not a positive time")
    return None, value * UNITS[unit]


def limit_s(prof, base_time: float | None) -> float | None:
    """The budget in training seconds (None: no budget, or a budget in baseline runs before
    the baseline has a time to target)."""
    if prof.budget_seconds is not None:
        return prof.budget_seconds
    if prof.budget is None or not base_time:
        return None
    return prof.budget * base_time


def budgeted(prof) -> bool:
    return prof.budget is not None or prof.budget_seconds is not None


LOOKS = 1000  # within a budget, looks go on until the budget or the pick says stop


def follows(prof, follow: int) -> int:
    """How many times a profile follows its `next`: `follow` (--follow), or, within a
    budget, as often as the budget's looks ask (next_look)."""
    return LOOKS if budgeted(prof) else follow


class Guard:
    """The budget's hold on the driver: `admit` refuses to start a trial once the trials
    have spent the limit; `stop` (a driver stopper) stops a running one whose next step
    would take the spending past it (a trial honours a stop after the step it is in, so a
    profile ends within about one step of its budget). Spending is the training seconds of
    every run in `runs` (read again before each trial is admitted, and kept up to date from
    the stopper's own status rows in between) plus `fixed_s` (the decode sweep)."""

    def __init__(self, limit: float | None, runs: Path | None = None, fixed_s: float = 0.0):
        self.limit, self.runs, self.fixed = limit, runs, fixed_s
        self.seen: dict[str, float] = {}
        self.refresh()

    def refresh(self) -> None:
        from rlbatch.core.runlog import read_json

        if self.runs is not None and self.runs.is_dir():
            for d in sorted(self.runs.iterdir()):
                self.seen[d.name] = read_json(d / "summary.json").get("train_s") or 0.0

    def spent(self) -> float:
        return self.fixed + sum(self.seen.values())

    def admit(self, trial) -> bool:
        if self.limit is None:
            return True
        self.refresh()
        return self.spent() < self.limit

    def stop(self, st: dict) -> str | None:
        self.seen[Path(st["run_dir"]).name] = st["train_s"]
        if self.limit is None or st["target"].get("reached"):
            return None
        step = st["train_s"] * st["B"] / st["samples"] if st.get("samples") else 0.0
        if self.spent() + step < self.limit:
            return None
        return (f"profile_budget: the profile has spent {self.spent():,.1f} of its budget of "
                f"{self.limit:,.1f} training seconds")


# ---- the pick and its probabilities ---------------------------------------------------------

def pool(result: dict) -> list[dict]:
    """The configurations a budget's pick may be: the reference's algorithm (the fixed-LR
    control included, and a configuration whose curve departs: a budget's pick is the one
    that reaches the target soonest), none of whose runs diverged or met the target at
    once, with at least one run that crossed or was stopped; the reference first."""
    entries = result["configs"]
    ref = next(e for e in entries if e["config"] == result["reference"]["config"])
    rest = [e for e in entries if e is not ref and e["algorithm"] == ref["algorithm"]
            and e["verdict"] not in OUT and observed(e)]
    return [ref] + rest


def observed(e: dict) -> tuple[list[float], list[float]]:
    """(log T of the runs that crossed, log of the training time of those that ended
    without crossing: each a bound below its T)."""
    crossed = [math.log(r["time_to_target"]) for r in e["runs"]
               if not r["censored"] and r.get("time_to_target")]
    bounds = [math.log(r["last_train_s"]) for r in e["runs"]
              if r["censored"] and r.get("last_train_s")]
    return (crossed, bounds) if crossed or bounds else ()


def spread(entries: list[dict], prior_sd: float) -> tuple[float, int]:
    """The run-to-run sd of log T: the prior (prior_sd, PRIOR_DF) updated by the spread of
    each configuration with two or more runs that crossed; (sd, its degrees of freedom)."""
    ss, df = PRIOR_DF * prior_sd ** 2, PRIOR_DF
    for e in entries:
        logs = observed(e)[0]
        if len(logs) >= 2:
            ss += statistics.variance(logs) * (len(logs) - 1)
            df += len(logs) - 1
    return math.sqrt(ss / df), df


def probabilities(result: dict, prior_sd: float, seed: int = 0) -> dict:
    """Per configuration of `pool`: P(within 5% of the fastest of the pool), P(slower than
    the baseline), P(the fastest); the spread used and its degrees of freedom.

    The baseline's mean log T has a flat prior; the candidates' are drawn from one normal
    around a common mean (flat) with sd PRIOR_TAU, so that the luckiest of several
    candidates seen once is not taken at its face value (the winner's curse of picking the
    lowest of noisy times). Given the spread s, each candidate's mean is drawn from its
    conjugate posterior: the common mean m from N(sum w y / sum w, 1 / sum w) with
    w = 1 / (PRIOR_TAU^2 + s^2 / n), then the mean from its runs' mean y (n runs that
    crossed) shrunk towards m. A run that ended without crossing weighs each draw by the
    chance that its T lies past where it ended (importance weights); a candidate none of
    whose runs crossed is drawn from N(m, PRIOR_TAU^2) and weighed so."""
    entries = pool(result)
    sd, df = spread(entries, prior_sd)
    seen = [observed(e) for e in entries]
    crossed_c = [(statistics.fmean(c), len(c)) for c, _ in seen[1:] if c]
    rng = random.Random(seed)
    norm = statistics.NormalDist()
    k = len(entries)
    within, slower, best = [0.0] * k, [0.0] * k, [0.0] * k
    total = 0.0
    for _ in range(DRAWS):
        s = sd * math.sqrt(df / rng.gammavariate(df / 2, 2))  # sd ~ its scaled-inv-chi2
        mu = draw_means(seen, crossed_c, s, rng)
        w = 1.0
        for i, (_, bounds) in enumerate(seen):
            for b in bounds:
                w *= norm.cdf((mu[i] - b) / s)
        low = min(mu)
        total += w
        for i, x in enumerate(mu):
            within[i] += w * (x <= low + math.log(WITHIN))
            slower[i] += w * (x > mu[0])
            best[i] += w * (x == low)
    return {"sd_log_time": sd, "sd_df": df, "prior_sd": prior_sd, "prior_tau": PRIOR_TAU,
            "draws": DRAWS,
            "configs": [{"config": e["config"], "sequences_per_step": e["sequences_per_step"],
                         "lr": e["lr"], "staleness": e.get("staleness") or 0,
                         "runs": e["seeds"], "crossed": len(seen[i][0]),
                         "time_ratio": e["time_to_target"] / entries[0]["time_to_target"]
                         if e["time_to_target"] else None,
                         "p_within_5pct": within[i] / total,
                         "p_slower_than_baseline": None if i == 0 else slower[i] / total,
                         "p_best": best[i] / total}
                        for i, e in enumerate(entries)]}


def draw_means(seen: list, crossed_c: list, s: float, rng: random.Random) -> list[float]:
    """One draw of every configuration's mean log T at spread s (`probabilities`;
    `crossed_c`: (mean log T, runs that crossed) of each candidate with a crossing): the
    baseline's around its runs' mean, the candidates' common mean m from those that
    crossed, each candidate's mean shrunk towards m (or drawn around m if none crossed)."""
    tau2 = PRIOR_TAU ** 2
    base = seen[0][0]
    k = len(seen)
    mu = [statistics.fmean(base) + rng.gauss(0.0, s / math.sqrt(len(base)))] + [0.0] * (k - 1)
    weights = [1 / (tau2 + s * s / n) for _, n in crossed_c]
    if weights:  # the candidates' common mean, from those that crossed
        m = sum(w * y for w, (y, _) in zip(weights, crossed_c, strict=True)) / \
            sum(weights) + rng.gauss(0.0, 1 / math.sqrt(sum(weights)))
    else:  # none crossed: around the baseline's, as wide as the prior
        m = mu[0] + rng.gauss(0.0, PRIOR_TAU)
    for i in range(1, k):
        crossed = seen[i][0]
        if crossed:
            prec = len(crossed) / (s * s) + 1 / tau2
            centre = (statistics.fmean(crossed) * len(crossed) / (s * s) + m / tau2) / prec
            mu[i] = centre + rng.gauss(0.0, 1 / math.sqrt(prec))
        else:
            mu[i] = m + rng.gauss(0.0, PRIOR_TAU)
    return mu


def pick(result: dict, probs: dict, max_slower: float,
         sequential: bool = False) -> tuple[dict, str]:
    """The budget's pick among `probs["configs"]` and why, in words. `sequential`: the
    draws alone decide (the decision rule's `established`, a test at alpha at each look,
    would add its error at every look)."""
    rows = probs["configs"]
    base = rows[0]
    rec = result.get("recommendation") or {}
    if rec.get("evidence") == "established" and not sequential:
        row = next((r for r in rows if r["config"] == rec["config"]), None)
        if row is not None:
            return row, "shown faster than the baseline (evidence established)"
    top = max(rows, key=lambda r: (r["p_within_5pct"], r is base))
    if top is base:
        return base, "the baseline is the configuration most likely within 5% of the fastest"
    if top["p_slower_than_baseline"] > max_slower:
        bound = ("the sequential decision's bound" if sequential
                 else "profile.budget_max_slower")
        return base, (f"the likeliest fastest, {size_words(top)}, is slower than "
                      f"the baseline with probability {top['p_slower_than_baseline']:.2f}, "
                      f"above {bound} {max_slower:g}")
    return top, "the configuration most likely within 5% of the fastest"


def next_look(result: dict, probs: dict, chosen: dict, *, seeds: int, spent: float,
              limit: float | None, sure_within: float = 0.5
              ) -> tuple[dict | None, str, str | None]:
    """({"profile.seeds": n} for the next look, or None; why in words; its challenger):
    one more seed of the configurations whose question is open (`look_configs`), at the
    seeds the look needs to bring each to `seeds` + 1, when their projected cost fits in
    what is left."""
    rows = probs["configs"]
    if not rows[1:]:
        return None, "no candidate is left to compare", None
    slower = chosen.get("p_slower_than_baseline")
    need = SURE_BASELINE if slower is None else sure_within
    if chosen["p_within_5pct"] >= need and (slower is None or (
            slower <= SURE_SLOWER and rows[0]["crossed"] >= BASE_RUNS)):
        return None, (f"sure enough: P(within 5%) {chosen['p_within_5pct']:.2f} >= "
                      f"{need:g}" + ("" if slower is None else
                                          f", P(slower) {slower:.2f} <= {SURE_SLOWER}")), None
    if limit is None:
        return None, "no budget", None
    looked = look_configs(probs, chosen)
    want = seeds + 1
    cost = look_cost(result, probs, looked, want)
    names = " and ".join("the baseline" if r is rows[0] else size_words(r) for r in looked)
    if spent + cost > limit:
        return None, (f"{CANNOT_PAY} for another seed of {names} (projected "
                      f"{cost:,.1f} s, {max(0.0, limit - spent):,.1f} s left)"), None
    rival = next(r for r in looked if r is not rows[0])
    return {"profile.seeds": want}, (f"one more seed of {names} (projected {cost:,.1f} s of "
                                     f"the {limit - spent:,.1f} s left)"), rival["config"]


def look_cost(result: dict, probs: dict, looked: list[dict], want: int) -> float:
    """Projected training seconds to bring each configuration of `looked` to `want` seeds,
    each seed at its configuration's time to target (a configuration none of whose runs
    crossed: at most the baseline's)."""
    by = {e["config"]: e for e in result["configs"]}
    base = by[probs["configs"][0]["config"]]
    return sum(max(0, want - by[r["config"]]["seeds"])
               * (by[r["config"]]["time_to_target"] or base["time_to_target"])
               for r in looked)


def look_configs(probs: dict, chosen: dict) -> list[dict]:
    """The configurations the next look runs (rows of `probs`, the baseline first where it
    runs): while the pick is a candidate not yet sure to be faster than the baseline (or is
    the baseline), the baseline and the likeliest candidate; once a candidate pick is at
    most SURE_SLOWER likely slower (and the baseline has BASE_RUNS runs that crossed), what
    is open is whether it is within 5% of the fastest, so the pick and its likeliest rival
    among the other candidates (a top-two allocation:
    Russo, "Simple Bayesian algorithms for best-arm identification", Operations Research
    68, 2020), and the baseline rests."""
    rows = probs["configs"]
    base, others = rows[0], rows[1:]
    slower = chosen.get("p_slower_than_baseline")
    rivals = [r for r in others if r is not chosen]
    if (chosen is not base and slower is not None and slower <= SURE_SLOWER and rivals
            and base["crossed"] >= BASE_RUNS):
        return [chosen, max(rivals, key=lambda r: r["p_within_5pct"])]
    return [base, chosen if chosen is not base
            else max(others, key=lambda r: r["p_within_5pct"])]


def block(result: dict | None, prof, *, spent: float, base_time: float | None) -> dict | None:
    """profile.json's `decision.budget`: the pick, the probabilities, what was spent and the
    next look (`next_set`, `challenger`), or None without a budget or an analysis."""
    if not budgeted(prof) or not result or not result.get("recommendation"):
        return None
    probs = probabilities(result, prof.futility_sd)
    chosen, why = pick(result, probs, SURE_SLOWER if prof.sequential
                       else prof.budget_max_slower, prof.sequential)
    lim = limit_s(prof, base_time)
    sets, look_why, rival = next_look(result, probs, chosen, seeds=prof.seeds, spent=spent,
                                      limit=lim, sure_within=prof.budget_sure_within)
    looked = look_configs(probs, chosen) if sets else []
    paying = None  # the budget, in training seconds, that pays for the look the cap refused
    if not sets and look_why.startswith(CANNOT_PAY) and base_time:
        paying = spent + look_cost(result, probs, look_configs(probs, chosen), prof.seeds + 1)
    return {"budget_runs": prof.budget, "budget_seconds": prof.budget_seconds,
            "sequential": prof.sequential,
            "limit_s": lim, "spent_s": spent,
            "spent_runs": spent / base_time if base_time else None,
            "pick": chosen["config"], "pick_sequences_per_step": chosen["sequences_per_step"],
            "pick_lr": chosen["lr"], "pick_staleness": chosen.get("staleness", 0),
            "is_reference": chosen is probs["configs"][0],
            "why": why, "p_within_5pct": chosen["p_within_5pct"],
            "p_slower_than_baseline": chosen["p_slower_than_baseline"],
            "probabilities": probs, "next_set": sets, "challenger": rival,
            "look_configs": [r["config"] for r in looked if r is not probs["configs"][0]],
            "baseline_rests": bool(looked) and looked[0] is not probs["configs"][0],
            "next": look_why, "next_look_budget_s": paying,
            "next_look_budget_runs": paying / base_time if paying else None}


def lines(b: dict) -> list[str]:
    """The budget's pick in words. P(slower than the baseline) is printed: the replays find
    it calibrated within 0.1 pooled over the banks; the model's P(within 5% of the
    fastest) is not (overconfident on the banks: docs/analysis.md, "A budget"), so it
    orders the configurations and stays in the JSON without being printed as a chance."""
    unit = (f"{b['budget_runs']:g} baseline runs" if b["budget_runs"] is not None
            else f"{b['budget_seconds']:,.0f} training seconds")
    spent = (f"{b['spent_runs']:.2f} baseline runs" if b.get("spent_runs")
             else f"{b['spent_s']:,.1f} s")
    what = ("keep the baseline" if b["is_reference"] else
            f"B={b['pick_sequences_per_step']}, lr {b['pick_lr']:.3g}"
            + (f", staleness {b['pick_staleness']}" if b.get("pick_staleness") else ""))
    slower = b["p_slower_than_baseline"]
    out = [f"within the budget ({unit}; spent {spent}): {what} ({b['why']})"
           + ("" if slower is None else f"; P(slower than the baseline) {slower:.2f}")]
    p = b["probabilities"]
    ranked = sorted(enumerate(p["configs"]), key=lambda x: -x[1]["p_within_5pct"])
    out.append("  ranked, likeliest fastest first: " + "; ".join(
        _row(r, i == 0) for i, r in ranked)
        + f" (run-to-run sd of log T {p['sd_log_time']:.2f}: "
        + (f"{p['sd_df'] - PRIOR_DF} degrees of freedom from the runs, {PRIOR_DF} from the "
           "prior)" if p["sd_df"] > PRIOR_DF else "the prior's, no configuration has two "
           "crossings yet)"))
    out.append(f"  next: {b['next']}")
    if b.get("forecast_runs") is not None:
        out.append(f"  forecast: from these runs, this decision costs about "
                   f"{b['forecast_runs']:.1f} baseline runs in all, at most "
                   f"{b['limit_s'] / b['spent_s'] * b['spent_runs']:.0f} (its cap)")
    return out


def _row(r: dict, is_base: bool) -> str:
    name = "baseline" if is_base else f"{size_words(r)} lr {r['lr']:.3g}"
    ratio = "none crossed" if r["time_ratio"] is None else f"T ratio {r['time_ratio']:.2f}"
    slower = r["p_slower_than_baseline"]
    return (f"{name} ({r['runs']} run{'s' if r['runs'] != 1 else ''}, {ratio}"
            + ("" if slower is None else f", P(slower) {slower:.2f}") + ")")
