"""Bad input on the reading side (issue 16, build item 6), each through the real CLI with real
files: exit status 2, one line naming the place (file:line, the flag, the key), nothing
written. Prompts longer than the model's context, ingest flags and framework config values,
binary `--config` / `--base` files, malformed `profile.json`, and metric values that are not
numbers (warned once per key and file, dropped exactly as if they had not been logged)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_cli
from rlbatch.analysis.analyze import analyze
from rlbatch.analysis.crossing import Target
from test_report_figures import ACC, write_profile, write_sweep

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

REPO = Path(__file__).resolve().parents[1]
INGEST = REPO / "tests" / "fixtures" / "ingest"
VERL_LOG = INGEST / "verl" / "metrics.jsonl"
RLBATCH = [sys.executable, "-m", "rlbatch.cli.main"]
PG = ["--prompts-per-step", "4", "--samples-per-prompt", "2"]


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only: RunWriter fsyncs rows


def one_line_error(argv: list[str], capsys) -> str:
    code, _, err = run_cli(argv, capsys)
    err = err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (code, err)
    assert "Traceback" not in err[0]
    return err[0]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def addition_rows(n: int = 40) -> list[dict]:
    return [{"prompt": f"{100 + i}+{200 + 3 * i}=", "answer": str(300 + 4 * i)}
            for i in range(n)]


# ---------------------------------------------------------------- 1. prompt lengths
def test_train_rejects_a_prompt_longer_than_the_context_before_any_run_dir(
        tmp_path, tiny_model_dir):
    """The tiny model has 128 positions: a 204-token prompt at line 8 is named, with its
    length and the budget, exit 2, and no run directory is created (before: trained)."""
    rows = addition_rows()
    rows[7] = {"prompt": "1" * 200 + "+1=", "answer": "2"}
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    out = tmp_path / "runs"
    proc = subprocess.run(
        [*RLBATCH, "train", "--preset", "grpo-tiny", "--out", str(out),
         "--set", "task.name=dataset", "--set", f"task.path={data}",
         "--set", f"model={tiny_model_dir}", "--set", "budget.max_samples=256"],
        check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith(f"error: {data}:8: prompt is 204 tokens + rollout.max_new_tokens 5 "
                             "= 209 positions, more than the model's 128"), err[0]
    assert "max_position_embeddings" in err[0]
    assert not out.exists() or not any(out.iterdir())


def test_data_check_with_model_names_every_long_row_and_the_10mb_prompt(
        tmp_path, tiny_model_dir, capsys):
    """`rlbatch data check --model`: the first long row as file:line, the others counted and
    listed; a 10 MB prompt is one line too (before: a traceback asking for 640 GiB in
    train), counted on a prefix so it stays cheap; a fitting file passes."""
    rows = addition_rows()
    for i in (2, 5, 9):
        rows[i] = {"prompt": "9" * 150, "answer": "1"}
    many = write_jsonl(tmp_path / "many.jsonl", rows)
    msg = one_line_error(["data", "check", str(many), "--model", str(tiny_model_dir)], capsys)
    assert f"{many}:3: prompt is 151 tokens" in msg
    assert "2 more row(s) too long (lines 6, 10)" in msg

    rows = addition_rows()
    rows[3] = {"prompt": "1" * (10 * 1024 * 1024) + "+1=", "answer": "2"}
    huge = write_jsonl(tmp_path / "huge.jsonl", rows)
    msg = one_line_error(["data", "check", str(huge), "--model", str(tiny_model_dir)], capsys)
    assert f"{huge}:4: prompt is 10,485,763 characters, at least" in msg
    assert "at most 123 fit in the model's 128 positions" in msg

    ok = write_jsonl(tmp_path / "ok.jsonl", addition_rows())
    code, out, _ = run_cli(["data", "check", str(ok), "--model", str(tiny_model_dir)], capsys)
    assert code == 0 and out.startswith("ok: 40 rows")
    msg = one_line_error(["data", "check", str(ok), "--model", str(tiny_model_dir),
                          "--max-new-tokens", "200"], capsys)
    assert "rollout.max_new_tokens = 200 leaves no room for a prompt" in msg


def test_held_out_file_rows_are_checked_too(tmp_path, tiny_model_dir):
    """A too-long row of `task.eval_path` is named by its own file and line."""
    from rlbatch.core.config import TaskConfig
    from rlbatch.core.errors import DataError
    from rlbatch.rollout.datasets import DatasetTask
    from rlbatch.rollout.prompt_lengths import check_prompt_lengths

    train = write_jsonl(tmp_path / "train.jsonl", addition_rows())
    held = addition_rows(5)
    held[4] = {"prompt": "7" * 130, "answer": "7"}
    held_path = write_jsonl(tmp_path / "held.jsonl", held)
    task = DatasetTask.from_config(TaskConfig(name="dataset", path=str(train),
                                              eval_path=str(held_path)))
    with pytest.raises(DataError) as exc:
        check_prompt_lengths(task, tiny_model_dir, 5)
    assert str(exc.value).startswith(f"{held_path}:5: prompt is 131 tokens")


# ---------------------------------------------------------------- 2. ingest flags
def test_ingest_negative_batch_is_refused_in_a_real_process(tmp_path):
    """The case from the issue (before: exit 0 and a run with B = 0)."""
    out = tmp_path / "run"
    proc = subprocess.run([*RLBATCH, "ingest", "verl", str(VERL_LOG), "--out", str(out),
                           "--prompts-per-step", "-5", "--samples-per-prompt", "0"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.strip() == ("error: --prompts-per-step: must be a whole number from 1 "
                                   "to 1,000,000, got -5")
    assert not out.exists()


@pytest.mark.parametrize("flags, needle", [
    (["--samples-per-prompt", "0"], "--samples-per-prompt: must be a whole number from 1"),
    (["--prompts-per-step", "99999999999999999999"], "--prompts-per-step: must be a whole"),
    (["--prompts-per-step", "100000", "--samples-per-prompt", "1000"],
     "= 100,000,000 sequences per step is more than 16,777,216"),
    (["--lr", "nan"], "--lr: must be a finite learning rate > 0"),
    (["--lr", "inf"], "--lr: must be a finite learning rate > 0"),
    (["--lr", "-1e-6"], "--lr: must be a finite learning rate > 0"),
    (["--reference-lr", "0"], "--reference-lr: must be a finite learning rate > 0"),
    (["--reference-sequences", "-3"], "--reference-sequences: must be a whole number from 1"),
    (["--num-processes", "0"], "--num-processes: must be a whole number from 1"),
    (["--updates-per-step", "-1"], "--updates-per-step: must be a whole number from 1"),
    (["--seed", "-7"], "--seed: must be a whole number from 0"),
    (["--algorithm", "dpo"], "--algorithm: use one of grpo, ppo"),
    (["--reward-key", " "], "--reward-key: must name a logged key"),
])
def test_every_numeric_ingest_flag_is_checked(tmp_path, capsys, flags, needle):
    out = tmp_path / "run"
    msg = one_line_error(["ingest", "verl", str(VERL_LOG), "--out", str(out), *PG, *flags],
                         capsys)
    assert needle in msg
    assert not out.exists()


def test_ingest_config_file_values_are_checked_and_named(tmp_path, capsys):
    """A verl launch script with `data.train_batch_size=-5`: named by file and setting, for
    `ingest --config` and `plan --base` alike, even when a flag overrides it."""
    script = (INGEST / "verl" / "run_grpo.sh").read_text()
    bad = tmp_path / "neg.sh"
    bad.write_text(script.replace("TRAIN_BATCH=128", "TRAIN_BATCH=-5"))
    out = tmp_path / "run"
    for argv in (["ingest", "verl", str(VERL_LOG), "--out", str(out), "--config", str(bad)],
                 ["ingest", "verl", str(VERL_LOG), "--out", str(out), "--config", str(bad),
                  *PG],
                 ["plan", "--framework", "verl", "--prompts", "64,128", "--base", str(bad)]):
        msg = one_line_error(argv, capsys)
        assert msg == (f"error: {bad}: prompts per rollout step = -5 (from "
                       "data.train_batch_size) must be >= 1")
    assert not out.exists()
    nan_lr = tmp_path / "nan.sh"
    nan_lr.write_text(script.replace("optim.lr=1e-6", "optim.lr=nan"))
    msg = one_line_error(["plan", "--framework", "verl", "--prompts", "64", "--base",
                          str(nan_lr)], capsys)
    assert "learning rate = nan (from actor_rollout_ref.actor.optim.lr)" in msg
    msg = one_line_error(["plan", "--framework", "verl", "--prompts", "64", "--base",
                          str(INGEST / "verl" / "run_grpo.sh"), "--base-lr", "nan"], capsys)
    assert msg == "error: --base-lr must be a finite number > 0, got nan"


# ---------------------------------------------------------------- 3. binary config files
@pytest.mark.parametrize("name", ["run.yaml", "run.sh", "run.json", "run.toml"])
def test_binary_config_and_base_files_are_one_line(tmp_path, capsys, name):
    """Before: a UnicodeDecodeError traceback (exit 1)."""
    blob = tmp_path / name
    blob.write_bytes(b"seed: 1\n\xfb\xff\x00binary\n" + bytes(range(256)))
    framework = {"run.toml": "prime-rl", "run.json": "trl"}.get(name, "verl")
    log = {"prime-rl": INGEST / "prime-rl" / "run", "trl": INGEST / "trl" / "trainer_state.json",
           "verl": VERL_LOG}[framework]
    out = tmp_path / "run"
    msg = one_line_error(["ingest", framework, str(log), "--out", str(out), *PG,
                          "--config", str(blob)], capsys)
    assert msg.startswith(f"error: {blob}:2: not a UTF-8 text file (byte 0xfb at offset 8)")
    assert not out.exists()
    msg = one_line_error(["plan", "--framework", framework, "--prompts", "64",
                          "--base", str(blob)], capsys)
    assert msg.startswith(f"error: {blob}:2: not a UTF-8 text file")


# ---------------------------------------------------------------- 4. malformed profile.json
@pytest.fixture(scope="module")
def good_profile(tmp_path_factory) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)
        root = write_profile(tmp_path_factory.mktemp("profile") / "p")
    return json.loads((root / "profile.json").read_text())


def _pop(path: list):
    def edit(doc):
        node = doc
        for part in path[:-1]:
            node = node[part]
        node.pop(path[-1])
    return edit


def _set(path: list, value):
    def edit(doc):
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return edit


@pytest.mark.parametrize("edit, needle", [
    (_set(["decision"], "grpo-B256"), "'decision' must be an object or null, not a string"),
    (lambda d: [d], "expected a JSON object, got a list"),
    (_set(["decode"], 64), "'decode' must be an object or null, not an integer"),
    (_pop(["decode", "sweep", "rows", 0, "concurrency"]),
     "'decode.sweep.rows[0].concurrency' is missing"),
    (_set(["decode", "sweep", "rows", 1, "tokens_per_s"], "fast"),
     "'decode.sweep.rows[1].tokens_per_s' must be a number, not a string"),
    (_set(["trials"], {"a": 1}), "'trials' must be a list or null, not an object"),
    (_pop(["trials", 0, "run_dir"]), "'trials[0].run_dir' is missing"),
    (_set(["cost"], [1, 2]), "'cost' must be an object or null, not a list"),
    (_set(["cost", "total_s"], True),
     "'cost.total_s' must be a number or null, not true or false"),
    (_set(["target"], "eval/accuracy"), "'target' must be an object or null, not a string"),
    (_set(["analysis"], [1]), "'analysis' must be an object or null, not a list"),
    (_pop(["analysis", "target"]), "'analysis.target' is missing"),
    (_set(["analysis", "configs", 0, "runs"], "x"),
     "'analysis.configs[0].runs' must be a list, not a string"),
    (_pop(["analysis", "configs", 1, "runs", 0, "censored"]),
     "'analysis.configs[1].runs[0].censored' is missing"),
    (_set(["analysis", "recommendation", "config"], "grpo-nope"),
     "'analysis.recommendation.config' names 'grpo-nope', which is not in 'analysis.configs'"),
])
def test_report_on_a_malformed_profile_is_one_line(tmp_path, capsys, good_profile, edit,
                                                   needle):
    """Before: AttributeError / KeyError / TypeError tracebacks (9 of these 15)."""
    doc = json.loads(json.dumps(good_profile))
    doc = edit(doc) or doc
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "profile.json").write_text(json.dumps(doc))
    out = tmp_path / "r.html"
    msg = one_line_error(["report", str(prof), "-o", str(out)], capsys)
    assert msg == f"error: {prof / 'profile.json'}: {needle}"
    assert not out.exists()


def test_the_good_profile_passes_the_check(tmp_path, good_profile):
    """The unedited profile passes (a full report of it: tests/test_report.py)."""
    from rlbatch.report.inputs import read_profile

    (tmp_path / "profile.json").write_text(json.dumps(good_profile))
    assert read_profile(tmp_path) == good_profile


# ---------------------------------------------------------------- 5. non-numeric metrics
BAD_VALUES = {5: "0.75x", 6: True, 7: {"v": 0.75}}  # evals.jsonl rows 6, 7, 8 of base-s0


def _rewrite(path: Path, change) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    write_jsonl(path, [change(i, r) for i, r in enumerate(rows)])


def test_non_numeric_metric_values_are_warned_and_dropped_as_if_not_logged(tmp_path, capsys):
    """Three non-numeric `eval/accuracy` values in one file: one warning naming its first
    `file:line`, the key and the count; N* equals that of the same log with those values
    left out (before: dropped silently, and `true` was read as 1.0, so N* moved)."""
    bad = write_sweep(tmp_path / "bad")
    shutil.copytree(bad, tmp_path / "omitted")
    evals = bad / "base-s0" / "evals.jsonl"
    _rewrite(evals, lambda i, r: {**r, ACC: BAD_VALUES[i]} if i in BAD_VALUES else r)
    _rewrite(tmp_path / "omitted" / "base-s0" / "evals.jsonl",
             lambda i, r: {k: v for k, v in r.items() if not (i in BAD_VALUES and k == ACC)})
    _rewrite(bad / "sqrt256-s1" / "steps.jsonl",
             lambda i, r: {**r, "reward/mean": "n/a"} if i >= 2 else r)
    code, out, err = run_cli(["analyze", str(bad), "--target", f"{ACC}=0.5", "--bootstrap",
                              "200", "--json"], capsys)
    err = err.strip().splitlines()
    assert code == 0
    warned = [w for w in err if "not a number" in w]
    assert warned == [
        (f"warning: {evals}:6: '{ACC}' is '0.75x', not a number; 3 such value(s) of '{ACC}' "
         "in this file dropped (treated as not logged)"),
        (f"warning: {bad / 'sqrt256-s1' / 'steps.jsonl'}:3: 'reward/mean' is 'n/a', not a "
         "number; 2 such value(s) of 'reward/mean' in this file dropped (treated as not "
         "logged)")]
    got = json.loads(out.strip().splitlines()[-1])
    want = analyze([tmp_path / "omitted"], Target(ACC, 0.5), n_boot=200)

    def n_star(doc):
        return {Path(r["run"]).name: r["samples_to_target"]
                for e in doc["configs"] for r in e["runs"]}

    assert n_star(got) == n_star(want)
    # 0.25 at 512 samples, next numeric value 0.75 at 1,024: N* = 768 (576 with clean rows)
    assert n_star(got)["base-s0"] == 768.0 and n_star(got)["base-s1"] == 576.0


def test_a_metric_with_no_numeric_value_is_not_called_absent(tmp_path, capsys):
    """Before: "target metric 'eval/accuracy' is absent from all runs; eval metrics:
    eval/accuracy"."""
    root = tmp_path / "sweep"
    write_sweep(root)
    for run in root.iterdir():
        _rewrite(run / "evals.jsonl", lambda i, r: {**r, ACC: f"{r[ACC]}%"})
    msg = one_line_error(["analyze", str(root), "--target", f"{ACC}=0.5"], capsys)
    assert "absent" not in msg
    assert msg.startswith(f"error: target metric '{ACC}' is logged (in evals) but has no "
                          "numeric value in any run: 54 value(s) are not numbers (dropped), "
                          "the first at ")
    assert "evals.jsonl:1 ('0.25%')" in msg
    msg = one_line_error(["analyze", str(root), "--target", "eval/other=0.5"], capsys)
    assert "'eval/other' is absent from all runs" in msg


