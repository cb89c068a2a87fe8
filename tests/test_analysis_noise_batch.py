"""B_simple is compared with the optimizer minibatch (sequences per optimizer update), not with
the sequences per rollout step (analysis/noise.py, `compared_batch`), on constructed run logs."""

from __future__ import annotations

import os

import pytest

from rlbatch.analysis import noise
from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.analysis.runs import load_runs
from rlbatch.core.runlog import RunWriter

ACC = "eval/accuracy"
# N* by B: runs cross 0.5 there (0.25 before, 0.75 after, evaluations every 100 samples)
NSTAR = {128: 4550, 512: 6550, 256: 4550, 64: 4550}
LAST = 8000


def _write_run(d, b: int, seed: int, minibatches: int, noise_scale: float | None,
               derived_minibatch: bool = True):
    derived = {"sequences_per_step": b, "actor_lr": 1e-4}
    if derived_minibatch:
        derived["minibatch_sequences"] = b // minibatches
    cfg = {"algorithm": "grpo", "seed": seed, "output_dir": str(d.parent),
           "batch": {"prompts_per_step": b // 8, "samples_per_prompt": 8,
                     "minibatches_per_step": minibatches},
           "optimizer": {"reference_sequences": 128, "reference_lr": 1e-4, "lr_scaling": "sqrt"},
           "target": {"metric": ACC, "value": 0.5}, "derived": derived}
    with RunWriter(d) as w:
        w.write_config(cfg)
        w.write_manifest({"run_id": d.name, "seed": seed})
        for i in range(1, LAST // b + 1):
            row = {"step": i, "samples": i * b, "prompts": i * b // 8, "tokens": i * b * 5,
                   "train_s": i / 4, "time/rollout": 0.1, "time/reward": 0.0,
                   "time/actor_update": 0.15, "time/critic_update": 0.0, "time/other": 0.0,
                   "reward/mean": 0.5, "actor/lr": 1e-4, "actor/grad_norm": 1.0,
                   "actor/loss": 0.0}
            if noise_scale is not None:
                row["actor/noise_scale"] = noise_scale
            w.log_step(row)
        for k, s in enumerate(range(0, LAST + 1, 100)):
            w.log_eval({"step": k, "samples": s, "train_s": s / (4 * b),
                        ACC: 0.75 if s > NSTAR[b] else 0.25})


def _sweep(root, noise_scale):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)  # speed only
        for b in (128, 512):
            for seed in (0, 1):
                _write_run(root / f"grpo-B{b}-s{seed}", b, seed, 4, noise_scale)
    return root


def test_prediction_compares_b_simple_with_the_minibatch(tmp_path):
    doc = analyze([_sweep(tmp_path, 100.0)], Target(ACC, 0.5))
    cfg = {c["sequences_per_step"]: c for c in doc["configs"]}
    assert {b: c["minibatch_sequences"] for b, c in cfg.items()} == {128: 32, 512: 128}
    pred = doc["prediction"]
    assert (pred["b_noise"], pred["b_noise_source"], pred["b_noise_batch"]) == \
        (100.0, "b_simple_actor", "minibatch_sequences")
    assert pred["reference_minibatch_sequences"] == 32
    # 4 minibatches per step: the updates see 32 and 128 sequences, B_noise = 100
    n_hat = NSTAR[128] * (1 + 128 / 100) / (1 + 32 / 100)
    assert cfg[512]["predicted_samples_to_target"] == pytest.approx(n_hat, rel=1e-12)
    assert cfg[512]["predicted_time_to_target"] == pytest.approx(n_hat / (4 * 512), rel=1e-12)
    assert cfg[128]["predicted_samples_to_target"] == pytest.approx(NSTAR[128], rel=1e-12)
    # comparing with sequences per step instead would predict much more (a real difference)
    wrong = NSTAR[128] * (1 + 512 / 100) / (1 + 128 / 100)
    assert abs(cfg[512]["predicted_samples_to_target"] / wrong - 1) > 0.2


def test_fitted_b_crit_stays_in_sequences_per_step():
    """No B_simple logged: B_noise is the fit's B_crit, whose unit is sequences per step."""
    assert noise.compared_batch("b_crit_mccandlish_fit") == "sequences_per_step"
    assert noise.compared_batch(None) == "sequences_per_step"
    assert noise.compared_batch("b_simple_actor") == "minibatch_sequences"


def test_no_b_simple_predicts_with_sequences_per_step(tmp_path):
    doc = analyze([_sweep(tmp_path, None)], Target(ACC, 0.5))
    pred = doc["prediction"]
    assert (pred["b_noise_source"], pred["b_noise_batch"]) == \
        ("b_crit_mccandlish_fit", "sequences_per_step")
    bc = pred["b_noise"]
    assert bc == pytest.approx(doc["critical_batch"]["b_crit_mccandlish"], rel=1e-12)
    cfg = {c["sequences_per_step"]: c for c in doc["configs"]}
    n_hat = NSTAR[128] * (1 + 512 / bc) / (1 + 128 / bc)
    assert cfg[512]["predicted_samples_to_target"] == pytest.approx(n_hat, rel=1e-12)


def test_minibatch_sequences_from_the_config(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)
        _write_run(tmp_path / "derived", 256, 0, 4, None)
        # an ingested run's config: batch.minibatches_per_step only, no derived minibatch
        _write_run(tmp_path / "ingested", 256, 0, 8, None, derived_minibatch=False)
        # a config without minibatches_per_step: the default, one minibatch per step
        d = tmp_path / "plain"
        _write_run(d, 64, 0, 1, None, derived_minibatch=False)
        text = (d / "config.yaml").read_text().replace("  minibatches_per_step: 1\n", "")
        (d / "config.yaml").write_text(text)
    runs = load_runs([tmp_path]).runs.set_index("run")
    got = {os.path.basename(r): v for r, v in runs["minibatch_sequences"].items()}
    assert got == {"derived": 64, "ingested": 32, "plain": 64}


def test_mccandlish_fit_is_least_squares_without_a_warning():
    """The fit of 1/S on 1/E at realistic N* (x ~ 1e-4) is ordinary least squares, as
    np.polyfit computes it, and writes nothing to stderr (polyfit's RankWarning did)."""
    import warnings

    import numpy as np

    b = [64, 128, 256, 512]
    e = [9000.0, 10400.0, 14100.0, 21000.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = noise.mccandlish_fit(b, e)
    x, y = 1 / np.array(e), np.array(b) / np.array(e)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slope, intercept = np.polyfit(x, y, 1)
    assert fit["b_crit_mccandlish"] == pytest.approx(-slope, rel=1e-6)
    assert fit["s_min"] == pytest.approx(1 / intercept, rel=1e-6)
    assert noise.mccandlish_fit([64, 128], [9000.0, 9000.0])["b_crit_mccandlish"] is None
