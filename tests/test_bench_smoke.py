"""Smoke test of the bench scripts that simulate through the analysis's own code
(bench/coverage.py and bench/procedure_sim.py call analyze.judge and selection.recommend on
synthetic configurations): each runs as a subprocess at a tiny size and must exit 0 and end
with its JSON line holding the keys it documents. It exists so that a change to the analysis
(a new key an entry must carry, a renamed field) cannot silently break a published table of
docs/analysis.md ("Intervals across seeds", "The whole procedure") that only these scripts
produce. Figures are checked by nothing here: at a few replicates they are noise, and the
published ones come from the scripts at full size. No model is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

# script -> (arguments at a tiny size, top-level keys of its JSON line, keys of each row of
# the table it publishes: {list key: row keys})
SCRIPTS = {
    "coverage.py": (
        ["--reps", "3"], {"reps", "ci", "q_cv", "coverage", "decisions", "seconds"},
        {"coverage": {"cv", "censored", "n", "N*", "q", "T", "N* ratio", "q ratio", "T ratio",
                      "printed_share"},
         "decisions": {"case", "cv", "n", "excludes_1/N* ratio", "excludes_1/q ratio",
                       "excludes_1/T ratio", "departed",
                       "N* or T interval excludes 1, or departed",
                       "T interval excludes 1, or departed", "a claim in words",
                       "recommended", "P(faster)>=0.95", "P(faster)>=0.90"}}),
    "procedure_sim.py": (
        ["--reps", "3"], {"reps", "rows", "seconds"},
        {"rows": {"case", "cv", "seeds", "confirm_seeds", "recommended_not_faster",
                  "recommended_faster", "kept_baseline"}}),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bench_script_runs_and_ends_with_its_json_line(script):
    args, keys, rows = SCRIPTS[script]
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert keys <= set(doc), f"{script}: missing {sorted(keys - set(doc))}"
    for key, row_keys in rows.items():
        assert doc[key], f"{script}: `{key}` is empty"
        for row in doc[key]:
            assert row_keys <= set(row), f"{script} {key}: missing {sorted(row_keys - set(row))}"


def test_replay_table_runs_on_a_bank_and_ends_with_its_json_line(tmp_path):
    """bench/replay_table.py (the decision table of docs/analysis.md, "Replays") on a bank
    written from known curves with the no-saving bank's config, one replicate of two
    variants: it exits 0, prints the table, and its JSON line holds a row per procedure
    with the replay command's keys, and the truth."""
    from helpers.banks import write_bank
    from rlbatch.core.loading import load_config

    cfg = load_config(str(BENCH / "banks" / "no-saving.yaml"))
    speed = {128: 100.0, 256: 90.0, 512: 80.0, 1024: 70.0}  # no saving: B0 is the best
    write_bank(cfg, tmp_path / "bank", range(3), speed, rate=dict.fromkeys(speed, 2.0))
    proc = subprocess.run([sys.executable, str(BENCH / "replay_table.py"), "--bank",
                           f"no-saving={tmp_path / 'bank'}", "--replicates", "1",
                           "--variants", "full,probe", "--workers", "1"],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["procedure"] for r in doc["rows"]] == [
        "full", "keep the baseline", "one seed each, lowest T", "probe"]
    keys = {"replicates", "recommends", "picks_within_5pct", "mean_regret",
            "slower_than_baseline", "median_cost", "pick_interval_coverage"}
    assert all(keys <= set(r) for r in doc["rows"])
    assert doc["truth"]["no-saving"]["best_sequences"] == 128
    assert "| no-saving | full |" in proc.stdout


