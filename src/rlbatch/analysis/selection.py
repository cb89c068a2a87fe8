"""Verdicts per configuration, the decision rule and the recommendation.

Decision rule (docs/design.md, Method): T = N*/q with q measured over the same span as N*
(stats.py), so a candidate beats the baseline exactly when q_cand/q_base > N*_cand/N*_base.
Both ratios are reported with their bootstrap intervals, and so is T_cand/T_base.

Verdicts (one word per meaning; docs/analysis.md):
- `reference`: the baseline every other configuration is compared with;
- `too_easy`: the target was met at or before the first evaluation after step 0 by one of
  its runs, so no N* is resolved; it never enters a decision;
- `slower`: at least half of its runs were stopped early because they could not beat the
  baseline's median time to target (stop code `cannot_win`): slower than the baseline is
  what is known, nothing about alignment;
- `unconfirmed`: it or the reference has fewer than 2 seeds; its `indication` holds what the
  single seed suggests (aligned / departed / inconclusive), and no interval or P(faster) of
  it is reported as evidence;
- `aligned`, `departed`, `inconclusive`: the equivalence test on log(N* ratio)
  (invariance.verdict) with at least 2 seeds on both sides.

Recommendation: only from the reference's LR-scaling family (same algorithm and
lr_scaling: square root by default; the fixed-LR control is reported against its sqrt twin
instead). A candidate is recommended only when it is `aligned` and its advantage holds
across seeds: the upper end of the T-ratio interval is below 1. Among such candidates the
lowest T wins; otherwise the reference is kept. `evidence` says which case holds, and
`next` names what to run when the evidence is not enough. No torch import.
"""

from __future__ import annotations

from rlbatch.analysis import invariance
from rlbatch.analysis.stats import finite_or_none

MIN_SEEDS = 2
RULE = ("lowest T = N*/q among configurations of the reference's LR-scaling family that are "
        "aligned with it and faster across seeds (upper end of the T-ratio interval < 1); "
        "otherwise keep the reference")


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
    stopped = [r for r in runs if r.get("stop_code") == "cannot_win" and r["censored"]]
    if 2 * len(stopped) >= len(runs):
        return {"verdict": "slower", "indication": None}
    if entry["seeds"] < MIN_SEEDS or ref["seeds"] < MIN_SEEDS:
        return {"verdict": "unconfirmed", "indication": indication}
    return {"verdict": indication, "indication": indication}


def versus_baseline(cand: dict, base: dict, comparison: dict) -> dict:
    """N*, q and T ratios (candidate / baseline) with intervals, whether the rule
    q_ratio > N*_ratio holds at the point estimates, and P(T_cand < T_base). Intervals and
    P(faster) are None when either side has fewer than 2 seeds (a single seed gives a point,
    not a spread)."""
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
        "seeds": [cand["seeds"], base["seeds"]],
    }


def family(entries: list[dict], ref: dict) -> list[dict]:
    """The reference's LR-scaling family: same algorithm and lr_scaling, the reference too."""
    return [e for e in entries if e["algorithm"] == ref["algorithm"]
            and e["lr_scaling"] == ref["lr_scaling"]]


def established_faster(e: dict) -> bool:
    hi = ((e.get("vs_reference") or {}).get("time_ratio_ci") or [None, None])[1]
    return e["verdict"] == "aligned" and hi is not None and hi < 1.0


def could_still_win(e: dict, ref: dict) -> bool:
    """Whether a configuration of the reference's family may still beat the reference: not
    ruled out (departed, slower, too_easy, or a single seed that missed the crossing by more
    than the margin), and a point time to target (its lower bound when censored) below the
    reference's."""
    if e is ref or e["verdict"] in ("departed", "slower", "too_easy", "reference"):
        return False
    if e["time_to_target"] is None and e.get("indication") == "departed":
        return False
    t = e["time_to_target"] if e["time_to_target"] is not None \
        else e.get("time_to_target_lower_bound")
    return t is None or ref["time_to_target"] is None or t < ref["time_to_target"]


def open_candidates(entries: list[dict], ref: dict) -> list[dict]:
    """Family configurations that may still beat the reference but are not established as
    faster (unconfirmed or inconclusive, or aligned with an interval that reaches 1)."""
    return [e for e in family(entries, ref)
            if could_still_win(e, ref) and not established_faster(e)]


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


def recommend(entries: list[dict], reference: str) -> dict | None:
    """The recommendation (None when the reference itself has no resolved time to target)."""
    ref = next(e for e in entries if e["config"] == reference)
    if ref["verdict"] == "too_easy" or ref["time_to_target"] is None:
        return None
    fam = family(entries, ref)
    winners = [e for e in fam if e is not ref and established_faster(e)]
    best = min(winners, key=lambda e: (e["time_to_target"], e["config"])) if winners else ref
    pending = open_candidates(entries, ref)
    compared = [e for e in fam if e["seeds"] >= MIN_SEEDS and e["verdict"] != "too_easy"]
    if winners:
        evidence = "established"
    elif pending:
        evidence = "not_enough"
    else:
        evidence = "none_faster"
    is_ref = best is ref
    vs = best.get("vs_reference") or {}
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
        "time_ratio_ci": None if is_ref else vs.get("time_ratio_ci"),
        "p_faster_than_reference": None if is_ref else vs.get("p_faster"),
        "compared": [{"config": e["config"], "seeds": e["seeds"], "verdict": e["verdict"]}
                     for e in compared],
        "open": [{"config": e["config"], "seeds": e["seeds"], "verdict": e["verdict"],
                  "time_ratio": (e.get("vs_reference") or {}).get("time_ratio")}
                 for e in pending],
        "next": next_step(pending, ref),
        "rule": RULE,
    }


def next_step(pending: list[dict], ref: dict) -> str | None:
    """What to run to settle the open candidates (None when nothing is open)."""
    if not pending:
        return None
    names = ", ".join(f"B={e['sequences_per_step']}" for e in pending)
    seeds = max(3, ref["seeds"] + 1)
    return (f"run seeds of {names} and of the reference until each has at least {seeds} "
            f"(e.g. rlbatch profile --seeds {seeds}), then analyze again")


def control_versus_twin(control: dict, twin: dict, comparison: dict) -> dict:
    """The fixed-LR control against its sqrt-scaled twin (same B): N* and T penalties
    (control / twin) with intervals; `eta0_may_be_under_tuned` when the control is faster
    across seeds (upper end of its T-ratio interval below 1)."""
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
        "eta0_may_be_under_tuned": bool(t_ci[1] is not None and t_ci[1] < 1.0),
    }
