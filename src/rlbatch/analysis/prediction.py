"""Time to target predicted from a probe: a candidate's short prefix against the baseline.

A probe runs a candidate for a fraction of the samples the baseline needed to reach the
target (docs/design.md, Method, "Probes"). From the prefix: the sample-efficiency ratio r
(the stretch of the samples axis that maps the baseline's mean curve onto the candidate's,
fitted by least squares on a log grid) with a parametric-bootstrap interval, the alignment
verdict on log r (`invariance.verdict`), the steady-state throughput q, and the predicted
N* = r N*_base and T = N*/q. `across_probes` replaces the per-probe intervals by ones built
from the probes' spread around each other, which keep their level where one probe's own
bootstrap does not. The estimators, the bootstrap and the argument for the across-probe
interval: docs/design.md, "Module notes". Pure numpy on arrays the caller reads from run
logs; no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from rlbatch.analysis import invariance

R_RANGE = 4.0  # r is searched in [1/4, 4]; a fit at either end is reported as such
R_GRID = np.exp(np.linspace(-math.log(R_RANGE), math.log(R_RANGE), 321))  # ~0.9% apart
MIN_POINTS = 2  # candidate evaluations after step 0 needed for a fit

Curve = tuple[np.ndarray, np.ndarray]  # (samples, metric value), samples increasing


@dataclass(frozen=True)
class BaselineCurves:
    """The baseline's evaluations per seed and the crossings of those that reached the
    target (`nstars`; a seed still running or stopped short contributes its curve only)."""

    curves: list[Curve]
    nstars: list[float]

    def __post_init__(self):
        if len(self.curves) < 2:
            raise ValueError("a probe needs the curves of at least 2 baseline seeds (the "
                             "seed-to-seed spread is measured on them)")
        if not self.nstars:
            raise ValueError("no baseline seed reached the target")


def _clean(curve: Curve) -> Curve:
    s, v = (np.asarray(a, dtype=float) for a in curve)
    keep = np.isfinite(s) & np.isfinite(v)
    s, v = s[keep], v[keep]
    order = np.argsort(s, kind="stable")
    return s[order], v[order]


@dataclass(frozen=True)
class MeanCurve:
    """The baseline's seeds on the union of their evaluated samples: the mean over the seeds
    whose evaluated range covers each point (`count` of them), and the seed-to-seed standard
    deviation pooled over the points two or more seeds cover (one number: evaluation noise
    on a fixed held-out set changes slowly along a curve, and a per-point estimate from 2-3
    seeds is too noisy to use; None with fewer than two seeds anywhere)."""

    grid: np.ndarray
    mean: np.ndarray
    count: np.ndarray
    sd: float | None


def mean_curve(curves: list[Curve]) -> MeanCurve:
    curves = [_clean(c) for c in curves]
    grid = np.unique(np.concatenate([s for s, _ in curves]))
    vals = np.full((len(curves), len(grid)), np.nan)
    for i, (s, v) in enumerate(curves):
        if len(s):
            inside = (grid >= s[0]) & (grid <= s[-1])
            vals[i, inside] = np.interp(grid[inside], s, v)
    count = np.sum(np.isfinite(vals), axis=0)
    mean = np.nansum(vals, axis=0) / np.maximum(count, 1)
    keep = count > 0
    grid, vals, count, mean = grid[keep], vals[:, keep], count[keep], mean[keep]
    two = count >= 2
    sd = None
    if two.any():
        dev = np.nansum((vals[:, two] - mean[two]) ** 2)
        sd = float(math.sqrt(dev / np.sum(count[two] - 1)))
    return MeanCurve(grid, mean, count, sd)


def fit_ratio(base_grid: np.ndarray, base_mean: np.ndarray, cand: Curve) -> float | None:
    """The r in R_GRID minimising the mean squared gap between cand(x) and base(x / r) over
    the candidate's points x > 0 that the stretched baseline covers (None: too few)."""
    s, v = _clean(cand)
    keep = s > 0
    s, v = s[keep], v[keep]
    ok = np.isfinite(base_mean)
    bg, bm = base_grid[ok], base_mean[ok]
    if len(s) < MIN_POINTS or len(bg) < 2:
        return None
    x = s[None, :] / R_GRID[:, None]  # (R, n): where each point falls on the baseline's axis
    covered = x <= bg[-1]
    pred = np.interp(x, bg, bm)
    err = np.where(covered, (pred - v[None, :]) ** 2, 0.0)
    n = covered.sum(axis=1)
    mse = np.where(n >= MIN_POINTS, err.sum(axis=1) / np.maximum(n, 1), np.inf)
    if not np.isfinite(mse).any():
        return None
    return float(R_GRID[int(np.argmin(mse))])


