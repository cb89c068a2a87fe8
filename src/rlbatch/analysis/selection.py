"""Verdicts per configuration, the decision rule and the recommendation.

Decision rule (docs/design.md, Method; docs/analysis.md, "The decision"): T = N*/q with q
measured over the same span as N* (stats.py), so a candidate beats the baseline exactly when
q_cand/q_base > N*_cand/N*_base; both ratios and T_cand/T_base are reported with their
intervals. Each configuration gets one verdict (`reference`, `too_easy`, `slower`,
`diverged`, `unconfirmed`, `aligned`, `departed`, `fewer_samples`, `inconclusive`). The recommendation,
from the reference's LR-scaling family only, is the lowest-T candidate whose advantage is
shown (Holm's step-down over the family), else the reference; `evidence`, `next` and `plan`
say how strong the case is and what to run next. What each verdict means and the rule in
full: docs/design.md, "Module notes". No torch import.
"""

from __future__ import annotations

import math

from rlbatch.analysis import invariance, seedstats
from rlbatch.analysis.defaults import DEFAULT_CI
from rlbatch.analysis.labels import size_words
from rlbatch.analysis.stats import finite_or_none

MIN_SEEDS = 2
DEFAULT_ALPHA = 0.05
POWER = 0.8
RULE = ("lowest T = N*/q among configurations of the reference's LR-scaling family that are "
        "not shown to need more samples beyond the margin and whose T advantage is shown "
        "(one-sided confidence above 1 - alpha/m, Holm over the m candidates), none of whose "
        "runs diverged; otherwise keep the "
        "reference")
REJECTED = ("departed", "slower", "too_easy", "diverged", "reference")
STATISTIC = ("crossing: N* is each run's first crossing of the target (docs/analysis.md, "
             "'Which statistic')")
COMPARISON = ("unpaired: each configuration's seeds are independent samples (same-seed runs "
              "of two configurations are not matched; docs/analysis.md, 'Replays')")


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return finite_or_none(num / den)


def config_verdict(entry: dict, ref: dict, log_lo: float, log_hi: float, margin: float) -> dict:
    """{"verdict", "indication"} of a non-reference configuration (see the module text)."""
    runs = entry["runs"]
    indication = invariance.verdict(log_lo, log_hi, margin)
    if any(r.get("too_easy") for r in runs):
        return {"verdict": "too_easy", "indication": None}
    if any(r.get("status") == "diverged" for r in runs):  # never a late crossing
        return {"verdict": "diverged", "indication": indication}
    stopped = [r for r in runs if r.get("stop_code") == "cannot_win" and r["censored"]]
    if 2 * len(stopped) >= len(runs):
        return {"verdict": "slower", "indication": None}
    if entry["seeds"] < MIN_SEEDS or ref["seeds"] < MIN_SEEDS:
        return {"verdict": "unconfirmed", "indication": indication}
    return {"verdict": indication, "indication": indication}


def versus_baseline(cand: dict, base: dict, comparison: dict) -> dict:
    """N*, q and T ratios (candidate / baseline) with intervals, whether the rule
    q_ratio > N*_ratio holds at the point estimates, and P(faster), the one-sided confidence
    that T_cand < T_base. Intervals and P(faster) are None when either side has fewer than
    2 seeds (a single seed gives an indication, never a verdict)."""
    n_ratio = _ratio(cand["samples_to_target"], base["samples_to_target"])
    q_ratio = _ratio(cand["throughput"], base["throughput"])
    wins = None if n_ratio is None or q_ratio is None else bool(q_ratio > n_ratio)
    seeded = min(cand["seeds"], base["seeds"]) >= MIN_SEEDS
    keep = (lambda v: v) if seeded else (lambda v: None)
    none2 = [None, None]
    return {
        "samples_ratio": n_ratio,
        "samples_ratio_ci": comparison["samples_ratio_ci"] if seeded else none2,
        "throughput_ratio": q_ratio,
        "throughput_ratio_ci": comparison["throughput_ratio_ci"] if seeded else none2,
        "time_ratio": _ratio(cand["time_to_target"], base["time_to_target"]),
        "time_ratio_ci": comparison["time_ratio_ci"] if seeded else none2,
        "faster_by_rule": wins,
        "p_faster": keep(comparison["p_faster"]),
        "time_ratio_se": comparison.get("time_ratio_se"),
        "run_sd_log_time": comparison.get("run_sd_log_time"),
        "df": comparison.get("df"),
        "seeds": [cand["seeds"], base["seeds"]],
    }


