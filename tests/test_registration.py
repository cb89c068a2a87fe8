"""The stretch statistic (analysis/registration.py) on constructed curves with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlbatch.analysis.registration import register, rising, stretched_groups


def f(x):
    return 0.2 + 0.4 * (1 - np.exp(-np.asarray(x, dtype=float) / 2000.0))


def curve(stretch: float, upto: float = 8000.0, every: float = 128.0):
    x = np.arange(0.0, upto + 1, every)
    return x, f(x / stretch)


def test_register_recovers_known_stretches():
    stretches = [1.0, 1.2, 0.8, 1.5, 2.0]
    curves = [(s[1:], v[1:]) for s, v in (curve(r) for r in stretches)]
    a = register(curves, np.array([True, True, True, False, False]))
    want = np.log(stretches) - np.mean(np.log(stretches[:3]))
    assert np.allclose(a, want, atol=0.01)


def test_rising_keeps_the_segment_near_the_target():
    s, v = curve(1.0)
    seg_s, seg_v = rising((s, v), threshold=0.5, frac=0.8)  # level 0.2 + 0.8 * 0.3 = 0.44
    assert seg_v[0] < 0.44 <= seg_v[1] and seg_s[0] > 0
    assert len(seg_s) == len(s) - int(np.flatnonzero(v < 0.44)[-1])


def _run(name, stretch, censored=False):
    s, v = curve(stretch)
    thr = 0.5
    nstar = None if censored else float(np.interp(thr, v, s))
    return {"run": name, "censored": censored, "samples_to_target": nstar, "threshold": thr,
            "throughput_to_target": 100.0, "time_to_target": None if censored else nstar / 100,
            "last_samples": s[-1]}, (s, v)


def test_stretched_groups_rescale_crossed_runs_and_keep_censored_ones():
    runs = {n: _run(n, r, c) for n, r, c in
            [("a0", 1.0, False), ("a1", 1.1, False), ("b0", 1.5, False), ("b1", 3.0, True)]}
    groups = [{"config": "A", "runs": [runs["a0"][0], runs["a1"][0]]},
              {"config": "B", "runs": [runs["b0"][0], runs["b1"][0]]}]
    out = stretched_groups(groups, {n: c for n, (_, c) in runs.items()}, "A")
    new = {r["run"]: r for g in out for r in g["runs"]}
    ref = math.sqrt(runs["a0"][0]["samples_to_target"] * runs["a1"][0]["samples_to_target"])
    # the reference's geometric mean is kept, and b0 sits 1.5 / sqrt(1.1) above it
    assert math.sqrt(new["a0"]["samples_to_target"] * new["a1"]["samples_to_target"]) == \
        pytest.approx(ref, rel=1e-9)
    assert new["b0"]["samples_to_target"] / ref == pytest.approx(1.5 / math.sqrt(1.1), rel=0.02)
    assert new["b0"]["time_to_target"] == pytest.approx(new["b0"]["samples_to_target"] / 100)
    assert new["b1"] == runs["b1"][0]  # censored: its bounds, untouched
    assert groups[0]["runs"][0]["samples_to_target"] == runs["a0"][0]["samples_to_target"]
