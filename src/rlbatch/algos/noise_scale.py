"""Gradient noise scale B_simple = tr(Sigma) / |G|^2 from two batch sizes.

Implements the unbiased two-batch estimator of McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training" (arXiv:1812.06162), Appendix A.1: a gradient averaged over B
samples has E|G_B|^2 = |G|^2 + tr(Sigma)/B, so |G_B|^2 at two batch sizes gives |G|^2 and
tr(Sigma). `NoiseScaleEMA` smooths numerator and denominator separately before dividing, as
the paper does. In the trainer the small batch is the micro-batch and the big one the
minibatch; micro-batches of unequal sizes enter through their harmonic mean
(`effective_small_batch`), which keeps both estimates unbiased.

Deviation from the paper: a "sample" is one sequence; with a token-mean loss the
per-sequence gradients are only approximately i.i.d. with equal weight. Pure math: Python
floats or numpy arrays in, the same out; no torch import. The formulas, the harmonic-mean
argument and why micro-batches must be random subsets: docs/design.md, "Module notes".
"""

from __future__ import annotations

import math

import numpy as np


def _check_sizes(b_small: float, b_big: float) -> None:
    if not (0 < b_small < b_big):
        raise ValueError(
            f"two-batch estimator needs 0 < b_small < b_big, got b_small={b_small}, b_big={b_big} "
            "(micro_batch_sequences must be smaller than the minibatch)"
        )


def _out(x):
    arr = np.asarray(x, dtype=np.float64)
    return float(arr) if arr.ndim == 0 else arr


def effective_small_batch(sizes) -> float:
    """b_eff = 1 / mean_i(1/b_i): the small batch size at which the mean over micro-batches
    of |g_i|^2 has the expectation |G|^2 + tr(Sigma)/b_eff (docs/design.md, "Module
    notes"); the harmonic mean of the micro-batch sizes b_i (sequences), equal to b when
    every b_i = b."""
    b = np.asarray(sizes, dtype=np.float64)
    if b.size == 0 or not (b > 0).all():
        raise ValueError(f"micro-batch sizes must be positive and at least one, got {sizes!r}")
    if (b == b[0]).all():
        return float(b[0])  # exactly b, not b up to rounding
    return float(b.size / (1.0 / b).sum())


def unbiased_grad_sq(g_small_sq, g_big_sq, b_small: float, b_big: float):
    """|G|^2 estimate, McCandlish et al. 2018 App. A.1:
    (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)."""
    _check_sizes(b_small, b_big)
    small_sq = np.asarray(g_small_sq, dtype=np.float64)
    big_sq = np.asarray(g_big_sq, dtype=np.float64)
    return _out((b_big * big_sq - b_small * small_sq) / (b_big - b_small))


def trace_sigma(g_small_sq, g_big_sq, b_small: float, b_big: float):
    """tr(Sigma) estimate (per-sample gradient covariance trace), McCandlish et al. 2018
    App. A.1: (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)."""
    _check_sizes(b_small, b_big)
    small_sq = np.asarray(g_small_sq, dtype=np.float64)
    big_sq = np.asarray(g_big_sq, dtype=np.float64)
    return _out((small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big))


def b_simple_ratio(trace, grad_sq):
    """B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, the simple noise scale). NaN where |G|^2 <= 0
    (the estimate of |G|^2 is not significant yet), never a division by zero."""
    t = np.asarray(trace, dtype=np.float64)
    g = np.asarray(grad_sq, dtype=np.float64)
    safe = np.where(g > 0, g, 1.0)
    return _out(np.where(g > 0, t / safe, np.nan))


def two_batch_estimate(g_small_sq, g_big_sq, b_small: float, b_big: float) -> dict:
    """All three quantities from one pair of measurements (no smoothing).

    Returns {"grad_sq": |G|^2, "trace": tr(Sigma), "b_simple": tr(Sigma)/|G|^2}.
    """
    g2 = unbiased_grad_sq(g_small_sq, g_big_sq, b_small, b_big)
    tr = trace_sigma(g_small_sq, g_big_sq, b_small, b_big)
    return {"grad_sq": g2, "trace": tr, "b_simple": b_simple_ratio(tr, g2)}


class NoiseScaleEMA:
    """EMA-smoothed B_simple: smooths |G|^2 and tr(Sigma) separately, then divides
    (McCandlish et al. 2018 App. A.1). Both averages are bias-corrected like Adam's moments
    (divided by 1 - decay^t); the correction cancels in the ratio but makes `grad_sq` and
    `trace` readable from the first update.

    >>> ema = NoiseScaleEMA(decay=0.9)
    >>> ema.update(g_small_sq=3.0, g_big_sq=1.5, b_small=1, b_big=4)  # |G|^2=1, tr=2
    2.0
    """

    def __init__(self, decay: float = 0.9):
        if not (0.0 <= decay < 1.0):
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self._grad_sq = 0.0
        self._trace = 0.0
        self._weight = 0.0  # 1 - decay^t: the bias correction
        self.count = 0

    def update(self, g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> float:
        """Fold one measurement in; return the smoothed B_simple (NaN while |G|^2 <= 0).
        Non-finite inputs raise ValueError: a NaN would poison the average forever."""
        if not (math.isfinite(g_small_sq) and math.isfinite(g_big_sq)):
            raise ValueError(f"non-finite squared norms: {g_small_sq}, {g_big_sq}")
        g2 = unbiased_grad_sq(g_small_sq, g_big_sq, b_small, b_big)
        tr = trace_sigma(g_small_sq, g_big_sq, b_small, b_big)
        d = self.decay
        self._grad_sq = d * self._grad_sq + (1.0 - d) * g2
        self._trace = d * self._trace + (1.0 - d) * tr
        self._weight = d * self._weight + (1.0 - d)
        self.count += 1
        return self.b_simple

    @property
    def grad_sq(self) -> float:
        """Smoothed |G|^2 (NaN before the first update)."""
        return self._grad_sq / self._weight if self._weight > 0 else math.nan

    @property
    def trace(self) -> float:
        """Smoothed tr(Sigma) (NaN before the first update)."""
        return self._trace / self._weight if self._weight > 0 else math.nan

    @property
    def b_simple(self) -> float:
        """Smoothed tr(Sigma) / smoothed |G|^2; NaN before any update or while |G|^2 <= 0."""
        if self._weight == 0:
            return math.nan
        return b_simple_ratio(self.trace, self.grad_sq)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "grad_sq": self._grad_sq, "trace": self._trace,
                "weight": self._weight, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.decay = float(state["decay"])
        self._grad_sq = float(state["grad_sq"])
        self._trace = float(state["trace"])
        self._weight = float(state["weight"])
        self.count = int(state["count"])
