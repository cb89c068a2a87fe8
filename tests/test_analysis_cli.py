"""`analyze` end to end on a synthetic sweep with known crossings, and `rlbatch analyze`."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import t as student_t

from helpers.cli import run_cli
from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from rlbatch.core.runlog import RunWriter

ACC = "eval/accuracy"
# N* per seed by B; None = never reaches the target (censored at 12,000 samples).
SWEEP = {
    32: [4550],
    64: [4450, 4550, 4650],
    128: [4450, 4550, 4650],  # reference: B0 = 128
    256: [4350, 4550, 4550],
    512: [4450, 4550, 4650],
    1024: [9050, 9550, 9950],
    2048: [None, None, None],
}
LAST = 12000


def write_sweep(root):
    """Evaluations every 100 samples: 0.25 before N*, 0.75 after, so the crossing of 0.5 is
    interpolated exactly at N* (N* - 50 -> 0.25, N* + 50 -> 0.75). q = 4B samples/s exactly."""
    for b, nstars in SWEEP.items():
        for seed, nstar in enumerate(nstars):
            d = root / f"grpo-B{b}-s{seed}"
            cfg = {"algorithm": "grpo", "seed": seed, "output_dir": str(root),
                   "batch": {"prompts_per_step": b // 8, "samples_per_prompt": 8},
                   "optimizer": {"reference_sequences": 128, "reference_lr": 1e-4,
                                 "lr_scaling": "sqrt"},
                   "target": {"metric": ACC, "value": 0.5},
                   "derived": {"sequences_per_step": b, "actor_lr": 1e-4 * math.sqrt(b / 128)}}
            with RunWriter(d) as w:
                w.write_config(cfg)
                w.write_manifest({"run_id": d.name, "seed": seed})
                for i in range(1, LAST // b + 1):
                    w.log_step({
                        "step": i, "samples": i * b, "prompts": i * b // 8, "tokens": i * b * 5,
                        "train_s": i / 4, "time/rollout": 0.1, "time/reward": 0.0,
                        "time/actor_update": 0.15, "time/critic_update": 0.0, "time/other": 0.0,
                        "reward/mean": 0.5, "actor/lr": 1e-4, "actor/grad_norm": 1.0,
                        "actor/loss": 0.0, "actor/noise_scale": 1000.0})
                for k, s in enumerate(range(0, LAST + 1, 100)):  # step = eval counter (unique)
                    acc = 0.75 if nstar is not None and s > nstar else 0.25
                    w.log_eval({"step": k, "samples": s, "train_s": s / (4 * b), ACC: acc})
    return root


def make_sweep(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)  # speed only: RunWriter fsyncs every row
        return write_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def doc(sweep):
    return analyze([sweep], Target(ACC, 0.5))


def by_b(doc):
    return {c["sequences_per_step"]: c for c in doc["configs"]}


# The pooled log-normal model by hand (docs/analysis.md): geometric means, one s over the
# configurations that crossed (df = runs - configurations), Student-t ends, for each
# configuration's own interval; a comparison of two rests on the two alone (pair_s).
CROSSED = {b: v for b, v in SWEEP.items() if v[0] is not None}
DF = sum(len(v) for v in CROSSED.values()) - len(CROSSED)
S = math.sqrt(sum(((np.log(v) - np.log(v).mean()) ** 2).sum() for v in CROSSED.values()) / DF)
T90 = float(student_t.ppf(0.95, DF))


def pair_s(a: int, b: int) -> tuple[float, int]:
    """The spread of a comparison of B=a with B=b (analyze.judge's default spread, `pair`):
    pooled over the two alone, with its degrees of freedom."""
    ss = sum(((np.log(SWEEP[x]) - np.log(SWEEP[x]).mean()) ** 2).sum() for x in (a, b))
    df = len(SWEEP[a]) + len(SWEEP[b]) - 2
    return math.sqrt(ss / df), df


def gm(values):
    return math.exp(float(np.mean(np.log(values))))


def test_configurations_group_seeds_and_medians(doc):
    cfg = by_b(doc)
    assert list(cfg) == [32, 64, 128, 256, 512, 1024, 2048]
    assert [cfg[b]["seeds"] for b in cfg] == [1, 3, 3, 3, 3, 3, 3]
    assert cfg[128]["samples_to_target"] == pytest.approx(gm(SWEEP[128]), rel=1e-12)
    assert cfg[256]["samples_to_target"] == pytest.approx(gm(SWEEP[256]), rel=1e-12)
    assert cfg[1024]["samples_to_target"] == pytest.approx(gm(SWEEP[1024]), rel=1e-12)
    assert cfg[256]["samples_to_target_median"] == 4550.0
    half = T90 * S / math.sqrt(3)
    assert cfg[128]["samples_to_target_ci"] == pytest.approx(
        [gm(SWEEP[128]) * math.exp(-half), gm(SWEEP[128]) * math.exp(half)], rel=1e-9)
    assert cfg[32]["samples_to_target_ci"] == pytest.approx(  # one seed: the pooled s
        [4550 * math.exp(-T90 * S), 4550 * math.exp(T90 * S)], rel=1e-9)
    assert cfg[128]["throughput"] == pytest.approx(512.0, rel=1e-12)
    assert cfg[512]["time_to_target"] == pytest.approx(gm(SWEEP[512]) / 2048, rel=1e-12)
    assert sorted(r["samples_to_target"] for r in cfg[128]["runs"]) == [4450.0, 4550.0, 4650.0]


def test_censored_configuration(doc):
    c = by_b(doc)[2048]
    assert c["samples_to_target"] is None and c["time_to_target"] is None
    assert c["samples_to_target_lower_bound"] == pytest.approx(float(LAST), rel=1e-12)
    lo, hi = c["samples_to_target_ci"]  # its bounds bound its mean below
    assert lo == pytest.approx(LAST * math.exp(-T90 * S / math.sqrt(3)), rel=1e-9) and hi is None
    assert all(r["censored"] for r in c["runs"]) and c["censored_runs"] == 3


def test_verdicts_and_critical_batch(doc):
    cfg = by_b(doc)
    assert doc["reference"]["config"] == cfg[128]["config"]
    verdicts = {b: c["verdict"] for b, c in cfg.items()}
    assert verdicts == {32: "unconfirmed", 64: "aligned", 128: "reference", 256: "aligned",
                        512: "aligned", 1024: "departed", 2048: "departed"}
    assert cfg[32]["indication"] == "aligned"  # what its single seed suggests
    assert cfg[256]["invariance"]["log_samples_ratio"] == pytest.approx(
        math.log(gm(SWEEP[256]) / gm(SWEEP[128])), rel=1e-9)
    lo, _ = cfg[1024]["invariance"]["log_samples_ratio_ci"]
    s_pair, df_pair = pair_s(1024, 128)  # a comparison rests on the two compared
    assert lo == pytest.approx(math.log(gm(SWEEP[1024]) / gm(SWEEP[128]))
                               - float(student_t.ppf(0.95, df_pair)) * s_pair * math.sqrt(2 / 3),
                               rel=1e-9)
    assert cfg[1024]["vs_reference"]["df"] == df_pair == 4
    cb = doc["critical_batch"]
    assert cb["critical_batch_departure"] == 512
    assert cb["first_not_aligned_batch"] == 1024
    assert "b_crit_mccandlish" in cb and "cbs_zhang_20pct_model" in cb


def test_curve_difference_data(doc):
    inv = by_b(doc)[512]["invariance"]
    curves = inv["curves"]
    assert curves["grid"][0] == 0.0 and curves["grid"][-1] == float(LAST)
    assert curves["diff"] == [0.0] * len(curves["grid"])  # same seeds' curves as the reference
    assert inv["normalized_area"] == 0.0
    assert by_b(doc)[1024]["invariance"]["normalized_area"] > 0.1


def test_recommendation_and_prediction(doc):
    cfg = by_b(doc)
    rec = doc["recommendation"]
    assert rec["config"] == cfg[512]["config"] and rec["evidence"] == "established"
    s_pair, df_pair = pair_s(512, 128)  # 4x the q of the same N*: log T ratio -log 4
    assert rec["p_faster_than_reference"] == pytest.approx(
        float(student_t.cdf(math.log(4) / (s_pair * math.sqrt(2 / 3)), df_pair)), rel=1e-12)
    assert rec["p_faster_than_reference"] > 1 - 1e-6 and rec["spread"] == "pair"
    assert rec["time_ratio_ci"][1] < 1.0
    assert rec["speedup_vs_reference"] == pytest.approx(4.0, rel=1e-12)  # same N*, 4x q
    vs = cfg[512]["vs_reference"]
    assert vs["samples_ratio"] == pytest.approx(1.0) and vs["faster_by_rule"] is True
    assert vs["throughput_ratio"] == pytest.approx(4.0)
    assert doc["prediction"]["b_noise"] == 1000.0
    assert doc["prediction"]["b_noise_source"] == "b_simple_actor"
    n_hat = gm(SWEEP[128]) * (1 + 512 / 1000) / (1 + 128 / 1000)
    assert cfg[512]["predicted_samples_to_target"] == pytest.approx(n_hat, rel=1e-12)
    assert cfg[512]["predicted_time_to_target"] == pytest.approx(n_hat / 2048, rel=1e-12)
    assert cfg[128]["noise_scale"] == {"actor": 1000.0, "critic": None}


def test_one_seed_warning_and_settings(doc):
    assert any("1 seed(s); a verdict needs at least 2" in w for w in doc["warnings"])
    s = doc["settings"]
    assert (s["ci"], s["bootstrap_resamples"], s["margin"]) == (0.90, 2000, math.log(1.15))


def test_explicit_reference_run(sweep):
    d = analyze([sweep], Target(ACC, 0.5), reference_run=str(sweep / "grpo-B256-s0"),
                n_boot=200)
    cfg = by_b(d)
    assert d["reference"]["config"] == cfg[256]["config"]
    assert cfg[256]["verdict"] == "reference"


def test_cli_json(sweep, capsys):
    code, out, _ = run_cli(["analyze", str(sweep), "--target", "eval/accuracy=0.5", "--json",
                            "--bootstrap", "300"], capsys)
    assert code in (0, None)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["target"] == {"metric": ACC, "value": 0.5, "gain": None, "direction": "higher",
                             "thresholds": [0.5]}
    c = by_b(doc)[128]
    for key in ("config", "sequences_per_step", "lr", "seeds", "samples_to_target",
                "samples_to_target_ci", "time_to_target", "throughput", "verdict", "runs"):
        assert key in c
    assert set(c["runs"][0]) >= {"run", "seed", "samples_to_target", "time_to_target", "censored"}
    assert doc["critical_batch"]["critical_batch_departure"] == 512
    assert doc["recommendation"]["sequences_per_step"] == 512


def test_cli_table_uses_config_target(sweep, capsys):
    code, out, _ = run_cli(["analyze", str(sweep), "--bootstrap", "100"], capsys)
    assert code in (0, None)
    assert "critical batch (departure sense): 512" in out
    assert "decision: P=64 G=8 (B=512), lr=0.0002: 4x faster than the baseline" in out
    assert "evidence: established" in out


@pytest.mark.parametrize("args,needle", [
    (["analyze", "/nonexistent/sweep", "--target", "eval/accuracy=0.5"], "path not found"),
    (["analyze", "SWEEP", "--target", "eval/accuracy"], "--target"),
    (["analyze", "SWEEP", "--target", "eval/missing=0.5"], "absent from all runs"),
    (["analyze", "SWEEP", "--target", "eval/accuracy=0.5", "--margin", "-1"], "--margin"),
    (["analyze", "SWEEP", "--target", "eval/accuracy=0.5", "--reference", "/nope"], "not found"),
])
def test_cli_bad_input_exits_2_with_one_line(sweep, capsys, args, needle):
    args = [str(sweep) if a == "SWEEP" else a for a in args]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_cli_subprocess_json_last_line(sweep):
    exe = [sys.executable, "-m", "rlbatch.cli.main"]
    out = subprocess.run(exe + ["analyze", str(sweep / "grpo-B128-s0"), str(sweep / "grpo-B256-s0"),
                                "--target", "eval/accuracy=0.5", "--json", "--bootstrap", "50"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert [c["sequences_per_step"] for c in doc["configs"]] == [128, 256]


def test_cli_statistic_stretch_is_named_and_a_bad_one_refused(sweep, capsys):
    code, out, _ = run_cli(["analyze", str(sweep), "--target", "eval/accuracy=0.5", "--json",
                            "--bootstrap", "100", "--statistic", "stretch"], capsys)
    assert code in (0, None)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["settings"]["statistic"] == "stretch"
    assert doc["recommendation"]["statistic"].startswith("stretch:")
    base = analyze([sweep], Target(ACC, 0.5))
    assert base["settings"]["statistic"] == "crossing"
    assert base["recommendation"]["statistic"].startswith("crossing:")
    # the reference keeps its geometric-mean N* (the stretch is relative to it)
    ref = next(c for c in doc["configs"] if c["verdict"] == "reference")
    ref0 = next(c for c in base["configs"] if c["verdict"] == "reference")
    assert ref["samples_to_target"] == pytest.approx(ref0["samples_to_target"], rel=1e-6)
    code, _, err = run_cli(["analyze", str(sweep), "--target", "eval/accuracy=0.5",
                            "--statistic", "median"], capsys)
    assert code == 2 and "--statistic must be one of crossing, stretch" in err


def test_runs_that_never_reached_the_target_are_counted_apart(sweep, doc, capsys):
    """B = 2048's three runs never reach the target: they enter N* and T as bounds (Tobit),
    and the decision says how many of a configuration's seeds did not reach it, in the text
    and in `recommendation.compared`."""
    compared = {c["config"]: c for c in doc["recommendation"]["compared"]}
    cfg = by_b(doc)
    assert compared[cfg[2048]["config"]]["censored_runs"] == 3
    assert compared[cfg[128]["config"]]["censored_runs"] == 0
    code, out, _ = run_cli(["analyze", str(sweep), "--bootstrap", "100"], capsys)
    assert code in (0, None)
    (line,) = [x for x in out.splitlines() if "B2048" in x and "seeds" in x]
    assert "(3 seeds, 3 not reaching the target," in line, line
    assert not any("not reaching" in x for x in out.splitlines() if "B128 " in x)


def test_a_control_faster_than_its_twin_says_the_scaled_lr_overshoots():
    """The fixed-LR control runs at eta0, its sqrt twin at eta0 sqrt(B/B0): a control faster
    across seeds says the scaled LR is too high at that B (eta0 above its best at B0, or a
    slower-than-sqrt rule), not that eta0 is too low."""
    from rlbatch.analysis.selection import control_versus_twin
    from rlbatch.cli.decision_text import _closing_lines

    def side(config, lr, t):
        return {"config": config, "seeds": 3, "sequences_per_step": 256, "lr": lr,
                "samples_to_target": 1000.0, "time_to_target": t}

    def control(upper):
        return control_versus_twin(side("ctl", 1e-4, 8.0), side("twin", 1.414e-4, 10.0),
                                   {"samples_ratio_ci": [0.7, 0.9],
                                    "time_ratio_ci": [0.6, upper]})

    faster, unclear = control(0.95), control(1.05)
    assert faster["scaled_lr_too_high"] and faster["eta0_may_be_under_tuned"]
    assert not unclear["scaled_lr_too_high"]
    labels = {"ctl": "B256 lr0.0001", "twin": "B256 lr0.000141"}
    (line,) = _closing_lines({"fixed_lr_controls": [faster]}, {}, labels)
    assert line.endswith("faster than its twin across seeds, at the lower LR: the sqrt rule's "
                         "LR overshoots here (eta0 above its best at B0, or the best LR grows "
                         "more slowly than sqrt(B/B0))"), line
    (line,) = _closing_lines({"fixed_lr_controls": [unclear]}, {}, labels)
    assert "overshoots" not in line


def test_a_stopped_configuration_reads_not_shown_faster_not_slower(tmp_path):
    """Verdict `slower` is a stop (half or more of the runs stopped `cannot_win`), not a
    measured T ratio above 1: a decision line says what was shown."""
    from rlbatch.cli.decision_text import _compared_lines, _screened_lines

    entry = {"config": "c64", "seeds": 2, "verdict": "slower", "censored_runs": 1,
             "runs": [], "vs_reference": None, "time_to_target": 3.9,
             "time_to_target_ci": [1.0, 9.0], "algorithm": "grpo", "lr_scaling": "sqrt"}
    ref = {"config": "c128", "seeds": 2, "verdict": "reference", "censored_runs": 0,
           "time_to_target": 4.4, "time_to_target_ci": [2.6, 7.5], "algorithm": "grpo",
           "lr_scaling": "sqrt"}
    labels = {"c64": "B64", "c128": "B128"}
    rec = {"compared": [{"config": "c64", "seeds": 2, "verdict": "slower"}],
           "rejected": [{"config": "c64", "why": "stopped early: ..."}]}
    (line,) = _compared_lines(rec, {"c64": entry, "c128": ref}, labels)
    assert line.startswith("  B64 (2 seeds, 1 not reaching the target, not shown faster) "
                           "stopped early"), line
    screened = {**entry, "config": "c256", "seeds": 1}
    doc = {"reference": {"config": "c128"}, "configs": [ref, screened]}
    (line,) = _screened_lines(doc, {"compared": []}, {"c128": ref, "c256": screened},
                              {**labels, "c256": "B256"})
    assert line == ("  screened: B256 (1 seed(s), 1 not reaching the target): not shown faster "
                    "(stopped early); T ratio -"), line


def test_paired_spread_is_named_in_the_decision(sweep, capsys):
    """`--spread paired` says what the comparisons rest on: same-seed pairs where enough
    seeds crossed, unpaired otherwise (the sweep's configurations have 3 seeds, seeds 0-2)."""
    code, out, _ = run_cli(["analyze", str(sweep), "--bootstrap", "100", "--spread", "paired",
                            "--json"], capsys)
    assert code in (0, None)
    rec = json.loads(out.splitlines()[-1])["recommendation"]
    assert rec["spread"] == "paired" and rec["comparison"].startswith(
        "paired: same-seed log ratios where at least 3 seeds")
    code, out, _ = run_cli(["analyze", str(sweep), "--bootstrap", "100", "--spread", "paired"],
                           capsys)
    text = " ".join(out.split())
    assert "paired comparisons where 3 or more seeds of both crossed, unpaired otherwise" in text


def test_a_verdict_on_a_curve_reads_as_the_curves_not_as_speed():
    """A candidate can be shown faster (evidence `established`) while its alignment is
    inconclusive: its line says "curve inconclusive", so the two do not read as one
    contradicting the other."""
    from rlbatch.cli.decision_text import verdict_words

    assert verdict_words("inconclusive") == "curve inconclusive"
    assert verdict_words("aligned") == "curve aligned"
    assert verdict_words("departed") == "curve departed"
    assert verdict_words("fewer_samples") == "curve fewer samples"
    assert verdict_words("slower") == "not shown faster"
    assert verdict_words("reference") == "reference"
