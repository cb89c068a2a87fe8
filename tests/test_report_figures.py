"""Figure data of `rlbatch report` (analysis/figures.py), by equality on small synthetic run
logs whose every number is known by construction. Also the synthetic sweep and profile.json
that the other report tests use (`write_sweep`, `write_profile`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from rlbatch.analysis import figures, labels, tables
from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.analysis.runs import load_runs
from rlbatch.core.runlog import RunWriter

ACC = "eval/accuracy"
# (name, B, lr_scaling, seeds, N* crossing index k, step seconds, phases per step)
# Evaluations every 128 samples: 0.25 up to k*128, 0.75 from (k+1)*128, so N* = k*128 + 64.
# q = B / step seconds: 256 samples/s at B=128, 409.6 at B=256.
PHASES_128 = {"time/rollout": 0.25, "time/reward": 0.0625, "time/actor_update": 0.125,
              "time/critic_update": 0.0, "time/other": 0.0625}
PHASES_256 = {**PHASES_128, "time/rollout": 0.375}
CONFIGS = [
    ("base", 128, "sqrt", (0, 1), 4, 0.5, PHASES_128),
    ("sqrt256", 256, "sqrt", (0, 1), 4, 0.625, PHASES_256),
    ("fixed256", 256, "none", (0, 1), 7, 0.625, PHASES_256),
]
LAST = 1024
NOISE = {256: 100.0, 512: 200.0, 768: 300.0, 1024: 400.0}  # actor/noise_scale of sqrt256


def run_config(b: int, rule: str, seed: int, root: Path, **over) -> dict:
    lr = 1e-4 * (math.sqrt(b / 128) if rule == "sqrt" else 1.0)
    cfg = {"name": over.get("name", "synthetic"), "algorithm": over.get("algorithm", "grpo"),
           "seed": seed, "output_dir": str(root),
           "task": {"name": over.get("task", "addition"), "digits": 3},
           "batch": {"prompts_per_step": b // 8, "samples_per_prompt": 8},
           "optimizer": {"reference_sequences": 128, "reference_lr": 1e-4, "lr_scaling": rule},
           "rollout": {"generation_concurrency": 64},
           "target": {"metric": over.get("metric", ACC), "value": 0.5},
           "derived": {"sequences_per_step": b, "actor_lr": lr}}
    return cfg


def write_run(d: Path, cfg: dict, k: int, step_s: float, phases: dict, noise: dict | None = None,
              metric: str = ACC) -> None:
    b = cfg["derived"]["sequences_per_step"]
    with RunWriter(d) as w:
        w.write_config(cfg)
        w.write_manifest({"run_id": d.name, "seed": cfg["seed"]})
        for i in range(1, LAST // b + 1):
            row = {"step": i, "samples": i * b, "prompts": i * b // 8, "tokens": i * b * 5,
                   "train_s": i * step_s, **phases, "reward/mean": 0.5, "actor/lr": 1e-4,
                   "actor/grad_norm": 1.0, "actor/loss": 0.0, "rollout/concurrency": min(b, 64),
                   "rollout/tokens_per_s": 1000.0 + b}
            if noise and i * b in noise:
                row["actor/noise_scale"] = noise[i * b]
            w.log_step(row)
        for j, s in enumerate(range(0, LAST + 1, 128)):
            w.log_eval({"step": j, "samples": s, "train_s": s * step_s / b,
                        metric: 0.25 if j <= k else 0.75})


def write_sweep(root: Path) -> Path:
    for name, b, rule, seeds, k, step_s, phases in CONFIGS:
        for seed in seeds:
            cfg = run_config(b, rule, seed, root)
            noise = NOISE if name == "sqrt256" else None
            write_run(root / f"{name}-s{seed}", cfg, k, step_s, phases, noise)
    return root


DECODE_ROWS = [  # roofline tokens/s = tokens_per_s * bound / achieved
    {"concurrency": 16, "tokens_per_s": 1000.0, "roofline_bound_flops": 4e9,
     "achieved_flops": 1e9, "bound_by": "memory", "latency_s": 0.5, "within_latency_cap": True},
    {"concurrency": 64, "tokens_per_s": 3000.0, "roofline_bound_flops": 8e9,
     "achieved_flops": 4e9, "bound_by": "memory", "latency_s": 0.7, "within_latency_cap": True},
    {"concurrency": 256, "tokens_per_s": 3100.0, "roofline_bound_flops": 1e10,
     "achieved_flops": 5e9, "bound_by": "compute", "latency_s": 2.6,
     "within_latency_cap": True},
]


def write_profile(root: Path) -> Path:
    """A profile directory shaped like profile/procedure.py's `_finish` output."""
    write_sweep(root / "runs")
    doc = analyze([root / "runs"], Target(ACC, 0.5),
                  reference_run=str(root / "runs" / "base-s0"))
    rec = doc["recommendation"]
    trials = [{"trial": d.name, "kind": "baseline" if d.name.startswith("base") else
               ("control" if d.name.startswith("fixed") else "sqrt"),
               "B": 128, "lr": 1e-4, "seed": 0, "samples": LAST, "train_s": 4.0, "metric": 0.75,
               "status": "target_reached", "target": {}, "stop_reason": None,
               "run_dir": str(d)} for d in sorted((root / "runs").iterdir())]
    profile = {
        "config": "synthetic", "target": {"metric": ACC, "value": 0.5}, "problem": None,
        "decision": {"prompts_per_step": 32, "samples_per_prompt": 8, "sequences_per_step": 256,
                     "lr": rec["lr"], "generation_concurrency": 64, **rec},
        "decode": {"key": {"model": "tiny"}, "chosen": 64, "seconds": 3.0,
                   "sweep": {"engine": "builtin", "device": "cpu", "rows": DECODE_ROWS,
                             "plateau_concurrency": 64, "max_concurrency_in_budget": 1024,
                             "stopped_by": "completed", "latency_cap_s": None}},
        "trials": trials,
        "cost": {"trial_train_s": 16.0, "decode_sweep_s": 3.0, "total_s": 19.0,
                 "baseline_time_to_target_s": 2.25, "multiple_of_baseline_time_to_target": 8.4},
        "analysis": doc,
    }
    (root / "profile.json").write_text(json.dumps(profile, indent=2))
    return root


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only: RunWriter fsyncs every row


