"""Whole-program tests of the built-in trainer on the warm-started tiny model (real CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import run_cli, set_flags
from helpers.kill import stable
from rlbatch.core.runlog import STEP_REQUIRED, read_run

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

SMALL = ["batch.prompts_per_step=8", "batch.samples_per_prompt=8", "budget.max_samples=1024",
         "eval.every_samples=512", "eval.prompts=128"]


def _only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_grpo_run_log_contract(tiny_model_dir, tmp_path, capsys):
    code, out, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path), "--json",
                              *set_flags(SMALL)], capsys)
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    run = read_run(summary["run_dir"])
    # the status follows from the budget and from whether the target was crossed (where a
    # stochastic run lands differs between CPUs)
    reached = summary["target"]["reached"]
    assert summary["status"] == ("target_reached" if reached else "budget_exhausted")
    assert summary["samples"] == 1024
    assert [r["step"] for r in run.steps] == list(range(1, 17))
    assert [r["samples"] for r in run.steps] == [64 * k for k in range(1, 17)]
    for row in run.steps:
        assert all(k in row for k in STEP_REQUIRED)
        assert row["actor/lr"] == pytest.approx(1e-4 * (64 / 128) ** 0.5)
    # train_s is the sum of the steps' phase times: evaluation and checkpoints are excluded
    phases = [k for k in run.steps[0] if k.startswith("time/")]
    total = 0.0
    for row in run.steps:
        total += sum(row[k] for k in phases)
        assert row["train_s"] == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert [e["samples"] for e in run.evals] == [0, 512, 1024]
    assert all(e["eval/prompts"] == 128 for e in run.evals)
    assert run.config["derived"]["sequences_per_step"] == 64
    assert run.manifest["backend"] == "builtin" and run.manifest["seed"] == 0
    # re-running a finished run is idempotent: nothing is recomputed or appended
    code, _, _ = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path),
                          *set_flags(SMALL)], capsys)
    assert code == 0 and len(read_run(summary["run_dir"]).steps) == 16


def test_ppo_critic_schedule(tiny_model_dir, tmp_path, capsys):
    """Critic warm-up and cadence are in samples: 64-sequence steps, warm-up 128 samples (the
    first two steps train only the critic), an update every 128 samples (every second step)."""
    sets = SMALL + ["critic.warmup_samples=128", "critic.update_every_samples=128",
                    "eval.prompts=64", "budget.max_samples=512"]
    code, _, err = run_cli(["train", "--preset", "ppo-tiny", "--out", str(tmp_path), "--json",
                            *set_flags(sets)], capsys)
    assert code == 0, err
    run = read_run(_only_run(tmp_path))
    steps = run.steps
    assert steps[0]["actor/loss"] is None and steps[1]["actor/loss"] is None  # critic warm-up
    assert all(isinstance(r["actor/loss"], float) for r in steps[2:])
    updated = [r["step"] for r in steps if r.get("critic/loss") is not None]
    assert updated == [2, 4, 6, 8]  # the steps ending at 128, 256, 384, 512 samples
    assert all(r["time/critic_values"] > 0 for r in steps)  # values are computed every step
    assert all((r["time/critic_update"] > 0) == (r["step"] in updated) for r in steps)


def test_nonfinite_updates_are_skipped_then_diverge(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """A non-finite loss skips the update and is counted; two in a row end the run `diverged`.
    (Non-finite rewards no longer get this far: the reward runner counts them as faults,
    tests/test_reliability.py; the NaN is injected into the advantages here.)"""
    import rlbatch.backends.builtin.trainer as trainer_module

    real = trainer_module.grpo_advantages

    def nan_advantages(*args, **kwargs):
        adv, stats = real(*args, **kwargs)
        return adv * float("nan"), stats

    monkeypatch.setattr(trainer_module, "grpo_advantages", nan_advantages)
    sets = SMALL + ["nonfinite.max_consecutive=2", "eval.at_start=false"]
    code, out, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"),
                              "--json", *set_flags(sets)], capsys)
    assert code == 3, err  # EXIT_DIVERGED: finished, but not a result
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "diverged" and summary["nonfinite_skipped"] == 2
    run = read_run(summary["run_dir"])
    assert [r["actor/nonfinite_skipped"] for r in run.steps] == [1, 1]


def test_bad_model_path_writes_nothing(tmp_path, capsys):
    code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"),
                            "--set", f"model={tmp_path / 'missing'}"], capsys)
    assert code == 2
    assert "model:" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_interrupted_run_needs_resume_flag(tiny_model_dir, tmp_path, capsys):
    sets = SMALL + ["budget.max_samples=128", "eval.prompts=32"]
    run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path), *set_flags(sets)], capsys)
    run = _only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    summary["status"] = "running"  # as a killed run leaves it
    (run / "summary.json").write_text(json.dumps(summary))
    code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--out", str(tmp_path),
                            *set_flags(sets)], capsys)
    assert code == 2 and "--resume" in err


DETERMINISTIC_SKIP = ("time/", "train_s", "rollout/tokens_per_s")


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(DETERMINISTIC_SKIP)} for r in rows]


@pytest.mark.slow
def test_sigkill_and_resume_matches_uninterrupted(tiny_model_dir, tmp_path):
    """SIGKILL at step 10 of 24, then --resume: the log equals the uninterrupted run's.
    Slow: its contract (a SIGKILLed run says `running` and resumes to the uninterrupted
    log) is checked fast by test_kill::test_two_random_kills_resume_to_the_uninterrupted_log
    (SIGKILLs inside an evaluation and inside a checkpoint write, at random steps)."""
    sets = ["batch.prompts_per_step=8", "budget.max_samples=1536", "eval.every_samples=512",
            "eval.prompts=64", "checkpoint.every_samples=256"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", "grpo-tiny",
           *set_flags(sets)]
    subprocess.run(cmd + ["--out", str(tmp_path / "a")], check=True, env=env,
                   capture_output=True)
    proc = subprocess.Popen(cmd + ["--out", str(tmp_path / "b")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        found = list((tmp_path / "b").glob("*/steps.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 10:
            steps = found[0]
            break
        time.sleep(0.05)
    assert steps is not None, "training did not reach step 10"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_rows = len(steps.read_text().splitlines())
    assert killed_rows < 24  # really interrupted
    assert json.loads((steps.parent / "summary.json").read_text())["status"] == "running"
    subprocess.run(cmd + ["--out", str(tmp_path / "b"), "--resume"], check=True, env=env,
                   capture_output=True)
    a, b = read_run(_only_run(tmp_path / "a")), read_run(_only_run(tmp_path / "b"))
    assert len(a.steps) == 24 and len(b.steps) == 24
    assert _stable(b.steps) == _stable(a.steps)
    assert _stable(b.evals) == _stable(a.evals)
    assert b.summary["status"] == a.summary["status"]
    # the crossing's own training seconds are wall-clock, as `train_s` in the rows is
    assert stable(b.summary["target"]) == stable(a.summary["target"])


def test_stop_request_ends_the_run_stopped_after_a_final_evaluation(tiny_model_dir, tmp_path):
    """A STOP file (the profile's early stop) ends the run after the step in flight with
    status `stopped`, its code, and an evaluation where it stopped; a relative target is the
    step-0 value plus the gain, kept apart from the configured value."""
    from rlbatch.backends.builtin.trainer import Trainer
    from rlbatch.core.loading import load_config

    cfg = load_config(preset="grpo-tiny", overrides=[
        "batch.prompts_per_step=8", "budget.max_samples=4096", "eval.every_samples=2048",
        "eval.prompts=128", "target.value=null", "target.gain=0.5", f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    (trainer.state.dir / "STOP").write_text("cannot_win: 3.0 s > 2.0 s")
    summary = trainer.run()
    assert (summary["status"], summary["stop_code"], summary["steps"]) == ("stopped",
                                                                           "cannot_win", 1)
    run = read_run(trainer.state.dir)
    assert [e["step"] for e in run.evals] == [0, 1]  # evaluated where it stopped
    t = summary["target"]
    assert (t["value"], t["gain"], t["reached"]) == (None, 0.5, False)
    assert t["threshold"] == pytest.approx(run.evals[0]["eval/accuracy"] + 0.5)


def test_stopped_run_continues_once_its_stop_file_is_gone(tiny_model_dir, tmp_path):
    """How the probe strategy extends a probe: a run stopped by a STOP file stays finished
    while the file is there (even with --resume); once it is removed, --resume continues it
    from its last checkpoint, and its steps equal an uninterrupted run's (the evaluation where
    it stopped is the only extra row)."""
    from rlbatch.backends.builtin.trainer import Trainer
    from rlbatch.core.loading import load_config

    sets = ["batch.prompts_per_step=8", "budget.max_samples=512", "eval.every_samples=256",
            "eval.prompts=32", "budget.stop_at_target=false"]

    def cfg(out):
        return load_config(preset="grpo-tiny", overrides=[*sets, f"output_dir={out}"])

    full = Trainer(cfg(tmp_path / "a")).run()
    first = Trainer(cfg(tmp_path / "b"))
    (first.state.dir / "STOP").write_text("probe: 64 samples, the probe's length 64")
    assert first.run()["status"] == "stopped"
    again = Trainer(cfg(tmp_path / "b"), resume=True)
    assert again.state.finished  # the STOP file is still there
    (again.state.dir / "STOP").unlink()
    cont = Trainer(cfg(tmp_path / "b"), resume=True)
    assert not cont.state.finished
    summary = cont.run()
    assert (summary["status"], summary["stop_code"]) == (full["status"], None)
    a, b = read_run(_only_run(tmp_path / "a")), read_run(_only_run(tmp_path / "b"))
    assert _stable(b.steps) == _stable(a.steps)
    assert [e["step"] for e in b.evals] == sorted({1} | {e["step"] for e in a.evals})


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_eval_halves_are_two_disjoint_sets_of_the_same_run(tiny_model_dir, tmp_path, capsys):
    """`eval.halves` on twice the prompts: the first half is the default evaluation set
    (its accuracy equals eval/accuracy of a run evaluated on those prompts alone), the
    second is disjoint from it, the whole is their mean, and the training is untouched
    (docs/analysis.md, "Evaluation noise")."""
    small = [s for s in SMALL if not s.startswith("eval.prompts")]
    runs = {}
    for name, sets in (("one", ["eval.prompts=128"]),
                       ("halves", ["eval.prompts=256", "eval.halves=true"])):
        code, out, err = run_cli(["train", "--preset", "grpo-tiny", "--out",
                                  str(tmp_path / name), "--json",
                                  *set_flags(small + sets)], capsys)
        assert code == 0, err
        runs[name] = read_run(json.loads(out.strip().splitlines()[-1])["run_dir"])
    one, halves = runs["one"], runs["halves"]
    drop = {"train_s", "rollout/tokens_per_s"} | {k for k in one.steps[0]
                                                  if k.startswith("time/")}
    assert [{k: v for k, v in r.items() if k not in drop} for r in one.steps] == \
        [{k: v for k, v in r.items() if k not in drop} for r in halves.steps]
    assert len(one.evals) == len(halves.evals) == 3
    for a, b in zip(one.evals, halves.evals, strict=True):
        assert "eval/accuracy_a" not in a
        assert b["eval/accuracy_a"] == a["eval/accuracy"]
        assert b["eval/accuracy"] == pytest.approx(
            (b["eval/accuracy_a"] + b["eval/accuracy_b"]) / 2, abs=1e-12)
    from rlbatch.rollout.tasks import AdditionTask

    task = AdditionTask(3)
    first, second = task.eval_set(256)[:128], task.eval_set(256)[128:]
    assert first == task.eval_set(128)
    assert not {e.prompt for e in first} & {e.prompt for e in second}
