"""A run's sample efficiency from its curve near the target, as an alternative to its first
crossing (docs/analysis.md, "Which statistic"; `rlbatch analyze --statistic stretch`).

Shape-invariant registration: every run's curve is modelled as one shared shape on the
log-samples axis, shifted by the run's own log stretch a_i, value_ij ~ f(log n_ij - a_i).
The shape f is the isotonic (non-decreasing) regression of all the runs' points on the
shifted axis; given f, each a_i is the shift (on a grid 0.9% apart) that minimises the run's
mean squared gap over the points f covers; the two steps alternate until the shifts settle,
with the reference configuration's mean shift fixed at 0. Only the rising segment is used:
each run's points from its last evaluation below start + `frac` x (threshold - start) on,
step 0 excluded (where every run starts alike), so early dynamics that say little about when
a run gets to the target do not enter.

A run's N* is then N*_ref x exp(a_i), N*_ref the geometric mean of the reference's
crossings, and its T that over its own throughput to the target; the pooled model of
seedstats.py takes them as it takes crossings. Runs that did not reach the target keep their
censoring bounds. Pure numpy/scipy; no torch import.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import isotonic_regression

SHIFTS = np.linspace(-math.log(8.0), math.log(8.0), 463)  # ~0.9% apart
DEFAULT_FRAC = 0.8
Curve = tuple[np.ndarray, np.ndarray]


def register(curves: list[Curve], ref: np.ndarray, iters: int = 50) -> np.ndarray:
    """Per-run log stretch a_i of the shared-shape model (module text); `ref` marks the
    reference runs, whose mean shift is 0. Every curve needs points with samples > 0."""
    a = np.zeros(len(curves))
    for _ in range(iters):
        x = np.concatenate([np.log(s) - a[i] for i, (s, _) in enumerate(curves)])
        y = np.concatenate([v for _, v in curves])
        order = np.argsort(x, kind="stable")
        xs, fs = x[order], isotonic_regression(y[order]).x
        new = np.array([_best_shift(s, v, xs, fs) for s, v in curves])
        new -= new[ref].mean()
        if np.max(np.abs(new - a)) < 1e-12:
            return new
        a = new
    return a


def _best_shift(s: np.ndarray, v: np.ndarray, xs: np.ndarray, fs: np.ndarray) -> float:
    at = np.log(s)[None, :] - SHIFTS[:, None]  # (shifts, points)
    inside = (at >= xs[0]) & (at <= xs[-1])
    err = np.where(inside, (np.interp(at, xs, fs) - v[None, :]) ** 2, 0.0)
    n = inside.sum(axis=1)
    mse = np.where(n >= max(1, (len(s) + 1) // 2), err.sum(axis=1) / np.maximum(n, 1), np.inf)
    if not np.isfinite(mse).any():  # the shape covers too little of this run: no shift
        return 0.0
    return float(SHIFTS[int(np.argmin(mse))])


def rising(curve: Curve, threshold: float, frac: float = DEFAULT_FRAC) -> Curve:
    """The points after step 0 from the last evaluation below start + frac x (threshold -
    start) on (start: the curve's first value)."""
    s, v = (np.asarray(x, dtype=float) for x in curve)
    level = v[0] + frac * (threshold - v[0])
    below = np.flatnonzero(v < level)
    keep = (np.arange(len(s)) >= (int(below[-1]) if len(below) else 0)) & (s > 0)
    return s[keep], v[keep]


def stretched_groups(groups: list[dict], curves: dict[str, Curve], ref_id: str,
                     frac: float = DEFAULT_FRAC) -> list[dict]:
    """`groups` (analyze.group_configs) with each crossed run's samples_to_target and
    time_to_target replaced by the registration's (module text). `curves` maps a run's
    directory to its (samples, values); a run whose rising segment has no point after step
    0 keeps its crossing."""
    crossed = [(g["config"], r) for g in groups for r in g["runs"]
               if not r["censored"] and r.get("samples_to_target")]
    segs = {r["run"]: rising(curves[r["run"]], r["threshold"], frac) for _, r in crossed}
    used = [(c, r) for c, r in crossed if len(segs[r["run"]][0])]
    ref = np.array([c == ref_id for c, _ in used])
    if not ref.any():
        return groups
    a = register([segs[r["run"]] for _, r in used], ref)
    n_ref = math.exp(float(np.mean([math.log(r["samples_to_target"])
                                    for (c, r), is_ref in zip(used, ref) if is_ref])))
    new = {r["run"]: n_ref * math.exp(float(ai)) for (_, r), ai in zip(used, a)}
    out = []
    for g in groups:
        runs = []
        for r in g["runs"]:
            if r["run"] in new:
                q = r.get("throughput_to_target")
                r = {**r, "samples_to_target": new[r["run"]],
                     "time_to_target": new[r["run"]] / q if q else r.get("time_to_target")}
            runs.append(r)
        out.append({**g, "runs": runs})
    return out