@pytest.fixture
def sweep(tmp_path):
    root = write_sweep(tmp_path / "sweep")
    frames = load_runs([root])
    doc = analyze([root], Target(ACC, 0.5), reference_run=str(root / "base-s0"))
    return root, frames, doc


def _by_label(items):
    return {c["label"]: c for c in items}


BASE, SQRT, FIXED = "B=128 (16x8) lr=0.0001 sqrt", "B=256 (32x8) lr=0.000141 sqrt", \
    "B=256 (32x8) lr=0.0001 none"


def test_seed_band_union_grid_each_run_inside_its_range():
    band = figures.seed_band([([0.0, 2.0], [0.0, 2.0]), ([0.0, 1.0, 3.0], [1.0, 1.0, 1.0])])
    assert band == {"x": [0.0, 1.0, 2.0, 3.0], "mean": [0.5, 1.0, 1.5, 1.0],
                    "lo": [0.0, 1.0, 1.0, 1.0], "hi": [1.0, 1.0, 2.0, 1.0], "seeds": 2}
    assert figures.seed_band([([], [])]) is None


def test_config_labels_disambiguate_collisions():
    e = {"sequences_per_step": 8, "prompts_per_step": 1, "samples_per_prompt": 8, "lr": 0.5,
         "lr_scaling": "sqrt"}
    got = labels.config_labels([{**e, "config": "grpo-B8-lr0.5-aaaaaaaa"},
                                {**e, "config": "grpo-B8-lr0.5-bbbbbbbb"},
                                {"config": "unconfigured-x", "sequences_per_step": None}])
    assert got == {"grpo-B8-lr0.5-aaaaaaaa": "B=8 (1x8) lr=0.5 sqrt #aaaaaa",
                   "grpo-B8-lr0.5-bbbbbbbb": "B=8 (1x8) lr=0.5 sqrt #bbbbbb",
                   "unconfigured-x": "unconfigured-x"}
    # GRPO and PPO at the same B and LR: the algorithm tells them apart, not a hash
    got = labels.config_labels([{**e, "algorithm": "grpo", "config": "grpo-B8-lr0.5-aaaaaaaa"},
                                {**e, "algorithm": "ppo", "config": "ppo-B8-lr0.5-cccccccc"}])
    assert got == {"grpo-B8-lr0.5-aaaaaaaa": "GRPO B=8 (1x8) lr=0.5 sqrt",
                   "ppo-B8-lr0.5-cccccccc": "PPO B=8 (1x8) lr=0.5 sqrt"}