def test_ingest_warns_about_non_numeric_logged_values(tmp_path, capsys):
    """verl's file logger with a string accuracy, a boolean and an object: each key warned
    once with file:line (before: dropped silently, one evaluation fewer)."""
    rows = [json.loads(line) for line in VERL_LOG.read_text().splitlines() if line.strip()]
    rows[0]["data"]["val-core/openai/gsm8k/reward/mean@1"] = "0.5x"
    rows[1]["data"]["actor/entropy"] = True
    rows[1]["data"]["critic/score/mean"] = {"v": 1}
    log = write_jsonl(tmp_path / "metrics.jsonl", rows)
    code, _, err = run_cli(["ingest", "verl", str(log), "--out", str(tmp_path / "run"), *PG,
                            "--lr", "1e-6"], capsys)
    err = err.strip().splitlines()
    assert code == 0
    assert err == [
        (f"warning: {log}:1: 'val-core/openai/gsm8k/reward/mean@1' is '0.5x', not a number; "
         "1 such value(s) of 'val-core/openai/gsm8k/reward/mean@1' in this file not ingested"),
        (f"warning: {log}:2: 'actor/entropy' is True, not a number; 1 such value(s) of "
         "'actor/entropy' in this file not ingested"),
        (f"warning: {log}:2: 'critic/score/mean' is {{'v': 1}}, not a number; 1 such "
         "value(s) of 'critic/score/mean' in this file not ingested")]


