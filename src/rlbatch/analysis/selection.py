"""Decision rule and recommendation: pick the configuration that reaches the target first.

DESIGN.md: T = N*/q, so a candidate beats the baseline only if q_cand/q_base >
N*_cand/N*_base. Per candidate we report both ratios (medians across seeds, bootstrap
intervals from stats.compare) and whether the rule holds at the point estimates.

Recommendation ("align, then accelerate"): among the configurations whose verdict is
`aligned` (the reference counts as aligned with itself) and whose median T is known, the one
with the lowest median T, with the bootstrap probability P(T_cand < T_base) that its median
time beats the baseline's. No torch import.
"""

from __future__ import annotations

from rlbatch.analysis.stats import finite_or_none

ELIGIBLE = ("aligned", "reference")


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return finite_or_none(num / den)


def versus_baseline(cand: dict, base: dict, comparison: dict) -> dict:
    """q ratio vs N* ratio (point and intervals), T ratio and P(T_cand < T_base).
    `cand`/`base` are config entries (samples_to_target, time_to_target, throughput)."""
    n_ratio = _ratio(cand["samples_to_target"], base["samples_to_target"])
    q_ratio = _ratio(cand["throughput"], base["throughput"])
    wins = None if n_ratio is None or q_ratio is None else bool(q_ratio > n_ratio)
    return {
        "samples_ratio": n_ratio,
        "samples_ratio_ci": comparison["samples_ratio_ci"],
        "throughput_ratio": q_ratio,
        "throughput_ratio_ci": comparison["throughput_ratio_ci"],
        "time_ratio": _ratio(cand["time_to_target"], base["time_to_target"]),
        "faster_by_rule": wins,
        "p_faster": comparison["p_faster"],
    }


def recommend(entries: list[dict], reference: str) -> dict | None:
    """The aligned configuration with the lowest median time to target (None if there is
    none). `entries` are config entries with `verdict`, `time_to_target` and, except the
    reference, `vs_reference`."""
    eligible = [e for e in entries if e["verdict"] in ELIGIBLE and e["time_to_target"] is not None]
    if not eligible:
        return None
    best = min(eligible, key=lambda e: (e["time_to_target"], e["config"]))
    ref = next(e for e in entries if e["config"] == reference)
    is_ref = best["config"] == reference
    vs = best.get("vs_reference") or {}
    return {
        "config": best["config"],
        "sequences_per_step": best["sequences_per_step"],
        "lr": best["lr"],
        "time_to_target": best["time_to_target"],
        "time_to_target_ci": best["time_to_target_ci"],
        "speedup_vs_reference": None if is_ref else _ratio(ref["time_to_target"],
                                                           best["time_to_target"]),
        "p_faster_than_reference": None if is_ref else vs.get("p_faster"),
        "is_reference": is_ref,
        "rule": "lowest median time to target among configurations aligned with the reference",
    }
