"""Reliability and safety (issue 16): the reward runner and its policy, truthful statuses,
strict JSON, strict config input. Real worker processes, real files, the real CLI.

The misbehaving reward functions live in tests/helpers/faulty_rewards.py; subprocesses get
that folder on PYTHONPATH, in-process runs on sys.path.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.cli import run_cli, set_flags
from helpers.procs import with_default_stop_signals
from rlbatch.algos.advantages import grpo_advantages
from rlbatch.core.config import RewardConfig
from rlbatch.core.runlog import atomic_write_json, dumps_strict, read_run
from rlbatch.rollout.reward_runner import Call, RewardRunner, classify, fault_key
from rlbatch.rollout.tasks import Example

HELPERS = Path(__file__).resolve().parent / "helpers"
SMALL = ["batch.prompts_per_step=8", "batch.samples_per_prompt=8", "budget.max_samples=1024",
         "eval.every_samples=512", "eval.prompts=128"]


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def _rlbatch(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlbatch.cli.main", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def _strict_json(path: Path):
    """json.loads that refuses NaN / Infinity (RFC 8259), as other languages' parsers do."""
    def refuse(name):
        raise ValueError(f"{path}: non-standard JSON constant {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


def _only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


# ---------------------------------------------------------------- the runner, in isolation

@pytest.mark.parametrize("value, expected", [
    (1, (None, 1.0, None)), (True, (None, 1.0, None)), (0.25, (None, 0.25, None)),
    (None, (None, None, None)),
    (float("nan"), ("nonfinite", None, "returned nan")),
    (float("-inf"), ("nonfinite", None, "returned -inf")),
    (1e300, ("nonfinite", None, "returned 1e+300, beyond the float32 range")),
    ("1.0", ("error", None, "returned str; expected a number, a bool or None")),
    ([1.0], ("error", None, "returned list; expected a number, a bool or None")),
])
def test_classify(value, expected):
    assert classify(value) == expected


def test_fault_key_masks_quoted_text_and_numbers():
    a = fault_key("error", "ValueError: failed on '123+456=' after 3 tries")
    assert a == fault_key("error", "ValueError: failed on '999+1=' after 12 tries")
    assert a != fault_key("error", "KeyError: 'x'")
    assert a != fault_key("timeout", "ValueError: failed on '123+456=' after 3 tries")


SCRIPT = ["ok", "raise", "nan", "hang", "die", "str", "none", "wrong", "ok", "ok"]


def test_pool_policy_timeout_and_dead_workers_are_replaced(monkeypatch):
    """Each kind of fault, in real worker processes: a hung call is killed after timeout_s, a
    worker that exits is replaced, and the pool keeps scoring afterwards."""
    monkeypatch.syspath_prepend(str(HELPERS))
    runner = RewardRunner(None, "faulty_rewards:scripted", 1e-6,
                          RewardConfig(workers=2, timeout_s=1.0))
    assert runner.pooled
    calls = [Call("p", c, Example("p", "ok"), i) for i, c in enumerate(SCRIPT)]
    try:
        t0 = time.monotonic()
        scored = runner.score(calls)
        elapsed = time.monotonic() - t0
        assert scored.faults == [None, "error", "nonfinite", "timeout", "error", "error", None,
                                 None, None, None]
        assert scored.values == [1.0, None, None, None, None, None, None, 0.0, 1.0, 1.0]
        assert scored.messages[1] == "ValueError: scripted failure"
        assert scored.messages[4] == "reward worker died (exit code 7)"
        assert scored.counts() == {"errors": 3, "timeouts": 1, "nonfinite": 1}
        assert 1.0 <= elapsed < 30  # waited for the timeout, not for the hour-long sleep
        assert runner.pool.replaced == 2  # the hung worker and the dead one
        again = runner.score([Call("p", "ok", Example("p", "ok"), 0)] * 6)
        assert again.values == [1.0] * 6 and again.n_faults == 0
        pids = [w.proc.pid for w in runner.pool.workers]
    finally:
        runner.close()
    for pid in pids:  # closed: no worker left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_in_process_for_builtin_and_declared_cheap(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS))
    from rlbatch.core.config import TaskConfig
    from rlbatch.rollout.datasets import build_task

    task = build_task(TaskConfig(name="addition"))
    assert not RewardRunner(task, "exact", 1e-6, RewardConfig()).pooled
    cheap = RewardRunner(build_task(TaskConfig(name="addition",
                                               reward="faulty_rewards:cheap_exact")),
                         "faulty_rewards:cheap_exact", 1e-6, RewardConfig())
    assert not cheap.pooled
    no_pool = RewardRunner(build_task(TaskConfig(name="addition",
                                                 reward="faulty_rewards:scripted")),
                           "faulty_rewards:scripted", 1e-6, RewardConfig(workers=0))
    assert not no_pool.pooled
    scored = no_pool.score([Call("p", c, Example("p", "ok"), 0) for c in
                            ("ok", "raise", "nan", "str", "none")])
    assert scored.faults == [None, "error", "nonfinite", "error", None]
    assert scored.values == [1.0, None, None, None, None]


def test_grpo_drop_leaves_faulted_samples_out_of_their_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 9.0, 1.0, 1.0, 0.0, 0.0])  # two groups of 4
    valid = torch.tensor([True, True, True, False, True, True, False, False])
    adv, stats = grpo_advantages(rewards, 4, "std", valid=valid)
    # group 1 without its 9.0 is (1, 0, 0): mean 1/3, population std sqrt(2)/3
    std = math.sqrt(2) / 3
    expect = [(1 - 1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0.0]
    assert adv[:4].tolist() == pytest.approx(expect, abs=1e-6)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # (1, 1) has std 0: no signal
    assert stats["adv/zero_std_groups"] == 0.5
    same, _ = grpo_advantages(rewards[:3], 3, "std")  # the same as a group of three
    assert adv[:3].tolist() == pytest.approx(same.tolist(), abs=1e-6)
    assert torch.equal(grpo_advantages(rewards, 4, valid=torch.ones(8, dtype=torch.bool))[0],
                       grpo_advantages(rewards, 4)[0])


# ---------------------------------------------------------------- data check

@pytest.mark.parametrize("fn, needle", [
    ("always_raises", ("faulty_rewards:always_raises failed on the reference answer "
                       "(RuntimeError: verifier is down; 3 of 3 rows faulted)")),
    ("two_args", "task.reward: faulty_rewards:two_args must take (prompt, completion, example)"),
    ("returns_text", "returned str; expected a number, a bool or None"),
    ("returns_inf", "returned a non-finite value on the reference answer"),
    ("import_fails", "task.reward: importing 'broken_module' raised ZeroDivisionError"),
])
def test_data_check_reports_a_bad_reward_in_one_line(tmp_path, fn, needle):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    spec = "broken_module:f" if fn == "import_fails" else f"faulty_rewards:{fn}"
    res = _rlbatch("data", "check", str(data), "--reward", spec)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert needle in lines[0]


def test_unimportable_reward_says_how_modules_are_found(tmp_path):
    # train resolves the function before it writes anything
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"),
                   "--set", "task.reward=no_such_module_xyz:f")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "PYTHONPATH" in res.stderr and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- config input

