"""`rlbatch replay`: the real profile code served recorded runs. Banks here are written
from known curves (no training), in the run-log format, with the configs `rlbatch bank`
records (`bank_trials`), so every figure a replay prints has a known answer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from helpers.banks import write_bank
from helpers.cli import run_cli
from rlbatch.core.errors import DataError
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import read_json, read_jsonl
from rlbatch.profile import DEFAULT_BUDGET
from rlbatch.profile.bank import learning_key, load_bank
from rlbatch.profile.driver import Driver, Journal
from rlbatch.profile.replay import ReplayExecutor, profile_keys, replay, replay_config
from rlbatch.profile.trials import plan_trials

SETS = ["target.gain=0.15", "eval.every_samples=256", "budget.max_samples=8192",
        "profile.prompts_per_step=[32]", "profile.fixed_lr_control=false",
        "profile.concurrency=[]", "profile.min_evaluations=4"]


def config_file(tmp_path: Path, *extra: str, name: str = "profile.yaml") -> Path:
    """A profile config (the quick preset with SETS, then `extra`) as a YAML file."""
    lines = ["extends: quick", "name: replay-test"]
    data: dict = {}
    for item in [*SETS, *extra]:  # later items win
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        node = data
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    text = yaml.safe_dump(data, sort_keys=False)
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n" + text.replace("'", ""))
    return path


@pytest.fixture
def saving(tmp_path):
    """A bank where B = 256 learns like B0 = 128 per sample at twice the throughput: its
    true T ratio is 0.5, the best."""
    path = config_file(tmp_path)
    cfg = load_config(str(path))
    write_bank(cfg, tmp_path / "bank", range(8), {128: 100.0, 256: 200.0})
    return path, cfg, tmp_path / "bank"


def test_a_trial_is_served_at_its_own_cadence_and_a_stop_ends_it_after_the_next_step(
        saving, tmp_path):
    """Driven by the profile's own Driver: the trial's evaluations are the bank's at the
    trial's cadence (every 256 samples = every other step at B = 128, from a bank evaluated
    every step); a stop requested once past 4 training seconds (the target is at about 7.5) takes effect after the next
    step, which ends on an evaluation, and the summary says `stopped` with its code."""
    _, cfg, bank = saving
    cfg = replay_config(cfg)
    trial = plan_trials(cfg, tmp_path / "p" / "runs", 128, [0], kinds=("sqrt",))[0]
    (tmp_path / "p" / "trials").mkdir(parents=True)
    (tmp_path / "p" / "logs").mkdir()
    ex = ReplayExecutor(load_bank(bank), {0: 5})
    driver = Driver(cfg, tmp_path / "p", ex, Journal(tmp_path / "p" / "j.jsonl"), None, 0.0)
    driver.run([trial], lambda st: "cannot_win: test" if st["train_s"] > 4.0 else None)
    d = trial.run_dir()
    steps, evals = read_jsonl(d / "steps.jsonl")[0], read_jsonl(d / "evals.jsonl")[0]
    summary = read_json(d / "summary.json")
    assert summary["status"] == "stopped" and summary["stop_code"] == "cannot_win"
    src = load_bank(bank).runs[learning_key(trial.config.resolved_dict())][5]
    first_past = next(s for s in src.steps if s["train_s"] > 4.0)
    assert steps[-1]["step"] == first_past["step"] + 1  # asked after that step, honoured after the next
    assert steps == src.steps[:len(steps)]  # the bank's rows, unchanged
    assert [e["samples"] for e in evals[:-1]] == list(range(0, steps[-1]["samples"], 256))[:len(evals) - 1]
    assert evals[-1]["step"] == steps[-1]["step"]
    assert json.loads((d / "manifest.json").read_text())["bank_run"] == str(src.dir)


def test_same_profile_seed_is_the_same_bank_seed_for_every_configuration(saving, tmp_path):
    _, cfg, bank = saving
    cfg = replay_config(cfg)
    ex = ReplayExecutor(load_bank(bank), {0: 6, 1: 2})
    trials = plan_trials(cfg, tmp_path / "runs", 128, [0, 1], kinds=("baseline", "sqrt"))
    for t in trials:
        path = tmp_path / f"{t.name}.yaml"
        path.write_text(yaml.safe_dump(t.config.resolved_dict()))
        ex.submit(t.name, path, tmp_path / "log")
    served = {name: ex.live[name].src.seed for name in ex.live}
    assert served == {"base-P16-s0": 6, "sqrt-P32-s0": 6, "base-P16-s1": 2, "sqrt-P32-s1": 2}


def test_replay_scores_the_profile_against_the_banks_truth(saving):
    """The truth comes from every seed (B = 256 at T ratio 0.5: the best); the score rows
    have the interface's keys and fractions; keeping the baseline costs nothing and has a
    regret of 1/0.5 - 1; and two replays with one seed are equal."""
    _, cfg, bank = saving
    doc = replay(cfg, bank, ["full"], 4, seed=3)
    truth = doc["truth"]
    assert truth["best_sequences"] == 256
    ratios = {c["sequences_per_step"]: c["time_ratio"] for c in truth["configs"]}
    assert ratios[128] == 1.0 and ratios[256] == pytest.approx(0.5, rel=0.05)
    rows = {r["strategy"]: r for r in doc["strategies"]}
    assert set(rows) == {"full", "keep_baseline", "one_seed_grid"}
    for r in rows.values():
        for k in ("recommends", "picks_within_5pct", "slower_than_baseline"):
            assert 0.0 <= r[k] <= 1.0
        assert r["replicates"] == 4 and r["median_cost"] >= 0.0
    keep = rows["keep_baseline"]
    assert keep["mean_regret"] == pytest.approx(1 / ratios[256] - 1)
    assert keep["picks_within_5pct"] == 0.0 and keep["median_cost"] == 0.0
    full = rows["full"]
    # every replicate trains at least the baseline's two seeds: more than one baseline T
    assert full["median_cost"] > 1.0
    assert replay(cfg, bank, ["full"], 4, seed=3) == doc


def test_a_bank_without_a_configuration_of_the_profile_is_one_line_naming_it(tmp_path, capsys):
    path = config_file(tmp_path)
    cfg = load_config(str(path))
    write_bank(cfg, tmp_path / "bank", range(3), {128: 100.0, 256: 200.0})
    other = config_file(tmp_path, "profile.prompts_per_step=[64]", name="other.yaml")
    code, out, err = run_cli(["replay", other, tmp_path / "bank", "--replicates", "1"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no runs of grpo B=512" in err and str(tmp_path / "bank") in err
    # fewer seeds than the strategy needs: named too
    write_bank(cfg, tmp_path / "one", range(1), {128: 100.0, 256: 200.0})
    code, _, err = run_cli(["replay", config_file(tmp_path), tmp_path / "one"], capsys)
    assert code == 2 and "has 1 seeds" in err and "needs 2" in err


def test_replay_command_prints_its_table_and_the_interface_json(saving, capsys):
    """The interface other tools call: the last JSON line holds `strategies` and `truth`."""
    path, _, bank = saving
    code, out, err = run_cli(["replay", path, bank, "--replicates", "2", "--strategy", "all",
                              "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out.strip().splitlines()[-1])
    names = [r["strategy"] for r in doc["strategies"]]
    assert names == ["full", "probe", "keep_baseline", "one_seed_grid",
                     f"one_seed_grid_budget_{DEFAULT_BUDGET}"]  # the default decision's:
    # beside the grid within its cap
    keys = {"strategy", "replicates", "recommends", "picks_within_5pct", "mean_regret",
            "slower_than_baseline", "median_cost", "pick_interval_coverage"}
    assert all(keys <= set(r) for r in doc["strategies"])
    assert {"configs", "best_sequences"} <= set(doc["truth"])
    assert all({"sequences_per_step", "time_ratio", "time_ratio_ci"} <= set(c)
               for c in doc["truth"]["configs"])
    assert err.count("replay full ") == 2 and err.count("replay probe ") == 2
    code, out, _ = run_cli(["replay", path, bank, "--replicates", "1"], capsys)
    assert code == 0 and "keep_baseline" in out and "best (not departed): grpo B=256" in out


def test_profile_keys_name_each_trial_and_an_empty_bank_is_refused(saving, tmp_path):
    _, cfg, _ = saving
    assert [k[1] for k in profile_keys(cfg)] == [16, 32]  # P of the baseline, the candidate
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no run directories"):
        load_bank(tmp_path / "empty")


# ---------------------------------------------------------------- recording a bank
def test_a_bank_run_stops_once_its_evaluations_have_settled_above_the_target(tmp_path):
    """The stop comes once the evaluations have stayed at or above the target over
    eval.every_samples + B samples (here 256 + 128): a dip below restarts the count, and the
    threshold is the step-0 value + target.gain."""
    from rlbatch.profile.bank import SettledStopper, settled_span

    cfg = load_config(str(config_file(tmp_path)))
    span = settled_span(cfg)
    assert span == 256 + 128
    stopper = SettledStopper(cfg, tmp_path, span)
    rows = [(0, 0.30), (256, 0.46), (512, 0.44), (768, 0.45), (1024, 0.47), (1152, 0.46)]
    for i, (s, v) in enumerate(rows):
        stopper("eval", {"step": i, "samples": s, "train_s": s / 100, "eval/accuracy": v})
        stopper("step", {"step": i, "samples": s})  # step rows are not evaluations
        stopped = (tmp_path / "STOP").exists()
        assert stopped == (s == 1152), s  # 768 .. 1152 is the first settled stretch
    assert (tmp_path / "STOP").read_text().startswith("requested: bank: ")


@pytest.mark.landing_free
@pytest.mark.trained
def test_rlbatch_bank_records_every_configuration_and_resumes_without_retraining(
        tiny_model_dir, tmp_path, capsys):
    """A bank of a profile with the baseline alone (its one candidate is B0), two steps per
    run: one seed, then a second command with one more seed, which trains only that seed
    (the first's logs are untouched); bank.json lists every run with its crossing and a
    checksum, and runs are not stopped at the target."""
    path = config_file(tmp_path, "eval.prompts=32", "budget.max_samples=256",
                       "eval.every_samples=128", "target.gain=0.02",
                       "checkpoint.every_samples=128", "profile.prompts_per_step=[16]")
    bank = tmp_path / "bank"
    code, out, err = run_cli(["bank", path, "--seeds", "1", "--out", bank], capsys)
    assert code == 0, err
    first = {p: p.stat().st_mtime_ns for p in bank.glob("*/steps.jsonl")}
    assert len(first) == 1
    code, out, err = run_cli(["bank", path, "--seeds", "2", "--out", bank, "--json"], capsys)
    assert code == 0, err
    assert err.count("(recorded before)") == 1
    assert {p: p.stat().st_mtime_ns for p in first} == first
    doc = json.loads(out.strip().splitlines()[-1])
    assert [(r["kind"], r["seed"]) for r in doc["runs"]] == [("baseline", 0), ("baseline", 1)]
    assert read_json(bank / "bank.json") == doc and len(doc["checksum"]) == 16
    for r in doc["runs"]:
        d = bank / r["run"]
        config = yaml.safe_load((d / "config.yaml").read_text())
        assert config["budget"]["stop_at_target"] is False
        assert not (d / "checkpoints").exists()  # finished: its logs are all a replay reads
        assert r["status"] in ("stopped", "budget_exhausted", "target_reached")
        evals = read_jsonl(d / "evals.jsonl")[0]
        if r["samples_to_target"] is not None:
            crossing = next(e for e in evals
                            if e["eval/accuracy"] >= evals[0]["eval/accuracy"] + 0.02)
            assert (crossing["samples"], crossing["train_s"]) == (r["samples_to_target"],
                                                                   r["time_to_target"])
    assert [len(v) for v in load_bank(bank).runs.values()] == [2]


def test_pairing_reports_the_same_seed_correlation_and_what_pairing_saves(saving):
    """In the saving bank every configuration of a seed shares that seed's N* factor and
    speed factor: log N* and log T correlate across configurations (up to the steps that discretize N*), the per-seed
    log T ratio does not vary (a paired comparison needs no seeds to speak of), while the
    unpaired difference carries both configurations' spread."""
    from rlbatch.profile.replay_truth import attach_crossings, pairing

    _, cfg, bank_dir = saving
    bank = load_bank(bank_dir)
    attach_crossings(bank, cfg)
    [row] = pairing(bank, profile_keys(cfg))
    assert row["pairs"] == 8
    assert row["corr_log_nstar"] > 0.9 and row["corr_log_time"] > 0.9  # steps discretize N*
    assert row["sd_unpaired_log_time_ratio"] > 0.1
    assert row["seed_factor"] < 0.1


@pytest.mark.parametrize("follow_up", ["open", "all"])
def test_a_follow_up_gives_new_seeds_to_the_open_configurations_only(tmp_path, follow_up):
    """A bank where B = 256 is twice as fast and B = 512 slower than the baseline (T ratio
    1.25: it cannot win). After the first look, a follow-up with 3 seeds per configuration
    (profile.follow_up: open) runs the new seeds of the baseline and B = 256 only; with
    `all` it runs B = 512's too."""
    from rlbatch.profile.driver import with_sets
    from rlbatch.profile.procedure import run_profile

    spending = follow_up == "open"  # and, in that case, alpha spent over the looks
    path = config_file(tmp_path, "profile.prompts_per_step=[32,64]",
                       f"profile.follow_up={follow_up}",
                       f"profile.alpha_spending={str(spending).lower()}")
    cfg = replay_config(load_config(str(path)))
    write_bank(cfg, tmp_path / "bank", range(5), {128: 100.0, 256: 200.0, 512: 80.0})
    bank = load_bank(tmp_path / "bank")
    out = tmp_path / "profile"
    doc = run_profile(cfg, out, ReplayExecutor(bank, {s: s for s in range(5)}), poll_s=0.0)
    first = {p.name for p in (out / "runs").iterdir()}
    doc2 = run_profile(with_sets(cfg, {"profile.seeds": 3}), out,
                       ReplayExecutor(bank, {s: s for s in range(5)}), poll_s=0.0)
    alphas = [d["analysis"]["recommendation"]["alpha"] for d in (doc, doc2)]
    assert alphas == ([0.025, 0.0125] if spending else [0.05, 0.05])
    started = [e["trial"] for e in read_jsonl(out / "journal.jsonl")[0]
               if e["event"] == "started"]
    new = started[len(first):]
    assert {"base-P16-s2", "sqrt-P32-s2"} <= set(new)
    if follow_up == "open":
        assert not any(t.startswith("sqrt-P64") for t in new)
        skipped = next(e for e in read_jsonl(out / "journal.jsonl")[0]
                       if e["event"] == "closed_configs_skipped")
        assert skipped["trials"] == ["sqrt-P64-s1", "sqrt-P64-s2"]
    else:
        assert {"sqrt-P64-s1", "sqrt-P64-s2"} <= set(new)


def test_a_challenger_follow_up_gives_new_seeds_to_the_baseline_and_the_challenger(tmp_path):
    """Two candidates a little faster than the baseline (T ratios 0.89 and 0.92), neither
    shown faster on two seeds: with profile.follow_up: challenger the decision names the
    challenger (the lower point T, B = 256) and the seeds its own plan asks for, and the
    follow-up runs new seeds of the baseline and B = 256 only."""
    from rlbatch.analysis.selection import next_seeds
    from rlbatch.profile.driver import with_sets
    from rlbatch.profile.procedure import run_profile

    path = config_file(tmp_path, "profile.prompts_per_step=[32,64]",
                       "profile.follow_up=challenger")
    cfg = replay_config(load_config(str(path)))
    write_bank(cfg, tmp_path / "bank", range(12), {128: 100.0, 256: 112.0, 512: 109.0})
    bank = load_bank(tmp_path / "bank")
    out = tmp_path / "profile"
    doc = run_profile(cfg, out, ReplayExecutor(bank, {s: s for s in range(12)}), poll_s=0.0)
    rec = doc["analysis"]["recommendation"]
    assert rec["evidence"] == "not_enough" and len(rec["open"]) == 2
    chosen = next(e["config"] for e in doc["analysis"]["configs"]
                  if e["sequences_per_step"] == 256)
    plan = [p for p in rec["plan"] if p["config"] == chosen]
    ref = next(e for e in doc["analysis"]["configs"] if e["verdict"] == "reference")
    seeds = next_seeds(plan, ref)
    assert seeds > 2
    assert doc["decision"]["follow_up"] == {"configs": [chosen], "seeds": seeds}
    assert doc["decision"]["next_set"] == {"profile.seeds": seeds}
    first = {p.name for p in (out / "runs").iterdir()}
    run_profile(with_sets(cfg, doc["decision"]["next_set"]), out,
                ReplayExecutor(bank, {s: s for s in range(12)}), poll_s=0.0)
    started = [e["trial"] for e in read_jsonl(out / "journal.jsonl")[0]
               if e["event"] == "started"]
    new = started[len(first):]
    assert new and {t.rsplit("-s", 1)[0] for t in new} == {"base-P16", "sqrt-P32"}
    skipped = next(e for e in read_jsonl(out / "journal.jsonl")[0]
                   if e["event"] == "closed_configs_skipped")
    assert {t.rsplit("-s", 1)[0] for t in skipped["trials"]} == {"sqrt-P64"}


def test_a_bank_finds_its_finished_runs_under_another_versions_run_ids(saving, tmp_path):
    """Run ids hash the config, so another version of rlbatch may name the same run
    differently: `rlbatch bank` finds finished runs by configuration and seed, trains
    nothing (no model is built here), and bank.json names the directories found."""
    from rlbatch.profile.bank import record_bank

    _, cfg, bank = saving
    for d in list(bank.iterdir()):
        d.rename(d.with_name(d.name.rsplit("-", 1)[0] + "-0ldversn"))
    said = []
    doc = record_bank(cfg, bank, list(range(8)), say=said.append)
    assert len(said) == 16 and all(line.endswith("(recorded before)") for line in said)
    assert all(r["run"].endswith("-0ldversn") for r in doc["runs"])


def test_the_quick_saving_preset_is_the_large_saving_banks_config():
    """`--preset quick-saving` (make demo-saving) is the workload whose replays
    docs/analysis.md reports: the same config as bench/banks/large-saving.yaml but its name."""
    root = Path(__file__).resolve().parents[1] / "bench" / "banks"
    preset = load_config(None, preset="quick-saving").model_dump(mode="json")
    bank = load_config(str(root / "large-saving.yaml")).model_dump(mode="json")
    assert preset.pop("name") == "quick-saving" and bank.pop("name") == "bank-large-saving"
    assert preset == bank


@pytest.mark.parametrize("name", ["no-saving", "large-saving", "modest-saving", "ppo"])
def test_the_committed_banks_load_and_match_their_checksums(name, tmp_path):
    """The banks behind docs/analysis.md ("Replays"): 12 seeds of each of the profile's 5
    configurations, every run to its target, and bank.json's checksum recomputed from the
    runs themselves."""
    import tarfile

    from rlbatch.profile.bank import bank_summary, bank_trials

    root = Path(__file__).resolve().parents[1] / "bench" / "banks"
    with tarfile.open(root / f"{name}.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    bank_dir = tmp_path / name
    bank = load_bank(bank_dir)
    cfg = load_config(str(root / f"{name}.yaml"))
    assert sorted(bank.runs) == sorted(profile_keys(cfg))
    assert all(sorted(runs) == list(range(12)) for runs in bank.runs.values())
    doc = read_json(bank_dir / "bank.json")
    trials = bank_trials(cfg, bank_dir, list(range(12)))
    dirs = [bank_dir / r["run"] for r in doc["runs"]]
    assert bank_summary(cfg, trials, dirs)["checksum"] == doc["checksum"]
    assert all(r["time_to_target"] is not None for r in doc["runs"])


def test_pick_log_bias_is_the_mean_log_of_printed_over_true_ratio():
    """The replay's measure of how optimistic a recommended pick's printed T ratio is."""
    from rlbatch.profile.replay_truth import Outcome, pick_log_bias

    ratio = {("a",): 0.5, ("b",): 0.8}
    recs = [Outcome(("a",), True, None, 1.0, 0, point=0.4),
            Outcome(("b",), True, None, 1.0, 0, point=0.8),
            Outcome(("b",), True, None, 1.0, 0, point=None)]  # printed none: left out
    assert pick_log_bias(recs, ratio) == pytest.approx((math.log(0.8) + 0.0) / 2)
    assert pick_log_bias([], ratio) is None