def family(entries: list[dict], ref: dict) -> list[dict]:
    """The reference's LR-scaling family: same algorithm and lr_scaling, the reference too
    (batch schedules included: they are candidates like any configuration)."""
    return [e for e in entries if e["algorithm"] == ref["algorithm"]
            and e["lr_scaling"] == ref["lr_scaling"]]


def static(entries: list[dict], staleness: int = 0) -> list[dict]:
    """The configurations that ran at one B (no batch schedule) and at the reference's
    staleness (`staleness`): what models of N* or T against B, and the critical batch, are
    fitted to."""
    return [e for e in entries if not e.get("schedule")
            and (e.get("staleness") or 0) == staleness]


def _p_faster(e: dict) -> float | None:
    return (e.get("vs_reference") or {}).get("p_faster")


def eligible(e: dict) -> bool:
    """Compared with the reference on at least 2 seeds each, not rejected, and with an
    estimated time to target (a configuration none of whose runs crossed has none)."""
    return (e["verdict"] not in REJECTED + ("unconfirmed",) and _p_faster(e) is not None
            and e["time_to_target"] is not None)


def _holm_order(entries: list[dict], ref: dict) -> tuple[int, list[dict]]:
    """m, the family's candidates (the ones with a single seed included), and the eligible
    ones in Holm's order: the smallest one-sided p-value (1 - p_faster) first."""
    cands = [e for e in family(entries, ref) if e is not ref]
    return len(cands), sorted((e for e in cands if eligible(e)),
                              key=lambda e: (1.0 - _p_faster(e), e["config"]))


def shown_faster(entries: list[dict], ref: dict, alpha: float = DEFAULT_ALPHA) -> list[dict]:
    """The family candidates whose T advantage holds by Holm's step-down at one-sided level
    `alpha` over every candidate of the family, the ones with a single seed included: a
    profile confirms the luckiest of its screened candidates, and counting all of them keeps
    the chance of recommending any configuration that is not faster at most alpha."""
    m, pool = _holm_order(entries, ref)
    out = []
    for i, e in enumerate(pool):
        if 1.0 - _p_faster(e) > alpha / (m - i):
            break
        out.append(e)
    return out


def family_confidence(entries: list[dict], ref: dict) -> dict[str, float]:
    """Per eligible family candidate, 1 - its Holm-adjusted one-sided p-value over the m
    candidates of the family (the ones `shown_faster` counts): the confidence that it is
    faster allowing for the other candidates compared. `shown_faster` holds exactly the
    candidates whose value is at least 1 - alpha. Like `p_faster` (1 - the unadjusted
    p-value), a confidence, not the probability that the candidate is faster."""
    m, pool = _holm_order(entries, ref)
    out, worst = {}, 0.0
    for i, e in enumerate(pool):
        worst = max(worst, min(1.0, (m - i) * (1.0 - _p_faster(e))))
        out[e["config"]] = 1.0 - worst
    return out


def could_still_win(e: dict, ref: dict) -> bool:
    """Whether a configuration of the reference's family may still beat the reference: not
    ruled out (departed, slower, too_easy, or a single seed that missed the crossing by more
    than the margin), and a point time to target (its lower bound when censored) below the
    reference's."""
    if e is ref or e["verdict"] in REJECTED:
        return False
    if e["time_to_target"] is None and e.get("indication") == "departed":
        return False
    t = e["time_to_target"] if e["time_to_target"] is not None \
        else e.get("time_to_target_lower_bound")
    return t is None or ref["time_to_target"] is None or t < ref["time_to_target"]


def open_candidates(entries: list[dict], ref: dict, winners: list[dict] | None = None
                    ) -> list[dict]:
    """Family configurations that may still beat the reference but are not shown faster."""
    won = {e["config"] for e in (shown_faster(entries, ref) if winners is None else winners)}
    return [e for e in family(entries, ref) if could_still_win(e, ref) and e["config"] not in won]


def challenger(entries: list[dict], ref: dict) -> dict | None:
    """The configuration to confirm against the reference: among those that could still win,
    the lowest point time to target; one that crossed the target ranks before a censored one
    (whose time is only bounded below)."""
    pool = [e for e in family(entries, ref) if could_still_win(e, ref)]
    if not pool:
        return None
    return min(pool, key=lambda e: (e["time_to_target"] is None,
                                    e["time_to_target"] if e["time_to_target"] is not None
                                    else e.get("time_to_target_lower_bound") or 0.0,
                                    e["config"]))