@pytest.mark.parametrize("text, needle", [
    ("batch:\n  prompts_per_step: true\n",
     "bad.yaml:3: batch.prompts_per_step: expected a number, not a boolean"),
    ("batch:\n  prompts_per_step: 8\n  samples_per_prompt: 4\n  prompts_per_step: 16\n",
     "bad.yaml:5: duplicate key 'batch.prompts_per_step'"),
    ("batch:\n  prompts_per_step: 99999999999999999999\n",
     "bad.yaml:3: batch.prompts_per_step: Input should be less than or equal to 1000000"),
    ("optimizer:\n  reference_lr: .inf\n",
     "bad.yaml:3: optimizer.reference_lr: Input should be a finite number"),
    ("rollout:\n  temperature: .nan\n",
     "bad.yaml:3: rollout.temperature: Input should be a finite number"),
    ("reward:\n  on_error: skip\n",
     "bad.yaml:3: reward.on_error: Input should be 'value' or 'drop'"),
    ("reward:\n  max_error_rate: 2\n",
     "bad.yaml:3: reward.max_error_rate: Input should be less than or equal to 1"),
    ("profile:\n  prompts_per_step: [8, true]\n",
     "bad.yaml:3: profile.prompts_per_step: expected a number, not a boolean"),
    ("batch:\n  prompts_per_step: 1000000\n  samples_per_prompt: 1000\n",
     "sequences per step is more than 16,777,216"),
])
def test_bad_input_is_one_line_with_file_and_line(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text("extends: grpo-tiny\n" + text)
    for command in ("config", "train"):
        args = ["config", "check", str(path)] if command == "config" else \
            ["train", str(path), "--out", str(tmp_path / "runs")]
        code, _, err = run_cli(args, capsys)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- strict JSON

def test_json_files_are_strict(tmp_path):
    obj = {"a": float("nan"), "b": {"c": [1.0, float("inf"), {"d": float("-inf")}]},
           "e": torch.tensor(float("nan")), "f": (2, float("nan"))}
    atomic_write_json(tmp_path / "x.json", obj)
    assert _strict_json(tmp_path / "x.json") == {"a": None, "b": {"c": [1.0, None, {"d": None}]},
                                                 "e": None, "f": [2, None]}
    assert dumps_strict([float("nan")]) == "[null]"
    with pytest.raises(TypeError):  # what cannot be encoded is refused before any write
        atomic_write_json(tmp_path / "y.json", {"g": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]  # nothing half-written


# ---------------------------------------------------------------- runs that fail

@pytest.mark.landing_free
def test_reward_past_the_error_rate_fails_the_run_with_its_reason(tiny_model_dir, tmp_path):
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path),
                   *set_flags(SMALL + ["task.reward=faulty_rewards:always_raises",
                                       "eval.at_start=false"]))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[-1] == (
        "error: task.reward: faulty_rewards:always_raises faulted on 64 of 64 calls (100%) of "
        "the last training calls, more than reward.max_error_rate = 0.25; see "
        "reward_errors.jsonl in the run directory")
    assert "reward error (train, step 1, prompt 0) in faulty_rewards:always_raises: "\
           "RuntimeError: verifier is down" in res.stderr
    assert "Traceback" not in res.stderr
    run = _only_run(tmp_path)
    summary = _strict_json(run / "summary.json")
    assert summary["status"] == "failed" and summary["failure"] == lines[-1][len("error: "):]
    assert summary["reward_faults"] == {"calls": 64, "errors": 64, "timeouts": 0,
                                        "nonfinite": 0}
    logged = [json.loads(x) for x in (run / "reward_errors.jsonl").read_text().splitlines()]
    assert logged == [{"step": 1, "phase": "train", "kind": "error",
                       "function": "faulty_rewards:always_raises", "prompt_index": 0,
                       "prompt": logged[0]["prompt"], "message": "RuntimeError: verifier is down"}]
    steps = read_run(run).steps  # the step that crossed the limit is logged, then the run ends
    assert [(r["step"], r["reward/errors"]) for r in steps] == [(1, 64)]
    # a plain re-run says what the directory holds; it is not silently skipped as finished
    again = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path),
                     *set_flags(SMALL + ["task.reward=faulty_rewards:always_raises",
                                         "eval.at_start=false"]))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "holds a failed run (task.reward: faulty_rewards:always_raises faulted" in again.stderr
    assert "--resume" in again.stderr


