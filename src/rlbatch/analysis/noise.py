"""Noise-scale model of batch size (McCandlish et al. 2018) over run logs.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv:1812.06162)
model the optimizer steps S and samples E needed to reach a fixed target at batch B as

    S = S_min (1 + B_noise / B),    E = E_min (1 + B / B_noise),    E = B S,

equivalently (S/S_min - 1)(E/E_min - 1) = 1 with B_noise = E_min / S_min. Expanding the
product gives S E = S E_min + S_min E, i.e. dividing by S E,

    1/S = 1/S_min - (E_min / S_min) * (1/E),

a straight line in (1/E, 1/S): intercept a = 1/S_min, slope b = -E_min/S_min. So
S_min = 1/a, E_min = -b/a and B_crit = E_min/S_min = -b, their *critical batch* at which
training takes twice the minimum steps and twice the minimum samples (50% efficiency on
both). Here S = N*/B (rollout steps) and E = N* (samples); B is sequences per step.

Under the same model, Zhang et al. 2024's critical batch size (CBS: 20% more steps than
perfect linear scaling, S(B) = 1.2 E_min/B) is B = 0.2 B_crit; reported as model-implied.

B_simple = tr(Sigma)/|G|^2 logged per step (`actor/noise_scale`, `critic/noise_scale`,
estimated by algos/noise_scale.py) is summarized per run as its median over the second half
of training (rows with samples > half of the run's last samples), where it is most stable.

Prediction of time to target from short probes (docs/design.md T = N*/q):
    N*_hat(B) = N*_ref (1 + B/B_noise) / (1 + B_ref/B_noise),   T_hat(B) = N*_hat(B) / q_hat(B)
with B_noise = B_simple (actor) when logged, else the fitted B_crit. B and B_noise must be in
the same unit (`compared_batch`). B_simple is the noise scale of the gradient of one optimizer
update, so the batch it is compared with is the optimizer minibatch (`minibatch_sequences` =
sequences per step / minibatches per step), not the rollout batch: a run with 4 minibatches
per step takes 4 updates of B/4 sequences each. The fitted B_crit is in sequences per step
(S above counts rollout steps), so it is compared with `sequences_per_step`. With several
epochs per step a sample enters several updates, which the model does not describe.
No torch import.
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
    slope, intercept = np.polyfit(x, y, 1)
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
    """The configuration key of the batch B_noise is compared with (module docstring):
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