def steady_throughput(samples: np.ndarray, seconds: np.ndarray, skip_steps: int = 1
                      ) -> tuple[float | None, np.ndarray]:
    """q over the steps after the first `skip_steps`: (total samples / total seconds, the
    per-step (samples, seconds) pairs used, for the bootstrap). `samples` and `seconds` are
    per-step increments."""
    smp = np.asarray(samples, dtype=float)[skip_steps:]
    sec = np.asarray(seconds, dtype=float)[skip_steps:]
    keep = np.isfinite(smp) & np.isfinite(sec) & (sec > 0)
    pairs = np.stack([smp[keep], sec[keep]], axis=1) if keep.any() else np.zeros((0, 2))
    if len(pairs) == 0:
        return None, pairs
    return float(pairs[:, 0].sum() / pairs[:, 1].sum()), pairs


def _interval(draws: np.ndarray, ci: float) -> list:
    """Percentile interval of the finite draws. On constructed curves its nominal level
    overstates how often it holds the true r (docs/benchmarks.md, "Probe bootstrap interval
    on constructed curves"), one reason decisions use `across_probes` instead."""
    draws = draws[np.isfinite(draws)]
    if len(draws) == 0:
        return [None, None]
    a = (1 - ci) / 2
    return [float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))]


def _bootstrap_draws(rng: np.random.Generator, base_mean: MeanCurve, cand: Curve, r: float,
                     nstars: np.ndarray, pairs: np.ndarray, pairs0: np.ndarray,
                     n_boot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`n_boot` parametric-bootstrap draws of (r, the baseline's N*, q_cand, q_base): each
    perturbs the baseline's mean curve by its own noise and the fitted candidate curve by one
    seed's sd, refits r, and resamples the baseline's crossings and both runs' timed steps."""
    cs, _ = _clean(cand)
    cs = cs[cs > 0]
    g, m0, sd = base_mean.grid, base_mean.mean, base_mean.sd or 0.0
    fitted = np.interp(cs / r, g, m0)
    mean_sd = sd / np.sqrt(base_mean.count)  # the baseline mean's own noise, per point
    r_draws, n_draws, q_draws = np.empty(n_boot), np.empty(n_boot), np.empty(n_boot)
    q0_draws = np.empty(n_boot)
    for b in range(n_boot):
        m = m0 + rng.normal(0.0, 1.0, len(g)) * mean_sd
        noisy = fitted + rng.normal(0.0, sd, len(cs))
        rb = fit_ratio(g, m, (cs, noisy))
        r_draws[b] = np.nan if rb is None else rb
        n_draws[b] = np.median(nstars[rng.integers(0, len(nstars), len(nstars))])
        rows = pairs[rng.integers(0, len(pairs), len(pairs))]
        q_draws[b] = rows[:, 0].sum() / rows[:, 1].sum()
        rows = pairs0[rng.integers(0, len(pairs0), len(pairs0))]
        q0_draws[b] = rows[:, 0].sum() / rows[:, 1].sum()
    return r_draws, n_draws, q_draws, q0_draws


def predict(base: BaselineCurves, cand: Curve, steps: tuple[np.ndarray, np.ndarray], *,
            base_steps: tuple[np.ndarray, np.ndarray] | None = None,
            margin: float = invariance.DEFAULT_MARGIN, ci: float = 0.9, n_boot: int = 400,
            seed: int = 0, skip_steps: int = 1) -> dict:
    """The probe's prediction for one candidate (one seed): r, the alignment verdict on
    log r, q, N* and T, each with its interval, and `problem` when nothing can be predicted.
    `steps` holds the candidate's per-step (samples, seconds) increments; with the baseline's
    (`base_steps`), also the time ratio T_cand / T_base = r x q_base / q_cand and its
    interval. The ratio is what decisions use: the baseline's N* is common to both sides and
    cancels, so one lucky or unlucky baseline crossing does not move it."""
    rng = np.random.default_rng(seed)
    base_mean = mean_curve(base.curves)
    r = fit_ratio(base_mean.grid, base_mean.mean, cand)
    q, pairs = steady_throughput(*steps, skip_steps=skip_steps)
    out = {"ratio": r, "ratio_ci": [None, None], "verdict": "inconclusive", "throughput": q,
           "throughput_ci": [None, None], "samples_to_target": None,
           "samples_to_target_ci": [None, None], "time_to_target": None,
           "time_to_target_ci": [None, None], "time_ratio": None, "time_ratio_ci": [None, None],
           "evaluations": int(np.sum(_clean(cand)[0] > 0)),
           "seed_sd": base_mean.sd, "problem": None}
    if r is None:
        out["problem"] = (f"the probe has {out['evaluations']} evaluation(s) after step 0 that "
                          f"the baseline's curve covers; at least {MIN_POINTS} are needed")
        return out
    if q is None:
        out["problem"] = "no timed steps after the warm-up"
        return out
    nstars = np.asarray(base.nstars, dtype=float)
    q0, pairs0 = (None, pairs) if base_steps is None else \
        steady_throughput(*base_steps, skip_steps=skip_steps)
    r_draws, n_draws, q_draws, q0_draws = _bootstrap_draws(
        rng, base_mean, cand, r, nstars, pairs, pairs0, n_boot)
    nstar = r * float(np.median(nstars))
    r_ci = _interval(r_draws, ci)
    log_lo = math.log(r_ci[0]) if r_ci[0] else math.nan
    log_hi = math.log(r_ci[1]) if r_ci[1] else math.nan
    out.update(ratio_ci=r_ci, verdict=invariance.verdict(log_lo, log_hi, margin),
               throughput_ci=_interval(q_draws, ci), samples_to_target=nstar,
               samples_to_target_ci=_interval(r_draws * n_draws, ci),
               time_to_target=nstar / q,
               time_to_target_ci=_interval(r_draws * n_draws / q_draws, ci))
    if q0 is not None:
        out.update(time_ratio=r * q0 / q,
                   time_ratio_ci=_interval(r_draws * q0_draws / q_draws, ci),
                   base_throughput=q0)
    if r in (R_GRID[0], R_GRID[-1]):
        out["problem"] = f"r = {r:.3g} is at the end of the searched range [1/{R_RANGE:g}, {R_RANGE:g}]"
    return out


ACROSS = ("ratio", "time_ratio")


def across_probes(preds: dict[str, dict], copies: dict[str, dict] | None = None,
                  ci: float = 0.9, margin: float = invariance.DEFAULT_MARGIN
                  ) -> dict[str, dict]:
    """The probes' predictions (`predict`'s dicts by name) with intervals from their spread
    around each other (module text, 6): `ratio_ci`, `time_ratio_ci` and the N* and T
    intervals they imply, and the verdict on the new r interval. `copies` are predictions of
    further seeds of the baseline itself (true ratio 1): they enter the spread and are not
    returned. The bootstrap intervals move under `within_run`; `interval_df` is the spread's
    degrees of freedom (0: no interval)."""
    def ok(p):
        return p.get("problem") is None and bool(p.get("ratio")) and bool(p.get("time_ratio"))
    members = [p for p in [*preds.values(), *(copies or {}).values()] if ok(p)]
    df = len(members) - 1
    half = {}
    for key in ACROSS:
        logs = np.log([p[key] for p in members])
        half[key] = (float(sps.t.ppf(0.5 + ci / 2, df) * math.sqrt(2.0) * np.std(logs, ddof=1))
                     if df >= 1 else None)
    out = {}
    for name, p in preds.items():
        q = dict(p)
        q["within_run"] = {k: p[k] for k in ("ratio_ci", "time_ratio_ci", "samples_to_target_ci",
                                             "time_to_target_ci", "verdict")}
        q["interval_df"] = max(df, 0) if ok(p) else 0
        if ok(p) and df >= 1:
            r_ci = _around(p["ratio"], half["ratio"])
            scale = p["samples_to_target"] / p["ratio"]
            q.update(ratio_ci=r_ci, time_ratio_ci=_around(p["time_ratio"], half["time_ratio"]),
                     samples_to_target_ci=[x * scale for x in r_ci],
                     time_to_target_ci=[x * scale / p["throughput"] for x in r_ci],
                     verdict=invariance.verdict(math.log(r_ci[0]), math.log(r_ci[1]), margin))
        else:
            q.update(ratio_ci=[None, None], time_ratio_ci=[None, None],
                     samples_to_target_ci=[None, None], time_to_target_ci=[None, None],
                     verdict="inconclusive")
        out[name] = q
    return out


def _around(x: float, half: float) -> list:
    return [x * math.exp(-half), x * math.exp(half)]
