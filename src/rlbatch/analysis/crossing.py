"""Per run: samples to target N*, time to target T and throughput q (docs/design.md vocabulary).

N* is the *first* crossing of the target on the samples axis, linearly interpolated between
the two evaluation points that bracket it: with v_{i-1} < target <= v_i,

    N* = s_{i-1} + (target - v_{i-1}) / (v_i - v_{i-1}) * (s_i - s_{i-1}).

A value equal to the target counts as reached (so a tie lands exactly on that point); if the
first evaluation already meets the target, N* is its samples. A run that never reaches the
target is *censored*: N* is unknown and only bounded below by its last evaluated samples
("> last samples"); nothing is extrapolated. Null/NaN metric values are skipped.

T maps N* through the step log: train_s is linearly interpolated at N* between the
steps.jsonl (samples, train_s) pairs, with (0, 0) prepended (both counters are cumulative from
zero); if the step log does not cover N*, the evaluation rows' (samples, train_s) are used.
q = last samples / last train_s of the step log (whole loop), falling back to the eval rows.

Smoothing is off by default; `smooth=k` replaces each value by the trailing mean of the last
k valid evaluations (it never looks ahead, so it cannot move a crossing earlier than data
allow). No torch import.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlbatch.core.errors import DataError, UserError

_TARGET = re.compile(r"^\s*([A-Za-z0-9_./:\-@]+)\s*(>=|<=|=)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Target:
    """A target: `metric` reaches `value` (>= when higher_is_better, else <=), or, when
    `gain` is set instead, the run's own step-0 value plus `gain` (a relative target)."""

    metric: str
    value: float | None
    higher_is_better: bool = True
    gain: float | None = None

    def as_dict(self) -> dict:
        return {"metric": self.metric, "value": self.value, "gain": self.gain,
                "direction": "higher" if self.higher_is_better else "lower"}

    def threshold(self, start: float | None) -> float | None:
        """The absolute value to reach, given the run's step-0 value (None if unknown)."""
        if self.gain is None:
            return self.value
        if start is None or not math.isfinite(start):
            return None
        return start + self.gain if self.higher_is_better else start - self.gain


def parse_target(text: str) -> Target:
    """`eval/accuracy=0.8` (or `>=`): reach 0.8 or more; `eval/loss<=0.3`: 0.3 or less;
    `eval/accuracy=+0.15`: the run's step-0 value plus 0.15 (a relative target)."""
    m = _TARGET.match(text or "")
    value = None
    if m:
        try:
            value = float(m.group(3))
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise UserError(f"--target: expected METRIC=VALUE (e.g. eval/accuracy=0.8), got '{text}'")
    higher = m.group(2) != "<="
    if m.group(3).startswith("+"):
        if value <= 0:
            raise UserError(f"--target: a relative gain must be positive, got '{text}'")
        return Target(m.group(1), None, higher_is_better=higher, gain=value)
    return Target(m.group(1), value, higher_is_better=higher)


@dataclass(frozen=True)
class Crossing:
    """First crossing of a target. `samples` is N* (None when censored); `last_samples` is
    the last evaluated samples (the censoring bound); `index` the first point meeting it."""

    samples: float | None
    censored: bool
    last_samples: float | None
    index: int | None


