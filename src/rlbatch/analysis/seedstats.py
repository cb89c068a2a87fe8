"""Intervals across seeds that keep their stated coverage at 2-10 seeds (docs/analysis.md,
"Intervals across seeds").

Model, per quantity X (N*, q or T of a run): log X = m_c + e with e ~ N(0, s^2), one mean
m_c per configuration and one s pooled over the configurations fitted together (a common
coefficient of variation), so the degrees of freedom are all runs minus all configurations
(df = N - k), not one configuration's n - 1. A run that did not reach the target has log N*
and log T only bounded below (its last evaluated samples and seconds); it enters through the
censored normal likelihood (Tobit), fitted by EM. Intervals are m_c +- t_df se_c, and a
ratio of two configurations is exp(m_a - m_b) with se = sqrt(se_a^2 + se_b^2): exact under
the model without censoring; with censoring se_c uses the censored runs' Fisher information.
`p_below` is the one-sided confidence that m_a < m_b (the t cdf at -d/se): uniform when the
two are equal, so a claim made at p >= 1 - a is wrong in at most a of such comparisons.
Coverage measured by simulation: bench/coverage.py. No torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

MIN_S = 1e-9  # floor of the pooled s in the EM (identical values give s = 0)


@dataclass(frozen=True)
class Sample:
    """One configuration's runs of one quantity: `values` (> 0, the bound where censored)."""

    values: np.ndarray
    censored: np.ndarray


@dataclass(frozen=True)
class PooledFit:
    """Per configuration: `m` (mean of logs; None when every run is censored), `at_bounds`
    (mean of logs with censored runs at their bounds: a lower bound of m), `info` (effective
    runs: Fisher information x s^2; the run count without censoring), `n` (runs); and the
    pooled `s` (df-corrected; None without replicates) with its degrees of freedom `df`."""

    m: dict
    at_bounds: dict
    info: dict
    n: dict
    s: float | None
    df: int

    def se(self, c: str) -> float | None:
        if self.s is None or not self.info.get(c):
            return None
        return self.s / math.sqrt(self.info[c])


def _usable(sample: Sample) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(sample.values, dtype=np.float64)
    c = np.asarray(sample.censored, dtype=bool)
    ok = np.isfinite(v) & (v > 0)
    return np.log(v[ok]), c[ok]


def fit_pooled(samples: dict[str, Sample], iters: int = 500, tol: float = 1e-10) -> PooledFit:
    """The pooled log-normal (Tobit where censored) fit of several configurations. A
    configuration whose every run is censored says nothing about the spread: it is left out
    of s and df, its mean is None, and its bounds bound its mean below (`at_bounds`)."""
    data = {k: _usable(v) for k, v in samples.items()}
    data = {k: d for k, d in data.items() if len(d[0])}
    at_bounds = {k: float(np.mean(d[0])) for k, d in data.items()}
    n = {k: len(d[0]) for k, d in data.items()}
    names = [k for k, d in data.items() if not d[1].all()]  # identified: a run crossed
    if not names:
        return PooledFit({k: None for k in data}, at_bounds, {}, n, None, 0)
    y = np.concatenate([data[k][0] for k in names])
    cens = np.concatenate([data[k][1] for k in names])
    g = np.concatenate([np.full(n[k], i) for i, k in enumerate(names)])
    big_n, kk = len(y), len(names)
    df = big_n - kk
    m, s = _em(y, cens, g, kk, np.array([at_bounds[k] for k in names]), df, iters, tol)
    info = _information(y, cens, g, kk, m, s)
    m_by = {k: None for k in data}
    m_by.update({k: float(m[i]) for i, k in enumerate(names)})
    return PooledFit(m=m_by, at_bounds=at_bounds,
                     info={k: float(info[i]) for i, k in enumerate(names)}, n=n,
                     s=s * math.sqrt(big_n / df) if df > 0 else None, df=df)


def _hazard(a: np.ndarray) -> np.ndarray:
    """phi(a) / (1 - Phi(a)), the inverse Mills ratio (stable for large a)."""
    return np.exp(sps.norm.logpdf(a) - sps.norm.logsf(a))


def _em(y, cens, g, k, m0, df, iters, tol) -> tuple[np.ndarray, float]:
    """EM for the censored normal with one mean per group and a pooled sd (MLE)."""
    n = np.bincount(g, minlength=k).astype(np.float64)
    m = m0.copy()
    r = y - m[g]
    s = max(math.sqrt(float(r @ r) / max(df, 1)), MIN_S)
    if not cens.any():
        return m, max(math.sqrt(float(r @ r) / len(y)), 0.0)
    for _ in range(iters):
        a = (y - m[g]) / s
        lam = np.where(cens, _hazard(a), 0.0)
        ey = np.where(cens, m[g] + s * lam, y)  # E[log X | log X >= bound]
        var = np.where(cens, s * s * (1.0 + a * lam - lam * lam), 0.0)
        m_new = np.bincount(g, weights=ey, minlength=k) / n
        s_new = max(math.sqrt(float((var + (ey - m_new[g]) ** 2).sum()) / len(y)), MIN_S)
        done = np.max(np.abs(m_new - m)) < tol and abs(s_new - s) < tol
        m, s = m_new, s_new
        if done:
            break
    return m, s