def selected_interval(vs: dict, m: int, ci: float = DEFAULT_CI) -> list:
    """The pick's T-ratio interval allowing for its selection among the m candidates of the
    family: its own interval at level `ci`, widened (same centre on the log scale, the same
    t distribution) to level 1 - (1 - ci) / m. This is the false-coverage-rate adjusted
    interval of Benjamini and Yekutieli (2005, JASA 100:71-81) for R = 1 parameter selected
    of m: the chance that a pick is made and its interval misses is at most 1 - ci. Its
    upper end is below 1 exactly when the candidate passes Holm's first step at one-sided
    (1 - ci) / 2 / m (alpha = 0.05 at ci = 0.9). Ends that are unknown stay unknown."""
    lo, hi = (vs.get("time_ratio_ci") or [None, None])[:2]
    df = vs.get("df") or 0
    if lo is None or hi is None or lo <= 0 or hi <= 0 or df < 1 or m <= 1:
        return [lo, hi]
    scale = seedstats.t_quantile(df, 1 - (1 - ci) / m) / seedstats.t_quantile(df, ci)
    mid, half = (math.log(lo) + math.log(hi)) / 2, (math.log(hi) - math.log(lo)) / 2
    return [finite_or_none(math.exp(mid - scale * half)),
            finite_or_none(math.exp(mid + scale * half))]


def recommend(entries: list[dict], reference: str, alpha: float = DEFAULT_ALPHA,
              ci: float = DEFAULT_CI) -> dict | None:
    """The recommendation (None when the reference itself has no resolved time to target).
    The seed plan is at the level the decision uses for a single candidate, Holm's first
    step: alpha / m over the m candidates of the family. `time_ratio_ci` of a recommended
    candidate allows for its selection (`selected_interval`); its own interval, the one its
    row shows, is `time_ratio_ci_unadjusted`."""
    ref = next(e for e in entries if e["config"] == reference)
    if ref["verdict"] == "too_easy" or ref["time_to_target"] is None:
        return None
    fam = family(entries, ref)
    winners = shown_faster(entries, ref, alpha)
    best = min(winners, key=lambda e: (e["time_to_target"], e["config"])) if winners else ref
    pending = open_candidates(entries, ref, winners)
    compared = [e for e in fam if e["seeds"] >= MIN_SEEDS and e["verdict"] != "too_easy"]
    analysed = len([e for e in fam if e is not ref])
    # nothing_compared: no candidate of the family has runs (each failed, or none was run),
    # which is not "shown not faster" (none_faster)
    evidence = "established" if winners else ("not_enough" if pending else (
        "none_faster" if analysed else "nothing_compared"))
    is_ref = best is ref
    vs = best.get("vs_reference") or {}
    m = max(1, len([e for e in fam if e is not ref]))
    plan = seed_plan(pending, ref, alpha / m)
    return {
        "config": best["config"],
        "sequences_per_step": best["sequences_per_step"],
        "lr": best["lr"],
        "seeds": best["seeds"],
        "time_to_target": best["time_to_target"],
        "time_to_target_ci": best["time_to_target_ci"],
        "is_reference": is_ref,
        "evidence": evidence,
        "speedup_vs_reference": None if is_ref else _ratio(ref["time_to_target"],
                                                           best["time_to_target"]),
        "time_ratio_ci": None if is_ref else selected_interval(vs, m, ci),
        "time_ratio_ci_unadjusted": None if is_ref else vs.get("time_ratio_ci"),
        "time_ratio_ci_level_each": None if is_ref else 1 - (1 - ci) / m,
        "p_faster_than_reference": None if is_ref else vs.get("p_faster"),
        "p_faster_family": None if is_ref else vs.get("p_faster_family"),
        "alpha": alpha,
        "candidates_analysed": analysed,
        "shown_faster": [e["config"] for e in winners],
        "compared": [{"config": e["config"], "seeds": e["seeds"], "verdict": e["verdict"],
                      "censored_runs": e.get("censored_runs", 0)} for e in compared],
        "rejected": [{"config": e["config"], "sequences_per_step": e["sequences_per_step"],
                      "verdict": e["verdict"], "why": rejection_reason(e)}
                     for e in fam if e is not ref and e["verdict"] in REJECTED],
        "open": [{"config": e["config"], "seeds": e["seeds"], "verdict": e["verdict"],
                  "time_ratio": (e.get("vs_reference") or {}).get("time_ratio")}
                 for e in pending],
        "plan": plan,
        "reference_lr_check": reference_lr_check(fam, ref),
        "next": next_step(plan, ref) if not winners else settled(best, pending),
        "next_seeds": next_seeds(plan, ref) if not winners else None,
        "rule": RULE,
        "statistic": STATISTIC,
        "comparison": COMPARISON,
    }