@pytest.mark.landing_free
def test_trl_backend_same_policy_and_failed_status(tiny_model_dir, tmp_path):
    pytest.importorskip("trl")
    trl = ["backend=trl", "batch.prompts_per_step=4", "batch.samples_per_prompt=4",
           "eval.prompts=32", "budget.max_samples=64", "eval.at_start=false"]
    refused = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path / "d"),
                       *set_flags(trl + ["reward.on_error=drop"]))
    assert refused.returncode == 2 and "reward.on_error: 'drop' is not supported by the trl " \
        "backend" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path / "r"),
                   *set_flags(trl + ["task.reward=faulty_rewards:always_raises"]))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(
        "error: task.reward: faulty_rewards:always_raises faulted on 16 of 16 calls (100%)")
    run = read_run(_only_run(tmp_path / "r"))
    assert run.summary["status"] == "failed" and "faulted on 16 of 16" in run.summary["failure"]
    assert [(r["step"], r["reward/errors"], r["reward/mean"]) for r in run.steps] == [(1, 16, 0.0)]


@pytest.mark.landing_free
def test_nonfinite_rewards_are_counted_and_never_reach_the_loss(tiny_model_dir, tmp_path):
    """NaN on every call: faults, not a diverged run; with the limit raised the run ends on
    its budget with every update finite and evaluation saying it could measure nothing."""
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path), "--json",
                   *set_flags(SMALL + ["task.reward=faulty_rewards:returns_nan", "eval.prompts=32",
                                       "budget.max_samples=128", "reward.max_error_rate=1",
                                       "target.value=null", "target.gain=0.1"]))
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "budget_exhausted" and summary["nonfinite_skipped"] == 0
    run = read_run(summary["run_dir"])
    assert [r["reward/nonfinite"] for r in run.steps] == [64, 64]
    assert all(r["reward/mean"] == 0.0 for r in run.steps)  # error_value
    assert all(e["eval/accuracy"] is None and e["eval/reward_nonfinite"] == 32
               for e in run.evals)  # nothing measured: null, not 0 and not NaN
    assert summary["target"]["threshold"] is None and not summary["target"]["reached"]
    _strict_json(Path(summary["run_dir"]) / "summary.json")


