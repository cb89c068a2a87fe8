"""Two-batch gradient-noise-scale estimator (McCandlish et al. 2018, App. A.1)."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlbatch.algos.noise_scale import (
    NoiseScaleEMA,
    b_simple_ratio,
    trace_sigma,
    two_batch_estimate,
    unbiased_grad_sq,
)

MODULE = Path(__file__).resolve().parents[1] / "src" / "rlbatch" / "algos" / "noise_scale.py"


def test_hand_computed_pair():
    # |G|^2 = 1, tr(Sigma) = 2: E|G_1|^2 = 1 + 2/1 = 3, E|G_4|^2 = 1 + 2/4 = 1.5.
    assert unbiased_grad_sq(3.0, 1.5, 1, 4) == 1.0
    assert trace_sigma(3.0, 1.5, 1, 4) == 2.0
    assert two_batch_estimate(3.0, 1.5, 1, 4) == {"grad_sq": 1.0, "trace": 2.0, "b_simple": 2.0}


def test_returns_python_floats_for_scalars_and_arrays_for_arrays():
    assert type(unbiased_grad_sq(3.0, 1.5, 1, 4)) is float
    out = trace_sigma(np.array([3.0, 5.0]), np.array([1.5, 2.0]), 1, 4)
    # (5 - 2) / (1 - 1/4) = 4
    assert out.tolist() == [2.0, 4.0]


def test_b_simple_is_nan_when_grad_sq_not_positive():
    assert math.isnan(b_simple_ratio(1.0, 0.0))
    assert math.isnan(b_simple_ratio(1.0, -0.5))
    assert b_simple_ratio(np.array([2.0, 1.0]), np.array([0.5, -1.0]))[0] == 4.0


@pytest.mark.parametrize("small,big", [(4, 4), (8, 4), (0, 4)])
def test_rejects_batch_sizes_that_cannot_estimate(small, big):
    with pytest.raises(ValueError, match="b_small < b_big"):
        unbiased_grad_sq(1.0, 1.0, small, big)


def test_ema_smooths_numerator_and_denominator_separately():
    ema = NoiseScaleEMA(decay=0.5)
    assert math.isnan(ema.b_simple)
    assert ema.update(3.0, 1.5, 1, 4) == 2.0  # |G|^2 = 1, tr = 2 (bias-corrected: exact)
    # second pair with |G|^2 = 3, tr = 4: E|G_1|^2 = 3 + 4 = 7, E|G_4|^2 = 3 + 4/4 = 4.
    b = ema.update(7.0, 4.0, 1, 4)
    # EMA sums: g = 0.5*(0.5*1) + 0.5*3 = 1.75, tr = 0.5*(0.5*2) + 0.5*4 = 2.5, weight 0.75
    assert ema.grad_sq == 1.75 / 0.75
    assert ema.trace == 2.5 / 0.75
    assert b == 2.5 / 1.75  # ratio of smoothed values, not the mean of ratios (2 and 4/3)
    assert ema.count == 2


def test_ema_state_roundtrip_and_nonfinite_input():
    ema = NoiseScaleEMA(0.9)
    ema.update(3.0, 1.5, 1, 4)
    other = NoiseScaleEMA()
    other.load_state_dict(ema.state_dict())
    assert other.update(7.0, 4.0, 1, 4) == ema.update(7.0, 4.0, 1, 4)
    with pytest.raises(ValueError, match="non-finite"):
        ema.update(float("nan"), 1.0, 1, 4)
    with pytest.raises(ValueError, match="decay"):
        NoiseScaleEMA(1.0)


def _linear_regression_norms(seed, draws, d, sigma, b_small, b_big, r):
    """Squared norms of micro-batch (averaged) and big-batch gradients of the loss
    0.5 (x.w - y)^2 at a fixed w, y = x.w* + eps, x ~ N(0, I), r = w - w*."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((draws, b_big, d))        # (T, B_big, d)
    eps = sigma * rng.standard_normal((draws, b_big))  # (T, B_big)
    g = x * (x @ r - eps)[..., None]                   # per-example gradients (T, B_big, d)
    micro = g.reshape(draws, b_big // b_small, b_small, d).mean(axis=2)
    g_small_sq = (micro ** 2).sum(-1).mean(-1)         # mean over micro-batches of |g_micro|^2
    g_big_sq = (g.mean(axis=1) ** 2).sum(-1)           # |accumulated gradient|^2
    return g_small_sq, g_big_sq


def test_recovers_closed_form_noise_scale_on_linear_regression():
    # Closed form at a fixed parameter (x ~ N(0, I_d), Gaussian 4th moments):
    # G = r, Sigma = (|r|^2 + sigma^2) I + r r^T, so |G|^2 = |r|^2 = 1 and
    # tr(Sigma) = d (|r|^2 + sigma^2) + |r|^2 = 8 * 1.25 + 1 = 11 -> B_simple = 11.
    d, sigma, b_small, b_big = 8, 0.5, 4, 64
    r = np.ones(d) / np.sqrt(d)
    true_g2, true_tr = 1.0, d * (1.0 + sigma ** 2) + 1.0
    gs, gb = _linear_regression_norms(0, 2000, d, sigma, b_small, b_big, r)
    est = two_batch_estimate(gs.mean(), gb.mean(), b_small, b_big)
    assert abs(est["grad_sq"] / true_g2 - 1) < 0.10
    assert abs(est["trace"] / true_tr - 1) < 0.10
    assert abs(est["b_simple"] / (true_tr / true_g2) - 1) < 0.10
    ema = NoiseScaleEMA(decay=0.999)
    for a, b in zip(gs, gb):
        smoothed = ema.update(float(a), float(b), b_small, b_big)
    assert abs(smoothed / (true_tr / true_g2) - 1) < 0.10


def test_module_imports_no_torch():
    # Load the file on its own (the algos package __init__ may import torch for other modules).
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ns', {str(MODULE)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert importlib.util.find_spec("rlbatch.algos.noise_scale") is not None