def test_invariance_against_samples_and_seconds(sweep):
    _, frames, doc = sweep
    d = figures.invariance_data(doc, frames, "samples")
    cfg = _by_label(d["configs"])
    grid = [float(s) for s in range(0, LAST + 1, 128)]
    assert (d["x"], d["metric"], d["target"]) == ("samples", ACC, 0.5)
    assert cfg[BASE]["x"] == grid and cfg[BASE]["seeds"] == 2
    assert cfg[BASE]["mean"] == [0.25] * 5 + [0.75] * 4 == cfg[BASE]["lo"] == cfg[BASE]["hi"]
    assert cfg[FIXED]["mean"] == [0.25] * 8 + [0.75]
    assert {c["label"]: c["verdict"] for c in d["configs"]} == {
        BASE: "reference", SQRT: "aligned", FIXED: "departed"}
    t = _by_label(figures.invariance_data(doc, frames, "train_s")["configs"])
    assert t[BASE]["x"] == [s * 0.5 / 128 for s in grid]  # train_s = samples / q, q = 256
    assert t[SQRT]["x"] == [s * 0.625 / 256 for s in grid]


def test_scaling_and_decision_rule(sweep):
    _, _, doc = sweep
    pts = _by_label(figures.scaling_data(doc)["points"])
    assert pts[BASE]["samples_to_target"] == pytest.approx(576.0, rel=1e-12)
    assert pts[BASE]["time_to_target"] == pytest.approx(2.25, rel=1e-12)
    assert pts[SQRT]["samples_to_target"] == pytest.approx(576.0, rel=1e-12)
    assert pts[SQRT]["time_to_target"] == pytest.approx(576 / 409.6, rel=1e-12)
    assert pts[FIXED]["samples_to_target"] == pytest.approx(960.0, rel=1e-12)
    rule = figures.decision_rule_data(doc)
    got = {p["label"]: (p["verdict"], p["faster_by_rule"]) for p in rule["points"]}
    assert got == {SQRT: ("aligned", True), FIXED: ("departed", False)}
    r = _by_label(rule["points"])
    assert r[SQRT]["samples_ratio"] == pytest.approx(1.0, rel=1e-12)
    assert r[SQRT]["throughput_ratio"] == pytest.approx(1.6, rel=1e-12)
    assert r[FIXED]["samples_ratio"] == pytest.approx(960 / 576, rel=1e-12)
    assert rule["not_plotted"] == []


def test_phase_seconds_per_thousand_samples(sweep):
    _, frames, doc = sweep
    d = figures.phase_data(doc, frames)
    assert d["phases"] == ["rollout", "reward", "actor", "critic", "other"]
    cfg = _by_label(d["configs"])
    assert cfg[BASE]["steps"] == 16  # two seeds x 8 steps
    assert cfg[BASE]["seconds_per_1k_samples"] == {
        "rollout": 0.25 * 1000 / 128, "reward": 0.0625 * 1000 / 128,
        "actor": 0.125 * 1000 / 128, "critic": 0.0, "other": 0.0625 * 1000 / 128}
    assert cfg[BASE]["fraction"] == {"rollout": 0.5, "reward": 0.125, "actor": 0.25,
                                     "critic": 0.0, "other": 0.125}
    assert cfg[SQRT]["seconds_per_1k_samples"]["rollout"] == 0.375 * 1000 / 256


