"""Per-configuration statistics across seeds: N*, q and T with intervals, and the ratios
of a candidate to the reference (docs/analysis.md).

Estimates and intervals come from the pooled log-normal model of seedstats.py, fitted to
the configurations of one algorithm together: N*, q and T are geometric means across seeds
(the median of a log-normal), a run that did not reach the target entering N* and T as
censored at its last samples and seconds. A run's q is measured over the same span as its
N* (samples to target / training seconds to target), so per run log T = log N* - log q and
the T ratio is the N* ratio over the q ratio. Intervals are two-sided at `ci` (default
0.90: each end is a one-sided 95% bound, as a TOST equivalence test at the 5% level uses).

The bootstrap helpers below serve the pointwise bands of the invariance curves
(invariance.py); the descriptive `samples_to_target_median` follows the censored-median
rule of `median_summary`. No torch import.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from rlbatch.analysis import seedstats
from rlbatch.analysis.defaults import DEFAULT_BOOT, DEFAULT_CI  # noqa: F401  (re-exported)


def boot_indices(n: int, n_boot: int, seed: int, key: str) -> np.ndarray:
    """(n_boot, n) resampling indices from Generator(seed, crc32(key)): same key, same draws."""
    rng = np.random.default_rng([int(seed), zlib.crc32(key.encode())])
    return rng.integers(0, n, size=(n_boot, n))


def censored_bounds(values, censored, lower) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per run: the value itself, or for a censored run (lower bound, +inf).
    A missing value or lower bound (None) counts as 0 for lo, +inf for hi."""
    lo, hi = [], []
    for v, c, b in zip(values, censored, lower):
        if not c and v is not None and math.isfinite(v):
            lo.append(float(v))
            hi.append(float(v))
        else:
            lo.append(float(b) if b is not None and math.isfinite(b) else 0.0)
            hi.append(math.inf)
    return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)