def rejection_reason(e: dict) -> str:
    """Why a family candidate is out of the decision, in words."""
    vs = e.get("vs_reference") or {}
    if e["verdict"] == "departed":
        lo = (vs.get("samples_ratio_ci") or [None, None])[0]
        return (f"needs more samples than the reference beyond the margin (N* ratio "
                f"{_fmt(vs.get('samples_ratio'))}, interval from {_fmt(lo)}): rejected by step 3 "
                "of the method")
    if e["verdict"] == "slower":
        return ("stopped early: half or more of its runs trained longer than the reference's "
                "time to target without reaching the target")
    if e["verdict"] == "diverged":
        k = sum(r.get("status") == "diverged" for r in e["runs"])
        return (f"diverged in {k} of its {len(e['runs'])} seeds (non-finite training values): a "
                "run that diverges does not reach the target later, it does not reach it, so "
                "its time to target is not estimated as a late crossing")
    return "target met by its first evaluation: no N* resolved"


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}x"


def reference_lr_check(fam: list[dict], ref: dict) -> dict | None:
    """When a candidate needs clearly fewer samples than B0 (`fewer_samples`), eta0 looks
    under-tuned at B0: what to run to check (B0 at eta0 x sqrt(B/B0) of that candidate)."""
    ahead = [e for e in fam if e is not ref and e["verdict"] == "fewer_samples"]
    if not ahead or not ref.get("lr") or not ref.get("sequences_per_step"):
        return None
    e = min(ahead, key=lambda e: e["sequences_per_step"] or 0)
    factor = math.sqrt(e["sequences_per_step"] / ref["sequences_per_step"])
    return {"config": e["config"], "sequences_per_step": e["sequences_per_step"],
            "samples_ratio_ci": (e.get("vs_reference") or {}).get("samples_ratio_ci"),
            "lr_to_try_at_reference": ref["lr"] * factor,
            "note": (f"B={e['sequences_per_step']} needs fewer samples than B0 beyond the "
                     f"margin: eta0 looks under-tuned at B0; run B0 at eta0 x "
                     f"{factor:.3g} = {ref['lr'] * factor:.3g} as a new baseline")}


def seed_plan(pending: list[dict], ref: dict, alpha: float = DEFAULT_ALPHA) -> list[dict]:
    """Per open candidate: seeds per side that resolve its observed T ratio at 80% power
    (one-sided at `alpha`, the level its test will use), and the smallest T advantage its
    current seeds can resolve."""
    out = []
    for e in pending:
        vs = e.get("vs_reference") or {}
        sd, df, se = vs.get("run_sd_log_time"), vs.get("df") or 0, vs.get("time_ratio_se")
        ratio = vs.get("time_ratio")
        effect = math.log(ratio) if ratio else None
        need = seedstats.seeds_for(sd, df, effect, POWER, alpha) if effect else None
        detect = seedstats.detectable_log_ratio(se, df, POWER, alpha)
        out.append({"config": e["config"], "sequences_per_step": e["sequences_per_step"],
                    "staleness": e.get("staleness") or 0,
                    "seeds": [e["seeds"], ref["seeds"]], "time_ratio": ratio,
                    "seeds_per_side_needed": need,
                    "detectable_time_ratio": None if detect is None
                    else finite_or_none(math.exp(-detect))})
    return out


def next_step(plan: list[dict], ref: dict) -> str | None:
    """What to run to settle the open candidates (None when nothing is open)."""
    if not plan:
        return None
    parts = []
    for p in plan:
        need, ratio, detect = p["seeds_per_side_needed"], p["time_ratio"], \
            p["detectable_time_ratio"]
        if need is None and ratio is not None and detect is not None:
            parts.append(f"{size_words(p)}: its T ratio {ratio:.2f} is too close to 1 "
                         "to resolve (more than 1,000 seeds per side); these seeds show only a "
                         f"T ratio below {detect:.2f}")
        elif need is None:
            parts.append(f"{size_words(p)}: at least "
                         f"{max(MIN_SEEDS, ref['seeds'] + 1)} seeds of it and of the reference")
        elif p["time_ratio"] is not None and p["time_ratio"] >= 1:
            parts.append(f"{size_words(p)}: not faster at its point estimate "
                         f"(T ratio {p['time_ratio']:.2f}); more seeds would only confirm that")
        else:
            parts.append(f"{size_words(p)}: {need} seeds per side resolve its T "
                         f"ratio {p['time_ratio']:.2f} at 80% power")
    seeds = next_seeds(plan, ref)
    if seeds is None:
        return "; ".join(parts) + ": keep the baseline unless a smaller effect matters"
    return "; ".join(parts) + f" (e.g. rlbatch profile --seeds {seeds}), then analyze again"


