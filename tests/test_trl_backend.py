"""TRL backend (`backend: trl`) through the real CLI on the warm-started tiny model.

Tiny budgets (P = 4, G = 4, B = 16, a few steps): the run-log contract, evaluation marks, the
built-in LR schedule, `rlbatch analyze` reading the run, and refusal / exact resume of an
interrupted run. Skipped when TRL is not installed (`pip install 'rlbatch[trl]'`).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers.cli import run_cli, set_flags
from rlbatch.cli.main import main
from rlbatch.core.runlog import STEP_REQUIRED, read_run

P, G = 4, 4
B = P * G
BASE = ["backend=trl", f"batch.prompts_per_step={P}", f"batch.samples_per_prompt={G}",
        "eval.prompts=32"]
FULL = ["budget.max_samples=64", "eval.every_samples=32", "optimizer.warmup_samples=32"]
LR = 1e-4 * (B / 128) ** 0.5  # grpo-tiny: eta0 = 1e-4 at B0 = 128, sqrt rule


def _train(out: Path, sets, capsys, *extra):
    return run_cli(["train", "--preset", "grpo-tiny", "--out", str(out), "--json", *extra,
                    *set_flags(BASE + sets)], capsys)


@pytest.fixture(scope="module")
def trl_run(tiny_model_dir, tmp_path_factory):
    """One 4-step run: evals at 0, 32, 64 samples; LR warm-up over the first 32 samples.
    Returns (output dir, summary). Module-scoped, so it captures output itself."""
    out = tmp_path_factory.mktemp("trl")
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            main(["train", "--preset", "grpo-tiny", "--out", str(out), "--json",
                  *set_flags(BASE + FULL)])
            code = 0
        except SystemExit as exc:
            code = exc.code
    assert code == 0, err.getvalue()[-2000:]
    return out, json.loads(buf.getvalue().strip().splitlines()[-1])


@pytest.mark.landing_free
def test_trl_run_log_contract(trl_run):
    _, summary = trl_run
    run = read_run(summary["run_dir"])
    reached = summary["target"]["reached"]
    assert summary["status"] == ("target_reached" if reached else "budget_exhausted")
    assert summary["samples"] == 64
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert [r["samples"] for r in run.steps] == [B * k for k in range(1, 5)]
    assert [r["prompts"] for r in run.steps] == [P * k for k in range(1, 5)]
    total, tokens = 0.0, 0
    for row in run.steps:
        assert all(k in row for k in STEP_REQUIRED), set(STEP_REQUIRED) - set(row)
        assert row["time/critic_update"] == 0.0
        assert 0.0 <= row["reward/mean"] <= 1.0
        assert isinstance(row["actor/loss"], float) and isinstance(row["actor/grad_norm"], float)
        # every response has 1..max_new_tokens (5) tokens, EOS included
        assert B <= row["tokens"] - tokens <= 5 * B
        tokens = row["tokens"]
        total += sum(row[k] for k in row if k.startswith("time/"))
        assert row["train_s"] == pytest.approx(total, rel=1e-9, abs=1e-9)  # phases sum to wall
        assert row["time/rollout"] > 0 and row["time/actor_update"] > 0
    # the built-in schedule: linear warm-up in samples (lr_at), then the scaled LR
    assert [r["actor/lr"] for r in run.steps] == pytest.approx([LR / 2, LR, LR, LR], rel=1e-6)
    assert [e["samples"] for e in run.evals] == [0, 32, 64]
    assert [e["step"] for e in run.evals] == [0, 2, 4]
    assert all(e["eval/prompts"] == 32 and e["eval/k"] == 1 for e in run.evals)
    assert run.evals[1]["train_s"] == run.steps[1]["train_s"]  # evaluation not in train_s
    assert run.manifest["backend"] == "trl" and run.manifest["trl"]
    assert run.config["backend"] == "trl"
    assert run.config["derived"]["sequences_per_step"] == B
    assert summary["throughput"] == pytest.approx(64 / summary["train_s"])
    assert summary["eval_s"] > 0


@pytest.mark.landing_free
def test_trl_run_is_idempotent_and_analyzable(trl_run, capsys):
    out, summary = trl_run
    code, stdout, stderr = _train(out, FULL, capsys)
    assert code == 0, stderr
    assert len(read_run(summary["run_dir"]).steps) == 4  # finished: nothing re-run
    code, stdout, stderr = run_cli(["analyze", str(out), "--target", "eval/accuracy=0.01", "--json",
                                    "--bootstrap", "50"], capsys)
    assert code == 0, stderr
    doc = json.loads(stdout.strip().splitlines()[-1])
    (conf,) = doc["configs"]
    assert conf["sequences_per_step"] == B
    assert conf["samples_to_target"] == 0  # accuracy > 0.01 at the first evaluation


@pytest.mark.landing_free
def test_trl_interrupted_run_refused_then_resumed_exactly(trl_run, tmp_path, capsys):
    """Kill after step 2 (checkpoint at 32 samples), refuse without --resume, resume exactly."""
    from rlbatch.backends.trl.run import train_trl
    from rlbatch.cli.common import resolve

    sets = ["budget.max_samples=48", "eval.every_samples=32", "optimizer.warmup_samples=32",
            "checkpoint.every_samples=32"]
    cfg = resolve(None, "grpo-tiny", BASE + sets + [f"output_dir={tmp_path}"])

    class Killed(Exception):
        pass

    def kill_at_3(kind, row):
        if kind == "step" and row["step"] == 3:
            raise Killed

    with pytest.raises(Killed):
        train_trl(cfg, callback=kill_at_3)
    code, stdout, stderr = _train(tmp_path, sets, capsys)
    assert code == 2 and "--resume" in stderr and "Traceback" not in stderr
    code, stdout, stderr = _train(tmp_path, sets, capsys, "--resume")
    assert code == 0, stderr
    resumed = read_run(json.loads(stdout.strip().splitlines()[-1])["run_dir"])
    full = read_run(trl_run[1]["run_dir"])  # same trajectory, longer budget
    keys = ("step", "samples", "tokens", "reward/mean", "actor/loss", "actor/grad_norm")
    assert [[r[k] for k in keys] for r in resumed.steps] == \
        [[r[k] for k in keys] for r in full.steps[:3]]
    assert [e["samples"] for e in resumed.evals] == [0, 32, 48]  # ends on an evaluation
    assert resumed.summary["status"] == ("target_reached" if resumed.summary["target"]["reached"]
                                         else "budget_exhausted")


def test_trl_rejects_ppo(tmp_path, capsys):
    code, _, stderr = run_cli(["train", "--preset", "ppo-tiny", "--out", str(tmp_path),
                               *set_flags(["backend=trl"])], capsys)
    assert code == 2 and "GRPO only" in stderr


@pytest.mark.landing_free
def test_trl_nonfinite_updates_are_skipped_then_diverged(tiny_model_dir, tmp_path, capsys,
                                                          monkeypatch):
    """A NaN loss: the update is skipped (weights stay finite), counted, and after
    nonfinite.max_consecutive such steps the run ends as `diverged`."""
    import torch
    from safetensors.torch import load_file
    from trl import GRPOTrainer

    from rlbatch.backends.trl.run import latest_checkpoint

    orig = GRPOTrainer._compute_loss
    monkeypatch.setattr(GRPOTrainer, "_compute_loss",
                        lambda self, model, inputs: orig(self, model, inputs) * float("nan"))
    code, stdout, stderr = _train(tmp_path, ["budget.max_samples=64", "eval.at_start=false",
                                             "eval.prompts=8", "nonfinite.max_consecutive=2"],
                                  capsys)
    assert code == 3, stderr  # EXIT_DIVERGED
    summary = json.loads(stdout.strip().splitlines()[-1])
    run = read_run(summary["run_dir"])
    assert summary["status"] == "diverged" and summary["nonfinite_skipped"] == 2
    assert [r["actor/nonfinite_skipped"] for r in run.steps] == [1, 1]
    assert all(r["actor/loss"] is None for r in run.steps)  # NaN is stored as null
    ckpt = latest_checkpoint(Path(summary["run_dir"]))  # the final one, after step 2
    assert ckpt.name == "checkpoint-2"
    assert all(torch.isfinite(t).all() for t in load_file(ckpt / "model.safetensors").values())


@pytest.mark.lands
def test_profile_with_trl_backend(tiny_model_dir, tmp_path):
    """`rlbatch profile --backend trl`: every trial runs TRL's GRPOTrainer, and the
    profile's early stop (a STOP file) is honoured by the TRL backend too. Where the
    baseline lands depends on the CPU: if it misses the target (or meets it at once) the
    profile must say so and stop after the baseline; otherwise it screens the candidate."""
    import subprocess
    import sys

    out = tmp_path / "prof"
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "profile", "--preset", "quick",
           "--follow", "0", "--backend", "trl", "--batches", "8", "--concurrency", "64",
           "--set", "target.gain=0.04", "--set", "eval.prompts=512",
           "--set", "eval.every_samples=128", "--set", "profile.fixed_lr_control=false",
           "--set", "profile.confirm_seeds=0", "--set", "profile.min_evaluations=1",
           "--set", "budget.max_samples=16384",
           "--out", str(out), "--json"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "profile.json").read_text())
    for t in doc["trials"]:
        manifest = json.loads((Path(t["run_dir"]) / "manifest.json").read_text())
        assert manifest["backend"] == "trl"
        assert t["status"] in ("target_reached", "budget_exhausted", "stopped")
    base = doc["trials"][0]
    assert base["trial"] == "base-P16-s0"
    assert base["status"] == ("target_reached" if base["target"]["reached"]
                              else "budget_exhausted")
    if doc["problem"] is not None:  # no anchor for a comparison: nothing else is run
        assert doc["problem"].startswith(("target too easy", "the baseline reached"))
        assert [t["trial"] for t in doc["trials"]] == ["base-P16-s0"] and not doc["decision"]
        return
    assert {t["trial"] for t in doc["trials"]} == {"base-P16-s0", "sqrt-P8-s0"}
    # one seed each: the baseline is kept, and the profile says the evidence is not enough
    # or that nothing was faster, never a speed-up from a single seed
    d = doc["decision"]
    assert d is not None and d["is_reference"] and d["p_faster_than_reference"] is None