def first_crossing(samples, values, target: float, higher_is_better: bool = True) -> Crossing:
    """First crossing of `target` by the curve (samples, values), linearly interpolated.
    Points must be sorted by samples; non-finite values are skipped. No extrapolation."""
    s = np.asarray(samples, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(v) & np.isfinite(s)
    s, v = s[keep], v[keep]
    if len(s) == 0:
        return Crossing(None, True, None, None)
    if not higher_is_better:
        v, target = -v, -target
    hits = np.flatnonzero(v >= target)
    if len(hits) == 0:
        return Crossing(None, True, float(s[-1]), None)
    i = int(hits[0])
    if i == 0:
        return Crossing(float(s[0]), False, float(s[-1]), 0)
    frac = (target - v[i - 1]) / (v[i] - v[i - 1])  # v[i-1] < target <= v[i]: no 0-division
    return Crossing(float(s[i - 1] + frac * (s[i] - s[i - 1])), False, float(s[-1]), i)


def smooth_trailing(values, window: int) -> np.ndarray:
    """Trailing mean over the last `window` values (fewer at the start); window 1 = none."""
    v = np.asarray(values, dtype=np.float64)
    if window < 1:
        raise UserError(f"--smooth must be >= 1 evaluations, got {window}")
    if window == 1 or len(v) == 0:
        return v
    csum = np.concatenate([[0.0], np.cumsum(v)])
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def metric_curve(rows: pd.DataFrame, metric: str, smooth: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(samples, values) of one run's metric: non-finite values dropped, then smoothed."""
    if rows.empty or metric not in rows.columns:
        return np.zeros(0), np.zeros(0)
    v = pd.to_numeric(rows[metric], errors="coerce").to_numpy(dtype=np.float64)
    s = rows["samples"].to_numpy(dtype=np.float64)
    keep = np.isfinite(v)
    return s[keep], smooth_trailing(v[keep], smooth)


def _pairs(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    if rows.empty or "train_s" not in rows.columns:
        return np.zeros(0), np.zeros(0)
    s = rows["samples"].to_numpy(dtype=np.float64)
    t = rows["train_s"].to_numpy(dtype=np.float64)
    keep = np.isfinite(s) & np.isfinite(t)
    s, t = s[keep], t[keep]
    if len(s) and s[0] > 0:
        s, t = np.concatenate([[0.0], s]), np.concatenate([[0.0], t])
    return s, t


def time_at_samples(n: float | None, steps: pd.DataFrame, evals: pd.DataFrame) -> float | None:
    """Training seconds at `n` samples: interpolated on the step log's (samples, train_s),
    falling back to the eval rows' when the step log does not reach `n`; None if neither."""
    if n is None:
        return None
    for rows in (steps, evals):
        s, t = _pairs(rows)
        if len(s) and s[0] <= n <= s[-1]:
            return float(np.interp(n, s, t))
    return None


def throughput(steps: pd.DataFrame, evals: pd.DataFrame) -> float | None:
    """q = samples per training second over the whole run: last samples / last train_s of
    the step log (eval rows if there is none). None when train_s is not positive."""
    for rows in (steps, evals):
        s, t = _pairs(rows)
        if len(s) and t[-1] > 0:
            return float(s[-1] / t[-1])
    return None


def start_value(samples: np.ndarray, values: np.ndarray) -> float | None:
    """The curve's value at samples == 0 (the step-0 evaluation), else None."""
    at0 = np.flatnonzero(samples == 0)
    return float(values[at0[0]]) if len(at0) else None


def run_result(steps: pd.DataFrame, evals: pd.DataFrame, target: Target, source: str = "evals",
               smooth: int = 1) -> dict:
    """One run's N*, T (or their censoring bounds) and q. `source` says which log holds the
    target metric ("evals", or "steps" for a per-step metric such as reward/mean).

    `throughput_to_target` is q over the same span as N*: N* / T (the decision rule's q); for
    a censored run it falls back to the whole-run q. `too_easy` is true when the target is
    met at or before the first evaluation after step 0 (the crossing is then not resolved by
    any training). `evaluations_before_target` counts evaluations with samples below N*."""
    curve_rows = evals if source == "evals" else steps
    s, v = metric_curve(curve_rows, target.metric, smooth)
    threshold = target.threshold(start_value(s, v))
    if threshold is None:
        c = Crossing(None, True, float(s[-1]) if len(s) else None, None)
    else:
        c = first_crossing(s, v, threshold, target.higher_is_better)
    t = time_at_samples(c.samples, steps, evals)
    q_run = throughput(steps, evals)
    q_span = c.samples / t if c.samples and t else None
    first_trained = int(np.argmax(s > 0)) if np.any(s > 0) else None
    return {
        "samples_to_target": c.samples,
        "time_to_target": t,
        "censored": c.censored,
        "threshold": threshold,
        "evaluations": len(s),
        "evaluations_before_target": None if c.censored else int(np.sum(s < c.samples)),
        "too_easy": bool(c.index is not None and first_trained is not None
                         and c.index <= first_trained),
        "first_evaluation_samples": None if first_trained is None else float(s[first_trained]),
        "last_samples": c.last_samples,
        "last_train_s": time_at_samples(c.last_samples, steps, evals),
        "throughput": q_run,
        "throughput_to_target": q_span if q_span is not None else q_run,
    }


def metric_source(frames, metric: str) -> str:
    """"evals" if any run logged `metric` in evals.jsonl, else "steps" if any step row has
    it; otherwise a DataError naming the metric and the columns that do exist."""
    for name, df in (("evals", frames.evals), ("steps", frames.steps)):
        if metric in df.columns and pd.to_numeric(df[metric], errors="coerce").notna().any():
            return name
    known = sorted(c for c in frames.evals.columns if c.startswith("eval/"))
    raise DataError(f"target metric '{metric}' is absent from all runs"
                    f"{'; eval metrics: ' + ', '.join(known) if known else ''}")


def per_run_records(frames, target: Target, smooth: int = 1) -> list[dict]:
    """One dict per run: the `runs` frame row (run, config, seed, B, lr, ...) + run_result().
    A run without any finite value of the metric has evaluations == 0 (callers drop it)."""
    source = metric_source(frames, target.metric)
    out = []
    for rec in frames.runs.to_dict("records"):
        res = run_result(frames.run_steps(rec["run"]), frames.run_evals(rec["run"]), target,
                         source, smooth)
        out.append({**rec, **res})
    return out


def per_run_table(frames, target: Target, smooth: int = 1) -> pd.DataFrame:
    """per_run_records as a tidy frame (one row per run)."""
    return pd.DataFrame(per_run_records(frames, target, smooth))
