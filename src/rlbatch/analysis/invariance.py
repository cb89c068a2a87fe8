"""Batch-size invariance of sample-indexed curves against a reference configuration.

Checks the "align" half of the procedure (docs/design.md, Method): with eta(B) =
eta0*sqrt(B/B0), curves plotted against cumulative samples should coincide (Malladi et al.
2022; Hilton et al. 2022 for PPO). Per candidate: the curve difference on a common sample
grid with a seed-bootstrap band, the normalized area between the curves, and
log(N*_cand / N*_ref) with its interval (stats.py). `verdict` reads that interval against
a margin (log 1.15 by default) as `aligned`, `departed`, `fewer_samples` or `inconclusive`;
the "critical batch (departure sense)" is the largest B up to which the reference's family
stays aligned. Definitions, the verdict rule and how censored runs enter: docs/design.md,
"Module notes". No torch import.
"""

from __future__ import annotations

import math

import numpy as np

from rlbatch.analysis.defaults import DEFAULT_MARGIN
from rlbatch.analysis.stats import finite_or_none

VERDICTS = ("aligned", "departed", "fewer_samples", "inconclusive")


def verdict(log_lo: float, log_hi: float, margin: float = DEFAULT_MARGIN) -> str:
    """The verdict (docs/design.md, "Module notes") from the interval [log_lo, log_hi] of
    log(N* ratio)."""
    if math.isnan(log_lo) or math.isnan(log_hi):
        return "inconclusive"
    if -margin < log_lo and log_hi < margin:
        return "aligned"
    if log_lo >= margin:
        return "departed"
    if log_hi <= -margin:
        return "fewer_samples"
    return "inconclusive"


def common_grid(curves: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Sorted union of all evaluated samples inside the intersection of the curves' ranges
    (empty if some curve is empty or the ranges do not overlap)."""
    if not curves or any(len(s) == 0 for s, _ in curves):
        return np.zeros(0)
    lo = max(float(s[0]) for s, _ in curves)
    hi = min(float(s[-1]) for s, _ in curves)
    if lo > hi:
        return np.zeros(0)
    pts = np.unique(np.concatenate([s for s, _ in curves]))
    return pts[(pts >= lo) & (pts <= hi)]


def on_grid(curves: list[tuple[np.ndarray, np.ndarray]], grid: np.ndarray) -> np.ndarray:
    """(n_runs, len(grid)) values, each run linearly interpolated onto the grid."""
    return np.stack([np.interp(grid, s, v) for s, v in curves]) if curves else np.zeros((0, 0))


def normalized_area(grid: np.ndarray, diff: np.ndarray, ref_mean: np.ndarray) -> float | None:
    """Trapezoid mean of |diff| over the grid / range of the reference mean curve; None when
    the grid is empty or the reference curve is flat on it."""
    if len(grid) == 0:
        return None
    span = float(np.max(ref_mean) - np.min(ref_mean))
    if span <= 0:
        return None
    absd = np.abs(diff)
    width = float(grid[-1] - grid[0])
    if width > 0:
        mean_abs = float(np.sum((absd[1:] + absd[:-1]) / 2.0 * np.diff(grid)) / width)
    else:
        mean_abs = float(np.mean(absd))
    return mean_abs / span


def invariance_curves(ref_curves, cand_curves, ref_idx: np.ndarray, cand_idx: np.ndarray,
                      ci: float) -> dict:
    """Figure data: mean curves, their difference and its seed-bootstrap band on the common
    grid, plus the normalized area and max |diff|. `*_idx` are the (n_boot, n_runs)
    resampling matrices of each configuration (stats.boot_indices)."""
    grid = common_grid(list(ref_curves) + list(cand_curves))
    empty = {"grid": [], "reference_mean": [], "candidate_mean": [], "diff": [],
             "band": [[], []], "normalized_area": None, "max_abs_diff": None}
    if len(grid) == 0:
        return empty
    ref = on_grid(ref_curves, grid)    # (n_ref, G)
    cand = on_grid(cand_curves, grid)  # (n_cand, G)
    ref_mean, cand_mean = ref.mean(axis=0), cand.mean(axis=0)
    diff = cand_mean - ref_mean
    boot = cand[cand_idx].mean(axis=1) - ref[ref_idx].mean(axis=1)  # (n_boot, G)
    a = (1.0 - ci) / 2.0
    band_lo = np.quantile(boot, a, axis=0, method="inverted_cdf")
    band_hi = np.quantile(boot, 1.0 - a, axis=0, method="inverted_cdf")
    return {
        "grid": grid.tolist(), "reference_mean": ref_mean.tolist(),
        "candidate_mean": cand_mean.tolist(), "diff": diff.tolist(),
        "band": [band_lo.tolist(), band_hi.tolist()],
        "normalized_area": normalized_area(grid, diff, ref_mean),
        "max_abs_diff": float(np.max(np.abs(diff))),
    }


def log_ratio_point(nstar_cand: float | None, nstar_ref: float | None) -> float | None:
    """log(N*_cand / N*_ref) of the estimates; None when either is unknown or zero."""
    if not nstar_cand or not nstar_ref:
        return None
    return finite_or_none(math.log(nstar_cand / nstar_ref))


def critical_batch_departure(entries: list[dict]) -> dict:
    """Critical batch in the departure sense from [{"sequences_per_step", "verdict"}] of one
    family (the reference's verdict is "reference", counted as aligned): the largest B with
    every tested B up to it aligned. Configurations whose verdict says nothing about
    alignment (unconfirmed, slower, too_easy) are left out. `lower_bound_only` is true when the largest tested B is
    still aligned (the departure lies beyond the sweep)."""
    by_b: dict[int, list[str]] = {}
    for e in entries:
        if e.get("verdict") not in ("reference", "aligned", "departed", "fewer_samples",
                                    "inconclusive"):
            continue  # unconfirmed, slower, too_easy: nothing known about alignment
        if e.get("sequences_per_step") is not None:
            by_b.setdefault(int(e["sequences_per_step"]), []).append(e["verdict"])
    crit, first_bad = None, None
    for b in sorted(by_b):
        if all(v in ("aligned", "reference") for v in by_b[b]):
            crit = b
        else:
            first_bad = b
            break
    largest = max(by_b) if by_b else None
    return {
        "critical_batch_departure": crit,
        "first_not_aligned_batch": first_bad,
        "largest_tested_batch": largest,
        "lower_bound_only": crit is not None and crit == largest,
    }