def test_noise_scale_and_lr_control(sweep):
    _, frames, doc = sweep
    noise = figures.noise_scale_data(doc)
    assert noise["critic"] == []
    assert noise["actor"] == [{"config": noise["actor"][0]["config"], "label": SQRT,
                               "seed": seed, "samples": [256.0, 512.0, 768.0, 1024.0],
                               "values": [100.0, 200.0, 300.0, 400.0]} for seed in (0, 1)]
    (pair,) = figures.lr_control_data(doc, frames)
    assert pair["sequences_per_step"] == 256
    assert (pair["fixed"]["label"], pair["sqrt"]["label"]) == (FIXED, SQRT)
    assert pair["samples_ratio"] == pytest.approx(960 / 576, rel=1e-12)
    assert pair["time_ratio"] == pytest.approx(960 / 576, rel=1e-12)
    assert pair["throughput_ratio"] == 1.0
    assert pair["fixed"]["curve"]["mean"] == [0.25] * 8 + [0.75]


def test_decision_with_measured_saving_and_interval(sweep):
    _, frames, doc = sweep
    d = tables.decision_data(doc, None, frames.configs)
    assert (d["label"], d["prompts_per_step"], d["samples_per_prompt"]) == (SQRT, 32, 8)
    assert d["generation_concurrency"] == 64 and d["lr"] == pytest.approx(1e-4 * math.sqrt(2))
    assert d["measured_saving"] == pytest.approx(1 - (576 / 409.6) / 2.25, rel=1e-12)
    assert d["measured_saving_ci"] == pytest.approx([0.375, 0.375], rel=1e-12)  # no seed spread
    assert d["reference_label"] == BASE and not d["is_reference"]
    # B_noise = 350: the median of the logged actor B_simple over the second half (300, 400)
    t_hat = 576 * (1 + 256 / 350) / (1 + 128 / 350) / 409.6
    assert d["predicted_saving"] == pytest.approx(1 - t_hat / 2.25, rel=1e-12)
    assert tables.decision_data({**doc, "recommendation": None}) == {
        "recommended": False, "reason": "the reference has no time to target"}
    assert d["evidence"] == "established" and d["seeds"] == 2


def test_decode_from_profile_sweep_and_from_steps(sweep):
    _, frames, _ = sweep
    prof = {"decode": {"chosen": 64, "sweep": {"rows": DECODE_ROWS, "plateau_concurrency": 64,
                                               "max_concurrency_in_budget": 1024,
                                               "stopped_by": "completed", "engine": "builtin",
                                               "device": "cpu"}}}
    d = figures.decode_data(prof)
    assert [p["roofline_tokens_per_s"] for p in d["points"]] == [4000.0, 6000.0, 6200.0]
    assert (d["plateau_concurrency"], d["chosen_concurrency"]) == (64, 64)
    assert (d["memory_limit_concurrency"], d["memory_limit_in_view"]) == (1024, True)
    s = figures.decode_data(None, frames)
    assert s["source"] == "training_steps"
    # median over every step row at C = 64: 1128 (B = 128) and 1256 (B = 256), as many each
    assert [(p["concurrency"], p["tokens_per_s"]) for p in s["points"]] == [(64, 1192.0)]
    assert figures.decode_data(None, None) is None


def test_runs_table_links_are_relative(sweep, tmp_path):
    _, frames, doc = sweep
    rows = tables.runs_table(doc, frames.configs, None, str(tmp_path))
    assert sorted(r["link"] for r in rows) == ["sweep/base-s0/", "sweep/base-s1/",
                                               "sweep/fixed256-s0/", "sweep/fixed256-s1/",
                                               "sweep/sqrt256-s0/", "sweep/sqrt256-s1/"]
    assert {(r["name"], r["task"]) for r in rows} == {("synthetic", "addition")}


def test_absent_data_gives_notes_not_errors(sweep, tmp_path):
    _, _, doc = sweep
    data = figures.report_data(doc, None, None, str(tmp_path))
    assert set(data["notes"]) == {"invariance_samples", "invariance_time", "decode", "phases"}
    assert data["figures"]["scaling"] is not None and data["figures"]["noise_scale"] is not None
    (pair,) = data["figures"]["lr_control"]  # without run logs: the ratios, no curves
    assert pair["fixed"]["curve"] is None and pair["time_ratio"] is not None
