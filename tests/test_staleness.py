"""Rollouts decoded ahead of the update (`rollout.max_staleness`; docs/design.md, "Stale
rollouts"): the objective against a stale behaviour policy, the worker's log-probabilities,
the policy version each step logs, and where the knob is refused. Killed and resumed:
tests/test_kill.py::test_a_stale_run_killed_twice_resumes_to_the_uninterrupted_log."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from helpers.cli import run_cli, set_flags
from helpers.kill import stable
from rlbatch.algos.losses import aggregate, clipped_surrogate
from rlbatch.core.runlog import read_run

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

SMALL = ["batch.prompts_per_step=8", "budget.max_samples=512", "eval.every_samples=256",
         "eval.prompts=32"]


def test_the_objective_clips_the_ratio_to_the_stale_behaviour_policy():
    """Two tokens a stale behaviour policy drew with probabilities 0.25 and 0.5, which the
    current policy gives 0.5 and 0.45: ratios 2 and 0.9. With clip 0.2, advantage +1: the
    first is clipped to 1.2 (no gradient), the second is not, so the token-mean loss is
    -(1.2 + 0.9) / 2 = -1.05 and its gradient reaches the second token only; advantage -1:
    min(-2, -1.2) = -2 and min(-0.9, -0.88) = -0.9, loss (2 + 0.9) / 2 = 1.45, both tokens
    unclipped."""
    behaviour = torch.log(torch.tensor([[0.25, 0.5]]))
    for adv, want, grads in ((1.0, -1.05, [0.0, -0.5 * 0.9]), (-1.0, 1.45, [1.0, 0.45])):
        logp = torch.log(torch.tensor([[0.5, 0.45]])).requires_grad_(True)
        per_token, clipped = clipped_surrogate(logp, behaviour, torch.tensor([adv]), 0.2, 0.2)
        loss = aggregate(per_token, torch.ones(1, 2, dtype=torch.bool), 2.0)
        assert float(loss.detach()) == pytest.approx(want, abs=1e-6)
        loss.backward()
        # d/dlogp of -r A / 2 is -r A / 2 where unclipped, 0 where the clip binds
        assert logp.grad[0].tolist() == pytest.approx(grads, abs=1e-6)
        assert clipped[0].tolist() == [adv > 0, False]


@pytest.mark.trained
def test_the_worker_records_the_behaviour_policys_logprobs(tiny_model_dir):
    """A batch submitted with version 0's weights, then the model updated while the worker
    decodes: the batch's log-probabilities are version 0's teacher-forced ones, not the
    updated model's (what the clipped objective needs as its behaviour policy)."""
    from rlbatch.backends.builtin.ahead import Ahead, weights_of
    from rlbatch.backends.builtin.batch import build_batch, forward_logprobs
    from rlbatch.rollout.engine import SamplingParams, response_keys
    from rlbatch.rollout.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    ahead = Ahead(model, tok, "builtin", 1, 1)
    try:
        prompts = [tok("12+34=")["input_ids"]] * 4
        v0 = weights_of(model)
        ahead.submit(1, 0, v0, ["x"], prompts, SamplingParams(max_new_tokens=5), 4,
                     response_keys(0, 0, 0, 1, 4), 0.0)
        with torch.no_grad():  # the update of step 1, while batch 1 decodes
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        got = ahead.take(1)
    finally:
        ahead.close()
    batch = build_batch(got.rollouts, ahead.engine.pad_id)
    mask = batch.response_mask
    with torch.no_grad():
        stale = forward_logprobs(ahead.model, batch, 1.0)  # the worker's copy: version 0
        now = forward_logprobs(model, batch, 1.0)
    assert all(torch.equal(ahead.model.state_dict()[k], v) for k, v in v0.items())
    assert torch.allclose(got.rollouts.logprobs[mask], stale[mask], atol=1e-5)
    assert not torch.allclose(got.rollouts.logprobs[mask], now[mask], atol=1e-3)