def _information(y, cens, g, k, m, s) -> np.ndarray:
    """Per group: Fisher information for its mean, in units of 1/s^2 (1 per observed run;
    lam (lam - a) < 1 per censored one)."""
    if s <= MIN_S:
        return np.bincount(g, minlength=k).astype(np.float64)
    a = (y - m[g]) / s
    lam = _hazard(a)
    w = np.where(cens, lam * (lam - a), 1.0)
    return np.bincount(g, weights=w, minlength=k)


def t_quantile(df: int, ci: float) -> float:
    return float(sps.t.ppf(0.5 + ci / 2.0, df))


def config_interval(fit: PooledFit, c: str, ci: float) -> list:
    """[lo, hi] of exp(m_c) at level `ci`; an end is None where it cannot be bounded: no
    replicates anywhere (df < 1), or (upper end) every run of c censored."""
    if c not in fit.at_bounds or fit.df < 1:
        return [None, None]
    se = _side_se(fit, c)
    if se is None:
        return [None, None]
    t = t_quantile(fit.df, ci)
    if fit.m[c] is None:  # all censored: their bounds bound the mean below
        return [_exp(fit.at_bounds[c] - t * se), None]
    return [_exp(fit.m[c] - t * se), _exp(fit.m[c] + t * se)]


def _side_se(fit: PooledFit, c: str) -> float | None:
    """se of configuration c's mean: from the fit, or for an all-censored configuration that
    of the mean of its bounds (which bound its mean below)."""
    if fit.s is None:
        return None
    if fit.m[c] is None:
        return fit.s / math.sqrt(fit.n[c])
    return fit.se(c)


def contrast(fit: PooledFit, a: str, b: str, ci: float) -> dict:
    """exp(m_a - m_b): `point`, `ci` [lo, hi] at `ci`, `log_ci` (raw, +-inf allowed), and
    `p_below`, the one-sided confidence that m_a < m_b. Unknown parts are None; where one
    side has every run censored only one end is bounded (its mean lies above its bounds)."""
    out = {"point": None, "ci": [None, None], "log_ci": (math.nan, math.nan), "p_below": None}
    if a not in fit.at_bounds or b not in fit.at_bounds:
        return out
    ma, mb = fit.m[a], fit.m[b]
    if ma is not None and mb is not None:
        out["point"] = _exp(ma - mb)
    se_a, se_b = _side_se(fit, a), _side_se(fit, b)
    if se_a is None or se_b is None or fit.df < 1:
        return out
    t = t_quantile(fit.df, ci)
    se = math.hypot(se_a, se_b)
    if ma is not None and mb is not None:
        d = ma - mb
        out["log_ci"] = (d - t * se, d + t * se)
        out["p_below"] = _p_below(d, se, fit.df)
    elif ma is None and mb is not None:  # a is only bounded below: so is a - b, and no
        out["log_ci"] = (fit.at_bounds[a] - mb - t * se, math.inf)  # claim that a is lower
    elif mb is None and ma is not None:
        out["log_ci"] = (-math.inf, ma - fit.at_bounds[b] + t * se)
    else:
        out["log_ci"] = (-math.inf, math.inf)
    out["ci"] = [_exp(x) if math.isfinite(x) else (0.0 if x < 0 else None)
                 for x in out["log_ci"]]
    return out


def p_below(d: float, se: float, df: int) -> float:
    """The one-sided confidence that a difference estimated at d (se, df) is below 0."""
    return _p_below(d, se, df)


def _p_below(d: float, se: float, df: int) -> float:
    if se <= 0:
        return 1.0 if d < 0 else (0.0 if d > 0 else 0.5)
    return float(sps.t.cdf(-d / se, df))


def _exp(x: float) -> float | None:
    if math.isnan(x) or math.isinf(x):
        return None
    return math.exp(x) if x < 700 else None


def seeds_for(se_one: float | None, df: int, log_effect: float, power: float = 0.8,
              alpha: float = 0.05, most: int = 1000) -> int | None:
    """Seeds per side that resolve a log difference `log_effect` one-sidedly at level
    `alpha` with probability `power`, given the pooled s (`se_one`: s of one run)."""
    if se_one is None or not log_effect or not math.isfinite(log_effect):
        return None
    if se_one <= 0:  # runs that do not vary (a deterministic trainer): the limit, two seeds
        return 2
    for n in range(2, most + 1):
        dfn = max(df, 2 * n - 2)
        se = se_one * math.sqrt(2.0 / n)
        if abs(log_effect) / se >= sps.t.ppf(1 - alpha, dfn) + sps.t.ppf(power, dfn):
            return n
    return None


def detectable_log_ratio(se: float | None, df: int, power: float = 0.8,
                         alpha: float = 0.05) -> float | None:
    """The smallest |log difference| a comparison with standard error `se` resolves at
    level `alpha` with probability `power`."""
    if se is None or df < 1:
        return None
    return float(se * (sps.t.ppf(1 - alpha, df) + sps.t.ppf(power, df)))