def settled(best: dict, pending: list[dict]) -> str | None:
    """`next` once a candidate is shown faster: the decision asks for nothing more; the open
    candidates (not shown faster than the reference) are named, since more seeds could show
    one of them faster still."""
    if not pending:
        return None
    others = ", ".join(size_words(e) for e in pending)
    return (f"nothing for this decision ({size_words(best)} is shown faster); more "
            f"seeds of {others} and the reference could show one of them faster still")


def next_seeds(plan: list[dict], ref: dict) -> int | None:
    """Seeds per configuration that `next_step` asks for (None: more seeds would not settle
    anything, or nothing is open)."""
    if not plan:
        return None
    needs = [p["seeds_per_side_needed"] for p in plan if p["seeds_per_side_needed"]]
    if not needs and all(p["detectable_time_ratio"] is not None for p in plan):
        return None
    return max(max(needs, default=0), MIN_SEEDS, ref["seeds"] + (0 if needs else 1))


def stale_versus_twin(stale: dict, twin: dict, comparison: dict) -> dict:
    """Rollouts at another staleness against the twin at the reference's (same B and LR),
    in the JSON as `staleness` and `twin_staleness`: the N* ratio (what
    staleness cost in samples), the throughput ratio (what it bought: each side's q = N* / T
    over the span to the target, as in `vs_reference`) and the T ratio (the net), stale / twin, with the intervals of the
    comparison where both have MIN_SEEDS seeds."""
    seeded = min(stale["seeds"], twin["seeds"]) >= MIN_SEEDS
    return {
        "config": stale["config"], "twin": twin["config"], "staleness": stale["staleness"],
        "twin_staleness": twin.get("staleness") or 0,
        "sequences_per_step": stale["sequences_per_step"],
        "seeds": [stale["seeds"], twin["seeds"]],
        "samples_ratio": _ratio(stale["samples_to_target"], twin["samples_to_target"]),
        "samples_ratio_ci": comparison["samples_ratio_ci"] if seeded else [None, None],
        "throughput_ratio": _ratio(stale["throughput"], twin["throughput"]),
        "time_ratio": _ratio(stale["time_to_target"], twin["time_to_target"]),
        "time_ratio_ci": comparison["time_ratio_ci"] if seeded else [None, None],
    }


def control_versus_twin(control: dict, twin: dict, comparison: dict) -> dict:
    """The fixed-LR control against its sqrt-scaled twin (same B): N* and T penalties
    (control / twin) with intervals; `scaled_lr_too_high` when the control, at the lower
    LR eta0, is faster across seeds (upper end of its T-ratio interval below 1): the sqrt
    rule's LR overshoots at this B, so eta0 lies above its best at B0 or the best LR grows
    more slowly than sqrt(B/B0) here. `eta0_may_be_under_tuned` is the same flag under its
    first name (kept for readers of the JSON)."""
    seeded = min(control["seeds"], twin["seeds"]) >= MIN_SEEDS
    t_ci = comparison["time_ratio_ci"] if seeded else [None, None]
    return {
        "control": control["config"], "twin": twin["config"],
        "sequences_per_step": control["sequences_per_step"],
        "lr": control["lr"], "twin_lr": twin["lr"], "seeds": [control["seeds"], twin["seeds"]],
        "samples_ratio": _ratio(control["samples_to_target"], twin["samples_to_target"]),
        "samples_ratio_ci": comparison["samples_ratio_ci"] if seeded else [None, None],
        "time_ratio": _ratio(control["time_to_target"], twin["time_to_target"]),
        "time_ratio_ci": t_ci,
        "scaled_lr_too_high": bool(t_ci[1] is not None and t_ci[1] < 1.0),
        "eta0_may_be_under_tuned": bool(t_ci[1] is not None and t_ci[1] < 1.0),
    }