def _train(out: Path, k: int, capsys) -> dict:
    code, stdout, err = run_cli(["train", "--preset", "grpo-tiny", "--out", out, "--json",
                                 *set_flags([*SMALL, f"rollout.max_staleness={k}"])], capsys)
    assert code == 0, err
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.trained
def test_a_stale_run_logs_each_batchs_policy_version_and_repeats_itself(tiny_model_dir,
                                                                      tmp_path, capsys):
    """At k = 2, step s trains on the batch of policy version max(0, s - 1 - 2), and says so;
    its first step is the synchronous run's (the same prompts, keys and starting weights,
    decoded on the worker); the phases still sum to train_s
    (rollout: the wait for the batch); and a second run of the same config logs the same
    values, whatever the two threads' timing."""
    runs = {name: read_run(_train(tmp_path / name, k, capsys)["run_dir"])
            for name, k in (("sync", 0), ("a", 2), ("b", 2))}
    sync, a = runs["sync"], runs["a"]
    assert [(r["rollout/policy_version"], r["rollout/staleness"]) for r in a.steps] == \
        [(max(0, s - 3), s - 1 - max(0, s - 3)) for s in range(1, 9)]
    assert all("rollout/policy_version" not in r for r in sync.steps)
    assert stable(a.steps[0]) == stable(sync.steps[0]) | {"rollout/policy_version": 0,
                                                          "rollout/staleness": 0}
    total = 0.0
    for row in a.steps:
        total += sum(v for key, v in row.items() if key.startswith("time/"))
        assert row["train_s"] == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert row["rollout/decode_s"] > 0
    assert stable(runs["b"].steps) == stable(a.steps)
    assert stable(runs["b"].evals) == stable(a.evals)
    assert a.config["rollout"]["max_staleness"] == 2
    assert "max_staleness" not in sync.config["rollout"]  # run ids stay as they were


@pytest.mark.parametrize("sets, names", [
    (["backend=trl"], "TRL backend"),
    (["rollout.engine=hf"], "rollout.engine"),
    (["batch.schedule.steps=[[0,64],[256,128]]"], "batch.schedule"),
    (["rollout.max_staleness=9"], "rollout.max_staleness"),
    (["rollout.max_staleness=0", "profile.max_staleness=[0,1]", "rollout.engine=hf"],
     "profile.max_staleness needs rollout.engine: builtin"),
])
def test_staleness_where_it_cannot_run_is_refused(sets, names, tmp_path, capsys):
    code, _, err = run_cli(["train", "--preset", "grpo-tiny", "--out", tmp_path,
                            *set_flags(["batch.prompts_per_step=8", "rollout.max_staleness=1",
                                        *sets])], capsys)
    assert code == 2
    assert names in err and "max_staleness" in err
    assert len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written


# ---------------------------------------------------------------- staleness in the profile

def _stale_bank(tmp_path: Path, seeds: int = 6):
    """A bank of a profile crossing B0 = 128 and B = 256 with staleness 0 and 1, written
    from known curves (no training): staleness 1 needs 1.1x the samples of its synchronous
    twin and trains at 1.5x its throughput (T ratio 1.1 / 1.5 = 0.733 against the twin);
    B = 256 at staleness 0 runs at 1.2x the baseline's throughput, at its samples."""
    from helpers.banks import write_run
    from rlbatch.core.loading import load_config
    from rlbatch.profile.bank import bank_trials
    from rlbatch.profile.replay import replay_config
    from test_replay import config_file

    path = config_file(tmp_path, "profile.max_staleness=[0,1]")
    cfg = replay_config(load_config(str(path)))
    speed = {(128, 0): 100.0, (128, 1): 150.0, (256, 0): 120.0, (256, 1): 180.0}
    rng = random.Random(3)
    noise = {s: (math.exp(rng.gauss(0, 0.15)), math.exp(rng.gauss(0, 0.1)))
             for s in range(seeds)}
    trials = bank_trials(cfg, tmp_path / "bank", list(range(seeds)))
    for t in trials:
        k = t.config.rollout.max_staleness
        n, f = noise[t.seed]
        write_run(t, cfg.budget.max_samples, 1e-4 / (n * (1.1 if k else 1.0)),
                  speed[(t.sequences_per_step, k)] / f)
    return path, cfg, trials