def test_sizes_are_bounded_before_parsing(tmp_path, capsys):
    """A list bomb (a 5-million-item list in a config) and a huge --set value are refused
    by size, in one line, before YAML parses them; a list setting holds at most 64 values."""
    big = tmp_path / "bomb.yaml"
    big.write_text("extends: grpo-tiny\nprofile:\n  concurrency: [" + "1, " * 500_000 + "1]\n")
    err = one_line_error(["config", "check", str(big)], capsys)
    assert "bomb.yaml" in err and "at most 1,048,576 bytes" in err
    value = "[" + "1," * 600_000 + "1]"
    err = one_line_error(["config", "check", "--preset", "grpo-tiny", "--set",
                          f"profile.concurrency={value}"], capsys)
    assert "--set profile.concurrency" in err and "at most 1,048,576" in err
    many = "[" + ",".join(str(i + 1) for i in range(65)) + "]"
    code, _, err = run_cli(["config", "check", "--preset", "grpo-tiny", "--set",
                            f"profile.concurrency={many}"], capsys)
    assert code == 2 and "profile.concurrency" in err and "64" in err
    assert "Traceback" not in err


def test_config_check_checks_what_train_checks(tmp_path, capsys):
    """`config check` refuses what `train` would refuse before writing anything: a reward
    that cannot be imported, a model folder that is not there, eval.prompts beyond the
    held-out set; one line each, exit 2."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(40)))
    base = ["config", "check", "--preset", "grpo-tiny", "--set", "task.name=dataset",
            "--set", f"task.path={data}", "--set", "eval.prompts=2"]
    code, out, _ = run_cli(base, capsys)
    assert code == 0 and out.startswith("ok:")
    err = one_line_error(base + ["--set", "task.reward=no_such_module_xyz:fn"], capsys)
    assert "task.reward" in err or "no_such_module_xyz" in err
    err = one_line_error(base + ["--set", f"model={tmp_path / 'missing'}"], capsys)
    assert err.startswith("error: model:") and "missing" in err
    err = one_line_error(base[:-1] + ["eval.prompts=64"], capsys)
    assert "eval.prompts = 64" in err and "4 held-out prompts" in err
