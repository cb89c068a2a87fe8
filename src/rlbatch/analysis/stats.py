"""Seed-bootstrap statistics per configuration, with censored runs.

T is the decision rule's T = N*/q: the median N* across seeds over the median q, where a
run's q is measured over the same span as its N* (samples to target / training seconds to
target). So the T ratio of two configurations is their N* ratio over their q ratio, in the
point estimate and in every bootstrap resample.

The unit of resampling is the run (seed): each configuration draws its own `n_boot` x n
index matrix from a numpy Generator seeded by (seed, crc32(config id)), so results do not
depend on which other configurations are analysed, and N*, T and q of one configuration are
resampled together (paired). Configurations are resampled independently of each other.

Intervals are percentile intervals at `ci` (default 0.90, two-sided: the 5th and 95th
percentiles, the interval a TOST equivalence test at the 5% level uses), taken with
numpy's "inverted_cdf" method so each end is an actual bootstrap value (never an average of
a finite value and infinity).

Censoring: a run that did not reach the target has N* in (last_samples, inf). Every
statistic is computed twice, with censored values at their lower bound and at +inf; an
interval takes its lower end from the first and its upper end from the second (so censoring
only ever widens it; without censoring both coincide). The median is null when it involves a
censored run, i.e. when more than half of the runs are censored (odd n) or at least half
(even n, where the median averages the two middle runs); its lower bound is then reported.
No torch import.
"""

from __future__ import annotations

import math
import warnings
import zlib
from dataclasses import dataclass

import numpy as np

DEFAULT_CI = 0.90
DEFAULT_BOOT = 2000


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


def _nanmedian_rows(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN resample -> NaN, on purpose
        return np.nanmedian(x, axis=1)


@dataclass(frozen=True)
class ConfigBoot:
    """Bootstrap distributions (length n_boot) of one configuration across seeds: median N*
    with censored runs at their lower bound (`nstar_lo`) and at +inf (`nstar_hi`), median q
    over the span to the target (`q`), and T = median N* / median q (`time_lo`, `time_hi`)."""

    config: str
    n: int
    nstar_lo: np.ndarray
    nstar_hi: np.ndarray
    q: np.ndarray

    @property
    def time_lo(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.nstar_lo / self.q

    @property
    def time_hi(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.nstar_hi / self.q


def _q(runs: list[dict]) -> np.ndarray:
    """Per run q over the span to the target (whole-run q for a censored run); NaN if unknown."""
    return np.asarray([np.nan if r.get("throughput_to_target") is None
                       else r["throughput_to_target"] for r in runs], dtype=np.float64)


def config_boot(config: str, runs: list[dict], n_boot: int, seed: int) -> ConfigBoot:
    """Resample the runs (dicts from crossing.run_result) of one configuration; N* and q of a
    run are drawn together (paired)."""
    n_lo, n_hi = censored_bounds([r["samples_to_target"] for r in runs],
                                 [r["censored"] for r in runs],
                                 [r["last_samples"] for r in runs])
    idx = boot_indices(len(runs), n_boot, seed, config)
    return ConfigBoot(
        config=config, n=len(runs),
        nstar_lo=np.median(n_lo[idx], axis=1), nstar_hi=np.median(n_hi[idx], axis=1),
        q=_nanmedian_rows(_q(runs)[idx]),
    )


def median_summary(values, censored, lower) -> dict:
    """Point median across runs (None when it involves a censored run) and its lower bound."""
    lo, hi = censored_bounds(values, censored, lower)
    return {"median": finite_or_none(np.median(hi)), "lower_bound": finite_or_none(np.median(lo))}


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else finite_or_none(a / b)


def config_stats(runs: list[dict], boot: ConfigBoot, ci: float) -> dict:
    """Medians across seeds and their bootstrap intervals for N*, q and T = N*/q of one
    configuration. `time_to_target` is the decision rule's T (median N* / median q, q over
    the span to the target), so comparing T is the same as comparing q ratio with N* ratio;
    `time_to_target_measured` is the median of the runs' interpolated training seconds."""
    cens = [r["censored"] for r in runs]
    nstar = median_summary([r["samples_to_target"] for r in runs], cens,
                           [r["last_samples"] for r in runs])
    q = _q(runs)
    q_med = float(np.nanmedian(q)) if np.isfinite(q).any() else None
    measured = median_summary([r["time_to_target"] for r in runs],
                              [c or r["time_to_target"] is None for c, r in zip(cens, runs)],
                              [r["last_train_s"] for r in runs])
    return {
        "samples_to_target": nstar["median"],
        "samples_to_target_lower_bound": nstar["lower_bound"],
        "samples_to_target_ci": interval(boot.nstar_lo, boot.nstar_hi, ci),
        "throughput": q_med,
        "throughput_ci": interval(boot.q, boot.q, ci) if q_med is not None else [None, None],
        "time_to_target": _div(nstar["median"], q_med),
        "time_to_target_lower_bound": _div(nstar["lower_bound"], q_med),
        "time_to_target_ci": interval(boot.time_lo, boot.time_hi, ci),
        "time_to_target_measured": measured["median"],
        "censored_runs": int(sum(cens)),
    }


def _log_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(num / den)  # inf/x -> +inf, x/inf -> 0 -> -inf, 0/0 -> NaN


def log_ratio_bounds(cand: ConfigBoot, ref: ConfigBoot) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap distributions bounding log(N*_cand / N*_ref): lower uses the candidate's
    lower bounds over the reference's upper ones, upper the reverse (censoring widens)."""
    return _log_ratio(cand.nstar_lo, ref.nstar_hi), _log_ratio(cand.nstar_hi, ref.nstar_lo)


def _ratio_ci(lo: np.ndarray, hi: np.ndarray, ci: float) -> list:
    a, b = raw_interval(lo, hi, ci)
    return [finite_or_none(math.exp(x)) if not math.isnan(x) else None for x in (a, b)]


def compare(cand: ConfigBoot, base: ConfigBoot, ci: float) -> dict:
    """Candidate vs baseline, each ratio cand/base with its interval at `ci`: N* ratio (also
    as a log, for the invariance verdict), q ratio and T ratio (T = N*/q, so the T ratio is
    the N* ratio over the q ratio in every resample). `p_faster` is the share of resamples in
    which the candidate's T is lower, counting a censored candidate run at +inf and a
    censored baseline run at its lower bound (conservative for the candidate)."""
    lo, hi = log_ratio_bounds(cand, base)
    log_lo, log_hi = raw_interval(lo, hi, ci)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_ratio = cand.q / base.q
    t_lo, t_hi = _log_ratio(cand.time_lo, base.time_hi), _log_ratio(cand.time_hi, base.time_lo)
    return {
        "log_samples_ratio_raw": (log_lo, log_hi),
        "log_samples_ratio_ci": [finite_or_none(log_lo), finite_or_none(log_hi)],
        "samples_ratio_ci": [finite_or_none(math.exp(x)) if not math.isnan(x) else None
                             for x in (log_lo, log_hi)],
        "throughput_ratio_ci": interval(q_ratio, q_ratio, ci),
        "time_ratio_ci": _ratio_ci(t_lo, t_hi, ci),
        "p_faster": float(np.mean(cand.time_hi < base.time_lo)),
    }
