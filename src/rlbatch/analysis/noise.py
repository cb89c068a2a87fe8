"""Noise-scale model of batch size (McCandlish et al. 2018) over run logs.

Fits the model S = S_min (1 + B_noise/B), E = E_min (1 + B/B_noise) of McCandlish et al.
(arXiv:1812.06162) to the runs' rollout steps S = N*/B and samples E = N* to target: a
straight line in (1/E, 1/S) gives S_min, E_min and their critical batch B_crit =
E_min/S_min, reported with the 20%-overhead CBS of Zhang et al. 2024 that it implies. It
also summarizes the logged B_simple (algos/noise_scale.py) per run, and predicts time to
target at other batch sizes from a reference run, T_hat(B) = N*_hat(B) / q_hat(B). The
derivation, the summary statistic and which batch each noise scale is compared with:
docs/design.md, "Module notes". No torch import.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

NOISE_COLUMNS = {"actor": "actor/noise_scale", "critic": "critic/noise_scale"}
ZHANG_OVERHEAD = 0.2


def mccandlish_fit(sequences, samples_to_target) -> dict:
    """Fit S = S_min(1 + B_noise/B), E = E_min(1 + B/B_noise) to points (B, N*) by ordinary
    least squares of 1/S on 1/E (S = N*/B, E = N*). Needs two or more distinct B with finite,
    positive N*. Returns s_min, e_min, b_crit (McCandlish 50%-efficiency critical batch),
    the model-implied Zhang 20%-overhead CBS, the point count, and `reason` when no fit."""
    b = np.asarray(sequences, dtype=np.float64)
    e = np.asarray(samples_to_target, dtype=np.float64)
    keep = np.isfinite(b) & np.isfinite(e) & (b > 0) & (e > 0)
    b, e = b[keep], e[keep]
    out = {"s_min": None, "e_min": None, "b_crit_mccandlish": None,
           "cbs_zhang_20pct_model": None, "points": len(b), "reason": None}
    if len(np.unique(b)) < 2:
        out["reason"] = "needs samples to target at two or more batch sizes"
        return out
    s = e / b
    x, y = 1.0 / e, 1.0 / s
    # least squares in closed form: np.polyfit warns (RankWarning) on x ~ 1e-4 to stderr
    dx = x - x.mean()
    if not np.any(dx):
        out["reason"] = "every batch size reached the target at the same N*: no fit"
        return out
    slope = float(np.dot(dx, y - y.mean()) / np.dot(dx, dx))
    intercept = float(y.mean() - slope * x.mean())
    if intercept <= 0 or slope >= 0:
        out["reason"] = (f"points do not follow the S-E hyperbola (intercept {intercept:.3g} "
                         f"must be > 0, slope {slope:.3g} < 0)")
        return out
    b_crit = float(-slope)
    out.update(s_min=float(1.0 / intercept), e_min=float(-slope / intercept),
               b_crit_mccandlish=b_crit, cbs_zhang_20pct_model=ZHANG_OVERHEAD * b_crit)
    return out


def noise_scale_series(steps: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(samples, B_simple) of one run where the column is logged and finite."""
    if steps.empty or column not in steps.columns:
        return np.zeros(0), np.zeros(0)
    v = pd.to_numeric(steps[column], errors="coerce").to_numpy(dtype=np.float64)
    s = steps["samples"].to_numpy(dtype=np.float64)
    keep = np.isfinite(v) & np.isfinite(s)
    return s[keep], v[keep]


def second_half_median(steps: pd.DataFrame, column: str) -> float | None:
    """Median of the logged B_simple over the second half of the run (samples > last/2)."""
    s, v = noise_scale_series(steps, column)
    if len(s) == 0:
        return None
    last = float(steps["samples"].max())
    late = v[s > last / 2.0]
    return float(np.median(late)) if len(late) else None


def config_noise_summary(run_steps: list[pd.DataFrame]) -> dict:
    """Per configuration: median over its runs of each run's second-half median B_simple,
    for actor and critic (None when not logged)."""
    out = {}
    for role, col in NOISE_COLUMNS.items():
        vals = [m for m in (second_half_median(st, col) for st in run_steps) if m is not None]
        out[role] = float(np.median(vals)) if vals else None
    return out


def choose_b_noise(actor_b_simple: list[float | None], fit: dict) -> tuple[float | None, str | None]:
    """B_noise for prediction: the median of the configurations' actor B_simple if any was
    logged, else the fitted McCandlish B_crit, else None."""
    vals = [v for v in actor_b_simple if v is not None and math.isfinite(v) and v > 0]
    if vals:
        return float(np.median(vals)), "b_simple_actor"
    if fit.get("b_crit_mccandlish"):
        return float(fit["b_crit_mccandlish"]), "b_crit_mccandlish_fit"
    return None, None


def compared_batch(b_noise_source: str | None) -> str:
    """The configuration key of the batch B_noise is compared with (docs/design.md, "Module
    notes"):
    `minibatch_sequences` for the logged B_simple (per optimizer update), else
    `sequences_per_step` (the unit of the McCandlish fit)."""
    return "minibatch_sequences" if b_noise_source == "b_simple_actor" else "sequences_per_step"


def predicted_samples(b: float, nstar_ref: float, b_ref: float, b_noise: float) -> float:
    """N*_hat(B) = N*_ref (1 + B/B_noise) / (1 + B_ref/B_noise) (McCandlish E(B) model)."""
    return nstar_ref * (1.0 + b / b_noise) / (1.0 + b_ref / b_noise)


def predict_time(b: float | None, q: float | None, nstar_ref: float | None, b_ref: float | None,
                 b_noise: float | None) -> dict:
    """{"predicted_samples_to_target", "predicted_time_to_target"} for one configuration;
    None where an input is missing."""
    if None in (b, nstar_ref, b_ref, b_noise):
        return {"predicted_samples_to_target": None, "predicted_time_to_target": None}
    n_hat = predicted_samples(b, nstar_ref, b_ref, b_noise)
    t_hat = n_hat / q if q else None
    return {"predicted_samples_to_target": n_hat, "predicted_time_to_target": t_hat}