@pytest.mark.landing_free
@pytest.mark.parametrize("preset", ["grpo-tiny", "ppo-tiny"])
def test_on_error_drop_leaves_faulted_samples_out(tiny_model_dir, tmp_path, preset):
    res = _rlbatch("train", "--preset", preset, "--out", str(tmp_path), "--json",
                   *set_flags(SMALL + ["task.reward=faulty_rewards:raises_10pct", "eval.prompts=64",
                                       "budget.max_samples=256", "eval.at_start=false",
                                       "reward.on_error=drop", "batch.minibatches_per_step=2",
                                       "critic.warmup_samples=0", "reward.workers=1",
                                       # the faults are random (10% a call): a 64-call step past
                                       # the default 25% limit is rare but was seen once in CI;
                                       # the limit has its own tests, this one is about dropping
                                       "reward.max_error_rate=0.5"]))
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    run = read_run(summary["run_dir"])
    assert len(run.steps) == 4 and summary["nonfinite_skipped"] == 0
    for r in run.steps:  # fewer faults than a minibatch (32) holds: all of them dropped
        assert r["reward/dropped"] == r["reward/errors"] < 32
        assert math.isfinite(r["actor/loss"])
        assert preset == "grpo-tiny" or math.isfinite(r["critic/loss"])
    assert sum(r["reward/dropped"] for r in run.steps) > 0
    assert sum(r["reward/errors"] for r in run.steps) == summary["reward_faults"]["errors"]


def _wait_for_rows(path_glob, root: Path, rows: int, proc, timeout=300) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        found = list(root.glob(path_glob))
        if found and len(found[0].read_text().splitlines()) >= rows:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"training did not reach {rows} rows")


STABLE_SKIP = ("time/", "train_s", "rollout/tokens_per_s")


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(STABLE_SKIP)} for r in rows]