def test_a_profile_crosses_its_batches_with_staleness(tmp_path):
    """profile.max_staleness [0, 1]: the baseline at B0 and staleness 0; every candidate B,
    and B0, at each staleness; the trial's config carries it (so its run id differs), and
    the synchronous trials' configs are what they were without the key."""
    _, _, trials = _stale_bank(tmp_path, seeds=1)
    names = [t.name for t in trials]
    assert names == ["base-P16-s0", "sqrt-P16-k1-s0", "sqrt-P32-s0", "sqrt-P32-k1-s0"]
    assert [t.config.rollout.max_staleness for t in trials] == [0, 1, 0, 1]
    assert "max_staleness" not in trials[2].config.resolved_dict()["rollout"]
    assert len({t.run_id for t in trials}) == 4


def test_the_analysis_separates_what_staleness_cost_from_what_it_bought(tmp_path, capsys):
    """On the known bank: each stale configuration against its synchronous twin (at B0 the
    baseline) shows N* ratio 1.1 (the samples it cost), throughput ratio 1.5 (what it
    bought) and T ratio 0.733, and the stale ones stay out of the fits against B."""
    _stale_bank(tmp_path)
    code, out, err = run_cli(["analyze", tmp_path / "bank", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out.strip().splitlines()[-1])
    stale = {c["sequences_per_step"]: c for c in doc["staleness"]}
    assert set(stale) == {128, 256}
    for c in stale.values():
        assert c["staleness"] == 1
        assert c["samples_ratio"] == pytest.approx(1.1, rel=0.02)
        assert c["throughput_ratio"] == pytest.approx(1.5, rel=0.02)
        assert c["time_ratio"] == pytest.approx(1.1 / 1.5, rel=0.03)
        assert c["time_ratio_ci"][0] < c["time_ratio"] < c["time_ratio_ci"][1]
    by_id = {e["config"]: e for e in doc["configs"]}
    assert by_id[stale[128]["twin"]]["config"] == doc["reference"]["config"]
    assert by_id[stale[256]["twin"]]["staleness"] == 0
    assert doc["critical_batch"]["mccandlish_fit"]["points"] == 2  # B = 128 and 256, at 0
    code, out, err = run_cli(["analyze", tmp_path / "bank"], capsys)
    assert code == 0, err
    assert "staleness 1 at B=256 vs its twin at 0 (synchronous): N* ratio 1.1" in out
    assert "decision: P=32 G=8 (B=256), lr=0.000141, rollout.max_staleness=1:" in out


def test_a_replay_keys_runs_by_staleness(tmp_path, capsys):
    """`rlbatch replay` on the bank: the truth lists each (B, staleness) configuration with
    its T ratio against the baseline, and the fastest is B = 256 at staleness 1
    (1.1 / 1.8 = 0.61 of the baseline's T)."""
    path, _, _ = _stale_bank(tmp_path)
    code, out, err = run_cli(["replay", path, tmp_path / "bank", "--replicates", "3", "--json"],
                             capsys)
    assert code == 0, err
    doc = json.loads(out.strip().splitlines()[-1])
    truth = {c["config"]: c for c in doc["truth"]["configs"]}
    assert any("staleness 1" in name for name in truth)
    fastest = truth[doc["truth"]["fastest"]]
    assert "B=256" in fastest["config"] and "staleness 1" in fastest["config"]
    assert fastest["time_ratio"] == pytest.approx(1.1 / 1.8, rel=0.03)


def test_a_trials_progress_line_names_its_staleness(capsys):
    """The plain progress line of a profile without a terminal names a stale trial's
    staleness beside its B and LR; a synchronous trial's line is unchanged."""
    from rlbatch.cli.profile_cmds import _plain_progress

    row = {"trial": "sqrt-P16-k1-s0", "B": 128, "lr": 1.41e-4, "staleness": 1,
           "status": "running", "samples": 0, "train_s": 0.0, "metric": None}
    show = _plain_progress("eval/accuracy")
    show([row, {**row, "trial": "sqrt-P16-s0", "staleness": 0}])
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("trial sqrt-P16-k1-s0 (B=128, lr 0.000141, staleness 1): ")
    assert lines[1].startswith("trial sqrt-P16-s0 (B=128, lr 0.000141): ")