def finite_or_none(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def quantile(x: np.ndarray, q: float) -> float:
    """Percentile of a bootstrap distribution ("inverted_cdf": an actual draw); may be +-inf;
    NaN if any draw is NaN."""
    if np.isnan(x).any():
        return math.nan
    return float(np.quantile(x, q, method="inverted_cdf"))


def raw_interval(lo_dist: np.ndarray, hi_dist: np.ndarray, ci: float) -> tuple[float, float]:
    """(lower, upper) percentile interval at level `ci`: the lower end from the lower-bound
    distribution, the upper end from the upper-bound one; ends may be +-inf or NaN."""
    a = (1.0 - ci) / 2.0
    return quantile(lo_dist, a), quantile(hi_dist, 1.0 - a)


def interval(lo_dist: np.ndarray, hi_dist: np.ndarray, ci: float) -> list:
    """raw_interval as a JSON-ready list; non-finite ends become None (unbounded/undefined)."""
    return [finite_or_none(x) for x in raw_interval(lo_dist, hi_dist, ci)]


def median_summary(values, censored, lower) -> dict:
    """Point median across runs (None when it involves a censored run) and its lower bound."""
    lo, hi = censored_bounds(values, censored, lower)
    return {"median": finite_or_none(np.median(hi)), "lower_bound": finite_or_none(np.median(lo))}


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else finite_or_none(a / b)



@dataclass(frozen=True)
class SweepFit:
    """Pooled fits (seedstats.PooledFit) of log N*, log q and log T of the configurations
    analysed together."""

    nstar: seedstats.PooledFit
    q: seedstats.PooledFit
    time: seedstats.PooledFit


def _value(r: dict, key: str, bound: str) -> tuple[float, bool]:
    """(value, censored) of one run: the measured value, or for a run that did not reach
    the target its bound (last samples or seconds), censored."""
    if r["censored"] or r.get(key) is None:
        b = r.get(bound)
        return (math.nan if b is None else float(b)), True
    return float(r[key]), False


def run_samples(runs: list[dict]) -> tuple[seedstats.Sample, seedstats.Sample,
                                            seedstats.Sample]:
    """N*, q (over the span to the target) and T of one configuration's runs."""
    def sample(key, bound):
        pairs = [_value(r, key, bound) for r in runs]
        return seedstats.Sample(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    q = np.array([math.nan if r.get("throughput_to_target") is None
                  else float(r["throughput_to_target"]) for r in runs])
    return (sample("samples_to_target", "last_samples"),
            seedstats.Sample(q, np.zeros(len(runs), dtype=bool)),
            sample("time_to_target", "last_train_s"))


def fit_sweep(groups: list[dict]) -> SweepFit:
    """One pooled fit of the configurations `groups` (each {"config", "runs"})."""
    parts = {g["config"]: run_samples(g["runs"]) for g in groups}
    return SweepFit(*(seedstats.fit_pooled({c: p[i] for c, p in parts.items()})
                      for i in range(3)))


def fit_by_algorithm(groups: list[dict]) -> dict[str, SweepFit]:
    """Config id -> the pooled fit of its algorithm's configurations (GRPO and PPO runs have
    noise of their own, so they do not share a variance)."""
    pools: dict = {}
    for g in groups:
        pools.setdefault(g.get("algorithm"), []).append(g)
    out = {}
    for members in pools.values():
        fit = fit_sweep(members)
        out.update({g["config"]: fit for g in members})
    return out


def _estimate(fit: seedstats.PooledFit, c: str) -> tuple[float | None, float | None]:
    """(exp(m), exp(m with censored runs at their bounds)) of configuration c."""
    if c not in fit.at_bounds:
        return None, None
    m = fit.m[c]
    return (None if m is None else finite_or_none(math.exp(m)),
            finite_or_none(math.exp(fit.at_bounds[c])))


def config_stats(config: str, runs: list[dict], fit: SweepFit, ci: float) -> dict:
    """N*, q and T of one configuration (geometric means across seeds, the model's median)
    with intervals at `ci`; `time_to_target_measured` is the median of the runs' training
    seconds to the target and `samples_to_target_median` the median N* (None when it
    involves a censored run)."""
    cens = [r["censored"] for r in runs]
    nstar, n_lower = _estimate(fit.nstar, config)
    q, _ = _estimate(fit.q, config)
    time, t_lower = _estimate(fit.time, config)
    median = median_summary([r["samples_to_target"] for r in runs], cens,
                            [r["last_samples"] for r in runs])
    measured = median_summary([r["time_to_target"] for r in runs],
                              [c or r["time_to_target"] is None for c, r in zip(cens, runs)],
                              [r["last_train_s"] for r in runs])
    if config not in fit.nstar.at_bounds:  # no positive N* (the target met at 0 samples)
        nstar, n_lower = median["median"], median["lower_bound"]
    if config not in fit.time.at_bounds:
        time, t_lower = measured["median"], measured["lower_bound"]
    return {
        "samples_to_target": nstar,
        "samples_to_target_lower_bound": n_lower,
        "samples_to_target_ci": seedstats.config_interval(fit.nstar, config, ci),
        "samples_to_target_median": median["median"],
        "throughput": q,
        "throughput_ci": seedstats.config_interval(fit.q, config, ci),
        "time_to_target": time,
        "time_to_target_lower_bound": t_lower,
        "time_to_target_ci": seedstats.config_interval(fit.time, config, ci),
        "time_to_target_measured": measured["median"],
        "censored_runs": int(sum(cens)),
    }


def compare(fit: SweepFit, cand: str, base: str, ci: float) -> dict:
    """Candidate vs baseline, each ratio cand/base with its interval at `ci`: N* ratio (also
    as a log, for the verdicts), q ratio and T ratio; `p_faster`, the one-sided confidence
    that the candidate's T is lower (seedstats.contrast); `time_ratio_se` and `df`, what the
    T comparison rests on (for the seed planning of selection.next_step)."""
    n = seedstats.contrast(fit.nstar, cand, base, ci)
    q = seedstats.contrast(fit.q, cand, base, ci)
    t = seedstats.contrast(fit.time, cand, base, ci)
    se_c, se_b = fit.time.se(cand), fit.time.se(base)
    return {
        "log_samples_ratio_raw": n["log_ci"],
        "log_samples_ratio_ci": [finite_or_none(x) for x in n["log_ci"]],
        "samples_ratio_ci": n["ci"],
        "throughput_ratio_ci": q["ci"],
        "time_ratio_ci": t["ci"],
        "p_faster": t["p_below"],
        "time_ratio_se": None if se_c is None or se_b is None else math.hypot(se_c, se_b),
        "run_sd_log_time": fit.time.s,
        "df": fit.time.df,
    }