def test_aa_bank_writes_a_bank_whose_truth_is_one_and_replay_reads_it(tmp_path):
    """bench/aa_bank.py (the A/A bank of docs/analysis.md, "Looks and A/A") at 2 seeds: it
    exits 0 with its JSON line, and `rlbatch replay` reads the bank it wrote, every
    configuration of the no-saving profile at each seed."""
    from rlbatch.core.loading import load_config
    from rlbatch.profile.bank import load_bank
    from rlbatch.profile.replay import profile_keys

    proc = subprocess.run([sys.executable, str(BENCH / "aa_bank.py"),
                           str(BENCH / "banks" / "no-saving.yaml"), "--seeds", "2", "--out",
                           str(tmp_path / "aa")], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["runs"] == 10 and doc["configurations"] == 5
    bank = load_bank(tmp_path / "aa")
    keys = profile_keys(load_config(str(BENCH / "banks" / "no-saving.yaml")))
    assert sorted(bank.runs) == sorted(keys)
    assert all(sorted(bank.runs[k]) == [0, 1] for k in keys)


def test_a_planted_bank_has_the_t_ratios_it_was_given(tmp_path):
    """bench/aa_bank.py --t-ratio (the planted bank of docs/analysis.md, "A budget as a
    sequential decision"): with the run-to-run spread near 0, the bank's truth gives each
    configuration its planted T ratio and the same N*, none departed; a list of the wrong
    length is one line and exit 2."""
    from rlbatch.core.loading import load_config
    from rlbatch.profile.bank import load_bank
    from rlbatch.profile.replay import profile_keys
    from rlbatch.profile.replay_truth import attach_crossings, bank_truth

    config = str(BENCH / "banks" / "no-saving.yaml")
    args = [sys.executable, str(BENCH / "aa_bank.py"), config, "--seeds", "2", "--sd-nstar",
            "0.001", "--sd-q", "0.001"]
    proc = subprocess.run([*args, "--t-ratio", "1,0.85,0.7,0.76,1", "--out",
                           str(tmp_path / "p")], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = load_config(config)
    bank = load_bank(tmp_path / "p")
    attach_crossings(bank, cfg)
    rows = bank_truth(cfg, bank, profile_keys(cfg))["configs"]
    got = [r["time_ratio"] for r in rows]
    assert got == pytest.approx([1.0, 0.85, 0.7, 0.76, 1.0], abs=0.005)
    assert all(r["samples_ratio"] == pytest.approx(1.0, abs=0.005) for r in rows)
    assert all(r["verdict"] in ("reference", "aligned") for r in rows)
    bad = subprocess.run([*args, "--t-ratio", "1,0.85", "--out", str(tmp_path / "q")],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert bad.returncode == 2 and "--t-ratio" in bad.stderr and not (tmp_path / "q").exists()


def _eval_noise():
    import importlib.util

    spec = importlib.util.spec_from_file_location("eval_noise", BENCH / "eval_noise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_eval_noise_reads_each_halfs_crossing_of_its_own_step0_plus_the_gain(tmp_path):
    """bench/eval_noise.py (docs/analysis.md, "Evaluation noise"): each half's N* is the
    interpolated first crossing of its own step-0 value plus the gain; a half that never
    crosses is None."""
    rows = [{"samples": 256 * i, "eval/accuracy_a": 0.30 + 0.01 * i,
             "eval/accuracy_b": 0.20 + 0.02 * i, "eval/accuracy": 0.25}
            for i in range(12)]
    (tmp_path / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = _eval_noise().crossings(tmp_path, 0.10)
    assert got["a"] == pytest.approx(2560.0) and got["b"] == pytest.approx(1280.0)
    assert got["whole"] is None


def test_eval_noise_share_bounds_follow_the_components():
    """The share's bootstrap interval: near 0 when both halves agree on every seed (no
    evaluation noise), reaching 1 when the halves are independent (no training part)."""
    import numpy as np

    mod = _eval_noise()
    rng = np.random.default_rng(3)
    a = rng.normal(0, 0.3, 16)
    lo, hi = mod.share_ci(a, a + rng.normal(0, 1e-4, 16), rng, 500)
    assert hi < 1e-3
    lo, hi = mod.share_ci(a, rng.normal(0, 0.3, 16), rng, 500)
    assert hi == 1.0 and lo > 0.2