@pytest.mark.landing_free
@pytest.mark.parametrize("sig, code, failure", [
    (signal.SIGTERM, 128 + signal.SIGTERM, "terminated by SIGTERM"),
    pytest.param(signal.SIGINT, 130, "interrupted by SIGINT", marks=pytest.mark.slow),
])
def test_signal_marks_the_run_failed_and_resume_continues_it(tiny_model_dir, tmp_path, sig,
                                                             code, failure):
    sets = ["batch.prompts_per_step=8", "budget.max_samples=768", "eval.every_samples=256",
            "eval.prompts=64", "checkpoint.every_samples=128"]
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", "grpo-tiny",
           *set_flags(sets)]
    subprocess.run(cmd + ["--out", str(tmp_path / "a")], env=_env(), check=True,
                   capture_output=True)
    proc = subprocess.Popen(with_default_stop_signals(cmd + ["--out", str(tmp_path / "b")]),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    steps = _wait_for_rows("*/steps.jsonl", tmp_path / "b", 5, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    summary = _strict_json(steps.parent / "summary.json")
    assert summary["status"] == "failed" and summary["failure"] == failure
    assert summary["steps"] < 12  # really stopped early
    plain = subprocess.run(cmd + ["--out", str(tmp_path / "b")], env=_env(),
                           capture_output=True, text=True, check=False)
    assert plain.returncode == 2 and f"holds a failed run ({failure})" in plain.stderr
    subprocess.run(cmd + ["--out", str(tmp_path / "b"), "--resume"], env=_env(), check=True,
                   capture_output=True)
    a, b = read_run(_only_run(tmp_path / "a")), read_run(_only_run(tmp_path / "b"))
    assert len(b.steps) == 12 and _stable(b.steps) == _stable(a.steps)
    assert _stable(b.evals) == _stable(a.evals)
    assert b.summary["status"] == a.summary["status"] and b.summary["failure"] is None


# ---------------------------------------------------------------- the acceptance run

FLAKY = ["task.reward=faulty_rewards:flaky", "reward.timeout_s=0.5", "reward.workers=4"]


def _acceptance(tmp_path, budget: int, extra: list[str]) -> tuple[dict, object]:
    res = _rlbatch("train", "--preset", "grpo-tiny", "--out", str(tmp_path), "--json",
                   "--set", f"budget.max_samples={budget}", *set_flags(FLAKY + extra), timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    run = read_run(summary["run_dir"])
    assert summary["samples"] == budget and summary["status"] in ("budget_exhausted",
                                                                  "target_reached")
    faults = summary["reward_faults"]
    for key in ("errors", "timeouts", "nonfinite"):  # counted per step, summed in the summary
        assert all(isinstance(r[f"reward/{key}"], int) for r in run.steps)
        assert sum(r[f"reward/{key}"] for r in run.steps) == faults[key] > 0
    assert faults["calls"] == budget
    rate = (faults["errors"] + faults["nonfinite"] + faults["timeouts"]) / budget
    assert 0.05 < rate < 0.2  # ~11% by construction
    for e in run.evals:
        assert sum(e[f"eval/reward_{k}"] for k in ("errors", "timeouts", "nonfinite")) > 0
    logged = [json.loads(x) for x in
              (Path(summary["run_dir"]) / "reward_errors.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in logged} == {"error", "nonfinite", "timeout"}
    assert all(r["function"] == "faulty_rewards:flaky" and isinstance(r["prompt_index"], int)
               for r in logged)
    for name in ("summary.json", "manifest.json"):
        _strict_json(Path(summary["run_dir"]) / name)
    return summary, run


@pytest.mark.landing_free
def test_acceptance_fast_flaky_reward_runs_to_its_budget(tiny_model_dir, tmp_path):
    _acceptance(tmp_path, 1024, ["eval.every_samples=512", "eval.prompts=256"])


@pytest.mark.lands
@pytest.mark.slow
def test_acceptance_flaky_reward_accuracy_still_rises(tiny_model_dir, tmp_path):
    _, run = _acceptance(tmp_path, 8192, ["eval.every_samples=2048"])
    accuracy = [e["eval/accuracy"] for e in run.evals]
    assert len(accuracy) == 5 and accuracy[-1] > accuracy[0] + 0.05, accuracy


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
